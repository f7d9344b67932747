"""``pod-path``: CPU per pod of the extender's whole live path, in one process, stage by
stage, without the network.

What a pod costs topoplace in kube mode, as kube-scheduler and the API server drive it: the
watch's ``ADDED`` event (``cache.upsert_pod`` + ``remember_pending``), ``filter``
(``NodeNames``, a new order of every node for each pod, as kube-scheduler's parallel filter
sends on a large cluster), ``bind`` and the watch's ``MODIFIED`` event of the bound pod. The
verbs run through the real ASGI app (``create_app``: ``VerbRoutes``, body parsing, metrics,
the audit log line) called in-process; the API write is ``StubBinderNoApi`` (a stand-in:
nothing is written), and there is no HTTP server (uvicorn's share is ``extender-latency``'s).
``--background`` bound pods (one CPU each, no GPU) sit in the snapshot first, as every bound
pod of a real cluster does.

Two parts of those stages are also timed on their own, over each pod's real decision record
(the one bind explains): ``decision record`` (``DecisionLog.record`` of the filter decision
into a fresh ring, as filter does) and ``why line`` (``scheduler.core.explain.summarize``,
the one-line why bind writes into the placement record). They are inside ``filter`` and
``bind``, not added to them. A third figure is the explanation of that record, computed
only when asked (``DecisionLog.explained``: the inspect API, ``topoplace explain``). These
three are timed with ``time.perf_counter`` (too short for the process clock), the stages
with ``time.process_time``.

Figures, per stage: median and p99 CPU ms per pod over the pods of all runs, and the mean
of each run. ``topoplace bench pod-path [--nodes 500] [--pods 2000] [--background 0]
[--runs 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import platform
import random
import statistics
import time
from typing import Any

import orjson

from benchmarks.clusters import make_pod, synthetic_cluster
from benchmarks.registry import Figures
from benchmarks.stats import p99
from scheduler.cli.main import load_params
from scheduler.core.explain import summarize
from scheduler.core.model import PLACEMENT_ANNOTATION
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.server.app import create_app
from scheduler.server.decisions import DecisionLog
from scheduler.server.extender import Extender
from scheduler.server.metrics import Metrics

STAGES = ("watch ADDED", "filter", "bind", "watch MODIFIED")
"""The pod's stages, in order; their sum is the pod's CPU."""
PARTS = ("decision record", "why line", "explain")
"""Parts of filter and bind, and the on-request explanation, timed apart (see the module
docstring)."""


class StubBinderNoApi:
    """Stands in for the API server write (which this benchmark does not measure)."""

    def bind(self, pod: Any, node: str, annotations: Any) -> str:
        return ""


async def _call(app: Any, path: str, body: bytes) -> dict[str, Any]:
    sent: list[dict[str, Any]] = []
    msgs = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return msgs.pop(0) if msgs else {"type": "http.disconnect"}

    async def send(m: dict[str, Any]) -> None:
        sent.append(m)

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 40000),
        "query_string": b"",
    }
    await app(scope, receive, send)
    return orjson.loads(sent[-1]["body"])


def one_run(nodes: int, pods: int, background: int, seed: int) -> dict[str, list[float]]:
    """Per-pod CPU seconds of each stage for one fresh extender."""
    objs = synthetic_cluster(nodes)["items"]
    node_objs = [o for o in objs if o["kind"] == "Node"]
    names = [n["metadata"]["name"] for n in node_objs]
    bound = [
        make_pod(
            f"bg{i:06d}",
            0,
            namespace="background",
            node=names[i % len(names)],
            cpu="1",
            memory="1Gi",
        )
        for i in range(background)
    ]
    params = load_params(None)
    cache = ClusterCache.from_objects(node_objs, bound, params)
    ext = Extender(
        cache, StubBinderNoApi(), Metrics(), gangs=GangRuntime(), profiles=("topoplace",)
    )
    app = create_app(ext)
    rng = random.Random(seed)
    todo = [make_pod(f"p{i:05d}", 1, namespace="bench", cpu="1", memory="1Gi") for i in range(pods)]
    bodies = []
    for i, p in enumerate(todo):
        p["metadata"]["uid"] = f"uid-{seed}-{i}"
        p["metadata"]["resourceVersion"] = str(1000 + 2 * i)  # as the API server sets it
        order = names[:]
        rng.shuffle(order)
        bodies.append(orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": order}))
    out: dict[str, list[float]] = {s: [] for s in (*STAGES, *PARTS)}
    ring = DecisionLog(lambda: params)

    async def main() -> None:
        for i, pod in enumerate(todo):
            name = pod["metadata"]["name"]
            t0 = time.process_time()
            cache.upsert_pod(pod)
            cache.remember_pending(pod)
            t1 = time.process_time()
            r = await _call(app, "/scheduler/filter", bodies[i])
            t2 = time.process_time()
            (node,) = r["NodeNames"]
            args = {"PodName": name, "PodNamespace": "bench", "PodUID": pod["metadata"]["uid"]}
            b = await _call(app, "/scheduler/bind", orjson.dumps({**args, "Node": node}))
            t3 = time.process_time()
            if b.get("Error"):
                raise RuntimeError(f"bind {name}: {b['Error']}")
            held = cache.snapshot().pods[f"bench/{name}"]
            now = copy.deepcopy(pod)  # the bound pod as the watch would deliver it
            now["spec"]["nodeName"] = node
            now["metadata"]["resourceVersion"] = str(1001 + 2 * i)
            now["metadata"].setdefault("annotations", {})[PLACEMENT_ANNOTATION] = held.raw[
                "metadata"
            ]["annotations"][PLACEMENT_ANNOTATION]
            t4 = time.process_time()
            cache.upsert_pod(now)
            t5 = time.process_time()
            for stage, dt in zip(STAGES, (t1 - t0, t2 - t1, t3 - t2, t5 - t4), strict=True):
                out[stage].append(dt)
            rec = ext.decisions.latest(f"bench/{name}")
            if rec is None:
                raise RuntimeError(f"filter kept no decision record for bench/{name}")
            t6 = time.perf_counter()
            ring.record(rec.verb, rec.snap, rec.req, rec.pos, rec.basis)
            t7 = time.perf_counter()
            summarize(rec.snap, rec.req, rec.pos, params, rec.verb, chosen=node, basis=rec.basis)
            t8 = time.perf_counter()
            ext.decisions.explained(rec)
            t9 = time.perf_counter()
            out["decision record"].append(t7 - t6)
            out["why line"].append(t8 - t7)
            out["explain"].append(t9 - t8)

    asyncio.run(main())
    return out


def add_arguments(ap: Any) -> None:
    """``--nodes``, ``--pods``, ``--background`` (the runner adds ``--runs``, default 3)."""
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--pods", type=int, default=2000, help="one-GPU pods placed per run")
    ap.add_argument("--background", type=int, default=0, help="bound CPU pods already there")


def run(args: argparse.Namespace) -> Figures:
    """``--runs`` fresh extenders (seeds 0..runs-1), each placing ``--pods`` pods."""
    n_runs = args.runs or 3
    runs = [one_run(args.nodes, args.pods, args.background, seed) for seed in range(n_runs)]
    rows: list[tuple[Any, ...]] = []
    total = [0.0] * n_runs
    for stage in (*STAGES, *PARTS):
        xs = [1000 * x for r in runs for x in r[stage]]
        means = [1000 * statistics.fmean(r[stage]) for r in runs]
        if stage in STAGES:
            total = [t + m for t, m in zip(total, means, strict=True)]
        label = stage if stage in STAGES else f"  of which: {stage}"
        if stage == "explain":
            label = "explain the record (on request)"
        rows.append((label, statistics.median(xs), p99(xs), ", ".join(f"{m:.3f}" for m in means)))
    rows.insert(
        len(STAGES), ("all stages (sum of means)", "", "", ", ".join(f"{t:.3f}" for t in total))
    )
    return Figures(
        "CPU ms per pod, per stage of the pod path (in process, no HTTP)",
        ("stage", "median ms", "p99 ms", "run means ms"),
        rows,
        {"nodes": args.nodes, "pods per run": args.pods, "bound pods before": args.background,
         "runs": n_runs, "pod": "1 GPU", "python": platform.python_version()},
        ("Stages: process CPU time; the parts and the explanation: wall time (perf_counter).",),
    )  # fmt: skip
