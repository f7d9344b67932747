"""The one event loop of the offline benchmarks.

A run replays jobs (arrivals, departures) and faults on a cluster ledger, places jobs with a
pluggable placement step and reports through hooks. Everything scenario-specific (what is
measured, how a placement stretches a job, how faults become signals) is a strategy or a
hook; the loop owns only time, the queue and each job's lifecycle.

Events and their order. An event is ``(time, rank, seq)``-ordered: at equal times faults
come first (rank 0), then health signals (1: a node's published state changes, periodic
re-assessment), then job events (2: work finished, explicit departure, re-queue after an
interruption, crash of a job placed on broken hardware), then arrivals (3); ``seq`` is the
order events were scheduled in. Events later than ``horizon`` are never scheduled.

Serving the queue. After every event (``serve="event"``) or after all events of one
instant (``serve="instant"``), the queue is served once, in order: jobs that were
interrupted first, then by arrival. Disciplines:

* ``reject``: every waiting job is tried once; a job that cannot be placed is rejected
  (counted, never retried): kube-scheduler without retries, and the FGD artifact.
* ``strict-fifo``: only the head may start; a head that cannot be placed blocks everyone
  behind it (Kueue ``StrictFIFO``).
* ``best-effort-fifo``: every waiting job is tried in order and any that fits starts; no
  reservation for the head (Kueue ``BestEffortFIFO``).

An attempt is skipped, as a refusal, when it cannot change the answer: when the ledger's
necessary condition fails (:meth:`Ledger.may_fit`) and when the same job was refused at the
very same ledger generation (placements are deterministic functions of the ledger).

Lifecycle. A placed job runs ``overhead + (work left) x slowdown`` seconds (``slowdown``
from the ``stretch`` strategy; 1 without one), or until its explicit departure, or forever.
A fault on hardware a running job uses interrupts it: the work since its last checkpoint is
lost, it keeps its GPUs until the job controller notices (``requeue_delay``) and is then
queued again ahead of new arrivals, paying ``restart_overhead`` on its next start. A job
placed on hardware that is broken at that instant crashes ``crash_after`` later and is
queued again. With remediation (``Recovery.evict_after``, topoplace's policy
``remediation``), a job whose hardware failure has been *published* for ``evict_after``
seconds is evicted then, if that is sooner: torn down and queued again (the health model's
``evicted_at`` says when).

Hooks see every step (:class:`Hook`) and read the engine and the runs; they never change
them. With ``check`` the ledger's invariants are verified after every serve.
"""

from __future__ import annotations

import heapq
import math
from bisect import insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from benchmarks.engine.jobs import Job, Run
from scheduler.core.schedule import PlacementResult

FAULT, ASSESS, TICK, FINISH, LEAVE, REQUEUE, CRASH, ARRIVE, EVICT = (
    "fault", "assess", "tick", "finish", "leave", "requeue", "crash", "arrive", "evict"
)  # fmt: skip
RANK = {
    FAULT: 0, ASSESS: 1, TICK: 1, FINISH: 2, LEAVE: 2, REQUEUE: 2, CRASH: 2, EVICT: 2, ARRIVE: 3
}  # fmt: skip
"""Order of event kinds at equal times (lower first)."""

Queueing = Literal["reject", "strict-fifo", "best-effort-fifo"]
QUEUEING: tuple[str, ...] = ("reject", "strict-fifo", "best-effort-fifo")


@dataclass(frozen=True, slots=True)
class Recovery:
    """What a fault costs a job (seconds).

    Attributes:
        requeue_delay: from a fault to the job being torn down and queued again (it holds
            its GPUs meanwhile).
        crash_after: a job placed on broken hardware crashes this long after its start.
        checkpoint_every: work is saved at multiples of this (productive time only).
        restart_overhead: charged at the start of every placement after the first.
        evict_after: topoplace's remediation (policy ``remediation.after_seconds`` with
            ``mode: evict``): a job on hardware whose failure has been published this long
            is evicted then, when that comes before ``requeue_delay`` / ``crash_after``;
            None: no remediation (the job controller's delays only).
    """

    requeue_delay: float = 300.0
    crash_after: float = 300.0
    checkpoint_every: float = 3600.0
    restart_overhead: float = 600.0
    evict_after: float | None = None


class Ledger(Protocol):
    """The cluster state a run places jobs on (owned by the engine)."""

    @property
    def generation(self) -> int:
        """Changes with every change of the cluster state."""
        ...

    def may_fit(self, job: Job) -> bool:
        """A necessary condition for any placement of ``job`` now."""
        ...

    def hold(self, run: Run) -> None:
        """Make ``run.members`` hold their resources."""
        ...

    def release(self, run: Run) -> None:
        """Free what ``run.members`` hold."""
        ...

    def check(self, runs: Iterable[Run]) -> None:
        """Raise ``InvariantError`` unless the state holds exactly what running ``runs`` hold."""
        ...

    def gpu_usage(self) -> tuple[Any, Any]:
        """Per node: milli-GPU in use, and GPUs (numpy arrays)."""
        ...


class Placement(Protocol):
    """The placement step: one job on the current ledger (pure; all or nothing)."""

    def place(self, ledger: Any, run: Run) -> PlacementResult:
        """Where ``run.job``'s members go (``run.key`` names them), or why not."""
        ...


class HealthModel(Protocol):
    """Turns faults into the signals placement sees, and knows the ground truth."""

    def initial(self, ledger: Any) -> None:
        """Assess every node at time 0."""
        ...

    def schedule(self, push: Callable[[float, str, Any], None], horizon: float) -> None:
        """Schedule the instants at which published signals change (``ASSESS``/``TICK``)."""
        ...

    def assess(self, ledger: Any, node: str, t: float) -> None:
        """Re-assess ``node`` from what is published at ``t``."""
        ...

    def tick(self, ledger: Any, t: float) -> None:
        """Periodic re-assessment (history decays)."""
        ...

    def broken(self, run: Run, t: float) -> tuple[tuple[str, bool], ...]:
        """Per member on broken hardware at ``t``: ``(kind, signalled)``."""
        ...


Stretch = Callable[[Any, Run], tuple[float, object]]
"""``(ledger, run) -> (slowdown, what the model saw)`` for a placement just held."""


class Hook:
    """Observer of a run (metrics, logs). Every method is a no-op here; override some."""

    def arrived(self, engine: Engine, run: Run) -> None:
        """``run`` joined the queue (first arrival only)."""

    def advance(self, engine: Engine, before: float, now: float) -> None:
        """Time moves from ``before`` to ``now`` (called before the events at ``now``)."""

    def attempted(self, engine: Engine, run: Run, result: PlacementResult) -> None:
        """The placement step answered for ``run``."""

    def started(self, engine: Engine, run: Run) -> None:
        """``run`` was placed and holds its members."""

    def rejected(self, engine: Engine, run: Run) -> None:
        """``run`` could not be placed and leaves (``reject`` discipline)."""

    def interrupted(self, engine: Engine, run: Run, elapsed: float, kept: float) -> None:
        """A fault hit ``run`` after ``elapsed`` s of its placement; ``kept`` s were saved."""

    def released(self, engine: Engine, run: Run, why: str) -> None:
        """``run`` frees its members: ``finish``, ``leave``, ``requeue``, ``crash`` or ``end``."""

    def settled(self, engine: Engine, t: float) -> None:
        """The queue was served after the event(s) at ``t``."""

    def finished(self, engine: Engine) -> None:
        """No events are left (running jobs were released at a finite horizon)."""


class InvariantError(AssertionError):
    """The simulated cluster broke all-or-nothing or no-double-booking."""


class Engine:
    """One simulation run (see the module docstring). Use once: ``Engine(...).run(jobs)``.

    Attributes:
        ledger / placement / health / recovery / stretch: the strategies.
        runs: job name -> its run, in arrival order.
        queue: waiting runs in service order.
        now: the current time.
        checks: invariant checks performed.
    """

    def __init__(
        self,
        ledger: Ledger,
        placement: Placement,
        *,
        queue: Queueing = "reject",
        serve: Literal["event", "instant"] = "event",
        hooks: Sequence[Hook] = (),
        health: HealthModel | None = None,
        recovery: Recovery = Recovery(),
        stretch: Stretch | None = None,
        horizon: float = math.inf,
        check: bool = False,
        namespace: str = "sim",
    ) -> None:
        if queue not in QUEUEING:
            raise ValueError(f"unknown queueing {queue!r}; known: {', '.join(QUEUEING)}")
        if serve not in ("event", "instant"):
            raise ValueError("serve is 'event' or 'instant'")
        self.ledger = ledger
        self.placement = placement
        self.discipline = queue
        self.per_instant = serve == "instant"
        self.hooks = tuple(hooks)
        self.health = health
        self.recovery = recovery
        self.stretch = stretch
        self.horizon = horizon
        self.check = check
        self.namespace = namespace
        self.runs: dict[str, Run] = {}
        self.queue: list[Run] = []
        self.now = 0.0
        self.checks = 0
        self._events: list[tuple[float, int, int, str, Any]] = []
        self._seq = 0
        self._refused: dict[str, int] = {}

    # ---- events ---------------------------------------------------------------------------

    def push(self, t: float, kind: str, payload: Any) -> None:
        """Schedule an event (dropped beyond the horizon)."""
        if t <= self.horizon:
            heapq.heappush(self._events, (t, RANK[kind], self._seq, kind, payload))
            self._seq += 1

    def run(self, jobs: Sequence[Job], faults: Sequence[Any] = ()) -> None:
        """Replay ``jobs`` and ``faults`` (objects with ``node``, ``start``, ``end`` and, for
        one GPU, ``gpu``; a fault that ends when it starts only carries a warning for the
        health model) until no event is left."""
        if faults and self.health is None:
            raise ValueError("faults need a health model")
        for f in faults:
            if f.end > f.start:
                self.push(f.start, FAULT, f)
        if self.health is not None:
            self.health.initial(self.ledger)
            self.health.schedule(self.push, self.horizon)
        for j in jobs:
            self.push(j.arrive, ARRIVE, j)
        for j in jobs:
            if j.depart is not None:
                self.push(j.depart, LEAVE, j.name)
        events = self._events
        while events:
            t = events[0][0]
            for h in self.hooks:
                h.advance(self, self.now, t)
            self.now = t
            self._handle(heapq.heappop(events))
            while self.per_instant and events and events[0][0] == t:
                self._handle(heapq.heappop(events))
            self._serve(t)
            if self.check:
                self.ledger.check(self.runs.values())
                self.checks += 1
            for h in self.hooks:
                h.settled(self, t)
        if math.isfinite(self.horizon):
            for h in self.hooks:
                h.advance(self, self.now, self.horizon)
            self.now = self.horizon
            for r in self.runs.values():
                if r.running:
                    self._release(r, self.horizon, "end")
        for h in self.hooks:
            h.finished(self)

    def _handle(self, event: tuple[float, int, int, str, Any]) -> None:
        t, _, _, kind, payload = event
        if kind == ARRIVE:
            if payload.name in self.runs:
                raise ValueError(f"two jobs are called {payload.name!r}")
            r = Run(payload, len(self.runs), f"{self.namespace}/{payload.name}")
            self.runs[payload.name] = r
            self._enqueue(r)
            for h in self.hooks:
                h.arrived(self, r)
        elif kind == LEAVE:
            r = self.runs.get(payload)
            if r is None:  # leaves before it arrives (the FGD artifact ignores it too)
                return
            if r.running:
                self._release(r, t, "leave")
                r.epoch += 1
            elif r.queued:
                self.queue.remove(r)
                r.queued = False
        elif kind == FAULT:
            gpus = getattr(payload, "gpu", None)
            for r in [r for r in self.runs.values() if r.running and not r.doomed]:
                if any(
                    a.node == payload.node and (gpus is None or gpus in a.gpus) for a in r.members
                ):
                    self._interrupt(r, t)
            assert self.health is not None
            self.health.assess(self.ledger, payload.node, t)
        elif kind == ASSESS:
            assert self.health is not None
            self.health.assess(self.ledger, payload, t)
        elif kind == TICK:
            assert self.health is not None
            self.health.tick(self.ledger, t)
        else:
            r, epoch = payload
            if r.epoch != epoch or not r.running:
                return
            if kind == FINISH:
                self._release(r, t, "finish")
                r.epoch += 1
            elif kind in (REQUEUE, EVICT):
                self._release(r, t, "requeue" if kind == REQUEUE else "evicted")
                self._enqueue(r)
            else:  # CRASH
                self._release(r, t, "crash")
                r.restarted = True
                r.epoch += 1
                self._enqueue(r)

    # ---- lifecycle ------------------------------------------------------------------------

    def _enqueue(self, r: Run) -> None:
        r.queued = True
        insort(self.queue, r, key=lambda x: (not x.restarted, x.job.arrive, x.seq))

    def _serve(self, t: float) -> None:
        if not self.queue:
            return
        for r in list(self.queue):
            if self._attempt(r, t):
                continue
            if self.discipline == "strict-fifo":
                return
            if self.discipline == "reject":
                self.queue.remove(r)
                r.queued = False
                for h in self.hooks:
                    h.rejected(self, r)

    def _attempt(self, r: Run, t: float) -> bool:
        gen = self.ledger.generation
        if self._refused.get(r.job.name) == gen or not self.ledger.may_fit(r.job):
            return False
        res = self.placement.place(self.ledger, r)
        for h in self.hooks:
            h.attempted(self, r, res)
        if not res.ok:
            self._refused[r.job.name] = gen
            return False
        if len(res.assignments) != r.job.pods:
            raise InvariantError(
                f"{r.key}: placement returned {len(res.assignments)} of {r.job.pods} members"
            )
        self._start(r, t, res.assignments, res.details)
        return True

    def _start(
        self, r: Run, t: float, members: Sequence[Any], details: Mapping[str, object]
    ) -> None:
        """``r`` holds ``members`` from ``t`` on: its run time, or its crash when placed
        on broken hardware (the bookkeeping of every placement, whoever made it)."""
        if r.queued:
            self.queue.remove(r)
        r.queued = False
        r.members = tuple(members)
        r.details = details
        self.ledger.hold(r)
        r.running = True
        r.start = t
        r.overhead = self.recovery.restart_overhead if r.restarted else 0.0
        if self.stretch is not None:
            r.slowdown, r.locality = self.stretch(self.ledger, r)
        r.broken = self.health.broken(r, t) if self.health is not None else ()
        r.finish = math.inf
        if r.broken:
            r.doomed = True
            crash = t + self.recovery.crash_after
            evicted = self._evict_time(r, t)
            self.push(crash if evicted is None else min(crash, evicted), CRASH, (r, r.epoch))
        else:
            r.doomed = False
            if r.job.duration is not None:
                r.finish = t + r.overhead + (r.job.duration - r.saved) * r.slowdown
                self.push(r.finish, FINISH, (r, r.epoch))
        for h in self.hooks:
            h.started(self, r)

    def _interrupt(self, r: Run, t: float) -> None:
        rec = self.recovery
        elapsed = t - r.start
        productive = max(0.0, elapsed - r.overhead)
        kept = math.floor(productive / rec.checkpoint_every) * rec.checkpoint_every
        work = r.job.duration if r.job.duration is not None else math.inf
        r.saved = min(r.saved + kept, work)
        for h in self.hooks:
            h.interrupted(self, r, elapsed, kept)
        r.doomed = True
        r.restarted = True
        r.epoch += 1
        evicted = self._evict_time(r, t)
        if evicted is not None and evicted < t + rec.requeue_delay:
            self.push(evicted, EVICT, (r, r.epoch))
        else:
            self.push(t + rec.requeue_delay, REQUEUE, (r, r.epoch))

    def _evict_time(self, r: Run, t: float) -> float | None:
        """When remediation evicts ``r`` (at ``t`` or later), or None (no remediation, or
        its hardware's failure is not published long enough). A health model that can tell
        has ``evicted_at(run, t, after) -> float | None``
        (:meth:`benchmarks.engine.health.SignalHealth.evicted_at`)."""
        after = self.recovery.evict_after
        evicted_at = getattr(self.health, "evicted_at", None)
        if after is None or evicted_at is None:
            return None
        return evicted_at(r, t, after)

    def _release(self, r: Run, t: float, why: str) -> None:
        self.ledger.release(r)
        for h in self.hooks:
            h.released(self, r, why)
        r.members = ()
        r.running = False
