"""topoplace allocates the ResourceClaims of pods gated with ``topoplace.io/allocate``.

kube-scheduler's DRA allocator takes the first devices that fit; it knows nothing of
NVLink. A pod template that adds the scheduling gate ``topoplace.io/allocate`` hands the
choice to topoplace instead. kube-scheduler ignores a gated pod; :class:`GateAllocator`:

1. picks the node and the NVLink-best free healthy devices for the pod's unallocated
   claims (``scheduler.core.dra.pick_for_pod``; a gang, declared by
   ``topoplace.io/gang`` + ``topoplace.io/gang-size``, is planned whole with the gang
   solver over the DRA nodes, all or nothing);
2. holds them in the ledger at once (assumed holdings, under the cache lock, so topoplace
   never hands a device twice), then writes each claim: the delete-protection finalizer
   and the ``topoplace.io/allocated-by`` annotation, then ``status.allocation`` with the
   node's ``nodeSelector`` and ``allocationTimestamp`` (a client may pre-allocate;
   kube-scheduler then only filters to that node and reserves; from 1.36 it would add a
   missing timestamp in its reservation, which the API server refuses: the allocation is
   immutable);
3. checks it once the watch shows the writes (no wait, no list; see "The check" below): if
   another claim holds one of its devices (kube-scheduler allocating at the same moment
   from a view that did not have topoplace's write yet), it waits for that pod's bind
   check when the pod is not bound yet, else topoplace's allocation yields: it is removed
   again (the pod is still gated, nothing uses it) and the pod is retried with the other
   claim's devices known;
4. removes the gate; kube-scheduler schedules the pod onto the pinned node and calls
   topoplace's bind.

**The race with kube-scheduler.** Nothing in the API stops two claims naming one device,
and kube-scheduler counts allocated devices in a set fed by its claim informer: when one of
two claims naming a device gives it back, the set drops the device though the other claim
still holds it, and kube-scheduler may hand it out again. So both sides must avoid it:
topoplace (a) never picks a device an allocated claim or its own in-flight allocation holds
(the ledger), (b) avoids the devices kube-scheduler's first fit would take for claim pods it
filtered in the last seconds (``DraRouter.likely_kube_picks``, when kube-scheduler calls
topoplace for claim pods: the DRA deploy variant), (c) in filter, predicts the first fit
without its own allocations of the last ``RECENT_S`` seconds (kube-scheduler's view may not
have them yet) and refuses nodes where it would take one (``REASON_CLAIM_IN_FLIGHT``), (d)
verifies after writing (step 3), and (e) checks at bind the claims kube-scheduler allocated
for the pod against its own devices (:meth:`GateAllocator.check_bind`). Of two allocations
naming a device, the one written second is checked after the first exists (topoplace holds
a device before writing it; kube-scheduler's PreBind comes before topoplace's bind), so one
of (d) and (e) sees every conflict. A conflict with a pod not bound yet is left to that
pod's bind check (which gives kube-scheduler's allocation back and fails the bind); the
survivor is then written again (:meth:`GateAllocator._rewrite`), so kube-scheduler counts
its devices again. Where the survivor is in use and cannot be written again, topoplace
keeps claim pods off those devices until it is gone (``DraRouter.note_uncounted``).

**Shared devices.** A device with ``allowMultipleAllocations`` (consumable capacity) may be
named by several claims; the conflict there is the sum of their ``consumedCapacity``
exceeding a capacity of the device (``dra.conflicts`` with the inventory). Step 3 and the
bind check treat it as they treat a device named twice: topoplace's share yields when
the claims over capacity with it are not all kube-scheduler's for pods still to bind
(else it waits for their bind check), and the bind check gives back kube-scheduler's
share where the sum with topoplace's shares (allocated, or held while being written) is
over. Nothing is written again after such a conflict: kube-scheduler counts shares one
by one, so giving one back leaves the others counted.

**The check costs nothing, and needs no settle.** A watch delivers a resource's events in
``resourceVersion`` order. Once the cache shows topoplace's own write of a claim (at the
version the write returned, or later), it has every claim written before that write: it
is then the consistent read step 3 needs, so the check reads the cache (a few ms after
the write) instead of listing every claim from the API. Only when the watch has not shown
the writes within :data:`CATCH_UP_S`, or nothing was written (a restart, a retry), is a
consistent list read. And no settle is needed before the gate goes (:data:`SETTLE_S` is
0): a claim kube-scheduler writes *before* topoplace's write is in that view, so step 3
sees it; one it writes *after* is checked at its pod's bind (e), which finds topoplace's
devices, because topoplace holds them in the ledger before writing and that holding is
dropped early only by an allocation the watch shows before topoplace's own, that is, one
step 3 sees. Waiting longer before the check adds nothing to either case: every
interleaving is closed by (d) or (e), whatever the wait (the live race test runs with
both the filter window on and off). A settle would only help where kube-scheduler binds
claim pods without topoplace (no DRA variant, so no (e)): a write landing within the
settle would still be seen; ``TOPOPLACE_DRA_SETTLE_S`` sets one there, per allocation.

**Liveness: the gate waits while kube-scheduler allocates on the node.** A conflict is
repaired by writing the survivor again (above), which only a claim no pod has reserved
allows: once the gate goes, kube-scheduler reserves topoplace's claim at once, and a
conflict found later leaves kube-scheduler's count short of the device for as long as the
claim lives (its pods are then kept off it: safe, but a pod pinned to that node may wait
that long). Such a conflict comes from a kube-scheduler pod in flight on that node
(filtered from a view without topoplace's write, its PreBind not yet written). So a
checked allocation keeps its gate while kube-scheduler may be allocating claims there
(:meth:`GateAllocator._kube_busy`: claim pods topoplace's filter let through on the node,
or pending claim pods without the gate that may go there, whose claims are not allocated
yet), up to :data:`HOLD_MAX_S`, and is checked again once they are: a conflict is then
seen with the claim still free to write again. With no kube-scheduler allocation in flight
there (every pod gated, or the node quiet) nothing is held.

**Timing.** Nothing waits on a poll or on another pod. The watch wakes the allocator
(:meth:`GateAllocator.notify`: a gated pod added or changed, a claim added, given back or
deleted, a write of its own shown), with a slow poll (:data:`POLL_S`) as a safety net.
Each allocation is a flight of its own: held in the ledger by the allocator's thread,
written by one of a few writer threads (:data:`WRITERS`; one pod's writes stay in order:
finalizer and mark, allocation, then the gate), settled on its own timer and checked as
soon as its writes show, while the next pods are planned and written. The node search
reads only the nodes that can still hold the best choice (:meth:`GateAllocator._pick`: a
branch and bound on ring bandwidth and packing), a few ms at 500 nodes, so the cache lock
it holds is short.

**Restart.** Nothing is kept in memory that the API does not hold: allocated claims come
back through the watch as ledger holdings, a gated pod whose claims are all allocated is
verified and released, a claim topoplace allocated for a pod whose other claims are not
is completed on the same node, and a gang's members whose claims are allocated are fixed
in its re-plan.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler.core import dra
from scheduler.core.gang import DRA_CHOICE_ANNOTATION, GangSizeError, gang_request, plan_gangs
from scheduler.core.model import Health, NodeInfo, PodInfo
from scheduler.core.objects import ObjectError, object_key, request_from_pod
from scheduler.core.schedule import Assignment, place_pod, selector_matches
from scheduler.core.snapshot import (
    ClusterSnapshot,
    DoubleBookingError,
    build_snapshot,
    claim_holding_info,
    gpus_by_dra,
    with_pod,
)
from scheduler.kube.client import ApiError, ApiUnavailable
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.dra import DraRouter, ExtendedPick, all_claims, clique_reader
from topology.select import best_bottlenecks

log = logging.getLogger(__name__)

SETTLE_S = 0.0
"""Seconds between writing an allocation and checking it (none: the check and the bind
check close the race without it, see the module docstring)."""
ENV_SETTLE_S = "TOPOPLACE_DRA_SETTLE_S"
"""Environment variable overriding :data:`SETTLE_S` (0 to 60; each allocation waits its
own, never another's)."""


ENV_RECENT_S = "TOPOPLACE_DRA_RECENT_S"
"""Environment variable overriding the router's ``RECENT_S`` (0 to 60; 0 turns the window
off, which the live race test does to force conflicts onto the bind check)."""


def _env_seconds(name: str, default: float, environ: Mapping[str, str] | None) -> float:
    raw = (os.environ if environ is None else environ).get(name, "")
    try:
        v = float(raw)
    except ValueError:
        return default
    return v if 0 <= v <= 60 else default


def settle_from_env(environ: Mapping[str, str] | None = None) -> float:
    """:data:`SETTLE_S`, or the value of :data:`ENV_SETTLE_S` when it is a number in 0..60."""
    return _env_seconds(ENV_SETTLE_S, SETTLE_S, environ)


POLL_S = 2.0
"""Seconds between passes when no event comes: the safety net. A pass runs at once on a
watch event that may let a gated pod move (:meth:`GateAllocator.notify`), when a writer
thread ends, and when a settle ends."""
HELD_OFF_S = 0.5
"""Seconds between looks for pods kept off by the filter's window of recent writes
(:meth:`GateAllocator.wake_held_off`; no API call unless one is due)."""
CATCH_UP_S = 1.0
"""How long a written allocation's check waits for the watch to show the writes before it
reads a consistent list from the API instead (a watch that is down or far behind)."""
PICK_BATCH = 8
"""Nodes read at a time in the search for a gated pod's node (:meth:`GateAllocator._pick`)."""
HOLD_MAX_S = 2.0
"""Longest a checked allocation keeps its gate while kube-scheduler allocates claims on the
same node (:meth:`GateAllocator._kube_busy`; see "Liveness" in the module docstring)."""
HOLD_POLL_S = 0.05
"""Seconds between looks while an allocation is held so."""
RECHECK_S = 0.5
"""Seconds before a pod whose claims are all allocated already (a restart; a conflict
waiting for kube-scheduler's pod's bind check) is checked again: that check reads a list
from the API, so it is not run on every event."""
WRITERS = 4
"""Writer threads: allocations of different pods are written at the same time (each pod's
writes in order: finalizer and mark, allocation, gate)."""
WAIT_FOR_BIND_S = 60.0
"""How long a checked allocation that shares a device with a claim kube-scheduler
allocated for a pod not bound yet keeps its devices (and its gate) while topoplace's bind
check fails that pod and gives its allocation back; past it, topoplace's yields."""

EXTENDED_PICK = "topoplace.io/dra-devices"
"""Pod annotation recording the devices topoplace chose for a gated pod whose
``nvidia.com/gpu`` DRA backs (``{"node": ..., "devices": [[driver, pool, name], ...]}``),
written with the gate's removal: a restarted topoplace gives them to the pod's claim at
bind all the same."""

WAITING = "waiting"
RELEASED = "released"
YIELDED = "yielded"
FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one pass did for one pod (tests, logs).

    Attributes:
        pod: ``namespace/name``.
        state: ``released`` (allocated and ungated), ``waiting`` (nothing fits yet, or the
            gang is incomplete), ``yielded`` (a conflict: allocation removed, retried
            later), ``failed`` (an API error; retried later).
        node: the node (released / yielded).
        devices: the device names allocated (released / yielded).
        reason: why waiting / yielded / failed.
    """

    pod: str
    state: str
    node: str = ""
    devices: tuple[str, ...] = ()
    reason: str = ""


class ClaimApi:
    """What the allocator needs from the API (``scheduler.kube.dra.ClaimWriter``)."""

    def get_claim(self, ns: str, name: str) -> dict[str, Any]: ...  # pragma: no cover
    def list_claims(self) -> list[dict[str, Any]]: ...  # pragma: no cover
    def update_claim(self, claim: Mapping[str, Any]) -> dict[str, Any]: ...  # pragma: no cover
    def update_claim_status(
        self, claim: Mapping[str, Any]
    ) -> dict[str, Any]: ...  # pragma: no cover
    def remove_gate(
        self, pod: Mapping[str, Any], gate: str, annotations: Mapping[str, str] | None = None
    ) -> dict[str, Any]: ...  # pragma: no cover
    def get_pod(self, ns: str, name: str) -> dict[str, Any]: ...  # pragma: no cover


@dataclass(frozen=True, slots=True)
class _Written:
    """Allocations written in this pass, to check and release: the pods (a gang's all),
    their claims, the gang key ("" for one pod)."""

    pods: tuple[Mapping[str, Any], ...]
    claims: tuple[str, ...]
    gang: str = ""
    notes: Mapping[str, str] = field(default_factory=dict)
    """Annotations written on the pods with the gate's removal."""
    picks: tuple[tuple[dra.Pick, Mapping[str, Mapping[str, Any]], str], ...] = ()
    """Allocations held in the ledger and still to write: (pick, the claims by key, the
    ComputeDomain); empty when every claim is allocated already."""

    @property
    def name(self) -> str:
        return self.gang or object_key(self.pods[0])


@dataclass(slots=True, eq=False)
class _Flight:
    """An allocation on its way (owned by the allocator's thread): written by a writer
    thread, settled, checked, then its gates removed by a writer thread.

    Attributes:
        w: what is allocated.
        written_at: when its writes ended (monotonic; its launch when it wrote nothing).
        due: when its settle ends.
        next_check: when a pass must look at it without an event (its settle's end, then
            the watch's grace, :data:`CATCH_UP_S`).
        future: the writer thread's work under way (the writes, then the gate removal).
        ungating: ``future`` removes the gates (the check passed).
        rvs: claim key -> ``resourceVersion`` of its last write (filled by the writer).
    """

    w: _Written
    written_at: float
    due: float
    next_check: float
    future: futures.Future[Any] | None = None
    ungating: bool = False
    rvs: dict[str, str] = field(default_factory=dict)


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _caught_up(claims: Mapping[str, Mapping[str, Any]], rvs: Mapping[str, str]) -> bool:
    """Whether ``claims`` (the cache's) hold each claim of ``rvs`` at the version written
    or a later one. ``resourceVersion`` is compared as the integer the API server (etcd's
    revision) gives; one that is not an integer must be equal."""
    for key, rv in rvs.items():
        c = claims.get(key)
        have = str(((c or {}).get("metadata") or {}).get("resourceVersion") or "")
        if have == rv:
            continue
        if not (have.isdigit() and rv.isdigit() and int(have) > int(rv)):
            return False
    return True


def extended_pick_value(node: str, devices: Iterable[dra.Device]) -> str:
    """The :data:`EXTENDED_PICK` annotation's value (compact JSON)."""
    ids = [list(d.id) for d in devices]
    return json.dumps({"node": node, "devices": ids}, separators=(",", ":"))


def rfc3339(t: float) -> str:
    """``t`` (epoch seconds) as the API's ``metav1.Time``: UTC, whole seconds, ``Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _ns_name(key: str) -> tuple[str, str]:
    ns, _, name = key.partition("/")
    return ns, name


class GateAllocator:
    """Allocates claims of gated pods (see the module docstring).

    Args:
        cache: the cluster cache (DRA objects and holdings).
        api: claim and pod writes (:class:`ClaimApi`).
        pending: the pending pods the watch knows (``KubeWatcher.pending_pods``).
        kube_picks: devices kube-scheduler may be allocating now
            (``DraRouter.likely_kube_picks``).
        settle_s: see :data:`SETTLE_S` (None: :func:`settle_from_env`).
        sleep: interruptible sleep, for :meth:`step`'s settle (tests pass a recorder).
        clock: wall-clock seconds for ``allocationTimestamp`` (tests pass a fixed one).
        monotonic: seconds for settles and the watch's grace (tests pass one they move).
        writers: writer threads (:data:`WRITERS`).
        router: the extender's :class:`DraRouter`: gated pods whose ``nvidia.com/gpu`` DRA
            backs are chosen for through it (None: such pods are released unchosen).
    """

    def __init__(
        self,
        cache: ClusterCache,
        api: ClaimApi,
        pending: Callable[[], Sequence[Mapping[str, Any]]],
        kube_picks: Callable[[], Iterable[dra.DeviceId]] = frozenset,
        settle_s: float | None = None,
        sleep: Callable[[float], Any] | None = None,
        clock: Callable[[], float] = time.time,
        router: DraRouter | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        writers: int = WRITERS,
    ) -> None:
        self.cache = cache
        self.api = api
        self.pending = pending
        self.kube_picks = kube_picks
        self.settle_s = settle_from_env() if settle_s is None else settle_s
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._clock = clock
        self.router = router
        self._given: set[str] = set()  # pods whose claim got topoplace's devices
        self._repair: set[str] = set()  # claims to write again before their pods go
        self._conflict_since: dict[str, float] = {}  # allocation -> first conflict seen
        self._thread: threading.Thread | None = None
        self._monotonic = monotonic
        self._wake = threading.Event()
        self._flights: dict[str, _Flight] = {}  # name -> allocation on its way (the thread's)
        self._watched: frozenset[str] = frozenset()  # claims of the flights (read by notify)
        self._released: dict[str, str] = {}  # pod released -> its version still gated
        self._adopt_waits: dict[str, str] = {}  # adopted pod -> why it waits (logged once)
        self._whole_memo: tuple[dra.Inventory, bool] | None = None
        self._pool = futures.ThreadPoolExecutor(writers, thread_name_prefix="dra-writer")
        if router is not None:
            router.check_bind = self.check_bind
            router.on_adopt = self._wake.set
            router.recent_s = _env_seconds(ENV_RECENT_S, router.recent_s, None)

    # ---- one pass -----------------------------------------------------------------------

    def step(self) -> list[Outcome]:
        """One whole pass, waited for (tests, tools): every gated pod is allocated
        (:meth:`tick`), and every allocation this pass started is written, settled,
        checked and released or given back before it returns. One outcome per single pod
        and per gang written, and one per pod that waits, gangs first, then single pods,
        by key. The settle is slept with the ``sleep`` given, and the check does not wait
        for the watch (an allocation the cache has not seen yet is checked against a
        consistent list instead)."""
        slots = self._plan()
        names = {s for s in slots if isinstance(s, str)}
        got: dict[str, Outcome] = {}
        while names - got.keys():
            for o in self._advance(force=True):
                got[o.pod] = o
            open_ = [self._flights[n] for n in names - got.keys() if n in self._flights]
            busy = [f.future for f in open_ if f.future is not None]
            if busy:
                futures.wait(busy, return_when=futures.FIRST_COMPLETED)
            elif open_:
                due = max(f.due for f in open_) - self._monotonic()
                if due > 0:
                    self._sleep(due)
                for f in open_:
                    f.due = min(f.due, self._monotonic())
        return [got[s] if isinstance(s, str) else s for s in slots]

    def tick(self) -> list[Outcome]:
        """One pass that never waits (the thread's): allocations settled and checked
        (:meth:`_advance`), then every gated pod not in flight allocated, its writes handed
        to the writer threads. Returns what ended in this pass: released, yielded and
        failed allocations, and the pods that wait."""
        out = self._advance()
        out += [o for o in self._plan() if isinstance(o, Outcome)]
        return out + self._advance()

    def _plan(self) -> list[Outcome | str]:
        """Allocate every gated pod (gangs first, then single pods, by key) whose
        allocation is not in flight: held in the ledger here, written by the writer
        threads (:meth:`_launch`). Returns, in that order, an outcome for each pod that
        waits or failed and the flight name of each allocation started."""
        pending = list(self.pending())
        if self.router is not None:
            self._extended_bookkeeping(pending)
        live = {object_key(p): _rv(p) for p in pending}
        self._released = {k: v for k, v in self._released.items() if live.get(k) == v}
        adopted = self.router.adopted() if self.router is not None else frozenset()
        if self._adopt_waits:
            self._adopt_waits = {k: v for k, v in self._adopt_waits.items() if k in adopted}
        if adopted:
            # the watch keeps no pending claim pod without the gate: the filter's copy
            known = {object_key(p) for p in pending}
            pending += [
                p for k in sorted(adopted - known) if (p := self.cache.pending(k)) is not None
            ]
        pods = sorted(
            (
                p
                for p in pending
                if (dra.gated(p) or self._adoptable(p, adopted))
                and object_key(p) not in self._released
            ),
            key=object_key,
        )
        gangs: dict[str, list[Mapping[str, Any]]] = {}
        singles = []
        for p in pods:
            try:
                req = request_from_pod(p, self.cache.params.fabric)
            except ObjectError as exc:
                log.warning("gated pod %s is invalid: %s", object_key(p), exc)
                continue
            if req.gang and not dra.gated(p):
                continue  # an adopted gang member: its gang is kube-scheduler's to place
            (gangs.setdefault(req.gang, []) if req.gang else singles).append(p)
        done: list[Outcome | _Written] = []
        for key in sorted(gangs):
            if key not in self._flights:
                done += self._gang(key, gangs[key])
        for p in singles:
            if object_key(p) not in self._flights:
                got = self._single(p)
                if isinstance(got, Outcome) and not dra.gated(p):
                    if self._adopt_waits.get(got.pod) != got.reason:
                        log.info("adopted claim pod %s waits: %s", got.pod, got.reason)
                    self._adopt_waits[got.pod] = got.reason
                done.append(got)
        return [self._launch(w) if isinstance(w, _Written) else w for w in done]

    def _adoptable(self, pod: Mapping[str, Any], adopted: frozenset[str]) -> bool:
        """Whether ``pod``, without the gate, is one the router handed to the allocator
        (``DraRouter.adopted``) and still needs devices: a single pod (no gang) with
        claims, not all allocated. One that no longer needs them is dropped from the
        router's set."""
        key = object_key(pod)
        if key not in adopted or self.router is None:
            return False
        spec = pod.get("spec") or {}
        claims = self.cache.snapshot().extra.get(dra.CLAIMS_KEY) or {}
        theirs, complete = dra.pod_claims(pod, claims)
        if (
            spec.get("nodeName")
            or not spec.get("resourceClaims")
            or (complete and theirs and all(dra.is_allocated(c) for c in theirs))
        ):
            self.router.drop_adopted(key)
            return False
        return True

    def _launch(self, w: _Written) -> str:
        """Start the flight of ``w``: its writes on a writer thread (one pod's writes in
        order), or, with nothing to write, its settle at once. Returns its name."""
        now = self._monotonic()
        due = now + (max(self.settle_s, RECHECK_S) if w.claims and not w.picks else self.settle_s)
        f = _Flight(w, written_at=now, due=due, next_check=due)
        if w.picks:
            f.future = self._pool.submit(self._write_all, w, f.rvs)
            f.future.add_done_callback(lambda _f: self._wake.set())
        self._flights[w.name] = f
        self._watched = frozenset(k for g in self._flights.values() for k in g.w.claims)
        return w.name

    def _write_all(self, w: _Written, rvs: dict[str, str]) -> Outcome | None:
        """The writes of one flight (a writer thread): each pick's claims in order. Returns
        None (written) or the failure."""
        for pick, claims, domain in w.picks:
            err = self._write(pick, claims, domain, rvs)
            if err:
                return Outcome(w.name, FAILED, pick.node, reason=err)
        return None

    def _advance(self, force: bool = False) -> list[Outcome]:
        """Move every flight on: writes done start the settle; a settle passed checks the
        allocation (:meth:`_fresh`, :meth:`_verdict`) and hands a clean one's gate removal
        to a writer thread; a gate removal done ends the flight. ``force``: a check does
        not wait for the watch nor hold for kube-scheduler's allocations (:meth:`step`).
        Returns the outcomes of the flights that ended."""
        out: list[Outcome] = []
        listed: list[list[dict[str, Any]] | Outcome] = []  # one list per call at most
        for name, f in sorted(self._flights.items()):
            now = self._monotonic()
            if f.future is not None:
                if not f.future.done():
                    continue
                res = self._result(f)
                f.future = None
                if f.ungating:
                    self._end(name)
                    res = res or Outcome(name, FAILED, reason="no outcome")
                    if res.state == RELEASED:  # the watch may show them gated a moment more
                        self._released.update((object_key(p), _rv(p)) for p in f.w.pods if _rv(p))
                    out.append(res)
                    continue
                if res is not None:  # the writes failed (undone)
                    self._end(name)
                    out.append(res)
                    continue
                f.written_at = now
                f.due = f.next_check = now + self.settle_s
            if f.due > now:
                continue
            if not force and now - f.written_at < HOLD_MAX_S and self._kube_busy(f):
                f.next_check = now + HOLD_POLL_S
                continue
            fresh = self._fresh(f, now, force, listed)
            if fresh is None:  # the watch has not shown the writes yet: its event wakes
                f.next_check = f.written_at + CATCH_UP_S
                continue
            if isinstance(fresh, Outcome):
                self._end(name)
                out.append(replace(fresh, pod=name))
                continue
            verdict = self._verdict(f.w, fresh)
            if isinstance(verdict, Outcome):
                self._end(name)
                out.append(verdict)
                continue
            f.ungating = True
            f.future = self._pool.submit(self._ungate, f.w, *verdict)
            f.future.add_done_callback(lambda _f: self._wake.set())
        return out

    def _kube_busy(self, f: _Flight) -> bool:
        """Whether kube-scheduler may be allocating claims on a node of ``f`` now: claim
        pods topoplace's filter let through there whose claims are not allocated yet
        (``DraRouter.likely_kube_picks``), or pending claim pods without the gate whose
        claims are not all allocated and whose nodeSelector allows the node (kube-scheduler
        has them queued, or filters them from a view that may lack ``f``'s writes)."""
        snap = self.cache.snapshot()
        claims = snap.extra.get(dra.CLAIMS_KEY) or {}
        nodes = {pick.node for pick, _, _ in f.w.picks} or {
            dra.allocation_node(claims[k]) for k in f.w.claims if k in claims
        }
        ids = self.kube_picks()
        if ids:
            inv = self.cache.dra_inventory(snap)
            if any((d := inv.by_id.get(i)) is not None and d.node in nodes for i in ids):
                return True
        infos = [n for n in (snap.node(name) for name in sorted(nodes)) if n is not None]
        own = {object_key(p) for p in f.w.pods}
        for p in self.pending():
            spec = p.get("spec") or {}
            if not spec.get("resourceClaims") or dra.gated(p) or object_key(p) in own:
                continue
            theirs, _ = dra.pod_claims(p, claims)
            if theirs and all(dra.is_allocated(c) for c in theirs):
                continue
            selector = spec.get("nodeSelector") or {}
            if any(selector_matches(n.labels, selector) for n in infos):
                return True
        return False

    def idle(self, timeout: float | None = None) -> bool:
        """Wait until no writer thread has work of this allocator's flights under way (the
        next :meth:`tick` then sees it done). Returns False on the timeout."""
        busy = [f.future for f in list(self._flights.values()) if f.future is not None]
        return not futures.wait(busy, timeout).not_done

    @staticmethod
    def _result(f: _Flight) -> Outcome | None:
        assert f.future is not None
        try:
            return f.future.result()
        except Exception as exc:  # a bug in a writer thread: the flight fails, retried
            log.exception("allocation of %s failed", f.w.name)
            return Outcome(f.w.name, FAILED, reason=f"internal error: {exc}")

    def _end(self, name: str) -> None:
        self._flights.pop(name, None)
        self._watched = frozenset(k for g in self._flights.values() for k in g.w.claims)

    def _fresh(
        self,
        f: _Flight,
        now: float,
        force: bool,
        listed: list[list[dict[str, Any]] | Outcome],
    ) -> Sequence[Mapping[str, Any]] | Outcome | None:
        """The claims to check flight ``f`` against: every claim the API held when ``f``'s
        last write was made, or later.

        For claims written by ``f``: the cache's claims, once the watch has delivered each
        of them at the version written or a later one. A watch delivers a resource's
        events in ``resourceVersion`` order, so by then every claim written before ``f``'s
        own writes is in the cache: this is the consistent read the check needs (see the
        module docstring), at no cost. None while the watch is behind, until
        :data:`CATCH_UP_S` after the writes (or at once with ``force``); then, and for a
        flight that wrote nothing (its claims were allocated already: a restart, a retry),
        a consistent list from the API (one per :meth:`_advance`). A flight with no claims
        (extended resources) is checked against nothing."""
        if not f.w.claims:
            return []
        if f.rvs:
            claims = self.cache.snapshot().extra.get(dra.CLAIMS_KEY) or {}
            if _caught_up(claims, f.rvs):
                return list(claims.values())
            if not force and now - f.written_at < CATCH_UP_S:
                return None
            log.info("the watch has not shown %s's writes: checking a list", f.w.name)
        if not listed:
            try:
                listed.append(self.api.list_claims())
            except (ApiError, ApiUnavailable) as exc:
                listed.append(Outcome("", FAILED, reason=f"listing claims failed: {exc}"))
        return listed[0]

    def _claims(self, pod: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], bool, str]:
        """(the pod's GPU claims, whether all its claims exist, its ComputeDomain)."""
        extra = self.cache.snapshot().extra
        claims = extra.get(dra.CLAIMS_KEY) or {}
        every, complete = dra.pod_claims(pod, claims)
        domain = dra.pod_compute_domain(pod, claims)
        return dra.gpu_claims(every, extra.get(dra.CLASSES_KEY) or {}), complete, domain

    def _cd_allows(self, snap: ClusterSnapshot, domain: str) -> Callable[[str], bool]:
        """Whether a node may take a pod of ComputeDomain ``domain`` (always, without one):
        not serving another domain, in an NVLink domain, the same as the domain's others."""
        if not domain:
            return lambda _name: True
        serving = dra.serving_domains(all_claims(snap))
        clique = clique_reader(snap, self.cache.params.fabric)
        cliques = dra.domain_cliques(domain, serving, clique)
        return lambda name: not dra.cd_verdict(domain, name, clique(name), serving, cliques)

    def _nodes(
        self,
        snap: ClusterSnapshot,
        pod: Mapping[str, Any],
        inv: dra.Inventory,
        pin: str = "",
        domain: str = "",
    ) -> list[NodeInfo]:
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        allows = self._cd_allows(snap, domain)
        out = []
        for name in inv.by_node:
            n = snap.node(name)
            if n is None or n.health.state >= Health.UNHEALTHY or n.health.unschedulable:
                continue
            if (pin and name != pin) or not selector_matches(n.labels, selector):
                continue
            if allows(name):
                out.append(n)
        return out

    def _single(self, pod: Mapping[str, Any]) -> Outcome | _Written:
        key = object_key(pod)
        claims, complete, domain = self._claims(pod)
        if not complete:
            return Outcome(key, WAITING, reason=dra.REASON_CLAIMS_UNKNOWN)
        ext = self.router.extended_resources(pod) if self.router is not None else {}
        if ext and not claims:
            return self._single_extended(pod, ext)
        done = [c for c in claims if dra.is_allocated(c)]
        pins = {dra.allocation_node(c) for c in done}
        if len(pins) > 1:
            return Outcome(key, WAITING, reason="the pod's claims are allocated on two nodes")
        if len(done) == len(claims):
            return _Written((pod,), tuple(object_key(c) for c in claims))
        picks = frozenset(self.kube_picks())
        with self.cache.lock:
            snap = self.cache.snapshot()
            inv = self.cache.dra_inventory(snap)
            nodes = self._nodes(snap, pod, inv, next(iter(pins), ""), domain)
            pick = self._pick(pod, claims, nodes, inv, snap, picks)
            if isinstance(pick, str):
                return Outcome(key, WAITING, reason=pick)
            by_key = {object_key(c): c for c in claims}
            self._assume(pick, by_key, domain)
        log.info(
            "allocating %s on %s: GPUs %s (ring %.1f GB/s)",
            key,
            pick.node,
            list(pick.gpus),
            pick.bottleneck,
        )
        keys = tuple(object_key(c) for c in claims)
        return _Written((pod,), keys, picks=((pick, by_key, domain),))

    def _pick(
        self,
        pod: Mapping[str, Any],
        claims: Sequence[Mapping[str, Any]],
        nodes: Sequence[NodeInfo],
        inv: dra.Inventory,
        snap: ClusterSnapshot,
        picks: frozenset[dra.DeviceId],
    ) -> dra.Pick | str:
        """``dra.pick_for_pod`` over ``nodes``: the same answer, from the few nodes that
        can hold it when every device is a whole GPU (the common cluster).

        ``pick_for_pod`` reads every node's devices (hundreds of milliseconds at 500
        nodes, under the cache lock). Its choice is the least (-ring bandwidth, free GPUs
        left, risk, name). On a node with ``f`` free GPUs a set of ``k`` leaves exactly
        ``f - k`` and its ring bandwidth is at most the best ring over any ``k`` of the free
        GPUs (``topology.select.best_bottlenecks`` under the bandwidth-first policy): the
        claims' selectors, taints and the devices to avoid only remove GPUs. So the nodes
        are taken in the order of that optimistic key, a few at a time, until the next
        one's optimistic key is worse than the best choice found: none after it can beat
        it (branch and bound). Shared devices and partitions choose by other rules (the
        sharing policy): any in the inventory, or nothing found, and every node is read."""
        policy = self.cache.params.selection_policy
        extra = snap.extra

        def full(among: Sequence[NodeInfo]) -> dra.Pick | str:
            return dra.pick_for_pod(
                pod,
                among,
                inv,
                extra,
                policy,
                picks,
                snap.pods.values(),
                self.cache.params.sharing,
            )

        specs = [dra.claim_spec(c) for c in claims if not dra.is_allocated(c)]
        k = sum(dra.gpus_requested(s) for s in specs)
        if len(nodes) <= PICK_BATCH or k <= 0 or not self._whole_only(inv):
            return full(nodes)
        ranked: list[tuple[tuple[float, int, float, str], NodeInfo]] = []
        for n in nodes:
            free = n.free_mask
            f = free.bit_count()
            if f < k:
                continue  # no k free GPUs: nothing to choose there
            try:
                ub = best_bottlenecks(n.shape, free, "topoplace")[k]
            except (ValueError, IndexError):
                return full(nodes)
            ranked.append(((-ub, f - k, float(n.health.risk), n.name), n))
        ranked.sort(key=lambda r: r[0])
        best: tuple[tuple[float, int, float, str], dra.Pick] | None = None
        for i in range(0, len(ranked), PICK_BATCH):
            if best is not None and ranked[i][0] > best[0]:
                break
            got = full([n for _, n in ranked[i : i + PICK_BATCH]])
            if isinstance(got, dra.Pick):
                n = snap.node(got.node)
                assert n is not None
                left = (n.free_mask & ~sum(1 << g for g in got.gpus)).bit_count()
                key = (-got.bottleneck, left, float(n.health.risk), got.node)
                if best is None or key < best[0]:
                    best = (key, got)
        return best[1] if best is not None else full(nodes)

    def _whole_only(self, inv: dra.Inventory) -> bool:
        """Whether ``inv`` has no shared device and no partition (memo per inventory)."""
        memo = self._whole_memo
        if memo is None or memo[0] is not inv:
            flat = (d for devs in inv.by_node.values() for d in devs)
            memo = (inv, not any(d.shared or d.partition for d in flat))
            self._whole_memo = memo
        return memo[1]

    # ---- nvidia.com/gpu backed by DRA ---------------------------------------------------

    def _single_extended(
        self, pod: Mapping[str, Any], ext: Mapping[str, str]
    ) -> Outcome | _Written:
        """Choose node and devices for a gated pod whose ``nvidia.com/gpu`` DRA backs.

        kube-scheduler creates the pod's claim itself, in its PreBind (a claim made
        beforehand would be deleted as stale), so nothing is written here: topoplace places
        the pod with the whole-GPU engine (``place_pod``: the node and NVLink-best set a
        device-plugin node would get) over the DRA nodes, holds the devices in the ledger,
        remembers the choice in the router (its filter keeps the pod to that node) and
        releases the gate; at bind, :meth:`reallocate` gives the special claim those
        devices."""
        assert self.router is not None
        key = object_key(pod)
        done = self.router.extended_pick(key)
        if done is not None:  # chosen in an earlier pass; release again
            notes = {EXTENDED_PICK: extended_pick_value(done.node, done.devices)}
            return _Written((pod,), (), notes=notes)
        params = self.cache.params
        try:
            req = request_from_pod(pod, params.fabric)
        except ObjectError as exc:
            return Outcome(key, WAITING, reason=f"invalid pod: {exc}")
        spec = dra.extended_claim_spec(pod, ext)
        if spec is None or req.gpus != dra.gpus_requested(spec):
            return Outcome(key, WAITING, reason=dra.REASON_CLAIMS_UNSUPPORTED)
        picks = frozenset(self.kube_picks())
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        with self.cache.lock:
            snap = self.cache.snapshot()
            inv = self.cache.dra_inventory(snap)

            def allows(name: str) -> bool:
                n = snap.node(name)
                return n is not None and gpus_by_dra(n) and selector_matches(n.labels, selector)

            res = place_pod(self._dra_view(snap, inv, picks, allows), req, params)
            if not res.ok or not res.assignments:
                return Outcome(key, WAITING, reason=res.reason or dra.REASON_NO_DRA_NODE)
            a = res.assignments[0]
            classes = snap.extra.get(dra.CLASSES_KEY) or {}
            cands = dra.whole_gpu_candidates(inv, a.node, [spec], classes, picks)
            if cands is None:
                return Outcome(key, WAITING, reason=dra.REASON_CLAIMS_UNSUPPORTED)
            if any(g not in cands for g in a.gpus):
                return Outcome(key, WAITING, reason="a chosen GPU has no device the class may take")
            devs = tuple(cands[g] for g in a.gpus)
            self._hold(key, pod, a.node, devs)
        log.info("chose for %s on %s: GPUs %s", key, a.node, list(a.gpus))
        return _Written((pod,), (), notes={EXTENDED_PICK: extended_pick_value(a.node, devs)})

    def _extended_bookkeeping(self, pending: Sequence[Mapping[str, Any]]) -> None:
        """Forget choices for pods that went away (deleted, bound); take back, from their
        :data:`EXTENDED_PICK` annotation, the choices for released pods not bound yet that
        this process does not know (it restarted)."""
        assert self.router is not None
        live = {object_key(p) for p in pending}
        self._given &= live
        for k in self.router.extended_keys():
            pick = self.router.extended_pick(k)
            if k not in live and pick is not None:
                self._drop_pick(k, pick)
        for p in pending:
            k = object_key(p)
            note = ((p.get("metadata") or {}).get("annotations") or {}).get(EXTENDED_PICK)
            if not note or dra.gated(p) or k in self._given or self.router.extended_pick(k):
                continue
            try:
                rec = json.loads(note)
                node = str(rec["node"])
                ids = [tuple(str(x) for x in d) for d in rec["devices"]]
            except (ValueError, KeyError, TypeError):
                log.warning("pod %s: unreadable %s annotation", k, EXTENDED_PICK)
                self._given.add(k)
                continue
            with self.cache.lock:
                inv = self.cache.dra_inventory()
                devs = tuple(inv.by_id.get(i) for i in ids)  # type: ignore[arg-type]
                if not devs or any(d is None or d.node != node or d.gpu is None for d in devs):
                    self._given.add(k)  # the devices are gone: kube-scheduler's first fit
                    continue
                got = tuple(d for d in devs if d is not None)
                self._hold(k, p, node, got)
            log.info("took back the choice for %s on %s from its annotation", k, node)

    def _hold(
        self, key: str, pod: Mapping[str, Any], node: str, devs: tuple[dra.Device, ...]
    ) -> None:
        """Hold ``devs`` for pod ``key`` in the ledger and remember the choice in the
        router (cache lock held by the caller)."""
        assert self.router is not None
        m = pod.get("metadata") or {}
        gpus = tuple(sorted(d.gpu for d in devs if d.gpu is not None))
        hold = dra.holder_key(f"{key}/<extended-resources>")
        ns = m.get("namespace") or "default"
        stand_in = {"metadata": {"namespace": ns, "name": f"{m.get('name')}/<extended-resources>"}}
        spec = dra.ClaimSpec(hold, (dra.Request("gpus", "", len(devs)),))
        raw = dra.allocated_claim(stand_in, node, spec, devs)
        self.cache.assume(PodInfo(key=hold, uid="", node=node, gpus=gpus, assumed=True, raw=raw))
        self.router.pick_extended(key, ExtendedPick(node, devs, gpus, hold))

    def reallocate(self, key: str, node: str) -> str:
        """At bind: give the special claim kube-scheduler made for pod ``key`` (in its
        PreBind, by first fit) the devices topoplace chose (:meth:`_single_extended`).
        The allocation is immutable once set, so it is removed (with ``reservedFor``) and
        written again with the chosen devices and the same reservation, before the pod is
        bound (nothing runs it yet), then checked against every claim (one consistent list).
        Returns "" (done, or nothing to do) or an error (the bind fails; kube-scheduler
        deletes the claim and tries again: a device written meanwhile into another claim, or
        an API error)."""
        if self.router is None:
            return ""
        pick = self.router.extended_pick(key)
        if pick is None:
            return ""
        if pick.node != node:
            log.warning("%s bound to %s, not %s as chosen: keeping first fit", key, node, pick.node)
            self._drop_pick(key, pick)
            return ""
        ns, name = _ns_name(key)
        try:
            pod = self.api.get_pod(ns, name)
            st = pod.get("status") or {}
            claim_name = (st.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
            if not claim_name:
                return "the pod records no claim for its extended resources"
            cur = self.api.get_claim(ns, claim_name)
            spec = dra.claim_spec(cur)
            if dra.gpus_requested(spec) != len(pick.devices):
                self._drop_pick(key, pick)
                return ""
            want = sorted(d.id for d in pick.devices)
            if sorted(dra.allocated_ids(cur)) == want:
                self._drop_pick(key, pick)
                return ""  # the first fit was topoplace's choice
            status = dict(cur.get("status") or {})
            reserved = status.get("reservedFor") or []
            cleared = {k: v for k, v in status.items() if k not in ("allocation", "reservedFor")}
            cur = self.api.update_claim_status({**cur, "status": cleared})
            (devs,) = dra.split_devices([spec], pick.devices)
            alloc = dra.allocation_status(node, spec, devs, rfc3339(self._clock()))
            done = self.api.update_claim_status(
                {**cur, "status": {**cleared, "allocation": alloc, "reservedFor": reserved}}
            )
            # kube-scheduler may have allocated one of these devices meanwhile, from a view
            # without topoplace's hold: then the bind fails and kube-scheduler deletes this
            # claim (its Unreserve) and tries the pod again, so no device stays held twice
            mine = {dra.object_key(done): dra.allocated_ids(done)}
            bad = dra.conflicts(mine, self.api.list_claims())
        except (ApiError, ApiUnavailable) as exc:
            log.warning("re-allocating the claim of %s failed: %s", key, exc)
            return f"re-allocating the pod's DRA claim failed: {exc}"
        if bad:
            log.warning("claim of %s shares devices with %s: the bind fails", key, bad)
            self._drop_pick(key, pick)
            return f"the pod's DRA devices are also held by {sorted(bad.items())}"
        log.info("gave %s's claim %s on %s: %s", key, claim_name, node, [d.name for d in devs])
        self._drop_pick(key, pick)
        # the written claim holds the devices now, as its watch event will show
        self.cache.apply_claim(dra.object_key(done), done)
        return ""

    def check_bind(
        self,
        key: str,
        pod: Mapping[str, Any],
        node: str,
        uid: str,
        own: Mapping[dra.DeviceId, str],
        extended: bool = False,
    ) -> str:
        """At bind (``DraRouter.before_bind_claims``): the pod's claims kube-scheduler
        allocated, read from the API, against ``own`` (the devices topoplace allocated or
        holds on ``node`` -> claim key).

        Why this closes the race: each side checks after it writes. topoplace holds a
        device in its ledger before it writes it and checks its write against every claim
        written before it (the cache once the watch shows the write, :meth:`_fresh`);
        kube-scheduler's PreBind writes before topoplace's bind is called. Of two
        allocations naming one device, the one written second is therefore checked after
        the first exists: topoplace's by its check, kube-scheduler's here. A share of a
        shared device conflicts when the sum consumed there with topoplace's shares is
        over capacity (:meth:`_over_capacity`). A conflict found here removes the claim's allocation
        (and ``reservedFor``, only this pod's: nothing runs it yet; kube-scheduler deletes
        a special claim itself when the bind fails) and fails the bind; kube-scheduler
        then allocates again. Returns "" or an error (an API error fails the bind too)."""
        ns, name = _ns_name(key)
        try:
            if extended:
                st = self.api.get_pod(ns, name).get("status") or {}
                made = (st.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
                names = [f"{ns}/{made}"] if made else []
            else:
                names = list(dra.pod_claim_names(pod))
                if len(names) < len((pod.get("spec") or {}).get("resourceClaims") or ()):
                    names = list(dra.pod_claim_names(self.api.get_pod(ns, name)))
            bad: dict[str, tuple[dict[str, Any], list[str]]] = {}
            twice: set[str] = set()  # claims of topoplace's naming a device ``bad`` names
            for ck in names:
                cur = self.api.get_claim(*_ns_name(ck))
                if not dra.is_allocated(cur) or dra.allocated_by_topoplace(cur):
                    continue
                hit = {own[i] for i in dra.allocated_ids(cur) if own.get(i, ck) != ck}
                twice |= hit
                hit |= self._over_capacity(ck, cur)
                if hit:
                    bad[ck] = (cur, sorted(hit))
            for ck, (cur, hit) in sorted(bad.items()):
                log.warning(
                    "claim %s of %s (kube-scheduler's) shares devices with %s: the bind fails",
                    ck,
                    key,
                    hit,
                )
                if not extended:
                    self._deallocate(cur, uid)
                    for h in hit:  # kube-scheduler's count lost the shared devices
                        if h not in twice:
                            continue  # a share over capacity: the others' count stays
                        if h.endswith("/<extended-resources>"):
                            continue  # a choice not written yet: its write counts
                        self._repair.discard(h)
                        if not self._rewrite(h):
                            self._repair.add(h)  # its pod, if still gated, writes it again
                            self._uncounted(h, [i for i in own if own[i] == h])
        except (ApiError, ApiUnavailable) as exc:
            log.warning("checking the claims of %s at bind failed: %s", key, exc)
            return f"checking the pod's DRA claims failed: {exc}"
        if bad:
            held = sorted((k, v[1]) for k, v in bad.items())
            return f"the pod's DRA devices are also allocated by topoplace: {held}"
        return ""

    def _over_capacity(self, key: str, claim: Mapping[str, Any]) -> set[str]:
        """topoplace's claims (allocated, or being written: the ledger's holdings) with a
        share of a shared device that ``claim`` (kube-scheduler's, key ``key``, as read
        from the API) also has a share of, where the sum of what every claim the cache
        knows consumes, with ``claim`` as read, exceeds the device's capacity. The
        holdings are in the ledger before topoplace writes them, so a share of
        topoplace's written before ``claim`` is always counted here."""
        if not dra.shared_results(claim):
            return set()
        snap = self.cache.snapshot()
        view: dict[str, Mapping[str, Any]] = dict(snap.extra.get(dra.CLAIMS_KEY) or {})
        ours: set[str] = {k for k, c in view.items() if dra.allocated_by_topoplace(c)}
        for k, p in snap.pods.items():
            ck = k[len(dra.HOLDER_PREFIX) :]
            if not (p.assumed and k.startswith(dra.HOLDER_PREFIX) and p.raw):
                continue
            if ck != key and not dra.is_allocated(view.get(ck) or {}):
                view[ck] = p.raw  # an allocation topoplace is writing
                ours.add(ck)
        view[key] = claim
        inv = self.cache.dra_inventory(snap)
        mine = {key: [did for did, _, _ in dra.shared_results(claim)]}
        bad = dra.conflicts(mine, view.values(), inv)
        return {o for o in bad.get(key, ()) if o in ours}

    def _deallocate(self, claim: Mapping[str, Any], uid: str) -> None:
        """Remove kube-scheduler's allocation (and the reservation) of ``claim``, reserved
        for the pod ``uid`` alone or for none (a claim shared with a pod that runs is left
        as it is). Raises the API's errors."""
        st = dict(claim.get("status") or {})
        users = {str(r.get("uid") or "") for r in st.get("reservedFor") or ()}
        if users - {uid}:
            log.warning("claim %s is in use by %s: left allocated", object_key(claim), users)
            return
        cleared = {k: v for k, v in st.items() if k not in ("allocation", "reservedFor")}
        self.api.update_claim_status({**claim, "status": cleared})
        log.info("removed kube-scheduler's allocation of %s", object_key(claim))

    def _drop_pick(self, key: str, pick: ExtendedPick) -> None:
        assert self.router is not None
        self._given.add(key)
        self.router.drop_extended(key)
        self.cache.forget(pick.hold)

    # ---- gangs --------------------------------------------------------------------------

    def _gang(self, gang: str, members: list[Mapping[str, Any]]) -> list[Outcome | _Written]:
        """Plan a whole gang of gated claim pods with the gang solver, all or nothing."""
        params = self.cache.params
        reqs = []
        fixed: list[Assignment] = []
        claims_of: dict[str, list[Mapping[str, Any]]] = {}
        domains: set[str] = set()
        for p in members:
            claims, complete, domain = self._claims(p)
            if not complete:
                return [Outcome(object_key(p), WAITING, reason=dra.REASON_CLAIMS_UNKNOWN)]
            claims_of[object_key(p)] = claims
            domains.add(domain)
        if len(domains) > 1:
            why = "gang members use different ComputeDomains"
            return [Outcome(object_key(p), WAITING, reason=why) for p in members]
        domain = next(iter(domains), "")
        snap0 = self.cache.snapshot()
        inv0 = self.cache.dra_inventory(snap0)
        no_gpus = 0
        for p in members:
            k = object_key(p)
            claims = claims_of[k]
            req = request_from_pod(p, params.fabric)
            if not claims:
                no_gpus += 1  # nothing to allocate: released with the gang
                continue
            if all(dra.is_allocated(c) for c in claims):
                held = [dra.claim_holding(c, inv0) for c in claims]
                gpus = tuple(sorted({g for h in held if h for g in h[1]}))
                node = next((h[0] for h in held if h), "")
                fixed.append(Assignment(k, node, gpus))
                continue
            if any(dra.is_allocated(c) for c in claims):
                return [Outcome(k, WAITING, reason="gang member partly allocated")]
            n = sum(dra.gpus_requested(dra.claim_spec(c)) for c in claims)
            reqs.append(replace(req, gpus=n))
        size = max((r.gang_size for r in reqs), default=0)
        if reqs and len(reqs) + len(fixed) + no_gpus < size:
            return [
                Outcome(object_key(p), WAITING, reason="gang incomplete: members not created yet")
                for p in members
            ]
        if not reqs:
            keys = [object_key(c) for p in members for c in claims_of[object_key(p)]]
            # members whose nvidia.com/gpu DRA backs opted in: the gang runtime gives its
            # plan's GPUs to their special claims at bind (scheduler.runtime.gangs)
            router = self.router
            chosen = router is not None and any(router.extended_resources(p) for p in members)
            notes = {DRA_CHOICE_ANNOTATION: "true"} if chosen else {}
            return [_Written(tuple(members), tuple(keys), gang, notes=notes)]
        picks = frozenset(self.kube_picks())
        with self.cache.lock:
            snap = self.cache.snapshot()
            inv = self.cache.dra_inventory(snap)
            try:
                greq = gang_request(reqs, size, fixed)
            except (GangSizeError, ValueError) as exc:
                return [Outcome(object_key(p), WAITING, reason=str(exc)) for p in members]
            allows = self._cd_allows(snap, domain)
            res = None
            reasons = []
            for part in self._partitions(snap, inv, domain, allows):
                sub = self._dra_view(snap, inv, picks, part)
                res = plan_gangs(sub, [greq], params)[0]
                if res.ok:
                    break
                reasons.append(res.reason)
            if res is None or not res.ok:
                why = reasons[0] if reasons and not domain else "; ".join(sorted(set(reasons)))
                if domain:
                    why = f"{dra.REASON_CD_NO_SINGLE_CLIQUE} ({why or 'no free NVLink domain'})"
                return [Outcome(object_key(p), WAITING, reason=why) for p in members]
            by_key = {object_key(p): p for p in members}
            picks_out: list[dra.Pick] = []
            for a in res.assignments:
                pod = by_key.get(a.pod)
                if pod is None or any(f.pod == a.pod for f in fixed):
                    continue
                pick = self._pick_of(a, pod, claims_of[a.pod], inv, snap, picks)
                if isinstance(pick, str):
                    return [Outcome(object_key(p), WAITING, reason=pick) for p in members]
                picks_out.append(pick)
            all_claims = {object_key(c): c for cs in claims_of.values() for c in cs}
            for pick in picks_out:
                self._assume(pick, all_claims, domain)
        log.info(
            "allocating gang %s: %s",
            gang,
            ", ".join(f"{p.node}:{list(p.gpus)}" for p in picks_out),
        )
        keys = [object_key(c) for p in members for c in claims_of[object_key(p)]]
        writes = tuple((pick, all_claims, domain) for pick in picks_out)
        return [_Written(tuple(members), tuple(keys), gang, picks=writes)]

    def _partitions(
        self,
        snap: ClusterSnapshot,
        inv: dra.Inventory,
        domain: str,
        allows: Callable[[str], bool],
    ) -> list[Callable[[str], bool]]:
        """Node sets a gang is planned in, tried in order: every DRA node it may use; for a
        ComputeDomain gang one NVLink partition (``nvidia.com/gpu.clique``) at a time, the
        one with the most free GPUs first (ties by name)."""
        if not domain:
            return [allows]
        clique = clique_reader(snap)
        free: dict[str, int] = {}
        for name in inv.by_node:
            n = snap.node(name)
            c = clique(name)
            if n is not None and c is not None and allows(name):
                free[c] = free.get(c, 0) + n.free_gpus
        order = sorted(free, key=lambda c: (-free[c], c))
        return [lambda n, c=c: allows(n) and clique(n) == c for c in order]

    def _dra_view(
        self,
        snap: ClusterSnapshot,
        inv: dra.Inventory,
        avoid: frozenset[dra.DeviceId],
        allows: Callable[[str], bool] = lambda _name: True,
    ) -> ClusterSnapshot:
        """The snapshot restricted to DRA nodes that ``allows`` (the gang solver places only
        there), with topoplace's in-flight holdings and the devices kube-scheduler may be
        allocating held too."""
        names = [n for n in inv.by_node if snap.node(n) is not None and allows(n)]
        nodes = [snap.node(n).raw for n in names]  # type: ignore[union-attr]
        pods = [
            p.raw
            for p in snap.pods.values()
            if p.node in inv.by_node
            and p.raw
            and not p.key.startswith(dra.HOLDER_PREFIX)
            and not p.assumed
        ]
        sub = build_snapshot(nodes, pods, self.cache.params, snap.extra)
        for k, p in snap.pods.items():
            if p.assumed and k.startswith(dra.HOLDER_PREFIX) and p.node in sub.index:
                with contextlib.suppress(DoubleBookingError, KeyError):
                    sub = with_pod(sub, p)
        extra: dict[str, set[int]] = {}
        for did in avoid:
            d = inv.by_id.get(did)
            if d is not None and d.gpu is not None:
                extra.setdefault(d.node, set()).add(d.gpu)
        for node, gpus in sorted(extra.items()):
            n = sub.node(node)
            if n is None:
                continue
            free = tuple(g for g in sorted(gpus) if n.free_mask >> g & 1)
            if free:
                sub = with_pod(sub, PodInfo(f"kube-picks:{node}", "", node, free))
        return sub

    def _pick_of(
        self,
        a: Assignment,
        pod: Mapping[str, Any],
        claims: Sequence[Mapping[str, Any]],
        inv: dra.Inventory,
        snap: ClusterSnapshot,
        avoid: frozenset[dra.DeviceId],
    ) -> dra.Pick | str:
        specs = [(object_key(c), dra.claim_spec(c)) for c in claims if not dra.is_allocated(c)]
        extra = snap.extra
        cands = dra.whole_gpu_candidates(
            inv, a.node, [s for _, s in specs], extra.get(dra.CLASSES_KEY) or {}, avoid
        )
        if cands is None:
            return dra.REASON_CLAIMS_UNSUPPORTED
        if any(g not in cands for g in a.gpus):
            return "a GPU of the gang plan has no device the claims may take"
        parts = dra.split_devices([s for _, s in specs], [cands[g] for g in a.gpus])
        return dra.Pick(
            a.node, tuple((k, s, p) for (k, s), p in zip(specs, parts, strict=True)), a.gpus
        )

    # ---- writes -------------------------------------------------------------------------

    def _assume(
        self, pick: dra.Pick, claims: Mapping[str, Mapping[str, Any]], domain: str = ""
    ) -> None:
        """Hold the picked GPUs in the ledger (cache lock held by the caller)."""
        snap = self.cache.snapshot()
        inv = self.cache.dra_inventory(snap)
        for ck, spec, devs in pick.claims:
            body = dra.allocated_claim(claims[ck], pick.node, spec, devs, domain)
            # shares of shared devices and MIG partitions hold shares, full GPUs whole
            held = claim_holding_info(body, inv, snap.node, assumed=True)
            if held is not None:
                self.cache.assume(held)
                continue
            info = PodInfo(
                key=dra.holder_key(ck),
                uid=str((claims[ck].get("metadata") or {}).get("uid") or ""),
                node=pick.node,
                gpus=tuple(sorted({d.gpu for d in devs if d.gpu is not None})),
                assumed=True,
                raw=body,
            )
            self.cache.assume(info)

    def _write(
        self,
        pick: dra.Pick,
        claims: Mapping[str, Mapping[str, Any]],
        domain: str = "",
        rvs: dict[str, str] | None = None,
    ) -> str:
        """Write finalizer + annotation, then the allocation, of each picked claim, in that
        order; on an error, undo what was written and drop the assumptions. Returns "" or
        the error; ``rvs`` gets each written claim's ``resourceVersion`` (claim key ->).

        The first write starts from the cache's copy of the claim (``claims``): its
        ``resourceVersion`` makes the update conditional, so a copy the API has moved past
        fails with 409 and is read again, never overwritten. Safe to run in a writer thread
        (the cache and the router lock themselves)."""
        written: list[str] = []
        for ck, spec, devs in pick.claims:
            ns, name = _ns_name(ck)
            try:
                cur = claims.get(ck)
                for fresh in (cur is None, True):
                    if fresh:
                        cur = self.api.get_claim(ns, name)
                    assert cur is not None
                    if dra.is_allocated(cur):
                        raise ApiError(409, "Conflict", "claim allocated meanwhile")
                    body = dra.allocated_claim(
                        cur, pick.node, spec, devs, domain, rfc3339(self._clock())
                    )
                    meta_only = {**body, "status": cur.get("status") or {}}
                    try:
                        updated = self.api.update_claim(meta_only)
                        break
                    except ApiError as exc:
                        if fresh or not exc.conflict:
                            raise
                updated["status"] = body["status"]
                done = self.api.update_claim_status(updated)
                written.append(ck)
                rv = str((done.get("metadata") or {}).get("resourceVersion") or "")
                if rvs is not None and rv:
                    rvs[ck] = rv
                if self.router is not None:
                    self.router.note_written(ck, [d.id for d in devs])
            except (ApiError, ApiUnavailable) as exc:
                log.warning("allocating %s failed: %s; undoing", ck, exc)
                for w in written:
                    self._undo(w)
                for c, _, _ in pick.claims:
                    self.cache.forget(dra.holder_key(c))
                return f"claim write failed: {exc}"
        return ""

    def _undo(self, claim_key: str) -> bool:
        """Remove topoplace's allocation of a claim nothing uses yet (status first, then
        the finalizer and mark). Returns whether it was undone."""
        ns, name = _ns_name(claim_key)
        for _ in range(3):
            try:
                cur = self.api.get_claim(ns, name)
                if not dra.allocated_by_topoplace(cur):
                    return False
                if (cur.get("status") or {}).get("reservedFor"):
                    return False  # in use already: never pull it from under a pod
                if dra.is_allocated(cur):
                    st = dict(cur.get("status") or {})
                    st.pop("allocation", None)
                    cur = self.api.update_claim_status({**cur, "status": st})
                m = dict(cur.get("metadata") or {})
                m["finalizers"] = [
                    f for f in m.get("finalizers") or () if f != dra.DELETE_PROTECTION
                ]
                ann = dict(m.get("annotations") or {})
                ann.pop(dra.ALLOCATED_BY, None)
                ann.pop(dra.CD_ANNOTATION, None)
                m["annotations"] = ann
                self.api.update_claim({**cur, "metadata": m})
                return True
            except ApiError as exc:
                if exc.conflict:
                    continue
                log.warning("undoing %s failed: %s", claim_key, exc)
                return False
            except ApiUnavailable as exc:
                log.warning("undoing %s failed: %s", claim_key, exc)
                return False
        return False

    def _binding_later(self, claim: Mapping[str, Any]) -> bool:
        """Whether ``claim`` (another's) is kube-scheduler's allocation for pods that are
        not bound yet (each one topoplace has not bound: its bind will check the claim)."""
        if dra.allocated_by_topoplace(claim):
            return False
        ns = (claim.get("metadata") or {}).get("namespace") or "default"
        users = [r for r in (claim.get("status") or {}).get("reservedFor") or () if r]
        if not users:
            return False  # allocated and reserved by no pod: nothing will bind it
        pods = self.cache.snapshot().pods
        for r in users:
            p = pods.get(f"{ns}/{r.get('name')}")
            if r.get("resource") != "pods" or (p is not None and p.node):
                return False
        return True

    def _uncounted(self, claim_key: str, ids: Sequence[dra.DeviceId]) -> None:
        """``claim_key`` keeps ``ids``, which kube-scheduler no longer counts: the router
        keeps kube-scheduler's pods off them (``DraRouter.note_uncounted``)."""
        log.warning(
            "claim %s keeps devices %s that kube-scheduler no longer counts as allocated "
            "(they were in two claims and the other gave them back); claim pods are kept "
            "off them until the claim's allocation goes",
            claim_key,
            sorted(ids),
        )
        if self.router is not None:
            self.router.note_uncounted(claim_key, ids)

    def _rewrite(self, claim_key: str) -> bool:
        """Remove a claim's allocation and write the same one again, so that
        kube-scheduler, whose count of allocated devices forgot them when another claim
        naming them was given back, counts them again (it adds a claim's devices when its
        allocation appears). Only a claim no pod has reserved (nothing runs it). Returns
        whether it was written again."""
        ns, name = _ns_name(claim_key)
        try:
            cur = self.api.get_claim(ns, name)
            st = dict(cur.get("status") or {})
            alloc = st.get("allocation")
            if not alloc or st.get("reservedFor"):
                return False
            cleared = {k: v for k, v in st.items() if k != "allocation"}
            cur = self.api.update_claim_status({**cur, "status": cleared})
            done = self.api.update_claim_status({**cur, "status": {**cleared, "allocation": alloc}})
        except (ApiError, ApiUnavailable) as exc:
            log.warning("writing %s's allocation again failed: %s", claim_key, exc)
            return False
        log.info("wrote %s's allocation again: kube-scheduler counts its devices again", claim_key)
        if self.router is not None:
            self.router.counted_again(claim_key)
            self.router.note_written(claim_key, dra.allocated_ids(done))
        return True

    def _verdict(
        self, w: _Written, fresh: Sequence[Mapping[str, Any]]
    ) -> Outcome | tuple[str, tuple[str, ...]]:
        """Whether ``w`` may go: (its node, its devices) if its claims share no device with
        another claim of ``fresh`` (its gates are then removed, :meth:`_ungate`), else what
        happened. A claim kube-scheduler allocated for a pod that is not bound
        yet (topoplace binds it, and its bind check will fail it and give the allocation
        back) is waited for, the devices kept, up to :data:`WAIT_FOR_BIND_S`; any other
        conflict, or a longer one, makes topoplace's allocation yield. Either way the
        survivor must be written again (:meth:`_rewrite`): kube-scheduler counts allocated
        devices in a set, so removing one of two claims that name a device removes the
        device from its count although the other still holds it."""
        by_key = {object_key(c): c for c in fresh}
        mine = {k: dra.allocated_ids(by_key[k]) for k in w.claims if k in by_key}
        hard = dra.conflicts(mine, fresh)  # devices named twice
        inv = self.cache.dra_inventory(self.cache.snapshot())
        bad = dra.conflicts(mine, fresh, inv)  # and shared devices over capacity
        node = next((dra.allocation_node(by_key[k]) for k in w.claims if k in by_key), "")
        devices = tuple(sorted(d for ids in mine.values() for _, _, d in ids))
        if bad:
            others = sorted({o for v in bad.values() for o in v})
            now = time.monotonic()
            since = self._conflict_since.setdefault(w.name, now)
            later = {o for o in others if o in by_key and self._binding_later(by_key[o])}
            # wait when the claims the bind check will give back end every conflict (on a
            # device named twice: every other claim is such; on a shared device: the sum
            # without them fits)
            if now - since < WAIT_FOR_BIND_S and not dra.conflicts(
                mine, [c for c in fresh if object_key(c) not in later], inv
            ):
                if hard:
                    self._repair.update(k for k in w.claims if k in by_key)
                why = f"devices also in {others}, allocated by kube-scheduler for pods topoplace has not bound: waiting for their bind to give them back"
                return Outcome(w.name, WAITING, node, devices, why)
            for k, others_k in bad.items():
                log.warning("claim %s shares devices with %s: topoplace yields", k, others_k)
            self._conflict_since.pop(w.name, None)
            for k in w.claims:
                if k in by_key and dra.allocated_by_topoplace(by_key[k]):
                    self._undo(k)
                self.cache.forget(dra.holder_key(k))
                self._repair.discard(k)
            named_twice = sorted({o for v in hard.values() for o in v})
            for o in named_twice:  # kube-scheduler's count of the shared devices lost them
                if o in by_key and not self._rewrite(o):
                    self._uncounted(o, dra.allocated_ids(by_key[o]))
            why = f"devices also held by {sorted(bad.items())}"
            return Outcome(w.name, YIELDED, node, devices, why)
        self._conflict_since.pop(w.name, None)
        fix = [k for k in w.claims if k in self._repair]
        if fix:
            for k in fix:
                self._repair.discard(k)
                self._rewrite(k)
            why = "allocation written again (kube-scheduler counts its devices again); checking"
            return Outcome(w.name, WAITING, node, devices, why)
        return node, devices

    def _ungate(self, w: _Written, node: str, devices: tuple[str, ...]) -> Outcome:
        """Remove the gates of ``w``'s pods (a writer thread; after its claims' writes).
        A pod without the gate (``DraRouter.adopted``) is woken instead: kube-scheduler
        parked it after topoplace's filter refused it, and now only reserves its claims."""
        for p in w.pods:
            if not dra.gated(p):
                key = object_key(p)
                if self.router is not None:
                    self.router.drop_adopted(key)
                wake = getattr(self.api, "wake_pod", None)
                if wake is not None:
                    ns, name = _ns_name(key)
                    with contextlib.suppress(ApiError, ApiUnavailable):
                        wake(ns, name, "topoplace allocated its DRA claims")
                continue
            try:
                self.api.remove_gate(p, dra.ALLOCATE_GATE, w.notes)
            except ApiError as exc:
                if exc.not_found:
                    continue
                return Outcome(w.name, FAILED, node, devices, f"removing the gate failed: {exc}")
            except ApiUnavailable as exc:
                return Outcome(w.name, FAILED, node, devices, f"removing the gate failed: {exc}")
        return Outcome(w.name, RELEASED, node, devices)

    # ---- thread -------------------------------------------------------------------------

    def wake_held_off(self) -> list[str]:
        """Wake the pending pods topoplace's filter refused only while its recent writes
        could still be missing from kube-scheduler's view (``DraRouter.due_wakes``): that
        window has ended, and nothing else may move them. Returns the pods woken."""
        wake = getattr(self.api, "wake_pod", None)
        if self.router is None or wake is None:
            return []
        woken = []
        for key in self.router.due_wakes():
            if self.cache.pending(key) is None:
                continue
            ns, name = _ns_name(key)
            try:
                wake(ns, name, "topoplace's recent DRA allocations are visible now")
            except (ApiError, ApiUnavailable) as exc:
                log.warning("waking %s failed: %s", key, exc)
                continue
            woken.append(key)
        return woken

    def notify(self, kind: str, typ: str, obj: Mapping[str, Any]) -> None:
        """A watch event the cache has applied (``KubeWatcher.on_event``; the watch's
        thread: only sets a flag). Wakes the allocator for what may let a gated pod move: a
        gated pod added or changed (its claims named), a claim added, given back or
        deleted (a template claim made, devices freed), or a write of an allocation in
        flight shown (its check may run). Other events (kube-scheduler's allocations,
        every other pod) wake nothing."""
        if kind == "pods":
            wake = typ != "DELETED" and dra.gated(obj)
        elif kind == "resourceclaims":
            wake = typ == "DELETED" or not dra.is_allocated(obj) or object_key(obj) in self._watched
        else:
            wake = False
        if wake:
            self._wake.set()

    def _next_wake(self, now: float, last_pass: float, interval: float) -> float:
        """Seconds until the thread must run a pass without an event: the first check due
        (a settle ended, the watch's grace over), else the safety poll."""
        at = last_pass + interval
        for f in self._flights.values():
            if f.future is None:
                at = min(at, f.next_check)
        return max(0.0, at - now)

    def run(self, interval: float = POLL_S) -> None:
        """Passes (:meth:`tick`) until :meth:`stop`: at once on a :meth:`notify` that
        matters or a writer thread done, when a settle ends, and every ``interval``
        seconds whatever happens (the safety net for a missed event: a node added, a
        device's taint gone). Pods kept off by the filter's window are woken every
        :data:`HELD_OFF_S`."""
        last_pass = float("-inf")
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.wake_held_off()
            now = self._monotonic()
            if self._wake.is_set() or now - last_pass >= interval or self._due(now):
                self._wake.clear()
                last_pass = now
                try:
                    for o in self.tick():
                        if o.state != WAITING:
                            log.info(
                                "allocation of %s %s: %s %s %s",
                                o.pod,
                                o.state,
                                o.node,
                                o.devices,
                                o.reason,
                            )
                except Exception:  # keep the loop alive; the next pass starts from the API's view
                    log.exception("allocator pass failed")
            wait = min(self._next_wake(self._monotonic(), last_pass, interval), HELD_OFF_S)
            self._wake.wait(wait)

    def _due(self, now: float) -> bool:
        """Whether a flight's check is due (its settle ended, or the watch's grace)."""
        return any(f.future is None and f.next_check <= now for f in self._flights.values())

    def start(self, interval: float = POLL_S) -> None:
        """Run :meth:`run` in a daemon thread."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.run, args=(interval,), name="dra-allocator", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (waits up to ``timeout``) and the writer threads (a write under
        way finishes; the flights it leaves are the API's state, taken up again by the next
        allocator from the watch)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
