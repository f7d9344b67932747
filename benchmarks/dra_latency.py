"""Filter and prioritize of DRA claim pods, in process, as the server answers them.

A pod whose GPUs are ResourceClaims reaches topoplace after kube-scheduler's own
DynamicResources filter: ``NodeNames`` holds the nodes where its claims can be allocated.
For each, topoplace predicts the devices kube-scheduler's allocator will take
(``scheduler.runtime.dra.DraRouter``): filter refuses nodes that cannot take them in its
view, prioritize scores the predicted set's bandwidth.

The cluster: ``--nodes`` DGX H100 nodes (``benchmarks.clusters.dgx_h100_nodes``), each with
one recorded 8-GPU ResourceSlice of ``gpu.nvidia.com`` (``tests/fixtures/kube/dra-1.33``,
renamed per node, a pool per node: ``benchmarks.health_refresh.node_slices``) and the
recorded DeviceClass. ``--held`` of the nodes (a deterministic draw) hold an allocated claim
of 4 GPUs (gpu-0..3, in the shape kube-scheduler writes). Then ``--pods`` claim pods, each
with its own pending claim of 1, 2, 4 and 8 GPUs in turn, arrive one after another; for
each, the benchmark sends what kube-scheduler sends:

* filter: the pod and, in ``NodeNames``, the nodes where its claim can be allocated
  (predicted from scratch beforehand, outside the timing), as JSON bytes through
  ``Extender.filter_json``;
* prioritize: the nodes filter kept, through ``Extender.prioritize_json``.

Nothing changes the cluster between pods (the claims stay pending): each pod's figures are
those of a warm process on an unchanged snapshot. The heap built so far is moved out of the
garbage collector's reach, as ``topoplace serve`` does after its start-up. The first pod after the slices are read
also fills the router's per-node memo; it is reported apart ("first pod").

Prints the conditions and, per node count: wall ms per verb (median, p99 over pods, and the
first pod), the nodes offered and kept. ``--source DIR`` imports ``scheduler`` from
another checkout (before / after on one machine).

Run: ``python -m benchmarks.dra_latency [--nodes 500 1000 5000] [--pods 40] [--held 0.4]
[--source DIR]``
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.checkout import add_source_option, import_scheduler
from benchmarks.stats import p99

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "kube" / "dra-1.33"
COUNTS = (1, 2, 4, 8)


def one_case(nodes: int, pods: int, held: float) -> dict[str, Any]:
    """Wall ms per verb for each pod, and the nodes offered / kept."""
    from benchmarks.clusters import claim_pod, dgx_h100_nodes, resource_claim
    from benchmarks.health_refresh import node_slices
    from scheduler.cli.main import load_params
    from scheduler.core import dra
    from scheduler.runtime.cache import ClusterCache
    from scheduler.server.extender import Extender

    objs = dgx_h100_nodes(nodes)
    names = [o["metadata"]["name"] for o in objs]
    slices = [dict(s, kind="ResourceSlice") for s in node_slices(names)]
    classes = json.loads((FIXTURES / "deviceclasses.v1beta1.json").read_text())["items"]
    classes = [dict(c, kind="DeviceClass") for c in classes]
    inv = dra.inventory(slices)
    rng = random.Random(11)
    claims = []
    for name in sorted(rng.sample(names, int(held * nodes))):
        c = resource_claim(f"held-{name}", 4)
        spec = dra.claim_spec(c)
        c["status"] = {
            "allocation": dra.allocation_status(name, spec, inv.by_node[name][:4]),
        }
        claims.append(c)
    pending = [resource_claim(f"want-{i:04d}", COUNTS[i % len(COUNTS)]) for i in range(pods)]
    extra = dra.extra_of([*classes, *slices, *claims, *pending])
    cache = ClusterCache.from_objects(objs, [], load_params(None), extra=extra)
    ext = Extender(cache)
    from scheduler.cli import main as cli

    cli._settle_heap()  # as `topoplace serve` after its start-up: the heap out of the GC's reach
    in_use = dra.held_device_ids(claims)
    cls = extra[dra.CLASSES_KEY]
    out: dict[str, Any] = {"filter": [], "prioritize": [], "offered": [], "kept": []}
    for i, claim in enumerate(pending):
        spec = dra.claim_spec(claim)
        offered = [
            n for n in names if dra.first_fit(inv, n, [spec], cls, in_use).feasible
        ]  # what kube-scheduler's DynamicResources filter leaves
        pod = claim_pod(f"pod-{i:04d}", claim["metadata"]["name"])
        raw = orjson.dumps({"Pod": pod, "NodeNames": offered})
        t = time.perf_counter()
        reply = ext.filter_json(orjson.loads(raw), raw)
        out["filter"].append(1000 * (time.perf_counter() - t))
        kept = [n.strip() for n in orjson.loads(reply).get("NodeNames") or []]
        raw = orjson.dumps({"Pod": copy.deepcopy(pod), "NodeNames": kept})
        t = time.perf_counter()
        scores = orjson.loads(ext.prioritize_json(orjson.loads(raw), raw))
        out["prioritize"].append(1000 * (time.perf_counter() - t))
        out["offered"].append(len(offered))
        out["kept"].append(len(kept))
        if kept and max(h["Score"] for h in scores) != 10:
            raise SystemExit(f"pod {i}: no node scored 10 among {len(kept)} kept")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[500, 1000, 5000])
    ap.add_argument("--pods", type=int, default=40, help="claim pods per node count")
    ap.add_argument("--held", type=float, default=0.4, help="share of nodes holding 4 GPUs")
    add_source_option(ap)
    args = ap.parse_args(argv)
    src = import_scheduler(args.source)
    print(
        f"DRA claim pods, in process (scheduler from {src}): DGX H100 nodes, one recorded "
        f"8-GPU ResourceSlice each, {args.held:.0%} of them holding a 4-GPU claim; "
        f"{args.pods} pods, claims of {'/'.join(map(str, COUNTS))} GPUs in turn, offered "
        "the nodes where the claim can be allocated; wall ms per verb"
    )
    print("| nodes | verb | median | p99 | first pod | nodes offered (median) | kept (median) |")
    print("|---|---|---|---|---|---|---|")
    for n in args.nodes:
        r = one_case(n, args.pods, args.held)
        for verb in ("filter", "prioritize"):
            t = r[verb]
            print(
                f"| {n} | {verb} | {statistics.median(t):.2f} | {p99(t):.2f} | {t[0]:.2f} "
                f"| {statistics.median(r['offered']):.0f} | {statistics.median(r['kept']):.0f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
