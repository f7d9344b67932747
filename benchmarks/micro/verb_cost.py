"""``verb-cost``: filter + prioritize CPU per pod kind, in process, as the server answers them.

Up to six kinds of pod arrive one after another at a warm extender (the heap moved out of the
garbage collector's reach, as ``topoplace serve`` does after its start-up), each kind on a
cluster of ``--nodes`` DGX H100 nodes (``benchmarks.clusters.dgx_h100_nodes``) of its own,
``--held`` of them (a seeded draw) holding 4 of their GPUs:

* ``whole GPU``: pods of 1, 2, 4 and 8 whole GPUs in turn (``nvidia.com/gpu``); filter is
  offered every node in a new order per pod (kube-scheduler's parallel filter on a large
  cluster), prioritize the nodes filter kept;
* ``gang member``: 8-GPU members of gangs of 4 (``topoplace.io/gang``); the first member's
  filter plans the whole gang (CP-SAT), its mates find the plan; nothing is bound, so each
  plan's reservation stays and the next gang plans around it. Each gang is in a namespace
  of its own (tenants): in one namespace the unbound reservations would reach
  ``gang.max_reserved_gpus_per_namespace`` (1,024 GPUs) at the 32nd gang and every later
  gang would be refused;
* ``HAMi share``: nodes running HAMi's device plugin (register annotation, 10 replicas per
  GPU), pods of one share (20,000 MiB and 30 % of the cores as ``gpumem`` / ``gpucores``);
* ``DRA claim``: nodes with one recorded 8-GPU ResourceSlice each
  (``benchmarks.clusters.node_slices``) and the recorded DeviceClass; claims of 1, 2, 4, 8
  GPUs in turn; the held share holds an allocated 4-GPU claim. A claim pod reaches
  topoplace after kube-scheduler's DynamicResources filter, so filter is offered the nodes
  where its claim can be allocated (computed beforehand, outside the timing), in a new
  order per pod; topoplace
  predicts the devices kube-scheduler's allocator will take (``DraRouter``);
* ``DRA claim (constrained)`` (run when named): the ``DRA claim`` case with a
  ``matchAttribute`` constraint in every claim, on the attributes the recorded devices
  carry (:data:`CONSTRAINT_OF`): 1 and 2 GPUs under one ``resource.kubernetes.io/pcieRoot``,
  4 and 8 GPUs of one ``gpu.nvidia.com/productName``;
* ``DRA share`` (run when named: ``--pods-of "DRA share"``): DRA consumable capacity:
  nodes whose 8 GPUs are shared devices (v1, ``allowMultipleAllocations``, memory and
  compute capacity), claims of one shared GPU with 10, 20, 40, 60 GiB in turn; the held
  share has 40 GiB taken on 4 GPUs. Every node has room for every ask, so filter is offered
  every node (shuffled).

Each verb is called as the server calls it (JSON bytes through ``Extender.filter_json`` /
``prioritize_json``) and timed in CPU (``time.process_time``). Figures per kind: median
and p99 CPU ms per pod of filter, of prioritize and of both, over ``--pods`` pods x
``--runs`` runs (the first pod of each run included), and the nodes offered and kept.

``--kind slices``: the CPU of one ResourceSlice watch event in kube mode
(``KubeWatcher.apply_event``). A DRA driver republishes a node's ResourceSlice whenever a device's taints change (a GPU
marked unhealthy, an XID, maintenance). The watch applies a taint update under the cache
lock, so filter and bind wait for it; a rebuild runs beside them, sharing the interpreter
(see ``wait`` below). This benchmark builds a watcher over ``--nodes`` synthetic
8-GPU nodes with one recorded 8-GPU slice each (``benchmarks.clusters.node_slices``:
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

The API objects come from :class:`ListOnlyApiNoServer` (a stand-in for the API server: it
serves discovery and the initial lists from memory). Figures: median and p99 CPU ms of one
event (``--events`` per kind), the nodes whose health the last event changed, and the burst.

``topoplace bench verb-cost [--nodes 500 ...] [--pods 200] [--held 0.4] [--runs 3]``;
``topoplace bench verb-cost --kind slices [--nodes 500 5000] [--events 40] [--burst 20]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from benchmarks.clusters import (
    DRA_FIXTURES,
    claim_pod,
    dgx_h100_nodes,
    hami_node,
    hami_pod,
    make_pod,
    node_slices,
    resource_claim,
    synthetic_cluster,
)
from benchmarks.registry import Figures
from benchmarks.stats import p99

VERSION = "v1beta1"
COUNTS = (1, 2, 4, 8)
GANG_SIZE = 4
KINDS = (
    "whole GPU",
    "gang member",
    "HAMi share",
    "DRA claim",
    "DRA claim (constrained)",
    "DRA share",
)
"""The pod kinds, in the order the figures list them."""
DEFAULT_KINDS = KINDS[:4]  # whole GPU, gang member, HAMi share, DRA claim
"""The kinds run without ``--pods-of`` (the constrained claim and ``DRA share`` are asked
for by name)."""

Case = tuple[
    list[dict[str, Any]],
    list[dict[str, Any]],
    dict[str, Any],
    list[tuple[dict[str, Any], list[str]]],
]
"""(nodes, bound pods, extra objects for the cache, [(pod, nodes offered)])."""


def _held(names: list[str], held: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    return sorted(rng.sample(names, int(held * len(names))))


def whole_case(nodes: int, pods: int, held: float, seed: int) -> Case:
    """Whole-GPU pods of 1, 2, 4, 8 GPUs in turn, offered every node (shuffled)."""
    objs = dgx_h100_nodes(nodes)
    names = [o["metadata"]["name"] for o in objs]
    bound = [make_pod(f"held-{n}", 4, namespace="busy", node=n, gpu_indices=range(4))
             for n in _held(names, held, seed)]  # fmt: skip
    rng = random.Random(seed)
    todo = []
    for i in range(pods):
        order = names[:]
        rng.shuffle(order)
        todo.append((make_pod(f"w{i:05d}", COUNTS[i % len(COUNTS)], namespace="bench"), order))
    return objs, bound, {}, todo


def gang_case(nodes: int, pods: int, held: float, seed: int) -> Case:
    """8-GPU members of gangs of :data:`GANG_SIZE` (each gang in its own namespace),
    offered every node (shuffled)."""
    objs, bound, _, _ = whole_case(nodes, 0, held, seed)
    names = [o["metadata"]["name"] for o in objs]
    rng = random.Random(seed)
    todo = []
    for i in range(pods):
        order = names[:]
        rng.shuffle(order)
        gang = f"g{i // GANG_SIZE:04d}"
        # a namespace per gang: nothing binds, and the unbound reservations of one
        # namespace stop at gang.max_reserved_gpus_per_namespace (1,024 GPUs: 32 gangs)
        pod = make_pod(f"{gang}-{i % GANG_SIZE}", 8, namespace=f"bench-{gang}", gang=gang,
                       gang_size=GANG_SIZE)  # fmt: skip
        todo.append((pod, order))
    return objs, bound, {}, todo


def hami_case(nodes: int, pods: int, held: float, seed: int) -> Case:
    """HAMi share pods (20,000 MiB, 30 % cores) on HAMi nodes, offered every node."""
    objs = [hami_node(f"hami-{i:05d}", leaf=f"leaf-{i // 32:03d}", spine="spine-0")
            for i in range(nodes)]  # fmt: skip
    names = [o["metadata"]["name"] for o in objs]
    bound = [make_pod(f"held-{n}", 4, namespace="busy", node=n, gpu_indices=range(4))
             for n in _held(names, held, seed)]  # fmt: skip
    rng = random.Random(seed)
    todo = []
    for i in range(pods):
        order = names[:]
        rng.shuffle(order)
        todo.append((hami_pod(f"s{i:05d}", 20000, 30), order))
    return objs, bound, {}, todo


PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
"""The standard attribute NVIDIA's DRA driver publishes per GPU (pairs of GPUs share one
in the recorded slice)."""
PRODUCT = "gpu.nvidia.com/productName"
"""The driver's ``productName`` attribute, qualified by its domain."""
CONSTRAINT_OF = {1: PCIE_ROOT, 2: PCIE_ROOT, 4: PRODUCT, 8: PRODUCT}
"""The ``matchAttribute`` of a constrained claim per GPU count: 1 and 2 GPUs under one PCIe
root (the recorded node has 2 GPUs per root, so 4 and 8 could never share one), 4 and 8
GPUs of one product."""


def constrained(claim: dict[str, Any], count: int) -> dict[str, Any]:
    """``claim`` with ``constraints: [{matchAttribute: CONSTRAINT_OF[count]}]`` (every
    request)."""
    claim["spec"]["devices"]["constraints"] = [{"matchAttribute": CONSTRAINT_OF[count]}]
    return claim


def dra_case(nodes: int, pods: int, held: float, seed: int, with_constraints: bool = False) -> Case:
    """DRA claim pods (1, 2, 4, 8 GPUs in turn), offered the nodes where the claim can be
    allocated (what kube-scheduler's DynamicResources filter leaves), in a new order per pod;
    ``with_constraints``: each claim with the ``matchAttribute`` constraint of
    :data:`CONSTRAINT_OF`."""
    from scheduler.core import dra

    objs = dgx_h100_nodes(nodes)
    names = [o["metadata"]["name"] for o in objs]
    slices = [dict(s, kind="ResourceSlice") for s in node_slices(names)]
    classes = json.loads((DRA_FIXTURES / "deviceclasses.v1beta1.json").read_text())["items"]
    classes = [dict(c, kind="DeviceClass") for c in classes]
    inv = dra.inventory(slices)
    claims = []
    for name in _held(names, held, seed):
        c = resource_claim(f"held-{name}", 4)
        spec = dra.claim_spec(c)
        c["status"] = {"allocation": dra.allocation_status(name, spec, inv.by_node[name][:4])}
        claims.append(c)
    pending = [resource_claim(f"want-{i:04d}", COUNTS[i % len(COUNTS)]) for i in range(pods)]
    if with_constraints:
        pending = [constrained(c, COUNTS[i % len(COUNTS)]) for i, c in enumerate(pending)]
    extra = dra.extra_of([*classes, *slices, *claims, *pending])
    in_use = dra.held_device_ids(claims)
    cls = extra[dra.CLASSES_KEY]
    # every node has the same slice: whether a claim fits a node depends only on the claim
    # (its request and constraints) and which of the node's devices are held
    state = {n: tuple(d.name for d in inv.by_node[n] if d.id in in_use) for n in names}
    fits: dict[tuple[Any, ...], bool] = {}
    rng = random.Random(seed)
    todo = []
    for i, claim in enumerate(pending):
        spec = dra.claim_spec(claim)
        form = (spec.requests, spec.constraints)
        offered = []
        for n in names:
            k = (form, state[n])
            if k not in fits:
                fits[k] = dra.first_fit(inv, n, [spec], cls, in_use).feasible
            if fits[k]:
                offered.append(n)
        rng.shuffle(offered)  # a new order per pod, as for the other kinds
        todo.append((claim_pod(f"pod-{i:04d}", claim["metadata"]["name"]), offered))
    return objs, [], extra, todo


def dra_constrained_case(nodes: int, pods: int, held: float, seed: int) -> Case:
    """:func:`dra_case` with a ``matchAttribute`` constraint in every claim."""
    return dra_case(nodes, pods, held, seed, with_constraints=True)


def dra_share_case(nodes: int, pods: int, held: float, seed: int) -> Case:
    """DRA capacity claim pods (one shared GPU of 10, 20, 40, 60 GiB in turn) on nodes whose
    8 GPUs are shared devices (``benchmarks.cluster.dra.node_slices`` with ``shared=8``,
    v1); the held share of nodes has 40 GiB taken on each of 4 GPUs. Every node has a GPU
    with room for every ask, so every node is offered (shuffled)."""
    from benchmarks.cluster.dra import SHARED_CLASS, device_class
    from benchmarks.cluster.dra import node_slices as shared_slices
    from scheduler.core import dra

    objs = dgx_h100_nodes(nodes)
    names = [o["metadata"]["name"] for o in objs]
    slices = [dict(s, kind="ResourceSlice") for n in names
              for s in shared_slices(n, "v1", gpus=8, shared=8)]  # fmt: skip
    classes = [dict(device_class("v1", SHARED_CLASS, shared=True), kind="DeviceClass")]
    inv = dra.inventory(slices)

    def claim(name: str, memory: str) -> dict[str, Any]:
        req = {"name": "gpu", "exactly": {"deviceClassName": SHARED_CLASS, "count": 1,
               "capacity": {"requests": {"memory": memory}}}}  # fmt: skip
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
                "spec": {"devices": {"requests": [req]}}}  # fmt: skip

    claims = []
    for name in _held(names, held, seed):
        for g in range(4):
            c = claim(f"held-{name}-{g}", "40Gi")
            dev = inv.by_node[name][g]
            c["status"] = {"allocation": dra.allocation_status(name, dra.claim_spec(c), [dev])}
            claims.append(c)
    pending = [claim(f"want-{i:04d}", ("10Gi", "20Gi", "40Gi", "60Gi")[i % 4])
               for i in range(pods)]  # fmt: skip
    extra = dra.extra_of([*classes, *slices, *claims, *pending])
    rng = random.Random(seed)
    todo = []
    for i, c in enumerate(pending):
        order = names[:]
        rng.shuffle(order)
        todo.append((claim_pod(f"pod-{i:04d}", c["metadata"]["name"]), order))
    return objs, [], extra, todo


CASES: dict[str, Callable[[int, int, float, int], Case]] = {
    "whole GPU": whole_case,
    "gang member": gang_case,
    "HAMi share": hami_case,
    "DRA claim": dra_case,
    "DRA claim (constrained)": dra_constrained_case,
    "DRA share": dra_share_case,
}


def one_run(kind: str, nodes: int, pods: int, held: float, seed: int) -> dict[str, list[float]]:
    """CPU ms of filter and prioritize for each pod of one fresh extender, and the nodes
    offered and kept.

    Raises:
        RuntimeError: a pod that no node kept, or a prioritize that did not score exactly
            the nodes filter kept.
    """
    from scheduler.cli import main as cli
    from scheduler.cli.main import load_params
    from scheduler.runtime.cache import ClusterCache
    from scheduler.runtime.gangs import GangRuntime
    from scheduler.server.extender import Extender

    objs, bound, extra, todo = CASES[kind](nodes, pods, held, seed)
    cache = ClusterCache.from_objects(objs, bound, load_params(None), extra=extra or None)
    ext = Extender(cache, gangs=GangRuntime(), profiles=("topoplace",))
    bodies = [orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": offered})
              for pod, offered in todo]  # fmt: skip
    del objs, bound, extra
    cli._settle_heap()  # as `topoplace serve` after its start-up
    out: dict[str, list[float]] = {"filter": [], "prioritize": [], "offered": [], "kept": []}
    for (pod, offered), raw in zip(todo, bodies, strict=True):
        t = time.process_time()
        reply = ext.filter_json(orjson.loads(raw), raw)
        out["filter"].append(1000 * (time.process_time() - t))
        kept = [n.strip() for n in orjson.loads(reply).get("NodeNames") or []]
        if not kept:
            raise RuntimeError(f"{kind}: no node kept {pod['metadata']['name']}: {reply[:200]!r}")
        raw2 = orjson.dumps({"Pod": copy.deepcopy(pod), "Nodes": None, "NodeNames": kept})
        t = time.process_time()
        scores = orjson.loads(ext.prioritize_json(orjson.loads(raw2), raw2))
        out["prioritize"].append(1000 * (time.process_time() - t))
        if sorted(h["Host"] for h in scores) != sorted(kept):
            raise RuntimeError(f"{kind}: prioritize scored {scores}, filter kept {kept}")
        out["offered"].append(len(offered))
        out["kept"].append(len(kept))
    return out


def verbs(args: argparse.Namespace) -> Figures:
    """Per node count and pod kind: filter, prioritize and both, median and p99 CPU ms per
    pod."""
    runs_n = args.runs or 3
    kinds = args.pods_of or list(DEFAULT_KINDS)
    rows: list[tuple[Any, ...]] = []
    for nodes, kind in ((n, k) for n in args.nodes for k in kinds):
        runs = [one_run(kind, nodes, args.pods, args.held, seed) for seed in range(runs_n)]
        f = [x for r in runs for x in r["filter"]]
        p = [x for r in runs for x in r["prioritize"]]
        both = [a + b for a, b in zip(f, p, strict=True)]
        offered = statistics.median(x for r in runs for x in r["offered"])
        kept = statistics.median(x for r in runs for x in r["kept"])
        rows.append((nodes, kind, statistics.median(f), p99(f), statistics.median(p), p99(p),
                     statistics.median(both), p99(both), offered, kept))  # fmt: skip
    return Figures(
        "filter + prioritize CPU ms per pod, per pod kind (in process)",
        (
            "nodes",
            "pod kind",
            "filter median",
            "filter p99",
            "prioritize median",
            "prioritize p99",
            "both median",
            "both p99",
            "nodes offered (median)",
            "kept (median)",
        ),  # fmt: skip
        rows,
        {
            "nodes": "DGX H100 (HAMi: 8 x H100, 10 shares each)",
            "holding 4 GPUs": f"{args.held:.0%}",
            "pods per run": args.pods,
            "runs": runs_n,
            "sizes": "whole GPU and DRA claims: 1/2/4/8 GPUs in turn; gangs of 4 x 8 GPUs",
        },  # fmt: skip
    )


# ---- --kind slices -------------------------------------------------------------------------


class ListOnlyApiNoServer:
    """Stands in for the API server: discovery of ``resource.k8s.io/v1beta1`` and the
    initial lists, from memory (no watch is opened: events are applied directly)."""

    def __init__(self, lists: dict[str, dict[str, Any]]) -> None:
        self.lists = lists
        self.discovery = json.loads((DRA_FIXTURES / f"apiresources.{VERSION}.json").read_text())

    def api_resources(self, group: str, version: str) -> dict[str, Any] | None:
        return self.discovery if version == VERSION else None  # None: not served

    def list(self, kind: Any) -> dict[str, Any]:
        return copy.deepcopy(self.lists.get(kind.name) or {"items": [], "metadata": {}})


def slice_case(nodes: int, events: int, burst: int = 0) -> dict[str, Any]:
    """Per kind: (CPU ms of each event, nodes whose health the last one changed); with
    ``burst``, also "burst": (CPU ms of the burst and its rebuild, rebuilds) and "wait":
    (the probe's wall ms per take of the cache during one rebuild)."""
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
    classes = json.loads((DRA_FIXTURES / f"deviceclasses.{VERSION}.json").read_text())
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


def slices(args: argparse.Namespace) -> Figures:
    """Per node count: taint and device events, and the burst (when ``--burst``)."""
    rows: list[tuple[Any, ...]] = []
    notes = []
    for n in args.nodes:
        cases = slice_case(n, args.events, args.burst)
        for case in ("taint", "device"):
            times, changed = cases[case]
            label = "a device taint" if case == "taint" else "a device left out / back"
            rows.append((n, label, statistics.median(times), p99(times), changed))
        if args.burst:
            cpu, rebuilds = cases["burst"]
            waits = cases["wait"]
            notes.append(
                f"{n} nodes: a burst of {args.burst} slices republished with a device left out "
                f"took {cpu:.1f} ms CPU and {rebuilds} rebuild(s); during one rebuild a probe "
                f"took the cache {len(waits)} times, longest {max(waits):.3f} ms, median "
                f"{statistics.median(waits):.3f} ms (wall)."
            )
    return Figures(
        "CPU ms of one ResourceSlice watch event (in process, KubeWatcher.apply_event)",
        ("nodes", "event", "median ms", "p99 ms", "nodes whose health the last event changed"),
        rows,
        {
            "nodes": "synthetic 8-GPU nodes, one recorded 8-GPU slice each, health tracker on",
            "events per kind": args.events,
            "slice API": VERSION,
        },  # fmt: skip
        tuple(notes),
    )


def add_arguments(ap: Any) -> None:
    """Both kinds' flags (the runner adds ``--runs``, default 3)."""
    ap.add_argument("--kind", choices=("verbs", "slices"), default="verbs")
    ap.add_argument("--nodes", type=int, nargs="+", default=None,
                    help="node counts (verbs: default 500; slices: default 500 5000)")  # fmt: skip
    ap.add_argument("--pods", type=int, default=200, help="verbs: pods per kind and run")
    ap.add_argument("--pods-of", nargs="+", choices=KINDS, metavar="KIND",
                    help=f"verbs: only these pod kinds ({', '.join(KINDS)})")  # fmt: skip
    ap.add_argument("--held", type=float, default=0.4, help="verbs: share of nodes holding 4 GPUs")
    ap.add_argument("--events", type=int, default=40, help="slices: events timed per kind")
    ap.add_argument("--burst", type=int, default=20,
                    help="slices: slices republished in the burst (0: none)")  # fmt: skip


def run(args: argparse.Namespace) -> Figures:
    """``--kind verbs`` (default) or ``slices``."""
    if args.kind == "slices":
        args.nodes = args.nodes or [500, 5000]
        return slices(args)
    args.nodes = args.nodes or [500]
    return verbs(args)
