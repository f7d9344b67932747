"""Preemption replayed live through the real kube-scheduler, next to the engine's replay.

    python -m benchmarks.live.preemption --kube-bin ~/kube-bin-1.33 --out out/preempt

A full cluster of low- and mid-priority work, then high-priority pods that fit nowhere,
one after another. Every arm starts from the same cluster: the filler pods are created
already bound, with topoplace's placement record (node and GPUs), so kube-scheduler,
topoplace and the offline engine all see the same GPUs taken.

* **Nodes**: ``--h100`` DGX H100 (NVSwitch: any GPU set is NVLink) and ``--v100`` DGX-1
  V100 (hybrid cube-mesh: only some 4-GPU sets are NVLink rings), 8 GPUs each, GFD labels.
* **Filler**: each node cut into pods of 1, 2 or 4 GPUs on aligned blocks, priority low
  (10) or mid (100) at random; some 4-GPU blocks on different nodes are paired into
  2-member gangs (a training job's workers). A share (``--protected``) of the pods alone
  carry ``budget: protected``, selected by one PodDisruptionBudget that allows no
  disruption (serving replicas a platform team keeps up): preempting one is a violation.
* **Arrivals**: ``--arrivals`` pods of priority 1000, of 1, 2, 4 or 8 GPUs; a share of the
  4-GPU ones ask ``topoplace.io/min-link: nvlink``. Each is created when the previous one
  is bound (or given up after ``--wait`` s and deleted) and the cluster has settled (no
  pod being deleted, no gang teardown pending).

Arms, each on a fresh control plane, kube-scheduler with the shipped configuration:

* ``topoplace``: as shipped (``preemptVerb: preempt``, the shipped policy: a preempted
  gang's other members evicted by the remediator);
* ``in-tree victims``: the same without ``preemptVerb`` and with ``preemption.start:
  off``: kube-scheduler's DefaultPreemption chooses node and victims by its dry run over
  in-tree filters (GPU counts), topoplace still filters, prioritizes and binds (what
  topoplace did before it answered preemptions);
* ``verb only``: ``preemptVerb`` answered, ``preemption.start: off`` (what topoplace did
  before it started preemptions kube-scheduler does not: with ``--fractional``, arrivals
  that find a free replica without the memory wait).

**Gangs** (``--tp-gangs``): ``--h100`` DGX H100 nodes, each with four of its GPUs held by
filler pods (1, 2 or 4 GPUs, low or mid priority; some 4-GPU blocks paired across nodes
into low-priority 2-member gangs), and arrivals that are gangs of two 4-GPU members of
high priority that must share one node (``topoplace.io/topology-required: node``: tensor
parallelism over NVLink). Every member passes kube-scheduler's filters (four GPUs free on
every node), so kube-scheduler preempts for none: only a preemption topoplace starts for
the whole gang (``started_preemption.start_gang``) places them. An arrival is both members,
created together; it counts as placed when both are bound. The offline row is topoplace's
own extender in process (:func:`offline_gangs`).

**Fractional** (``--fractional``): ``--t4`` nodes of four T4s (15,360 MiB) registered
for HAMi, each GPU split four ways (``nvidia.com/gpu`` advertised as 16 replicas) and
full: four filler pods per GPU of 1,000 to 6,000 MiB (20 % compute each, HAMi's
``vgpu-devices-allocated`` record naming the GPU). Arrivals ask one GPU with 4,000 to
12,000 MiB. kube-scheduler counts replicas only; topoplace's victims must leave one GPU
with the memory. The offline row is topoplace's own extender in process (filter, preempt
with kube-scheduler's candidates by replica count, bind), with the live policy
(``sharing.hami_lock: release``: no HAMi device plugin runs here to release the node lock).

The offline row is the engine on the same objects (:func:`offline`): each arrival placed
by ``place_pod`` if it fits, else preempted by ``select_victims`` among the nodes
kube-scheduler's dry run would offer (where the pod fits by GPU count, CPU and memory
once every lower-priority pod is gone), or, when none helps there, by the preemption
topoplace starts itself (:func:`started_candidates`), the victims and the rest of their
gangs removed, the pod placed on the chosen node with the chosen GPUs. The live topoplace arm is compared
arrival by arrival: the same node, the same pods gone.

Figures per arm: arrivals placed, pods and GPUs preempted, gang members torn down, gangs
left partly running (members bound while another was preempted: GPUs held for a job that
cannot run), protected pods preempted (budget violations), preemptions that freed GPUs the pod could not use (a pod placed on another
node than its victims', or not placed), time from creation to bind (p50, p99).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.clusters import hami_register, make_node, make_pod
from benchmarks.live.fractional import BindRecorder, policy_file, shares
from scheduler.core.disruption import BUDGETS_EXTRA
from scheduler.core.fractional import HAMI_ALLOCATED, HAMI_REGISTER, hami_devices
from scheduler.core.model import PLACEMENT_ANNOTATION
from scheduler.core.objects import placement_value, request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.preemption import (
    lowest_priorities,
    pod_priority,
    select_victims,
    started_choice,
    without_lower,
)
from scheduler.core.schedule import ROOM_CODES, filter_codes, place_pod
from scheduler.core.snapshot import (
    ClusterSnapshot,
    build_snapshot,
    pod_info_for,
    with_pod,
    without_pod,
)

NAMESPACE = "preempt-bench"
T4_MIB = 15360
SPLIT = 4
FILL_MIB = (1000, 2000, 3000, 4000, 6000)
ARRIVAL_MIB = (4000, 6000, 8000, 10000, 12000)
CORES = 20

PRIORITIES = {"low": 10, "mid": 100, "high": 1000}
REPO = Path(__file__).resolve().parents[2]
ARMS = ("topoplace", "in-tree victims", "verb only")
"""``verb only``: topoplace answering kube-scheduler's preemptions but starting none
(``preemption.start: off``, what topoplace did before it preempted for fractional pods
kube-scheduler sees room for); meaningful with ``--fractional``."""


def log(msg: str) -> None:
    print(f"[preempt-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the scenario ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """Node objects, filler pods (bound, with placement records), arrivals (pending), in
    creation order."""

    nodes: list[dict[str, Any]]
    fill: list[dict[str, Any]]
    arrivals: list[dict[str, Any]]
    budgets: list[dict[str, Any]] = field(default_factory=list)


def _pod(
    name: str,
    gpus: int,
    cls: str,
    *,
    node: str | None = None,
    block: Sequence[int] = (),
    gang: str | None = None,
    min_link: str = "",
) -> dict[str, Any]:
    ann = {"topoplace.io/min-link": min_link} if min_link else {}
    p = make_pod(
        name,
        gpus,
        namespace=NAMESPACE,
        node=node,
        gpu_indices=list(block) if node else None,
        gang=gang,
        gang_size=2 if gang else None,
        annotations=ann,
        cpu="4",
        memory="32Gi",
    )
    p["spec"]["priorityClassName"] = f"bench-{cls}"
    p["spec"]["priority"] = PRIORITIES[cls]  # what the Priority admission plugin writes
    p["spec"]["terminationGracePeriodSeconds"] = 0
    p["metadata"].pop("uid", None)
    return p


PROTECTED = {"budget": "protected"}


def budget() -> dict[str, Any]:
    """The PodDisruptionBudget over the protected pods: no disruption allowed (the status
    the disruption controller writes for ``maxUnavailable: 0``)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "protected", "namespace": NAMESPACE},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": dict(PROTECTED)}},
    }


def _fill(
    blocks: Sequence[tuple[str, int, tuple[int, ...]]],
    gang_of: Mapping[int, str],
    rnd: random.Random,
) -> list[dict[str, Any]]:
    """The filler pods of ``blocks`` (node, GPUs, indices): a block in ``gang_of`` is a
    low-priority member of that gang, any other a pod alone of low or mid priority."""
    fill = []
    members: dict[str, int] = {}
    for i, (node, size, block) in enumerate(blocks):
        gang = gang_of.get(i)
        if gang:
            k = members.get(gang, 0)
            members[gang] = k + 1
            fill.append(_pod(f"{gang}-{k}", size, "low", node=node, block=block, gang=gang))
        else:
            cls = rnd.choice(("low", "low", "mid"))
            fill.append(_pod(f"fill-{i:03d}", size, cls, node=node, block=block))
    return fill


def build(seed: int, h100: int, v100: int, arrivals: int, protected: float = 0.0) -> Scenario:
    """The scenario of ``seed`` (deterministic; ``protected`` draws from a stream of its
    own, so the nodes, pods and arrivals are those of the seed without budgets)."""
    rnd = random.Random(seed)
    nodes = [make_node(f"h100-{i:02d}", 8, "h100", machine="DGX-H100") for i in range(h100)]
    nodes += [make_node(f"v100-{i:02d}", 8, "v100", machine="DGX-1") for i in range(v100)]
    blocks: list[tuple[str, int, tuple[int, ...]]] = []
    for n in nodes:
        name = n["metadata"]["name"]
        start = 0
        while start < 8:
            room = [s for s in (1, 2, 4) if start % s == 0 and start + s <= 8]
            size = rnd.choice(room)
            blocks.append((name, size, tuple(range(start, start + size))))
            start += size
    fours = [i for i, b in enumerate(blocks) if b[1] == 4]
    rnd.shuffle(fours)
    gang_of: dict[int, str] = {}
    pairs = 0
    while len(fours) >= 2 and pairs < len(nodes) // 2:
        a = fours.pop()
        b = next((j for j in fours if blocks[j][0] != blocks[a][0]), None)
        if b is None:
            break
        fours.remove(b)
        gang_of[a] = gang_of[b] = f"job-{pairs}"
        pairs += 1
    fill = _fill(blocks, gang_of, rnd)
    _protect(fill, seed, protected)
    arr = []
    for i in range(arrivals):
        size = rnd.choice((1, 2, 4, 4, 8))
        link = "nvlink" if size == 4 and rnd.random() < 0.5 else ""
        arr.append(_pod(f"urgent-{i:02d}", size, "high", min_link=link))
    return Scenario(nodes, fill, arr, [budget()] if protected > 0 else [])


def build_rings(seed: int, v100: int, arrivals: int, protected: float = 0.0) -> Scenario:
    """``--rings``: DGX-1 V100 nodes (hybrid cube-mesh) each with one-GPU pods of low or
    mid priority on four GPUs whose four free GPUs form no NVLink ring, and arrivals of
    4-GPU pods that need NVLink. kube-scheduler counts four free GPUs on every node, so
    its dry run names no victim: only a preemption topoplace starts places them."""
    from scheduler.core.linkclass import class_rank, feasible_sizes
    from scheduler.core.model import indices_to_mask
    from topology import CATALOG

    rnd = random.Random(seed)
    shape, nvlink = CATALOG["dgx1-v100"], class_rank("nvlink")
    patterns = [
        used
        for used in itertools.combinations(range(8), 4)
        if not (feasible_sizes(shape, indices_to_mask(set(range(8)) - set(used)))[nvlink] >> 4) & 1
    ]
    nodes = [make_node(f"v100-{i:02d}", 8, "v100", machine="DGX-1") for i in range(v100)]
    fill = []
    for n in nodes:
        name = n["metadata"]["name"]
        for g in rnd.choice(patterns):
            cls = rnd.choice(("low", "low", "mid"))
            fill.append(_pod(f"fill-{name[-2:]}-{g}", 1, cls, node=name, block=(g,)))
    _protect(fill, seed, protected)
    arr = [_pod(f"urgent-{i:02d}", 4, "high", min_link="nvlink") for i in range(arrivals)]
    return Scenario(nodes, fill, arr, [budget()] if protected > 0 else [])


ONE_NODE = {"topoplace.io/topology-required": "node"}


def build_tp_gangs(seed: int, h100: int, arrivals: int, protected: float = 0.0) -> Scenario:
    """``--tp-gangs`` (module docstring; deterministic): each DGX H100 keeps four GPUs free,
    the other four held by filler pods on aligned blocks; arrivals are gangs ``tp-NN`` of
    two 4-GPU members that must share a node."""
    rnd = random.Random(seed)
    nodes = [make_node(f"h100-{i:02d}", 8, "h100", machine="DGX-H100") for i in range(h100)]
    blocks: list[tuple[str, int, tuple[int, ...]]] = []
    for n in nodes:
        name = n["metadata"]["name"]
        base = rnd.choice((0, 4))  # which half is held
        start = 0
        while start < 4:
            size = rnd.choice([s for s in (1, 2, 4) if start % s == 0 and start + s <= 4])
            blocks.append((name, size, tuple(range(base + start, base + start + size))))
            start += size
    fours = [i for i, b in enumerate(blocks) if b[1] == 4]
    rnd.shuffle(fours)
    gang_of = {}
    for k in range(max(1, len(fours) // 4) if len(fours) > 1 else 0):  # a quarter in pairs
        a, b = fours[2 * k], fours[2 * k + 1]
        gang_of[a] = gang_of[b] = f"job-{k}"
    fill = _fill(blocks, gang_of, rnd)
    _protect(fill, seed, protected)
    arr = []
    for i in range(arrivals):
        for k in range(2):
            p = _pod(f"tp-{i:02d}-{k}", 4, "high", gang=f"tp-{i:02d}")
            p["metadata"]["annotations"].update(ONE_NODE)
            arr.append(p)
    return Scenario(nodes, fill, arr, [budget()] if protected > 0 else [])


def units(arrivals: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The arrivals as created together: a gang's members (consecutive, one gang
    annotation) are one unit, a pod alone another."""
    out: list[list[dict[str, Any]]] = []
    for p in arrivals:
        g = _gang(p)
        if g and out and _gang(out[-1][0]) == g:
            out[-1].append(p)
        else:
            out.append([p])
    return out


def _protect(fill: list[dict[str, Any]], seed: int, share: float) -> None:
    """Label ``share`` of the pods alone for the budget (a stream of its own)."""
    guard = random.Random(seed * 7919 + 1)
    for p in fill:
        if not _gang(p) and guard.random() < share:
            p["metadata"]["labels"] = dict(PROTECTED)


def _device_ids(node: Mapping[str, Any]) -> list[str]:
    """The GPU UUIDs of a HAMi node's register annotation, by index."""
    return [d.uuid for d in hami_devices(node["metadata"]["annotations"][HAMI_REGISTER])]


def _share_pod(
    name: str, mem: int, cls: str, *, node: Mapping[str, Any] | None = None, gpu: int = 0
) -> dict[str, Any]:
    """A HAMi pod of one GPU with ``mem`` MiB and :data:`CORES` % compute; with ``node``
    bound to its GPU ``gpu`` (HAMi's allocation record)."""
    limits = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": str(mem),
        "nvidia.com/gpucores": str(CORES),
    }
    p: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {}},
        "spec": {
            "schedulerName": "topoplace",
            "priorityClassName": f"bench-{cls}",
            "priority": PRIORITIES[cls],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "infer",
                    "image": "registry.k8s.io/pause:3.9",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": limits},
                }
            ],
        },
    }
    if node is not None:
        uuid = _device_ids(node)[gpu]
        p["spec"]["nodeName"] = node["metadata"]["name"]
        p["metadata"]["annotations"] = {
            HAMI_ALLOCATED: f"{uuid},NVIDIA,{mem},{CORES}:;",
            "hami.io/vgpu-node": node["metadata"]["name"],
            "hami.io/bind-phase": "success",
        }
    return p


def build_shares(seed: int, t4: int, arrivals: int, protected: float = 0.0) -> Scenario:
    """The fractional scenario of ``seed`` (see the module docstring; deterministic)."""
    rnd = random.Random(seed)
    nodes = []
    for i in range(t4):
        n = make_node(f"t4-{i:02d}", 4, "t4")
        n["metadata"].setdefault("annotations", {})[HAMI_REGISTER] = hami_register(
            n["metadata"]["name"], 4, T4_MIB, "NVIDIA-Tesla T4", SPLIT
        )
        for part in ("capacity", "allocatable"):
            n["status"][part]["nvidia.com/gpu"] = str(4 * SPLIT)
        nodes.append(n)
    fill = []
    for n in nodes:
        for gpu in range(4):
            sizes = [rnd.choice(FILL_MIB) for _ in range(SPLIT)]
            while sum(sizes) > T4_MIB:
                sizes[sizes.index(max(sizes))] = rnd.choice(FILL_MIB[:2])
            for mem in sizes:
                cls = rnd.choice(("low", "low", "mid"))
                fill.append(_share_pod(f"fill-{len(fill):03d}", mem, cls, node=n, gpu=gpu))
    _protect(fill, seed, protected)
    arr = [_share_pod(f"urgent-{i:02d}", rnd.choice(ARRIVAL_MIB), "high") for i in range(arrivals)]
    return Scenario(nodes, fill, arr, [budget()] if protected > 0 else [])


def is_shares(sc: Scenario) -> bool:
    """True for a fractional scenario."""
    return any(HAMI_ALLOCATED in (p["metadata"].get("annotations") or {}) for p in sc.fill)


def priority_classes() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": f"bench-{cls}"},
            "value": v,
            "preemptionPolicy": "PreemptLowerPriority",
        }
        for cls, v in PRIORITIES.items()
    ]


# ---- what happened at each arrival ----------------------------------------------------------


@dataclass
class Step:
    """One arrival: where it went and what was removed for it."""

    pod: str
    gpus: int
    min_link: str
    node: str | None = None
    gpu_set: list[int] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    gone_gpus: int = 0
    gone_nodes: list[str] = field(default_factory=list)
    bind_s: float | None = None
    gone_mib: int = 0


def _gpus(pod: Mapping[str, Any]) -> int:
    res = pod["spec"]["containers"][0]["resources"].get("limits") or {}
    return int(res.get("nvidia.com/gpu", 0))


def _mib(pod: Mapping[str, Any]) -> int:
    res = pod["spec"]["containers"][0]["resources"].get("limits") or {}
    return int(res.get("nvidia.com/gpumem", 0))


def _allocated_gpus(annotations: Mapping[str, str], node: Mapping[str, Any]) -> list[int]:
    """GPU indices of a HAMi allocation record on ``node``."""
    ids = _device_ids(node)
    value = annotations.get(HAMI_ALLOCATED, "")
    return sorted(ids.index(uuid) for uuid, _, _ in shares(node["metadata"]["name"], value))


def _gang(pod: Mapping[str, Any]) -> str:
    return str((pod["metadata"].get("annotations") or {}).get("topoplace.io/gang", ""))


def _protected(pod: Mapping[str, Any]) -> bool:
    return (pod["metadata"].get("labels") or {}).get("budget") == PROTECTED["budget"]


def summarize(steps: Sequence[Step], fill: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """An arm's figures (see the module docstring)."""
    by_name = {p["metadata"]["name"]: p for p in fill}
    gone = [n for s in steps for n in s.gone]
    protected = sum(1 for n in gone if n in by_name and _protected(by_name[n]))
    gangs: dict[str, list[str]] = {}
    for name, p in by_name.items():
        if _gang(p):
            gangs.setdefault(_gang(p), []).append(name)

    def held_by_partial(gone_now: set[str]) -> tuple[int, int]:
        part = [g for g, ms in gangs.items() if 0 < sum(m in gone_now for m in ms) < len(ms)]
        return len(part), sum(
            _gpus(by_name[m]) for g in part for m in gangs[g] if m not in gone_now
        )

    so_far: set[str] = set()
    after_each = []
    for st in steps:
        so_far.update(st.gone)
        after_each.append(held_by_partial(so_far)[1])
    partial, held = held_by_partial(set(gone))
    members_gone = sum(1 for n in gone if n in by_name and _gang(by_name[n]))
    wasted = sum(1 for s in steps if s.gone and (s.node is None or s.node not in s.gone_nodes))
    times = sorted(s.bind_s for s in steps if s.bind_s is not None)
    return {
        "arrivals": len(steps),
        "placed": sum(1 for s in steps if s.node),
        "preemptions": sum(1 for s in steps if s.gone),
        "pods_gone": len(gone),
        "gpus_gone": sum(s.gone_gpus for s in steps),
        "gang_members_gone": members_gone,
        "gpu_memory_gone_mib": sum(_mib(by_name[n]) for n in gone if n in by_name),
        "budget_violations": protected,
        "gangs_left_partial": partial,
        "gpus_held_by_partial_gangs": held,
        "partial_gang_gpus_after_arrivals": sum(after_each),
        "partial_gang_gpus_max": max(after_each, default=0),
        "preemptions_not_used": wasted,
        "bind_p50_s": round(statistics.median(times), 3) if times else None,
        "bind_p99_s": round(times[min(len(times) - 1, int(0.99 * len(times)))], 3)
        if times
        else None,
    }


# ---- offline ----------------------------------------------------------------------------------


def in_tree_candidates(snap: ClusterSnapshot, req: Any) -> dict[str, set[str]]:
    """Nodes kube-scheduler's dry run would offer: the pod fits there by GPU count, CPU
    and memory once every lower-priority pod is gone, and does not fit now."""
    gone = without_lower(snap, req.priority)
    out: dict[str, set[str]] = {}
    for n in snap.nodes:
        after = gone.node(n.name)
        now_free = n.gpu_allocatable - sum(len(p.gpus) for p in snap.pods_on(n.name))
        free = after.gpu_allocatable - sum(len(p.gpus) for p in gone.pods_on(n.name))
        cpu_ok = not after.cpu_milli or after.cpu_used_milli + req.cpu_milli <= after.cpu_milli
        if free >= req.gpus and cpu_ok and now_free < req.gpus:
            out[n.name] = {p.uid for p in snap.pods_on(n.name) if pod_priority(p) < req.priority}
    return out


def started_candidates(snap: ClusterSnapshot, req: Any, params: SchedParams) -> Any:
    """The victim search of a preemption topoplace starts itself
    (``server.started_preemption``): over the nodes kube-scheduler's filters pass (GPU
    count, CPU and memory free now, so its dry run names no victim there) that topoplace
    refuses only for GPUs taken, where a pod of lower priority is."""
    from scheduler.server.started_preemption import candidates

    cands = []
    for i, n in enumerate(snap.nodes):
        free = n.gpu_allocatable - sum(len(p.gpus) for p in snap.pods_on(n.name))
        cpu_ok = not n.cpu_milli or n.cpu_used_milli + req.cpu_milli <= n.cpu_milli
        if free >= req.gpus and cpu_ok:
            cands.append(i)
    pos = np.array(cands, dtype=np.int64)
    codes = filter_codes(snap, req, pos, params) if len(pos) else pos
    room = [snap.nodes[int(i)].name for i in pos[np.isin(codes, ROOM_CODES)]]
    nodes = candidates(room, snap, lowest_priorities(snap), req.priority)
    return select_victims(snap, req, nodes, params)


def _offline_objects(sc: Scenario) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The filler pods with UIDs (the API server's part) and the budgets as ``extra``."""
    fill = []
    for p in sc.fill:
        q = json.loads(json.dumps(p))
        q["metadata"]["uid"] = f"uid-{q['metadata']['name']}"
        fill.append(q)
    return fill, {BUDGETS_EXTRA: {f"{NAMESPACE}/{b['metadata']['name']}": b for b in sc.budgets}}


def offline(sc: Scenario, params: SchedParams) -> list[Step]:
    """The engine's replay of the scenario (see the module docstring)."""
    fill, extra = _offline_objects(sc)
    snap = build_snapshot(sc.nodes, fill, params, extra=extra)
    steps = []
    for pod in sc.arrivals:
        q = json.loads(json.dumps(pod))
        q["metadata"]["uid"] = f"uid-{q['metadata']['name']}"
        req = request_from_pod(q, params.fabric)
        step = Step(req.name, req.gpus, req.min_link)
        res = place_pod(snap, req, params)
        if not res.ok:
            d = select_victims(snap, req, in_tree_candidates(snap, req), params)
            c = d.chosen
            if params.preemption.start == "evict":  # as started_preemption.cheaper_elsewhere
                alt = started_choice(started_candidates(snap, req, params))
                if alt is not None and (c is None or alt.cost < c.cost):
                    c = alt
            if c is None:
                steps.append(step)
                continue
            step.gone = [v.pod.split("/")[1] for v in c.victims] + [
                k.split("/")[1] for k in c.gang_members
            ]
            step.gone_gpus = c.gpus_disrupted
            step.gone_nodes = sorted(
                {snap.pods[v.pod].node for v in c.victims}
                | {snap.pods[k].node for k in c.gang_members}
            )
            for v in c.victims:
                snap = without_pod(snap, v.pod)
            res = place_pod(snap, req, params)  # the nominated node: the chosen one
            for k in c.gang_members:  # torn down after the pod is placed
                snap = without_pod(snap, k)
        (a,) = res.assignments
        step.node, step.gpu_set = a.node, list(a.gpus)
        q["spec"]["nodeName"] = a.node
        q["metadata"]["annotations"][PLACEMENT_ANNOTATION] = placement_value(a.node, a.gpus, "")
        snap = with_pod(snap, pod_info_for(snap, q, a.node))
        steps.append(step)
    return steps


def in_tree_share_candidates(snap: ClusterSnapshot, pod: Mapping[str, Any]) -> dict[str, set[str]]:
    """Nodes kube-scheduler's dry run would offer a HAMi pod: it counts ``nvidia.com/gpu``
    replicas only, so a node where the replicas are all taken now and would not be with
    every lower-priority pod gone (the victims named are those pods)."""
    prio, want = int(pod["spec"]["priority"]), _gpus(pod)
    out: dict[str, set[str]] = {}
    for n in snap.nodes:
        alloc = int((n.raw.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu", 0))
        on = list(snap.pods_on(n.name))
        taken = sum(len(p.shares) for p in on)
        lower = [p for p in on if pod_priority(p) < prio]
        if taken + want > alloc and taken - sum(len(p.shares) for p in lower) + want <= alloc:
            out[n.name] = {p.uid for p in lower}
    return out


def _in_process(sc: Scenario, policy: Path, gangs: bool = False) -> tuple[Any, BindRecorder]:
    """topoplace's own extender over the scenario's nodes and filler pods (with its gang
    runtime when ``gangs``), binding into a :class:`BindRecorder`: the offline replays that
    run the extender's own verbs."""
    from scheduler.cli.main import load_params
    from scheduler.runtime.cache import ClusterCache
    from scheduler.runtime.gangs import GangRuntime
    from scheduler.server.extender import Extender

    fill, extra = _offline_objects(sc)
    binder = BindRecorder()
    params = load_params(str(policy))
    cache = ClusterCache.from_objects(sc.nodes, fill, params, extra=extra)
    return Extender(cache, binder, gangs=GangRuntime() if gangs else None), binder


def _bind(ext: Any, binder: BindRecorder, pod: Mapping[str, Any], node: str) -> tuple[str, dict]:
    """Bind ``pod`` (with its UID) to ``node`` through the extender's ``bind`` verb: (the
    node, the Binding's annotations); RuntimeError when the bind is refused."""
    md = pod["metadata"]
    body = {"PodName": md["name"], "PodNamespace": NAMESPACE, "PodUID": md["uid"], "Node": node}
    binder.last = None
    res = ext.bind(body)
    if res.get("Error") or binder.last is None:
        raise RuntimeError(f"offline bind of {md['name']} failed: {res.get('Error')}")
    return binder.last


def offline_shares(sc: Scenario, policy: Path) -> list[Step]:
    """The fractional scenario through topoplace's own extender in process: each arrival
    filtered on every node and bound where it fits; else its preemption answered for
    kube-scheduler's candidates (:func:`in_tree_share_candidates`), the victims removed,
    and the pod filtered again on the node named (kube-scheduler's nomination). When
    kube-scheduler has no candidate (it sees a free replica) or topoplace's answer names
    none, the preemption topoplace starts itself (``preemption.start: evict``,
    ``scheduler.server.started_preemption``): its victims removed, its hold taken, and the
    pod filtered again on every node (no nomination: kube-scheduler did not preempt)."""
    from scheduler.server import started_preemption

    ext, binder = _in_process(sc, policy)
    cache, preempt = ext.cache, ext.params.preemption.start
    names = sorted(n["metadata"]["name"] for n in sc.nodes)
    node_objs = {n["metadata"]["name"]: n for n in sc.nodes}
    steps = []
    for pod in sc.arrivals:
        q = json.loads(json.dumps(pod))
        q["metadata"]["uid"] = f"uid-{q['metadata']['name']}"
        step = Step(q["metadata"]["name"], 1, "")
        fit = ext.filter({"Pod": q, "NodeNames": names}).get("NodeNames") or []
        if not fit:
            cands = in_tree_share_candidates(cache.snapshot(), q)
            meta = {
                n: {"Pods": [{"UID": u} for u in sorted(v)], "NumPDBViolations": 0}
                for n, v in cands.items()
            }
            got = ext.preempt({"Pod": q, "NodeNameToMetaVictims": meta}) if cands else {}
            chosen = got.get("NodeNameToMetaVictims") or {}
            started = None
            if not chosen and preempt == "evict":
                started = started_preemption.start(ext, f"{NAMESPACE}/{step.pod}")
                if started is not None:
                    chosen = {started.node: {"Pods": [{"UID": v.uid} for v in started.victims]}}
            if not chosen:
                steps.append(step)
                continue
            ((node, victims),) = chosen.items()
            uids = {v["UID"] for v in victims["Pods"]}
            snap = cache.snapshot()
            for key in sorted(k for k, p in snap.pods.items() if p.uid in uids):
                step.gone.append(key.split("/")[1])
                step.gone_mib += sum(s.memory_mib for s in snap.pods[key].shares)
                cache.delete_pod(key)
            step.gone_gpus = len(step.gone)
            step.gone_nodes = [node]
            if started is not None:  # victims gone: the hold, then every node offered
                started_preemption.settle(ext, f"{NAMESPACE}/{step.pod}")
            retry = names if started is not None else [node]
            fit = ext.filter({"Pod": q, "NodeNames": retry}).get("NodeNames") or []
            if not fit:
                steps.append(step)
                continue
        step.node, annotations = _bind(ext, binder, q, fit[0])
        step.gpu_set = _allocated_gpus(annotations, node_objs[step.node])
        steps.append(step)
    return steps


def offline_gangs(sc: Scenario, policy: Path) -> list[Step]:
    """The ``--tp-gangs`` scenario through topoplace's own extender in process, with its
    gang runtime: each gang's members filtered on every node; refused, the preemption
    topoplace starts for the gang (``started_preemption.start_gang``, kube-scheduler
    preempting for no member), its victims removed, the gang planned (``settle``), the
    rest of the victims' gangs torn down (the remediator's eviction comes after the victim
    is gone), and the members filtered and bound on their planned node."""
    from scheduler.runtime.stranded import gang_record_key
    from scheduler.server import started_preemption

    ext, binder = _in_process(sc, policy, gangs=True)
    cache = ext.cache
    names = sorted(n["metadata"]["name"] for n in sc.nodes)
    steps = []
    for unit in units(sc.arrivals):
        pods = []
        for pod in unit:
            q = json.loads(json.dumps(pod))
            q["metadata"]["uid"] = f"uid-{q['metadata']['name']}"
            pods.append(q)
        gang = _gang(pods[0])
        step = Step(gang or pods[0]["metadata"]["name"], sum(_gpus(q) for q in pods), "")
        fits = [ext.filter({"Pod": q, "NodeNames": names}).get("NodeNames") or [] for q in pods]
        if not all(fits) and ext.params.preemption.start == "evict":
            key = gang_record_key(f"{NAMESPACE}/{gang}")
            chosen = started_preemption.start_gang(ext, key)
            if chosen is not None:
                snap = cache.snapshot()
                gone = [v.pod for v in chosen.victims] + list(chosen.gang_members)
                step.gone = sorted(k.split("/")[1] for k in gone)
                step.gone_gpus = chosen.gpus_disrupted
                step.gone_nodes = sorted({snap.pods[k].node for k in gone})
                for v in chosen.victims:
                    cache.delete_pod(v.pod)
                started_preemption.settle(ext, key)  # planned once the victims are gone
                for k in chosen.gang_members:  # their gangs torn down after, as live
                    cache.delete_pod(k)
                fits = [
                    ext.filter({"Pod": q, "NodeNames": names}).get("NodeNames") or [] for q in pods
                ]
        if not all(fits):
            steps.append(step)
            continue
        placed = []
        for q, fit in zip(pods, fits, strict=True):
            node, annotations = _bind(ext, binder, q, fit[0])
            rec = json.loads(annotations[PLACEMENT_ANNOTATION])
            placed.append((node, list(rec.get("gpus") or [])))
        step.node = ",".join(sorted({n for n, _ in placed}))
        step.gpu_set = [g for _, gs in placed for g in gs]
        steps.append(step)
    return steps


# ---- live -------------------------------------------------------------------------------------


def _live_arm(sc: Scenario, args: argparse.Namespace, arm: str) -> tuple[list[Step], dict]:
    from benchmarks.live.kubesched import (
        KubeScheduler,
        Topoplace,
        load_shipped,
        render_config,
    )
    from benchmarks.live.standalone import down_plane, up_plane

    out = Path(args.out)
    slug = arm.replace(" ", "-")
    shares = is_shares(sc)
    node_objs = {n["metadata"]["name"]: n for n in sc.nodes}
    work_dir, plane, kc, api = up_plane(args, f"preempt-bench-{slug}-")
    tp = ks = None
    steps: list[Step] = []
    try:
        for pc in priority_classes():
            api.call("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", pc, ok=(409,))
        api.ensure_namespace(NAMESPACE)
        for b in sc.budgets:
            api.call("POST", f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets", b)
        api.create_nodes(sc.nodes)
        for p in sc.fill:
            q = json.loads(json.dumps(p))
            q["spec"].pop("priority")  # the Priority admission plugin writes it
            api.create_pod(NAMESPACE, q)
        logs = out / "logs" / slug
        tp = Topoplace(
            kc,
            logs,
            port=args.extender_port,
            source=args.topoplace_src,
            policy=policy_file(out / f"policy-shares-{slug}.yaml", arm == "topoplace")
            if shares
            else _whole_policy(out / f"policy-{slug}.yaml", arm == "topoplace"),
        )
        tp.start()
        cfg = render_config(load_shipped(), kc, tp.extender_url)
        if arm == "in-tree victims":
            for ext in cfg["extenders"]:
                ext.pop("preemptVerb", None)
        ks = KubeScheduler(
            kc,
            tp.extender_url,
            logs,
            port=args.topoplace_sched_port,
            kube_bin=args.kube_bin,
            config=cfg,
        )
        ks.start()
        (out / f"scheduler-config-{slug}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        gpus_of = {p["metadata"]["name"]: _gpus(p) for p in sc.fill}
        mib_of = {p["metadata"]["name"]: _mib(p) for p in sc.fill}
        node_of = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in sc.fill}
        for unit in units(sc.arrivals):
            before = {p["metadata"]["name"] for p in api.list_pods(NAMESPACE)["items"]}
            pods = [json.loads(json.dumps(pod)) for pod in unit]
            for q in pods:
                q["spec"].pop("priority")
            members = [q["metadata"]["name"] for q in pods]
            name = _gang(pods[0]) or members[0]
            step = Step(
                name,
                sum(_gpus(q) for q in pods),
                str(pods[0]["metadata"]["annotations"].get("topoplace.io/min-link", "")),
            )
            t0 = time.monotonic()
            for q in pods:
                api.create_pod(NAMESPACE, q)
            placed: dict[str, tuple[str, list[int]]] = {}
            while time.monotonic() - t0 < args.wait and len(placed) < len(members):
                for m in members:
                    if m in placed:
                        continue
                    got = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{m}")
                    if got["spec"].get("nodeName"):
                        node = got["spec"]["nodeName"]
                        ann = got["metadata"].get("annotations") or {}
                        if shares:
                            gpus = _allocated_gpus(ann, node_objs[node])
                        else:
                            gpus = list(
                                json.loads(ann.get(PLACEMENT_ANNOTATION, "{}")).get("gpus") or []
                            )
                        placed[m] = (node, gpus)
                if len(placed) < len(members):
                    time.sleep(0.05)
            if len(placed) == len(members):
                step.bind_s = round(time.monotonic() - t0, 3)
                step.node = ",".join(sorted({n for n, _ in placed.values()}))
                step.gpu_set = [g for m in members for g in placed[m][1]]
            else:  # all or nothing: a gang partly bound counts as not placed, and goes
                for m in members:
                    api.delete_pod(NAMESPACE, m)
            _settle(api, tp if arm != "in-tree victims" else None, args.settle)
            after = {p["metadata"]["name"] for p in api.list_pods(NAMESPACE)["items"]}
            step.gone = sorted(before - after - set(members))
            step.gone_gpus = sum(gpus_of.get(n, 0) for n in step.gone)
            step.gone_mib = sum(mib_of.get(n, 0) for n in step.gone)
            step.gone_nodes = sorted({node_of[n] for n in step.gone if n in node_of})
            if step.node:
                for q in pods:
                    m = q["metadata"]["name"]
                    gpus_of[m], node_of[m] = _gpus(q), placed[m][0]
            log(
                f"{arm}: {name} ({step.gpus} GPUs{' nvlink' if step.min_link else ''}) -> "
                f"{step.node} in {step.bind_s}s; gone: {', '.join(step.gone) or '-'}"
            )
            steps.append(step)
        return steps, {"preemptions": tp.get("/v1/inspect/preemptions")}
    finally:
        for proc in (ks, tp):
            if proc is not None:
                proc.stop()
        down_plane(api, plane, work_dir, out / "logs" / slug)


def _whole_policy(path: Path, start: bool) -> Path:
    """The shipped policy, with ``preemption.start: off`` unless ``start``."""
    return policy_file(path, start, release_hami_lock=False)


def _settle(api: Any, tp: Any, quiet: float) -> None:
    """Until no pod is being deleted, no gang teardown is pending (topoplace's view) and
    the pod list has not changed for ``quiet`` seconds (at most 30 s)."""
    t_end = time.monotonic() + 30
    last, since = None, time.monotonic()
    while time.monotonic() < t_end:
        items = api.list_pods(NAMESPACE)["items"]
        names = tuple(sorted(p["metadata"]["name"] for p in items))
        busy = any(p["metadata"].get("deletionTimestamp") for p in items)
        if tp is not None and not busy:
            busy = bool(tp.get("/v1/inspect/preemptions")["pending_teardowns"])
        if names != last or busy:
            last, since = names, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        time.sleep(0.1)


# ---- report -----------------------------------------------------------------------------------


def compare(live: Sequence[Step], off: Sequence[Step]) -> dict[str, int]:
    same_node = sum(1 for a, b in zip(live, off, strict=True) if a.node == b.node)
    same_gone = sum(1 for a, b in zip(live, off, strict=True) if sorted(a.gone) == sorted(b.gone))
    both = sum(
        1
        for a, b in zip(live, off, strict=True)
        if a.node == b.node and sorted(a.gone) == sorted(b.gone) and a.gpu_set == b.gpu_set
    )
    return {"same_node": same_node, "same_pods_gone": same_gone, "identical": both}


FIGURES = (
    ("placed", "arrivals placed"),
    ("preemptions", "arrivals that preempted"),
    ("pods_gone", "pods removed"),
    ("gpus_gone", "GPUs removed (fractional: shares)"),
    ("gpu_memory_gone_mib", "GPU memory removed (MiB; fractional)"),
    ("gang_members_gone", "gang members removed"),
    ("budget_violations", "protected pods removed (PodDisruptionBudget violations)"),
    ("gangs_left_partial", "gangs left partly running at the end"),
    ("gpus_held_by_partial_gangs", "GPUs they hold"),
    ("partial_gang_gpus_max", "GPUs held by partly running gangs, most after an arrival"),
    ("partial_gang_gpus_after_arrivals", "the same, summed over arrivals (GPU x arrivals)"),
    ("preemptions_not_used", "preemptions whose GPUs the pod did not get"),
    ("bind_p50_s", "creation to bind p50 (s)"),
    ("bind_p99_s", "creation to bind p99 (s)"),
)


def render(
    sc: Scenario,
    args: argparse.Namespace,
    rows: Mapping[str, dict[str, Any]],
    cmp: Mapping[str, int] | None,
) -> str:
    h = sum(1 for n in sc.nodes if n["metadata"]["name"].startswith("h100"))
    gangs = len({_gang(p) for p in sc.fill if _gang(p)})
    guarded = sum(1 for p in sc.fill if _protected(p))
    kinds = (
        f"{len(sc.nodes)} HAMi nodes of 4 T4s split {SPLIT} ways"
        if is_shares(sc)
        else f"{len(sc.nodes)} nodes ({h} DGX H100, {len(sc.nodes) - h} DGX-1 V100)"
    )
    arrivals = units(sc.arrivals)
    what = (
        f"{len(arrivals)} arrivals (gangs of {len(arrivals[0])} members that must share a node)"
        if arrivals and len(arrivals[0]) > 1
        else f"{len(arrivals)} arrivals"
    )
    lines = [
        "# Preemption, live through kube-scheduler and offline",
        "",
        f"{kinds}, "
        f"{len(sc.fill)} filler pods ({gangs} two-member gangs, {guarded} protected by a "
        f"PodDisruptionBudget allowing no disruption), {what} "
        f"of priority {PRIORITIES['high']}, seed {args.seed}; "
        f"`python -m benchmarks.live.preemption {' '.join(sys.argv[1:])}`.",
        "",
        "| figure | " + " | ".join(rows) + " |",
        "|---|" + "---|" * len(rows),
    ]
    for key, label in FIGURES:
        lines.append(f"| {label} | " + " | ".join(str(r[key]) for r in rows.values()) + " |")
    if cmp is not None:
        n = len(arrivals)
        lines += [
            "",
            f"Live topoplace against the offline engine, arrival by arrival: same node "
            f"{cmp['same_node']} of {n}, same pods removed {cmp['same_pods_gone']} of {n}, "
            f"node, pods removed and GPUs all identical {cmp['identical']} of {n}.",
        ]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from benchmarks.live.standalone import add_plane_args

    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.live.preemption", description=__doc__.split("\n")[0]
    )
    add_plane_args(ap)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--h100", type=int, default=8)
    ap.add_argument("--v100", type=int, default=8)
    ap.add_argument("--arrivals", type=int, default=24)
    ap.add_argument(
        "--fractional",
        action="store_true",
        help="HAMi nodes and pods (see the module docstring) instead of whole GPUs",
    )
    ap.add_argument("--t4", type=int, default=8, help="HAMi nodes with --fractional")
    ap.add_argument(
        "--rings",
        action="store_true",
        help="DGX-1 nodes whose four free GPUs form no NVLink ring, arrivals needing one "
        "(--v100 nodes; see build_rings)",
    )
    ap.add_argument(
        "--tp-gangs",
        action="store_true",
        help="DGX H100 nodes half held, arrivals that are 2-member gangs needing one node "
        "(--h100 nodes; see build_tp_gangs)",
    )
    ap.add_argument(
        "--protected",
        type=float,
        default=0.2,
        help="share of the filler pods alone under a PodDisruptionBudget allowing none",
    )
    ap.add_argument("--wait", type=float, default=30.0, help="seconds an arrival may take")
    ap.add_argument("--settle", type=float, default=1.0, help="quiet seconds between arrivals")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma list of " + ", ".join(ARMS))
    ap.add_argument("--offline-only", action="store_true", help="no control plane: the engine only")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.fractional:
        sc = build_shares(args.seed, args.t4, args.arrivals, args.protected)
        off = offline_shares(sc, policy_file(out / "policy-shares.yaml"))
    elif args.tp_gangs:
        sc = build_tp_gangs(args.seed, args.h100, args.arrivals, args.protected)
        off = offline_gangs(sc, _whole_policy(out / "policy-offline.yaml", True))
    else:
        if args.rings:
            sc = build_rings(args.seed, args.v100, args.arrivals, args.protected)
        else:
            sc = build(args.seed, args.h100, args.v100, args.arrivals, args.protected)
        policy = yaml.safe_load((REPO / "config" / "policy.yaml").read_text())
        off = offline(sc, SchedParams.from_config(policy))
    rows = {"offline topoplace": summarize(off, sc.fill)}
    detail: dict[str, Any] = {"offline topoplace": [asdict(s) for s in off]}
    cmp = None
    if not args.offline_only:
        from benchmarks.live.standalone import missing

        why = missing(args)
        if why:
            print(f"preemption benchmark: {why}", file=sys.stderr)
            return 2
        for arm in [a for a in args.arms.split(",") if a]:
            if arm not in ARMS:
                print(f"unknown arm {arm!r} (one of {', '.join(ARMS)})", file=sys.stderr)
                return 2
            steps, extra = _live_arm(sc, args, arm)
            rows[f"live {arm}"] = summarize(steps, sc.fill)
            detail[f"live {arm}"] = [asdict(s) for s in steps]
            detail[f"live {arm} topoplace"] = extra
            if arm == "topoplace":
                cmp = compare(steps, off)
    text = render(sc, args, rows, cmp)
    (out / "README.md").write_text(text)
    (out / "steps.json").write_text(json.dumps(detail, indent=1, sort_keys=True))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
