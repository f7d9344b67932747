"""Invariants of a live cluster, checked from the API server's objects alone.

The chaos runner (:mod:`benchmarks.live.chaos`) reads Nodes, Pods, ResourceClaims and
ResourceSlices from the API server every fraction of a second and hands them to
:func:`check`; nothing here asks topoplace what it thinks. A snapshot is judged as
Kubernetes (and the device plugins reading it) would see it:

* **No GPU held twice** (:data:`GPU_HELD_TWICE`): a whole GPU is held by the placement
  record (``topoplace.io/placement``, :func:`scheduler.core.objects.placement_of`) of a
  live bound pod, or by an allocated ResourceClaim's device
  (:func:`scheduler.core.dra.claim_holding`); two different holders of one
  ``(node, GPU index)`` is a violation. A pod and the claim reserved for it
  (``status.reservedFor``, the gated ``nvidia.com/gpu``-by-DRA path) are one holder. A
  record naming an index the node does not have is one too (:data:`RECORD_DISAGREES`).
* **HAMi memory and compute within the device** (:data:`HAMI_OVER_CAPACITY`): the shares
  ``hami.io/vgpu-devices-allocated`` records for every live pod of a node
  (:func:`scheduler.core.fractional.parse_hami_value`) add up to at most the memory and
  compute the node's ``hami.io/node-nvidia-register`` publishes for that device.
* **No DRA device in two claims** (:data:`DRA_HELD_TWICE`): a ``(driver, pool, device)``
  allocated by two different claims.

  A claim holds its devices (here and as a GPU holder above) unless it is *provisional*:
  reserved for no pod, and every live pod naming it still carries topoplace's scheduling
  gate ``topoplace.io/allocate``. That is the gated DRA path's allocation in flight:
  topoplace writes it while kube-scheduler may be allocating the same devices to an
  ungated claim from a view that does not show it yet, checks it against the claims it
  then sees, gives it back on a clash and lifts the gate only when it stands; no pod can
  be scheduled with it before. A clash that outlives the gate (or involves a claim
  reserved for a pod) is a violation.
* **Every bound pod of topoplace's profile carries its record** (:data:`NO_RECORD`): a
  bound pod whose ``schedulerName`` is one of ``profiles`` and which asks for a resource
  the extender manages (``nvidia.com/gpu`` or a HAMi share) has a placement record naming
  its node, or, for a share, HAMi's hand-off naming its node (``hami.io/vgpu-node``).
* **The record agrees with what the backend was told** (:data:`RECORD_DISAGREES`): the
  record's node is the pod's ``spec.nodeName``; its GPU count is the pod's request (not on
  a node whose GPUs are DRA devices: the claim holds them there); on a HAMi node the
  GPUs of the record are the devices HAMi's annotation names; a claim reserved for the pod
  holds exactly the record's GPUs. A record's GPU indices are judged against the node's
  GPU count as the project models it, except on a node it cannot model for now
  (``NodeInfo.unmodeled``: GPU Feature Discovery labels with values it does not know).
* **No gang partly bound beyond its plan's TTL** (:data:`GANG_PARTLY_BOUND`): a gang
  (``gang_of``: key and declared size) with some but not all members bound, whose oldest
  plan record (``created``) is older than its ``ttl`` plus ``gang_grace`` seconds.

Pure functions of their arguments except :func:`read_state`, which performs the reads.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.core import dra
from scheduler.core.fractional import (
    HAMI_ALLOCATED,
    HAMI_MEM,
    HAMI_MEM_PERCENT,
    HAMI_NODE,
    HAMI_REGISTER,
    ShareError,
    milli_capacity,
    node_devices,
    parse_hami_value,
)
from scheduler.core.health import RESOURCESLICES_KEY
from scheduler.core.model import GPU_RESOURCE, NodeInfo
from scheduler.core.objects import (
    gang_of,
    meta,
    object_key,
    placement_of,
    pod_gpus,
    pod_terminated,
)
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import build_snapshot, gpus_by_dra

GPU_HELD_TWICE = "gpu-held-twice"
HAMI_OVER_CAPACITY = "hami-over-capacity"
DRA_HELD_TWICE = "dra-device-held-twice"
NO_RECORD = "bound-without-record"
RECORD_DISAGREES = "record-disagrees"
GANG_PARTLY_BOUND = "gang-partly-bound"
KINDS = (
    GPU_HELD_TWICE,
    HAMI_OVER_CAPACITY,
    DRA_HELD_TWICE,
    NO_RECORD,
    RECORD_DISAGREES,
    GANG_PARTLY_BOUND,
)
"""Every violation kind, in report order."""

MANAGED_RESOURCES = (GPU_RESOURCE, HAMI_MEM, HAMI_MEM_PERCENT)
"""Requests that route a pod through the extender (the shipped ``managedResources`` that
carry a decision; ``nvidia.com/gpucores`` alone never comes without ``nvidia.com/gpu``)."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant in one snapshot.

    Attributes:
        kind: one of :data:`KINDS`.
        subject: what it is about (``node/gpu-3``, ``ns/pod``, ``ns/gang``, a device id).
        detail: a sentence naming the holders or figures involved.
    """

    kind: str
    subject: str
    detail: str

    def key(self) -> tuple[str, str]:
        """(kind, subject): a violation that persists over several polls is one."""
        return self.kind, self.subject


@dataclass(frozen=True, slots=True)
class ApiState:
    """The objects of one read of the API server.

    Attributes:
        nodes / pods / claims / slices: JSON objects as the API server returns them.
        at: wall-clock epoch seconds of the read (gang TTLs are judged against it).
    """

    nodes: tuple[Mapping[str, Any], ...]
    pods: tuple[Mapping[str, Any], ...]
    claims: tuple[Mapping[str, Any], ...] = ()
    slices: tuple[Mapping[str, Any], ...] = ()
    at: float = 0.0
    params: SchedParams = field(default_factory=SchedParams, compare=False)


def live_bound(pod: Mapping[str, Any]) -> str:
    """The node a pod holds resources on (bound, not Succeeded/Failed), or ""."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not isinstance(node, str) or not node or pod_terminated(pod):
        return ""
    return node


def _requests(pod: Mapping[str, Any]) -> set[str]:
    out: set[str] = set()
    for c in (pod.get("spec") or {}).get("containers") or ():
        res = (c or {}).get("resources") or {}
        for part in ("requests", "limits"):
            for k, v in (res.get(part) or {}).items():
                if str(v).strip() not in ("", "0"):
                    out.add(k)
    return out


def _is_share(pod: Mapping[str, Any]) -> bool:
    return bool(_requests(pod) & {HAMI_MEM, HAMI_MEM_PERCENT})


def _node_infos(state: ApiState) -> dict[str, NodeInfo]:
    """The nodes as the project models them (devices from HAMi's register, capacity)."""
    extra = {RESOURCESLICES_KEY: list(state.slices)} if state.slices else None
    snap = build_snapshot(state.nodes, (), state.params, extra=extra)
    return {n.name: n for n in snap.nodes}


def _claim_pods(claim: Mapping[str, Any]) -> list[str]:
    """``namespace/name`` of the pods a claim is reserved for."""
    ns = meta(claim).get("namespace") or "default"
    out = []
    for r in ((claim.get("status") or {}).get("reservedFor")) or ():
        if isinstance(r, Mapping) and r.get("resource") == "pods" and r.get("name"):
            out.append(f"{ns}/{r['name']}")
    return sorted(out)


GATE = "topoplace.io/allocate"
"""The scheduling gate of the gated DRA path (topoplace allocates the pod's claims)."""


def _provisional_claims(state: ApiState) -> set[str]:
    """``namespace/name`` of the claims that are provisional (see the module docstring)."""
    users: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for pod in state.pods:
        if pod_terminated(pod) or meta(pod).get("deletionTimestamp"):
            continue
        ns = meta(pod).get("namespace") or "default"
        for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
            name = ref.get("resourceClaimName") if isinstance(ref, Mapping) else None
            if name:
                users[f"{ns}/{name}"].append(pod)
    out = set()
    for claim in state.claims:
        key = dra.object_key(claim)
        pods = users.get(key)
        if not pods or _claim_pods(claim):
            continue
        if all(
            any(g.get("name") == GATE for g in (p.get("spec") or {}).get("schedulingGates") or ())
            for p in pods
        ):
            out.add(key)
    return out


def check(
    state: ApiState, profiles: Sequence[str] = ("topoplace",), gang_grace: float = 5.0
) -> list[Violation]:
    """Every violation in ``state`` (see the module docstring), sorted by kind then subject.

    Args:
        state: one read of the API server.
        profiles: ``schedulerName`` values whose bound pods must carry topoplace's record.
        gang_grace: seconds past a plan's TTL before a partly bound gang is reported (the
            read and the last bind are not one instant).
    """
    out: list[Violation] = []
    nodes = _node_infos(state)
    inv = dra.inventory(list(state.slices))
    holders: dict[tuple[str, int], list[str]] = defaultdict(list)
    record_gpus: dict[str, tuple[str, tuple[int, ...]]] = {}
    live = [(p, n) for p in state.pods if (n := live_bound(p))]

    # ---- records: presence, node, count, HAMi hand-off --------------------------------
    hami_used: dict[tuple[str, int], list[tuple[str, int, int]]] = defaultdict(list)
    for pod, node_name in live:
        key = object_key(pod)
        ann = meta(pod).get("annotations") or {}
        rec = placement_of(pod)
        ours = (pod.get("spec") or {}).get("schedulerName") in profiles
        managed = bool(_requests(pod) & set(MANAGED_RESOURCES))
        share = _is_share(pod)
        node = nodes.get(node_name)
        if ours and managed:
            if share:
                if ann.get(HAMI_NODE) != node_name and rec is None:
                    out.append(
                        Violation(
                            NO_RECORD,
                            key,
                            f"share bound to {node_name} without HAMi hand-off naming it",
                        )
                    )
            elif rec is None:
                out.append(
                    Violation(NO_RECORD, key, f"bound to {node_name} without a placement record")
                )
        if rec is not None:
            rnode = rec.get("node")
            if rnode is not None and rnode != node_name:
                out.append(
                    Violation(
                        RECORD_DISAGREES, key, f"record names {rnode}, pod is bound to {node_name}"
                    )
                )
            gpus = tuple(sorted(rec["gpus"]))
            if node is not None:
                by_dra = gpus_by_dra(node)
                if not share and not by_dra and gpus and len(gpus) != pod_gpus(pod):
                    out.append(
                        Violation(
                            RECORD_DISAGREES,
                            key,
                            f"record holds {len(gpus)} GPUs, pod asks {pod_gpus(pod)}",
                        )
                    )
                # a node the project cannot model (its labels odd for a while) has no GPU
                # count of the model's to judge an index by: its pods keep their GPUs
                bad = [g for g in gpus if g >= node.gpu_capacity] if not node.unmodeled else []
                if bad:
                    out.append(
                        Violation(
                            RECORD_DISAGREES,
                            key,
                            f"record names GPU {bad} of {node_name} ({node.gpu_capacity} GPUs)",
                        )
                    )
            if not share:
                for g in gpus:
                    holders[(node_name, g)].append(key)
                if gpus:
                    record_gpus[key] = (node_name, gpus)
        hami = ann.get(HAMI_ALLOCATED)
        if hami and node is not None and HAMI_REGISTER in (node.annotations or {}):
            try:
                shares = [s for ctr in parse_hami_value(node, hami) for s in ctr]
            except ShareError as exc:
                out.append(
                    Violation(
                        RECORD_DISAGREES, key, f"HAMi annotation unreadable on {node_name}: {exc}"
                    )
                )
                continue
            for s in shares:
                hami_used[(node_name, s.gpu)].append((key, s.memory_mib, s.milli))
            if rec is not None and not share:
                told = tuple(sorted({s.gpu for s in shares}))
                if told != tuple(sorted(rec["gpus"])):
                    out.append(
                        Violation(
                            RECORD_DISAGREES,
                            key,
                            f"record GPUs {sorted(rec['gpus'])} but HAMi was told {list(told)}",
                        )
                    )

    # ---- DRA: devices, and claims as GPU holders ------------------------------------------
    device_claims: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    provisional = _provisional_claims(state)
    for claim in state.claims:
        if not dra.is_allocated(claim):
            continue
        ckey = dra.object_key(claim)
        if ckey in provisional:
            continue
        for did in dra.allocated_ids(claim):
            device_claims[did].append(ckey)
        held = dra.claim_holding(claim, inv)
        if held is None:
            continue
        node_name, gpus = held
        reserved = _claim_pods(claim)
        holder = reserved[0] if len(reserved) == 1 else dra.holder_key(ckey)
        for pk in reserved:
            got = record_gpus.get(pk)
            if got is not None and got != (node_name, tuple(gpus)):
                out.append(
                    Violation(
                        RECORD_DISAGREES,
                        pk,
                        f"record holds {got[0]} GPUs {list(got[1])}, its claim {ckey} holds {node_name} {list(gpus)}",
                    )
                )
        for g in gpus:
            if holder not in holders[(node_name, g)]:
                holders[(node_name, g)].append(holder)
    for did, cs in sorted(device_claims.items()):
        if len(set(cs)) > 1:
            out.append(
                Violation(
                    DRA_HELD_TWICE, "/".join(did), f"allocated by {', '.join(sorted(set(cs)))}"
                )
            )

    for (node_name, g), who in sorted(holders.items()):
        if len(set(who)) > 1:
            out.append(
                Violation(
                    GPU_HELD_TWICE, f"{node_name}/gpu-{g}", f"held by {', '.join(sorted(set(who)))}"
                )
            )

    for (node_name, g), uses in sorted(hami_used.items()):
        node = nodes[node_name]
        devs = node_devices(node)
        if g >= len(devs):
            continue
        dev = devs[g]
        mem = sum(m for _, m, _ in uses)
        milli = sum(c for _, _, c in uses)
        if (
            (dev.memory_mib and mem > dev.memory_mib)
            or milli > milli_capacity(dev)
            or (dev.split and len(uses) > dev.split)
        ):
            who = ", ".join(sorted(k for k, _, _ in uses))
            out.append(
                Violation(
                    HAMI_OVER_CAPACITY,
                    f"{node_name}/gpu-{g}",
                    f"{mem}/{dev.memory_mib} MiB, {milli}/{milli_capacity(dev)} milli, {len(uses)} tasks: {who}",
                )
            )

    out += _gangs(state, live, gang_grace)
    return sorted(out, key=lambda v: (KINDS.index(v.kind), v.subject, v.detail))


def _gangs(
    state: ApiState, live: Iterable[tuple[Mapping[str, Any], str]], grace: float
) -> list[Violation]:
    size: dict[str, int] = {}
    for p in state.pods:
        gang, n = gang_of(p)
        if gang and n:
            size[gang] = max(size.get(gang, 0), n)
    bound: Counter[str] = Counter()
    since: dict[str, float] = {}
    ttl: dict[str, float] = {}
    for p, _ in live:
        gang, _n = gang_of(p)
        if not gang:
            continue
        bound[gang] += 1
        rec = placement_of(p) or {}
        created, t = rec.get("created"), rec.get("ttl")
        if isinstance(created, int | float) and created > 0:
            since[gang] = min(since.get(gang, created), float(created))
        if isinstance(t, int | float) and t > 0:
            ttl[gang] = max(ttl.get(gang, 0.0), float(t))
    out = []
    for gang, b in sorted(bound.items()):
        want = size.get(gang, 0)
        if not want or b >= want or gang not in since:
            continue
        age = state.at - since[gang]
        limit = ttl.get(gang, 0.0) + grace
        if age > limit:
            out.append(
                Violation(
                    GANG_PARTLY_BOUND,
                    gang,
                    f"{b}/{want} bound {age:.1f}s after its plan (TTL {ttl.get(gang, 0):.0f}s)",
                )
            )
    return out


def counts(violations: Iterable[Violation]) -> dict[str, int]:
    """Violations per kind (every kind present, zeros included)."""
    c = Counter(v.kind for v in violations)
    return {k: c.get(k, 0) for k in KINDS}


# ---- the ledger rebuilt from the API server ---------------------------------------------


def rebuilt_ledger(
    state: ApiState,
) -> dict[str, tuple[str, tuple[int, ...], tuple[tuple[int, int, int], ...]]]:
    """``pod key -> (node, GPUs, shares)`` of every holder the project's own loader
    (:func:`scheduler.core.snapshot.build_snapshot`) finds in ``state``: bound pods holding
    GPUs or shares and allocated claims (``resourceclaim:`` keys). This is what topoplace's
    cache must hold once it has caught up with the API server."""
    extra: dict[str, Any] = {}
    if state.slices:
        extra[RESOURCESLICES_KEY] = list(state.slices)
    if state.claims:
        extra[dra.CLAIMS_KEY] = {dra.object_key(c): c for c in state.claims}
    snap = build_snapshot(state.nodes, state.pods, state.params, extra=extra)
    out = {}
    for key in snap.pods:
        p = snap.pods[key]
        if p.gpus or p.shares:
            out[key] = (
                p.node,
                tuple(sorted(p.gpus)),
                tuple((s.gpu, s.memory_mib, s.milli) for s in p.shares),
            )
    return out


def topoplace_ledger(
    placements: Mapping[str, Any],
) -> dict[str, tuple[str, tuple[int, ...], tuple[tuple[int, int, int], ...]]]:
    """The bound holdings of topoplace's ``GET /v1/inspect/placements`` answer, in the form
    of :func:`rebuilt_ledger` (assumed placements and gang reservations left out)."""
    out = {}
    for row in placements.get("placements") or ():
        if row.get("state") != "bound":
            continue
        out[row["pod"]] = (
            row["node"],
            tuple(sorted(row.get("gpus") or ())),
            tuple(tuple(s) for s in row.get("shares") or ()),
        )
    return out


def ledger_diff(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """Lines describing every key whose holding differs between two ledgers (empty: equal).
    ``ours`` is topoplace's, ``theirs`` the rebuilt one."""
    lines = []
    for k in sorted(set(ours) | set(theirs)):
        a, b = ours.get(k), theirs.get(k)
        if a != b:
            lines.append(f"{k}: topoplace {a} api-server {b}")
    return lines


# ---- reading ------------------------------------------------------------------------------


def read_state(
    api: Any,
    namespace: str,
    label_selector: str = "",
    dra_version: str = "",
    now: float | None = None,
) -> ApiState:
    """One read of the API server through ``api`` (:class:`benchmarks.live.kubeapi.Api`):
    the Nodes (``label_selector``), the Pods and ResourceClaims of ``namespace``, and the
    ResourceSlices when ``dra_version`` names the ``resource.k8s.io`` version served.
    ``now``: the wall clock of the read (default: ``time.time()`` after the reads)."""
    import time

    nodes = api.list_nodes(label_selector)
    pods = api.list_pods(namespace).get("items") or []
    claims: list[Any] = []
    slices: list[Any] = []
    if dra_version:
        base = f"/apis/resource.k8s.io/{dra_version}"
        claims = api.get(f"{base}/namespaces/{namespace}/resourceclaims").get("items") or []
        slices = api.get(f"{base}/resourceslices").get("items") or []
    for p in pods:
        p.setdefault("metadata", {}).setdefault("namespace", namespace)
    return ApiState(
        tuple(nodes), tuple(pods), tuple(claims), tuple(slices), time.time() if now is None else now
    )
