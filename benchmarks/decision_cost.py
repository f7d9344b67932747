"""What decision records cost the verbs (``python -m benchmarks.decision_cost``).

In process, no HTTP (so machine noise from other processes weighs less than over
loopback): the extender over ``synthetic_cluster(N)``, a 4-GPU pod, the fast paths
``Extender.filter_json`` and ``prioritize_json`` timed call by call with recording on and
off alternately (off: ``DecisionLog.record`` replaced by a no-op), then the cost of
explaining one record in full (the inspect API, ``topoplace explain``) and of the
one-line summary bind writes into the placement record. Prints conditions, runs, median
and p99.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

from benchmarks.clusters import make_pod, synthetic_cluster
from scheduler.server.wire import RawBody


def _q(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p * (len(s) - 1))))] * 1e3


def run(nodes: int, calls: int) -> list[str]:
    from scheduler.cli.main import load_params
    from scheduler.runtime.cache import ClusterCache
    from scheduler.runtime.gangs import GangRuntime
    from scheduler.server.extender import Extender

    params = load_params(None)
    obj = synthetic_cluster(nodes)
    ns = [i for i in obj["items"] if i["kind"] == "Node"]
    ps = [i for i in obj["items"] if i["kind"] == "Pod"]
    ext = Extender(ClusterCache.from_objects(ns, ps, params), gangs=GangRuntime())
    import orjson

    body = orjson.dumps(
        {"Pod": make_pod("bench-0", 4), "NodeNames": [n["metadata"]["name"] for n in ns]}
    )
    real = ext.decisions.record

    def noop(*_: Any) -> None:
        return None

    lines = []
    for verb, fn in (("filter", ext.filter_json), ("prioritize", ext.prioritize_json)):
        for _ in range(50):
            fn(RawBody(body), body)
        on: list[float] = []
        off: list[float] = []
        for i in range(2 * calls):
            ext.decisions.record = real if i % 2 == 0 else noop  # type: ignore[method-assign]
            t = time.perf_counter()
            fn(RawBody(body), body)
            (on if i % 2 == 0 else off).append(time.perf_counter() - t)
        ext.decisions.record = real  # type: ignore[method-assign]
        lines.append(
            f"{nodes:>6}  {verb:<11} recording on: median {_q(on, 0.5):.3f} ms, p99 "
            f"{_q(on, 0.99):.3f}; off: median {_q(off, 0.5):.3f}, p99 {_q(off, 0.99):.3f} "
            f"({calls} calls each, alternating)"
        )
    rec = ext.decisions.latest("default/bench-0")
    assert rec is not None
    node = ext.decisions.explained(rec)["chosen"]["node"]
    full, summary = [], []
    for _ in range(50):
        t = time.perf_counter()
        ext.decisions.explained(rec)
        full.append(time.perf_counter() - t)
        t = time.perf_counter()
        ext.decisions.bind_summary("default/bench-0", node)
        summary.append(time.perf_counter() - t)
    st = ext.decisions.stats()
    lines.append(
        f"{nodes:>6}  explain one record: median {statistics.median(full) * 1e3:.2f} ms, p99 "
        f"{_q(full, 0.99):.2f}; bind's summary: median {statistics.median(summary) * 1e3:.2f} "
        f"ms, p99 {_q(summary, 0.99):.2f} (50 runs); ring after the run: {st['records']} "
        f"records, {st['bytes'] / 2**20:.1f} MiB"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per verb and setting")
    args = ap.parse_args(argv)
    print(
        f"decision record cost, in process: synthetic_cluster, 4-GPU pod, shipped policy; "
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    for n in args.sizes:
        for line in run(n, args.calls):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
