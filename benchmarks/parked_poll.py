"""CPU of the janitor's wake check for refused pods (``ParkedPods.poll``), in process.

In kube mode the janitor polls every second, holding the GIL while it does: the cost is
taken from filter and bind. This benchmark fills ``--nodes`` DGX H100 nodes (every GPU held
by a bound pod), refuses ``--parked`` 8-GPU pods through the real ``Extender`` filter (each
offered every node, as kube-scheduler sends them with ``percentageOfNodesToScore: 100``),
then times ``poll``:

* ``idle``: nothing freed since the last poll (the common case);
* ``freed``: one node's pod deleted before each poll (one pod woken, the rest checked);
* ``joined``: a node (full) added before each poll: the node positions move, so every
  parked pod's candidates are mapped onto the new ones.

The waker is ``CountingWakerNoApi`` (a stand-in for the annotation patch through the API,
whose cost is the waker's thread's, not the poll's); nothing is bound (``StubBinderNoApi``).

Prints the conditions and, per case, the median and p99 CPU ms of one poll
(``time.process_time``).

Run: ``python -m benchmarks.parked_poll [--nodes 500 5000] [--parked 100 2000] [--polls 20]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import orjson

from benchmarks.clusters import dgx_h100_nodes, make_pod
from benchmarks.pod_path import StubBinderNoApi
from benchmarks.stats import p99


class CountingWakerNoApi:
    """Stands in for ``PodWaker.wake`` (an API patch per pod): counts the pods."""

    def __init__(self) -> None:
        self.woken = 0

    def __call__(self, keys: list[str], why: str) -> None:
        self.woken += len(keys)


def one_case(nodes: int, parked: int, polls: int) -> dict[str, Any]:
    """Per case: CPU ms of each poll; and the pods parked and woken."""
    from scheduler.cli.main import load_params
    from scheduler.core.snapshot import build_snapshot
    from scheduler.runtime.cache import ClusterCache
    from scheduler.runtime.gangs import GangRuntime
    from scheduler.server import wire
    from scheduler.server.extender import Extender

    params = load_params(None)
    objs = dgx_h100_nodes(nodes)
    names = [o["metadata"]["name"] for o in objs]
    full = [
        make_pod(f"x{i}", 8, namespace="bench", node=n, gpu_indices=list(range(8)))
        for i, n in enumerate(names)
    ]
    cache = ClusterCache(build_snapshot(objs, full, params), params)
    ext = Extender(cache, StubBinderNoApi(), gangs=GangRuntime())
    waker = CountingWakerNoApi()
    ext.parked.waker = waker
    for i in range(parked):
        pod = make_pod(f"p{i}", 8, namespace="bench")
        cache.upsert_pod(pod)
        body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
        assert not orjson.loads(ext.filter_json(wire.RawBody(body), body))["NodeNames"]
    assert len(ext.parked) == parked
    ext.parked.poll(cache)
    out: dict[str, Any] = {"parked": len(ext.parked)}
    extra = dgx_h100_nodes(nodes + polls)[nodes:]
    for case in ("idle", "freed", "joined"):
        times = []
        for i in range(polls):
            if case == "freed":
                cache.delete_pod(f"bench/x{i}")
            elif case == "joined":
                name = extra[i]["metadata"]["name"]
                cache.upsert_node(extra[i])
                cache.upsert_pod(
                    make_pod(f"j{i}", 8, namespace="bench", node=name, gpu_indices=list(range(8)))
                )
            t = time.process_time()
            ext.parked.poll(cache)
            times.append(1000 * (time.process_time() - t))
        out[case] = times
    out["woken"] = waker.woken
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    ap.add_argument("--parked", type=int, nargs="+", default=[100, 2000])
    ap.add_argument("--polls", type=int, default=20, help="polls timed per case")
    args = ap.parse_args(argv)
    print(
        "ParkedPods.poll, in process: DGX H100 nodes all full, 8-GPU pods refused through "
        f"the real filter (offered every node); {args.polls} polls per case "
        "(CPU ms per poll, process_time)"
    )
    print("| nodes | parked | case | median | p99 | pods woken over the freed polls |")
    print("|---|---|---|---|---|---|")
    for n in args.nodes:
        for k in args.parked:
            r = one_case(n, k, args.polls)
            for case in ("idle", "freed", "joined"):
                t = r[case]
                print(
                    f"| {n} | {r['parked']} | {case} | {statistics.median(t):.3f} "
                    f"| {p99(t):.3f} | {r['woken']} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
