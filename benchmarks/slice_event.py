"""CPU of one ResourceSlice watch event in kube mode (``KubeWatcher.apply_event``), in
process.

A DRA driver republishes a node's ResourceSlice whenever a device's taints change (a GPU
marked unhealthy, an XID, maintenance). The watch applies a taint update under the cache
lock, so filter and bind wait for it; a rebuild runs beside them, sharing the interpreter
(see ``wait`` below). This benchmark builds a watcher over ``--nodes`` synthetic
8-GPU nodes with one recorded 8-GPU slice each (``benchmarks.health_refresh.node_slices``:
``tests/fixtures/kube/dra-1.33``, renamed per node), the recorded DeviceClass and a health
tracker, lists them as the watch's initial sync does, then times ``--events`` events of
two kinds:

* ``taint``: a slice republished with one device taint added (or the last one removed),
  round robin over the nodes: the watcher re-assesses that node alone
  (``ClusterCache.apply_slice_taints``);
* ``device``: a slice republished with a device left out (then put back): every node is
  read again from every object (``KubeWatcher._rebuild`` -> ``ClusterCache.replace_all``),
  here at once for each event (``slice_rebuild_delay_s=0``).

Two more figures for changes that need a rebuild:

* ``burst``: ``--burst`` slices republished with a device left out, one after another (a
  driver restarting on many nodes), then the rebuild that is due: the CPU of the whole
  burst and how many rebuilds it took (with the shipped ``WatchOptions``: one; a checkout
  without the coalescing rebuilds for each);
* ``wait``: while one rebuild runs in the watch's thread, a probe thread takes the cache
  (``ClusterCache.assume_chosen`` with a choice that holds nothing, as filter and bind
  take it) every millisecond: the longest and the median wall time of one take.

Each event's copy of the slice is made outside the timing. The API objects come from
:class:`ListOnlyApiNoServer` (a stand-in for the API server: it serves discovery and the
initial lists from memory; nothing here talks to a cluster).

Prints the conditions and, per case, the median and p99 CPU ms of one event
(``time.process_time``) and the nodes whose health the last event changed.

Run: ``python -m benchmarks.slice_event [--nodes 500 5000] [--events 40] [--burst 20]
[--source DIR]``
(``--source`` imports ``scheduler`` from another checkout, for a before / after
comparison; a checkout without the taint path rebuilds on both kinds).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.checkout import add_source_option, import_scheduler

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "kube" / "dra-1.33"
VERSION = "v1beta1"


class ListOnlyApiNoServer:
    """Stands in for the API server: discovery of ``resource.k8s.io/v1beta1`` and the
    initial lists, from memory (no watch is opened: events are applied directly)."""

    def __init__(self, lists: dict[str, dict[str, Any]]) -> None:
        self.lists = lists
        self.discovery = json.loads((FIXTURES / f"apiresources.{VERSION}.json").read_text())

    def api_resources(self, group: str, version: str) -> dict[str, Any] | None:
        return self.discovery if version == VERSION else None  # None: not served

    def list(self, kind: Any) -> dict[str, Any]:
        return copy.deepcopy(self.lists.get(kind.name) or {"items": [], "metadata": {}})


def one_case(nodes: int, events: int, burst: int = 0) -> dict[str, Any]:
    """Per kind: (CPU ms of each event, nodes whose health the last one changed); with
    ``burst``, also "burst": (CPU ms of the burst and its rebuild, rebuilds) and "wait":
    (the probe's wall ms per take of the cache during one rebuild)."""
    from benchmarks.clusters import synthetic_cluster
    from benchmarks.health_refresh import node_slices
    from scheduler.cli.main import load_params
    from scheduler.kube import dra as kdra
    from scheduler.kube.client import NODES, PODS
    from scheduler.kube.watcher import KubeWatcher, WatchOptions
    from scheduler.runtime.cache import ClusterCache
    from scheduler.runtime.health_tracker import HealthTracker

    objs = [o for o in synthetic_cluster(nodes)["items"] if o["kind"] == "Node"]
    names = [o["metadata"]["name"] for o in objs]
    slices = node_slices(names)
    for i, s in enumerate(slices):
        s["metadata"]["resourceVersion"] = str(10 + i)
    kinds = kdra.kinds_for(VERSION)
    classes = json.loads((FIXTURES / f"deviceclasses.{VERSION}.json").read_text())
    lists = {
        NODES.name: {"items": objs, "metadata": {"resourceVersion": "1"}},
        PODS.name: {"items": [], "metadata": {"resourceVersion": "1"}},
        kinds[0].name: {"items": slices, "metadata": {"resourceVersion": "1"}},
        kinds[1].name: {"items": [], "metadata": {"resourceVersion": "1"}},
        kinds[2].name: classes,
    }
    params = load_params(None)
    cache = ClusterCache.from_objects([], [], params)
    cache.health_tracker = HealthTracker(params.health)
    at_once = WatchOptions(podgroups=False)
    if hasattr(at_once, "slice_rebuild_delay_s"):  # a checkout with the coalescing
        at_once = WatchOptions(podgroups=False, slice_rebuild_delay_s=0)
    watcher = KubeWatcher(ListOnlyApiNoServer(lists), cache, at_once)
    watcher.sync()
    stream = watcher.streams[kinds[0].name]
    out: dict[str, Any] = {}
    rv = 10 * nodes
    for case in ("taint", "device"):
        times = []
        changed = 0
        for i in range(events):
            at = (i // 2) % nodes
            current = stream.store[_key(slices[at])]
            new = copy.deepcopy(current)
            rv += 1
            new["metadata"]["resourceVersion"] = str(rv)
            devices = new["spec"]["devices"]
            if case == "taint":
                body = devices[3]["basic"]
                if i % 2 == 0:
                    body["taints"] = [{"key": "gpu.nvidia.com/xid", "effect": "NoSchedule"}]
                else:
                    body.pop("taints", None)
            elif i % 2 == 0:
                devices.pop()
            else:
                devices.append(copy.deepcopy(slices[at]["spec"]["devices"][-1]))
            before = cache.snapshot()
            t = time.process_time()
            watcher.apply_event(stream, {"type": "MODIFIED", "object": new})
            times.append(1000 * (time.process_time() - t))
            after = cache.snapshot()
            changed = sum(
                1 for a, b in zip(before.nodes, after.nodes, strict=True) if a.health != b.health
            )
        out[case] = (times, changed)
    if burst:
        out["burst"] = _burst(watcher, stream, burst, rv)
        out["wait"] = _wait(watcher)
    return out


def _burst(watcher: Any, stream: Any, burst: int, rv: int) -> tuple[float, int]:
    """(CPU ms, rebuilds) of ``burst`` slices republished with a device left out, one per
    node, and the rebuild that is then due, with the shipped watch options."""
    from scheduler.kube.watcher import WatchOptions

    watcher.options = WatchOptions(podgroups=False)
    counter = watcher.metrics.rebuilds.labels(cause="resourceslices")
    before = counter._value.get()
    keys = list(stream.store)[:burst]
    objs = []
    for k in keys:
        new = copy.deepcopy(stream.store[k])
        rv += 1
        new["metadata"]["resourceVersion"] = str(rv)
        new["spec"]["devices"].pop()
        objs.append(new)
    t = time.process_time()
    for new in objs:
        watcher.apply_event(stream, {"type": "MODIFIED", "object": new})
    if hasattr(watcher, "rebuild_stale_slices"):
        watcher.rebuild_stale_slices(force=True)
    cpu = 1000 * (time.process_time() - t)
    return cpu, int(counter._value.get() - before)


def _wait(watcher: Any) -> list[float]:
    """Wall ms of each take of the cache by a probe thread (every 1 ms) while the
    watcher rebuilds once."""
    import threading

    cache = watcher.cache
    waits: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            cache.assume_chosen(lambda snap: "probe holds nothing")
            waits.append(1000 * (time.perf_counter() - t))
            time.sleep(0.001)

    thread = threading.Thread(target=probe)
    thread.start()
    time.sleep(0.05)
    with watcher._lock:
        watcher._rebuild("resourceslices")
    stop.set()
    thread.join()
    return waits


def _key(slice_obj: dict[str, Any]) -> str:
    """The watcher's store key of a cluster-scoped object (``object_key``)."""
    from scheduler.core.objects import object_key

    return object_key(slice_obj)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    ap.add_argument("--events", type=int, default=40, help="events timed per kind")
    ap.add_argument(
        "--burst", type=int, default=20, help="slices republished in the burst (0: none)"
    )
    add_source_option(ap)
    args = ap.parse_args(argv)
    where = import_scheduler(args.source)
    from benchmarks.stats import p99

    print(
        f"ResourceSlice watch events, in process: scheduler from {where}; synthetic 8-GPU "
        f"nodes with one recorded 8-GPU {VERSION} slice each, health tracker on, no pods; "
        f"{args.events} MODIFIED events per kind (CPU ms per event, process_time)"
    )
    print("| nodes | event | median | p99 | nodes whose health the last event changed |")
    print("|---|---|---|---|---|")
    results = {n: one_case(n, args.events, args.burst) for n in args.nodes}
    for n, cases in results.items():
        for case in ("taint", "device"):
            times, changed = cases[case]
            label = "a device taint" if case == "taint" else "a device left out / back"
            print(
                f"| {n} | {label} | {statistics.median(times):.2f} | {p99(times):.2f} | {changed} |"
            )
    if args.burst:
        print()
        print(
            f"A burst of {args.burst} slices republished with a device left out, then the "
            "rebuild due (shipped watch options); a probe taking the cache every 1 ms "
            "during one rebuild (wall ms per take)"
        )
        print("| nodes | burst CPU ms | rebuilds | probe takes | longest take | median take |")
        print("|---|---|---|---|---|---|")
        for n, cases in results.items():
            cpu, rebuilds = cases["burst"]
            waits = cases["wait"]
            print(
                f"| {n} | {cpu:.1f} | {rebuilds} | {len(waits)} | {max(waits):.3f} "
                f"| {statistics.median(waits):.3f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
