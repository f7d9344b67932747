"""Fractional GPUs (HAMi) through the real kube-scheduler, against topoplace's engine offline.

Opt-in: needs the control-plane binaries (``--kube-bin``: etcd, kube-apiserver,
kube-scheduler; the test cluster of :mod:`benchmarks.cluster` runs them) and the Alibaba openb trace (``../shared/data/alibaba-gpu-v2023``). One loopback control
plane; the trace's GPU nodes (``--nodes`` takes an even sample of them) as fake nodes
running HAMi's device plugin: each carries HAMi's ``hami.io/node-nvidia-register`` (its
GPUs with their memory, split 10 ways) and advertises ``nvidia.com/gpu`` as GPUs x 10
replicas, as HAMi's plugin does. The pods are the trace's GPU tasks (workload ``default``:
whole and fractional GPUs), in creation order, as long as the GPU shares they ask stay
within ``--fill`` of the cluster's GPUs (and at most ``--pods``):

* a fractional task (``gpu_milli`` below 1000) asks HAMi for one GPU with
  ``nvidia.com/gpumem-percentage`` and ``nvidia.com/gpucores`` of ``gpu_milli / 10`` %;
* a whole-GPU task asks for its GPUs at 100 % memory and compute each (HAMi's exclusive
  form), so whole and fractional pods share one ledger, as in the FGD paper's simulator.

CPU and memory requests are token ones (100m, 128Mi), so kube-scheduler's own filters
never leave out a node topoplace would choose.

**Live**: the pods are created as a backlog before kube-scheduler starts (names that sort
in arrival order); kube-scheduler runs the shipped configuration
(``config/deploy/scheduler-config.yaml``: the HAMi resources are the extender's
``managedResources``) with ``topoplace serve --kubeconfig`` and the shipped policy with
one change, ``sharing.hami_lock: release``: there is no HAMi device plugin here to release
the node lock a bind takes (with ``hold`` a node would take one pod per lock expiry), so
topoplace releases it once the Binding is written, as the live fractional test does. Each
pod's GPUs are read from the annotation topoplace hands HAMi
(``hami.io/vgpu-devices-allocated``).

**Offline**: the same Node objects and pods in the same order through topoplace's own
extender in process (filter, then bind on the node it offers), with no kube-scheduler.
"placed as offline" counts pods that got exactly the node and the devices (memory and
compute per GPU) of the offline replay.

**Default** (``--arms ... default``, HAMi only): the same tasks counted as GPU replicas,
time-slicing style, placed by kube-scheduler alone (one plain profile, no extender, its
default plugins and node sampling, the same client limits as topoplace's: qps 500, burst
1000): each node advertises ``nvidia.com/gpu`` as GPUs x 10 replicas (as it does for HAMi),
a fractional task asks ``ceil(gpu_milli / 100)`` replicas and a whole-GPU task 10 per GPU.
kube-scheduler counts replicas per node only (no GPU-level memory or compute), so this is
the pace of plain counting, the floor of what a scheduler of shares can cost; the summary
gives topoplace's pods/s over it.

Reports pods bound and pods/s (first bind to last), nodes and GPUs in use, GPUs left
untouched, the allocation ratio (GPU shares bound over the cluster's GPUs), shares that
overcommit a GPU (memory, compute or split count, recomputed from the annotations alone:
must be 0), placed as offline, topoplace's server-side filter and bind latency, and the
host's 1-minute load average while each arm ran (min / mean / max: both arms' pace moves
with it on a shared host), in ``summary.md`` and ``runs.csv`` under ``--out``. And what
each arm cost the host per pod placed, from kube-scheduler's start to the last bind
(:class:`~benchmarks.live.metrics.HostCost`): the CPU milliseconds of the API server,
etcd, kube-scheduler, topoplace and this process's own waiting (it lists only the pods
still unbound, every 2 s), and the API server's writes per pod (of them on nodes: HAMi's
node lock). When the whole control plane shares the host's cores, as here, an arm's pods/s
follows the sum of that CPU, so this says where a gap between the arms comes from.

Run::

    python -m benchmarks.live.fractional --nodes 300 --pods 1500 --runs 2 \\
        --kube-bin $HOME/kube-bin-1.33 --out out/live-frac
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from benchmarks.clusters import hami_register
from benchmarks.live.kubeapi import Api
from benchmarks.live.kubesched import KubeScheduler, Topoplace
from benchmarks.live.metrics import HostCost
from benchmarks.live.run import Plane, log
from benchmarks.live.scenario import PRODUCT_LABEL, NodeSpec, dns_name
from benchmarks.live.standalone import (
    REPO,
    add_plane_args,
    down_plane,
    missing,
    pods_per_s,
    source_of,
    up_plane,
    verb_ms,
)
from scheduler.core.fractional import (
    ALIYUN_COUNT,
    ALIYUN_DEV,
    ALIYUN_IDX,
    ALIYUN_MEM,
    ALIYUN_POD,
    HAMI_ALLOCATED,
    HAMI_REGISTER,
)

DATA = REPO.parent / "shared" / "data" / "alibaba-gpu-v2023"
NAMESPACE = "livebench-frac"
SCHEDULER = "topoplace"
SPLIT = 10
"""HAMi's ``deviceSplitCount`` default: tasks that may share one GPU."""
MEMORY_MIB = {"V100M16": 16384, "V100M32": 32768, "P100": 16384, "T4": 15360, "A10": 24576}
"""GPU memory of the trace's models; the trace's anonymised models (G2, G3) get
:data:`OTHER_MIB`. HAMi requests are percentages, so memory only scales the MiB written."""
OTHER_MIB = 16384
MILLI = 1000
BACKENDS = ("hami", "gpushare")
GPUSHARE_TASK_GIB = 15
"""gpushare asks memory in GiB, not a share of a device: a task of ``m`` per mille asks
``ceil(m * 15 / 1000)`` GiB, its share of the smallest GPU of the trace (T4, 15 GiB)."""


@dataclass(frozen=True, slots=True)
class Task:
    """One pod of the workload: ``gpus`` devices at ``milli`` per mille each."""

    name: str
    gpus: int
    milli: int


def node_objects(
    data: Path, count: int | None, run: str, backend: str = "hami"
) -> list[dict[str, Any]]:
    """The trace's GPU nodes (an even sample of ``count``) as HAMi nodes, or as gpushare
    nodes (``aliyun.com/gpu-mem`` in GiB and ``aliyun.com/gpu-count``, as gpushare's device
    plugin advertises them)."""
    from benchmarks.engine import openb

    raw = [n for n in openb.load_nodes(data) if n.num_gpu > 0]
    if count is not None and count < len(raw):
        step = len(raw) / max(1, count)
        raw = [raw[int(i * step)] for i in range(count)]
    out = []
    for n in raw:
        name = dns_name(n.name)
        obj = NodeSpec(
            name,
            n.num_gpu,
            n.cpu_milli_capacity,
            n.memory_mib_capacity,
            pods=250,
            labels={PRODUCT_LABEL: n.gpu_model},
        ).to_object(run)
        mib = MEMORY_MIB.get(n.gpu_model, OTHER_MIB)
        if backend == "gpushare":
            for part in ("capacity", "allocatable"):
                obj["status"][part][ALIYUN_MEM] = str(n.num_gpu * (mib // 1024))
                obj["status"][part][ALIYUN_COUNT] = str(n.num_gpu)
            out.append(obj)
            continue
        obj["metadata"].setdefault("annotations", {})[HAMI_REGISTER] = hami_register(
            name, n.num_gpu, mib, f"NVIDIA-{n.gpu_model}", SPLIT
        )
        for part in ("capacity", "allocatable"):
            obj["status"][part]["nvidia.com/gpu"] = str(n.num_gpu * SPLIT)
        out.append(obj)
    return out


def workload(
    data: Path, name: str, gpus: int, biggest: int, fill: float, limit: int | None
) -> list[Task]:
    """The trace's GPU tasks in creation order while their shares stay within ``fill`` of
    ``gpus`` GPUs (tasks wider than ``biggest`` GPUs are left out), at most ``limit``."""
    from benchmarks.engine import openb

    tasks = openb.load_tasks(name, data)
    times = openb.load_task_times(name, data)
    order = sorted(
        range(len(tasks)), key=lambda i: (times.get(tasks[i].name, (0, 0))[0] if times else 0, i)
    )
    out: list[Task] = []
    asked = 0
    for i in order:
        t = tasks[i]
        if t.num_gpu < 1 or t.gpu_milli < 1 or t.num_gpu > biggest:
            continue
        milli = min(MILLI, t.gpu_milli)
        if asked + t.num_gpu * milli > fill * gpus * MILLI:
            break
        if limit is not None and len(out) >= limit:
            break
        asked += t.num_gpu * milli
        out.append(Task(f"a{len(out):05d}-{dns_name(t.name)}", t.num_gpu, milli))
    return out


def replicas(task: Task) -> int:
    """``task`` in GPU replicas (:data:`SPLIT` per GPU): a share rounded up, whole GPUs."""
    return task.gpus * SPLIT if task.milli >= MILLI else -(-task.milli * SPLIT // MILLI)


def pod_object(task: Task, scheduler: str = SCHEDULER, backend: str = "hami") -> dict[str, Any]:
    """A HAMi pod for ``task`` (``nvidia.com/gpu`` with memory and compute percentages),
    a gpushare pod (``aliyun.com/gpu-mem``, :data:`GPUSHARE_TASK_GIB`; one GPU), or
    (``replicas``) the task in ``nvidia.com/gpu`` replicas alone (:func:`replicas`)."""
    if backend == "replicas":
        limits = {"nvidia.com/gpu": str(replicas(task))}
    elif backend == "gpushare":
        if task.gpus != 1:
            raise ValueError("gpushare shares one GPU per pod")
        limits = {ALIYUN_MEM: str(max(1, -(-task.milli * GPUSHARE_TASK_GIB // MILLI)))}
    else:
        pct = str(-(-task.milli // 10))  # per mille to percent, rounded up
        limits = {
            "nvidia.com/gpu": str(task.gpus),
            "nvidia.com/gpumem-percentage": pct,
            "nvidia.com/gpucores": pct,
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": task.name, "namespace": NAMESPACE, "labels": {"app": "livebench"}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "infer",
                    "image": "registry.k8s.io/pause:3.9",
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": limits,
                    },
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


class BindRecorder:
    """The offline replay's binder: records each Binding's node and annotations."""

    def __init__(self) -> None:
        self.last: tuple[str, dict[str, str]] | None = None

    def bind(self, pod: Any, node: str, annotations: Mapping[str, str]) -> str:
        self.last = (node, dict(annotations))
        return ""


def policy_file(path: Path, preempt: bool = True, release_hami_lock: bool = True) -> Path:
    """The shipped policy with ``sharing.hami_lock: release`` (unless not
    ``release_hami_lock``) and ``preemption.start: off`` unless ``preempt``, written to
    ``path``."""
    policy = yaml.safe_load((REPO / "config" / "policy.yaml").read_text())
    if release_hami_lock:
        policy.setdefault("sharing", {})["hami_lock"] = "release"
    if not preempt:
        policy.setdefault("preemption", {})["start"] = "off"
    path.write_text(yaml.safe_dump(policy))
    return path


def offline(
    nodes: list[dict[str, Any]], work: list[Task], policy: Path, backend: str = "hami"
) -> dict[str, tuple[str, str]]:
    """pod -> (node, :func:`allocation` of its hand-off) topoplace's own extender gives it,
    pod after pod (the live arm's policy; every node a candidate)."""
    from scheduler.cli.main import load_params
    from scheduler.runtime.cache import ClusterCache
    from scheduler.server.extender import Extender

    binder = BindRecorder()
    ext = Extender(ClusterCache.from_objects(nodes, [], load_params(str(policy))), binder)
    names = sorted(n["metadata"]["name"] for n in nodes)
    out: dict[str, tuple[str, str]] = {}
    for i, t in enumerate(work):
        pod = pod_object(t, backend=backend)
        pod["metadata"]["uid"] = f"offline-{i}"
        r = orjson.loads(ext.filter_json({"Pod": pod, "NodeNames": names}))
        if not r.get("NodeNames"):
            continue
        binder.last = None
        body = {"PodName": t.name, "PodNamespace": NAMESPACE, "PodUID": f"offline-{i}"}
        res = ext.bind({**body, "Node": r["NodeNames"][0]})
        if res.get("Error") or binder.last is None:
            raise RuntimeError(f"offline bind of {t.name} failed: {res.get('Error')}")
        out[t.name] = (binder.last[0], allocation(binder.last[1]))
    return out


def allocation(annotations: Mapping[str, str]) -> str:
    """What a pod's hand-off annotations say it got: HAMi's
    ``hami.io/vgpu-devices-allocated``, or gpushare's ``IDX,DEV,POD`` (GPU index, its GiB,
    the pod's GiB); "" for neither."""
    if HAMI_ALLOCATED in annotations:
        return annotations[HAMI_ALLOCATED]
    if ALIYUN_IDX in annotations:
        return ",".join(annotations.get(k, "") for k in (ALIYUN_IDX, ALIYUN_DEV, ALIYUN_POD))
    return ""


def devices_of(nodes: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Each GPU (HAMi: its UUID; gpushare: ``node/index``) -> its memory (HAMi MiB,
    gpushare GiB), compute (%) and split count, from what the nodes publish."""
    out: dict[str, dict[str, int]] = {}
    for n in nodes:
        text = (n["metadata"].get("annotations") or {}).get(HAMI_REGISTER)
        for d in orjson.loads(text) if text else []:
            out[d["id"]] = {"mem": d["devmem"], "core": d["devcore"], "count": d["count"]}
        cap = n["status"].get("capacity") or {}
        if not text and ALIYUN_MEM in cap:
            gpus = int(cap.get(ALIYUN_COUNT, 0))
            for i in range(gpus):
                unit = {"mem": int(cap[ALIYUN_MEM]) // gpus, "core": 100, "count": 1 << 30}
                out[f"{n['metadata']['name']}/{i}"] = unit
    return out


def shares(node: str, value: str) -> list[tuple[str, int, int]]:
    """(GPU, memory, compute %) of each device in an :func:`allocation` value: HAMi's
    ``UUID,TYPE,MEM,CORES:`` per device, ``;`` after each container (the GPU its UUID,
    memory in MiB); gpushare's ``IDX,DEV,POD`` (the GPU ``node/IDX``, memory in GiB)."""
    out = []
    if value and ":" not in value and ";" not in value:
        idx, _, pod = value.split(",")
        return [(f"{node}/{idx}", int(pod), 0)]
    for container in value.split(";"):
        for dev in container.split(":"):
            if dev:
                uuid, _, mem, cores = dev.split(",")
                out.append((uuid, int(mem), int(cores)))
    return out


def overcommitted(placed: Mapping[str, tuple[str, str]], devices: Mapping[str, Any]) -> int:
    """GPUs whose shares (from the annotations alone) exceed its memory, compute or split
    count, or that no node publishes."""
    mem: Counter[str] = Counter()
    core: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for node, value in placed.values():
        for uuid, m, c in shares(node, value):
            mem[uuid] += m
            core[uuid] += c
            count[uuid] += 1
    bad = 0
    for uuid in count:
        d = devices.get(uuid)
        if d is None or mem[uuid] > d["mem"] or core[uuid] > d["core"] or count[uuid] > d["count"]:
            bad += 1
    return bad


def figures(
    placed: Mapping[str, tuple[str, str]], work: list[Task], devices: Mapping[str, Any]
) -> dict[str, Any]:
    """Nodes and GPUs in use, GPUs untouched, allocation ratio, overcommitted GPUs."""
    by_name = {t.name: t for t in work}
    used = {uuid for n, v in placed.values() for uuid, _, _ in shares(n, v)}
    alloc = sum(by_name[p].gpus * by_name[p].milli for p in placed if p in by_name)
    return {
        "bound": len(placed),
        "nodes_used": len({n for n, _ in placed.values()}),
        "gpus_used": len(used),
        "gpus_untouched": len(devices) - len(used),
        "allocation": alloc / (MILLI * len(devices)) if devices else float("nan"),
        "overcommitted_gpus": overcommitted(placed, devices),
    }


def allocated(api: Api) -> dict[str, tuple[str, str]]:
    """pod -> (node, :func:`allocation` of its annotations) of every bound pod."""
    out = {}
    for p in api.list_pods(NAMESPACE).get("items", []):
        node = (p.get("spec") or {}).get("nodeName")
        if node:
            out[p["metadata"]["name"]] = (node, allocation(p["metadata"].get("annotations") or {}))
    return out


class LoadSampler:
    """The host's 1-minute load average sampled every ``every_s`` seconds while an arm
    runs (a ``with`` block): the pace of both arms moves with it on a shared host, so each
    arm reports the load it ran under (:meth:`figures`)."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> LoadSampler:
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def figures(self, prefix: str = "") -> dict[str, float]:
        """``{prefix}load_min``, ``load_mean``, ``load_max`` of the samples taken."""
        xs = self.samples or [os.getloadavg()[0]]
        return {
            f"{prefix}load_min": min(xs),
            f"{prefix}load_mean": statistics.fmean(xs),
            f"{prefix}load_max": max(xs),
        }


def run_arm(
    args: argparse.Namespace, plane: Plane, api: Api, kc: str, logs: Path, work: list[Task]
) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """One live run: topoplace and kube-scheduler started fresh, the backlog, figures."""
    tp = Topoplace(
        kc, logs, port=args.extender_port, source=args.topoplace_src, policy=args.policy_file
    )
    tp.start()
    ks = KubeScheduler(
        kc, tp.extender_url, logs, port=args.topoplace_sched_port, kube_bin=args.kube_bin
    )
    load = LoadSampler()
    cost = host_cost(plane, api, ks, tp)
    try:
        for t in work:
            api.create_pod(NAMESPACE, pod_object(t, backend=args.backend))
        with load, cost:
            ks.start()
            bound = wait_all_bound(api, len(work), args.timeout)
        verbs = verb_ms(tp, ("filter", "bind"))
        placed = allocated(api)
    finally:
        ks.stop()
        tp.stop()
    sched = pods_per_s(scheduler_bind_times(ks.log_file))
    row = {
        "pods_per_s": sched,
        "pods_per_s_sched": sched,
        **{f"{v}_{k}": verbs[v][k] for v in ("filter", "bind") for k in ("mean_ms", "p99_ms")},
        **load.figures(),
        **cost.figures(bound),
    }
    log(f"topoplace arm: API calls {dict(sorted(cost.calls.items()))}")
    return row, placed


DEFAULT_SCHEDULER = "default-scheduler"
BOUND_LINE = re.compile(
    r'^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*"Successfully bound pod to node" pod="([^"]+)"'
)


def clear_pods(api: Api, tries: int = 3) -> None:
    """Delete the namespace's pods between arms; a delete whose answer times out on a busy
    API server (thousands of pods) is asked again (deleting is idempotent)."""
    for attempt in range(1, tries + 1):
        try:
            api.delete_pods(NAMESPACE, timeout=300.0)
            return
        except Exception as exc:  # the client's read timeout, or the API's error
            if attempt == tries:
                raise
            log(f"deleting the pods: {type(exc).__name__}; again")
            time.sleep(5.0)


def wait_all_bound(
    api: Api, total: int, timeout: float, patience: float = 30.0, every_s: float = 2.0
) -> int:
    """Wait until ``total`` pods of the namespace are bound, none more bound for
    ``patience`` seconds counted from the end of a list (a list may itself take seconds on
    a busy API server), or ``timeout``; how many are bound.

    Only the pods still unbound are listed (``spec.nodeName=``), every ``every_s``
    seconds: the lists are the API server's and this process's CPU, taken from the host
    both arms share, and pods/s is timed from kube-scheduler's log, not from them."""
    start = last = time.monotonic()
    bound = 0
    while bound < total and time.monotonic() - start < timeout:
        pending = api.get(
            f"/api/v1/namespaces/{NAMESPACE}/pods", fieldSelector="spec.nodeName="
        ).get("items", [])
        now = time.monotonic()
        got = total - len(pending)
        if got > bound:
            bound, last = got, now
        elif now - last > patience:
            break
        if bound < total:
            time.sleep(every_s)
    return bound


def scheduler_bind_times(log_file: Path, namespace: str = NAMESPACE) -> list[float]:
    """When kube-scheduler finished each bind of ``namespace``'s pods (seconds of the day,
    its own log: ``"Successfully bound pod to node"``, written once the Binding, or the
    extender's bind, returned), in log order; past midnight the day goes on counting.

    Both arms are timed this way for their ratio: listing pods lags
    behind an API server busy with a fast scheduler's binds (a list of 1,633 pods took
    25 s beside default-scheduler's), which would undercount the faster arm."""
    out: list[float] = []
    day = 0.0
    for line in log_file.read_text(errors="replace").splitlines():
        m = BOUND_LINE.match(line)
        if m is None or not m.group(4).startswith(namespace + "/"):
            continue
        t = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)) + day
        if out and t < out[-1] - 3600:
            day += 86400.0
            t += 86400.0
        out.append(t)
    return out


def run_default(
    args: argparse.Namespace, plane: Plane, api: Api, kc: str, logs: Path, work: list[Task]
) -> dict[str, Any]:
    """The default arm: the tasks as ``nvidia.com/gpu`` replicas (:func:`replicas`), a
    backlog, kube-scheduler alone (no extender, no topoplace); pods bound and pods/s."""
    from benchmarks.live.kubesched import render_default_config

    cfg = render_default_config(kc, DEFAULT_SCHEDULER, percentage_of_nodes_to_score=None)
    ks = KubeScheduler(
        kc, "", logs, port=args.default_sched_port, kube_bin=args.kube_bin, config=cfg
    )
    load = LoadSampler()
    cost = host_cost(plane, api, ks, None)
    try:
        for t in work:
            api.create_pod(NAMESPACE, pod_object(t, DEFAULT_SCHEDULER, "replicas"))
        with load, cost:
            ks.start()
            bound = wait_all_bound(api, len(work), args.timeout)
    finally:
        ks.stop()
    times = scheduler_bind_times(ks.log_file)
    log(f"default arm: API calls {dict(sorted(cost.calls.items()))}")
    return {
        "default_bound": len(times),
        "default_pods_per_s": pods_per_s(times),
        **load.figures("default_"),
        **cost.figures(bound, "default_"),
    }


def host_cost(plane: Plane, api: Api, ks: KubeScheduler, tp: Topoplace | None) -> HostCost:
    """The arm's processes for :class:`~benchmarks.live.metrics.HostCost`: the API server,
    etcd, the arm's kube-scheduler, topoplace (its arm only) and this benchmark (its pod
    lists while waiting), and the API server's request counts."""
    pids: dict[str, Callable[[], int | None]] = {
        "apiserver": lambda: plane.pid("kube-apiserver"),
        "etcd": lambda: plane.pid("etcd"),
        "scheduler": lambda: ks.pid,
        "bench": os.getpid,
    }
    if tp is not None:
        pids["topoplace"] = lambda: tp.pid
    return HostCost(pids, lambda: api.get_text(api.server + "/metrics"))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA), help="the alibaba-gpu-v2023 folder")
    ap.add_argument("--workload", default="default", help="openb pod list (default, ...)")
    ap.add_argument("--nodes", type=int, default=None, help="sample of the trace's GPU nodes")
    ap.add_argument("--pods", type=int, default=None, help="at most this many pods")
    ap.add_argument("--fill", type=float, default=0.9, help="GPU shares asked / GPUs")
    ap.add_argument("--backend", choices=BACKENDS, default="hami", help="how GPUs are shared")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument(
        "--arms",
        nargs="+",
        choices=("topoplace", "default"),
        default=["topoplace", "default"],
        help="live arms per run (default: HAMi only; see the module docstring)",
    )
    add_plane_args(ap)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    data = Path(args.data)
    lacking = missing(args) or (
        ""
        if (data / "openb_node_list_gpu_node.csv").is_file()
        else f"needs the openb trace ({data})"
    )
    if lacking:
        print(lacking, file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work_dir, plane, kc, api = up_plane(args, "livebench-frac-")
    rows: list[dict[str, Any]] = []
    try:
        nodes = node_objects(data, args.nodes, "frac", args.backend)
        api.create_nodes(nodes)
        api.ensure_namespace(NAMESPACE)
        live_nodes = api.list_nodes()
        devices = devices_of(live_nodes)
        biggest = 1 if args.backend == "gpushare" else max(len(devices_of([n])) for n in nodes)
        work = workload(data, args.workload, len(devices), biggest, args.fill, args.pods)
        t = time.monotonic()
        args.policy_file = policy_file(work_dir / "policy.yaml")
        want = offline(live_nodes, work, args.policy_file, args.backend)
        log(f"offline: {len(want)} of {len(work)} placed in {time.monotonic() - t:.1f}s")
        order = [t.name for t in work]
        for run in range(1, args.runs + 1):
            extra: dict[str, Any] = {}
            if "default" in args.arms and args.backend == "hami":
                extra = run_default(args, plane, api, kc, work_dir / "logs", work)
                log(
                    f"run {run} default-scheduler: {extra['default_bound']}/{len(work)} "
                    f"bound, {extra['default_pods_per_s']:.1f} pods/s"
                )
                clear_pods(api)
            if "topoplace" not in args.arms:
                rows.append({"run": run, **extra})
                continue
            row, placed = run_arm(args, plane, api, kc, work_dir / "logs", work)
            row.update(extra)
            if extra:
                row["over_default"] = row["pods_per_s_sched"] / extra["default_pods_per_s"]
            same = [p for p in order if p in want and placed.get(p) == want[p]]
            diverged = next((i for i, p in enumerate(order) if placed.get(p) != want.get(p)), -1)
            row.update(
                run=run,
                **figures(placed, work, devices),
                placed_as_offline=len(same),
                first_divergence=diverged,
            )
            log(
                f"run {run}: {row['bound']}/{len(work)} bound, {row['pods_per_s']:.1f} pods/s, "
                f"{len(same)} placed as offline, {row['overcommitted_gpus']} overcommitted"
            )
            rows.append(row)
            clear_pods(api)
        if "topoplace" in args.arms:
            write(out, args, work, devices, rows, figures(want, work, devices))
        else:
            write_default(out, rows)
    finally:
        down_plane(api, plane, work_dir, out)
    return 0


FIELDS = (
    "bound",
    "pods_per_s",
    "nodes_used",
    "gpus_used",
    "gpus_untouched",
    "allocation",
    "overcommitted_gpus",
    "placed_as_offline",
    "first_divergence",
    "filter_mean_ms",
    "filter_p99_ms",
    "bind_mean_ms",
    "bind_p99_ms",
    "load_min",
    "load_mean",
    "load_max",
)


COST_PARTS = ("apiserver", "etcd", "scheduler", "topoplace", "bench", "total")
COST_FIELDS = (
    *(f"cpu_ms_{k}" for k in COST_PARTS),
    "writes_per_pod",
    "node_writes_per_pod",
)
DEFAULT_FIELDS = (
    *(f"default_{k}" for k in COST_FIELDS if k != "cpu_ms_topoplace"),
    "pods_per_s_sched",
    "default_bound",
    "default_pods_per_s",
    "over_default",
    "default_load_min",
    "default_load_mean",
    "default_load_max",
)


def cost_table(rows: list[dict[str, Any]]) -> list[str]:
    """What each arm cost the host per pod placed (median of runs): CPU milliseconds of each
    process from kube-scheduler's start to the last bind, and the API server's writes."""
    arms = [("topoplace", "")] + (
        [("default-scheduler", "default_")]
        if all("default_cpu_ms_total" in r for r in rows)
        else []
    )
    if not all("cpu_ms_total" in r for r in rows):
        return []

    def med(key: str) -> str:
        xs = [float(r[key]) for r in rows if key in r]
        return f"{statistics.median(xs):.2f}" if xs else "-"

    lines = [
        "",
        "Host cost per pod placed (median of runs), from kube-scheduler's start to the last "
        "bind: CPU ms of each process (`/proc/PID/stat`), the API server's writes (every "
        "request but GET, LIST and WATCH, from its `apiserver_request_total`):",
        "",
        "| arm | kube-apiserver | etcd | kube-scheduler | topoplace | benchmark's lists | "
        "all, CPU ms | API writes | of them on nodes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, pre in arms:
        cells = [med(f"{pre}cpu_ms_{k}") for k in COST_PARTS]
        lines.append(
            f"| {arm} | " + " | ".join(cells) + f" | {med(pre + 'writes_per_pod')} | "
            f"{med(pre + 'node_writes_per_pod')} |"
        )
    return lines


def write_default(out: Path, rows: list[dict[str, Any]]) -> None:
    """The default arm alone: pods bound and pods/s per run."""
    lines = ["| run | pods bound | pods/s | load average (1 min) min / mean / max |"]
    lines.append("|---|---|---|---|")
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['default_bound']} | {r['default_pods_per_s']:.1f} | "
            f"{r['default_load_min']:.1f} / {r['default_load_mean']:.1f} / "
            f"{r['default_load_max']:.1f} |"
        )
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def write(
    out: Path,
    args: argparse.Namespace,
    work: list[Task],
    devices: Mapping[str, Any],
    rows: list[dict[str, Any]],
    off: dict[str, Any],
) -> None:
    with open(out / "runs.csv", "w", newline="") as f:
        have = [k for k in (*COST_FIELDS, *DEFAULT_FIELDS) if all(k in r for r in rows)]
        w = csv.DictWriter(f, fieldnames=["run", *FIELDS, *have], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    med = {k: statistics.median(float(r[k]) for r in rows) for k in FIELDS}
    kinds = Counter("whole" if t.milli == MILLI else "fractional" for t in work)
    gpus = defaultdict(int)
    for t in work:
        gpus[t.gpus] += 1
    shape = (
        f"HAMi nodes (split {SPLIT})"
        if args.backend == "hami"
        else f"gpushare nodes (GiB; a task asks its share of {GPUSHARE_TASK_GIB} GiB)"
    )
    lines = [
        f"# Live fractional GPUs ({'HAMi' if args.backend == 'hami' else 'gpushare'})",
        "",
        f"Conditions: {len(devices)} GPUs on the openb trace's GPU nodes"
        f"{f' (an even sample of {args.nodes})' if args.nodes else ''} as {shape}; "
        f"{len(work)} pods of workload `{args.workload}` in creation order "
        f"({kinds['fractional']} fractional, {kinds['whole']} whole-GPU; by GPUs: "
        f"{dict(sorted(gpus.items()))}), shares up to {args.fill:.0%} of the GPUs; a backlog "
        f"created before kube-scheduler starts; {args.runs} run(s); topoplace from "
        f"{source_of(args.topoplace_src)}, shipped configuration, shipped policy with `sharing.hami_lock: release`; pods/s from the "
        "first bind to the last, from kube-scheduler's own log.",
        "",
        "| | pods bound | pods/s | nodes used | GPUs used | GPUs untouched | allocation "
        "| overcommitted GPUs | placed as offline | filter mean / p99 ms | bind mean / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| live topoplace (median of {len(rows)}) | {med['bound']:.0f} | "
        f"{med['pods_per_s']:.1f} | {med['nodes_used']:.0f} | {med['gpus_used']:.0f} | "
        f"{med['gpus_untouched']:.0f} | {med['allocation']:.4f} | "
        f"{med['overcommitted_gpus']:.0f} | {med['placed_as_offline']:.0f} | "
        f"{med['filter_mean_ms']:.2f} / {med['filter_p99_ms']:.2f} | "
        f"{med['bind_mean_ms']:.2f} / {med['bind_p99_ms']:.2f} |",
        f"| offline (topoplace's extender, in process) | {off['bound']} | | "
        f"{off['nodes_used']} | {off['gpus_used']} | {off['gpus_untouched']} | "
        f"{off['allocation']:.4f} | {off['overcommitted_gpus']} | | | |",
        *(
            [
                f"| live default-scheduler, GPU replicas (median of {len(rows)}) | "
                f"{statistics.median(r['default_bound'] for r in rows):.0f} | "
                f"{statistics.median(r['default_pods_per_s'] for r in rows):.1f} | "
                "| | | | | | | |",
                "",
                "Both timed by kube-scheduler's own log (first bind to last): topoplace "
                f"{statistics.median(r['pods_per_s_sched'] for r in rows):.1f} pods/s, "
                "default-scheduler "
                f"{statistics.median(r['default_pods_per_s'] for r in rows):.1f}; topoplace's "
                "pods/s over default-scheduler's (median of runs): "
                f"**{statistics.median(r['over_default'] for r in rows):.2f}x**; the "
                "host's 1-minute load average while the arms ran (mean per run): topoplace "
                + ", ".join(f"{r['load_mean']:.1f}" for r in rows)
                + "; default-scheduler "
                + ", ".join(f"{r['default_load_mean']:.1f}" for r in rows),
            ]
            if all("over_default" in r for r in rows)
            else []
        ),
        *cost_table(rows),
        "",
        "Per run:",
        "",
        "| run | " + " | ".join(FIELDS) + " |",
        "|" + "---|" * (len(FIELDS) + 1),
    ]
    for r in rows:
        cells = [f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in FIELDS]
        lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
