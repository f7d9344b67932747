"""A background check that runs every few seconds on a thread of its own."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Periodic:
    """Calls ``tick()`` every ``interval()`` seconds on a daemon thread named ``name``
    until :meth:`stop`; an exception in ``tick`` is logged (``what`` says what failed) and
    the loop goes on."""

    def __init__(
        self, name: str, tick: Callable[[], object], interval: Callable[[], float], what: str
    ) -> None:
        self.name = name
        self.tick = tick
        self.interval = interval
        self.what = what
        self._stop = threading.Event()
        self._poked = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread (a tick in progress finishes)."""
        self._stop.set()
        self._poked.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout)

    def poke(self) -> None:
        """Run the next tick now instead of at the end of the interval (from any thread;
        a tick in progress finishes first, then one more runs)."""
        self._poked.set()

    def _run(self) -> None:
        while True:
            self._poked.wait(self.interval())
            self._poked.clear()
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception:  # never let the loop die
                log.exception("%s failed", self.what)
