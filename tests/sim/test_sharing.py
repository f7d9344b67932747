"""The GPU-sharing model, the FGD fragmentation measure and the sharing policies.

Expected values are worked out by hand from the definitions in the FGD paper (ATC '23, Sec. 3)
and the policy formulas documented in ``scheduler.core.policies.sharing_policies``; the
arithmetic is spelled out beside each case.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pytest

from benchmarks.engine.gorand import GoRand
from scheduler.core.policies.sharing_policies import (
    NO_GPU,
    SHARING_POLICIES,
    SharingContext,
    get_sharing_policy,
    register_sharing_policy,
    select_host,
    sigmoid_score,
)
from scheduler.core.sharing import (
    FragmentationModel,
    SharingClusterView,
    SharingNode,
    SharingTask,
    TaskShape,
    TypicalDistribution,
    allocate,
    bind,
    classify,
    cluster_fragmentation,
    feasible_mask,
    fits,
    fragmentation_breakdown,
    node_fragmentation,
    typical_tasks,
)

# --------------------------------------------------------------------------- builders


def node(
    name: str,
    free: tuple[int, ...],
    *,
    cpu_free: int = 64_000,
    cpu_cap: int | None = None,
    mem_free: int = 262_144,
    mem_cap: int | None = None,
    model: str = "V100M16",
    affinity: tuple[tuple[str, int], ...] = (),
) -> SharingNode:
    """A node in a given state (keyword builder instead of a literal)."""
    return SharingNode(
        name=name,
        gpu_model=model if free else "",
        cpu_milli_capacity=cpu_cap if cpu_cap is not None else cpu_free,
        memory_mib_capacity=mem_cap if mem_cap is not None else mem_free,
        gpu_free_milli=free,
        cpu_milli_free=cpu_free,
        memory_mib_free=mem_free,
        affinity=affinity,
    )


def share(milli: int, cpu: int = 1000, mem: int = 0, spec: tuple[str, ...] = ()) -> SharingTask:
    return SharingTask(f"share{milli}", cpu, mem, 1, milli, spec)


def whole(n: int, cpu: int = 1000, mem: int = 0, spec: tuple[str, ...] = ()) -> SharingTask:
    return SharingTask(f"whole{n}", cpu, mem, n, 1000, spec)


def cpu_only(cpu: int, mem: int = 0) -> SharingTask:
    return SharingTask(f"cpu{cpu}", cpu, mem)


# Distribution used by the hand-worked fragmentation cases:
#   s1: 4 cores + half a GPU (p=0.5), s2: 2 cores + 2 whole GPUs (p=0.3), s3: 1 core, no GPU (p=0.2)
S1 = TaskShape(cpu_milli=4000, gpu_milli=500, num_gpu=1)
S2 = TaskShape(cpu_milli=2000, gpu_milli=1000, num_gpu=2)
S3 = TaskShape(cpu_milli=1000, gpu_milli=0, num_gpu=0)
DIST = TypicalDistribution((S1, S2, S3), (0.5, 0.3, 0.2))


# --------------------------------------------------------------------------- fragmentation


@dataclass(frozen=True)
class FragCase:
    description: str
    node: SharingNode
    expected: float


FRAG_CASES = [
    FragCase(
        # s1 fits (GPUs 1000 and 600 have >= 500): stranded = 200 + 0 = 200
        # s2 lacks GPUs (one free GPU < 2): all 1800; s3 uses no GPU: all 1800
        # F = 0.5*200 + 0.3*1800 + 0.2*1800 = 100 + 540 + 360 = 1000
        "partially used node: stranded slivers for s1, everything for s2 and s3",
        node("a", (1000, 600, 200, 0), cpu_free=8000),
        1000.0,
    ),
    FragCase(
        # 3 cores left: s1 lacks CPU (q4) and s2 lacks both (q1): every shape sees all 1800
        "CPU-exhausted node: all idle GPU is fragmented",
        node("b", (1000, 600, 200, 0), cpu_free=3000),
        1800.0,
    ),
    FragCase(
        # s1 fits, stranded = 0; s2 fits (two free GPUs), stranded = 0; s3: all 2000
        # F = 0.2 * 2000 = 400
        "two idle GPUs: only the CPU-only share of the workload counts",
        node("c", (1000, 1000), cpu_free=8000),
        400.0,
    ),
    FragCase("node without free GPU milli has no fragmentation", node("d", (0, 0)), 0.0),
    FragCase(
        # s1 fits: stranded 300 + 300 = 600... no: both GPUs have 300 < 500, so s1 lacks GPU.
        # s1: 600, s2: 600, s3: 600 -> F = 600
        "only slivers below every request: all of it is fragmented",
        node("e", (300, 300)),
        600.0,
    ),
]


@pytest.mark.parametrize("case", FRAG_CASES, ids=lambda c: c.description)
def test_node_fragmentation_by_hand(case: FragCase) -> None:
    assert node_fragmentation(case.node, DIST) == pytest.approx(case.expected)


def test_breakdown_partitions_idle_gpu() -> None:
    # Node a: q2 = 0.5*200 (s1 slivers) + 0.3*1800 (s2) = 640, q3 = 0.5*1600 = 800,
    # xl = 0.2*1800 = 360; the categories add up to the 1800 idle milli.
    b = fragmentation_breakdown(node("a", (1000, 600, 200, 0), cpu_free=8000), DIST)
    assert b["q2_lack_gpu"] == pytest.approx(640)
    assert b["q3_satisfied"] == pytest.approx(800)
    assert b["xl_satisfied"] == pytest.approx(360)
    assert sum(b.values()) == pytest.approx(1800)


@pytest.mark.parametrize(
    ("description", "nd", "shape", "expected"),
    [
        ("fits", node("n", (1000,), cpu_free=8000), S1, "q3_satisfied"),
        ("enough GPU, not enough CPU", node("n", (1000,), cpu_free=100), S1, "q4_lack_cpu"),
        ("enough CPU, no GPU room", node("n", (400,), cpu_free=8000), S1, "q2_lack_gpu"),
        ("neither", node("n", (400,), cpu_free=100), S1, "q1_lack_both"),
        ("CPU-only shape fits", node("n", (400,), cpu_free=8000), S3, "xl_satisfied"),
        ("CPU-only shape lacks CPU", node("n", (400,), cpu_free=10), S3, "xr_lack_cpu"),
        (
            "GPU model not allowed",
            node("n", (1000,), model="T4"),
            TaskShape(1000, 500, 1, "V100M16|V100M32"),
            "no_access",
        ),
    ],
)
def test_classify(description: str, nd: SharingNode, shape: TaskShape, expected: str) -> None:
    assert classify(nd, shape) == expected, description


def test_cluster_fragmentation_sums_nodes() -> None:
    nodes = [c.node for c in FRAG_CASES]
    assert cluster_fragmentation(nodes, DIST) == pytest.approx(sum(c.expected for c in FRAG_CASES))


def test_typical_tasks_cut_and_renormalise() -> None:
    # 6 x A, 3 x B, 1 x C with popularity 0.9: 9 of 10 needed -> A (6) then B (9) -> stop;
    # weights renormalised to 6/9 and 3/9.
    a = [SharingTask(f"a{i}", 1000, 0, 1, 500) for i in range(6)]
    b = [SharingTask(f"b{i}", 2000) for i in range(3)]
    c = [SharingTask("c0", 8000, 0, 8, 1000)]
    dist = typical_tasks(a + b + c, popularity=0.9)
    assert dist.shapes == (TaskShape(1000, 500, 1), TaskShape(2000, 0, 0))
    assert dist.weights == pytest.approx((6 / 9, 3 / 9))


def test_typical_tasks_ties_prefer_larger_shape() -> None:
    # Equal counts: the artifact orders by CPU, then per-GPU milli, GPU count, spec (descending).
    tasks = [SharingTask("x", 1000, 0, 1, 300), SharingTask("y", 2000, 0, 1, 300)]
    dist = typical_tasks(tasks, popularity=0.5)
    assert dist.shapes == (TaskShape(2000, 300, 1),)
    assert dist.weights == (1.0,)


def test_task_shape_ignores_memory_and_cpu_task_gpu_fields() -> None:
    assert SharingTask("t", 1000, 5, 1, 500).shape == SharingTask("u", 1000, 9, 1, 500).shape
    assert SharingTask("t", 1000).shape == TaskShape(1000, 0, 0, "")


# --------------------------------------------------------------------------- fit and allocation


@pytest.mark.parametrize(
    ("description", "nd", "task", "selection", "draw", "expected"),
    [
        ("best fit: least free device with room", node("n", (1000, 400, 350, 0)), share(300),
         "best", None, (2,)),
        ("best fit: lowest index among equal", node("n", (350, 1000, 350)), share(300), "best",
         None, (0,)),
        ("worst fit: most free device", node("n", (400, 1000, 350)), share(300), "worst", None,
         (1,)),
        ("random: the draw-th candidate in index order", node("n", (1000, 400, 350, 0)),
         share(300), "random", 1, (1,)),
        ("whole GPUs: lowest-indexed fully free", node("n", (1000, 400, 1000, 1000)), whole(2),
         "best", None, (0, 2)),
        ("CPU-only task takes no device", node("n", (1000,)), cpu_only(500), "best", None, ()),
        ("no fully free device for a whole GPU", node("n", (999, 999)), whole(1), "best", None,
         None),
        ("not enough fully free devices", node("n", (1000, 0)), whole(2), "best", None, None),
        ("GPU model constraint not met", node("n", (1000,), model="T4"),
         share(300, spec=("V100M16", "V100M32")), "best", None, None),
        ("GPU model constraint met", node("n", (1000,), model="V100M32"),
         share(300, spec=("V100M16", "V100M32")), "best", None, (0,)),
        ("CPU does not fit", node("n", (1000,), cpu_free=999), share(300, cpu=1000), "best",
         None, None),
        ("memory does not fit", node("n", (1000,), mem_free=10), share(300, mem=11), "best",
         None, None),
        ("GPU task on a CPU-only node", node("n", ()), share(300), "best", None, None),
    ],
)  # fmt: skip
def test_allocate(
    description: str,
    nd: SharingNode,
    task: SharingTask,
    selection: str,
    draw: int | None,
    expected: tuple[int, ...] | None,
) -> None:
    assert allocate(nd, task, selection, draw) == expected, description  # type: ignore[arg-type]
    assert fits(nd, task) == (expected is not None), description


def test_bind_returns_new_state_and_keeps_input() -> None:
    nd = node("n", (1000, 1000, 600), cpu_free=8000, cpu_cap=16000, mem_free=1000)
    before = copy.deepcopy(nd)
    after = bind(nd, share(500, cpu=2000, mem=100), (2,))
    after = bind(after, whole(2, cpu=1000), (0, 1))
    assert nd == before
    assert after.gpu_free_milli == (0, 0, 100)
    assert after.cpu_milli_free == 5000
    assert after.memory_mib_free == 900
    assert after.affinity == (("2-gpu", 1), ("share-gpu", 1))
    assert after.cpu_milli_capacity == 16000


@pytest.mark.parametrize(
    ("description", "task", "gpus"),
    [
        ("device without room", share(700), (2,)),
        ("wrong device count", whole(2), (0,)),
        ("same device twice", whole(2), (0, 0)),
        ("CPU-only task with a device", cpu_only(10), (0,)),
        ("CPU over capacity", share(100, cpu=9000), (0,)),
    ],
)
def test_bind_rejects_invalid(description: str, task: SharingTask, gpus: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):
        bind(node("n", (1000, 1000, 600), cpu_free=8000), task, gpus)


def test_allocate_random_needs_draw() -> None:
    with pytest.raises(ValueError):
        allocate(node("n", (1000,)), share(100), "random")


# --------------------------------------------------------------------------- vectorised model


def random_nodes(seed: int, n: int = 40) -> list[SharingNode]:
    rng = np.random.default_rng(seed)
    levels = np.array([0, 100, 250, 300, 500, 600, 750, 1000])
    out = []
    for i in range(n):
        g = int(rng.choice([1, 2, 4, 8]))
        free = tuple(int(x) for x in rng.choice(levels, size=g))
        model = str(rng.choice(["V100M16", "T4", "G2"]))
        out.append(node(f"r{i:02d}", free, cpu_free=int(rng.integers(0, 16)) * 1000, model=model))
    return out


MIXED = TypicalDistribution(
    (
        TaskShape(1000, 500, 1),
        TaskShape(4000, 250, 1),
        TaskShape(2000, 1000, 1),
        TaskShape(8000, 1000, 2, "V100M16|G2"),
        TaskShape(1000, 0, 0),
        TaskShape(6000, 750, 1, "T4"),
    ),
    (0.3, 0.2, 0.2, 0.1, 0.15, 0.05),
)


def test_vectorised_fragmentation_matches_scalar() -> None:
    nodes = random_nodes(1)
    view = SharingClusterView.from_nodes(nodes)
    fm = FragmentationModel.build(MIXED, view.model_names)
    vec = fm.node_frag(view.gpu_free, view.cpu_free, view.model_ids)
    assert vec == pytest.approx([node_fragmentation(n, MIXED) for n in nodes])


@pytest.mark.parametrize(
    "task", [share(250, cpu=2000), share(600), whole(1), whole(2), cpu_only(3000)]
)
def test_vectorised_deltas_match_scalar_before_minus_after(task: SharingTask) -> None:
    nodes = random_nodes(2)
    view = SharingClusterView.from_nodes(nodes)
    fm = FragmentationModel.build(MIXED, view.model_names)
    idx = np.flatnonzero(feasible_mask(view, task))
    assert len(idx) >= 3
    args = (view.gpu_free[idx], view.cpu_free[idx], view.model_ids[idx], task)
    if task.is_sharing:
        got = fm.delta_sharing(*args)
        for row, i in enumerate(idx):
            nd = nodes[i]
            for g, free in enumerate(nd.gpu_free_milli):
                if free < task.gpu_milli:
                    assert np.isnan(got[row, g])
                    continue
                expected = node_fragmentation(nd, MIXED) - node_fragmentation(
                    bind(nd, task, (g,)), MIXED
                )
                assert got[row, g] == pytest.approx(expected, abs=1e-9)
    else:
        got = fm.delta_exclusive(*args)
        for row, i in enumerate(idx):
            nd = nodes[i]
            placed = bind(nd, task, allocate(nd, task) or ())
            expected = node_fragmentation(nd, MIXED) - node_fragmentation(placed, MIXED)
            assert got[row] == pytest.approx(expected, abs=1e-9)


def test_artifact_order_fragmentation_equals_definition() -> None:
    # Same quantity, different float summation order: equal to rounding.
    nodes = random_nodes(6)
    view = SharingClusterView.from_nodes(nodes)
    fm = FragmentationModel.build(MIXED, view.model_names)
    got = fm.node_frag_artifact_order(view.gpu_free, view.cpu_free, view.model_ids)
    assert got == pytest.approx([node_fragmentation(n, MIXED) for n in nodes], abs=1e-9)


def test_feasible_mask_matches_fits() -> None:
    nodes = random_nodes(3)
    view = SharingClusterView.from_nodes(nodes)
    for task in [
        share(300),
        share(800, spec=("T4",)),
        whole(2),
        whole(4, cpu=9000),
        cpu_only(15000),
    ]:
        assert feasible_mask(view, task).tolist() == [fits(n, task) for n in nodes]


def test_view_round_trip() -> None:
    nodes = [node("a", (1000, 600), affinity=(("1-gpu", 2), ("share-gpu", 1))), node("b", ())]
    assert SharingClusterView.from_nodes(nodes).nodes() == tuple(nodes)


# --------------------------------------------------------------------------- policies


def cluster_abc(rank: tuple[int, ...] = (0, 1, 2)) -> SharingClusterView:
    """Three nodes: an idle 8-GPU node, a node hosting one shared task, one hosting a 1-GPU task."""
    return SharingClusterView.from_nodes(
        [
            node("idle8", (1000,) * 8, cpu_free=64_000, mem_free=262_144),
            node(
                "shared",
                (1000, 600),
                cpu_free=8000,
                cpu_cap=32_000,
                mem_free=100_000,
                mem_cap=131_072,
                affinity=(("share-gpu", 1),),
            ),
            node(
                "whole",
                (1000, 1000, 1000, 0),
                cpu_free=20_000,
                cpu_cap=32_000,
                mem_free=131_072,
                affinity=(("1-gpu", 1),),
            ),
        ],
        rank,
    )


def cluster_fgd() -> SharingClusterView:
    """P: GPUs (1000, 500); Q: two idle GPUs."""
    return SharingClusterView.from_nodes([node("P", (1000, 500)), node("Q", (1000, 1000))])


# Target workload for the FGD cases: half-GPU tasks and 1-GPU tasks, equally popular.
FGD_DIST = TypicalDistribution((TaskShape(1000, 500, 1), TaskShape(1000, 1000, 1)), (0.5, 0.5))


@dataclass(frozen=True)
class PolicyCase:
    description: str
    policy: str
    view: SharingClusterView
    task: SharingTask
    expected_node: str
    expected_gpu: tuple[int, ...] | None = None
    scores: dict[str, int] | None = None


POLICY_CASES = [
    PolicyCase(
        # (1 - (0.5*cpu_left/128000 + 0.5*gpu_left/8000)) * 100:
        # idle8: 1-(.24609+.46875)=28.5 -> 28; shared: 1-(.02734+.06875)=90.4 -> 90;
        # whole: 1-(.07422+.15625)=76.95 -> 76
        "bestfit: the tightest node for half a GPU",
        "bestfit", cluster_abc(), share(500), "shared", (1,), {"idle8": 28, "shared": 90, "whole": 76},
    ),
    PolicyCase(
        # 100*(1 - (cpu/128k*1000/128k + gpu/8k*500/8k)/2):
        # idle8: 1-(.00391+.0625)/2 -> 96; shared: 1-(.00049+.0125)/2 -> 99; whole -> 98
        "dotprod: smallest free-vs-request product",
        "dotprod", cluster_abc(), share(500), "shared", (1,), {"idle8": 96, "shared": 99, "whole": 98},
    ),
    PolicyCase(
        # share task: idle8 25 (no GPU task yet) + 0; shared 75 (only shared tasks) + 25*6400//8000=20;
        # whole 0 (other kind only) + 25*5000//8000=15
        "gpu-clustering: join the node that only hosts shared tasks",
        "gpu-clustering", cluster_abc(), share(500), "shared", (1,), {"idle8": 25, "shared": 95, "whole": 15},
    ),
    PolicyCase(
        # 1-GPU task: idle8 25; shared 0 + 20 (other kind); whole 75 + 15 = 90
        "gpu-clustering: a 1-GPU task joins the 1-GPU node",
        "gpu-clustering", cluster_abc(), whole(1), "whole", (0,), {"idle8": 25, "shared": 20, "whole": 90},
    ),
    PolicyCase(
        # idle8: 33-8 = 25; shared: uses the 600 device -> 100 - (60//10) = 94;
        # whole: must open a free device -> 50-1 = 49
        "gpu-packing: shared device first",
        "gpu-packing", cluster_abc(), share(500), "shared", (1,), {"idle8": 25, "shared": 94, "whole": 49},
    ),
    PolicyCase(
        # 1-GPU task: shared and whole both open one free device (49); idle8 25.
        # The tie goes to the lower rank: whole has rank 0 here.
        "gpu-packing: tie between used nodes broken by rank",
        "gpu-packing", cluster_abc(rank=(2, 1, 0)), whole(1), "whole", (0,),
        {"idle8": 25, "shared": 49, "whole": 49},
    ),
    PolicyCase(
        # CPU-only tasks score 0 everywhere: the lowest rank (idle8) wins
        "gpu-packing: CPU-only task goes to the lowest rank",
        "gpu-packing", cluster_abc(), cpu_only(6000), "idle8", None, {"idle8": 0, "shared": 0, "whole": 0},
    ),
    PolicyCase(
        # (cap - used_after)*100//cap per resource, averaged: idle8 (90+100)//2 = 95;
        # shared (6 + 100000*100//131072=76)//2 = 41; whole (43+100)//2 = 71
        "least-allocated: spread CPU-only work onto the emptiest node",
        "least-allocated", cluster_abc(), cpu_only(6000), "idle8", None, {"idle8": 95, "shared": 41, "whole": 71},
    ),
    PolicyCase(
        # P before: half-GPU fits (stranded 0), 1-GPU fits (stranded 500) -> F = 250.
        # P, device 1 -> (1000, 0): F = 0, delta +250 -> int(100*sigmoid(0.25)) = 56.
        # P, device 0 -> (500, 500): 1-GPU tasks no longer fit, F = 0.5*1000 = 500, delta -250 -> 43.
        # Q before F = 0; after (500, 1000): F = 0.5*500 = 250, delta -250 -> 43.
        "fgd: fill the half-used GPU, removing its stranded half",
        "fgd", cluster_fgd(), share(500), "P", (1,), {"P": 56, "Q": 43},
    ),
    PolicyCase(
        # 1-GPU task: P -> (0, 500): F stays 250 (delta 0 -> 50); Q -> (0, 1000): F stays 0 (50).
        # Tie: the lower rank (P) wins.
        "fgd: whole GPU, no change in fragmentation anywhere, tie to rank",
        "fgd", cluster_fgd(), whole(1), "P", (0,), {"P": 50, "Q": 50},
    ),
]  # fmt: skip


def _choose(
    case: PolicyCase, dist: TypicalDistribution
) -> tuple[str, tuple[int, ...] | None, dict[str, int]]:
    view = case.view
    policy = get_sharing_policy(case.policy)
    cand = np.flatnonzero(feasible_mask(view, case.task))
    fm = FragmentationModel.build(dist, view.model_names)
    res = policy.score(view, case.task, SharingContext(cand, fm, GoRand(1)))
    i = select_host(res, view.rank)
    g = int(res.gpus[list(res.nodes).index(i)])
    if not case.task.needs_gpu:
        gpus: tuple[int, ...] | None = None
    elif case.task.is_sharing and g != NO_GPU:
        gpus = (g,)
    else:
        gpus = allocate(view.node(i), case.task, policy.gpu_selection)
    scores = {view.names[j]: int(s) for j, s in zip(res.nodes, res.scores, strict=True)}
    return view.names[i], gpus, scores


@pytest.mark.parametrize("case", POLICY_CASES, ids=lambda c: c.description)
def test_policy_choice(case: PolicyCase) -> None:
    chosen, gpus, scores = _choose(case, FGD_DIST)
    if case.scores is not None:
        assert scores == case.scores
    assert chosen == case.expected_node
    assert gpus == case.expected_gpu


def test_fgd_prefers_device_that_keeps_whole_gpus() -> None:
    # Node (1000, 700), half-GPU task. Device 1 -> (1000, 200): F = 0.5*200 + 0.5*200 = 200
    # (before 0.5*0 + 0.5*700 = 350): delta +150 -> 53. Device 0 -> (500, 700): 1-GPU tasks
    # cannot fit, F = 0.5*1200 = 600: delta -250 -> 43. FGD takes device 1.
    view = SharingClusterView.from_nodes([node("n", (1000, 700))])
    fm = FragmentationModel.build(FGD_DIST, view.model_names)
    res = get_sharing_policy("fgd").score(view, share(500), SharingContext(np.array([0]), fm))
    assert res.scores.tolist() == [53]
    assert res.gpus.tolist() == [1]


def test_sigmoid_score_truncates_like_the_artifact() -> None:
    # int(100 * sigmoid(d/1000)): 0 -> 50, +40 milli -> 51 (50.9998 would be 50), -1 -> 49
    got = sigmoid_score(np.array([0.0, 39.0, 41.0, -1.0, 1e6, -1e6, np.nan]))
    assert got.tolist() == [50, 50, 51, 49, 100, 0, -1]


def test_random_policy_is_seeded_and_uniform_over_feasible() -> None:
    view = cluster_abc()
    task = share(900)  # every node has a free device
    cand = np.flatnonzero(feasible_mask(view, task))
    policy = get_sharing_policy("random")

    def picks(seed: int, n: int) -> list[int]:
        rng = GoRand(seed)
        return [
            select_host(policy.score(view, task, SharingContext(cand, rng=rng)), view.rank)
            for _ in range(n)
        ]

    assert picks(7, 50) == picks(7, 50)
    counts = np.bincount(picks(7, 3000), minlength=3)
    assert set(np.flatnonzero(counts)) == set(cand.tolist())
    assert counts[cand].min() > 800  # ~1000 each


@pytest.mark.parametrize("name", sorted(SHARING_POLICIES))
def test_every_policy_leaves_its_inputs_alone(name: str) -> None:
    view = SharingClusterView.from_nodes(random_nodes(4))
    fm = FragmentationModel.build(MIXED, view.model_names)
    snapshot = {
        f: getattr(view, f).copy()
        for f in ("gpu_free", "cpu_free", "memory_free", "affinity", "version", "rank")
    }
    policy = get_sharing_policy(name)
    for task in [share(250), whole(1), whole(2), cpu_only(2000)]:
        cand = np.flatnonzero(feasible_mask(view, task))
        cand_before = cand.copy()
        res = policy.score(view, task, SharingContext(cand, fm, GoRand(3)))
        assert res.nodes.tolist() == cand.tolist()
        assert len(res.scores) == len(cand)
        assert ((res.scores >= 0) & (res.scores <= 100)).all()
        assert (cand == cand_before).all()
    for f, arr in snapshot.items():
        assert (getattr(view, f) == arr).all(), f


@pytest.mark.parametrize("name", sorted(SHARING_POLICIES))
def test_every_policy_is_deterministic(name: str) -> None:
    view = SharingClusterView.from_nodes(random_nodes(5))
    fm = FragmentationModel.build(MIXED, view.model_names)
    policy = get_sharing_policy(name)
    cand = np.flatnonzero(feasible_mask(view, share(250)))
    a = policy.score(view, share(250), SharingContext(cand, fm, GoRand(9)))
    b = policy.score(view, share(250), SharingContext(cand, fm, GoRand(9)))
    assert a.scores.tolist() == b.scores.tolist()
    assert a.gpus.tolist() == b.gpus.tolist()


def test_registry() -> None:
    assert {"random", "dotprod", "gpu-clustering", "gpu-packing", "bestfit", "fgd"} <= set(
        SHARING_POLICIES
    )
    assert get_sharing_policy("fgd").name == "fgd"
    with pytest.raises(KeyError, match="known"):
        get_sharing_policy("nope")
    with pytest.raises(ValueError):
        register_sharing_policy("fgd")(type("Dup", (), {}))
