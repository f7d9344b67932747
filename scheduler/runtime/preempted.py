"""What topoplace answered kube-scheduler's preemptions, and the gangs they break.

The extender's ``preempt`` verb records each answer here; the remediator (kube mode)
reads the gangs a preemption broke and evicts their other members once the victim is
really going (``remediation.teardown_groups``); ``/v1/inspect/preemptions`` shows the
latest answers. No I/O; one lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from scheduler.core.remediation import Broken

RECENT = 100
"""Answers :meth:`PreemptionLedger.view` shows."""
HOLD_S = 30.0
"""How long a pod's last preemption answer holds: while topoplace still sees one of its
victims, the pod preempts nothing more (see :meth:`PreemptionLedger.waiting_for`)."""
BROKEN_MEMORY_S = 600.0
"""A broken-gang record whose victim never went (kube-scheduler did not preempt after
all) is dropped after this long."""


class PreemptionLedger:
    """Recent preemption answers and the broken gangs still to tear down.

    Args:
        clock: seconds (monotonic in production, injected in tests).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self._broken: dict[tuple[str, str], tuple[float, Broken]] = {}
        self._last: dict[str, tuple[float, frozenset[str], str]] = {}
        """pod key -> (when, victim UIDs, node) of its last answer that named victims."""

    def record(
        self,
        answer: dict[str, Any],
        broken: Iterable[Broken],
        pod: str = "",
        victims: Iterable[str] = (),
        node: str = "",
    ) -> None:
        """Keep one answer (JSON-ready), the gangs it breaks, and the victims ``pod`` was
        given (UIDs) on ``node``."""
        now = self.clock()
        with self._lock:
            self._recent.append({"time": now, **answer})
            for b in broken:
                self._broken[(b.gang, b.victim_uid)] = (now, b)
            uids = frozenset(victims)
            if pod and uids:
                self._last[pod] = (now, uids, node)
            for k in [k for k, (t, _, _) in self._last.items() if now - t > HOLD_S]:
                del self._last[k]

    def waiting_for(
        self, pod: str, present: Callable[[str], bool], room: Callable[[str], bool]
    ) -> bool:
        """True while ``pod``'s last answer (within :data:`HOLD_S`) still stands: one of
        its victims is there (``present``: UID -> still holding its GPUs in topoplace's
        view), or the node it named has room for the pod now (``room``: node -> the pod
        fits there).

        kube-scheduler deletes the victims, sees them go in its own cache, and may try the
        pod again before topoplace's watch has seen them go; topoplace's filter then still
        finds the node full, kube-scheduler preempts again, and a second node loses pods
        for nothing (seen live: 3 of 12 arrivals preempted twice; with the victims check
        alone, 1 of 24, the watch catching up between the filter and the preemption).
        While this holds the pod preempts nothing; its nomination stands, and topoplace's
        parked-pod wake-up sends it back to kube-scheduler once the GPUs are free."""
        with self._lock:
            got = self._last.get(pod)
        if got is None or self.clock() - got[0] > HOLD_S:
            return False
        return any(present(u) for u in got[1]) or room(got[2])

    def broken(self) -> list[Broken]:
        """The broken gangs not torn down yet (records older than
        :data:`BROKEN_MEMORY_S` are dropped)."""
        now = self.clock()
        with self._lock:
            for k in [k for k, (t, _) in self._broken.items() if now - t > BROKEN_MEMORY_S]:
                del self._broken[k]
            return [b for _, b in self._broken.values()]

    def done(self, b: Broken) -> None:
        """Forget a record whose gang was torn down (or had nothing left)."""
        with self._lock:
            self._broken.pop((b.gang, b.victim_uid), None)

    def sizes(self) -> dict[str, tuple[int, int | None]]:
        """Entries of each store, with its cap (None: bounded by :data:`HOLD_S` and
        :data:`BROKEN_MEMORY_S`): ``/v1/inspect/state``."""
        with self._lock:
            return {
                "recent": (len(self._recent), RECENT),
                "broken": (len(self._broken), None),
                "last": (len(self._last), None),
            }

    def view(self) -> dict[str, Any]:
        """``GET /v1/inspect/preemptions``: the latest answers, newest last, and the
        gangs waiting for their victim to go."""
        with self._lock:
            return {
                "recent": list(self._recent),
                "pending_teardowns": [
                    {
                        "gang": b.gang,
                        "victim": b.victim,
                        "members": len(b.members),
                        "preemptor": b.preemptor,
                        "recorded": t,
                    }
                    for t, b in self._broken.values()
                ],
            }
