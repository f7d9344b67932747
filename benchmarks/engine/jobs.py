"""What arrives at the simulated cluster: one job = one pod or one gang of identical members.

A :class:`Job` is the scenario-level description (what the workload asks for, when it
arrives, how long it runs); a :class:`Run` is the engine's mutable record of one job inside
one simulation (queued, running, interrupted, done). Scenarios build jobs; only the engine
changes runs, and hooks read them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.core.schedule import Assignment
from scheduler.core.sharing import MILLI, SharingTask

MIB = 1 << 20
"""Bytes per MiB (job memory is in MiB, snapshots count bytes)."""
PRODUCT_LABEL = "nvidia.com/gpu.product"
"""The node label that names its GPU model (GFD)."""


@dataclass(frozen=True, slots=True)
class Job:
    """One pod, or a gang of ``pods`` identical members placed all or nothing.

    Attributes:
        name: unique within the scenario.
        arrive: arrival time (seconds, or the position in an ordered arrival list).
        pods: members (1 for a single pod).
        gpus_per_pod: GPUs per member (0 for a CPU-only pod).
        gpu_milli: share of each GPU in milli-GPU: 1000 = whole GPUs; below 1000 (with one
            GPU per pod) a fractional, GPU-sharing pod; 0 with ``gpus_per_pod`` 0.
        gang: placed all or nothing as one group (every member of a gang, even a one-pod
            gang, carries the gang key).
        cpu_milli / memory_mib: requests per member.
        gpu_models: allowed GPU products (empty: any).
        node_selector: labels every member's node must carry.
        required / preferred: fabric level the gang must / should fit in one domain of.
        duration: work in seconds when placed compactly; None runs until it leaves.
        depart: time the job leaves whatever its state (a trace's deletion time); None: it
            leaves when its work is done.
    """

    name: str
    arrive: float
    pods: int = 1
    gpus_per_pod: int = 0
    gpu_milli: int = MILLI
    gang: bool = False
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required: str = ""
    preferred: str = ""
    duration: float | None = None
    depart: float | None = None

    @property
    def gpus(self) -> int:
        """GPUs of the whole job (members x GPUs per member)."""
        return self.pods * self.gpus_per_pod

    @property
    def needs_gpu(self) -> bool:
        """True if the job occupies GPU capacity."""
        return self.gpus_per_pod > 0 and self.gpu_milli > 0

    @property
    def gpu_milli_total(self) -> int:
        """Milli-GPU the job occupies (0 for CPU-only jobs)."""
        return self.gpus * self.gpu_milli if self.needs_gpu else 0

    @property
    def fractional(self) -> bool:
        """True for a GPU-sharing pod (one GPU, less than all of it)."""
        return self.gpus_per_pod == 1 and 0 < self.gpu_milli < MILLI

    @property
    def constraint(self) -> str:
        """``required``, ``preferred`` or ``none``."""
        return "required" if self.required else ("preferred" if self.preferred else "none")

    def selector(self) -> dict[str, str]:
        """Labels every member's node must carry: ``node_selector``, and the GPU product when
        one model is allowed (placement on snapshots matches exact labels).

        Raises:
            ValueError: several allowed models (only the sharing policies take a list).
        """
        if len(self.gpu_models) > 1:
            raise ValueError(
                f"{self.name}: several allowed GPU models need a sharing policy; place-pod and "
                "the gang policies take one model (or a selector)"
            )
        if self.gpu_models:
            return {**self.node_selector, PRODUCT_LABEL: self.gpu_models[0]}
        return dict(self.node_selector)

    def task(self) -> SharingTask:
        """The job as a GPU-sharing task (one member; the FGD policies' vocabulary)."""
        return SharingTask(
            name=self.name,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            num_gpu=self.gpus_per_pod,
            gpu_milli=self.gpu_milli if self.gpus_per_pod else 0,
            gpu_spec=self.gpu_models,
        )


def job_from_task(task: SharingTask, arrive: float, depart: float | None = None) -> Job:
    """A trace task (FGD vocabulary) as a job; ``task`` round-trips through :meth:`Job.task`."""
    return Job(
        name=task.name,
        arrive=arrive,
        gpus_per_pod=task.num_gpu,
        gpu_milli=task.gpu_milli,
        cpu_milli=task.cpu_milli,
        memory_mib=task.memory_mib,
        gpu_models=task.gpu_spec,
        depart=depart,
    )


@dataclass(slots=True, eq=False)
class Run:
    """The engine's state of one job in one simulation (hooks read it, never write it).

    Attributes:
        job: the job.
        seq: arrival order (ties of the queue order).
        key: gang key / pod key prefix ``<namespace>/<name>``.
        members: what the job holds while running (one assignment per member).
        running: holds resources now.
        queued: waiting in the queue.
        start: time of the current (or last) placement.
        finish: when the current placement's work completes (``inf``: never).
        overhead: restart cost charged at the start of the current placement (s).
        saved: work checkpointed so far (s).
        doomed: the current placement will end in a crash or requeue (no further faults hit).
        restarted: placed at least once before and interrupted (queued ahead of new jobs).
        epoch: increases whenever the current placement ends; events carry the epoch they
            were scheduled in, so events of a past placement are ignored.
        slowdown: stretch of the work by the placement's locality (1 = compact).
        locality: what the stretch model reported about the placement (scenario-specific).
        broken: ground truth at placement: one ``(kind, signalled)`` per member on broken
            hardware (``kind`` "node" or "gpu").
        details: the placer's details of the current placement.
    """

    job: Job
    seq: int
    key: str
    members: tuple[Assignment, ...] = ()
    running: bool = False
    queued: bool = False
    start: float = 0.0
    finish: float = math.inf
    overhead: float = 0.0
    saved: float = 0.0
    doomed: bool = False
    restarted: bool = False
    epoch: int = 0
    slowdown: float = 1.0
    locality: object = None
    broken: tuple[tuple[str, bool], ...] = ()
    details: Mapping[str, object] = field(default_factory=dict)
