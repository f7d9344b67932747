"""Where an offline sweep's independent runs execute: in this process, on local worker
processes, or as tasks on a Ray cluster.

Every scenario of ``topoplace bench`` (``fgd-openb``, ``faults``, ``gangs``) builds its list of
independent runs (workload x policy x seed, and the scenario's other axes) and hands it to
an :class:`Executor`::

    topoplace bench fgd-openb --out out/fgd               # all CPUs (os.cpu_count())
    topoplace bench fgd-openb --out out/fgd --workers 1   # inline, in this process
    topoplace bench gangs --out out/gangs --ray local     # a new local Ray instance
    topoplace bench faults --out out/f --ray auto         # join the running cluster
    topoplace bench faults --out out/f --ray head:6379    # ... or name its head
    topoplace bench faults --out out/f --ray ray://head:10001   # Ray Client

Contract (what scenarios and their callers may assume):

- ``map`` returns one result per item **in input order**, whatever the executor and whatever
  order runs finish in, so a scenario's outputs do not depend on where its runs executed.
  A run is a top-level function of plain, picklable arguments, deterministic for its
  arguments; the executor never changes its inputs, only where and when it runs.
- ``order`` (optional) is the submission order, a permutation of the item indices (e.g.
  costliest first, to shorten the tail); it changes wall time only.
- ``on_result(index, result)`` is called in the calling process as each run finishes
  (completion order), for progress lines; it must not feed back into the runs.
- The first failing run's exception propagates; runs not yet started are cancelled.
- ``--workers N`` caps local processes (``1``: inline, no pool); with ``--ray local`` it is
  the new instance's CPU count, and on a joined cluster the number of runs in flight.

A Ray cluster's workers must be able to import this project (the same commit, e.g.
``pip install 'topoplace[ray]'`` on every node) and read the input data at the same path
(``--data``, ``../shared/data``). When Ray is already initialised in this process (a
notebook, a test fixture), the executor uses that connection and leaves it open. Connecting
is Ray's business: a cluster with token authentication (Ray 2.60 turns it on) needs
``RAY_AUTH_MODE=token`` and the token in the environment for ``host:port`` and ``ray://``
addresses (``auto`` found it on the head node itself).
"""

from __future__ import annotations

import argparse
import itertools
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

RAY_INSTALL_HINT = "pip install 'topoplace[ray]'"
"""What to run when ``--ray`` is given but Ray is not importable."""


class SweepError(RuntimeError):
    """A sweep cannot be executed as configured (bad ``--workers``, Ray missing or unreachable)."""


def _order(n: int, order: Sequence[int] | None) -> list[int]:
    if order is None:
        return list(range(n))
    seq = list(order)
    if sorted(seq) != list(range(n)):
        raise ValueError("order must be a permutation of the item indices")
    return seq


class Executor(ABC):
    """Runs a function over independent items; results come back in input order.

    Executors are context managers: leaving the ``with`` block releases what they started
    (a Ray instance started with ``--ray local``, a connection they opened).
    """

    @abstractmethod
    def map(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        *,
        order: Sequence[int] | None = None,
        on_result: Callable[[int, R], None] | None = None,
    ) -> list[R]:
        """``[fn(x) for x in items]``, computed wherever this executor runs things.

        Args:
            fn: A top-level (picklable) function, deterministic for its argument.
            items: Picklable arguments, one run each.
            order: Submission order (a permutation of ``range(len(items))``); default
                input order.
            on_result: Called as ``on_result(index, result)`` in this process when a run
                finishes.

        Returns:
            The results, ``results[i] == fn(items[i])``.

        Raises:
            ValueError: If ``order`` is not a permutation of the indices.
            Exception: The first failing run's exception (Ray wraps it in its own type).
        """

    @abstractmethod
    def describe(self) -> str:
        """Where runs execute, for reports (e.g. ``"2 local processes"``)."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release what this executor started; idempotent."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class LocalExecutor(Executor):
    """Runs on up to ``workers`` local processes (``ProcessPoolExecutor``); ``1``: inline.

    A pool lives for one ``map`` call and never has more processes than items.
    """

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise SweepError(f"--workers must be at least 1, not {workers}")
        self.workers = workers or os.cpu_count() or 1

    def describe(self) -> str:
        """``"1 process (inline)"`` or ``"N local processes"``."""
        if self.workers == 1:
            return "1 process (inline)"
        return f"{self.workers} local processes"

    def map(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        *,
        order: Sequence[int] | None = None,
        on_result: Callable[[int, R], None] | None = None,
    ) -> list[R]:
        """See :meth:`Executor.map`."""
        seq = _order(len(items), order)
        results: dict[int, R] = {}

        def done(i: int, r: R) -> None:
            results[i] = r
            if on_result is not None:
                on_result(i, r)

        n = min(self.workers, len(items))
        if n <= 1:
            for i in seq:
                done(i, fn(items[i]))
        else:
            with ProcessPoolExecutor(max_workers=n) as pool:
                index: dict[Future[R], int] = {}
                try:
                    for i in seq:
                        index[pool.submit(fn, items[i])] = i
                    rank = {i: k for k, i in enumerate(seq)}
                    pending = set(index)
                    while pending:
                        finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                        # Several may finish together: report them in submission order.
                        for fut in sorted(finished, key=lambda f: rank[index[f]]):
                            done(index[fut], fut.result())
                except BaseException:
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
        return [results[i] for i in range(len(items))]


class RayExecutor(Executor):
    """Runs each item as a Ray task (``ray.remote``) on a local instance or a cluster.

    ``address``: ``"local"`` starts a new local instance (``workers`` CPUs, default all;
    no dashboard) and shuts it down on :meth:`close`; ``"auto"``, ``"host:port"`` or
    ``"ray://host:port"`` (Ray Client, needs ``ray[client]``) joins a running cluster, and
    ``workers`` then caps the runs in flight. Ray is connected lazily, on the first ``map``.

    Raises:
        SweepError: If Ray is not importable (with the install command).
    """

    def __init__(self, address: str, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise SweepError(f"--workers must be at least 1, not {workers}")
        try:
            import ray  # noqa: F401
        except ImportError as exc:
            raise SweepError(
                f"--ray needs Ray, which is not installed: {RAY_INSTALL_HINT}"
            ) from exc
        self.address = address
        self.workers = workers
        self._owned = False
        self._connected = False

    def _ray(self) -> Any:
        import ray

        if not self._connected:
            if not ray.is_initialized():
                kwargs: dict[str, Any] = {"address": self.address}
                if self.address == "local":
                    kwargs.update(num_cpus=self.workers, include_dashboard=False)
                try:
                    ray.init(**kwargs)
                except (ConnectionError, ValueError, RuntimeError) as exc:
                    raise SweepError(
                        f"cannot start or join Ray at {self.address!r}: {exc}"
                    ) from exc
                self._owned = True
            self._connected = True
        return ray

    def describe(self) -> str:
        """``"Ray at <address> (<CPUs> CPUs)"``."""
        cpus = self._ray().cluster_resources().get("CPU", 0)
        cap = f", at most {self.workers} runs in flight" if self._cap() else ""
        return f"Ray at {self.address} ({cpus:g} CPUs{cap})"

    def _cap(self) -> int | None:
        return self.workers if self.address != "local" else None

    def map(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        *,
        order: Sequence[int] | None = None,
        on_result: Callable[[int, R], None] | None = None,
    ) -> list[R]:
        """See :meth:`Executor.map`."""
        seq = _order(len(items), order)
        if getattr(fn, "__module__", None) == "__main__":
            raise SweepError(
                f"{fn.__qualname__} is defined in __main__, which Ray workers cannot import: "
                "run the sweep through its module (python -m ... or topoplace bench)"
            )
        if not seq:
            return []
        ray = self._ray()
        task = ray.remote(num_cpus=1)(fn)
        todo: Iterator[int] = iter(seq)
        index: dict[Any, int] = {}  # object ref -> item index
        results: dict[int, R] = {}
        for i in itertools.islice(todo, self._cap() or len(seq)):
            index[task.remote(items[i])] = i
        pending = list(index)
        try:
            while pending:
                finished, pending = ray.wait(pending, num_returns=1)
                for ref in finished:
                    i = index.pop(ref)
                    results[i] = ray.get(ref)
                    if on_result is not None:
                        on_result(i, results[i])
                    nxt = next(todo, None)
                    if nxt is not None:
                        ref = task.remote(items[nxt])
                        index[ref] = nxt
                        pending.append(ref)
        except BaseException:
            for ref in pending:
                ray.cancel(ref)
            raise
        return [results[i] for i in range(len(items))]

    def close(self) -> None:
        """Shut down the Ray instance this executor started or joined; idempotent."""
        if self._owned:
            import ray

            ray.shutdown()
        self._owned = False
        self._connected = False


def make_executor(workers: int | None = None, ray: str | None = None) -> Executor:
    """The executor for ``--workers`` / ``--ray``: Ray when an address is given, else local.

    Raises:
        SweepError: For ``workers < 1``, or ``ray`` given without Ray installed.
    """
    if ray:
        return RayExecutor(ray, workers)
    return LocalExecutor(workers)


def add_arguments(parser: argparse.ArgumentParser, *, jobs_alias: bool = False) -> None:
    """Add ``--workers`` and ``--ray`` (``jobs_alias``: also the old ``--jobs``, hidden)."""
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="local worker processes (default: all CPUs; 1 = inline, no pool); with --ray "
        "local the instance's CPUs, with a joined cluster the runs in flight",
    )
    if jobs_alias:
        parser.add_argument("--jobs", dest="workers", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run on Ray instead of local processes: 'local' starts a local instance, "
        "'auto', HOST:PORT or ray://HOST:PORT joins a cluster (needs "
        f"{RAY_INSTALL_HINT}); results are the same either way",
    )


def from_args(args: argparse.Namespace) -> Executor:
    """The executor selected by parsed ``--workers`` / ``--ray`` (absent: all local CPUs).

    Raises:
        SweepError: See :func:`make_executor`.
    """
    return make_executor(getattr(args, "workers", None), getattr(args, "ray", None))
