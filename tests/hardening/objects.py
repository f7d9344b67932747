"""Builders of hostile Node and Pod objects for the hardening tests (issue 12).

Every builder starts from a real-shaped object (``tests.builders``) and changes one field,
so a test row says exactly what is odd about its object.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.builders import gang_pod, make_node, make_pod

GPU = "nvidia.com/gpu"


class Deep(list):  # type: ignore[type-arg]
    """The outer list of :func:`deep`: a plain list to the code under test, with a short
    ``repr`` so a failing example can be printed (printing recurses per level)."""

    depth = 0

    def __repr__(self) -> str:
        return f"deep({self.depth})"


def deep(depth: int, leaf: Any = 1) -> Any:
    """A list nested ``depth`` levels (built without recursion)."""
    out: Any = leaf
    for _ in range(depth - 1):
        out = [out]
    outer = Deep([out])
    outer.depth = depth
    return outer


def set_path(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``obj`` with the dotted ``path`` set to ``value`` (``[key]`` segments
    name keys containing dots, e.g. ``status.capacity.[nvidia.com/gpu]``)."""
    out = copy.deepcopy(obj)
    parts: list[str] = []
    rest = path
    while rest:
        if rest.startswith("["):
            end = rest.index("]")
            parts.append(rest[1:end])
            rest = rest[end + 1 :].lstrip(".")
        else:
            head, _, rest = rest.partition(".")
            parts.append(head)
    cur: Any = out
    for p in parts[:-1]:
        if isinstance(cur, list):
            cur = cur[int(p)]
            continue
        if not isinstance(cur.get(p), dict | list):
            cur[p] = {}
        cur = cur[p]
    if isinstance(cur, list):
        cur[int(parts[-1])] = value
    else:
        cur[parts[-1]] = value
    return out


def gpu_node(name: str, gpus: Any, **kw: Any) -> dict[str, Any]:
    """A DGX-like node whose capacity and allocatable ``nvidia.com/gpu`` are ``gpus``."""
    node = make_node(name, 8, **kw)
    node["status"]["capacity"][GPU] = gpus
    node["status"]["allocatable"][GPU] = gpus
    return node


def gpu_pod(name: str = "p", gpus: Any = 1, **kw: Any) -> dict[str, Any]:
    """A pending pod whose only container requests (and limits) ``gpus`` GPUs."""
    pod = make_pod(name, 1, **kw)
    res = pod["spec"]["containers"][0]["resources"]
    res["requests"][GPU] = gpus
    res["limits"][GPU] = gpus
    return pod


def member(name: str, size: Any, gang: str = "train", gpus: int = 4, **kw: Any) -> dict[str, Any]:
    """A gang member whose ``topoplace.io/gang-size`` annotation is ``size`` (verbatim)."""
    pod = gang_pod(name, gpus, gang, **kw)
    pod["metadata"]["annotations"]["topoplace.io/gang-size"] = size
    return pod
