"""kube-scheduler extender wire format (``k8s.io/kube-scheduler/extender/v1``).

The wrapper types have no json tags, so kube-scheduler sends Go field names in PascalCase
and decodes replies case-insensitively. We accept any casing in and always write
PascalCase out, with every field present and ``null`` for nil, exactly as Go encodes them.
The embedded Pod and Node objects are ordinary camelCase Kubernetes JSON and are passed
through untouched.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, overload

import numpy as np
import orjson

from scheduler.server.name_index import NameIndex, scan


class WireError(ValueError):
    """The request body is not a valid extender payload (HTTP 400)."""


def fold(obj: Any) -> dict[str, Any]:
    """Top-level keys lower-cased, for case-insensitive access to wrapper fields.

    Raises:
        WireError: the body is not a JSON object.
    """
    if not isinstance(obj, Mapping):
        raise WireError("request body must be a JSON object")
    return {str(k).lower(): v for k, v in obj.items()}


class RawBody(Mapping[str, Any]):
    """A request body not parsed yet: a read-only mapping that parses the bytes on first
    use (WireError if they are not a JSON object).

    The HTTP edge hands this to filter and prioritize instead of a parsed body, so that
    :func:`extender_args` can read the arguments without turning thousands of node names
    into Python strings (see :meth:`NamesMemo.split`). Any other reader sees the whole
    body, parsed with orjson, exactly as if it had been parsed up front.

    Args:
        raw: the request body.
    """

    __slots__ = ("raw", "_parsed")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._parsed: Any = None

    def parsed(self) -> Any:
        """The whole body parsed (any JSON value).

        Raises:
            WireError: the body is not valid JSON.
        """
        if self._parsed is None:
            try:
                self._parsed = orjson.loads(self.raw)
            except orjson.JSONDecodeError as exc:
                raise WireError(f"malformed JSON: {exc}") from None
        return self._parsed

    def _object(self) -> Mapping[str, Any]:
        obj = self.parsed()
        if not isinstance(obj, Mapping):
            raise WireError("request body must be a JSON object")
        return obj

    def __getitem__(self, key: str) -> Any:
        return self._object()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._object())

    def __len__(self) -> int:
        return len(self._object())

    def __reversed__(self) -> Iterator[str]:
        return reversed(self._object())  # type: ignore[call-overload,no-any-return]


@overload
def extender_args(
    obj: Any,
    raw: bytes | None = None,
    memo: NamesMemo | None = None,
    defer_names: Literal[False] = False,
) -> tuple[Mapping[str, Any], list[str], list[Mapping[str, Any]] | None]: ...


@overload
def extender_args(
    obj: Any, raw: bytes | None, memo: NamesMemo | None, defer_names: Literal[True]
) -> tuple[Mapping[str, Any], list[str] | DeferredNames, list[Mapping[str, Any]] | None]: ...


def extender_args(
    obj: Any, raw: bytes | None = None, memo: NamesMemo | None = None, defer_names: bool = False
) -> tuple[Mapping[str, Any], list[str] | DeferredNames, list[Mapping[str, Any]] | None]:
    """Parse ``ExtenderArgs``: (Pod, candidate node names, Nodes.items or None).

    The names come from ``Nodes.items`` when kube-scheduler sent full objects
    (``nodeCacheCapable: false``), else from ``NodeNames``; ``items`` is not None exactly
    when the reply must carry full objects too.

    ``obj`` is the parsed body, or a :class:`RawBody` (then ``raw`` is its bytes). With
    the request's bytes and a ``memo``, ``NodeNames`` is read from the bytes where it can
    be (see :class:`NamesMemo`): a list sent before comes back as the list seen then,
    any other as a :class:`CandidateNames` that finds its names' snapshot positions from
    the bytes, and from a :class:`RawBody` without parsing the names at all. Whichever
    way, the list equals the body's ``NodeNames`` as orjson parses it.

    With ``defer_names``, names read from a :class:`RawBody` whose positions are all
    known may come back as a :class:`DeferredNames` instead: the positions without the
    list of strings (a hot path that decides by position never needs them; building them
    is the largest step left for a new order of thousands of names). The caller passes
    it to ``scheduler.core.schedule`` as it is and calls :func:`names_list` before any
    other use.

    Raises:
        WireError: not JSON (a :class:`RawBody`), ``Pod`` missing or not an object, or
            malformed node fields.
    """
    names: Any = None
    split = None
    if memo is not None:
        memo.head = None
    if isinstance(obj, RawBody):
        raw = obj.raw
        split = memo.split(raw, defer_names) if memo is not None else None
        obj, names = split if split is not None else (obj.parsed(), None)
    f = fold(obj)
    pod = f.get("pod")
    if not isinstance(pod, Mapping):
        raise WireError("ExtenderArgs.Pod is missing or not an object")
    if split is None:
        names = f.get("nodenames")
    nodes = f.get("nodes")
    items: list[Mapping[str, Any]] | None = None
    if nodes is not None:
        if not isinstance(nodes, Mapping):
            raise WireError("ExtenderArgs.Nodes must be a NodeList object or null")
        raw_items = fold(nodes).get("items") or []
        if not isinstance(raw_items, list) or not all(isinstance(n, Mapping) for n in raw_items):
            raise WireError("ExtenderArgs.Nodes.items must be a list of Node objects")
        items = raw_items
    if names is not None and split is None:
        names = _node_names(obj, names, raw, memo)
    if items is not None:
        return pod, [node_name_of(n) for n in items], items
    return pod, names or [], None


def _node_names(obj: Any, names: Any, raw: bytes | None, memo: NamesMemo | None) -> list[str]:
    """The validated ``NodeNames`` value ``names`` of the parsed body ``obj`` (see
    :func:`extender_args`)."""
    # The bytes describe the folded value only when the exact key ``NodeNames`` is the
    # last of the parsed object: no other casing of it comes later to override it.
    if memo is not None and raw is not None and next(reversed(obj)) == "NodeNames":
        return memo.adopt(raw, names)
    if not _all_strings(names):
        raise WireError(_NOT_STRINGS)
    return names  # type: ignore[no-any-return]


_NOT_STRINGS = "ExtenderArgs.NodeNames must be a list of strings or null"


class NamesMemo:
    """Reads ``NodeNames`` from the request bytes, so that thousands of names need not be
    parsed, hashed or compared one by one. One per extender; not thread-safe (the verbs
    run on the event loop).

    kube-scheduler marshals ``ExtenderArgs`` with ``NodeNames`` last, so a body ends with
    ``"NodeNames":["...",...]}``. Three ways, each exact:

    * **A list sent before** (kube-scheduler sends the same candidates pod after pod).
      Whenever a body ends with the same bytes as one remembered, its top-level
      ``NodeNames`` is that same list: the closing brace is the body's last, so the key
      belongs to the top-level object, and a duplicate key earlier in the body loses to
      it. The remembered (validated) list is returned, and comparing one block of bytes
      replaces comparing or hashing thousands of freshly parsed strings; the positions
      found for that list are found again with it. Holds the ``size`` most recent lists.
    * **Any other list** (a large cluster's parallel filter sends a new order every time)
      comes back as :class:`CandidateNames`: where each name lies in the body is found
      with a few array operations (:meth:`locate`), and its position in the snapshot by
      a vectorized hash lookup of those bytes (:class:`NameIndex`, built once per node
      set), without hashing a Python string per name.
    * **An unparsed body** (:meth:`split`): only the part before ``NodeNames`` is parsed
      (the pod, a few hundred bytes); the list is the remembered one, or the names are
      found by their bytes and taken from the index's own strings, so no string is
      created per name. Names the index does not know are parsed from the list's bytes.
    """

    KEY = b'"NodeNames":'

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._entries: list[tuple[bytes, list[str] | DeferredNames]] = []
        self._index: tuple[Mapping[str, int], NameIndex | None] | None = None
        self.head: bytes | None = None
        """The bytes before ``NodeNames`` (everything else the body says: the pod) of the
        body :func:`extender_args` read last, when it was split (:meth:`split`); None
        otherwise. Equal bytes mean an equal pod (see ``Extender._request``)."""

    def recall(self, raw: bytes) -> list[str] | None:
        """The list of an earlier body that ``raw`` ends like, or None."""
        seen = self._recall(raw)
        return None if seen is None else names_list(seen[1])

    def _recall(self, raw: bytes) -> tuple[bytes, list[str] | DeferredNames] | None:
        for entry in self._entries:
            if raw.endswith(entry[0]):
                return entry
        return None

    def remember(self, raw: bytes, names: list[str] | DeferredNames, at: int = -1) -> None:
        """Remember ``names``: the validated value of the last top-level key of ``raw``,
        which is exactly ``NodeNames`` (at byte ``at`` if known)."""
        if at < 0:
            at = raw.rfind(self.KEY)
        if at < 0:
            return  # written with spaces around the colon: not recognisable, not needed
        self._entries.insert(0, (raw[at:], names))
        del self._entries[self.size :]

    def adopt(self, raw: bytes, names: Any) -> list[str]:
        """``names`` validated, as remembered if ``raw`` ends like an earlier body, else
        as a :class:`CandidateNames` when the bytes allow (and remembered).

        ``raw`` must be valid JSON whose parsed top-level object has the exact key
        ``NodeNames`` last, with the value ``names``.

        Raises:
            WireError: ``names`` is not a list of strings.
        """
        seen = self.recall(raw)
        if seen is not None:
            return seen
        if isinstance(names, list):
            found = self.locate(raw, len(names))
            if found is not None:  # the bytes prove every item is a string
                at, starts, ends = found
                out = CandidateNames(names, self, raw, starts, ends)
                self.remember(raw, out, at)
                return out
        if not _all_strings(names):
            raise WireError(_NOT_STRINGS)
        self.remember(raw, names)
        return names  # type: ignore[no-any-return]

    def split(
        self, raw: bytes, defer: bool = False
    ) -> tuple[dict[str, Any], list[str] | DeferredNames] | None:
        """(the body without its top-level ``NodeNames``, parsed; that ``NodeNames``)
        for a body written the way kube-scheduler writes it, without parsing the names;
        None otherwise (then the caller parses the whole body).

        The body is ``H"NodeNames":[...]}`` where ``H}`` (``H`` less a trailing comma)
        must parse as a JSON object with no key ``nodenames`` in any casing, and the list
        must be recalled (:meth:`recall`) or pass :meth:`locate`. Then ``H`` is the open
        top-level object (a cut inside a nested value does not parse), the body is that
        object plus one last member, and parsing the whole body gives the same object
        with ``NodeNames`` as its last key. Names that a snapshot index knows are taken
        from it (their bytes matched exactly, so they are valid); if any is unknown the
        list's bytes are parsed, and if they do not parse, neither does the body: None.
        With ``defer``, known names come back as a :class:`DeferredNames`.
        """
        self.head = None
        seen = self._recall(raw)
        if seen is not None:
            at = len(raw) - len(seen[0])
            head = _head(raw, at)
            if head is None:
                return None
            self.head = raw[:at]
            return head, seen[1] if defer else names_list(seen[1])
        found = self.locate(raw)
        if found is None:
            return None
        at, starts, ends = found
        head = _head(raw, at)
        if head is None:
            return None
        resolved = None
        cached = self._index
        if cached is not None and cached[1] is not None:
            pos, known = cached[1].resolve(raw, starts, ends)
            resolved = (cached[0], pos, known)
        names: list[str] | DeferredNames
        if resolved is not None and resolved[2] and defer:
            names = DeferredNames(self, raw, starts, ends, resolved, cached[1])  # type: ignore[index,arg-type]
            self.remember(raw, names, at)
            self.head = raw[:at]
            return head, names
        if resolved is not None and resolved[2]:
            parsed = cached[1].names_at(resolved[1])  # type: ignore[index,union-attr]
        else:
            try:
                parsed = orjson.loads(raw[starts[0] - 2 : ends[-1] + 2])
            except orjson.JSONDecodeError:
                return None
        names = CandidateNames(parsed, self, raw, starts, ends, resolved)
        self.remember(raw, names, at)
        self.head = raw[:at]
        return head, names

    def locate(
        self, raw: bytes, count: int | None = None
    ) -> tuple[int, np.ndarray, np.ndarray] | None:
        """Where the names of the body's top-level ``NodeNames`` lie in ``raw``: (offset
        of the key, start and end offsets of each name's characters), or None when the
        list is not written the way the byte path reads (then the caller hashes names).

        The list must be ``count`` names long if given. It is accepted only when the body
        ends with ``"NodeNames":["...","...",...,"..."]}`` (trailing whitespace allowed):
        compact, no backslash, every comma between a closing and an opening quote, and
        twice as many quotes as names. Then everything after the key is one flat array
        of strings whose characters are exactly the bytes between the quotes (if the body
        is valid JSON), and the closing brace is the body's last, so the key is a member
        of the top-level object when the part before it is that object open (see
        :meth:`split`), or when the parsed object's last key is ``NodeNames`` (see
        :func:`extender_args`). A key named ``NodeNames`` in the pod fails the test.
        """
        end = len(raw)
        while end and raw[end - 1] in b" \t\r\n":
            end -= 1
        if end < 16 or raw[end - 3 : end] != b'"]}':
            return None
        at = raw.find(self.KEY)
        found = scan(raw, at + len(self.KEY), end - 1, count) if at >= 0 else None
        if found is None:
            last = raw.rfind(self.KEY)
            if last == at or last < 0:
                return None
            at = last
            found = scan(raw, at + len(self.KEY), end - 1, count)
            if found is None:
                return None
        return at, found[0], found[1]

    def positions(
        self, index: Mapping[str, int], raw: bytes, starts: np.ndarray, ends: np.ndarray
    ) -> tuple[np.ndarray, bool] | None:
        """(snapshot positions of the names at ``starts``/``ends`` in ``raw``, -1 for
        unknown names; whether all are known), or None when ``index`` has names the byte
        path cannot hold (then the caller hashes names)."""
        cached = self._index
        if cached is None or cached[0] is not index:
            try:
                table: NameIndex | None = NameIndex(index)
            except (ValueError, TypeError):  # TypeError: a name orjson cannot encode
                table = None
            cached = (index, table)
            self._index = cached
        return None if cached[1] is None else cached[1].resolve(raw, starts, ends)


def _head(raw: bytes, at: int) -> dict[str, Any] | None:
    """``raw[:at]`` closed as an object and parsed (see :meth:`NamesMemo.split`), or None."""
    cut = raw[:at].rstrip()
    if cut.endswith(b","):
        text = cut[:-1] + b"}"
    elif cut.endswith(b"{"):
        text = cut + b"}"
    else:
        return None
    try:
        head = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(head, dict) or any(k.lower() == "nodenames" for k in head):
        return None
    return head


class CandidateNames(list[str]):
    """A read-only ``NodeNames`` list that remembers where its names lie in the request
    bytes.

    Equal to the parsed list in every way, except that it refuses to be changed (it is
    shared: :class:`NamesMemo` hands the same object out for a list sent again). In
    addition :meth:`positions_in` gives the names' snapshot positions, found from the
    bytes once per snapshot index (``scheduler.core.schedule`` asks for them before
    hashing names itself).

    Args:
        names: the names, as parsed.
        memo: the memo that found them (it holds the byte index).
        raw: the request body; ``starts``/``ends``: each name's bytes in it.
        resolved: (index, positions, all known) already found for one snapshot index.
    """

    __slots__ = ("_memo", "_raw", "_starts", "_ends", "_resolved")

    def __init__(
        self,
        names: list[str],
        memo: NamesMemo,
        raw: bytes,
        starts: np.ndarray,
        ends: np.ndarray,
        resolved: tuple[Mapping[str, int], np.ndarray, bool] | None = None,
    ) -> None:
        super().__init__(names)
        self._memo = memo
        self._raw = raw
        self._starts = starts
        self._ends = ends
        if resolved is not None:
            resolved[1].flags.writeable = False
        self._resolved = resolved

    def positions_in(self, index: Mapping[str, int]) -> tuple[np.ndarray, bool] | None:
        """(read-only positions in ``index`` with -1 for unknown names, whether all are
        known), or None when ``index`` holds names the byte path cannot (then the caller
        looks the names up itself)."""
        done = self._resolved
        if done is not None and done[0] is index:
            return done[1], done[2]
        found = self._memo.positions(index, self._raw, self._starts, self._ends)
        if found is not None:
            found[0].flags.writeable = False
            self._resolved = (index, *found)
        return found

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("CandidateNames is read-only (copy it with list())")

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (list, (list(self),))  # copies and pickles are plain lists

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only
    append = extend = insert = pop = remove = clear = sort = reverse = _read_only


class DeferredNames(Sequence[str]):
    """``NodeNames`` whose snapshot positions are known but whose strings are not built
    yet (see ``defer_names`` in :func:`extender_args`).

    :meth:`positions_in` answers as :class:`CandidateNames` does; :func:`names_list`
    gives the list (a :class:`CandidateNames`, built once, from the index's own strings).
    As a sequence it reads like that list too, building it on first use.

    Args:
        memo: the memo that found the names; ``raw``/``starts``/``ends``: their bytes.
        resolved: (index, positions, True): every name known to ``table``'s index.
        table: the byte index that resolved them (its strings make the list).
    """

    __slots__ = ("_memo", "_raw", "_starts", "_ends", "_resolved", "_table", "_list")

    def __init__(
        self,
        memo: NamesMemo,
        raw: bytes,
        starts: np.ndarray,
        ends: np.ndarray,
        resolved: tuple[Mapping[str, int], np.ndarray, bool],
        table: NameIndex,
    ) -> None:
        resolved[1].flags.writeable = False
        self._memo = memo
        self._raw = raw
        self._starts = starts
        self._ends = ends
        self._resolved = resolved
        self._table = table
        self._list: CandidateNames | None = None

    def positions_in(self, index: Mapping[str, int]) -> tuple[np.ndarray, bool] | None:
        """As :meth:`CandidateNames.positions_in`."""
        done = self._resolved
        if done[0] is index:
            return done[1], done[2]
        return self.as_list().positions_in(index)

    def as_list(self) -> CandidateNames:
        """The names as a (read-only) list, built on the first call."""
        if self._list is None:
            index, pos, known = self._resolved
            names = self._table.names_at(pos)
            self._list = CandidateNames(
                names, self._memo, self._raw, self._starts, self._ends, (index, pos, known)
            )
        return self._list

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, i: Any) -> Any:
        return self.as_list()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_list())

    def __contains__(self, name: object) -> bool:
        return name in self.as_list()

    def __eq__(self, other: object) -> bool:
        return self.as_list() == other

    __hash__ = None  # type: ignore[assignment]


def names_list(names: list[str] | DeferredNames) -> list[str]:
    """``names`` from :func:`extender_args` as a list (builds a :class:`DeferredNames`'
    list; any other list is returned as it is)."""
    return names.as_list() if isinstance(names, DeferredNames) else names


def _all_strings(names: Any) -> bool:
    """True for a list of str. ``str.join`` checks every item's type in C, which is
    several times faster than a per-item type test at kube-scheduler's list sizes."""
    if not isinstance(names, list):
        return False
    try:
        "".join(names)
    except TypeError:
        return False
    return True


def node_name_of(node: Mapping[str, Any]) -> str:
    """metadata.name of a Node object ("" if absent)."""
    m = node.get("metadata")
    return str(m.get("name") or "") if isinstance(m, Mapping) else ""


def filter_result(
    node_names: list[str] | None,
    nodes: list[Mapping[str, Any]] | None,
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> dict[str, Any]:
    """``ExtenderFilterResult`` with every field present (nil -> null)."""
    return {
        "Nodes": None if nodes is None else {"metadata": {}, "items": nodes},
        "NodeNames": node_names,
        "FailedNodes": dict(failed) if failed else {},
        "FailedAndUnresolvableNodes": dict(unresolvable) if unresolvable else {},
        "Error": error.replace("%", "%%"),
    }


def binding_args(obj: Any) -> tuple[str, str, str, str]:
    """Parse ``ExtenderBindingArgs``: (PodName, PodNamespace, PodUID, Node).

    Raises:
        WireError: a required field is missing or not a string.
    """
    f = fold(obj)
    out = []
    for key in ("podname", "podnamespace", "poduid", "node"):
        v = f.get(key, "")
        if v is None:
            v = ""
        if not isinstance(v, str):
            raise WireError(f"ExtenderBindingArgs field {key} must be a string")
        out.append(v)
    if not out[0] or not out[3]:
        raise WireError("ExtenderBindingArgs needs PodName and Node")
    return out[0], out[1] or "default", out[2], out[3]


def preemption_args(
    obj: Any,
) -> tuple[Mapping[str, Any], dict[str, list[dict[str, str]]], dict[str, int]]:
    """Parse ``ExtenderPreemptionArgs`` into (Pod, node -> victim UIDs, node -> PDB violations).

    Full victims (``NodeNameToVictims``) are reduced to their UIDs, keeping their order.

    Raises:
        WireError: malformed payload: no Pod object, a victims map or entry that is not an
            object, an entry's ``Pods`` that is not a list (null is an empty list, as Go
            sends a nil slice), a victim that is not an object, a full victim's
            ``metadata`` that is not an object, a UID that is not a string, or a
            ``NumPDBViolations`` that is not an integer.
    """
    f = fold(obj)
    pod = f.get("pod")
    if not isinstance(pod, Mapping):
        raise WireError("ExtenderPreemptionArgs.Pod is missing or not an object")
    victims: dict[str, list[dict[str, str]]] = {}
    pdb: dict[str, int] = {}
    meta_map = f.get("nodenametometavictims")
    full_map = f.get("nodenametovictims")
    for src, is_meta in ((meta_map, True), (full_map, False)):
        if src is None:
            continue
        if not isinstance(src, Mapping):
            raise WireError("victims map must be an object or null")
        for node, v in src.items():
            if not isinstance(v, Mapping):
                raise WireError("victims entry must be an object")
            fv = fold(v)
            pods = fv.get("pods")
            if pods is None:
                pods = []
            if not isinstance(pods, list):
                raise WireError("victims entry's Pods must be a list or null")
            uids = []
            for p in pods:
                if not isinstance(p, Mapping):
                    raise WireError("victim pod must be an object")
                if is_meta:
                    uid = fold(p).get("uid")
                else:
                    md = p.get("metadata")
                    if md is not None and not isinstance(md, Mapping):
                        raise WireError("victim pod's metadata must be an object")
                    uid = (md or {}).get("uid")
                if uid is not None and not isinstance(uid, str):
                    raise WireError("victim pod's UID must be a string")
                uids.append({"UID": uid or ""})
            victims[str(node)] = uids
            n = fv.get("numpdbviolations", 0) or 0
            if not isinstance(n, int):
                raise WireError("NumPDBViolations must be an integer")
            pdb[str(node)] = n
    return pod, victims, pdb
