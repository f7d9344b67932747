"""The registry of sharing (node-scoring) policies and what every policy shares.

A sharing policy scores the feasible nodes of a GPU-sharing cluster view for one task
(:class:`SharingPolicy`); it registers itself by name with :func:`register_sharing_policy`
when its module is imported. The FGD paper's policies are in ``sharing_policies.py``,
topoplace's own in ``topoplace_sharing.py``; both build on this module, which imports
neither (``sharing_policies`` imports ``topoplace_sharing`` so that every user of the registry
sees it).

Contract: registration happens at import time only; callers treat ``SHARING_POLICIES`` as
read-only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from scheduler.core.sharing import (
    FragmentationModel,
    GpuSelection,
    IntArray,
    SharingClusterView,
    SharingTask,
)

NO_GPU = -1
"""Entry of ``SharingScores.gpus`` meaning "the policy leaves the device choice to the rule"."""
MAX_NODE_SCORE = 100
MIN_NODE_SCORE = 0


class RandomSource(Protocol):
    """What the random policy needs from a seeded generator (e.g. ``GoRand``)."""

    def intn(self, n: int) -> int:
        """Uniform integer in ``[0, n)``."""
        ...


@dataclass(frozen=True, slots=True, eq=False)
class SharingContext:
    """Per-decision inputs besides the cluster view and the task.

    Attributes:
        candidates: Indices of the feasible nodes to score (sorted, non-empty).
        frag: Fragmentation model of the target workload (required by ``fgd``).
        rng: Seeded generator (required by ``random``).
    """

    candidates: IntArray
    frag: FragmentationModel | None = None
    rng: RandomSource | None = None


@dataclass(frozen=True, slots=True, eq=False)
class SharingScores:
    """Scores of ``nodes`` (same order), and the device each would use for a GPU-sharing task.

    ``gpus[i] == NO_GPU`` means the caller allocates with the policy's ``gpu_selection`` rule.
    """

    nodes: IntArray
    scores: IntArray
    gpus: IntArray


class SharingPolicy(Protocol):
    """A node-scoring policy for GPU-sharing clusters.

    Attributes:
        name: Registry name.
        gpu_selection: Device rule for GPU-sharing tasks when ``gpus`` says ``NO_GPU``.
        cacheable: True if a node's score depends only on that node's state and the task's
            resource shape (CPU, memory, GPU count and milli), so callers may cache it per node
            version. False for policies that draw random numbers.
    """

    name: str
    gpu_selection: GpuSelection
    cacheable: bool

    def score(
        self, view: SharingClusterView, task: SharingTask, ctx: SharingContext
    ) -> SharingScores:
        """Score ``ctx.candidates`` for ``task``."""
        ...


SHARING_POLICIES: dict[str, SharingPolicy] = {}
"""Registered policies by name."""


def register_sharing_policy(name: str) -> Callable[[type], type]:
    """Class decorator: instantiate the policy with ``name`` and register it.

    Raises:
        ValueError: If the name is already registered.
    """

    def deco(cls: type) -> type:
        if name in SHARING_POLICIES:
            raise ValueError(f"sharing policy {name!r} already registered")
        inst = cls()
        inst.name = name
        SHARING_POLICIES[name] = inst
        return cls

    return deco


def get_sharing_policy(name: str) -> SharingPolicy:
    """The registered policy ``name``.

    Raises:
        KeyError: With the list of known names.
    """
    try:
        return SHARING_POLICIES[name]
    except KeyError:
        known = ", ".join(sorted(SHARING_POLICIES))
        raise KeyError(f"unknown sharing policy {name!r} (known: {known})") from None


def select_host(result: SharingScores, rank: IntArray) -> int:
    """The winning node: highest score, ties to the lowest ``rank``.

    Args:
        result: Scores of the candidate nodes (non-empty).
        rank: Tie-break rank per node of the view (lower wins).

    Returns:
        Index (into the view) of the chosen node.
    """
    best = result.scores.max()
    tied = result.nodes[result.scores == best]
    return int(tied[np.argmin(rank[tied])])


def sigmoid_score(delta_milli: np.ndarray) -> IntArray:
    """FGD's node score ``int(100 * sigmoid(delta / 1000))`` for a fragmentation drop ``delta``.

    NaN entries (no placement) map to -1 so that they never win a maximum.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        s = (1.0 / (1.0 + np.exp(-(delta_milli / 1000.0)))) * float(MAX_NODE_SCORE)
    out = np.where(np.isnan(s), -1.0, s)
    return out.astype(np.int64)
