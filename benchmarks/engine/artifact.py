"""The FGD artifact's randomness: its submission order and its node ranking.

A run of the reproduction is the one engine (:mod:`benchmarks.engine`) with a sharing
ledger, a sharing policy and the ``reject`` queue: for each arrival, filter the feasible
nodes (CPU, memory, GPU model, GPU room), score them with the policy, take the best (ties:
lowest node rank), choose the devices; a task that fits nowhere fails (it is not retried).
This module supplies what makes it the artifact's run, draw for draw.

The arrival order of the FGD artifact is replayed bit for bit (``fgd_arrivals``): Go's
``math/rand`` seeded with the run seed draws one ``Int``, shuffles the tasks sorted by name,
then samples tasks (with replacement, from the name-sorted workload) and appends them until the
next one would push the total GPU request past ``tune_ratio`` x cluster capacity (or removes
random tasks if the workload is already larger). The artifact then names nodes with a random
permutation drawn from the same generator (``node_rank``); its kube-scheduler fork breaks score
ties by the smallest node name, i.e. by that permutation.

Determinism: everything random comes from the ``GoRand`` created from the seed (the engine's
sharing placement keeps drawing from it for the random policy and random device choice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from benchmarks.engine.gorand import GoRand
from scheduler.core.sharing import SharingTask

DEFAULT_TUNE_RATIO = 1.3
"""Arrived GPU demand the FGD experiments submit, as a fraction of cluster GPU capacity."""
DEFAULT_RANK_SKIP = 10
"""Go ``Int63`` draws between tuning and the node-name permutation in the artifact.

Between tuning the workload and permuting node names the artifact starts the scheduler's
informers, whose reflectors each draw one ``rand.Float64`` (watch timeout) from the same global
generator. Ten such draws reproduce the published per-seed curves of every deterministic
policy column for column (checked on several seeds and workloads); any other value gives an
equally random node order, i.e. the same statistics but not the same individual runs.
"""


@dataclass(frozen=True, slots=True)
class ArrivalPlan:
    """The task sequence of one seed and the generator positioned after drawing it."""

    tasks: tuple[SharingTask, ...]
    rng: GoRand
    original_gpu_milli: int
    target_gpu_milli: float


def fgd_arrivals(
    tasks: Sequence[SharingTask],
    seed: int,
    capacity_gpu_milli: int,
    tune_ratio: float = DEFAULT_TUNE_RATIO,
) -> ArrivalPlan:
    """The artifact's submission order for ``seed`` (shuffle, then tune to ``tune_ratio``).

    Args:
        tasks: The workload (any order; names must be unique).
        seed: Run seed (the artifact uses 42..51).
        capacity_gpu_milli: Cluster GPU capacity in milli-GPU.
        tune_ratio: Target arrived GPU demand / capacity; <= 0 disables tuning.

    Returns:
        The ordered tasks and the generator, ready for ``node_rank``.
    """
    rng = GoRand(seed)
    rng.int_()  # the artifact evaluates rand.Int() in a debug log right after seeding
    by_name = sorted(tasks, key=lambda t: t.name)
    order = list(by_name)
    rng.shuffle_list(order)
    total = sum(t.total_gpu_milli for t in order)
    original = total
    target = tune_ratio * float(capacity_gpu_milli)
    if tune_ratio > 0 and float(total) > target:
        while float(total) > target:
            removed = order.pop(rng.intn(len(order)))
            total -= removed.total_gpu_milli
    elif tune_ratio > 0 and float(total) < target:
        i = 0
        while True:
            src = by_name[rng.intn(len(by_name))]
            # The artifact compares with the per-GPU request here (not the total); kept as is.
            if float(total + src.gpu_milli) > target:
                break
            total += src.total_gpu_milli
            order.append(replace(src, name=f"{src.name}-tuned-{i}"))
            i += 1
    return ArrivalPlan(tuple(order), rng, original, target)


def node_rank(num_nodes: int, rng: GoRand, skip: int = DEFAULT_RANK_SKIP) -> np.ndarray:
    """Tie-break rank of the name-sorted nodes: the artifact's random name prefix."""
    for _ in range(skip):
        rng.int63()
    return np.asarray(rng.perm(num_nodes), dtype=np.int64)
