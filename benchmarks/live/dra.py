"""DRA claim pods through the real kube-scheduler, with topoplace and without, and offline.

Opt-in: needs the control-plane binaries (``--kube-bin``, Kubernetes >= 1.32). One
loopback control plane (the test cluster, :mod:`benchmarks.cluster`, DRA served);
``--nodes`` fake 8-GPU nodes that advertise no ``nvidia.com/gpu`` and publish their GPUs
as one ResourceSlice each (:func:`benchmarks.cluster.dra.publish`: the NVIDIA driver's
layout, a pool per node). Then, per arm and run, ``--pods`` pods, each with its own ResourceClaim
of 1, 2, 4 or 8 GPUs in turn (class ``gpu.nvidia.com``), created as a backlog before the
arm's kube-scheduler starts (names that sort in arrival order), as ``benchmarks.live.run``
does:

* ``topoplace``: kube-scheduler with the shipped DRA variant of the configuration
  (``config/deploy/dra/scheduler-config-dra.yaml``: the extender has no
  ``managedResources``, so claim pods reach its filter and prioritize) and
  ``topoplace serve --kubeconfig`` (``--topoplace-src``: another checkout, an A/B);
* ``default``: kube-scheduler alone (its default plugins, DynamicResources included),
  ``percentageOfNodesToScore: 100``, client qps 500 / burst 1000.

Both with the feature gates the version needs for DRA (``DynamicResourceAllocation``,
beta and off by default in 1.32 and 1.33; none from 1.34). Each pod's node and devices are read from its claim's allocation.

**Offline**: the same pods in the same order, on the same Node and ResourceSlice objects,
through topoplace's own router (``scheduler.runtime.dra.DraRouter``): each pod goes to the
node topoplace scores best, with the devices it predicts kube-scheduler's allocator takes
there, and its claim is then held. "placed as offline" counts pods whose live node and
devices are exactly those.

Reports pods/s (first bind to last), nodes used and whole nodes left, placed as offline,
and topoplace's server-side filter and prioritize means (its ``/metrics``), in
``summary.md`` and ``runs.csv`` under ``--out``.

Run::

    python -m benchmarks.live.dra --nodes 200 --pods 200 --runs 2 \\
        --kube-bin $HOME/kube-bin-1.33 --out out/live-dra
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.cluster.dra import publish
from benchmarks.clusters import claim_pod, resource_claim
from benchmarks.live.kubeapi import Api, ApiError
from benchmarks.live.kubesched import KubeScheduler, Topoplace, render_default_config
from benchmarks.live.run import log
from benchmarks.live.scenario import NodeSpec
from benchmarks.live.standalone import (
    REPO,
    add_plane_args,
    down_plane,
    missing,
    pods_per_s,
    source_of,
    up_plane,
    verb_ms,
    wait_bound,
)

VARIANT = REPO / "config" / "deploy" / "dra" / "scheduler-config-dra.yaml"
CLASS = "gpu.nvidia.com"
NAMESPACE = "livebench-dra"
SIZES = (1, 2, 4, 8)
ARMS = {"topoplace": "topoplace", "default": "livebench-dra-default"}
"""Each arm's schedulerName: the shipped profile's (topoplace binds only its profiles' pods),
and a profile of the default arm's own."""


def dra_version(api: Api) -> str:
    """The newest ``resource.k8s.io`` version the server serves."""
    served = {v["version"] for v in api.get("/apis/resource.k8s.io").get("versions", [])}
    for v in ("v1", "v1beta2", "v1beta1"):
        if v in served:
            return v
    raise RuntimeError("the API server serves no resource.k8s.io version (DRA needs >= 1.32)")


def node_objects(count: int, run: str) -> list[dict[str, Any]]:
    """8-GPU H100 nodes that advertise no ``nvidia.com/gpu``: their GPUs are DRA devices."""
    out = []
    for i in range(count):
        labels = {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        obj = NodeSpec(f"dra-{i:05d}", 0, labels=labels).to_object(run)
        for part in ("capacity", "allocatable"):
            obj["status"][part].pop("nvidia.com/gpu", None)
        out.append(obj)
    return out


def claim_object(name: str, count: int, version: str) -> dict[str, Any]:
    """The run's claim ``name`` of ``count`` GPUs (class ``gpu.nvidia.com``)."""
    claim = resource_claim(name, count, version, NAMESPACE, CLASS)
    del claim["metadata"]["uid"]  # the API server gives it
    return claim


def pod_object(name: str, claim: str, scheduler: str) -> dict[str, Any]:
    """The run's pod ``name`` using claim ``claim``."""
    pod = claim_pod(name, claim, scheduler, NAMESPACE)
    del pod["metadata"]["uid"], pod["status"]
    return pod


def workload(pods: int) -> list[tuple[str, str, int]]:
    """(pod, claim, GPUs) in arrival order."""
    return [(f"a{i:05d}-pod", f"a{i:05d}-claim", SIZES[i % len(SIZES)]) for i in range(pods)]


def offline(
    nodes: list[dict[str, Any]],
    slices: list[dict[str, Any]],
    classes: list[dict[str, Any]],
    version: str,
    work: list[tuple[str, str, int]],
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """pod -> (node, device names) topoplace's router gives it, pod after pod."""
    from scheduler.core import dra
    from scheduler.core.params import SchedParams
    from scheduler.runtime.cache import ClusterCache
    from scheduler.runtime.dra import DraRouter

    claims = [dict(claim_object(c, n, version), status={}) for _, c, n in work]
    extra = dra.extra_of([*classes, *slices, *claims])
    cache = ClusterCache.from_objects(nodes, [], SchedParams(), extra=extra)
    router = DraRouter(cache)
    names = sorted(n["metadata"]["name"] for n in nodes)
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for pod_name, claim, _ in work:
        pod = pod_object(pod_name, claim, "offline")
        plans = {p.node: p for p in router.plans(pod, names)}
        ok = [n for n in names if not plans[n].verdict]
        if not ok:
            continue
        scores = dict(router.prioritize(pod, ok))
        best = max(ok, key=lambda n: scores[n])  # the one node scored 10
        devices = plans[best].prediction.devices[0]
        key = f"{NAMESPACE}/{claim}"
        c = copy.deepcopy(cache.snapshot().extra[dra.CLAIMS_KEY][key])
        c["status"] = {"allocation": dra.allocation_status(best, dra.claim_spec(c), devices)}
        cache.apply_claim(key, c)
        out[pod_name] = (best, tuple(d.name for d in devices))
    return out


def _claims_path(version: str, name: str = "") -> str:
    base = f"/apis/resource.k8s.io/{version}/namespaces/{NAMESPACE}/resourceclaims"
    return f"{base}/{name}" if name else base


def create_backlog(api: Api, version: str, work: list[tuple[str, str, int]], sched: str) -> None:
    """Every claim, then every pod, one client, in arrival order."""
    for _, claim, n in work:
        api.call("POST", _claims_path(version), body=claim_object(claim, n, version))
    for pod, claim, _ in work:
        api.create_pod(NAMESPACE, pod_object(pod, claim, sched))


def allocations(api: Api, version: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """claim -> (node, device names) of its allocation."""
    from scheduler.core import dra

    out = {}
    for c in api.get(_claims_path(version)).get("items", []):
        if dra.is_allocated(c):
            devs = tuple(d for _, _, d in dra.allocated_ids(c))
            out[c["metadata"]["name"]] = (dra.allocation_node(c), devs)
    return out


def clear(api: Api, version: str) -> None:
    """Delete the pods, then the claims (their finalizers dropped: no controller runs)."""
    api.delete_pods(NAMESPACE)
    for c in api.get(_claims_path(version)).get("items", []):
        name = c["metadata"]["name"]
        if c["metadata"].get("finalizers"):
            c["metadata"]["finalizers"] = []
            with contextlib.suppress(ApiError):
                api.call("PUT", _claims_path(version, name), body=c)
        with contextlib.suppress(ApiError):
            api.call("DELETE", _claims_path(version, name))
    deadline = time.monotonic() + 60
    while api.get(_claims_path(version)).get("items") and time.monotonic() < deadline:
        time.sleep(0.5)


def run_arm(
    arm: str,
    args: argparse.Namespace,
    api: Api,
    kc: str,
    logs: Path,
    version: str,
    work: list[tuple[str, str, int]],
) -> dict[str, Any]:
    """One arm's run: backlog, scheduler, figures."""
    tp = None
    if arm == "topoplace":
        tp = Topoplace(kc, logs, port=args.extender_port, source=args.topoplace_src)
        tp.start()
        url, port, how = tp.extender_url, args.topoplace_sched_port, {"config_path": VARIANT}
    else:
        cfg = render_default_config(kc, ARMS[arm], percentage_of_nodes_to_score=100)
        url, port, how = "", args.default_sched_port, {"config": cfg}
    gates = args.scheduler_gates
    ks = KubeScheduler(kc, url, logs, port=port, kube_bin=args.kube_bin, extra_args=gates, **how)
    try:
        create_backlog(api, version, work, ARMS[arm])
        ks.start()
        seen = wait_bound(api, NAMESPACE, len(work), args.timeout)
        verbs = verb_ms(tp) if tp is not None else {}
        allocated = allocations(api, version)
    finally:
        ks.stop()
        if tp is not None:
            tp.stop()
    pods_s = pods_per_s(list(seen.values()))
    placed = {p: allocated.get(c) for p, c, _ in work if p in seen}
    used = {v[0] for v in placed.values() if v}
    free = args.nodes - len(used)
    log(f"{arm}: {len(seen)}/{len(work)} bound, {pods_s:.1f} pods/s, {len(used)} nodes used")
    clear(api, version)
    return {
        "arm": arm,
        "bound": len(seen),
        "pods_per_s": pods_s,
        "nodes_used": len(used),
        "whole_nodes_free": free,
        "placed": placed,
        **{
            f"{v}_{k}": verbs[v][k] if v in verbs else float("nan")
            for v in ("filter", "prioritize")
            for k in ("mean_ms", "p99_ms")
        },
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--arms", default="topoplace,default")
    add_plane_args(ap)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    lacking = missing(args)
    if lacking:
        print(lacking, file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = [a for a in args.arms.split(",") if a]
    work_dir, plane, kc, api = up_plane(args, "livebench-dra-", dra=True)
    assert plane.cluster is not None
    args.scheduler_gates = plane.cluster.flags.scheduler_args()
    rows: list[dict[str, Any]] = []
    try:
        version = dra_version(api)
        nodes = node_objects(args.nodes, "dra")
        api.create_nodes(nodes)
        names = [n["metadata"]["name"] for n in nodes]
        publish(api, plane.cluster.version, names)
        api.ensure_namespace(NAMESPACE)
        slices = api.get(f"/apis/resource.k8s.io/{version}/resourceslices").get("items", [])
        classes = api.get(f"/apis/resource.k8s.io/{version}/deviceclasses").get("items", [])
        for o, kind in [(s, "ResourceSlice") for s in slices] + [
            (c, "DeviceClass") for c in classes
        ]:
            o.setdefault("kind", kind)
        live_nodes = api.list_nodes()
        work = workload(args.pods)
        t = time.monotonic()
        want = offline(live_nodes, slices, classes, version, work)
        log(f"offline: {len(want)} placed in {time.monotonic() - t:.1f}s")
        for run in range(1, args.runs + 1):
            for arm in arms if run % 2 else arms[::-1]:
                r = run_arm(arm, args, api, kc, work_dir / "logs", version, work)
                same = sum(
                    1
                    for p, _, _ in work
                    if r["placed"].get(p) is not None
                    and (r["placed"][p][0], tuple(sorted(r["placed"][p][1])))
                    == (want[p][0], tuple(sorted(want[p][1])))
                    if p in want
                )
                r.update(run=run, placed_as_offline=same)
                rows.append(r)
        offline_used = len({v[0] for v in want.values()})
        write(out, args, version, rows, len(want), offline_used)
    finally:
        down_plane(api, plane, work_dir, out)
    return 0


def write(
    out: Path,
    args: argparse.Namespace,
    version: str,
    rows: list[dict[str, Any]],
    offline_placed: int,
    offline_used: int,
) -> None:
    fields = [
        "arm",
        "run",
        "bound",
        "pods_per_s",
        "nodes_used",
        "whole_nodes_free",
        "placed_as_offline",
        "filter_mean_ms",
        "filter_p99_ms",
        "prioritize_mean_ms",
        "prioritize_p99_ms",
    ]
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    med: dict[str, dict[str, float]] = {}
    for arm in {r["arm"] for r in rows}:
        rs = [r for r in rows if r["arm"] == arm]
        med[arm] = {
            k: statistics.median(float("nan") if r[k] is None else float(r[k]) for r in rs)
            for k in fields[2:]
        }
    lines = [
        "# Live DRA claim pods",
        "",
        f"Conditions: {args.nodes} fake 8-GPU nodes, one ResourceSlice each ({version}, "
        f"`benchmarks.cluster.dra`); {args.pods} pods, one claim each of {'/'.join(map(str, SIZES))} "
        f"GPUs in turn, a backlog created before each arm's kube-scheduler starts; "
        f"{args.runs} run(s), arms alternating; topoplace from {source_of(args.topoplace_src)}; "
        "pods/s from the first bind to the last (binds seen by listing every 0.2 s).",
        "",
        f"Offline (topoplace's router, pod after pod): {offline_placed} placed, "
        f"{offline_used} nodes used.",
        "",
        "| arm | runs | pods bound | pods/s | nodes used | whole nodes free | placed as "
        "offline | filter mean / p99 ms | prioritize mean / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, m in sorted(med.items()):
        n = sum(1 for r in rows if r["arm"] == arm)
        lines.append(
            f"| {arm} | {n} | {m['bound']:.0f} | {m['pods_per_s']:.1f} | {m['nodes_used']:.0f} "
            f"| {m['whole_nodes_free']:.0f} | {m['placed_as_offline']:.0f} "
            f"| {m['filter_mean_ms']:.2f} / {m['filter_p99_ms']:.2f} "
            f"| {m['prioritize_mean_ms']:.2f} / {m['prioritize_p99_ms']:.2f} |"
        )
    lines += ["", "Per run:", "", "| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(k, "")) for k in fields) + " |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
