"""The live benchmark replaying scenario files (``python -m benchmarks.live.run
--scenario-file``), without a cluster: the conversion of a file into the live arms' Node and
Pod objects (arrival order, gang annotations, departures, durations), the cap, the offline
engine on the same run, the deletions of pods that leave, and the report.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.engine.scenario import ScenarioError
from benchmarks.live.metrics import Figures, placement_figures
from benchmarks.live.offline import replay
from benchmarks.live.run import Departures, build_scenario, parse_args, render_summary
from benchmarks.live.scenario import (
    GANG_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    HOLD_GATE,
    LEAF_LABEL,
    PHASE_LABEL,
    PRODUCT_LABEL,
    RUN_LABEL,
    SPINE_LABEL,
    mix_scenario,
)
from benchmarks.live.scenariofile import (
    cap_jobs,
    engine_offline,
    load_file,
    merged_policy,
    pod_names,
)
from scheduler.cli.main import load_params
from scheduler.core.objects import TOPOLOGY_PREFERRED, TOPOLOGY_REQUIRED

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "benchmarks" / "scenarios"


def _write(tmp_path: Path, doc: dict[str, Any], name: str = "s.yaml") -> Path:
    f = tmp_path / name
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


GANGS_DOC: dict[str, Any] = {
    "name": "gangs-small",
    "description": "8 H100 nodes in two leaves, pods and gangs with lifetimes",
    "nodes": [
        {
            "fabric": {
                "count": 8,
                "gpus": 8,
                "product": "h100",
                "name": "h100-{i:04d}",
                "nodes_per_leaf": 4,
                "leaves_per_spine": 2,
            }
        }
    ],
    "arrivals": [
        # listed out of time order on purpose: the live order is by arrival time
        {"pods": {"count": 2, "gpus": 1, "name": "late-{i}", "at": 50, "every": 5, "depart": 90}},
        {
            "gangs": {
                "count": 2,
                "pods": 3,
                "gpus": 8,
                "name": "g-{i}",
                "at": 10,
                "every": 20,
                "duration": 25,
                "required": "leaf",
            }
        },
        {"pods": {"count": 1, "gpus": 4, "name": "first", "at": 0, "duration": 100}},
    ],
    "queue": "best-effort-fifo",
}


# ---- conversion ------------------------------------------------------------------------------


def test_mix_file_gives_the_builtin_mix_nodes_and_pods() -> None:
    fr = load_file(SCENARIOS / "mix.yaml")
    built = mix_scenario(500, 100, 2000)
    sc = fr.scenario
    assert not fr.timed and not sc.lifetimes and fr.cap == ""
    assert [n.name for n in sc.nodes] == [n.name for n in built.nodes]
    for a, b in zip(sc.nodes, built.nodes, strict=True):
        assert (a.gpus, a.cpu_milli, a.memory_mib, a.pods) == (
            b.gpus,
            b.cpu_milli,
            b.memory_mib,
            b.pods,
        )
        for key in (PRODUCT_LABEL, "nvidia.com/gpu.machine", LEAF_LABEL, SPINE_LABEL):
            assert a.labels.get(key) == b.labels.get(key), (a.name, key)
    assert [(p.name, p.gpus, p.cpu_milli, p.memory_mib) for p in sc.pods] == [
        (p.name, p.gpus, p.cpu_milli, p.memory_mib) for p in built.pods
    ]
    assert (sc.best_nodes_used(), sc.best_whole_free()) == (350, 150)
    # the objects the live arms create carry the same requests
    obj = sc.pods[0].to_object("livebench", "topoplace", "r")
    want = built.pods[0].to_object("livebench", "topoplace", "r")
    got_req = obj["spec"]["containers"][0]["resources"]["requests"]
    assert got_req == want["spec"]["containers"][0]["resources"]["requests"]


def test_gang_file_pods_in_arrival_order_with_gang_annotations(tmp_path: Path) -> None:
    fr = load_file(_write(tmp_path, GANGS_DOC), namespace="ns")
    sc = fr.scenario
    assert fr.timed and sc.lifetimes
    assert [p.name for p in sc.pods] == [
        "first",
        "g-0-0",
        "g-0-1",
        "g-0-2",
        "g-1-0",
        "g-1-1",
        "g-1-2",
        "late-0",
        "late-1",
    ]
    assert [p.arrive for p in sc.pods] == [0, 10, 10, 10, 30, 30, 30, 50, 55]
    assert sc.gangs() == {
        "g-0": ["g-0-0", "g-0-1", "g-0-2"],
        "g-1": ["g-1-0", "g-1-1", "g-1-2"],
    }
    g = next(p for p in sc.pods if p.name == "g-1-2")
    assert (g.gpus, g.gang_size, g.duration, g.depart, g.job) == (8, 3, 25.0, None, "g-1")
    late = sc.pods[-1]
    assert (late.depart, late.duration, late.gang) == (90.0, None, "")
    obj = g.to_object("ns", "topoplace", "run1", phase="topoplace-1")
    ann = obj["metadata"]["annotations"]
    assert ann[GANG_ANNOTATION] == "g-1" and ann[GANG_SIZE_ANNOTATION] == "3"
    assert ann[TOPOLOGY_REQUIRED] == "leaf" and TOPOLOGY_PREFERRED not in ann
    assert GANG_ANNOTATION not in sc.pods[0].to_object("ns", "s", "r")["metadata"]["annotations"]
    assert sorted(n.name for n in sc.nodes) == [f"h100-{i:04d}" for i in range(8)]
    assert {n.labels[LEAF_LABEL] for n in sc.nodes} == {"leaf-000", "leaf-001"}
    assert sc.gpu_capacity == 64 and sc.gpus_requested == 4 + 6 * 8 + 2


def test_pod_object_from_a_template_is_a_clean_create(tmp_path: Path) -> None:
    fr = load_file(_write(tmp_path, GANGS_DOC))
    spec = fr.scenario.pods[1]
    assert spec.template is not None
    before = copy.deepcopy(spec.template)
    assert before["metadata"].get("uid")  # the file's objects carry one: never sent
    obj = spec.to_object("livebench", "bench-default-100", "run7", "default-1", HOLD_GATE)
    assert spec.template == before  # not mutated
    meta = obj["metadata"]
    assert (meta["name"], meta["namespace"]) == ("g-0-0", "livebench")
    assert meta["labels"] == {RUN_LABEL: "run7", PHASE_LABEL: "default-1"}
    assert "uid" not in meta and "status" not in obj
    assert obj["spec"]["schedulerName"] == "bench-default-100"
    assert obj["spec"]["terminationGracePeriodSeconds"] == 0
    assert obj["spec"]["schedulingGates"] == [{"name": HOLD_GATE}]
    assert "priority" not in obj["spec"]  # the Priority admission plugin sets it
    assert obj["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert "schedulingGates" not in spec.to_object("ns", "s", "r")["spec"]


def test_node_object_from_a_template_is_ready_and_labelled() -> None:
    fr = load_file(SCENARIOS / "mix.yaml")
    spec = fr.scenario.nodes[0]
    before = copy.deepcopy(spec.template)
    obj = spec.to_object("run3")
    assert spec.template == before
    assert obj["metadata"]["labels"][RUN_LABEL] == "run3"
    assert obj["metadata"]["labels"][LEAF_LABEL] == "leaf-000"
    assert "uid" not in obj["metadata"]
    ready = [c for c in obj["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    assert obj["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_cap_keeps_whole_jobs_in_arrival_order(tmp_path: Path) -> None:
    fr = load_file(_write(tmp_path, GANGS_DOC), max_pods=5)
    # first (1 pod) + g-0 (3) = 4; g-1 (3 more) would exceed 5: stop there
    assert [j.name for j in fr.jobs] == ["first", "g-0"]
    assert len(fr.scenario.pods) == 4 and "first 2 of 5 jobs" in fr.cap
    fr = load_file(_write(tmp_path, GANGS_DOC), until=30)
    assert [j.name for j in fr.jobs] == ["first", "g-0", "g-1"]
    assert fr.run.horizon == 30
    with pytest.raises(ScenarioError):
        load_file(_write(tmp_path, GANGS_DOC), max_pods=0)
    jobs = fr.jobs
    assert cap_jobs(list(reversed(jobs))) == list(jobs)  # sorted by arrival


def test_file_with_faults_is_refused(tmp_path: Path) -> None:
    doc = {
        **GANGS_DOC,
        "faults": [
            {"outage": {"node": "h100-0000", "kind": "host", "start": 5, "end": 50, "detect": 6}}
        ],
    }
    with pytest.raises(ScenarioError, match="faults"):
        load_file(_write(tmp_path, doc))


def test_run_flags_build_a_file_scenario(tmp_path: Path) -> None:
    f = _write(tmp_path, GANGS_DOC)
    args = parse_args(
        ["--scenario-file", str(f), "--out", str(tmp_path / "o"), "--until", "30", "--seed", "4"]
    )
    sc = build_scenario(args)
    assert args.file_replay.run.seed == 4 and len(sc.pods) == 7
    assert "seed 4" in sc.source and str(f) in sc.source
    args = parse_args(["--out", str(tmp_path / "o"), "--nodes", "8", "--big", "1", "--small", "3"])
    assert build_scenario(args).name == "mix" and args.file_replay is None
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--time-scale", "0"])


def test_file_params_go_over_the_shipped_policy() -> None:
    shipped = {"placement_policy": "topoplace", "gang": {"plan_ttl_seconds": 60, "seed": 7}}
    got = merged_policy(shipped, {"gang": {"solver_time_limit_seconds": 0.25, "seed": 9}})
    assert got == {
        "placement_policy": "topoplace",
        "gang": {"plan_ttl_seconds": 60, "seed": 9, "solver_time_limit_seconds": 0.25},
    }
    assert shipped["gang"] == {"plan_ttl_seconds": 60, "seed": 7}
    fr = load_file(SCENARIOS / "gangs-h100.yaml", until=60)
    assert fr.params["gang"]["solver_time_limit_seconds"] == 0.25
    assert load_params(None).gang.solver_time_limit_seconds != 0.25  # so the merge matters


# ---- the offline engine on the same run ------------------------------------------------------


def test_engine_offline_on_a_mix_file_equals_the_builtin_replay(tmp_path: Path) -> None:
    doc = yaml.safe_load((SCENARIOS / "mix.yaml").read_text())
    doc["nodes"][0]["fabric"]["count"] = 40
    doc["nodes"][1]["fabric"]["count"] = 10
    doc["arrivals"][0]["pods"]["count"] = 10
    doc["arrivals"][1]["pods"]["count"] = 200
    fr = load_file(_write(tmp_path, doc))
    params = load_params(None)
    res = engine_offline(fr, params, backlog=True).offline
    assert res.source == "engine" and not res.refused and len(res.placements) == 210
    built = mix_scenario(50, 10, 200)
    nodes = [n.to_object("t") for n in built.nodes]
    pods = [p.to_object("livebench", "topoplace", "t") for p in built.pods]
    old = replay(nodes, pods, params)
    assert {k: v[0] for k, v in res.placements.items()} == {
        k: v[0] for k, v in old.placements.items()
    }
    fig = placement_figures(
        Figures("offline", 0), fr.scenario, {k: v[0] for k, v in res.placements.items()}, {}
    )
    assert (fig.nodes_used, fig.whole_nodes_free, fig.frag_free_gpus) == (35, 15, 0)


def test_engine_offline_backlog_and_timed_arrivals(tmp_path: Path) -> None:
    doc = {
        "name": "two",
        "nodes": [{"fabric": {"count": 1, "gpus": 8, "product": "h100", "name": "n-{i}"}}],
        "arrivals": [
            {"pods": {"count": 1, "gpus": 8, "name": "a", "at": 0, "duration": 10}},
            {"pods": {"count": 1, "gpus": 8, "name": "b", "at": 20, "duration": 10}},
        ],
        "queue": "reject",
    }
    fr = load_file(_write(tmp_path, doc))
    params = load_params(None)
    timed = engine_offline(fr, params, backlog=False)
    assert set(timed.offline.placements) == {"a", "b"}
    assert timed.start == {"a": 0.0, "b": 20.0}
    # as a backlog both arrive at once: b finds the node busy and the reject queue drops it
    backlog = engine_offline(fr, params, backlog=True)
    assert set(backlog.offline.placements) == {"a"}
    assert backlog.offline.refused == {"b": "rejected"}
    assert "every job at time 0" in backlog.offline.engine


def test_engine_offline_places_gangs_whole_within_a_leaf(tmp_path: Path) -> None:
    fr = load_file(_write(tmp_path, GANGS_DOC))
    res = engine_offline(fr, load_params(None), backlog=False)
    off = res.offline
    assert off.gangs == {"g-0": "placed", "g-1": "placed"}
    labels = {n.name: n.labels for n in fr.scenario.nodes}
    for gang, members in fr.scenario.gangs().items():
        nodes = [off.placements[m][0] for m in members]
        assert len(set(nodes)) == 3
        assert len({labels[n][LEAF_LABEL] for n in nodes}) == 1, gang
        assert {res.start[m] for m in members} == {10.0 if gang == "g-0" else 30.0}
    assert pod_names(fr.jobs[1]) == ["g-0-0", "g-0-1", "g-0-2"]


# ---- departures --------------------------------------------------------------------------------


class MockApi:
    """Records pod deletions (no API server)."""

    def __init__(self) -> None:
        self.deleted: list[tuple[str, str]] = []

    def delete_pod(self, ns: str, name: str) -> None:
        self.deleted.append((ns, name))


def test_departures_delete_pods_when_the_scenario_says(tmp_path: Path) -> None:
    sc = load_file(_write(tmp_path, GANGS_DOC)).scenario
    live = {p.name: f"a{i:05d}-{p.name}" for i, p in enumerate(sc.pods)}
    api = MockApi()
    deps = Departures(api, "ns", sc, live, time_scale=10.0)  # type: ignore[arg-type]
    assert deps.active
    # explicit departures (late-*, 90 s) at t0 + 9 s; durations only once bound
    t0 = time.monotonic() + 3600.0  # far ahead: nothing is due while the test looks
    with deps._cv:
        for p in deps.pods.values():
            if p.depart is not None:
                deps._push(t0 + p.depart / deps.scale, [p.name])
    assert [n for _, n in deps.planned()] == [("late-0",), ("late-1",)]
    deps.bound("first", t0)  # a single pod: its own duration, 100 s / 10
    deps.bound("g-0-0", t0 + 1)
    deps.bound("g-0-1", t0 + 2)
    assert len(deps.planned()) == 3  # the gang is not complete yet
    deps.bound("g-0-2", t0 + 4)
    plan = deps.planned()
    assert (t0 + 4 + 2.5, ("g-0-0", "g-0-1", "g-0-2")) in plan
    assert (t0 + 10.0, ("first",)) in plan
    assert deps.pending() == 6
    assert not api.deleted


def test_departures_thread_deletes_due_pods_by_their_live_names(tmp_path: Path) -> None:
    sc = load_file(_write(tmp_path, GANGS_DOC)).scenario
    live = {p.name: f"x-{p.name}" for p in sc.pods}
    api = MockApi()
    deps = Departures(api, "ns", sc, live, time_scale=1e9)  # every time is due at once
    deps.start(time.monotonic())  # late-0, late-1 (explicit departures)
    deps.bound("first", time.monotonic())
    deadline = time.monotonic() + 30
    while deps.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    deps.stop()
    assert sorted(api.deleted) == [("ns", "x-first"), ("ns", "x-late-0"), ("ns", "x-late-1")]
    assert set(deps.deleted) == {"first", "late-0", "late-1"} and not deps.errors
    with pytest.raises(ValueError):
        Departures(api, "ns", sc, live, time_scale=0)  # type: ignore[arg-type]


# ---- report ------------------------------------------------------------------------------------


def test_summary_of_a_file_with_lifetimes_names_the_engine(tmp_path: Path) -> None:
    fr = load_file(_write(tmp_path, GANGS_DOC))
    res = engine_offline(fr, load_params(None), backlog=False)
    nodes_of = {k: v[0] for k, v in res.offline.placements.items()}
    off = placement_figures(Figures("offline", 0), fr.scenario, nodes_of, {})
    off.wait_mean_scn_s = 0.0
    live = placement_figures(Figures("topoplace", 1), fr.scenario, nodes_of, {})
    live.wait_mean_scn_s = 1.5
    text = render_summary(
        fr.scenario, {"scenario": fr.scenario.source}, {"topoplace": [live]}, off, res.offline
    )
    assert "Pods leave during the run" in text and "Best possible" not in text
    assert "Offline: benchmarks.engine on s.yaml, seed 0" in text
    assert "| mean wait arrival -> bound, scenario s | 1.50 | 0 | 1.50 |" in text
    assert "| gangs complete | 2 | 2 | 0 |" in text
    assert not math.isnan(off.allocation_ratio)


def test_gang_members_are_interchangeable_when_compared_with_offline(tmp_path: Path) -> None:
    from benchmarks.live.metrics import compare_with_offline

    sc = load_file(_write(tmp_path, GANGS_DOC)).scenario
    offline = {
        "first": "h100-0000",
        "g-0-0": "h100-0004",
        "g-0-1": "h100-0005",
        "g-0-2": "h100-0006",
        "g-1-0": "h100-0001",
        "g-1-1": "h100-0002",
        "g-1-2": "h100-0003",
        "late-0": "h100-0007",
        "late-1": "h100-0007",
    }
    # g-0 on the same three nodes, members swapped: placed as offline
    live = {**offline, "g-0-0": "h100-0006", "g-0-2": "h100-0004"}
    fig = compare_with_offline(Figures("topoplace", 1), sc, live, offline)
    assert (fig.same_node_as_offline, fig.first_divergence) == (9, -1)
    # g-1 with one member elsewhere: two of its three members match, the third diverges
    live["g-1-1"] = "h100-0007"
    fig = compare_with_offline(Figures("topoplace", 1), sc, live, offline)
    assert (fig.same_node_as_offline, fig.first_divergence) == (8, 6)
    # a single pod elsewhere is compared by itself
    live["late-0"] = "h100-0005"
    fig = compare_with_offline(Figures("topoplace", 1), sc, live, offline)
    assert fig.same_node_as_offline == 7
    # a member unplaced in both counts as the same
    del live["g-1-1"]
    off = {k: v for k, v in offline.items() if k != "g-1-1"}
    fig = compare_with_offline(Figures("topoplace", 1), sc, live, off)
    assert fig.same_node_as_offline == 8
