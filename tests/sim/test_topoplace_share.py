"""topoplace-share, our own GPU-sharing policy (scheduler/core/policies/topoplace_sharing.py).

Checks its formula on hand-built openb-shaped nodes (where it departs from FGD), that it is
deterministic and pure, that random sequences of arrivals and departures placed by it never
overcommit a GPU's share or a node's CPU or memory (hypothesis), and that the registered name
runs through ``topoplace bench fgd-openb`` on a tiny trace.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.engine.gorand import GoRand
from benchmarks.engine.jobs import job_from_task
from benchmarks.engine.ledger import SharingLedger
from benchmarks.engine.loop import Engine
from benchmarks.engine.placers import SharingPlacement
from benchmarks.engine.scenarios.fgd.metrics import Recorder
from benchmarks.engine.scenarios.fgd.policy_compare import compare
from scheduler.cli import bench
from scheduler.core.fractional import best_decision, decide, share_request, workload_distribution
from scheduler.core.model import PodInfo, PodRequest
from scheduler.core.params import SchedParams
from scheduler.core.policies.sharing_policies import (
    SHARING_POLICIES,
    SharingContext,
    get_sharing_policy,
    select_host,
)
from scheduler.core.policies.topoplace_sharing import (
    POLICY_NAME,
    choose_share,
    cpu_per_gpu_milli,
    cpu_stranded,
)
from scheduler.core.schedule import place_pod
from scheduler.core.sharing import (
    MILLI,
    FragmentationModel,
    SharingClusterView,
    SharingNode,
    SharingTask,
    TaskShape,
    TypicalDistribution,
    feasible_mask,
    typical_tasks,
)
from scheduler.core.snapshot import with_pod, without_pod
from tests.sharing.builders import share_pod
from tests.sharing.test_ledger_property import _cluster, check
from tests.sim.synthetic import synthetic_cluster, synthetic_tasks, tiny_openb

# Node shapes of the openb cluster (openb_node_list_gpu_node.csv): model, GPUs, CPU, memory.
OPENB_SHAPES = (
    ("G2", 8, 96_000, 393_216),
    ("T4", 2, 104_000, 524_288),
    ("P100", 2, 16_000, 122_880),
    ("V100M16", 1, 8_000, 32_768),
    ("V100M32", 4, 48_000, 376_832),
)


def openb_node(name: str, shape: int) -> SharingNode:
    model, gpus, cpu, mem = OPENB_SHAPES[shape]
    return SharingNode.empty(name, model, cpu, mem, gpus)


def test_registered_under_a_topoplace_name() -> None:
    assert POLICY_NAME.startswith("topoplace")
    assert SHARING_POLICIES[POLICY_NAME] is get_sharing_policy(POLICY_NAME)
    assert get_sharing_policy(POLICY_NAME).cacheable


def test_cpu_per_gpu_milli_and_stranded_gpu() -> None:
    dist = TypicalDistribution(
        (TaskShape(12_000, 1000, 1), TaskShape(4_000, 500, 1), TaskShape(16_000, 0, 0)),
        (0.5, 0.25, 0.25),
    )
    fm = FragmentationModel.build(dist, ["G2"])
    # (0.5 * 12000 + 0.25 * 4000) / (0.5 * 1000 + 0.25 * 500); the CPU-only shape is left out
    assert cpu_per_gpu_milli(fm) == pytest.approx(7000 / 625)
    rho = 12.0
    out = cpu_stranded(np.array([8000.0, 8000.0, 0.0]), np.array([24_000.0, 96_000.0, 0.0]), rho)
    assert out.tolist() == [6000.0, 0.0, 0.0]
    cpu_only = FragmentationModel.build(TypicalDistribution((TaskShape(1000, 0, 0),), (1.0,)), [])
    assert cpu_per_gpu_milli(cpu_only) == 0.0
    assert cpu_stranded(np.array([8000.0]), np.array([0.0]), 0.0).tolist() == [0.0]


def _cpu_tight_and_cpu_rich() -> tuple[SharingClusterView, FragmentationModel]:
    """A G2 node (8 GPUs) with 30 of its 96 cores left, and an idle T4 node (2 GPUs, 104
    cores). The G2 node comes first in the tie order."""
    g2 = openb_node("g2", 0)
    g2 = SharingNode(
        g2.name,
        g2.gpu_model,
        g2.cpu_milli_capacity,
        g2.memory_mib_capacity,
        g2.gpu_free_milli,
        30_000,
        g2.memory_mib_free,
    )
    view = SharingClusterView.from_nodes([g2, openb_node("t4", 1)], rank=[0, 1])
    dist = TypicalDistribution((TaskShape(12_000, 1000, 1), TaskShape(16_000, 0, 0)), (0.8, 0.2))
    return view, FragmentationModel.build(dist, view.model_names)


def test_cpu_only_task_goes_where_cpu_is_spare_where_fgd_ties() -> None:
    view, fm = _cpu_tight_and_cpu_rich()
    task = SharingTask("cpu-only", 16_000, 8_192)
    ctx = SharingContext(candidates=np.array([0, 1]), frag=fm)
    fgd = get_sharing_policy("fgd").score(view, task, ctx)
    ours = get_sharing_policy(POLICY_NAME).score(view, task, ctx)
    # FGD: the next 12-core GPU task still fits both nodes -> no fragmentation change, a tie
    # that the rank gives to the G2 node, whose 8 GPUs then have 14 cores left.
    assert fgd.scores.tolist() == [50, 50]
    assert select_host(fgd, view.rank) == 0
    # Ours: on g2 the GPU its CPU cannot feed grows from 8000 - 30000/12 = 5500 to
    # 8000 - 14000/12 = 6833.3 milli-GPU (drop -1333.3, score int(100 * sigmoid(-1.333)) = 20).
    assert ours.scores.tolist() == [20, 50]
    assert select_host(ours, view.rank) == 1
    assert choose_share(view, task, fm) is not None
    assert choose_share(view, task, fm).name == "t4"  # type: ignore[union-attr]


def test_sharing_task_takes_the_exact_best_device() -> None:
    node = openb_node("g2", 0)
    free = (1000, 1000, 1000, 1000, 1000, 1000, 200, 190)
    node = SharingNode(node.name, node.gpu_model, 96_000, 393_216, free, 96_000, 393_216)
    view = SharingClusterView.from_nodes([node])
    dist = typical_tasks(
        [SharingTask(f"a{i}", 4000, 0, 1, 160) for i in range(2)]
        + [SharingTask(f"b{i}", 4000, 0, 1, 1000) for i in range(8)]
    )
    fm = FragmentationModel.build(dist, view.model_names)
    task = SharingTask("small", 4000, 1024, 1, 160)
    got = choose_share(view, task, fm)
    assert got is not None and got.gpus == (7,)  # 190 left -> 30: the tightest gap
    res = get_sharing_policy(POLICY_NAME).score(view, task, SharingContext(np.array([0]), fm))
    per_dev = fm.delta_sharing(view.gpu_free, view.cpu_free, view.model_ids, task)[0]
    assert res.gpus.tolist() == [int(np.nanargmax(per_dev))] == [7]


def test_multi_device_fractional_task_is_scored_and_placed_best_fit() -> None:
    node = openb_node("v32", 4)
    node = SharingNode(
        node.name, node.gpu_model, 48_000, 376_832, (1000, 600, 500, 1000), 48_000, 376_832
    )
    view = SharingClusterView.from_nodes([node])
    fm = FragmentationModel.build(typical_tasks(synthetic_tasks()), view.model_names)
    got = choose_share(view, SharingTask("two-halves", 2000, 1024, 2, 500), fm)
    assert got is not None and got.gpus == (1, 2)


def test_deterministic_and_does_not_touch_its_inputs() -> None:
    nodes = [openb_node(f"n{i}", i % len(OPENB_SHAPES)) for i in range(10)]
    view = SharingClusterView.from_nodes(nodes, rank=list(range(9, -1, -1)))
    fm = FragmentationModel.build(typical_tasks(synthetic_tasks()), view.model_names)
    before = {k: getattr(view, k).copy() for k in ("gpu_free", "cpu_free", "memory_free")}
    policy = get_sharing_policy(POLICY_NAME)
    for task in synthetic_tasks(40):
        cand = np.flatnonzero(feasible_mask(view, task))
        if len(cand) == 0:
            continue
        ctx = SharingContext(candidates=cand, frag=fm)
        a, b = policy.score(view, task, ctx), policy.score(view, task, ctx)
        assert a.scores.tolist() == b.scores.tolist() and a.gpus.tolist() == b.gpus.tolist()
        assert choose_share(view, task, fm) == choose_share(view, task, fm)
    for k, arr in before.items():
        assert (getattr(view, k) == arr).all(), k


def test_nodes_in_the_same_state_score_as_when_scored_alone() -> None:
    # score() scores each distinct node state once; the answer must be the per-node one.
    nodes = [openb_node(f"n{i}", i % 3) for i in range(9)]  # three of each shape, idle
    view = SharingClusterView.from_nodes(nodes)
    view.gpu_free[3, :3] = (190, 530, 0)  # a used G2
    view.cpu_free[3] = 20_000
    view.gpu_free[6, :3] = (190, 530, 0)  # the same state as node 3
    view.cpu_free[6] = 20_000
    fm = FragmentationModel.build(typical_tasks(synthetic_tasks()), view.model_names)
    policy = get_sharing_policy(POLICY_NAME)
    for task in (
        SharingTask("share", 4000, 1024, 1, 470),
        SharingTask("whole", 12_000, 1024, 1, 1000),
        SharingTask("cpu", 16_000, 1024),
    ):
        cand = np.flatnonzero(feasible_mask(view, task))
        together = policy.score(view, task, SharingContext(cand, fm))
        alone = [policy.score(view, task, SharingContext(np.array([i]), fm)) for i in cand]
        assert together.scores.tolist() == [int(a.scores[0]) for a in alone]
        assert together.gpus.tolist() == [int(a.gpus[0]) for a in alone]
        assert len(set(together.scores.tolist())) > 1  # the states do differ


def _simulate(seed: int) -> tuple[list[int], list[int]]:
    nodes, tasks = synthetic_cluster(), synthetic_tasks()
    ledger = SharingLedger(nodes, typical_tasks(tasks), np.arange(len(nodes))[::-1].copy())
    rec = Recorder(POLICY_NAME, seed)
    placement = SharingPlacement(get_sharing_policy(POLICY_NAME), GoRand(seed), len(nodes))
    jobs = [job_from_task(t, float(i)) for i, t in enumerate(tasks)]
    Engine(ledger, placement, hooks=[rec], check=True).run(jobs)
    res = rec.result()
    return res.node.tolist(), res.used_gpu_milli.tolist()


def test_whole_run_is_deterministic() -> None:
    a, b = _simulate(42), _simulate(42)
    assert a == b
    assert max(a[1]) > 0  # it placed GPU work


# --------------------------------------------------------------------------- property


TASKS = st.one_of(
    st.builds(  # GPU-sharing
        lambda c, m, g: ("share", c, m, 1, g),
        st.sampled_from([1000, 3152, 4000, 8000, 11_908]),
        st.sampled_from([1024, 12_288, 24_576]),
        st.integers(1, MILLI - 1),
    ),
    st.builds(  # whole GPUs
        lambda c, m, n: ("whole", c, m, n, MILLI),
        st.sampled_from([4000, 12_000, 32_000]),
        st.sampled_from([16_384, 65_536]),
        st.sampled_from([1, 2, 4, 8]),
    ),
    st.builds(  # fractional on several devices
        lambda c, g: ("multi-share", c, 2048, 2, g),
        st.sampled_from([2000, 6000]),
        st.integers(100, 900),
    ),
    st.builds(  # CPU only
        lambda c, m: ("cpu", c, m, 0, 0),
        st.sampled_from([2000, 16_000, 40_000]),
        st.sampled_from([4096, 65_536]),
    ),
)
STEPS = st.lists(st.tuples(TASKS, st.integers(0, 9)), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes=st.lists(st.integers(0, len(OPENB_SHAPES) - 1), min_size=1, max_size=6), steps=STEPS)
def test_never_overcommits_a_gpu_or_a_node(shapes: list[int], steps: list) -> None:
    nodes = [openb_node(f"n{i}", s) for i, s in enumerate(shapes)]
    view = SharingClusterView.from_nodes(nodes)
    tasks = [SharingTask(f"t{i}", c, m, n, g) for i, ((_, c, m, n, g), _) in enumerate(steps)]
    fm = FragmentationModel.build(typical_tasks(tasks), view.model_names)
    placed: list[tuple[SharingTask, int, tuple[int, ...]]] = []
    for task, (_, leave) in zip(tasks, steps, strict=True):
        if leave == 0 and placed:  # a departure frees what the oldest placed task held
            gone, i, gpus = placed.pop(0)
            view.cpu_free[i] += gone.cpu_milli
            view.memory_free[i] += gone.memory_mib
            for g in gpus:
                view.gpu_free[i, g] += gone.gpu_milli
        fits_somewhere = bool(feasible_mask(view, task).any())
        got = choose_share(view, task, fm)
        assert (got is not None) == fits_somewhere
        if got is None:
            continue
        i = got.node
        assert view.names[i] == got.name
        assert len(got.gpus) == (task.num_gpu if task.needs_gpu else 0)
        assert len(set(got.gpus)) == len(got.gpus)
        assert all(0 <= g < view.gpu_count[i] for g in got.gpus)
        if task.gpu_milli == MILLI:  # a whole GPU is never one that holds a share
            assert all(view.gpu_free[i, g] == MILLI for g in got.gpus)
        view.cpu_free[i] -= task.cpu_milli
        view.memory_free[i] -= task.memory_mib
        for g in got.gpus:
            view.gpu_free[i, g] -= task.gpu_milli
        view.version[i] += 1
        placed.append((task, i, got.gpus))
        assert (view.gpu_free >= 0).all() and (view.gpu_free <= MILLI).all()
        assert (view.cpu_free >= 0).all() and (view.memory_free >= 0).all()
    # the ledger is exactly what the placed tasks hold
    used = np.zeros_like(view.gpu_free)
    for task, i, gpus in placed:
        for g in gpus:
            used[i, g] += task.gpu_milli
    cap = np.array(
        [[MILLI] * n.num_gpu + [0] * (view.gpu_free.shape[1] - n.num_gpu) for n in nodes]
    )
    assert (view.gpu_free == cap - used).all()


# --------------------------------------------------------------------------- CLI


def test_bench_cli_runs_it_on_a_tiny_trace(tmp_path: Path) -> None:
    data = tiny_openb(tmp_path)
    parser = argparse.ArgumentParser(prog="topoplace")
    bench.add_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "out"
    args = parser.parse_args(
        [
            "bench", "fgd-openb", "--workloads", "tiny",
            "--policies", f"{POLICY_NAME},fgd", "--seeds", "42,43", "--data", str(data),
            "--expected", str(tmp_path / "none"), "--out", str(out), "--quiet", "--workers", "1",
            "--compare", "fgd", POLICY_NAME,
        ]
    )  # fmt: skip
    assert args.func(args) == 0
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert sorted((r["policy"], r["seed"]) for r in rows) == [
        ("fgd", "42"), ("fgd", "43"), (POLICY_NAME, "42"), (POLICY_NAME, "43"),
    ]  # fmt: skip
    for r in rows:
        assert 0.0 < float(r["alloc_pct_at_130"]) <= 100.0
        assert float(r["seconds"]) > 0.0
    assert f"| tiny | {POLICY_NAME} |" in (out / "report.md").read_text()
    table = compare(out / "results.csv", "fgd", POLICY_NAME)
    mean = {
        p: sum(float(r["alloc_pct_at_130"]) for r in rows if r["policy"] == p) / 2
        for p in ("fgd", POLICY_NAME)
    }
    assert f"| tiny | {mean['fgd']:.2f} | {mean[POLICY_NAME]:.2f} |" in table
    assert f"| tiny | {POLICY_NAME} | " in table  # the per-seed run-time table
    assert (out / "compare.md").read_text() == table + "\n"  # --compare wrote the same


# --------------------------------------------------------------------------- live path


LIVE_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("share"),
            st.sampled_from([1000, 3000, 5000, 8000, 12000, 20000]),
            st.sampled_from([0, 10, 25, 50, 100]),
            st.integers(1, 2),
        ),
        st.tuples(st.just("whole"), st.integers(1, 4), st.just(0), st.just(0)),
        st.tuples(st.just("delete"), st.integers(0, 1000), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LIVE_OPS)
def test_extender_core_path_with_it_never_overcommits_gpu_memory_or_compute(seq: list) -> None:
    # The extender's core decision (scheduler.core.fractional.decide) with
    # sharing.policy = topoplace-share, on HAMi-registered nodes: per GPU, memory (MiB),
    # compute and split count stay within what the node registered; no GPU is both whole
    # and shared (tests/sharing/test_ledger_property.check).

    params = SchedParams.from_config({"sharing": {"policy": POLICY_NAME}})
    assert params.sharing.policy == POLICY_NAME
    snap = _cluster()
    placed = 0
    for k, (kind, a, b, c) in enumerate(seq, 1):
        if kind == "share":
            req = share_request(share_pod(f"s{k}", mem=a, cores=b, count=c), 2000, params.sharing)
            assert req is not None
            dist = workload_distribution(snap.nodes, snap.pods.values()) if snap.pods else None
            dist = dist or typical_tasks([SharingTask("x", 2000, num_gpu=1, gpu_milli=250)])
            best = best_decision(decide(snap.nodes, req, dist, params.sharing))
            if best is not None:
                info = PodInfo(key=f"t/s{k}", uid="", node=best.node, gpus=(), shares=best.shares)
                snap = with_pod(snap, info)
                placed += 1
        elif kind == "whole":
            res = place_pod(snap, PodRequest(key=f"t/w{k}", gpus=a), params)
            if res.ok:
                got = res.assignments[0]
                snap = with_pod(snap, PodInfo(key=f"t/w{k}", uid="", node=got.node, gpus=got.gpus))
        elif snap.pods:
            snap = without_pod(snap, sorted(snap.pods)[a % len(snap.pods)])
        check(snap)
    if any(op[0] == "share" for op in seq):
        assert placed > 0  # the first share always fits the empty cluster
