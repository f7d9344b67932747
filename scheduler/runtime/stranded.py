"""Pods kube-scheduler will not preempt for, and topoplace's preemptions for them.

kube-scheduler preempts only where its in-tree filters refuse a pod. A node it sends to the
extender's filter has passed them with every pod in place; its DefaultPreemption's dry run
then finds that the pod fits there with no victim, and a candidate without victims is
dropped (``DryRunPreemption`` keeps only nodes with victims). So when topoplace alone
refuses the pod on such a node because the GPUs it could use are taken, kube-scheduler
never preempts there and never calls the extender's ``preempt`` verb for it, however low
the priority of the pods holding them:

- a HAMi or gpushare pod counts as one ``nvidia.com/gpu`` replica: a node with a free
  replica but no GPU with the memory the pod asks (in the live preemption benchmark without it, 12 of 24 high-priority
  arrivals stay pending: ``benchmarks/results/live-preemption.md``);
- a whole-GPU pod that needs a link class (``topoplace.io/min-link``): free GPUs that do
  not form such a set;
- GPUs that topoplace calls unhealthy while the node still advertises them.

:class:`StrandedPods` remembers each such refusal: the pod and the nodes refused for that
reason alone (filter reasons "not enough free healthy GPUs", "no free GPU set meets the
required link", "not enough free GPU memory or compute on any GPU"). The kube adapter
(``scheduler.kube.preemptor``) asks the extender to choose victims among those nodes once
the refusal is :data:`GRACE_S` old (kube-scheduler runs its PostFilter, and so the
``preempt`` verb when it has candidates, within the same scheduling cycle as the filter),
evicts them, and when the victims are gone holds the freed GPUs for the pod and wakes it.

Gangs the same way, under the key :func:`gang_record_key` (``gang:<namespace>/<gang>``):
a gang whose members each pass kube-scheduler's filters (GPUs free by its count on some
node) but which topoplace cannot place as a whole (one node, one NVLink domain or leaf
required, free GPUs scattered) is refused member by member, and kube-scheduler preempts for
none of them. Its record's ``node`` lists the nodes of its victims, comma-separated. No
I/O; one lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from scheduler.runtime.parked import backoff

GRACE_S = 1.0
"""Seconds after a refusal before topoplace preempts on its own: kube-scheduler's own
preemption (and the ``preempt`` verb) comes within the refusal's scheduling cycle."""
GIVE_UP_S = 60.0
"""A preemption whose victims are still there after this long (an eviction refused, a pod
stuck terminating) is given up; the pod may be preempted for again."""
MAX_PREEMPTIONS = 3
"""Preemptions topoplace starts for one pod at most while it stays pending: a pod still
refused after this many (something topoplace does not model keeps it out, or other pods
keep taking the GPUs freed for it) is not preempted for again, so evictions cannot
cascade."""
GANG_PREFIX = "gang:"
"""Prefix of a gang's record key (a pod key, ``namespace/name``, never has a colon)."""
MAX_STRANDED = 10_000
"""Pods remembered at most; the oldest refusal goes first."""


def gang_record_key(gang: str) -> str:
    """The record key of gang ``gang`` (``namespace/name``)."""
    return GANG_PREFIX + gang


def gang_of(key: str) -> str:
    """The gang of a record key ("" for a pod's)."""
    return key[len(GANG_PREFIX) :] if key.startswith(GANG_PREFIX) else ""


@dataclass(frozen=True, slots=True)
class Stranded:
    """A refused pod.

    Attributes:
        nodes: the nodes refused only for GPUs taken at its latest refusal.
        refused_at: when (the cache's clock): the first refusal since the last try.
        tried_at: when topoplace last looked for victims for it (-inf: never).
        tries: attempts that found nothing to preempt, in a row (the backoff: the
            parked-pod wake's, ``parked.backoff``).
        preemptions: preemptions started for it so far (at most :data:`MAX_PREEMPTIONS`).
        node: the node of its preemption in progress ("" none; a gang's: its victims'
            nodes, comma-separated).
        victims: the UIDs evicted for it there.
        preempted_at: when that preemption started.
    """

    nodes: tuple[str, ...]
    refused_at: float
    tried_at: float = float("-inf")
    tries: int = 0
    preemptions: int = 0
    node: str = ""
    victims: frozenset[str] = frozenset()
    preempted_at: float = float("-inf")


class StrandedPods:
    """Refused pods and topoplace's preemptions for them (module docstring).

    Thread-safe: filter records refusals, the kube adapter's preemptor thread acts.
    """

    def __init__(self, limit: int = MAX_STRANDED) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, Stranded] = OrderedDict()
        self._busy: tuple[frozenset[str], frozenset[str]] | None = None
        """:meth:`busy`, kept until a preemption starts or ends (the watch asks at every
        pod deletion)."""

    def sizes(self) -> dict[str, tuple[int, int | None]]:
        """Entries, with the cap: ``/v1/inspect/state``."""
        return {"stranded": (len(self._pods), self.limit)}

    def __len__(self) -> int:
        return len(self._pods)

    def get(self, key: str) -> Stranded | None:
        """The pod's record, if any."""
        return self._pods.get(key)

    def refused(self, key: str, nodes: Iterable[str], at: float) -> None:
        """Filter offered ``key`` no node; ``nodes`` were refused only for GPUs taken
        (nothing is remembered when there are none: preempting helps nowhere)."""
        names = tuple(sorted(nodes))
        with self._lock:
            old = self._pods.get(key)
            if not names:
                if old is not None and not old.node:
                    del self._pods[key]
                return
            if old is None:
                self._pods[key] = Stranded(names, at)
                while len(self._pods) > self.limit:
                    self._forgot(self._pods.popitem(last=False)[1])
            else:  # keeps its backoff and any preemption in progress, and the first
                # refusal not tried yet: a pod refused again and again (a gang's members
                # taking turns, each woken by the gang runtime) is still due GRACE_S after it
                first = old.refused_at if old.refused_at > old.tried_at else at
                self._pods[key] = replace(old, nodes=names, refused_at=first)

    def offered(self, key: str) -> None:
        """Filter offered ``key`` a node: nothing more to do for it."""
        if self._pods:
            with self._lock:
                self._forgot(self._pods.pop(key, None))

    def drop(self, key: str) -> None:
        """Forget ``key`` (bound, deleted, or not to be preempted for)."""
        self.offered(key)

    def prune(self, pending: Callable[[str], bool]) -> list[str]:
        """Forget the pods ``pending`` says are no longer waiting (bound, deleted);
        returns their keys."""
        with self._lock:
            gone = [k for k in self._pods if not pending(k)]
            for k in gone:
                self._forgot(self._pods.pop(k))
        return gone

    def due(self, now: float) -> list[str]:
        """Pods to look for victims for now, oldest refusal first: refused at least
        :data:`GRACE_S` ago, not tried since that refusal, past their backoff, with no
        preemption in progress and fewer than :data:`MAX_PREEMPTIONS` started."""
        with self._lock:
            return [
                k
                for k, s in self._pods.items()
                if not s.node
                and now - s.refused_at >= GRACE_S
                and s.tried_at < s.refused_at
                and (not s.tries or now - s.tried_at >= backoff(s.tries))
                and s.preemptions < MAX_PREEMPTIONS
            ]

    def in_progress(self) -> list[tuple[str, Stranded]]:
        """The pods with a preemption in progress, and their records."""
        with self._lock:
            return [(k, s) for k, s in self._pods.items() if s.node]

    def _forgot(self, s: Stranded | None) -> None:
        """A record is gone (lock held): :meth:`busy` is read again if it was in progress."""
        if s is not None and s.node:
            self._busy = None

    def busy(self) -> tuple[frozenset[str], frozenset[str]]:
        """(the nodes, the victim UIDs) of the preemptions in progress: another search
        leaves those nodes alone, and counts those victims' GPUs as theirs until they are
        gone (they are for the pod they were evicted for, as kube-scheduler's nominated
        pods count on their node)."""
        got = self._busy
        if got is None:
            with self._lock:
                going = [s for s in self._pods.values() if s.node]
                nodes = frozenset(n for s in going for n in s.node.split(","))
                got = self._busy = (nodes, frozenset(u for s in going for u in s.victims))
        return got

    def tried(self, key: str, at: float) -> None:
        """An attempt for ``key`` at ``at`` found nothing to preempt."""
        with self._lock:
            s = self._pods.get(key)
            if s is not None:
                self._pods[key] = replace(s, tried_at=at, tries=s.tries + 1)

    def preempting(self, key: str, node: str, victims: Iterable[str], at: float) -> None:
        """Victims (UIDs) on ``node`` are being evicted for ``key`` since ``at``."""
        with self._lock:
            self._busy = None
            s = self._pods.get(key)
            if s is not None:
                self._pods[key] = replace(
                    s,
                    tried_at=at,
                    tries=0,
                    node=node,
                    victims=frozenset(victims),
                    preempted_at=at,
                    preemptions=s.preemptions + 1,
                )

    def settled(self, key: str) -> None:
        """``key``'s preemption is over (victims gone and the pod woken, or given up): a
        later refusal may start another."""
        with self._lock:
            self._busy = None
            s = self._pods.get(key)
            if s is not None:
                self._pods[key] = replace(s, node="", victims=frozenset())

    def view(self) -> list[dict[str, Any]]:
        """JSON-ready records (``/v1/inspect/preemptions``)."""
        with self._lock:
            items = list(self._pods.items())
        return [
            {
                "pod": k,
                "nodes": len(s.nodes),
                "refused_at": s.refused_at,
                "tries": s.tries,
                "preemptions": s.preemptions,
                "node": s.node,
                "victims": len(s.victims),
            }
            for k, s in items
        ]
