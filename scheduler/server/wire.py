"""kube-scheduler extender wire format (``k8s.io/kube-scheduler/extender/v1``).

The wrapper types have no json tags, so kube-scheduler sends Go field names in PascalCase
and decodes replies case-insensitively. We accept any casing in and always write
PascalCase out, with every field present and ``null`` for nil, exactly as Go encodes them.
The embedded Pod and Node objects are ordinary camelCase Kubernetes JSON and are passed
through untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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


def extender_args(
    obj: Any, raw: bytes | None = None, memo: NamesMemo | None = None
) -> tuple[Mapping[str, Any], list[str], list[Mapping[str, Any]] | None]:
    """Parse ``ExtenderArgs``: (Pod, candidate node names, Nodes.items or None).

    The names come from ``Nodes.items`` when kube-scheduler sent full objects
    (``nodeCacheCapable: false``), else from ``NodeNames``; ``items`` is not None exactly
    when the reply must carry full objects too. With the request's ``raw`` bytes and a
    ``memo``, a ``NodeNames`` list sent before is recognised by its bytes and returned as
    the list seen then (see :class:`NamesMemo`).

    Raises:
        WireError: ``Pod`` missing or not an object, or malformed node fields.
    """
    f = fold(obj)
    pod = f.get("pod")
    if not isinstance(pod, Mapping):
        raise WireError("ExtenderArgs.Pod is missing or not an object")
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
    if names is not None:
        seen = memo.recall(raw) if memo is not None and raw is not None else None
        if seen is not None:
            names = seen
        elif not _all_strings(names):
            raise WireError("ExtenderArgs.NodeNames must be a list of strings or null")
        elif memo is not None and raw is not None and next(reversed(obj)) == "NodeNames":
            memo.remember(raw, names)
    if items is not None:
        return pod, [node_name_of(n) for n in items], items
    return pod, names or [], None


class NamesMemo:
    """Recognises a ``NodeNames`` list kube-scheduler sent before, from the request bytes.

    kube-scheduler marshals ``ExtenderArgs`` with ``NodeNames`` last, so a body ends with
    ``"NodeNames":[...]}``. Whenever a body ends with the same bytes as one remembered,
    its top-level ``NodeNames`` is that same list: the closing brace is the body's last,
    so the key belongs to the top-level object, and a duplicate key earlier in the body
    loses to it. The remembered (validated) list is returned, and comparing one block of
    bytes replaces comparing or hashing thousands of freshly parsed strings; positions
    memoized for that list are then found by identity of its items. A miss costs one
    reverse search of the body. Holds the ``size`` most recent lists.
    """

    KEY = b'"NodeNames":'

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._entries: list[tuple[bytes, list[str]]] = []

    def recall(self, raw: bytes) -> list[str] | None:
        """The list of an earlier body that ``raw`` ends like, or None."""
        for tail, names in self._entries:
            if raw.endswith(tail):
                return names
        return None

    def remember(self, raw: bytes, names: list[str]) -> None:
        """Remember ``names``: the validated value of the last top-level key of ``raw``,
        which is exactly ``NodeNames``."""
        at = raw.rfind(self.KEY)
        if at < 0:
            return  # written with spaces around the colon: not recognisable, not needed
        self._entries.insert(0, (raw[at:], names))
        del self._entries[self.size :]


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
        WireError: malformed payload.
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
            uids = []
            for p in fv.get("pods") or []:
                if not isinstance(p, Mapping):
                    raise WireError("victim pod must be an object")
                if is_meta:
                    uid = fold(p).get("uid", "")
                else:
                    uid = (p.get("metadata") or {}).get("uid", "")
                uids.append({"UID": str(uid)})
            victims[str(node)] = uids
            n = fv.get("numpdbviolations", 0) or 0
            if not isinstance(n, int):
                raise WireError("NumPDBViolations must be an integer")
            pdb[str(node)] = n
    return pod, victims, pdb
