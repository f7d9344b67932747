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

    def record(self, answer: dict[str, Any], broken: Iterable[Broken]) -> None:
        """Keep one answer (JSON-ready) and the gangs it breaks."""
        now = self.clock()
        with self._lock:
            self._recent.append({"time": now, **answer})
            for b in broken:
                self._broken[(b.gang, b.victim_uid)] = (now, b)

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
