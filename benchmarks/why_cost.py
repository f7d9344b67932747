"""CPU per pod of the decision records and of bind's one-line why (``python -m benchmarks.why_cost``).

In process, no HTTP: the pod path of ``benchmarks/pod_path.py`` (``synthetic_cluster(N)``
nodes, one pod after another: ``filter_json`` with every node in a shuffled order, then
``bind`` to the node it returned) collects, for each bind, the decision record bind
explains and the node. Then, over those real records (each on its own snapshot, as live):

* ``summarize``: :func:`scheduler.core.explain.summarize` as ``DecisionLog.bind_summary``
  calls it (the line written into the placement record under ``why``);
* ``record``: ``DecisionLog.record`` of every filter decision again into a fresh ring of
  the default bounds (its bookkeeping: the snapshot's estimated bytes, evictions).

Prints conditions, then median and p99 per call over all passes (``time.process_time``
is too coarse for a call; ``time.perf_counter``, so run it on a quiet machine).

Run: ``python -m benchmarks.why_cost [--nodes 500] [--pods 1500] [--gpus 1 2 4 8]
[--passes 3]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from typing import Any

import orjson

from benchmarks.clusters import make_pod, synthetic_cluster
from scheduler.cli.main import load_params
from scheduler.core.explain import summarize
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.server.decisions import DecisionLog, Record
from scheduler.server.extender import Extender
from scheduler.server.metrics import Metrics
from scheduler.server.wire import RawBody


class _StubBinderNoApi:
    """Stands in for the API server write (not measured here)."""

    def bind(self, pod: Any, node: str, annotations: Any) -> str:
        return ""


def collect(nodes: int, pods: int, gpus: list[int], seed: int = 0) -> tuple[Any, list[Any]]:
    """The scheduling parameters and, per bind, (the record bind explains, the node)."""
    objs = synthetic_cluster(nodes)["items"]
    node_objs = [o for o in objs if o["kind"] == "Node"]
    names = [n["metadata"]["name"] for n in node_objs]
    params = load_params(None)
    cache = ClusterCache.from_objects(node_objs, [], params)
    ext = Extender(
        cache, _StubBinderNoApi(), Metrics(), gangs=GangRuntime(), profiles=("topoplace",)
    )
    rng = random.Random(seed)
    out: list[tuple[Record, str]] = []
    for i in range(pods):
        pod = make_pod(f"p{i:05d}", gpus[i % len(gpus)], namespace="bench", cpu="1", memory="1Gi")
        pod["metadata"]["uid"] = f"uid-{seed}-{i}"
        cache.upsert_pod(pod)
        cache.remember_pending(pod)
        order = names[:]
        rng.shuffle(order)
        body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": order})
        found = orjson.loads(ext.filter_json(RawBody(body), body))["NodeNames"]
        if not found:
            continue  # the cluster is full for this size
        key = f"bench/{pod['metadata']['name']}"
        rec = ext.decisions.latest(key)
        args = {"PodName": pod["metadata"]["name"], "PodNamespace": "bench"}
        b = ext.bind({**args, "PodUID": f"uid-{seed}-{i}", "Node": found[0]})
        if b.get("Error"):
            raise RuntimeError(f"bind {key}: {b['Error']}")
        if rec is not None:
            out.append((rec, found[0]))
    return params, out


def _q(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))] * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--pods", type=int, default=1500)
    ap.add_argument("--gpus", type=int, nargs="+", default=[1], help="GPUs per pod, in turn")
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args(argv)
    params, binds = collect(args.nodes, args.pods, args.gpus)
    summ: list[float] = []
    rec_t: list[float] = []
    lines = 0
    for _ in range(args.passes):
        for rec, node in binds:
            t = time.perf_counter()
            line = summarize(
                rec.snap, rec.req, rec.pos, params, rec.verb, chosen=node, basis=rec.basis
            )
            summ.append(time.perf_counter() - t)
            lines += bool(line)
        log = DecisionLog(lambda: params)
        for rec, _ in binds:
            t = time.perf_counter()
            log.record(rec.verb, rec.snap, rec.req, rec.pos, rec.basis)
            rec_t.append(time.perf_counter() - t)
    print(
        f"why cost, in process: synthetic_cluster({args.nodes}) nodes, {len(binds)} binds of "
        f"{'/'.join(map(str, args.gpus))}-GPU pods (of {args.pods}), {args.passes} passes; "
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f}; {lines} non-empty lines"
    )
    print("| step | calls | median us | p99 us |")
    print("|---|---|---|---|")
    for name, xs in (("summarize (bind's why)", summ), ("DecisionLog.record", rec_t)):
        print(f"| {name} | {len(xs)} | {statistics.median(xs) * 1e6:.1f} | {_q(xs, 0.99):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
