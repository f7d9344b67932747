"""``preemption-latency``: time of one ``preempt`` answer (``Extender.preempt``), in process.

kube-scheduler calls the verb once per preemption, with its dry run's candidates: at most
``max(10 % of the nodes, 100)`` nodes (DefaultPreemption's ``minCandidateNodesPercentage``
and ``minCandidateNodesAbsolute``), each with the victims it picked. topoplace then finds
its own victims on every candidate (a snapshot without them, pods offered back, its filter
each time), so the answer costs in proportion to the candidates and the pods on them.

This benchmark builds ``--nodes`` DGX H100 nodes (``benchmarks.clusters.make_node``), every
GPU held by bound pods of priority 10 (per node: one 4-GPU pod, two 1-GPU pods, one 2-GPU
pod; every eighth 4-GPU pod a member of a two-member gang), and times the answer for a
4-GPU pod of priority 1000 given kube-scheduler's candidate count, as the HTTP app calls
it (the JSON body parsed, the answer built), and the pure decision alone
(``select_victims``).

With ``--budgets B`` the pods carry ``app: svc-<k>`` (k = the pod's position modulo
``2 B``) and ``B`` PodDisruptionBudgets select ``svc-0`` .. ``svc-<B-1>`` (one disruption
allowed each): half the pods are under a budget, as in a cluster with many services.

Figures: the conditions and, per case, the median and p99 ms over ``--runs`` answers (wall
time, ``time.perf_counter``; the verb runs on a worker thread).

A second table times the victim search of a preemption topoplace starts itself
(``scheduler.server.started_preemption.start``, dry run) for a pod refused on every node,
and the same call for a pod with nothing of lower priority on its nodes (its cheap exit).

``topoplace bench preemption-latency [--nodes 500 5000] [--runs 20] [--budgets B]``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from typing import Any

from benchmarks.registry import Figures
from benchmarks.stats import p99


def budgets(b: int) -> dict[str, Any]:
    """``b`` PodDisruptionBudgets as ``snapshot.extra`` (see the module docstring)."""
    from scheduler.core.disruption import BUDGETS_EXTRA

    out = {}
    for k in range(b):
        out[f"default/svc-{k}"] = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": f"svc-{k}", "namespace": "default"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": f"svc-{k}"}}},
            "status": {"disruptionsAllowed": 1},
        }
    return {BUDGETS_EXTRA: out}


def cluster(n: int, b: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``n`` nodes, every GPU held (see the module docstring)."""
    from benchmarks.clusters import make_node, make_pod

    nodes = [make_node(f"dgx-{i:05d}", 8, "h100", machine="DGX-H100") for i in range(n)]
    pods = []
    for i, node in enumerate(nodes):
        name = node["metadata"]["name"]
        gang = f"job-{i // 16}" if i % 8 == 0 else None
        for k, (size, block) in enumerate(((4, [0, 1, 2, 3]), (1, [4]), (1, [5]), (2, [6, 7]))):
            p = make_pod(
                f"p-{i:05d}-{k}",
                size,
                node=name,
                gpu_indices=block,
                gang=gang if k == 0 else None,
                gang_size=2,
                labels={"app": f"svc-{len(pods) % (2 * b)}"} if b else None,
            )
            p["spec"]["priority"] = 10
            pods.append(p)
    return nodes, pods


def add_arguments(ap: Any) -> None:
    """``--nodes``, ``--budgets`` (the runner adds ``--runs``: answers per case, default 20)."""
    ap.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    ap.add_argument("--budgets", type=int, default=0, help="PodDisruptionBudgets (see above)")


def run(args: argparse.Namespace) -> Figures:
    """Per node count: the preempt verb, ``select_victims``, and the started preemption's
    search (and its cheap exit); median and p99 wall ms over ``--runs`` answers.

    Raises:
        RuntimeError: the verb and the pure decision chose different nodes.
    """
    import orjson

    from benchmarks.clusters import make_pod
    from scheduler.cli.main import load_params
    from scheduler.core.objects import request_from_pod
    from scheduler.core.preemption import select_victims
    from scheduler.runtime.cache import ClusterCache
    from scheduler.runtime.gangs import GangRuntime
    from scheduler.server.extender import Extender

    runs = args.runs or 20
    params = load_params(None)
    rows: list[tuple[Any, ...]] = []
    for n in args.nodes:
        nodes, pods = cluster(n, args.budgets)
        extra = budgets(args.budgets) if args.budgets else None
        cache = ClusterCache.from_objects(nodes, pods, params, extra=extra)
        ext = Extender(cache, gangs=GangRuntime())
        snap = cache.snapshot()
        pending = make_pod("urgent", 4)
        pending["spec"]["priority"] = 1000
        req = request_from_pod(pending, params.fabric)
        by_node: dict[str, list[str]] = {}
        for p in snap.pods.values():
            if len(p.gpus) == 4:
                by_node[p.node] = [p.uid]
        names = sorted(by_node)[: min(len(by_node), max(n // 10, 100))]
        body = orjson.dumps(
            {
                "Pod": pending,
                "NodeNameToVictims": None,
                "NodeNameToMetaVictims": {
                    m: {"Pods": [{"UID": u} for u in by_node[m]], "NumPDBViolations": 0}
                    for m in names
                },
            }
        )
        verb, core = [], []
        chosen = ""
        for _ in range(runs):
            ext.preemptions = type(ext.preemptions)(cache.now)  # a fresh pod each time
            t = time.perf_counter()
            ans = ext.preempt(orjson.loads(body))
            verb.append(1000 * (time.perf_counter() - t))
            t = time.perf_counter()
            d = select_victims(snap, req, {m: set(by_node[m]) for m in names}, params)
            core.append(1000 * (time.perf_counter() - t))
            (chosen,) = ans["NodeNameToMetaVictims"]
            if d.chosen is None or d.chosen.node != chosen:
                raise RuntimeError(f"the verb chose {chosen}, select_victims {d.chosen}")
        size = (len(snap.nodes), len(snap.pods), len(names))
        rows.append(("preempt verb", *size, statistics.median(verb), p99(verb), chosen))
        rows.append(("select_victims", *size, statistics.median(core), p99(core), chosen))
        rows += _started(ext, pending, runs)
    return Figures(
        "Time of one preemption answer (wall ms, in process)",
        ("answer", "nodes", "pods", "candidates / searched", "median ms", "p99 ms", "chosen"),
        rows,
        {
            "nodes": "DGX H100, every GPU held by pods of priority 10 (4 + 1 + 1 + 2 GPUs per "
            "node, every eighth 4-GPU pod in a gang of 2)",
            "pod": "4 GPUs, priority 1000",
            "candidates": "kube-scheduler's: max(10 %, 100) nodes, the 4-GPU pod as victim",
            "budgets": args.budgets,
            "answers per case": runs,
        },  # fmt: skip
        (
            "started preemption: started_preemption.start (dry run) for the pod refused on every "
            "node, the search bounded to max(100, 10 %) nodes; 'nothing lower': a pod of "
            "priority 10 whose nodes hold nothing it may preempt (its cheap exit).",
        ),
    )


def _started(ext: Any, pending: dict[str, Any], runs: int) -> list[tuple[Any, ...]]:
    """The started-preemption rows for ``ext``'s cluster: the search and its cheap exit."""
    import copy

    from scheduler.core.preemption import lowest_priorities
    from scheduler.runtime.stranded import StrandedPods
    from scheduler.server import started_preemption

    logging.getLogger(started_preemption.__name__).setLevel(logging.ERROR)  # its dry-run lines
    cache = ext.cache
    snap = cache.snapshot()
    names = [n.name for n in snap.nodes]
    low = copy.deepcopy(pending)
    low["metadata"]["name"], low["metadata"]["uid"] = "low", "uid-low"
    low["spec"]["priority"] = 10
    cache.remember_pending(pending)
    cache.remember_pending(low)
    lowest = lowest_priorities(snap)  # once per pass in the preemptor, shared by its pods
    searched = len(started_preemption.candidates(names, snap, lowest, 1000))
    times, cheap = [], []
    chosen = ""
    for _ in range(runs):
        ext.preemptions = type(ext.preemptions)(cache.now)
        ext.stranded = StrandedPods()
        ext.stranded.refused("default/urgent", names, cache.now() - 10)
        ext.stranded.refused("default/low", names, cache.now() - 10)
        t = time.perf_counter()
        started_preemption.start(ext, "default/urgent", True, lowest)
        times.append(1000 * (time.perf_counter() - t))
        (answer,) = ext.preemptions.view()["recent"]
        chosen = answer["chosen"]["node"]
        t = time.perf_counter()
        started_preemption.start(ext, "default/low", True, lowest)
        cheap.append(1000 * (time.perf_counter() - t))
    size = (len(names), len(snap.pods), searched)
    return [
        ("started preemption", *size, statistics.median(times), p99(times), chosen),
        ("started: nothing lower", *size, statistics.median(cheap), p99(cheap), ""),
    ]
