"""The arrival sequence of a live run, replayed through the engine topoplace uses.

Single pods go through :func:`scheduler.core.schedule.place_pod` on a snapshot built by
:func:`scheduler.core.snapshot.build_snapshot` from the very Node objects the live run
created (read back from the API server); each placement is assumed (``with_pod``) before
the next pod. A gang is planned when its first member arrives, by the gang policy topoplace
is configured with (``placement_policy``), from the requests of all its members and its
declared size, and every slot is held from then on (as topoplace reserves a plan's slots).

kube-scheduler filters nodes before it asks the extender: CPU, memory and pod count
(NodeResourcesFit) and required node affinity. ``place_pod`` knows none of these, so when
some node fails them for a pod, that pod's candidates are narrowed to the nodes that pass
and decided with the same steps ``place_pod`` takes (filter, score, best score then name,
GPU set). ``OfflineResult.narrowed`` counts those pods; with token CPU requests (``mix``)
it is 0 and every decision is ``place_pod``'s own.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scheduler.core.gang import declared_size, gang_request
from scheduler.core.model import PodInfo, PodRequest
from scheduler.core.objects import request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.quantity import cpu_milli, quantity_int
from scheduler.core.schedule import (
    REASON_NO_FEASIBLE_NODE,
    Assignment,
    PlacementResult,
    choose_gpus,
    filter_nodes,
    place_pod,
    score_nodes,
)
from scheduler.core.snapshot import ClusterSnapshot, build_snapshot, with_pod


@dataclass(slots=True)
class OfflineResult:
    """Where the offline engine put each pod.

    Attributes:
        placements: pod name -> (node, GPU indices), pods that were placed.
        refused: pod name -> reason, pods that were not.
        seconds: wall time of the replay (decisions only, snapshot building included).
        narrowed: single pods whose candidates kube-scheduler's own filters would narrow
            (decided among those nodes, see the module docstring).
        gangs: gang name -> "placed" or the policy's reason.
        policy: gang policy used.
        source: ``replay`` (:func:`replay`, built-in scenarios) or ``engine`` (the offline
            engine on a scenario file, :mod:`benchmarks.live.scenariofile`).
        engine: how the engine ran (``engine`` source).
    """

    placements: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    narrowed: int = 0
    gangs: dict[str, str] = field(default_factory=dict)
    policy: str = ""
    source: str = "replay"
    engine: str = ""


def _allocatable(node: Mapping[str, Any]) -> tuple[int, int, int]:
    """(CPU milli, memory bytes, pods) allocatable: what NodeResourcesFit checks."""
    a = (node.get("status") or {}).get("allocatable") or {}
    return (
        cpu_milli(a.get("cpu"), 0),
        quantity_int(a.get("memory"), 0),
        quantity_int(a.get("pods"), 0),
    )


def _has_affinity(pod: Mapping[str, Any]) -> bool:
    aff = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    return bool(aff.get("requiredDuringSchedulingIgnoredDuringExecution"))


def _affinity_ok(pod: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Required node affinity (``In`` / ``NotIn`` / ``Exists`` / ``DoesNotExist`` terms, ORed)."""
    aff = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    req = aff.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = req.get("nodeSelectorTerms") or []
    if not terms:
        return True
    for term in terms:
        ok = True
        for e in term.get("matchExpressions") or []:
            v = labels.get(e["key"])
            op = e["operator"]
            vals = e.get("values") or []
            if (
                (op == "In" and v not in vals)
                or (op == "NotIn" and v in vals)
                or (op == "Exists" and v is None)
                or (op == "DoesNotExist" and v is not None)
            ):
                ok = False
                break
        if ok:
            return True
    return False


def place_among(
    snap: ClusterSnapshot, req: PodRequest, names: Sequence[str], params: SchedParams
) -> PlacementResult:
    """``place_pod``'s steps over ``names`` only (the nodes kube-scheduler would offer)."""
    out = filter_nodes(snap, req, names, params)
    if not out.feasible:
        return PlacementResult(ok=False, reason=REASON_NO_FEASIBLE_NODE)
    scores = score_nodes(snap, req, out.feasible, params)
    best = min(scores, key=lambda s: (-s[1], s[0]))[0]
    gs = choose_gpus(snap, req, best, params)
    if req.gpus and not gs.gpus:
        return PlacementResult(ok=False, reason=gs.error or REASON_NO_FEASIBLE_NODE)
    return PlacementResult(ok=True, assignments=(Assignment(req.key, best, gs.gpus),))


def replay(
    node_objs: Sequence[Mapping[str, Any]],
    pod_objs: Sequence[Mapping[str, Any]],
    params: SchedParams,
) -> OfflineResult:
    """Place ``pod_objs`` (arrival order) on ``node_objs`` as topoplace would, one by one.

    Pods are identified by ``metadata.name`` in the result.
    """
    from scheduler.core.policies.registry import DEFAULT_GANG_POLICY, GANG_POLICIES, get_policy

    t0 = time.perf_counter()
    get_policy(DEFAULT_GANG_POLICY)  # loads the registry
    policy = params.placement_policy if params.placement_policy in GANG_POLICIES else "topoplace"
    plan = get_policy(policy)
    snap = build_snapshot(node_objs, [], params)
    names = list(snap.names)
    pos = {n: i for i, n in enumerate(names)}
    by_name = {n["metadata"]["name"]: n for n in node_objs}
    free = np.array([_allocatable(by_name[n]) for n in names], dtype=np.int64).reshape(-1, 3)
    labels = [by_name[n]["metadata"].get("labels") or {} for n in names]
    res = OfflineResult(policy=policy)
    by_key: dict[str, str] = {}
    reqs: dict[str, PodRequest] = {}
    gang_members: dict[str, list[str]] = {}
    for p in pod_objs:
        name = p["metadata"]["name"]
        r = request_from_pod(p, params.fabric)
        reqs[name] = r
        by_key[r.key] = name
        if r.gang:
            gang_members.setdefault(r.gang, []).append(name)
    objs = {p["metadata"]["name"]: p for p in pod_objs}

    def assume(a: Assignment) -> None:
        nonlocal snap
        pname = by_key[a.pod]
        r = reqs[pname]
        snap = with_pod(
            snap,
            PodInfo(
                key=r.key,
                uid="",
                node=a.node,
                gpus=tuple(a.gpus),
                cpu_milli=r.cpu_milli,
                memory_bytes=r.memory_bytes,
                gang=r.gang,
            ),
        )
        free[pos[a.node]] -= (r.cpu_milli, r.memory_bytes, 1)
        res.placements[pname] = (a.node, tuple(a.gpus))

    for p in pod_objs:
        name = p["metadata"]["name"]
        r = reqs[name]
        if r.gang:
            if r.gang in res.gangs:
                if name not in res.placements:
                    res.refused[name] = res.gangs[r.gang]
                continue
            members = [reqs[m] for m in gang_members[r.gang]]
            greq = gang_request(members, declared_size(r, snap))
            out = plan(snap, greq, params)
            if out.ok and all(a.pod in by_key for a in out.assignments):
                for a in out.assignments:
                    assume(a)
                res.gangs[r.gang] = "placed"
            else:
                res.gangs[r.gang] = out.reason or "not placed"
                res.refused[name] = res.gangs[r.gang]
            continue
        ok = (free[:, 0] >= r.cpu_milli) & (free[:, 1] >= r.memory_bytes) & (free[:, 2] >= 1)
        if _has_affinity(objs[name]):
            ok &= np.array([_affinity_ok(objs[name], lab) for lab in labels], dtype=bool)
        if ok.all():
            out = place_pod(snap, r, params)
        else:
            res.narrowed += 1
            out = place_among(snap, r, [names[i] for i in np.flatnonzero(ok).tolist()], params)
        if out.ok:
            assume(out.assignments[0])
        else:
            res.refused[name] = out.reason
    res.seconds = time.perf_counter() - t0
    return res
