"""Single GPU pods that filter refused, woken when GPUs they could use appear.

kube-scheduler keeps a pod that no node passed in its unschedulable queue until a cluster
event that one of the plugins that rejected it cares about. When only topoplace refused it
there is no such plugin. Before 1.32 no event moves it; from 1.32 only an event some
in-tree plugin registers for does (``isEventOfInterest``: a pod deleted, a node's
allocatable, labels, taints or conditions changed), not a node annotation, and nothing of
what changes inside topoplace alone: a nomination or a gang's reservation that expires,
GPUs a cordon annotation gives back, a health verdict that ages, a burst of ResourceSlice
changes applied after its delay, a deletion kube-scheduler retried on before topoplace's
watch delivered it. Such a pod waits for the periodic flush
(``podMaxInUnschedulablePodsDuration``, 5 minutes).

Which pods: whole-GPU pods placed one by one (gang members are woken by the gang runtime,
``scheduler.runtime.gangs``; fractional, replica and DRA claim pods are not parked).
:class:`ParkedPods` remembers each such pod that filter refused while none of the
nodes kube-scheduler offered for it (its candidates, which passed every in-tree filter)
had as many free GPUs as it asks. The kube janitor's :meth:`ParkedPods.poll` (every
second) wakes, in the order they were refused, those of which a candidate now has that
many free GPUs, as many as the free GPUs can take, through the waker kube mode also uses
for gang members (an annotation patch: an update of the pod moves it). A pod woken and
refused again is woken next only after a backoff. A pod refused while a candidate had as
many free GPUs as it asks is not parked (its CPU or memory refused it, or the free GPUs
did not form a set it accepts): a count of free GPUs cannot tell when it fits, and the
events kube-scheduler watches for (a pod deleted) bring it back.

A DRA claim pod refused because topoplace's watch had not shown its ResourceClaims yet
(``scheduler.runtime.dra.REASON_CLAIMS_NOT_SEEN``: kube-scheduler's informer had them,
topoplace's lagged) is remembered with the claims it waits for
(:meth:`ParkedPods.wait_for_claims`); the poll wakes it once all of them are in the cache.
kube-scheduler saw those claims arrive before it asked, so no later event of theirs moves it.

Two moments wake every pod refused in a window, whatever its kind and whatever refused it
(:meth:`ParkedPods.wake_refused_since`, with its own backoff): a hold of topoplace's own
lapsed (a nomination or a gang reservation: the poll sees the cache's ``expired_total``
grow, and wakes the pods refused within the longest hold's TTL), and a rebuild applied
ResourceSlice changes the cache was behind on (``KubeWatcher.on_caught_up``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from scheduler.core.dra import CLAIMS_KEY
from scheduler.core.snapshot import ClusterSnapshot

log = logging.getLogger(__name__)

WAKE_BACKOFF_SECONDS = (2.0, 4.0, 8.0, 16.0, 30.0)
"""Delays before a pod (or a gang's parked members) woken and refused again is woken
once more."""

MAX_PARKED = 10_000
"""Refused pods remembered at most; the oldest refusal goes first."""

REFUSED_KEPT_S = 900.0
"""A refusal older than this is forgotten by :meth:`ParkedPods.poll`: kube-scheduler
retries every pending pod at least every 5 minutes (``podMaxInUnschedulablePodsDuration``),
so a pod still pending is refused again well within it, and one that is not has gone
(deleted, or bound without topoplace's filter) and needs no wake."""

MAX_WAKES = 200
"""Pods :meth:`ParkedPods.wake_refused_since` wakes at most per call (the longest-refused
first): a wake is an API patch and a scheduling cycle, and a window can hold many pods."""


@dataclass(frozen=True, slots=True)
class Parked:
    """A refused pod: the GPUs it asks, its candidates (a bit per node position of
    ``index``, the snapshot's node index when it was refused), and its wakes so far
    (count, and the time of the last)."""

    gpus: int
    candidates: int
    index: Any
    wakes: int = 0
    woken_at: float = float("-inf")


def _free(snap: ClusterSnapshot) -> np.ndarray:
    """Free GPUs per node position, 0 on nodes that take no pod."""
    a = snap.arrays
    return np.where(a.blocked == 0, a.free, 0)


def free_gpus(snap: ClusterSnapshot) -> int:
    """Free GPUs on schedulable nodes (the capacity a refused pod or gang waits for)."""
    return int(_free(snap).sum()) if len(snap.nodes) else 0


def _bits(flags: np.ndarray) -> int:
    """A bool per node position as an int, bit ``i`` for position ``i``."""
    return int.from_bytes(np.packbits(flags, bitorder="little").tobytes(), "little")


def _flags(bits: int, n: int) -> np.ndarray:
    """:func:`_bits` back: a bool per position ``0..n-1``."""
    raw = np.frombuffer(bits.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].astype(bool)


def _moves(old: Any, new: Any) -> np.ndarray:
    """Per position of the node index ``old`` (name -> position), the same node's position
    in ``new``; -1 for a node gone."""
    out = np.full(len(old), -1, dtype=np.int64)
    for name, i in old.items():
        out[i] = new.get(name, -1)
    return out


def _remap(bits: int, moves: np.ndarray, size: int) -> int:
    """Candidates given by old positions (``bits``), by the new positions of ``moves``
    (:func:`_moves`) among ``size`` nodes; nodes gone are dropped."""
    moved = moves[_flags(bits, len(moves))]
    flags = np.zeros(size, dtype=bool)
    flags[moved[moved >= 0]] = True
    return _bits(flags)


class ParkedPods:
    """Refused single GPU pods, and when to wake them (see the module docstring).

    ``waker(keys, why)`` asks kube-scheduler to retry the pods (kube mode sets it to
    :meth:`scheduler.kube.waker.PodWaker.wake`); without one nothing is remembered.
    Thread-safe: filter parks, the janitor polls.
    """

    def __init__(self, limit: int = MAX_PARKED) -> None:
        self.waker: Callable[[list[str], str], None] | None = None
        self.limit = limit
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, Parked] = OrderedDict()
        self._refused_at: OrderedDict[str, float] = OrderedDict()
        """Every pod refused (any kind, any reason) by the time of its latest refusal, for
        :meth:`wake_refused_since`."""
        self._behind_wakes: dict[str, tuple[int, float]] = {}
        """Wakes by :meth:`wake_refused_since` per pod (count, time of the last): backoff."""
        self._expired_seen: int | None = None
        """The cache's ``expired_total`` at the last poll."""
        self._claims_wait: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        """Pods refused while their claims were not in the cache -> those claims' keys."""

    def sizes(self) -> dict[str, tuple[int, int | None]]:
        """Entries of each store, with its cap: ``/v1/inspect/state``."""
        with self._lock:
            return {
                "parked": (len(self._pods), self.limit),
                "refused_at": (len(self._refused_at), self.limit),
                "behind_wakes": (len(self._behind_wakes), self.limit),
                "claims_wait": (len(self._claims_wait), self.limit),
            }

    def __len__(self) -> int:
        return len(self._pods)

    def get(self, key: str) -> Parked | None:
        """The pod's record, if parked."""
        return self._pods.get(key)

    def note_refusal(self, key: str, at: float) -> None:
        """Filter offered ``key`` no node at ``at`` (the cache's clock), for whatever
        reason: :meth:`wake_refused_since` wakes it if the cache was behind then."""
        if self.waker is None:
            return
        with self._lock:
            self._refused_at[key] = at
            self._refused_at.move_to_end(key)
            while len(self._refused_at) > self.limit:
                self._refused_at.popitem(last=False)

    def refused(self, key: str, gpus: int, snap: ClusterSnapshot, candidates: Any) -> bool:
        """Filter offered ``key`` (asking ``gpus``) none of the nodes at positions
        ``candidates`` of ``snap``. Parks it if none of them had ``gpus`` free GPUs;
        True if parked."""
        if self.waker is None or gpus <= 0 or not len(candidates):
            return False
        free = _free(snap)
        if int(free[candidates].max()) >= gpus:  # GPUs were there: something else refused
            if key in self._pods:
                with self._lock:
                    self._pods.pop(key, None)
            return False
        flags = np.zeros(len(free), dtype=bool)
        flags[candidates] = True
        bits = _bits(flags)
        with self._lock:
            old = self._pods.get(key)
            if old is None:
                self._pods[key] = Parked(gpus, bits, snap.index)
                while len(self._pods) > self.limit:
                    self._pods.popitem(last=False)
            else:  # keeps its place in the order and its wakes (the backoff)
                self._pods[key] = replace(old, gpus=gpus, candidates=bits, index=snap.index)
        return True

    def wait_for_claims(self, key: str, claims: Sequence[str]) -> None:
        """Filter refused ``key`` because ResourceClaims ``claims`` (``namespace/name``)
        were not in the cache: :meth:`poll` wakes it once they all are. Nothing is
        remembered without a waker or without a claim named."""
        if self.waker is None or not claims:
            return
        with self._lock:
            self._claims_wait[key] = tuple(claims)
            self._claims_wait.move_to_end(key)
            while len(self._claims_wait) > self.limit:
                self._claims_wait.popitem(last=False)

    def waiting_for_claims(self, key: str) -> tuple[str, ...]:
        """The claims pod ``key`` waits to be seen (empty: none)."""
        return self._claims_wait.get(key, ())

    def offered(self, key: str) -> None:
        """Filter offered ``key`` a node: nothing to wake it for."""
        if self._pods or self._refused_at or self._claims_wait:
            with self._lock:
                self._pods.pop(key, None)
                self._refused_at.pop(key, None)
                self._behind_wakes.pop(key, None)
                self._claims_wait.pop(key, None)

    def wake_claims_seen(self, cache: Any) -> list[str]:
        """Wake, in the order they were refused, the pods of :meth:`wait_for_claims`
        whose claims are all in the cache now; drop those bound or no longer pending.
        Each is woken once (refused again for claims still missing, it is remembered
        again). Returns the keys woken."""
        if self.waker is None or not self._claims_wait:
            return []
        snap = cache.snapshot()
        seen = snap.extra.get(CLAIMS_KEY) or {}
        woken: list[str] = []
        with self._lock:
            for key, names in list(self._claims_wait.items()):
                if _gone(key, snap, cache):
                    del self._claims_wait[key]
                elif all(n in seen for n in names):
                    del self._claims_wait[key]
                    woken.append(key)
        self._wake(woken, "claim pod(s)", "its ResourceClaims are seen")
        return woken

    def wake_refused_since(
        self, since: float, cache: Any, why: str, besides_parked: bool = False
    ) -> list[str]:
        """The cache has caught up with a change it was behind on from ``since`` (the
        cache's clock): wake the pods refused since then that are still pending, whatever
        refused them, for kube-scheduler may have retried them on that change before the
        cache had it. A pod woken so and refused again waits out a backoff before the
        next such wake; at most :data:`MAX_WAKES` are woken, those refused longest ago
        first. ``besides_parked``: not the pods parked for GPUs (:meth:`poll` has a closer
        rule for them). Returns the keys woken."""
        if self.waker is None or not self._refused_at:
            return []
        snap = cache.snapshot()
        now = cache.now()
        woken: list[str] = []
        with self._lock:
            for key, at in list(self._refused_at.items()):
                if _gone(key, snap, cache):  # older ones too: nothing else drops them
                    del self._refused_at[key]
                    self._behind_wakes.pop(key, None)
                    continue
                if at < since or (besides_parked and key in self._pods):
                    continue
                count, last = self._behind_wakes.get(key, (0, float("-inf")))
                if count and now - last < backoff(count):
                    continue
                if len(woken) >= MAX_WAKES:
                    break
                self._behind_wakes[key] = (count + 1, now)
                woken.append(key)
            while len(self._behind_wakes) > self.limit:
                self._behind_wakes.pop(next(iter(self._behind_wakes)))
        if woken:
            log.info("waking %d pod(s) refused while the cache was behind (%s)", len(woken), why)
            try:
                self.waker(woken, why)
            except Exception:  # the waker is an I/O edge: never let it break the watch
                log.exception("waking refused pods failed")
        return woken

    def _forget_old_refusals(self, before: float) -> None:
        """Drop the refusals made before ``before`` (cache clock): the store is in the
        order of the latest refusal (:meth:`note_refusal` moves a key to the end), so
        they are at its head and go in O(1) each."""
        if not self._refused_at:
            return
        with self._lock:
            refused = self._refused_at
            while refused:
                key, at = next(iter(refused.items()))
                if at >= before:
                    break
                del refused[key]
                self._behind_wakes.pop(key, None)

    def _wake(self, keys: list[str], what: str, why: str) -> None:
        """Hand ``keys`` to the waker with ``why`` (nothing when empty); the waker is an
        I/O edge: its failure is logged, never raised into the janitor."""
        if not keys:
            return
        log.info("waking %d %s: %s", len(keys), what, why)
        try:
            self.waker(keys, why)
        except Exception:
            log.exception("waking %s failed", what)

    def poll(self, cache: Any, hold_window_s: float = 60.0) -> list[str]:
        """Wake the parked pods of which a candidate now has the GPUs they ask (see the
        module docstring); drop those bound, deleted or forgotten. And when holds of
        topoplace's own lapsed since the last poll (the cache's ``expired_total``: a
        nomination or gang reservation freed GPUs, CPU, memory, shares or replicas, which
        no API event announces), wake the other pods refused within ``hold_window_s``
        (the longest such hold) with :meth:`wake_refused_since`; and the claim pods whose
        claims are seen now (:meth:`wake_claims_seen`). Returns the keys woken."""
        if self.waker is None:
            return []
        self._forget_old_refusals(cache.now() - REFUSED_KEPT_S)
        expired = getattr(cache, "expired_total", 0)
        lapsed = self._expired_seen is not None and expired != self._expired_seen
        self._expired_seen = expired
        behind = (
            self.wake_refused_since(
                cache.now() - hold_window_s, cache, "held resources lapsed", besides_parked=True
            )
            if lapsed
            else []
        )
        behind += self.wake_claims_seen(cache)
        if not self._pods:
            return behind
        snap = cache.snapshot()
        now = cache.now()
        free = _free(snap)
        budget = free_gpus(snap)
        at_least = {g: _bits(free >= g) for g in {p.gpus for p in self._pods.values()}}
        moves: dict[int, np.ndarray] = {}  # by id of an old index (held by the records)
        woken: list[str] = []
        with self._lock:
            for key, p in list(self._pods.items()):
                if _gone(key, snap, cache):
                    del self._pods[key]  # bound (held), or no longer a pending pod
                    self._refused_at.pop(key, None)
                    continue
                if p.index is not snap.index:  # nodes came or went: positions moved
                    m = moves.get(id(p.index))
                    if m is None:
                        m = moves[id(p.index)] = _moves(p.index, snap.index)
                    bits = _remap(p.candidates, m, len(free))
                    p = self._pods[key] = replace(p, candidates=bits, index=snap.index)
                if p.gpus > budget or not p.candidates & at_least[p.gpus]:
                    continue
                if p.wakes and now - p.woken_at < backoff(p.wakes):
                    continue
                woken.append(key)
                budget -= p.gpus
                self._pods[key] = replace(p, wakes=p.wakes + 1, woken_at=now)
        self._wake(woken, "refused pod(s)", "GPUs freed since the refusal")
        return behind + woken


def _gone(key: str, snap: ClusterSnapshot, cache: Any) -> bool:
    """Whether a refused pod needs no wake any more: it holds resources (bound), or it is
    no longer a pending pod the cache knows."""
    return key in snap.pods or cache.pending(key) is None


def backoff(times: int) -> float:
    """Seconds to wait after the ``times``-th (>= 1) retry: :data:`WAKE_BACKOFF_SECONDS`,
    capped at its last."""
    return WAKE_BACKOFF_SECONDS[min(times, len(WAKE_BACKOFF_SECONDS)) - 1]
