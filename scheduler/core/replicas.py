"""Time-slicing and MPS GPU replicas: counted per node, the kubelet picks the device.

NVIDIA's device plugin can advertise every physical GPU as ``replicas`` interchangeable
devices (``sharing.timeSlicing`` or ``sharing.mps``; NVIDIA/k8s-device-plugin
api/config/v1/replicas.go). The node then shows ``nvidia.com/gpu`` (or, with
``renameByDefault``, ``nvidia.com/gpu.shared``) = GPUs x replicas, and GPU Feature Discovery
labels it (internal/lm/resource.go):

* ``nvidia.com/gpu.replicas`` = replicas per GPU;
* ``nvidia.com/gpu.sharing-strategy`` = ``none`` | ``time-slicing`` | ``mps`` (absent on
  older GFD);
* ``nvidia.com/gpu.count`` = physical GPUs;
* ``nvidia.com/gpu.product`` = the product with a ``-SHARED`` suffix.

The kubelet, not the scheduler, picks which replica (hence which GPU) a container gets, so
no device can be chosen or handed off: a replica node is modelled as a counter
(``NodeInfo.replica_capacity`` / ``replicas_used``) and has no GPUs in the whole-GPU model.
Whole-GPU pods and gangs never land there (``snapshot.BLOCKED_SHARED``); a pod takes
replicas only when it opts in (:func:`opts_in`). Among replica nodes, a pod goes to the one
with the fewest free replicas that fit (then the lower risk, then the name).

Pure: every function reads its arguments only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.core.model import GPU_RESOURCE, MAX_NODE_GPUS
from scheduler.core.quantity import QuantityError, parse_quantity_int

REPLICAS_LABEL = "nvidia.com/gpu.replicas"
STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
COUNT_LABEL = "nvidia.com/gpu.count"
PRODUCT_LABEL = "nvidia.com/gpu.product"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
"""The resource a replica node advertises with the device plugin's ``renameByDefault``."""
SHARED_SUFFIX = "-SHARED"
STRATEGIES = ("time-slicing", "mps")
OPT_IN_SELECTOR_KEYS = (STRATEGY_LABEL, REPLICAS_LABEL, PRODUCT_LABEL)

MAX_REPLICAS_PER_GPU = 1024
"""Most replicas per GPU topoplace models (the device plugin sets no bound; 1024 processes
on one GPU is far beyond any useful time-slicing or MPS setup)."""
MAX_NODE_REPLICAS = MAX_NODE_GPUS * MAX_REPLICAS_PER_GPU
"""Most replicas a node (or a pod's request) may count."""

MAX_AFFINITY_TERMS = 64
"""Node-affinity terms / expressions read per pod for the opt-in (more are ignored)."""

REPLICA_MODES = ("opt-in", "off")
"""``sharing.replicas``: ``opt-in`` (a pod opts in, see :func:`opts_in`) or ``off``
(replica nodes take no GPU pod from topoplace)."""

REASON_NOT_REPLICA_NODE = "node does not share its GPUs as replicas"
REASON_REPLICAS_NEVER = "pod asks for more GPU replicas than the node has"
REASON_REPLICAS_NOW = "not enough free GPU replicas"
REASON_REPLICA_LINK = "kubelet picks replica devices: no link class can be guaranteed"


class ReplicaError(ValueError):
    """A replica node's labels or resources are contradictory or out of range."""


@dataclass(frozen=True, slots=True)
class ReplicaInventory:
    """What a replica node publishes.

    Attributes:
        strategy: ``time-slicing``, ``mps`` or "" (replicas label only).
        per_gpu: replicas per physical GPU (>= 2).
        gpus: physical GPUs.
        capacity: replicas the node can hand out.
        resource: the resource pods ask replicas with on this node.
    """

    strategy: str
    per_gpu: int
    gpus: int
    capacity: int
    resource: str


def _count(value: Any, where: str, low: int, high: int) -> int:
    try:
        return parse_quantity_int(value, low=low, high=high, whole=True)
    except QuantityError as exc:
        raise ReplicaError(f"{where}: {exc.reason} ({low}..{high})") from None


def node_replicas(
    labels: Mapping[str, str], capacity: Mapping[str, Any], allocatable: Mapping[str, Any]
) -> ReplicaInventory | None:
    """The replica inventory of a node, or None when it does not share GPUs by replicas.

    A node shares by replicas when GFD labels ``nvidia.com/gpu.replicas`` >= 2 with
    ``nvidia.com/gpu.sharing-strategy`` ``time-slicing``, ``mps`` or absent (older GFD).
    One replica per GPU is exclusive GPUs (the whole-GPU model). Physical GPUs come from
    ``nvidia.com/gpu.count``, else advertised replicas / replicas per GPU (rounded up).

    Raises:
        ReplicaError: an unknown strategy, ``none`` with several replicas, a number that is
            malformed or out of range (replicas ``1..MAX_REPLICAS_PER_GPU``, GPUs
            ``1..MAX_NODE_GPUS``, advertised replicas ``0..MAX_NODE_REPLICAS``), or more
            replicas advertised than GPUs x replicas.
    """
    strategy = labels.get(STRATEGY_LABEL)
    raw = labels.get(REPLICAS_LABEL)
    if raw is None:
        if strategy in STRATEGIES:
            raise ReplicaError(f"{STRATEGY_LABEL}={strategy} without {REPLICAS_LABEL}")
        if strategy not in (None, "none"):
            raise ReplicaError(f"{STRATEGY_LABEL}: unknown strategy")
        return None
    per_gpu = _count(raw, REPLICAS_LABEL, 1, MAX_REPLICAS_PER_GPU)
    if strategy not in (None, "none", *STRATEGIES):
        raise ReplicaError(f"{STRATEGY_LABEL}: unknown strategy")
    if per_gpu == 1:
        return None
    if strategy == "none":
        raise ReplicaError(f"{STRATEGY_LABEL}=none with {per_gpu} replicas per GPU")
    shared = SHARED_RESOURCE in capacity or SHARED_RESOURCE in allocatable
    resource = SHARED_RESOURCE if shared else GPU_RESOURCE
    raw_cap, raw_alloc = capacity.get(resource), allocatable.get(resource)
    cap = 0 if raw_cap is None else _count(raw_cap, f"capacity {resource}", 0, MAX_NODE_REPLICAS)
    alloc = (
        cap
        if raw_alloc is None
        else _count(raw_alloc, f"allocatable {resource}", 0, MAX_NODE_REPLICAS)
    )
    cap = max(cap, alloc)
    raw_count = labels.get(COUNT_LABEL)
    if raw_count is not None:
        gpus = _count(raw_count, COUNT_LABEL, 1, MAX_NODE_GPUS)
        if cap > gpus * per_gpu:
            raise ReplicaError(f"{resource}: more replicas than {COUNT_LABEL} x {REPLICAS_LABEL}")
    else:
        gpus = -(-cap // per_gpu)
        if gpus > MAX_NODE_GPUS:
            raise ReplicaError(f"{resource}: more than {MAX_NODE_GPUS} GPUs of replicas")
    return ReplicaInventory(
        strategy=strategy or "",
        per_gpu=per_gpu,
        gpus=gpus,
        capacity=min(alloc, gpus * per_gpu),
        resource=resource,
    )


# ---- pods ---------------------------------------------------------------------------------


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _asks_shared(pod: Mapping[str, Any]) -> bool:
    spec = _map(pod.get("spec"))
    for key in ("containers", "initContainers"):
        items = spec.get(key)
        if not isinstance(items, list | tuple):
            continue
        for c in items:
            res = _map(_map(c).get("resources"))
            if SHARED_RESOURCE in _map(res.get("limits")) or SHARED_RESOURCE in _map(
                res.get("requests")
            ):
                return True
    return False


def _shared_value(key: Any, value: Any) -> bool:
    """Whether ``key=value`` holds on replica nodes only."""
    if not isinstance(value, str):
        return False
    if key == STRATEGY_LABEL:
        return value in STRATEGIES
    if key == REPLICAS_LABEL:
        return value.strip() not in ("", "0", "1")
    if key == PRODUCT_LABEL:
        return value.endswith(SHARED_SUFFIX)
    return False


def opts_in(pod: Mapping[str, Any]) -> bool:
    """Whether a pod asks for GPU replicas (may land on a replica node). Lenient, cheap.

    A pod opts in by asking ``nvidia.com/gpu.shared``, or by selecting replica nodes only:
    a ``nodeSelector`` entry, or in every required node-affinity term an ``In`` expression
    whose values all hold on replica nodes only: ``nvidia.com/gpu.sharing-strategy`` in
    ``time-slicing`` / ``mps``, ``nvidia.com/gpu.replicas`` other than 1, or
    ``nvidia.com/gpu.product`` ending in ``-SHARED``.
    """
    if not isinstance(pod, Mapping):
        return False
    spec = _map(pod.get("spec"))
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping) and selector:
        for k in OPT_IN_SELECTOR_KEYS:
            if _shared_value(k, selector.get(k)):
                return True
    affinity = spec.get("affinity")
    if affinity and _affinity_opts_in(affinity):
        return True
    return _asks_shared(pod)


def _expression_opts_in(expr: Any) -> bool:
    e = _map(expr)
    values = e.get("values")
    if e.get("operator") != "In" or not isinstance(values, list | tuple) or not values:
        return False
    key = e.get("key")
    return all(_shared_value(key, v) for v in values[:MAX_AFFINITY_TERMS])


def _affinity_opts_in(affinity: Any) -> bool:
    required = _map(
        _map(_map(affinity).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    )
    terms = required.get("nodeSelectorTerms")
    if not isinstance(terms, list | tuple) or not terms:
        return False
    for term in terms[:MAX_AFFINITY_TERMS]:  # terms are ORed: each must select replicas
        exprs = _map(term).get("matchExpressions")
        if not isinstance(exprs, list | tuple):
            return False
        if not any(_expression_opts_in(e) for e in exprs[:MAX_AFFINITY_TERMS]):
            return False
    return True


def replica_resource(pod: Mapping[str, Any]) -> str:
    """The resource a replica pod counts: ``nvidia.com/gpu.shared`` if it asks for it,
    else ``nvidia.com/gpu``."""
    return SHARED_RESOURCE if _asks_shared(pod) else GPU_RESOURCE


# ---- placement -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaVerdicts:
    """Per-node verdicts for one replica pod.

    Attributes:
        feasible: names that can take the pod, in request order.
        failed / unresolvable: name -> reason ("not now" / "never").
        choice: the node the pod goes to ("" when none): fewest free replicas left after
            the pod, then the lower health risk, then the name.
        scores: name -> 0..10 (10: the choice; else 9 x share of the node's free replicas
            the pod takes; 0 for nodes that cannot take it).
    """

    feasible: tuple[str, ...]
    failed: Mapping[str, str]
    unresolvable: Mapping[str, str]
    choice: str
    scores: Mapping[str, int]


def node_reason(node: Any, replicas: int, min_link: str, held: int = 0) -> tuple[bool, str]:
    """(unresolvable, reason) why ``node`` (a ``NodeInfo``) cannot take ``replicas`` now;
    "" when it can. ``held``: replicas the pod itself already holds there (a nomination).
    Node health and cordons are the caller's (the snapshot's ``blocked`` column)."""
    if not node.replicas:
        return True, REASON_NOT_REPLICA_NODE
    if min_link and replicas >= 2:
        return True, REASON_REPLICA_LINK
    if replicas > node.replica_capacity:
        return True, REASON_REPLICAS_NEVER
    if replicas > node.replicas_free + held:
        return False, REASON_REPLICAS_NOW
    return False, ""


def choose(
    candidates: Sequence[tuple[str, int, float]], replicas: int
) -> tuple[str, dict[str, int]]:
    """(choice, scores) among feasible ``(name, free replicas, risk)``: the fewest free
    replicas left after the pod, then the lower risk, then the name; see
    :class:`ReplicaVerdicts` for the scores. Deterministic."""
    if not candidates:
        return "", {}
    best = min(candidates, key=lambda c: (c[1] - replicas, c[2], c[0]))[0]
    scores = {
        name: 10 if name == best else min(9, (9 * replicas) // max(free, 1))
        for name, free, _ in candidates
    }
    return best, scores
