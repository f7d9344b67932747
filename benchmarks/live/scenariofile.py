"""A scenario file (``benchmarks/scenarios/*.yaml``) replayed live, and the same file and seed
through the offline engine (``benchmarks/engine``) for the "simulated" column.

:func:`load_file` takes one run of the file (the first of its sweep, ``seed`` if given),
materialises it with the engine's own sources, optionally keeps only the first jobs
(``max_pods``: whole jobs in arrival order; ``until``: jobs arriving up to that scenario
time, which also becomes the run's horizon) and turns it into the live benchmark's
:class:`~benchmarks.live.scenario.Scenario` through :func:`benchmarks.engine.replay.from_inputs`:
the Node objects as the file makes them, the Pod objects in arrival order with their gang
annotations (``topoplace.io/gang``, ``gang-size``, ``topology-required`` / ``-preferred``),
arrival, departure and duration.

:func:`engine_offline` runs the offline engine on the same run, the same kept jobs and the
live run's scheduler parameters (:func:`benchmarks.engine.run.build` and
:meth:`benchmarks.engine.loop.Engine.run`, not a re-implementation) and records where each
pod was first placed. Two adjustments make it replay what the live arms get:

* a backlog release (``cold``, ``ungate``, ``create``) hands kube-scheduler every pod at
  once, in arrival order: the engine then gets every job at time 0, in the same order
  (durations and explicit departures unchanged); a ``timed`` release keeps the file's
  arrival times (scaled live by ``--time-scale``);
* live pods run their written duration: the engine runs with ``locality`` off (a
  ``pollux`` file stretches gang run times by their spread; nothing stretches them live).

Faults are replayed live by :mod:`benchmarks.live.faults` (this runner refuses a file with
faults).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.engine.jobs import Job, Run
from benchmarks.engine.loop import Engine, Hook
from benchmarks.engine.replay import TimedPod, first_run, from_inputs
from benchmarks.engine.scenario import Scenario as EngineScenario
from benchmarks.engine.scenario import ScenarioError
from benchmarks.engine.sources import Inputs, materialize
from benchmarks.live.offline import OfflineResult
from benchmarks.live.scenario import (
    GANG_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    GPU,
    PREFERRED_ANNOTATION,
    PRODUCT_LABEL,
    NodeSpec,
    PodSpec,
    Scenario,
)
from scheduler.core.params import SchedParams
from scheduler.core.quantity import cpu_milli, quantity_int

MIB = 1 << 20


@dataclass(frozen=True)
class FileReplay:
    """One run of a scenario file, as the live benchmark replays it.

    Attributes:
        scenario: nodes and pods (arrival order) for the live arms.
        run: the engine's run (seed set; ``horizon`` = ``until`` when capped by time).
        jobs: the jobs kept (arrival order), names as in the file.
        path: the file.
        cap: how the jobs were capped ("" if all were kept).
        timed: the file gives arrival times (not only an order).
    """

    scenario: Scenario
    run: EngineScenario
    jobs: tuple[Job, ...]
    path: str
    cap: str = ""
    timed: bool = False

    @property
    def params(self) -> Mapping[str, Any]:
        """The file's ``params`` (``policy.yaml`` sections)."""
        return self.run.params


def node_spec(obj: Mapping[str, Any]) -> NodeSpec:
    """A Node object as a :class:`NodeSpec` that creates it as it is."""
    alloc = (obj.get("status") or {}).get("allocatable") or {}
    meta = obj["metadata"]
    return NodeSpec(
        name=meta["name"],
        gpus=quantity_int(alloc.get(GPU), 0),
        cpu_milli=cpu_milli(alloc.get("cpu"), 0),
        memory_mib=quantity_int(alloc.get("memory"), 0) // MIB,
        pods=quantity_int(alloc.get("pods"), 110),
        labels=dict(meta.get("labels") or {}),
        template=obj,
    )


def _models(pod: Mapping[str, Any]) -> tuple[str, ...]:
    aff = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    req = aff.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    for term in req.get("nodeSelectorTerms") or []:
        for e in term.get("matchExpressions") or []:
            if e.get("key") == PRODUCT_LABEL and e.get("operator") == "In":
                return tuple(e.get("values") or ())
    return ()


def pod_spec(tp: TimedPod) -> PodSpec:
    """A :class:`benchmarks.engine.replay.TimedPod` as a :class:`PodSpec` that creates its
    Pod object (and keeps its arrival, departure, duration and job)."""
    pod = tp.pod
    meta = pod["metadata"]
    ann = meta.get("annotations") or {}
    req: dict[str, Any] = {}
    for c in pod["spec"].get("containers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            req[k] = v  # one container per pod here (replay.pod_objects)
    return PodSpec(
        name=meta["name"],
        gpus=quantity_int(req.get(GPU), 0),
        cpu_milli=cpu_milli(req.get("cpu"), 0),
        memory_mib=quantity_int(req.get("memory"), 0) // MIB,
        gang=ann.get(GANG_ANNOTATION, ""),
        gang_size=int(ann.get(GANG_SIZE_ANNOTATION, 0) or 0),
        preferred=ann.get(PREFERRED_ANNOTATION, ""),
        gpu_models=_models(pod),
        template=pod,
        arrive=tp.arrive,
        depart=tp.depart,
        duration=tp.duration,
        job=tp.job,
    )


def cap_jobs(
    jobs: Sequence[Job], max_pods: int | None = None, until: float | None = None
) -> list[Job]:
    """The first jobs in arrival order: whole jobs while their pods total at most
    ``max_pods``, arriving no later than ``until`` (scenario seconds)."""
    out: list[Job] = []
    pods = 0
    for j in sorted(jobs, key=lambda j: j.arrive):
        if until is not None and j.arrive > until:
            break
        if max_pods is not None and pods + j.pods > max_pods:
            break
        out.append(j)
        pods += j.pods
    return out


def _timed(jobs: Sequence[Job]) -> bool:
    """True unless every job arrives at its position in the list (an order, no times)."""
    return any(j.arrive != float(i) for i, j in enumerate(jobs))


def _inputs(run: EngineScenario, max_pods: int | None, until: float | None) -> Inputs:
    inputs = materialize(run)
    if inputs.faults:
        raise ScenarioError(
            f"{run.name}: a file with faults replays live with python -m benchmarks.live.faults "
            "(this runner takes files without a faults section)"
        )
    inputs.jobs = cap_jobs(inputs.jobs, max_pods, until)
    if not inputs.jobs:
        raise ScenarioError(f"{run.name}: no job left (max_pods {max_pods}, until {until})")
    return inputs


def load_file(
    path: str | Path,
    *,
    seed: int | None = None,
    max_pods: int | None = None,
    until: float | None = None,
    namespace: str = "livebench",
) -> FileReplay:
    """One run of the scenario file ``path`` as the live benchmark's scenario.

    Raises:
        OSError / ScenarioError: unreadable or malformed file, a file with faults, a cap
            that keeps no job.
    """
    run = first_run(path, seed)
    if until is not None:
        horizon = until if run.horizon is None else min(until, run.horizon)
        run = replace(run, horizon=horizon)
    inputs = _inputs(run, max_pods, until)
    live = from_inputs(run, inputs, namespace=namespace)
    jobs = tuple(inputs.jobs)
    n_all = len(materialize(run).jobs) if (max_pods is not None or until is not None) else 0
    cap = ""
    if n_all and n_all != len(jobs):
        what = []
        if max_pods is not None:
            what.append(f"at most {max_pods} pods")
        if until is not None:
            what.append(f"arrivals up to {until:g} s, horizon {run.horizon:g} s")
        cap = f"first {len(jobs)} of {n_all} jobs ({', '.join(what)})"
    pods = tuple(pod_spec(tp) for tp in live.pods)
    nodes = tuple(node_spec(n) for n in live.nodes)
    source = f"scenario file {path}, run 1 of its sweep, seed {run.seed}"
    if cap:
        source += f"; {cap}"
    gangs = len({p.gang for p in pods if p.gang})
    desc = (
        f"{live.description} [file {Path(path).name}, seed {run.seed}: {len(nodes)} nodes "
        f"({sum(n.gpus for n in nodes)} GPUs), {len(jobs)} jobs = {len(pods)} pods "
        f"({sum(p.gpus for p in pods)} GPUs), {gangs} gangs]"
    )
    sc = Scenario(live.name, desc, nodes, pods, source=source)
    return FileReplay(sc, run, jobs, str(path), cap, _timed(jobs))


# ---- the offline engine on the same run ---------------------------------------------------


class FirstPlacements(Hook):
    """Where and when each job was first placed, and which jobs were rejected."""

    def __init__(self) -> None:
        self.members: dict[str, tuple[float, tuple[Any, ...]]] = {}
        self.rejects: set[str] = set()

    def started(self, engine: Engine, run: Run) -> None:
        """Record the job's first placement (its members in member order)."""
        self.members.setdefault(run.job.name, (run.start, tuple(run.members)))

    def rejected(self, engine: Engine, run: Run) -> None:
        """Record a rejection (``reject`` queue)."""
        self.rejects.add(run.job.name)


@dataclass(slots=True)
class EngineResult:
    """The offline engine's replay: :class:`OfflineResult` and when each pod started."""

    offline: OfflineResult
    start: dict[str, float] = field(default_factory=dict)
    """Pod -> scenario time of its first placement."""
    run: EngineScenario | None = None


def pod_names(job: Job) -> list[str]:
    """The live pod names of ``job``'s members (:func:`benchmarks.engine.replay.pod_objects`)."""
    return [f"{job.name}-{i}" for i in range(job.pods)] if job.gang else [job.name]


def engine_offline(fr: FileReplay, params: SchedParams, *, backlog: bool) -> EngineResult:
    """The offline engine on ``fr``'s run and jobs with ``params`` (see the module docstring:
    ``backlog`` gives every job at time 0 in arrival order; locality off)."""
    t0 = time.perf_counter()
    from benchmarks.engine.run import build

    run = replace(fr.run, locality="")
    inputs = _inputs(run, None, None)
    keep = {j.name for j in fr.jobs}
    jobs = [j for j in inputs.jobs if j.name in keep]
    if [j.name for j in jobs] != [j.name for j in fr.jobs]:
        raise RuntimeError("the engine materialised other jobs than the live replay")
    if backlog:
        jobs = [replace(j, arrive=0.0) for j in jobs]
    inputs.jobs = jobs
    inputs.params = params
    hook = FirstPlacements()
    engine = build(run, inputs, [hook])
    engine.run(inputs.jobs, inputs.faults)
    res = OfflineResult(policy=run.gang_policy, source="engine")
    out = EngineResult(res, run=run)
    for j in jobs:
        names = pod_names(j)
        got = hook.members.get(j.name)
        if got is None:
            why = "rejected" if j.name in hook.rejects else "not placed by the end of the run"
            for n in names:
                res.refused[n] = why
            if j.gang:
                res.gangs[j.name] = why
            continue
        start, members = got
        for n, a in zip(names, members, strict=True):
            res.placements[n] = (a.node, tuple(a.gpus))
            out.start[n] = start
        if j.gang:
            res.gangs[j.name] = "placed"
    res.seconds = time.perf_counter() - t0
    res.engine = (
        f"benchmarks.engine on {Path(fr.path).name}, seed {run.seed}: pods `{run.pod_policy}`, "
        f"gangs `{run.gang_policy}`, queue `{run.queue}`, serve `{run.serve}`"
        + (f", horizon {run.horizon:g} s" if run.horizon is not None else "")
        + (
            "; every job at time 0 in arrival order (backlog, as the live release)"
            if backlog
            else "; the file's arrival times"
        )
        + ("; locality off (live pods run their written duration)" if fr.run.locality else "")
        + (f"; {engine.checks} ledger checks" if run.check else "")
    )
    return out


def merged_policy(base: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (a ``policy.yaml`` mapping) with the file's ``params`` sections over it: a
    section that is a mapping in both is merged key by key, anything else replaced."""
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in base.items()}
    for k, v in params.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out
