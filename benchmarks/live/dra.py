"""DRA claim pods through the real kube-scheduler, with topoplace and without, and offline.

Opt-in: needs the control-plane binaries (``--kube-bin``, Kubernetes >= 1.32). One
loopback control plane (the test cluster, :mod:`benchmarks.cluster`, DRA served);
``--nodes`` fake 8-GPU nodes that advertise no ``nvidia.com/gpu`` and publish their GPUs
as one ResourceSlice each (:func:`benchmarks.cluster.dra.publish`: the NVIDIA driver's
layout, a pool per node). Then, per arm and run, ``--pods`` pods, each with its own ResourceClaim
of 1, 2, 4 or 8 GPUs in turn (class ``gpu.nvidia.com``), created as a backlog before the
arm's kube-scheduler starts (names that sort in arrival order), as ``benchmarks.live.run``
does, or with ``--pace N`` one by one at N pods/s while it runs (claims first either way):

* ``topoplace``: kube-scheduler with the shipped DRA variant of the configuration
  (``config/deploy/dra/scheduler-config-dra.yaml``: the extender has no
  ``managedResources``, so claim pods reach its filter and prioritize) and
  ``topoplace serve --kubeconfig`` (``--topoplace-src``: another checkout, an A/B);
* ``gated``: the ``topoplace`` arm's setup and pods, each pod created with the scheduling
  gate ``topoplace.io/allocate``: topoplace allocates its claim (NVLink-best) and removes
  the gate (``--settle-s`` sets its ``TOPOPLACE_DRA_SETTLE_S``);
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
topoplace's server-side filter and prioritize means (its ``/metrics``), and each arm's
creation-to-bind p50 / p99 (the benchmark's monotonic time just before a pod's create call
to the receipt of the first watch event showing its ``spec.nodeName``; for the gated arm
also to the first event without gates), with ``gated minus ungated``, in ``summary.md``
and ``runs.csv`` under ``--out``. With a backlog the time to bind includes queueing; the
paced arrival measures one pod's way through.

Run::

    python -m benchmarks.live.dra --nodes 200 --pods 200 --runs 2 \\
        --kube-bin $HOME/kube-bin-1.33 --out out/live-dra
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import math
import statistics
import sys
import threading
import time
from collections.abc import Mapping, Sequence
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
from scheduler.kube.allocator import ENV_SETTLE_S as ENV_SETTLE
from scheduler.kube.allocator import SETTLE_S as SETTLE_DEFAULT_S

VARIANT = REPO / "config" / "deploy" / "dra" / "scheduler-config-dra.yaml"
CLASS = "gpu.nvidia.com"
NAMESPACE = "livebench-dra"
SIZES = (1, 2, 4, 8)
ARMS = {"topoplace": "topoplace", "gated": "topoplace", "default": "livebench-dra-default"}
"""Each arm's schedulerName: the shipped profile's (topoplace binds only its profiles' pods),
and a profile of the default arm's own."""
GATE = "topoplace.io/allocate"
"""The scheduling gate of the ``gated`` arm's pods: topoplace allocates their claims."""
UNGATED = "topoplace"
"""The arm the ``gated`` arm is compared with: the same setup, pods without the gate."""


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


def pod_object(name: str, claim: str, scheduler: str, gated: bool = False) -> dict[str, Any]:
    """The run's pod ``name`` using claim ``claim``; with ``gated``, created with the
    scheduling gate :data:`GATE` (topoplace allocates the claim and removes the gate)."""
    pod = claim_pod(name, claim, scheduler, NAMESPACE)
    del pod["metadata"]["uid"], pod["status"]
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": GATE}]
    return pod


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``; nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def bind_ms(created: Mapping[str, float], bound: Mapping[str, float]) -> dict[str, float]:
    """pod -> milliseconds from its create call to the first sight of its ``spec.nodeName``
    (both monotonic seconds), for the pods that have both."""
    return {p: (bound[p] - t) * 1000.0 for p, t in created.items() if p in bound}


def latency_figures(ms: Sequence[float]) -> dict[str, float]:
    """``bind_p50_ms``, ``bind_p99_ms`` and ``bind_max_ms`` of creation-to-bind samples."""
    return {
        "bind_p50_ms": percentile(ms, 50),
        "bind_p99_ms": percentile(ms, 99),
        "bind_max_ms": max(ms) if ms else float("nan"),
    }


def gated_overhead(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per arm, p50 / p99 over every run's pods pooled (``bind_samples``, ms), and for the
    ``gated`` arm when :data:`UNGATED` ran too, ``gated minus ungated``: its p50 and p99 less
    the ungated arm's (the issue's figure is the p99 difference)."""
    pooled: dict[str, list[float]] = {}
    for r in rows:
        pooled.setdefault(r["arm"], []).extend(r.get("bind_samples") or [])
    out = {
        arm: {"pods": float(len(ms)), **latency_figures(ms)} for arm, ms in sorted(pooled.items())
    }
    if "gated" in out and UNGATED in out:
        g, u = out["gated"], out[UNGATED]
        out["gated minus ungated"] = {
            "pods": float("nan"),
            "bind_p50_ms": g["bind_p50_ms"] - u["bind_p50_ms"],
            "bind_p99_ms": g["bind_p99_ms"] - u["bind_p99_ms"],
            "bind_max_ms": float("nan"),
        }
    return out


class BindWatch:
    """Watches the benchmark's pods from now on, in a thread, and records per pod name the
    monotonic time the watch first delivers it with ``spec.nodeName`` (``bound``) and, for
    a pod created gated, first without scheduling gates (``ungated``)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.bound: dict[str, float] = {}
        self.ungated: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def on_event(self, kind: str, pod: dict[str, Any], t: float) -> None:
        """Record the first sights (``kind`` DELETED is ignored)."""
        if kind == "DELETED":
            return
        name = pod["metadata"]["name"]
        spec = pod.get("spec") or {}
        if not spec.get("schedulingGates"):
            self.ungated.setdefault(name, t)
        if spec.get("nodeName"):
            self.bound.setdefault(name, t)

    def start(self) -> None:
        rv = self.api.list_pods(NAMESPACE)["metadata"]["resourceVersion"]
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"

        def loop() -> None:
            try:
                self.api.watch(path, rv, self.on_event, self._stop, server_timeout=5)
            except BaseException as exc:  # reported by wait()
                self.error = exc

        self._thread = threading.Thread(target=loop, name="bind-watch", daemon=True)
        self._thread.start()

    def wait(self, total: int, timeout: float, idle: float = 20.0) -> dict[str, float]:
        """``bound`` once ``total`` pods are, or nothing bound for ``idle`` s, or ``timeout``
        seconds passed (raises what the watch raised)."""
        start = last = time.monotonic()
        count = -1
        while len(self.bound) < total:
            if self.error is not None:
                raise RuntimeError(f"pod watch failed: {self.error}")
            now = time.monotonic()
            if len(self.bound) != count:
                count, last = len(self.bound), now
            if now - start > timeout or now - last > idle:
                break
            time.sleep(0.05)
        return dict(self.bound)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


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


def create_claims(api: Api, version: str, work: list[tuple[str, str, int]]) -> None:
    """Every claim, one client, in arrival order."""
    for _, claim, n in work:
        api.call("POST", _claims_path(version), body=claim_object(claim, n, version))


def create_pods(
    api: Api,
    work: list[tuple[str, str, int]],
    sched: str,
    gated: bool = False,
    pace: float = 0.0,
) -> dict[str, float]:
    """Every pod, one client, in arrival order: at once (``pace`` 0) or the i-th at
    ``i / pace`` seconds after the first. pod -> monotonic time just before its create call."""
    created: dict[str, float] = {}
    t0 = time.monotonic()
    for i, (pod, claim, _) in enumerate(work):
        if pace > 0:
            delay = t0 + i / pace - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        created[pod] = time.monotonic()
        api.create_pod(NAMESPACE, pod_object(pod, claim, sched, gated))
    return created


def create_backlog(api: Api, version: str, work: list[tuple[str, str, int]], sched: str) -> None:
    """Every claim, then every pod, one client, in arrival order."""
    create_claims(api, version, work)
    create_pods(api, work, sched)


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
    """One arm's run: claims, then pods (a backlog before the scheduler starts, or with
    ``args.pace`` > 0 one by one at that rate once it runs), scheduler, figures."""
    tp = None
    if arm in ("topoplace", "gated"):
        env = {} if args.settle_s is None else {ENV_SETTLE: str(args.settle_s)}
        tp = Topoplace(kc, logs, port=args.extender_port, source=args.topoplace_src, env=env)
        tp.start()
        url, port, how = tp.extender_url, args.topoplace_sched_port, {"config_path": VARIANT}
    else:
        cfg = render_default_config(kc, ARMS[arm], percentage_of_nodes_to_score=100)
        url, port, how = "", args.default_sched_port, {"config": cfg}
    gates = args.scheduler_gates
    ks = KubeScheduler(kc, url, logs, port=port, kube_bin=args.kube_bin, extra_args=gates, **how)
    watch = BindWatch(api)
    gated = arm == "gated"
    try:
        watch.start()
        create_claims(api, version, work)
        if args.pace > 0:
            ks.start()
            created = create_pods(api, work, ARMS[arm], gated, args.pace)
            seen = watch.wait(len(work), args.timeout)
        else:
            created = create_pods(api, work, ARMS[arm], gated)
            ks.start()
            seen = wait_bound(api, NAMESPACE, len(work), args.timeout)
            watch.wait(len(work), 30.0, idle=5.0)
        verbs = verb_ms(tp) if tp is not None else {}
        allocated = allocations(api, version)
    finally:
        watch.stop()
        ks.stop()
        if tp is not None:
            tp.stop()
    lat = bind_ms(created, watch.bound)
    gate_ms = bind_ms(created, watch.ungated) if gated else {}
    wake_ms = [lat[p] - gate_ms[p] for p in lat if p in gate_ms]
    pods_s = pods_per_s(list(seen.values()))
    placed = {p: allocated.get(c) for p, c, _ in work if p in seen}
    used = {v[0] for v in placed.values() if v}
    free = args.nodes - len(used)
    figs = latency_figures(list(lat.values()))
    log(
        f"{arm}: {len(seen)}/{len(work)} bound, {pods_s:.1f} pods/s, {len(used)} nodes used, "
        f"create to bind p50 {figs['bind_p50_ms']:.0f} ms p99 {figs['bind_p99_ms']:.0f} ms"
    )
    clear(api, version)
    return {
        "arm": arm,
        "bound": len(seen),
        "pods_per_s": pods_s,
        "nodes_used": len(used),
        "whole_nodes_free": free,
        "placed": placed,
        "bind_samples": list(lat.values()),
        **figs,
        "ungate_p50_ms": percentile(list(gate_ms.values()), 50),
        "ungate_p99_ms": percentile(list(gate_ms.values()), 99),
        "ungate_to_bind_p50_ms": percentile(wake_ms, 50),
        "ungate_to_bind_p99_ms": percentile(wake_ms, 99),
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
    ap.add_argument("--arms", default="topoplace,default", help=f"of {', '.join(ARMS)}")
    ap.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="pods per second, created one by one while kube-scheduler runs (0: a backlog "
        "created before it starts)",
    )
    ap.add_argument(
        "--settle-s",
        type=float,
        default=None,
        help=f"topoplace's {ENV_SETTLE} (default: topoplace's own, {SETTLE_DEFAULT_S} s)",
    )
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
    timing = [
        "bind_p50_ms",
        "bind_p99_ms",
        "bind_max_ms",
        "ungate_p50_ms",
        "ungate_p99_ms",
        "ungate_to_bind_p50_ms",
        "ungate_to_bind_p99_ms",
    ]
    fields += timing
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
    arrival = (
        f"created one by one at {args.pace:g} pods/s while kube-scheduler runs"
        if args.pace > 0
        else "a backlog created before each arm's kube-scheduler starts"
    )
    lines = [
        "# Live DRA claim pods",
        "",
        f"Conditions: {args.nodes} fake 8-GPU nodes, one ResourceSlice each ({version}, "
        f"`benchmarks.cluster.dra`); {args.pods} pods, one claim each of {'/'.join(map(str, SIZES))} "
        f"GPUs in turn, {arrival}; "
        f"{args.runs} run(s), arms alternating; topoplace from {source_of(args.topoplace_src)}; "
        "pods/s from the first bind to the last (binds seen by "
        f"{'the pod watch' if args.pace > 0 else 'listing every 0.2 s'}).",
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
    settle = SETTLE_DEFAULT_S if args.settle_s is None else args.settle_s
    lines += [
        "",
        "Creation to bind: from the benchmark's monotonic clock just before each pod's create "
        "call to the moment its pod watch first delivers the pod with `spec.nodeName` (ms; "
        "watch events are stamped on receipt, so the resolution is the watch's delivery, a "
        "few ms, not the 1 s of `creationTimestamp`). Pooled over the runs; the gated arm's "
        f"pods carry `{GATE}` (topoplace's {ENV_SETTLE} = {settle:g} s); ungate = create to "
        "the first sight of the pod without gates.",
        "",
        "| arm | pods | p50 ms | p99 ms | max ms |",
        "|---|---|---|---|---|",
    ]
    for arm, f in gated_overhead(rows).items():
        pods = "" if math.isnan(f["pods"]) else f"{f['pods']:.0f}"
        mx = "" if math.isnan(f["bind_max_ms"]) else f"{f['bind_max_ms']:.0f}"
        lines.append(f"| {arm} | {pods} | {f['bind_p50_ms']:.0f} | {f['bind_p99_ms']:.0f} | {mx} |")
    lines += ["", "Per run:", "", "| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(k, "")) for k in fields) + " |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _cell(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    raise SystemExit(main())
