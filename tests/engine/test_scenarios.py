"""Scenario files: the committed ones are the benchmarks' own configurations, any file runs
through ``topoplace bench FILE`` with the outputs of the command lines, the
loader rejects what it does not know, and a file replays live as Node and Pod objects."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from benchmarks.engine.locality import POLLUX_DIR
from benchmarks.engine.openb import PAPER_WORKLOADS
from benchmarks.engine.replay import GPU_MILLI_ANNOTATION, objects
from benchmarks.engine.run import run_one
from benchmarks.engine.scenario import Scenario, ScenarioError, from_mapping, load
from benchmarks.engine.scenarios.faults.run import faults_scenario
from benchmarks.engine.scenarios.faults.scenario import Scenario as Knobs
from benchmarks.engine.scenarios.fgd.run import fgd_scenario
from benchmarks.engine.scenarios.gangs.run import DEFAULT_POLICIES as GANG_POLICIES
from benchmarks.engine.scenarios.gangs.run import gang_scenario
from benchmarks.engine.scenarios.gangs.workload import HELIOS_SUMMARY, WorkloadSpec
from scheduler.cli import bench
from scheduler.core.policies.sharing_policies import SHARING_POLICIES
from tests.engine.golden import GOLDEN_CLI, csv_without
from tests.sim.synthetic import tiny_openb

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "benchmarks" / "scenarios"
HAVE_GANG_DATA = HELIOS_SUMMARY.exists() and POLLUX_DIR.exists()


def _runs(sc: Scenario) -> list[Scenario]:
    return [replace(r, name="", description="") for r in sc.runs()]


def test_committed_files_are_the_benchmarks_configurations() -> None:
    fgd = load(FILES / "fgd-openb.yaml")
    assert len(fgd.runs()) == 720  # 9 workloads x 8 registered sharing policies x 10 seeds
    assert _runs(fgd) == _runs(fgd_scenario(PAPER_WORKLOADS, list(SHARING_POLICIES), range(42, 52)))
    for cluster in ("nvl72", "h100"):
        sc = load(FILES / f"gangs-{cluster}.yaml")
        want = gang_scenario(cluster, 8, WorkloadSpec(), GANG_POLICIES, [1, 2, 3], check=True)
        assert sc.runs() == want.runs()  # names and descriptions too
    faults = load(FILES / "faults.yaml")
    assert _runs(faults) == _runs(
        faults_scenario(Knobs(days=30.0), [1, 2], [1.0, 10.0], ["topoplace", "kube-default",
                                                                 "ready-only"])
    )  # fmt: skip


def test_mix_packs_as_tightly_as_possible() -> None:
    (run,) = load(FILES / "mix.yaml").runs()
    res = run_one(run)
    assert (res.nodes, res.gpu_capacity, res.pods, res.placed_pods) == (500, 4000, 2100, 2100)
    assert (res.gpus_in_use, res.nodes_used, res.nodes_whole_free) == (2800.0, 350, 150)
    assert res.rejected_jobs == res.waiting_jobs == 0


def _bench(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="topoplace")
    bench.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", *argv])
    return int(args.func(args))


def _write(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_small_fgd_file_gives_the_command_line_output(tmp_path: Path) -> None:
    tiny_openb(tmp_path)
    doc = yaml.safe_load((FILES / "fgd-openb.yaml").read_text())
    doc["nodes"] = [{"openb": {"path": "openb-tiny"}}]  # relative to the file
    doc["arrivals"][0]["openb"]["path"] = "openb-tiny"
    # The golden output predates topoplace's own sharing policies (tests/sim/
    # test_topoplace_share.py runs those through the same command line).
    baselines = [p for p in SHARING_POLICIES if not p.startswith("topoplace")]
    doc["sweep"] = {"workload": ["tiny"], "pod_policy": baselines, "seed": "42,43"}
    f = _write(tmp_path / "fgd.yaml", doc)
    assert _bench(str(f), "--out", str(tmp_path / "out"), "--workers", "1", "--quiet") == 0  # fmt: skip
    got = csv_without(tmp_path / "out" / "results.csv", "seconds")
    assert got == csv_without(GOLDEN_CLI / "fgd.csv", "")
    assert (tmp_path / "out" / "report.md").is_file()


def test_a_small_faults_file_gives_the_command_line_output(tmp_path: Path) -> None:
    doc = yaml.safe_load((FILES / "faults.yaml").read_text())
    doc["horizon"] = "0.5d"
    doc["sweep"] = {"fault_rate": [20], "seed": "1-2",
                    "health": ["topoplace", "ready-only", "kube-default"]}  # fmt: skip
    f = _write(tmp_path / "faults.yaml", doc)
    assert _bench(str(f), "--out", str(tmp_path), "--workers", "1") == 0
    assert csv_without(tmp_path / "results.csv", "") == csv_without(GOLDEN_CLI / "faults.csv", "")


@pytest.mark.skipif(not HAVE_GANG_DATA, reason="../shared/data (helios, pollux) is not present")
def test_a_small_gang_file_gives_the_command_line_output(tmp_path: Path) -> None:
    doc = yaml.safe_load((FILES / "gangs-nvl72.yaml").read_text())
    doc["nodes"][0]["nvl72"]["racks"] = 2
    doc["arrivals"][0].update(units=2, jobs=15)
    doc["sweep"] = {"queue": ["best-effort-fifo", "strict-fifo"], "seed": 1,
                    "gang_policy": ["topoplace", "first-fit"]}  # fmt: skip
    f = _write(tmp_path / "gangs.yaml", doc)
    assert _bench(str(f), "--out", str(tmp_path), "--quiet") == 0
    assert csv_without(tmp_path / "results.csv", "wall_s") == csv_without(
        GOLDEN_CLI / "gangs.csv", ""
    )
    assert (tmp_path / "locality.png").read_bytes()[:4] == b"\x89PNG"


def test_inline_objects_jobs_and_faults(tmp_path: Path) -> None:
    """A scenario of inline pieces: a fault takes a node while a job runs on it."""
    from benchmarks.clusters import make_node

    doc = {
        "name": "inline",
        "nodes": [{"objects": [make_node("a", 8), make_node("b", 8)]}],
        "arrivals": [
            {"jobs": [{"name": "train", "at": 0, "pods": 2, "gpus": 8, "duration": 7200}]},
            {"pods": {"count": 3, "gpus": 1, "at": 10, "every": 5, "duration": 60}},
        ],
        "faults": [
            {"outage": {"node": "a", "kind": "host", "start": 3600, "end": 4000, "detect": 3640}}
        ],  # fmt: skip
        "placement": {"pods": "place-pod", "gangs": "pod-by-pod"},
        "queue": "best-effort-fifo",
        "horizon": "1d",
        "check": True,
    }
    (run,) = from_mapping(doc, tmp_path).runs()
    res = run_one(run)
    # The gang holds both nodes, so the three pods wait for it; it is interrupted at 1 h,
    # queued again at 1 h 5 min, and placed again once node a is healthy.
    assert (res.jobs, res.pods, res.placed_jobs, res.rejected_jobs) == (4, 5, 4, 0)
    assert res.wait_mean_s > 0 and res.gpus_in_use == 0.0


def test_loader_rejects_what_it_does_not_know(tmp_path: Path) -> None:
    base = {"name": "x", "nodes": [{"fabric": {"count": 1}}]}
    for bad, match in [
        ({"nmae": "x"}, "unknown keys"),
        ({"sweep": {"colour": [1]}}, "unknown axis"),
        ({"queue": "lifo"}, "queue"),
        ({"sweep": {"health": ["optimistic"]}}, "health"),
        ({"placement": {"pod": "fgd"}}, "placement"),
        ({"recovery": {"delay": 1}}, "recovery"),
        ({"horizon": "soon"}, "horizon"),
        ({"report": "pdf"}, "report"),
    ]:
        with pytest.raises(ScenarioError, match=match):
            from_mapping({**base, **bad}, tmp_path)
    with pytest.raises(ScenarioError, match="name"):
        from_mapping({"nodes": []}, tmp_path)
    with pytest.raises(ScenarioError, match="unknown source"):
        run_one(from_mapping({**base, "arrivals": [{"tasks": []}]}, tmp_path))
    with pytest.raises(ScenarioError, match="exactly one source key"):
        run_one(from_mapping({"name": "x", "nodes": [{"fabric": {}, "nvl72": {}}]}, tmp_path))


def test_a_file_replays_live_as_objects() -> None:
    live = objects(FILES / "mix.yaml", scheduler_name="topoplace")
    assert len(live.nodes) == 500 and len(live.pods) == 2100
    labels = live.nodes[0]["metadata"]["labels"]
    assert labels["network.topology.nvidia.com/leaf"] == "leaf-000"
    assert labels["network.topology.nvidia.com/spine"] == "spine-00"
    assert "network.topology.nvidia.com/leaf" not in live.nodes[400]["metadata"]["labels"]
    first, last = live.pods[0], live.pods[-1]
    assert first.pod["metadata"]["name"] == "big-0000" and last.job == "small-01999"
    assert [p.arrive for p in live.pods] == sorted(p.arrive for p in live.pods)
    assert first.pod["spec"]["schedulerName"] == "topoplace"
    assert first.pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert (first.depart, first.duration) == (None, None)


def test_gangs_and_fractions_replay_with_their_annotations(tmp_path: Path) -> None:
    doc = {
        "name": "g",
        "nodes": [{"fabric": {"count": 2}}],
        "arrivals": [
            {"gangs": {"count": 1, "pods": 2, "gpus": 4, "required": "leaf", "duration": 60}},
            {"jobs": [{"name": "share", "gpus": 1, "gpu_milli": 250, "models": ["NVIDIA-T4"]}]},
        ],
    }
    live = objects(from_mapping(doc, tmp_path))
    g0, g1, share = (p.pod for p in live.pods)
    ann = g0["metadata"]["annotations"]
    assert (g0["metadata"]["name"], g1["metadata"]["name"]) == ("gang-0000-0", "gang-0000-1")
    assert ann["topoplace.io/gang"] == "gang-0000" and ann["topoplace.io/gang-size"] == "2"
    assert ann["topoplace.io/topology-required"] == "leaf"
    assert share["metadata"]["annotations"][GPU_MILLI_ANNOTATION] == "250"
    term = share["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["NVIDIA-T4"]
    assert live.pods[0].duration == 60.0


def test_the_runner_refuses_what_a_scenario_file_sets_itself(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:  # before any run
        _bench(str(FILES / "fgd-openb.yaml"), "--seeds", "1-2")
    assert exc.value.code == 2 and "sets its own seeds" in capsys.readouterr().err
    assert _bench("no-such-benchmark") == 2
    assert "unknown benchmark 'no-such-benchmark'" in capsys.readouterr().err


def test_one_allowed_gpu_model_is_a_selector_on_snapshots(tmp_path: Path) -> None:
    doc = {
        "name": "models",
        "nodes": [
            {"fabric": {"count": 2, "product": "h100", "name": "h-{i}"}},
            {"fabric": {"count": 2, "product": "a100", "name": "a-{i}"}},
        ],  # fmt: skip
        "arrivals": [{"pods": {"count": 2, "gpus": 8, "models": ["NVIDIA-A100-SXM4-80GB"]}}],
    }
    res = run_one(from_mapping(doc, tmp_path).runs()[0])
    assert (res.placed_pods, res.nodes_used) == (2, 2)  # both A100 nodes ("a-" sorts first)
    doc["arrivals"][0]["pods"]["count"] = 3  # a third pod finds no A100 left
    assert run_one(from_mapping(doc, tmp_path).runs()[0]).rejected_jobs == 1
    doc["arrivals"][0]["pods"]["models"] = ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]
    with pytest.raises(ScenarioError, match="sharing policy"):
        run_one(from_mapping(doc, tmp_path).runs()[0])
