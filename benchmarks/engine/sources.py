"""Sources of a scenario: what its ``nodes``, ``arrivals`` and ``faults`` entries produce.

Every entry is a mapping with one source key (``objects``, ``fabric``, ``openb``, ``pods``,
``generator``...) and the source's parameters (``benchmarks/scenarios/README.md`` lists
them). :func:`materialize` turns one run (a scenario without a sweep) into :class:`Inputs`:
Node objects, jobs in arrival order, faults, and the run's seeded generator. Sources that
read files cache what they read per process (runs of a sweep share a worker).
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.clusters import dgx_h100_nodes, make_node, nvl72_racks
from benchmarks.engine.gorand import GoRand
from benchmarks.engine.health import GpuFault, Outage
from benchmarks.engine.jobs import PRODUCT_LABEL, Job, job_from_task
from benchmarks.engine.scenario import Scenario, ScenarioError
from scheduler.core.objects import node_gpus
from scheduler.core.params import SchedParams
from scheduler.core.quantity import cpu_milli, quantity_int
from scheduler.core.sharing import MILLI, SharingNode, SharingTask


@dataclass
class Inputs:
    """One run's materialised inputs.

    Attributes:
        nodes: Node objects (fresh; the run may keep them).
        jobs: jobs in arrival order (each with its arrival time).
        faults: outages then GPU faults, each group ordered by start.
        params: scheduler parameters (the ``params`` section, health from ``health``).
        rng: the run's seeded generator (a Go ``math/rand`` replay) for random policies and
            ties, positioned after whatever the arrival sources drew from it.
        tasks: the workload whose typical shapes define fragmentation (sharing runs): the
            trace's pod list when one was read, else the jobs.
        info: what sources report for the run's report (e.g. ``capacity_gpu_milli``).
    """

    nodes: list[dict[str, Any]]
    jobs: list[Job]
    faults: list[Outage | GpuFault]
    params: SchedParams
    rng: GoRand
    tasks: list[SharingTask]
    info: dict[str, Any] = field(default_factory=dict)


# ---- nodes ----------------------------------------------------------------------------------


def _labelled(
    nodes: list[dict[str, Any]], labels: Mapping[str, str] | None
) -> list[dict[str, Any]]:
    for n in nodes:
        n["metadata"]["labels"].update(labels or {})
    return nodes


def _fabric(
    count: int,
    gpus: int = 8,
    product: str = "h100",
    name: str = "node-{i:04d}",
    machine: str | None = None,
    nodes_per_leaf: int | None = None,
    leaves_per_spine: int | None = None,
    leaf: str = "leaf-{leaf:03d}",
    spine: str = "spine-{spine:02d}",
    cpu: str = "192",
    memory: str = "2Ti",
    labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``count`` identical nodes; with ``nodes_per_leaf`` Topograph leaf (and, with
    ``leaves_per_spine``, spine) labels, ``nodes_per_leaf`` consecutive nodes per leaf."""
    out = []
    for i in range(count):
        lf = sp = None
        if nodes_per_leaf:
            k = i // nodes_per_leaf
            lf = leaf.format(leaf=k)
            if leaves_per_spine:
                sp = spine.format(spine=k // leaves_per_spine)
        out.append(
            make_node(
                name.format(i=i),
                gpus,
                product,
                leaf=lf,
                spine=sp,
                zone=None,
                machine=machine,
                cpu=cpu,
                memory=memory,
                labels=labels,
            )
        )
    return out


@functools.lru_cache(maxsize=8)
def _openb_nodes(path: str | None, node_file: str | None) -> tuple[SharingNode, ...]:
    from benchmarks.engine import openb

    return tuple(openb.load_nodes(path, node_file or openb.NODE_FILE))


def openb_node_objects(
    path: str | None = None, node_file: str | None = None
) -> list[dict[str, Any]]:
    """The openb trace's node list as Node objects (name, CPU, memory, GPUs, GPU model)."""
    return [
        make_node(
            n.name,
            n.num_gpu,
            n.gpu_model,
            zone=None,
            cpu=f"{n.cpu_milli_capacity}m",
            memory=f"{n.memory_mib_capacity}Mi",
        )
        for n in _openb_nodes(path, node_file)
    ]


def _read_objects(path: str) -> list[dict[str, Any]]:
    text = Path(path).read_text()
    doc = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    items = doc.get("items", []) if isinstance(doc, Mapping) and "items" in doc else doc
    return [dict(x) for x in items if isinstance(x, Mapping) and x.get("kind", "Node") == "Node"]


def _node_source(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    e = dict(entry)
    labels = e.pop("labels", None)
    kind, args = _split(e, "nodes")
    if kind == "objects":
        nodes = [json.loads(json.dumps(x)) for x in args]
    elif kind == "file":
        nodes = _read_objects(args)
    elif kind == "fabric":
        nodes = _fabric(**args)
    elif kind == "nvl72":
        nodes = nvl72_racks(**args)
    elif kind == "dgx-h100":
        nodes = dgx_h100_nodes(**args)
    elif kind == "openb":
        nodes = openb_node_objects(args.get("path"), args.get("node_file"))
    else:
        raise ScenarioError(
            f"nodes: unknown source {kind!r}; known: objects, file, fabric, nvl72, dgx-h100, openb"
        )
    return _labelled(nodes, labels)


def node_objects(entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The Node objects of ``nodes`` entries, in order (fresh dicts)."""
    return [n for e in entries for n in _node_source(e)]


def _split(entry: Mapping[str, Any], section: str) -> tuple[str, Any]:
    """(source key, its value) of a one-key entry (``generator`` entries keep their keys)."""
    if "generator" in entry:
        return "generator", entry
    if len(entry) != 1:
        raise ScenarioError(
            f"{section}: each entry has exactly one source key, not {sorted(entry)}"
        )
    ((k, v),) = entry.items()
    return k, ({} if v is None else v)


def sharing_node(obj: Mapping[str, Any]) -> SharingNode:
    """A Node object as an idle GPU-sharing node (model = ``nvidia.com/gpu.product``)."""
    alloc = (obj.get("status") or {}).get("allocatable") or {}
    cap, _ = node_gpus(obj)
    return SharingNode.empty(
        name=obj["metadata"]["name"],
        gpu_model=(obj["metadata"].get("labels") or {}).get(PRODUCT_LABEL, ""),
        cpu_milli=cpu_milli(alloc.get("cpu"), 0),
        memory_mib=quantity_int(alloc.get("memory"), 0) >> 20,
        num_gpu=cap,
    )


# ---- arrivals -------------------------------------------------------------------------------

_JOB_KEYS = {
    "name", "at", "pods", "gpus", "gpu_milli", "gang", "cpu", "memory", "models", "selector",
    "required", "preferred", "duration", "depart",
}  # fmt: skip


def _job(d: Mapping[str, Any], name: str, at: float, gang: bool = False) -> Job:
    bad = set(d) - _JOB_KEYS - {"count"}
    if bad:
        raise ScenarioError(f"arrivals: unknown job keys {sorted(bad)}")
    pods = int(d.get("pods", 1))
    return Job(
        name=str(d.get("name", name)),
        arrive=float(d.get("at", at)),
        pods=pods,
        gpus_per_pod=int(d.get("gpus", 0)),
        gpu_milli=int(d.get("gpu_milli", MILLI)),
        gang=bool(d.get("gang", gang or pods > 1)),
        cpu_milli=cpu_milli(str(d.get("cpu", 0)), 0),
        memory_mib=quantity_int(str(d.get("memory", 0)), 0) >> 20,
        gpu_models=tuple(d.get("models") or ()),
        node_selector=dict(d.get("selector") or {}),
        required=str(d.get("required", "")),
        preferred=str(d.get("preferred", "")),
        duration=float(d["duration"]) if d.get("duration") is not None else None,
        depart=float(d["depart"]) if d.get("depart") is not None else None,
    )


def _repeated(args: Mapping[str, Any], gang: bool, start: int) -> list[Job]:
    count = int(args.get("count", 1))
    fmt = str(args.get("name", "gang-{i:04d}" if gang else "pod-{i:05d}"))
    every = args.get("every")
    base = float(args.get("at", start))
    spec = {k: v for k, v in args.items() if k not in ("name", "at", "every")}
    return [
        _job(spec, fmt.format(i=i), base + i * (float(every) if every is not None else 1.0), gang)
        for i in range(count)
    ]


@functools.lru_cache(maxsize=16)
def _openb_tasks(path: str | None, workload: str) -> tuple[SharingTask, ...]:
    from benchmarks.engine import openb

    return tuple(openb.load_tasks(workload, path))


def _openb_arrivals(
    args: Mapping[str, Any], run: Scenario, nodes: Sequence[Mapping[str, Any]], inp: Inputs
) -> list[Job]:
    """A trace's pod list: ``order: fgd-artifact`` (the FGD artifact's seeded shuffle, tuned
    to ``tune`` x GPU capacity; draws from the run's generator), ``creation`` (by creation
    time, with the trace's deletion times as departures when ``departures: true``) or
    ``file`` (file order); ``whole_gpu: true`` keeps whole-GPU pods only, ``fit: true`` stops
    before the requested GPUs would exceed the cluster's."""
    from benchmarks.engine import artifact, openb

    bad = set(args) - {"path", "workload", "order", "tune", "whole_gpu", "fit", "departures"}
    if bad:
        raise ScenarioError(f"arrivals.openb: unknown keys {sorted(bad)}")
    path = args.get("path")
    workload = run.workload or str(args.get("workload") or "default")
    tasks = list(_openb_tasks(path, workload))
    inp.tasks = tasks
    inp.info["workload"] = workload
    order = str(args.get("order", "file"))
    capacity = sum(node_gpus(n)[0] for n in nodes) * MILLI
    inp.info["capacity_gpu_milli"] = capacity
    if order == "fgd-artifact":
        plan = artifact.fgd_arrivals(tasks, run.seed, capacity, float(args.get("tune", 1.3)))
        inp.rng = plan.rng
        return [job_from_task(t, float(i)) for i, t in enumerate(plan.tasks)]
    if order not in ("file", "creation"):
        raise ScenarioError("arrivals.openb.order is fgd-artifact, creation or file")
    times = openb.load_task_times(workload, path) if order == "creation" else {}
    idx = sorted(range(len(tasks)), key=lambda i: (times.get(tasks[i].name, (0, 0))[0], i))
    biggest = max((node_gpus(n)[0] for n in nodes), default=0)
    out: list[Job] = []
    requested = 0
    for i in idx:
        t = tasks[i]
        if args.get("whole_gpu") and (t.num_gpu < 1 or t.gpu_milli != MILLI or t.num_gpu > biggest):
            continue
        if args.get("fit") and requested + t.total_gpu_milli > capacity:
            break
        requested += t.total_gpu_milli
        c, d = times.get(t.name, (None, None))
        at = float(c) if order == "creation" and c is not None else float(len(out))
        dep = float(d) if args.get("departures") and d is not None else None
        out.append(job_from_task(t, at, dep))
    return out


GENERATORS: dict[str, str] = {
    "helios-gangs": "benchmarks.engine.scenarios.gangs.workload:arrivals",
    "llama3-gangs": "benchmarks.engine.scenarios.faults.scenario:arrivals",
    "llama3": "benchmarks.engine.scenarios.faults.scenario:fault_source",
}
"""Generator name -> ``module:function`` of a scenario package, imported when a scenario
names it (the engine imports no scenario module itself). An arrivals generator is called
``f(params, run, nodes, inputs) -> list[Job]``, a fault generator ``f(params, run, nodes,
inputs) -> (outages, gpu_faults)``; either may record what its report needs in
``inputs.info``."""


def generator(name: str) -> Callable[..., Any]:
    """The generator function registered as ``name``.

    Raises:
        ScenarioError: no generator of that name.
    """
    target = GENERATORS.get(name)
    if target is None:
        raise ScenarioError(f"unknown generator {name!r}; known: {', '.join(sorted(GENERATORS))}")
    module, _, func = target.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), func)
    return fn


def _generated_arrivals(
    args: Mapping[str, Any], run: Scenario, nodes: Sequence[Mapping[str, Any]], inp: Inputs
) -> list[Job]:
    kind = str(args["generator"])
    if kind == "llama3":
        raise ScenarioError("arrivals: llama3 is a fault generator; arrivals use llama3-gangs")
    params = {k: v for k, v in args.items() if k != "generator"}
    jobs: list[Job] = generator(kind)(params, run, nodes, inp)
    return jobs


def _arrival_source(
    entry: Mapping[str, Any], run: Scenario, nodes: Sequence[Mapping[str, Any]], inp: Inputs
) -> list[Job]:
    kind, args = _split(entry, "arrivals")
    start = len(inp.jobs)
    if kind == "jobs":
        return [_job(d, f"job-{start + i:05d}", float(start + i)) for i, d in enumerate(args)]
    if kind in ("pods", "gangs"):
        return _repeated(args, kind == "gangs", start)
    if kind == "openb":
        return _openb_arrivals(args, run, nodes, inp)
    if kind == "generator":
        return _generated_arrivals(args, run, nodes, inp)
    raise ScenarioError(
        f"arrivals: unknown source {kind!r}; known: jobs, pods, gangs, openb, generator"
    )


# ---- faults ---------------------------------------------------------------------------------


def _fault_source(
    entry: Mapping[str, Any], run: Scenario, nodes: Sequence[Mapping[str, Any]], inp: Inputs
) -> tuple[list[Outage], list[GpuFault]]:
    kind, args = _split(entry, "faults")
    if kind == "outage":
        return [Outage(**args)], []
    if kind == "gpu":
        a = dict(args)
        a["xid_times"] = tuple(a.pop("xids", ()) or ())
        return [], [GpuFault(**a)]
    if kind == "generator" and args["generator"] == "llama3":
        params = {k: v for k, v in args.items() if k != "generator"}
        out: tuple[list[Outage], list[GpuFault]] = generator("llama3")(params, run, nodes, inp)
        return out
    raise ScenarioError(f"faults: unknown source {kind!r}; known: outage, gpu, generator: llama3")


# ---- a run ----------------------------------------------------------------------------------


def materialize(run: Scenario) -> Inputs:
    """Node objects, jobs, faults and the seeded generator of one run.

    Raises:
        ScenarioError: unknown sources or parameters.
    """
    if run.sweep:
        raise ValueError("materialize a run (Scenario.runs()), not a sweep")
    nodes = node_objects(run.nodes)
    params = SchedParams.from_config(dict(run.params) or None)
    inp = Inputs(nodes, [], [], params, GoRand(run.seed), [])
    for e in run.arrivals:
        inp.jobs.extend(_arrival_source(e, run, nodes, inp))
    outages: list[Outage] = []
    gpu_faults: list[GpuFault] = []
    for e in run.faults:
        o, g = _fault_source(e, run, nodes, inp)
        outages += o
        gpu_faults += g
    inp.faults = [*outages, *gpu_faults]
    if not inp.tasks:
        inp.tasks = [j.task() for j in inp.jobs]
    return inp
