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
    obj: Any,
) -> tuple[Mapping[str, Any], list[str], list[Mapping[str, Any]] | None]:
    """Parse ``ExtenderArgs``: (Pod, candidate node names, Nodes.items or None).

    The names come from ``Nodes.items`` when kube-scheduler sent full objects
    (``nodeCacheCapable: false``), else from ``NodeNames``; ``items`` is not None exactly
    when the reply must carry full objects too.

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
    if names is not None and (not isinstance(names, list) or not set(map(type, names)) <= {str}):
        raise WireError("ExtenderArgs.NodeNames must be a list of strings or null")
    if items is not None:
        return pod, [node_name_of(n) for n in items], items
    return pod, names or [], None


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
