"""CPU of the extender's pod watch per watch event, against a real API server.

What one pod costs the sidecar's ``watch-pods`` thread in kube mode: topoplace's real
:class:`~scheduler.kube.watcher.KubeWatcher` runs on a real
:class:`~scheduler.kube.client.KubeApi` (a list, then the pod watch with bookmarks) into a
real :class:`~scheduler.runtime.cache.ClusterCache`. A separate process (so that only the
watch thread works in the measuring process) creates ``--pods`` one-GPU pods of a scheduler
nobody runs (profile ``nobody``) and then binds them with Binding POSTs carrying
topoplace's placement annotation (as ``benchmarks/bind_client.py`` does), to the existing
nodes round robin (then the next GPU). Before the binds the pods are assumed in the cache
on those GPUs, as topoplace's bind does, so each bind reaches the watch as one ``MODIFIED``
event confirming an assumption, the event the lead measured at ~0.23 ms of CPU per pod in the live sidecar.

Measured inside the watch thread with ``time.thread_time`` (CPU of that thread only):

* ``io+decode``: from the end of the previous ``apply_event`` to the start of this one:
  the socket read, the HTTP chunk framing, the line split and ``orjson.loads``;
* ``apply_event``: the store and cache update (metrics, ``strip_object``, lock, cache);
* ``total``: their sum, per event.

Also the thread's whole CPU clock (``pthread_getcpuclockid``) over the bind phase divided
by the number of bound pods (checks the per-event sum misses nothing). The stream is read
by ``WatchStream`` (urllib3's ``HTTPResponse.stream``).

Needs a real API server (``KUBECONFIG``, e.g. ``../shared/controlplane/up.sh`` with
``fake_nodes.py``; no scheduler has to run). Pods are force-deleted after each run.

Run: ``KUBECONFIG=... python -m benchmarks.watch_cpu [--pods 300] [--runs 4]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import threading
import time
from collections.abc import Mapping
from typing import Any

import orjson

from benchmarks.clusters import make_pod
from benchmarks.kubebench import binding, connect
from benchmarks.stats import p99
from scheduler.core.model import PLACEMENT_ANNOTATION
from scheduler.core.objects import bound_pod, placement_value
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import build_snapshot, pod_info_for
from scheduler.kube.client import PODS, KubeApi
from scheduler.kube.watcher import KubeWatcher, ResourceStream, WatchOptions
from scheduler.runtime.cache import ClusterCache


class TimedWatcher(KubeWatcher):
    """The real watcher, with the watch thread's CPU recorded around every pod event."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.samples: list[tuple[str, bool, float, float]] = []
        self._mark: float | None = None
        self.pods_tid: int | None = None

    def watch_once(self, s: ResourceStream) -> int:
        if s.kind == PODS:
            self.pods_tid = threading.get_ident()
            self._mark = None  # the first event after a (re)connect also pays the request
        return super().watch_once(s)

    def apply_event(self, s: ResourceStream, event: Mapping[str, Any]) -> None:
        if s.kind != PODS:
            return super().apply_event(s, event)
        t0 = time.thread_time()
        obj = event.get("object") or {}
        bound = bool((obj.get("spec") or {}).get("nodeName"))
        typ = str(event.get("type"))
        try:
            super().apply_event(s, event)
        finally:
            t1 = time.thread_time()
            if self._mark is not None:
                self.samples.append((typ, bound, t0 - self._mark, t1 - t0))
            self._mark = t1
        return None


def _slot(i: int, nodes: list[str]) -> tuple[str, tuple[int, ...]]:
    """Pod ``i``'s node and GPU: round robin over the nodes, then the next GPU."""
    return nodes[i % len(nodes)], ((i // len(nodes)) % 8,)


def _drive(kubeconfig: str, phase: str, ns: str, names: list[str], nodes: list[str]) -> None:
    """Create (``create``), bind (``bind``) or force-delete (``delete``) the pods."""
    api = KubeApi.from_config(kubeconfig)
    for i, name in enumerate(names):
        if phase == "create":
            pod = make_pod(name, 1, namespace=ns, scheduler_name="nobody", cpu="1", memory="1Gi")
            api._post_json(f"/api/v1/namespaces/{ns}/pods", orjson.dumps(pod))
        elif phase == "bind":
            node, gpus = _slot(i, nodes)
            api.create_binding(ns, name, binding(ns, name, node, gpus))
        else:
            api._core.delete_namespaced_pod(
                name, ns, grace_period_seconds=0, _preload_content=False
            )
    api.close()


def _in_child(kubeconfig: str, phase: str, ns: str, names: list[str], nodes: list[str]) -> None:
    p = mp.get_context("spawn").Process(target=_drive, args=(kubeconfig, phase, ns, names, nodes))
    p.start()
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"{phase} driver failed (exit {p.exitcode})")


def _wait(cond: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def one_run(
    kubeconfig: str, reader: str, ns: str, pods: int, nodes: list[str], tag: str
) -> dict[str, Any]:
    """One fresh watcher, ``pods`` pods created then bound; per-event samples."""
    params = SchedParams()
    cache = ClusterCache(build_snapshot([], [], params), params)
    api = KubeApi.from_config(kubeconfig)
    w = TimedWatcher(api, cache, WatchOptions(podgroups=False, dra=False, watch_seconds=600))
    w.start()
    if not w.wait_synced(30):
        raise RuntimeError("watcher did not sync")
    names = [f"w-{tag}-{i}" for i in range(pods)]
    store = w.streams[PODS.name].store
    _wait(lambda: w.pods_tid is not None, "the pod watch")
    _in_child(kubeconfig, "create", ns, names, nodes)
    _wait(lambda: all(f"{ns}/{n}" in store for n in names), "ADDED events")
    # What topoplace's bind does before its Binding POST: assume the pod on its node and
    # GPUs, so each MODIFIED event confirms an assumption, as in the live sidecar.
    for i, name in enumerate(names):
        node, gpus = _slot(i, nodes)
        ann = {PLACEMENT_ANNOTATION: placement_value(node, gpus)}
        obj = bound_pod(store[f"{ns}/{name}"], node, ann)
        cache.assume(pod_info_for(cache.snapshot(), obj, node, assumed=True, params=params))
    time.sleep(0.2)
    clock = time.pthread_getcpuclockid(w.pods_tid or 0)
    n0 = len(w.samples)
    c0 = time.clock_gettime(clock)
    _in_child(kubeconfig, "bind", ns, names, nodes)

    def all_bound() -> bool:
        return all((store[f"{ns}/{n}"].get("spec") or {}).get("nodeName") for n in names)

    _wait(all_bound, "MODIFIED events of the bound pods")
    c1 = time.clock_gettime(clock)
    bind_samples = w.samples[n0:]
    add_samples = w.samples[:n0]
    w.stop()
    api.close()
    _in_child(kubeconfig, "delete", ns, names, nodes)
    return {
        "modified": [(io, ap) for typ, b, io, ap in bind_samples if typ == "MODIFIED" and b],
        "added": [(io, ap) for typ, b, io, ap in add_samples if typ == "ADDED"],
        "events_in_bind_phase": len(bind_samples),
        "thread_cpu_per_pod": (c1 - c0) / pods,
        "assumed_left": sum(1 for p in cache.snapshot().pods.values() if p.assumed),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=300, help="pods created and bound per run")
    ap.add_argument("--runs", type=int, default=4, help="runs")
    ap.add_argument("--namespace", default="watch-bench")
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    args = ap.parse_args(argv)
    ns = args.namespace
    api, nodes = connect(ap, args.kubeconfig, ns)
    if args.pods > 8 * len(nodes):
        ap.error(f"at most 8 pods per node ({8 * len(nodes)} here)")
    host = api.host
    api.close()
    readers = ["urllib3"]
    results: dict[str, list[dict[str, Any]]] = {r: [] for r in readers}
    for run in range(args.runs):
        order = readers if run % 2 == 0 else list(reversed(readers))
        for reader in order:
            tag = f"{reader[0]}{run}-{int(time.time())}"
            results[reader].append(one_run(args.kubeconfig, reader, ns, args.pods, nodes, tag))
    print(
        f"pod watch thread CPU per event: API server {host}, {len(nodes)} nodes, "
        f"{args.runs} runs x {args.pods} pods per reader, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; binds from a separate process"
    )
    print("| reader | event | split | median ms | p99 ms | run means (ms) |")
    print("|---|---|---|---|---|---|")
    for reader in readers:
        rs = results[reader]
        for event in ("modified", "added"):
            label = "MODIFIED (bind)" if event == "modified" else "ADDED (create)"
            for split, f in (
                ("io+decode", lambda x: x[0]),
                ("apply_event", lambda x: x[1]),
                ("total", lambda x: x[0] + x[1]),
            ):
                xs = [1000 * f(x) for r in rs for x in r[event]]
                means = ", ".join(
                    f"{1000 * statistics.fmean(f(x) for x in r[event]):.4f}" for r in rs
                )
                print(
                    f"| {reader} | {label} | {split} | {statistics.median(xs):.4f} | "
                    f"{p99(xs):.4f} | {means} |"
                )
        whole = ", ".join(f"{1000 * r['thread_cpu_per_pod']:.4f}" for r in rs)
        evs = ", ".join(str(r["events_in_bind_phase"]) for r in rs)
        print(f"| {reader} | bind phase | thread CPU clock / pods | | | {whole} |")
        print(f"| {reader} | bind phase | pod events seen per run | | | {evs} |")
        left = ", ".join(str(r["assumed_left"]) for r in rs)
        print(f"| {reader} | after | assumptions not confirmed by the watch | | | {left} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
