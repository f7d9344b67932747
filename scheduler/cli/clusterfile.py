"""Read and write cluster snapshot files: a Kubernetes ``List`` of Nodes and Pods.

The format is exactly what ``kubectl get nodes,pods -A -o json`` prints (JSON or YAML,
also multi-document YAML or a bare list of objects). PodGroup objects of the gang APIs
are kept in ``extra["podgroups"]`` keyed ``namespace/name``, PodDisruptionBudgets in
``extra["poddisruptionbudgets"]`` the same way (the preempt verb reads them); DRA objects
(ResourceSlice, ResourceClaim, DeviceClass) in ``extra`` as ``scheduler.core.dra.extra_of``
keeps them.
Other kinds are ignored.

Also the policy file (:func:`load_policy`, :func:`load_params`) and an in-process extender
over a cluster file (:func:`build_file_extender`), which ``serve --cluster``, ``demo`` and
``explain`` share (here, below all three commands, so none imports another).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import yaml

from scheduler.core.disruption import BUDGETS_EXTRA
from scheduler.core.dra import extra_of
from scheduler.core.objects import object_key


class ClusterFileError(ValueError):
    """The cluster file cannot be read or is not a List of Nodes and Pods."""


def parse_cluster(
    text: str, source: str = "<cluster>"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Parse cluster text into (nodes, pods, extra).

    Raises:
        ClusterFileError: unreadable or wrong shape, with the source named.
    """
    try:
        docs = (
            [d for d in yaml.safe_load_all(text) if d is not None]
            if text.lstrip()[:1] not in "{["
            else [orjson.loads(text)]
        )
    except (yaml.YAMLError, orjson.JSONDecodeError) as exc:
        raise ClusterFileError(f"{source}: not JSON or YAML: {exc}") from None
    items: list[Any] = []
    for d in docs:
        if isinstance(d, list):
            items.extend(d)
        elif isinstance(d, Mapping) and isinstance(d.get("items"), list):
            items.extend(d["items"])
        elif isinstance(d, Mapping) and d.get("kind"):
            items.append(d)
        else:
            raise ClusterFileError(
                f"{source}: expected a Kubernetes List with items, got {type(d).__name__}"
            )
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    groups: dict[str, Any] = {}
    budgets: dict[str, Any] = {}
    for i, obj in enumerate(items):
        if not isinstance(obj, Mapping):
            raise ClusterFileError(f"{source}: item {i} is not an object")
        kind = obj.get("kind")
        if kind == "Node":
            nodes.append(dict(obj))
        elif kind == "Pod":
            pods.append(dict(obj))
        elif kind in ("PodGroup", "PodGang"):  # gang APIs, Grove's PodGang
            groups[object_key(obj)] = dict(obj)
        elif kind == "PodDisruptionBudget":
            budgets[object_key(obj)] = dict(obj)
    if not nodes:
        raise ClusterFileError(f"{source}: no Node objects found")
    extra: dict[str, Any] = {"podgroups": groups} if groups else {}
    if budgets:
        extra[BUDGETS_EXTRA] = dict(sorted(budgets.items()))
    extra.update(extra_of(items))
    return nodes, pods, extra


def load_cluster(
    path: str | Path,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Read a cluster file. Raises ClusterFileError with a clear message."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ClusterFileError(f"cannot read cluster file {p}: {exc.strerror}") from None
    return parse_cluster(text, str(p))


def demo_cluster_path() -> Path:
    """The embedded demo cluster shipped in ``config/clusters/demo.yaml``."""
    import config

    return Path(config.__file__).resolve().parent / "clusters" / "demo.yaml"


def default_policy_path() -> Path:
    """The default policy shipped in ``config/policy.yaml``."""
    import config

    return Path(config.__file__).resolve().parent / "policy.yaml"


def load_policy(path: str | Path | None) -> Mapping[str, Any]:
    """Read a policy YAML (the shipped default when ``path`` is None).

    Raises:
        ClusterFileError: unreadable or not a mapping.
    """
    p = Path(path) if path else default_policy_path()
    try:
        obj = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ClusterFileError(f"cannot read policy file {p}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ClusterFileError(f"{p}: not YAML: {exc}") from None
    if obj is None:
        return {}
    if not isinstance(obj, Mapping):
        raise ClusterFileError(f"{p}: a policy must be a mapping")
    return obj


def load_params(path: str | None) -> Any:
    """SchedParams from a policy file (the shipped default when None)."""
    from scheduler.core.params import SchedParams

    return SchedParams.from_config(load_policy(path))


def build_file_extender(cluster: str | None, params: Any) -> tuple[Any, str]:
    """An Extender over a cluster file (the demo cluster when ``cluster`` is None)."""
    from scheduler.runtime.cache import ClusterCache
    from scheduler.server.extender import Extender

    path = cluster or str(demo_cluster_path())
    nodes, pods, extra = load_cluster(path)
    cache = ClusterCache.from_objects(nodes, pods, params, extra=extra)
    gangs = None
    try:
        from scheduler.runtime.gangs import GangRuntime  # type: ignore[attr-defined]

        gangs = GangRuntime()
    except ImportError:
        pass
    what = "embedded demo cluster" if cluster is None else f"cluster file {path}"
    return Extender(cache, gangs=gangs), what
