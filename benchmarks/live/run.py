"""Live benchmark runner: one arrival sequence through the real kube-scheduler with topoplace
as extender, through default-scheduler alone, and through the offline engine.

Steps: start a loopback control plane (``../shared/controlplane/up.sh`` with
``EXTENDER_URL=none``: its kube-scheduler serves ``default-scheduler`` without extender),
create the scenario's nodes (parallel raw REST), start ``topoplace serve --kubeconfig``
and kube-scheduler with the configuration topoplace ships (profile ``topoplace``), replay
the sequence offline on the very Node objects the API server holds, then per run and arm
create the pods in arrival order, watch their bindings until all are bound or nothing
moves for ``--idle-timeout`` seconds, record the figures, and delete the pods. Arms
alternate their order from one run to the next. Everything started is stopped by pid;
the plane is removed (``down.sh --purge``) unless ``--keep-work``.

Example (small; the acceptance scale is ``--nodes 500 --big 100 --small 2000``)::

    python -m benchmarks.live.run --scenario mix --nodes 50 --big 10 --small 200 \\
        --out /tmp/livebench-out

Results: ``summary.md`` (conditions, medians over runs, gaps), ``runs.csv`` (one row per
run and arm), ``pods-<arm>-<run>.csv`` (node and latency of every pod), and the rendered
``scheduler-config.yaml``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.live.kubeapi import Api, parallel
from benchmarks.live.kubesched import (
    DEFAULT_KUBE_BIN,
    REPO,
    KubeScheduler,
    Topoplace,
    binary_version,
)
from benchmarks.live.metrics import (
    Figures,
    compare_with_offline,
    metric_deltas,
    parse_prometheus,
    placement_figures,
    timing_figures,
)
from benchmarks.live.offline import OfflineResult, replay
from benchmarks.live.scenario import (
    PHASE_LABEL,
    RUN_LABEL,
    Scenario,
    mix_scenario,
    openb_scenario,
)

CONTROLPLANE = REPO.parent / "shared" / "controlplane"
DEFAULT_SCHEDULER = "default-scheduler"
ARMS = ("topoplace", "default")


def log(msg: str) -> None:
    print(f"[livebench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- control plane --------------------------------------------------------------------------


@dataclass
class Plane:
    """A loopback control plane started by ``up.sh`` (stopped by ``down.sh``, by pid)."""

    work: Path
    kube_bin: Path
    api_port: int
    etcd_port: int
    etcd_peer_port: int
    sched_port: int
    scripts: Path = CONTROLPLANE
    kubeconfig: str = ""

    def up(self) -> str:
        env = {
            **os.environ,
            "KUBE_BIN": str(self.kube_bin),
            "EXTENDER_URL": "none",
            "API_PORT": str(self.api_port),
            "ETCD_PORT": str(self.etcd_port),
            "ETCD_PEER_PORT": str(self.etcd_peer_port),
            "SCHED_PORT": str(self.sched_port),
        }
        self.work.mkdir(parents=True, exist_ok=True)
        with open(self.work / "up.log", "wb") as err:
            out = subprocess.run(
                ["bash", str(self.scripts / "up.sh"), str(self.work)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                check=False,
            )
        if out.returncode != 0:
            raise RuntimeError(f"up.sh failed (rc {out.returncode}); see {self.work}/up.log")
        self.kubeconfig = out.stdout.decode().strip().splitlines()[-1]
        return self.kubeconfig

    def down(self, purge: bool) -> None:
        cmd = ["bash", str(self.scripts / "down.sh"), str(self.work)]
        if purge:
            cmd.append("--purge")
        subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ---- one arm --------------------------------------------------------------------------------


@dataclass
class ArmResult:
    figures: Figures
    nodes_of: dict[str, str] = field(default_factory=dict)
    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)


def run_arm(
    api: Api,
    scenario: Scenario,
    *,
    arm: str,
    scheduler_name: str,
    run: int,
    run_id: str,
    namespace: str,
    labels: Mapping[str, Any],
    timeout: float,
    idle_timeout: float,
    rate: float,
    topoplace: Topoplace | None,
    create_workers: int = 1,
) -> ArmResult:
    """Create the scenario's pods in order for ``scheduler_name``, watch them bind.

    With ``create_workers`` > 1, pods are handed out in arrival order to that many
    concurrent clients, so two pods less than ``create_workers`` apart may reach the API
    server in either order."""
    phase = f"{arm}-{run}"
    selector = f"{PHASE_LABEL}={phase}"
    pods = [p.to_object(namespace, scheduler_name, run_id, phase) for p in scenario.pods]
    path = f"/api/v1/namespaces/{namespace}/pods"
    rv = api.list_pods(namespace, selector)["metadata"]["resourceVersion"]
    res = ArmResult(Figures(arm=arm, run=run))
    lock = threading.Lock()
    last = [time.monotonic()]
    errors: list[BaseException] = []

    def on_event(kind: str, obj: dict[str, Any], t: float) -> None:
        if kind not in ("ADDED", "MODIFIED"):
            return
        node = (obj.get("spec") or {}).get("nodeName")
        name = obj["metadata"]["name"]
        if node:
            with lock:
                if name not in res.bound:
                    res.bound[name] = t
                    res.nodes_of[name] = node
                    last[0] = t

    stop = threading.Event()

    def watch() -> None:
        try:
            api.watch(path, rv, on_event, stop, server_timeout=5, label_selector=selector)
        except BaseException as exc:  # reported after the arm
            errors.append(exc)

    before = parse_prometheus(topoplace.metrics()) if topoplace else {}
    th = threading.Thread(target=watch, name=f"watch-{phase}", daemon=True)
    th.start()
    time.sleep(0.2)  # let the watch connect
    t_start = time.monotonic()
    nxt = iter(enumerate(pods))
    take = threading.Lock()

    def creator() -> None:
        while True:
            with take:  # hand pods out in arrival order
                item = next(nxt, None)
                if item is None:
                    return
                i, pod = item
                if rate > 0:
                    wait = t_start + i / rate - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                res.created[pod["metadata"]["name"]] = time.monotonic()
            api.create_pod(namespace, pod)

    parallel(lambda _: creator(), list(range(create_workers)), create_workers)
    t_created = time.monotonic()
    last[0] = max(last[0], t_created)
    log(f"{phase}: {len(pods)} pods created in {t_created - t_start:.1f}s")
    n = len(pods)
    reported = 0.0
    while True:
        now = time.monotonic()
        with lock:
            done = len(res.bound)
            idle = now - last[0]
        if done >= n or now - t_start > timeout or idle > idle_timeout or errors:
            break
        if now - reported > 10:
            log(f"{phase}: {done}/{n} bound")
            reported = now
        time.sleep(0.05)
    t_end = time.monotonic()
    stop.set()
    th.join(1.0)  # a daemon; its stream ends within server_timeout
    after = parse_prometheus(topoplace.metrics()) if topoplace else {}
    if errors:
        log(f"{phase}: watch failed: {errors[0]}")
    # Reconcile with a list (a binding the watch missed still counts, without a time).
    pending: Counter[str] = Counter()
    for obj in api.list_pods(namespace, selector).get("items") or []:
        name = obj["metadata"]["name"]
        node = (obj.get("spec") or {}).get("nodeName")
        if node:
            res.nodes_of.setdefault(name, node)
        else:
            msg = next(
                (
                    c.get("message") or c.get("reason") or ""
                    for c in (obj.get("status") or {}).get("conditions") or []
                    if c.get("type") == "PodScheduled"
                ),
                "no PodScheduled condition",
            )
            pending[msg[:160]] += 1
    fig = placement_figures(res.figures, scenario, res.nodes_of, labels)
    timing_figures(fig, scenario, res.created, res.bound, t_created, t_end)
    fig.pending_reasons = "; ".join(f"{k} (x{v})" for k, v in pending.most_common(3))
    if topoplace is not None:
        fig.extra.update(metric_deltas(before, after))
    log(
        f"{phase}: {fig.pods_bound}/{fig.pods} bound in {fig.seconds:.1f}s "
        f"({fig.pods_per_s:.1f} pods/s), nodes used {fig.nodes_used}, "
        f"whole nodes free {fig.whole_nodes_free}"
    )
    return res


def wait_topoplace_free(tp: Topoplace, scenario: Scenario, timeout: float = 120) -> None:
    """Until topoplace's cache shows every GPU of the scenario's nodes free."""
    want = {n.name: n.gpus for n in scenario.nodes}
    deadline = time.monotonic() + timeout
    while True:
        got = {n["name"]: n.get("free_gpus") for n in tp.get("/v1/inspect/nodes")["nodes"]}
        if all(got.get(k) == v for k, v in want.items()):
            return
        if time.monotonic() > deadline:
            busy = [k for k, v in want.items() if got.get(k) != v][:5]
            raise RuntimeError(f"topoplace still shows GPUs in use after {timeout}s: {busy}")
        time.sleep(0.5)


# ---- report ---------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else math.nan


def median_figures(figs: Sequence[Figures]) -> dict[str, float]:
    """Median over runs of every numeric field."""
    out: dict[str, float] = {}
    if not figs:
        return out
    for k, v in figs[0].row().items():
        if isinstance(v, int | float) and not isinstance(v, bool) and k not in ("run",):
            out[k] = _median([f.row().get(k, math.nan) for f in figs])
    return out


def _fmt(v: Any, nd: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if v.is_integer() else f"{v:.{nd}f}"
    return str(v)


ROWS: tuple[tuple[str, str, bool], ...] = (
    # (label, field, gap computed against offline)
    ("pods bound", "pods_bound", True),
    ("GPUs bound", "gpus_bound", True),
    ("allocation ratio", "allocation_ratio", True),
    ("nodes used", "nodes_used", True),
    ("whole nodes free", "whole_nodes_free", True),
    ("whole 8-GPU nodes free", "whole_8gpu_nodes_free", True),
    ("free GPUs on partly used nodes (fragmentation)", "frag_free_gpus", True),
    ("fragmentation share of free GPUs", "frag_share", True),
    ("pods/s (first create -> last bind)", "pods_per_s", False),
    ("creating the pods took, s", "create_seconds", False),
    ("last bind after the last create, s", "drain_s", False),
    ("bind latency p50, s", "latency_p50", False),
    ("bind latency p99, s", "latency_p99", False),
    ("gangs complete", "gangs_complete", True),
    ("gangs partly bound at the end", "gangs_partial_at_end", True),
    ("longest partly-bound window, s", "gang_partial_max_s", False),
    ("gangs partly bound at one instant (max)", "gangs_partial_max_concurrent", False),
    ("most leaves one gang spans", "gang_leaves_max", True),
    ("pods placed as offline (same node, or unplaced in both)", "same_node_as_offline", False),
    ("first pod placed elsewhere than offline (arrival index)", "first_divergence", False),
)


def render_summary(
    scenario: Scenario,
    conditions: Mapping[str, Any],
    live: Mapping[str, Sequence[Figures]],
    offline_fig: Figures | None,
    offline: OfflineResult | None,
) -> str:
    med = {arm: median_figures(figs) for arm, figs in live.items() if figs}
    off = offline_fig.row() if offline_fig else {}
    lines = [f"# Live benchmark: {scenario.name}", ""]
    lines.append(f"Scenario: {scenario.description}.")
    lines.append("")
    lines.append("Conditions:")
    lines.append("")
    for k, v in conditions.items():
        lines.append(f"- {k}: {v}")
    lines.append("")
    lines.append(
        f"Best possible: {scenario.best_nodes_used()} nodes used, "
        f"{scenario.best_whole_free()} whole nodes free (a bound: fewest nodes, largest "
        "first, whose GPUs cover the request)."
    )
    lines.append("")
    arms = [a for a in ARMS if a in med]
    head = ["figure"]
    names = {"topoplace": "live topoplace", "default": "live default-scheduler"}
    head += [names[a] for a in arms]
    if offline_fig:
        head += ["offline (topoplace engine)", "gap live topoplace - offline"]
    lines.append("Medians over runs (latency: median of each run's p50 / p99):")
    lines.append("")
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for label, key, gap in ROWS:
        if key.startswith("gang") and not scenario.gangs():
            continue
        if key == "gang_leaves_max" and not any(med.get(a, {}).get(key) for a in arms):
            continue
        row = [label] + [_fmt(med[a].get(key)) for a in arms]
        if offline_fig:
            ov = off.get(key)
            row.append(_fmt(ov) if gap else "")
            lv = med.get("topoplace", {}).get(key)
            if gap and lv is not None and ov is not None and not math.isnan(float(ov)):
                row.append(_fmt(float(lv) - float(ov)))
            else:
                row.append("")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if offline is not None:
        lines.append(
            f"Offline: {len(offline.placements)} placed, {len(offline.refused)} refused in "
            f"{offline.seconds:.2f}s; gang policy `{offline.policy}`; {offline.narrowed} pod(s) "
            "decided among the nodes kube-scheduler's own filters leave (CPU/memory/pods, "
            "node affinity), the others by `place_pod` over all nodes."
        )
        if offline.gangs:
            lines.append(
                "Offline gangs: " + ", ".join(f"{k}: {v}" for k, v in offline.gangs.items())
            )
        lines.append("")
    lines.append("Per run:")
    lines.append("")
    cols = [
        "arm",
        "run",
        "pods_bound",
        "nodes_used",
        "whole_nodes_free",
        "frag_free_gpus",
        "pods_per_s",
        "latency_p50",
        "latency_p99",
        "gangs_partial_at_end",
        "gang_partial_max_s",
        "first_divergence",
    ]
    if not scenario.gangs():
        cols = [c for c in cols if not c.startswith("gang")]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for figs in live.values():
        for f in figs:
            r = f.row()
            lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    lines.append("")
    notes = []
    for figs in live.values():
        for f in figs:
            if f.pending_reasons:
                notes.append(f"- {f.arm} run {f.run}, pods left pending: {f.pending_reasons}")
            if f.extra:
                extra = ", ".join(f"{k}={_fmt(v, 3)}" for k, v in sorted(f.extra.items()))
                notes.append(f"- {f.arm} run {f.run}, topoplace /metrics during the arm: {extra}")
    if notes:
        lines.append("Notes:")
        lines.append("")
        lines.extend(notes)
        lines.append("")
    return "\n".join(lines)


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    if not rows:
        return
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: _csv_value(r.get(k)) for k in keys})


def _csv_value(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else round(v, 6)
    return v


def pod_rows(
    scenario: Scenario, res: ArmResult, offline: Mapping[str, str] | None
) -> list[dict[str, Any]]:
    rows = []
    t0 = min(res.created.values()) if res.created else 0.0
    for i, p in enumerate(scenario.pods):
        c, b = res.created.get(p.name), res.bound.get(p.name)
        rows.append(
            {
                "arrival": i,
                "pod": p.name,
                "gpus": p.gpus,
                "gang": p.gang,
                "node": res.nodes_of.get(p.name, ""),
                "offline_node": (offline or {}).get(p.name, ""),
                "created_s": round(c - t0, 6) if c is not None else "",
                "bound_s": round(b - t0, 6) if b is not None else "",
                "latency_s": round(b - c, 6) if b is not None and c is not None else "",
            }
        )
    return rows


# ---- main -----------------------------------------------------------------------------------


def build_scenario(args: argparse.Namespace) -> Scenario:
    if args.scenario == "mix":
        return mix_scenario(
            args.nodes,
            args.big,
            args.small,
            h100_share=args.h100_share,
            nodes_per_leaf=args.nodes_per_leaf,
            leaves_per_spine=args.leaves_per_spine,
            gangs=args.gangs,
            gang_size=args.gang_size,
            gang_gpus=args.gang_gpus,
            gang_preferred=args.gang_preferred,
        )
    return openb_scenario(
        args.workload,
        args.data,
        max_pods=args.max_pods,
        resources=args.resources,
        max_nodes=args.max_nodes,
    )


def _config_line(cfg: Mapping[str, Any]) -> str:
    """The knobs of the rendered scheduler configuration that matter for the figures."""
    conn = cfg.get("clientConnection") or {}
    ext = (cfg.get("extenders") or [{}])[0]
    prof = (cfg.get("profiles") or [{}])[0]
    disabled = [
        d.get("name")
        for d in ((prof.get("plugins") or {}).get("score") or {}).get("disabled") or []
    ]
    strategy = next(
        (
            ((pc.get("args") or {}).get("scoringStrategy") or {}).get("type")
            for pc in prof.get("pluginConfig") or []
            if pc.get("name") == "NodeResourcesFit"
        ),
        None,
    )
    return (
        f"extender weight {ext.get('weight')}, nodeCacheCapable {ext.get('nodeCacheCapable')}, "
        f"percentageOfNodesToScore {cfg.get('percentageOfNodesToScore')}, client qps "
        f"{conn.get('qps', 'default (50)')} / burst {conn.get('burst', 'default (100)')}, "
        f"NodeResourcesFit {strategy or 'default (LeastAllocated)'}, score plugins disabled: "
        f"{', '.join(map(str, disabled)) or 'none'}"
    )


def _git_rev() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return rev + (" (uncommitted changes)" if dirty else "")
    except OSError:
        return ""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.live.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenario", choices=("mix", "openb"), default="mix")
    p.add_argument("--out", required=True, help="results directory (created)")
    g = p.add_argument_group("mix")
    g.add_argument("--nodes", type=int, default=50)
    g.add_argument("--big", type=int, default=10, help="8-GPU pods, first")
    g.add_argument("--small", type=int, default=200, help="1-GPU pods, after the big ones")
    g.add_argument("--h100-share", type=float, default=0.8)
    g.add_argument("--nodes-per-leaf", type=int, default=16)
    g.add_argument("--leaves-per-spine", type=int, default=4)
    g.add_argument("--gangs", type=int, default=0, help="gangs spread among the small pods")
    g.add_argument("--gang-size", type=int, default=4)
    g.add_argument("--gang-gpus", type=int, default=8)
    g.add_argument("--gang-preferred", default="", help="topology-preferred level, e.g. leaf")
    g = p.add_argument_group("openb")
    g.add_argument("--workload", default="default")
    g.add_argument("--data", default=None, help="trace dir (default ../shared/data/...)")
    g.add_argument("--max-pods", type=int, default=None)
    g.add_argument("--max-nodes", type=int, default=None, help="an evenly spaced sample of N nodes")
    g.add_argument("--resources", choices=("trace", "minimal"), default="trace")
    g = p.add_argument_group("run")
    g.add_argument("--runs", type=int, default=1)
    g.add_argument("--arms", default="topoplace,default", help="live arms, comma-separated")
    g.add_argument("--no-offline", action="store_true")
    g.add_argument("--timeout", type=float, default=900, help="per arm, seconds")
    g.add_argument("--idle-timeout", type=float, default=20, help="stop when no bind for S s")
    g.add_argument(
        "--rate", type=float, default=0, help="pods/s to create (0: as fast as possible)"
    )
    g.add_argument(
        "--create-workers",
        type=int,
        default=1,
        help="concurrent pod creators (1: strict arrival order; more: faster, order kept "
        "to within that many pods)",
    )
    g.add_argument("--namespace", default="livebench")
    g.add_argument("--policy", default=None, help="topoplace policy file (default shipped)")
    g.add_argument(
        "--topoplace-src",
        default=None,
        help="run topoplace from another checkout (e.g. `git archive REV | tar -x -C DIR`); "
        "the offline arm still uses this one",
    )
    g.add_argument("--node-workers", type=int, default=8)
    g = p.add_argument_group("control plane")
    g.add_argument("--kubeconfig", default=None, help="use this running plane (no up/down)")
    g.add_argument("--kube-bin", default=str(DEFAULT_KUBE_BIN))
    g.add_argument("--controlplane", default=str(CONTROLPLANE), help="up.sh / down.sh dir")
    g.add_argument("--work", default=None, help="plane work dir (default /tmp/livebench-*)")
    g.add_argument("--keep-work", action="store_true", help="keep the work dir and logs")
    g.add_argument("--api-port", type=int, default=17443)
    g.add_argument("--etcd-port", type=int, default=24790)
    g.add_argument("--etcd-peer-port", type=int, default=24800)
    g.add_argument("--sched-port", type=int, default=11259, help="up.sh's default-scheduler")
    g.add_argument("--topoplace-sched-port", type=int, default=11260, help="shipped config's")
    g.add_argument("--extender-port", type=int, default=8890)
    g.add_argument("--shipped-config", default=None, help="another scheduler-config.yaml")
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        p.error(f"unknown arms {bad}; choose from {list(ARMS)}")
    args.arm_list = arms
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from scheduler import __version__
    from scheduler.cli.main import load_params

    scenario = build_scenario(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_id = f"lb{os.getpid()}"
    log(f"scenario: {scenario.description}")
    work = Path(args.work or tempfile.mkdtemp(prefix="livebench-", dir="/tmp"))
    plane = Plane(
        work,
        Path(args.kube_bin),
        args.api_port,
        args.etcd_port,
        args.etcd_peer_port,
        args.sched_port,
        scripts=Path(args.controlplane),
    )
    own_plane = args.kubeconfig is None
    api: Api | None = None
    tp: Topoplace | None = None
    ks: KubeScheduler | None = None
    live: dict[str, list[Figures]] = {a: [] for a in args.arm_list}
    offline_res: OfflineResult | None = None
    offline_fig: Figures | None = None
    conditions: dict[str, Any] = {}
    ok = False
    try:
        t = time.monotonic()
        kc = plane.up() if own_plane else args.kubeconfig
        if own_plane:
            log(f"control plane up in {time.monotonic() - t:.1f}s ({work})")
        api = Api(kc)
        api.ensure_namespace(args.namespace)
        node_objs = [n.to_object(run_id) for n in scenario.nodes]
        secs = api.create_nodes(node_objs, workers=args.node_workers)
        log(f"{len(node_objs)} nodes created in {secs:.1f}s")
        nodes = api.list_nodes(f"{RUN_LABEL}={run_id}")
        labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in nodes}
        bad = [
            n["metadata"]["name"]
            for n in nodes
            if any(
                t.get("key", "").startswith("node.kubernetes.io/")
                for t in (n.get("spec") or {}).get("taints") or []
            )
        ]
        if bad or len(nodes) != len(node_objs):
            raise RuntimeError(f"nodes not ready: {len(nodes)}/{len(node_objs)}, tainted {bad[:5]}")
        logs = work / "bench-logs"
        if "topoplace" in args.arm_list:
            tp = Topoplace(
                kc, logs, port=args.extender_port, policy=args.policy, source=args.topoplace_src
            )
            secs = tp.start()
            log(f"topoplace ready in {secs:.1f}s (log {tp.log_file})")
            ks = KubeScheduler(
                kc,
                tp.extender_url,
                logs,
                port=args.topoplace_sched_port,
                kube_bin=args.kube_bin,
                config_path=args.shipped_config,
            )
            secs = ks.start()
            (out / "scheduler-config.yaml").write_text(ks.config_file.read_text())
            log(f"kube-scheduler (shipped config, profiles {ks.profiles}) ready in {secs:.1f}s")
            wait_topoplace_free(tp, scenario)
        profile = ks.profiles[0] if ks else ""
        params = load_params(args.policy)
        pod_objs = [p.to_object(args.namespace, profile, run_id) for p in scenario.pods]
        offline_nodes: dict[str, str] | None = None
        if not args.no_offline:
            offline_res = replay(nodes, pod_objs, params)
            offline_nodes = {k: v[0] for k, v in offline_res.placements.items()}
            offline_fig = placement_figures(
                Figures(arm="offline", run=0), scenario, offline_nodes, labels
            )
            offline_fig.extra.update(
                {"seconds": round(offline_res.seconds, 3), "narrowed": offline_res.narrowed}
            )
            log(
                f"offline: {len(offline_res.placements)} placed in {offline_res.seconds:.2f}s, "
                f"nodes used {offline_fig.nodes_used}, whole free {offline_fig.whole_nodes_free}"
            )
        cores = os.cpu_count()
        load = os.getloadavg()
        conditions = {
            "nodes": f"{len(scenario.nodes)} ({scenario.gpu_capacity} GPUs)",
            "pods": f"{len(scenario.pods)} ({scenario.gpus_requested} GPUs), arrival order, "
            + (f"paced at {args.rate:g}/s" if args.rate else "created back to back")
            + (
                f", {args.create_workers} concurrent clients"
                if args.create_workers > 1
                else ", one client (strict order)"
            ),
            "runs": f"{args.runs} (arms alternate order per run; figures are medians)",
            "Kubernetes": f"{api.version()} (kube-scheduler {binary_version(Path(args.kube_bin) / 'kube-scheduler')})",
            "topoplace": f"{__version__} at {_git_rev()}"
            + (
                f"; live arm runs the checkout in {args.topoplace_src}"
                if args.topoplace_src
                else ""
            ),
            "topoplace arm": f"kube-scheduler profile `{profile}` with the shipped "
            "config/deploy/scheduler-config.yaml (rendered copy: scheduler-config.yaml)"
            if ks
            else "not run",
            "shipped scheduler config": _config_line(ks.config) if ks else "not used",
            "topoplace policy": args.policy or "shipped config/policy.yaml",
            "default arm": "up.sh's kube-scheduler, profile default-scheduler, no extender, "
            "client-go default QPS 50 / burst 100 (the shipped config sets its own)",
            "host": f"{platform.machine()}, {cores} cores, load average at start "
            f"{load[0]:.2f}, Python {platform.python_version()}",
            "wait": f"until all bound or no bind for {args.idle_timeout:g}s "
            f"(cap {args.timeout:g}s per arm)",
        }
        for r in range(1, args.runs + 1):
            order = list(args.arm_list) if r % 2 else list(reversed(args.arm_list))
            for arm in order:
                if arm == "topoplace":
                    assert tp is not None
                    wait_topoplace_free(tp, scenario)
                res = run_arm(
                    api,
                    scenario,
                    arm=arm,
                    scheduler_name=profile if arm == "topoplace" else DEFAULT_SCHEDULER,
                    run=r,
                    run_id=run_id,
                    namespace=args.namespace,
                    labels=labels,
                    timeout=args.timeout,
                    idle_timeout=args.idle_timeout,
                    rate=args.rate,
                    topoplace=tp if arm == "topoplace" else None,
                    create_workers=args.create_workers,
                )
                if offline_nodes is not None:
                    compare_with_offline(res.figures, scenario, res.nodes_of, offline_nodes)
                live[arm].append(res.figures)
                write_csv(out / f"pods-{arm}-{r}.csv", pod_rows(scenario, res, offline_nodes))
                secs = api.delete_pods(args.namespace)
                log(f"{arm}-{r}: pods deleted in {secs:.1f}s")
        rows = [f.row() for figs in live.values() for f in figs]
        if offline_fig:
            rows.append(offline_fig.row())
        write_csv(out / "runs.csv", rows)
        text = render_summary(scenario, conditions, live, offline_fig, offline_res)
        (out / "summary.md").write_text(text + "\n")
        print(text)
        log(f"results in {out}")
        ok = True
        return 0
    finally:
        if ks is not None:
            ks.stop()
        if tp is not None:
            tp.stop()
        if api is not None:
            with contextlib.suppress(Exception):
                api.delete_pods(args.namespace, timeout=30)
            with contextlib.suppress(Exception):
                api.delete_nodes(f"{RUN_LABEL}={run_id}")
            api.close()
        if own_plane:
            keep = args.keep_work or not ok
            plane.down(purge=not keep)
            if keep:
                log(f"work dir kept (logs in {work}/logs and {work}/bench-logs): {work}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
