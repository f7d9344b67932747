"""An immutable mapping with cheap functional updates, for the snapshot's pods.

Every bind, nomination and watch event makes a new :class:`ClusterSnapshot` with one pod
added, replaced or removed. Copying a dict of every bound pod for each of them costs
O(pods): about 3 ms per update at 100,000 pods, four updates per pod placed. A
:class:`PodMap` shares an unchanging ``base`` dict between versions and copies only a
small ``delta`` (changed or added keys) and ``gone`` set (base keys deleted); when those
outgrow ``max(64, sqrt(len))`` the next update flattens them into a new base, so an update
costs O(sqrt(n)) amortized and a lookup two or three dict probes.

Iteration order is exactly a dict's under the same operations (insertion order; a
replaced key keeps its place; a deleted and re-added key moves to the end), so code that
walks the pods sees what it saw when the snapshot held a plain dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar, overload

V = TypeVar("V")
_MISSING: Any = object()


def _flat(base: dict[str, V], delta: dict[str, V], gone: frozenset[str]) -> dict[str, V]:
    """One dict with the content and order of ``base`` updated by ``delta`` less ``gone``
    (what iterating the map gives), built by dict operations in C: a kept base key keeps
    its place (replaced in place when in ``delta``), a deleted one goes (and comes back at
    the end if ``delta`` re-added it), and new keys follow in ``delta``'s order. 21 us
    instead of 700 for 2,100 pods, once every 65 updates or more."""
    out = dict(base)
    for key in gone:
        del out[key]
    out.update(delta)
    return out


class PodMap(Mapping[str, V]):
    """Immutable ``str -> V`` mapping; :meth:`set` and :meth:`delete` return new maps."""

    __slots__ = ("_base", "_delta", "_gone", "_len")

    _base: dict[str, V]
    _delta: dict[str, V]
    _gone: frozenset[str]
    _len: int

    def __init__(self, items: Mapping[str, V] | Iterable[tuple[str, V]] = ()) -> None:
        if isinstance(items, PodMap):
            self._base, self._delta, self._gone, self._len = (
                items._base,
                items._delta,
                items._gone,
                items._len,
            )
            return
        base = dict(items)
        self._base = base
        self._delta = {}
        self._gone = frozenset()
        self._len = len(base)

    @classmethod
    def _make(cls, base: dict[str, V], delta: dict[str, V], gone: frozenset[str], n: int) -> Any:
        out = object.__new__(cls)
        out._base, out._delta, out._gone, out._len = base, delta, gone, n
        if len(delta) + len(gone) > max(64, int(n**0.5)):
            out._base = _flat(base, delta, gone)
            out._delta, out._gone = {}, frozenset()
        return out

    # ---- reads -------------------------------------------------------------------------

    def __getitem__(self, key: str) -> V:
        v = self._delta.get(key, _MISSING)
        if v is not _MISSING:
            return v
        if key in self._gone:
            raise KeyError(key)
        return self._base[key]

    @overload
    def get(self, key: str) -> V | None: ...
    @overload
    def get(self, key: str, default: Any) -> Any: ...

    def get(self, key: str, default: Any = None) -> Any:
        v = self._delta.get(key, _MISSING)
        if v is not _MISSING:
            return v
        if key in self._gone:
            return default
        return self._base.get(key, default)

    def __contains__(self, key: object) -> bool:
        if key in self._delta:
            return True
        return key not in self._gone and key in self._base

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        base, delta, gone = self._base, self._delta, self._gone
        if not delta and not gone:
            yield from base
            return
        for k in base:
            if k not in gone:
                yield k
        for k in delta:
            if k not in base or k in gone:
                yield k

    def values(self) -> Any:  # type: ignore[override]
        if not self._delta and not self._gone:
            return self._base.values()
        return [self[k] for k in self]

    def items(self) -> Any:  # type: ignore[override]
        if not self._delta and not self._gone:
            return self._base.items()
        return [(k, self[k]) for k in self]

    def __repr__(self) -> str:
        return f"PodMap({dict(self.items())!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (PodMap, (dict(self.items()),))

    # ---- updates -----------------------------------------------------------------------

    def set(self, key: str, value: V) -> PodMap[V]:
        """A map with ``key`` -> ``value`` (added at the end, or replaced in place)."""
        delta = dict(self._delta)
        present = key in self
        delta[key] = value
        return self._make(self._base, delta, self._gone, self._len + (0 if present else 1))

    def delete(self, key: str) -> PodMap[V]:
        """A map without ``key`` (the same map when it is absent)."""
        if key not in self:
            return self
        delta = self._delta
        if key in delta:
            delta = dict(delta)
            del delta[key]
        gone = self._gone
        if key in self._base and key not in gone:
            gone = gone | {key}
        return self._make(self._base, delta, gone, self._len - 1)
