"""The one engine reproduces the three event loops it replaced, bit for bit.

``golden.json`` holds what the pre-engine loops (``benchmarks/engine/scenarios/fgd/engine.py``,
``benchmarks/engine/scenarios/gangs/engine.py``, ``benchmarks/engine/scenarios/faults/engine.py`` at 16f44c8) produced on the
small configurations below: per FGD run a digest of the integer per-event arrays and one of
the fragmentation array, per gang run every gang's outcome (as a digest) and the run's
summary, per failure run every metric. The FGD fragmentation figures were re-recorded
when they became sums with the same bits on every CPU
(``scheduler.core.sharing.weighted_sum``; through BLAS their last bits followed the
processor's kernel); the integer figures and placements did not move.
``golden-cli/`` holds the ``results.csv`` of each scenario's command line on a tiny
configuration (measured columns dropped). Floats are compared exactly.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import registry
from benchmarks.engine.locality import POLLUX_DIR, LocalityModel, ModelFit
from benchmarks.engine.run import build, run_one
from benchmarks.engine.scenario import Scenario
from benchmarks.engine.scenarios.faults.run import faults_scenario
from benchmarks.engine.scenarios.faults.scenario import Scenario as Knobs
from benchmarks.engine.scenarios.fgd.metrics import Recorder, SimResult
from benchmarks.engine.scenarios.gangs.metrics import RunResult, summarize
from benchmarks.engine.scenarios.gangs.workload import (
    HELIOS_SUMMARY,
    ClusterSpec,
    HeliosStats,
    WorkloadSpec,
    cluster_spec,
    generate,
)
from benchmarks.engine.sources import materialize
from scheduler.cli import bench
from scheduler.core.params import GangParams, SchedParams
from tests.engine.golden import GOLDEN_CLI, csv_without
from tests.gangsim.test_engine import gang_jobs, simulate
from tests.sim.synthetic import synthetic_cluster, synthetic_tasks, tiny_openb, write_openb

HERE = Path(__file__).resolve().parent
GOLDEN: dict[str, Any] = json.loads((HERE / "golden.json").read_text())
SHARING = (
    "random",
    "dotprod",
    "gpu-clustering",
    "gpu-packing",
    "bestfit",
    "fgd",
    "least-allocated",
)


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:32]


def _sim_record(res: SimResult) -> dict[str, Any]:
    """An FGD run's record: the integer per-event arrays (what arrived, was used and left
    idle, and where every task went) and the fragmentation array each as one digest, so a
    failure says whether placements or only float sums moved."""
    return {
        "digest": _digest(
            res.arrived_gpu_milli,
            res.used_gpu_milli,
            res.idle_gpu_milli,
            res.placed,
            res.node,
        ),  # fmt: skip
        "frag_digest": _digest(res.frag_gpu_milli),
        "num_tasks": res.num_tasks,
        "num_failed": res.num_failed,
        "used_last": int(res.used_gpu_milli[-1]),
        "frag_last": float(res.frag_gpu_milli[-1]),
        "nodes_head": res.node[:40].tolist(),
    }


def _recorded(run: Scenario) -> SimResult:
    inputs = materialize(run)
    rec = Recorder(run.pod_policy, run.seed)
    build(run, inputs, [rec]).run(inputs.jobs, inputs.faults)
    return rec.result()


# ---- FGD: the artifact's arrival order and ranking, every sharing policy -------------------


@pytest.fixture(scope="module")
def synthetic_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_openb(
        tmp_path_factory.mktemp("synth"), synthetic_cluster(), synthetic_tasks(), "synth"
    )


@pytest.mark.parametrize("policy", SHARING)
def test_fgd_runs_are_the_old_loops(policy: str, synthetic_trace: Path) -> None:
    data = str(synthetic_trace)
    for seed in (42, 43):
        for tune in (1.3, 0.5):
            run = Scenario(
                "synthetic",
                nodes=({"openb": {"path": data}},),
                arrivals=(
                    {
                        "openb": {
                            "path": data,
                            "workload": "synth",
                            "order": "fgd-artifact",
                            "tune": tune,
                        }
                    },
                ),  # fmt: skip
                pod_policy=policy,
                ties="go-rank",
                rank_skip=10,
                seed=seed,
            )
            got = _sim_record(_recorded(run))
            assert got == GOLDEN["fgd"][f"{policy}/{seed}/{tune}"], (seed, tune)


@pytest.mark.parametrize("policy", SHARING)
def test_fgd_runs_with_departures_are_the_old_loops(policy: str, synthetic_trace: Path) -> None:
    want = GOLDEN["fgd_trace"][policy]
    jobs = [
        {"name": t.name, "at": c, "depart": d, "gpus": t.num_gpu, "gpu_milli": t.gpu_milli,
         "cpu": f"{t.cpu_milli}m", "memory": f"{t.memory_mib}Mi", "models": list(t.gpu_spec)}
        for t, (c, d) in zip(synthetic_tasks(80), want["times"], strict=True)
    ]  # fmt: skip
    run = Scenario(
        "trace",
        nodes=({"openb": {"path": str(synthetic_trace)}},),
        arrivals=({"jobs": jobs},),
        pod_policy=policy,
        seed=7,
    )
    assert _sim_record(_recorded(run)) == {k: v for k, v in want.items() if k != "times"}


# ---- gangs: queueing modes, locality stretch, invariants ------------------------------------

PARAMS = SchedParams(gang=GangParams(solver_time_limit_seconds=0.25, seed=7, workers=1))
MODEL = LocalityModel(
    (ModelFit("m", 1.5, {}, 2.0, "22", 1), ModelFit("n", 1.2, {}, 1.4, "11", 1)), 50.0
)
TOTAL = HeliosStats("total", 1580464, 3.716, 1.0, 6651.681, 206.0)


def _gang_record(run: RunResult, cl: ClusterSpec) -> dict[str, Any]:
    m = summarize(run, dict(zip(("local", "spine", "node"), cl.report_levels, strict=True)))
    m.pop("wall_s")
    outs = json.loads(json.dumps([
        [o.job.name, o.start, o.finish, o.slowdown, o.islands, dict(o.domains),
         dict(o.lower_bound), o.bandwidth_gbps, o.status, o.refusals]
        for o in run.outcomes
    ]))  # fmt: skip
    return json.loads(json.dumps({
        "summary": {k: (None if isinstance(v, float) and math.isnan(v) else v)
                    for k, v in m.items()},
        "outcomes_digest": hashlib.sha256(json.dumps(outs, sort_keys=True).encode()).hexdigest()[:32],
        "outcomes_head": outs[:3],
        "alloc_gpu_s": run.alloc_gpu_s, "useful_gpu_s": run.useful_gpu_s, "window": run.window,
        "makespan": run.makespan, "calls": run.calls, "refusals": run.refusals,
        "statuses": dict(run.statuses), "checks": run.checks, "params": dict(run.params),
    }))  # fmt: skip


@pytest.mark.parametrize(
    "policy",
    ["topoplace", "kai-binpack", "kueue-bestfit", "first-fit", "greedy-topology", "kueue-balanced"],
)
def test_gang_runs_are_the_old_loop(policy: str) -> None:
    cl = cluster_spec("nvl72", 2)
    jobs = gang_jobs(40, 5, preferred=True)
    for bf in (True, False):
        got = _gang_record(
            simulate(cl, jobs, policy, PARAMS, MODEL, seed=5, backfill=bf, check=True), cl
        )
        assert got == GOLDEN["gangs"][f"nvl72-hand/{policy}/{bf}"], bf


@pytest.mark.parametrize("name,units", [("nvl72", 2), ("h100", 1)])
def test_generated_gang_runs_are_the_old_loop(name: str, units: int) -> None:
    cl = cluster_spec(name, units)
    jobs = generate(cl, WorkloadSpec(jobs=60, hours=12.0, load=1.1), 2, stats=TOTAL)
    for policy in ("topoplace", "first-fit", "kai-binpack"):
        for bf in (True, False):
            got = _gang_record(
                simulate(cl, jobs, policy, PARAMS, MODEL, seed=2, backfill=bf, check=True), cl
            )
            assert got == GOLDEN["gangs"][f"{name}-gen/{policy}/{bf}"], (policy, bf)


# ---- faults: health models, recovery, placers ------------------------------------------------

SMALL = Knobs(days=2.0, racks=1, dgx_nodes=16, rate_multiplier=40.0, flap_share=0.1)
SMALL2 = Knobs(days=3.0, racks=2, dgx_nodes=8, rate_multiplier=25.0, flap_share=0.0, load=0.9)
FAULT_CASES = sorted(GOLDEN["faults"])


@pytest.mark.parametrize("key", FAULT_CASES)
def test_fault_runs_are_the_old_loop(key: str) -> None:
    which, seed, health, placer = key.split("/")
    base = SMALL if which == "small" else SMALL2
    gp = "" if placer == "greedy" else placer
    m = run_one(faults_scenario(base, [int(seed)], [1.0], [health], gp).runs()[0])
    got = json.loads(json.dumps({**asdict(m), "goodput": m.goodput}))
    # Figures added since the golden was recorded: no remediation in these runs, so no
    # eviction, and every interrupted gang freed its GPUs requeue_delay after its fault.
    assert got.pop("evicted") == 0
    assert all(abs(x - 300.0) < 1e-6 for x in got.pop("teardown_times"))
    assert got == GOLDEN["faults"][key]


# ---- the command lines, end to end ---------------------------------------------------------


def _golden_csv(name: str) -> str:
    return csv_without(GOLDEN_CLI / f"{name}.csv", None)


def test_fgd_command_line_output_is_the_old_one(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="topoplace")
    bench.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["bench", "fgd-openb", "--data", str(tiny_openb(tmp_path)),
         "--workloads", "tiny", "--policies", ",".join(SHARING), "--seeds", "42,43",
         "--expected", str(tmp_path / "absent"), "--out", str(tmp_path / "out"), "--quiet",
         "--workers", "1"]
    )  # fmt: skip
    assert args.func(args) == 0
    assert csv_without(tmp_path / "out" / "results.csv", "seconds") == _golden_csv("fgd")


def test_faults_command_line_output_is_the_old_one(tmp_path: Path) -> None:
    args = ["--days", "0.5", "--seeds", "1,2", "--multipliers", "20", "--policies",
            "topoplace", "ready-only", "kube-default", "--out", str(tmp_path), "--workers", "1"]  # fmt: skip
    assert registry.main(["faults", *args]) == 0
    assert csv_without(tmp_path / "results.csv", None) == _golden_csv("faults")


@pytest.mark.skipif(
    not (HELIOS_SUMMARY.exists() and POLLUX_DIR.exists()),
    reason="../shared/data (helios, pollux-placement-throughput) is not present",
)
def test_gangs_command_line_output_is_the_old_one(tmp_path: Path) -> None:
    args = ["--clusters", "nvl72", "--nvl72-racks", "2", "--policies", "topoplace,first-fit",
            "--seeds", "1", "--jobs", "15", "--quiet", "--out", str(tmp_path), "--workers", "1",
            "--check"]  # fmt: skip
    assert registry.main(["gangs", *args]) == 0
    assert csv_without(tmp_path / "results.csv", "wall_s") == _golden_csv("gangs")
