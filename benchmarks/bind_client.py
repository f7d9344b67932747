"""Client CPU of one Binding POST: ``KubeApi.create_binding`` (urllib3, blocking) against
``KubeApi.create_binding_async`` (``scheduler.kube.aio.AsyncPoster`` on the event loop).

Needs a real API server (``KUBECONFIG``, e.g. ``../shared/controlplane/up.sh`` with
``fake_nodes.py``; no scheduler has to run). Each run creates ``--pods`` one-GPU pods of a
scheduler nobody runs (profile ``nobody``) in namespace ``--namespace`` and binds half of
them on each path, sequentially, over kept-alive connections, to the existing nodes round
robin; then deletes them. Prints the client's CPU (``time.process_time``) and the wall time
per bind, per path: median and p99 over the binds of all runs, and per-run means.

Run: ``KUBECONFIG=... python -m benchmarks.bind_client [--pods 400] [--runs 3]
[--loop asyncio|uvloop]`` (``serve`` runs uvloop; the default is asyncio's own loop, as the
first figures were measured).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import orjson

from benchmarks.clusters import make_pod
from benchmarks.kubebench import binding, connect
from benchmarks.stats import p99


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=400, help="pods per run (half per path)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--namespace", default="bind-bench")
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    ap.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="event loop of the asyncio path (serve runs uvloop)",
    )
    args = ap.parse_args(argv)
    ns = args.namespace
    api, nodes = connect(ap, args.kubeconfig, ns)
    loop_factory = None
    if args.loop == "uvloop":
        import uvloop

        loop_factory = uvloop.new_event_loop
    cpu: dict[str, list[float]] = {"urllib3 (thread)": [], "asyncio (event loop)": []}
    wall: dict[str, list[float]] = {k: [] for k in cpu}
    means: dict[str, list[float]] = {k: [] for k in cpu}
    for run in range(args.runs):
        tag = f"r{run}-{int(time.time())}"
        names = [f"b-{tag}-{i}" for i in range(args.pods)]
        for name in names:
            pod = make_pod(name, 1, namespace=ns, scheduler_name="nobody")
            api._post_json(f"/api/v1/namespaces/{ns}/pods", orjson.dumps(pod))
        half = len(names) // 2
        order = list(cpu) if run % 2 == 0 else list(reversed(cpu))
        for path in order:
            batch = names[:half] if path == order[0] else names[half:]
            run_cpu: list[float] = []
            if path.startswith("urllib3"):
                for i, name in enumerate(batch):
                    c, w = time.process_time(), time.perf_counter()
                    api.create_binding(ns, name, binding(ns, name, nodes[i % len(nodes)]))
                    run_cpu.append(time.process_time() - c)
                    wall[path].append(time.perf_counter() - w)
            else:

                async def go(
                    batch: list[str] = batch, path: str = path, run_cpu: list[float] = run_cpu
                ) -> None:
                    for i, name in enumerate(batch):
                        c, w = time.process_time(), time.perf_counter()
                        body = binding(ns, name, nodes[i % len(nodes)])
                        await api.create_binding_async(ns, name, body)
                        run_cpu.append(time.process_time() - c)
                        wall[path].append(time.perf_counter() - w)

                with asyncio.Runner(loop_factory=loop_factory) as runner:
                    runner.run(go())
            cpu[path] += run_cpu
            means[path].append(statistics.fmean(run_cpu))
        for name in names:
            api._core.delete_namespaced_pod(
                name, ns, grace_period_seconds=0, _preload_content=False
            )
    print(f"Binding POST, client side: {args.runs} runs x {args.pods // 2} binds per path")
    print(f"API server {api.host}, {len(nodes)} nodes, asyncio path on {args.loop}")
    print("| path | CPU ms median | CPU ms p99 | run means (ms) | wall ms median | wall ms p99 |")
    print("|---|---|---|---|---|---|")
    for path in cpu:
        c = [1000 * x for x in cpu[path]]
        w = [1000 * x for x in wall[path]]
        rm = ", ".join(f"{1000 * m:.3f}" for m in means[path])
        print(
            f"| {path} | {statistics.median(c):.3f} | {p99(c):.3f} | {rm} | "
            f"{statistics.median(w):.3f} | {p99(w):.3f} |"
        )
    api.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
