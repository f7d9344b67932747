"""A scenario file as Kubernetes objects, for replaying it live through kube-scheduler.

The offline engine and a live replay read the same file: :func:`objects` materialises one
run of it (the sources, seeded generators included) and returns the Node objects to
create and the Pod objects in arrival order, each with its arrival time, its explicit
departure time (a trace's deletion time) and its work duration (the offline engine's run
time before the pod completes). A gang's members are consecutive, arrive together and
carry ``topoplace.io/gang`` / ``topoplace.io/gang-size`` (plus
``topoplace.io/topology-required`` / ``-preferred``); allowed GPU models become a required
node affinity on ``nvidia.com/gpu.product``; a fractional pod requests one GPU and carries
its share as ``topoplace.io/gpu-milli`` (kube-scheduler itself has no fractional GPUs).

Faults are not rendered: a live replay injects them through its own API (the offline
engine's :class:`benchmarks.engine.health.SignalHealth` shows what each one publishes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.clusters import make_pod
from benchmarks.engine.jobs import PRODUCT_LABEL, Job
from benchmarks.engine.scenario import Scenario, load
from benchmarks.engine.sources import Inputs, materialize
from scheduler.core.objects import TOPOLOGY_PREFERRED, TOPOLOGY_REQUIRED

GPU_MILLI_ANNOTATION = "topoplace.io/gpu-milli"


@dataclass(frozen=True, slots=True)
class TimedPod:
    """A Pod object to create at ``arrive``.

    Attributes:
        pod: the Pod (unbound; ``schedulerName`` as given to :func:`objects`).
        arrive: arrival time in seconds (or position, for scenarios without times).
        depart: explicit deletion time, if the scenario has one.
        duration: seconds the pod runs once bound, if the scenario says (None: forever).
        job: the job (gang) the pod belongs to.
    """

    pod: dict[str, Any]
    arrive: float
    depart: float | None
    duration: float | None
    job: str


@dataclass(frozen=True, slots=True)
class LiveScenario:
    """One run of a scenario file as objects (see the module docstring)."""

    name: str
    description: str
    nodes: list[dict[str, Any]]
    pods: list[TimedPod]


def pod_objects(job: Job, namespace: str, scheduler_name: str) -> list[dict[str, Any]]:
    """The Pod objects of ``job``'s members (``<name>`` or ``<name>-<i>`` for gangs)."""
    ann: dict[str, str] = {}
    if job.gang:
        if job.required:
            ann[TOPOLOGY_REQUIRED] = job.required
        if job.preferred:
            ann[TOPOLOGY_PREFERRED] = job.preferred
    if job.fractional:
        ann[GPU_MILLI_ANNOTATION] = str(job.gpu_milli)
    out = []
    for i in range(job.pods):
        pod = make_pod(
            f"{job.name}-{i}" if job.gang else job.name,
            job.gpus_per_pod,
            namespace=namespace,
            gang=job.name if job.gang else None,
            gang_size=job.pods if job.gang else None,
            annotations=ann,
            cpu=f"{job.cpu_milli}m",
            memory=f"{job.memory_mib}Mi",
            scheduler_name=scheduler_name,
            node_selector=dict(job.node_selector) or None,
        )
        if job.gpu_models:
            term = {"key": PRODUCT_LABEL, "operator": "In", "values": list(job.gpu_models)}
            pod["spec"]["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [term]}]
                    }
                }
            }
        out.append(pod)
    return out


def first_run(scenario: str | Path | Scenario, seed: int | None = None) -> Scenario:
    """The run :func:`objects` replays: the first run of ``scenario``'s sweep (a file or a
    loaded scenario), with ``seed`` if given.

    Raises:
        OSError / ScenarioError: unreadable or malformed file.
    """
    sc = scenario if isinstance(scenario, Scenario) else load(scenario)
    run = sc.runs()[0]
    return replace(run, seed=seed) if seed is not None else run


def from_inputs(
    run: Scenario,
    inputs: Inputs,
    *,
    namespace: str = "default",
    scheduler_name: str = "default-scheduler",
) -> LiveScenario:
    """``inputs`` (materialised from ``run``, possibly with fewer jobs) as objects: what
    :func:`objects` returns for the whole run."""
    pods = [
        TimedPod(p, job.arrive, job.depart, job.duration, job.name)
        for job in sorted(inputs.jobs, key=lambda j: j.arrive)
        for p in pod_objects(job, namespace, scheduler_name)
    ]
    return LiveScenario(run.name, run.description, inputs.nodes, pods)


def objects(
    scenario: str | Path | Scenario,
    *,
    seed: int | None = None,
    namespace: str = "default",
    scheduler_name: str = "default-scheduler",
) -> LiveScenario:
    """Node objects and timed Pod objects of one run of ``scenario`` (a file or a loaded
    scenario): the first run of its sweep, with ``seed`` if given.

    Raises:
        OSError / ScenarioError: unreadable or malformed file.
    """
    run = first_run(scenario, seed)
    return from_inputs(run, materialize(run), namespace=namespace, scheduler_name=scheduler_name)
