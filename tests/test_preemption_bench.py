"""The preemption benchmark's scenario, offline replay and figures
(benchmarks/live/preemption.py); its live arms need the control plane (``topoplace bench
live-preemption --kube-bin DIR``; figures in benchmarks/results/live-preemption.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.live.preemption import Step, build, main, offline, summarize
from scheduler.core.params import SchedParams

SP = SchedParams()


def test_the_scenario_is_a_full_cluster_and_the_same_for_a_seed() -> None:
    sc = build(3, 2, 2, 6)
    assert build(3, 2, 2, 6) == sc
    per_node: dict[str, int] = {}
    for p in sc.fill:
        per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0) + int(
            p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        )
    assert per_node == {n["metadata"]["name"]: 8 for n in sc.nodes}
    assert all(p["spec"]["priority"] < 1000 for p in sc.fill)
    assert all(p["spec"]["priority"] == 1000 and "nodeName" not in p["spec"] for p in sc.arrivals)


def test_offline_every_arrival_is_placed_and_no_gang_is_left_partly_running() -> None:
    sc = build(7, 4, 4, 12)
    steps = offline(sc, SP)
    assert offline(sc, SP) == steps  # deterministic
    fig = summarize(steps, sc.fill)
    assert fig["placed"] == 12 and fig["preemptions"] >= 1
    assert fig["gangs_left_partial"] == 0 and fig["partial_gang_gpus_max"] == 0
    assert fig["preemptions_not_used"] == 0
    # what a preemption removed is on the node the pod went to, or the rest of a gang
    gangs = {
        p["metadata"]["name"]: p["metadata"]["annotations"].get("topoplace.io/gang")
        for p in sc.fill
    }
    for s in steps:
        if s.gone:
            assert s.node in s.gone_nodes
            assert all(n in gangs for n in s.gone)


def test_a_gang_member_removed_alone_counts_its_partner_until_it_goes() -> None:
    sc = build(7, 4, 4, 2)
    a, b = sorted(
        p["metadata"]["name"] for p in sc.fill if p["metadata"]["name"].startswith("job-0")
    )
    gpus = int(
        next(p for p in sc.fill if p["metadata"]["name"] == b)["spec"]["containers"][0][
            "resources"
        ]["limits"]["nvidia.com/gpu"]
    )
    steps = [
        Step("urgent-00", 4, "", node="x", gone=[a], gone_gpus=4, gone_nodes=["x"]),
        Step("urgent-01", 4, "", node="y", gone=[b], gone_gpus=4, gone_nodes=["z"]),
    ]
    fig = summarize(steps, sc.fill)
    assert fig["partial_gang_gpus_max"] == gpus and fig["partial_gang_gpus_after_arrivals"] == gpus
    assert fig["gangs_left_partial"] == 0
    assert fig["preemptions_not_used"] == 1  # urgent-01 went to y, its victim was on z


def test_the_offline_run_writes_its_table(tmp_path: Path) -> None:
    assert (
        main(
            [
                "--offline-only",
                "--h100",
                "2",
                "--v100",
                "2",
                "--arrivals",
                "4",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    text = (tmp_path / "README.md").read_text()
    assert "| arrivals placed | 4 |" in text and "offline topoplace" in text


def test_the_latency_benchmark_runs_and_agrees_with_the_core(tmp_path) -> None:  # noqa: ANN001
    from benchmarks.micro.preemption_latency import add_arguments, run
    from benchmarks.registry import common_parser

    parser = common_parser("t")
    add_arguments(parser)
    figures = run(parser.parse_args(["--nodes", "12", "--runs", "1", "--out", str(tmp_path)]))
    rows = {r[0]: r for r in figures.rows}
    assert rows["preempt verb"][1:4] == (12, 48, 12) and rows["preempt verb"][-1] == "dgx-00001"
    assert rows["select_victims"][-1] == "dgx-00001"
    # the started preemption's search chooses the same node as the verb
    assert rows["started preemption"][1] == 12 and rows["started preemption"][3] == 12
    assert rows["started preemption"][-1] == "dgx-00001"


def test_budgets_protect_pods_offline_and_leave_the_seeds_scenario_as_it_was() -> None:
    plain, guarded = build(7, 8, 8, 24), build(7, 8, 8, 24, protected=0.2)
    assert plain.budgets == [] and len(guarded.budgets) == 1

    def unlabelled(sc: Any) -> list[Any]:
        out = json.loads(json.dumps(sc.fill))
        for p in out:
            p["metadata"].pop("labels", None)
        return out

    assert unlabelled(plain) == unlabelled(guarded) and plain.arrivals == guarded.arrivals
    protected = [p for p in guarded.fill if p["metadata"].get("labels") == {"budget": "protected"}]
    assert protected and not any(
        p["metadata"]["annotations"].get("topoplace.io/gang") for p in protected
    )
    kept = summarize(offline(guarded, SP), guarded.fill)
    blind = summarize(offline(replace(guarded, budgets=[]), SP), guarded.fill)
    assert kept["placed"] == blind["placed"] == 24
    # the engine preempts protected pods only where nothing else frees the GPUs
    assert kept["budget_violations"] < blind["budget_violations"]


def _hami_gpu(sc: Any, pod: dict[str, Any]) -> tuple[tuple[str, int], int]:
    """((node, GPU index), MiB) of a filler pod's HAMi allocation record."""
    uuid, _, mem, _ = pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"].split(",")
    node = next(n for n in sc.nodes if n["metadata"]["name"] == pod["spec"]["nodeName"])
    ids = [
        d["id"] for d in json.loads(node["metadata"]["annotations"]["hami.io/node-nvidia-register"])
    ]
    return (pod["spec"]["nodeName"], ids.index(uuid)), int(mem)


def test_the_fractional_scenario_preempts_so_that_no_gpu_is_overcommitted(tmp_path: Path) -> None:
    from benchmarks.live.preemption import SPLIT, T4_MIB, build_shares, offline_shares, policy_file

    sc = build_shares(5, 3, 8)
    assert build_shares(5, 3, 8) == sc
    per_gpu: dict[tuple[str, int], list[int]] = {}
    for p in sc.fill:
        gpu, mem = _hami_gpu(sc, p)
        per_gpu.setdefault(gpu, []).append(mem)
    # every GPU full by HAMi's split count, within its memory: any arrival preempts
    assert len(per_gpu) == 12 and all(
        len(v) == SPLIT and sum(v) <= T4_MIB for v in per_gpu.values()
    )
    policy = policy_file(tmp_path / "policy.yaml")
    steps = offline_shares(sc, policy)
    assert offline_shares(sc, policy) == steps  # deterministic
    placed = [s for s in steps if s.node]
    assert placed and all(
        s.gone and s.gone_nodes == [s.node] and len(s.gpu_set) == 1 for s in placed
    )
    # the ledger after every arrival: no GPU holds more memory than it has
    gone = {n for s in steps for n in s.gone}
    used: dict[tuple[str, int], int] = {}
    for p in sc.fill:
        if p["metadata"]["name"] not in gone:
            gpu, mem = _hami_gpu(sc, p)
            used[gpu] = used.get(gpu, 0) + mem
    asks = {
        p["metadata"]["name"]: p["spec"]["containers"][0]["resources"]["limits"]
        for p in sc.arrivals
    }
    for s in placed:
        gpu = (s.node, s.gpu_set[0])
        used[gpu] = used.get(gpu, 0) + int(asks[s.pod]["nvidia.com/gpumem"])
    assert max(used.values()) <= T4_MIB


def test_offline_topoplace_preempts_for_the_pods_kube_scheduler_sees_room_for(
    tmp_path: Path,
) -> None:
    """Seed 3 on three nodes: once a preemption leaves a free replica on a node,
    kube-scheduler's replica count passes the next large pods there and its dry run names
    no victim; only topoplace's own preemption (``preemption.start: evict``) places them."""
    from benchmarks.live.preemption import build_shares, offline_shares, policy_file

    sc = build_shares(3, 3, 8)
    started = offline_shares(sc, policy_file(tmp_path / "on.yaml"))
    verb_only = offline_shares(sc, policy_file(tmp_path / "off.yaml", preempt=False))
    assert [bool(s.node) for s in started] == [True] * 8
    assert sum(1 for s in verb_only if s.node) == 5
    # every preemption freed the GPU the pod then got
    assert all(s.gone and s.gone_nodes == [s.node] for s in started)


def test_rings_are_placed_only_by_the_preemptions_topoplace_starts() -> None:
    """``--rings``: four free GPUs on every DGX-1 but no NVLink ring. kube-scheduler's
    count passes everywhere, so it names no victim; offline with ``preemption.start:
    evict`` every arrival is placed on a ring, first by one eviction per node."""
    from benchmarks.live.preemption import build_rings, offline, summarize

    sc = build_rings(7, 4, 6)
    assert build_rings(7, 4, 6) == sc
    per_node: dict[str, list[int]] = {}
    for p in sc.fill:
        rec = json.loads(p["metadata"]["annotations"]["topoplace.io/placement"])
        per_node.setdefault(p["spec"]["nodeName"], []).extend(rec["gpus"])
    assert all(len(v) == 4 for v in per_node.values()) and len(per_node) == 4
    steps = offline(sc, SP)
    assert [bool(s.node) for s in steps] == [True] * 6
    # the cheapest node first: the three nodes where one pod frees a ring, then the one
    # where two do, then the emptied ones again
    assert [(s.node, len(s.gone)) for s in steps] == [
        ("v100-01", 1),
        ("v100-02", 1),
        ("v100-03", 1),
        ("v100-00", 2),
        ("v100-03", 3),
        ("v100-00", 2),
    ]
    assert all(s.gone_nodes == [s.node] for s in steps)
    off = offline(sc, SchedParams.from_config({"preemption": {"start": "off"}}))
    assert summarize(off, sc.fill)["placed"] == 0


def test_tp_gangs_are_placed_only_by_the_preemptions_topoplace_starts_for_gangs(
    tmp_path: Path,
) -> None:
    """``--tp-gangs``: four free GPUs on every DGX H100, arrivals of 2-member gangs that
    must share a node. Every member passes kube-scheduler's count, so it preempts for
    none; offline, topoplace's own extender with ``preemption.start: evict`` places every
    gang whole on one node, evicting pods of lower priority only, none a budget protects;
    with ``off`` none is placed."""
    from benchmarks.live.preemption import (
        PRIORITIES,
        _protected,
        _whole_policy,
        build_tp_gangs,
        offline_gangs,
        summarize,
        units,
    )

    sc = build_tp_gangs(7, 6, 4, protected=0.2)
    assert build_tp_gangs(7, 6, 4, protected=0.2) == sc
    held: dict[str, list[int]] = {}
    for p in sc.fill:
        rec = json.loads(p["metadata"]["annotations"]["topoplace.io/placement"])
        held.setdefault(p["spec"]["nodeName"], []).extend(rec["gpus"])
    assert len(held) == 6 and all(len(v) == 4 for v in held.values())
    assert [len(u) for u in units(sc.arrivals)] == [2, 2, 2, 2]
    steps = offline_gangs(sc, _whole_policy(tmp_path / "on.yaml", True))
    # No node frees with low pods alone (each node with only low pods has a protected
    # one), so mid pods go: the cheapest node first (one mid pod), then the node with one
    # mid and two low, then two mid and one low; the fourth gang finds only nodes holding
    # a protected pod and evicts nothing.
    assert [(s.pod, s.node, s.gone) for s in steps] == [
        ("tp-00", "h100-04", ["fill-013"]),
        ("tp-01", "h100-02", ["fill-007", "fill-008", "fill-009"]),
        ("tp-02", "h100-03", ["fill-010", "fill-011", "fill-012"]),
        ("tp-03", None, []),
    ]
    by_name = {p["metadata"]["name"]: p for p in sc.fill}
    for s in steps[:3]:
        assert sorted(s.gpu_set) == list(range(8)) and s.gone_nodes == [s.node]
        assert all(
            by_name[n]["spec"]["priority"] < PRIORITIES["high"] and not _protected(by_name[n])
            for n in s.gone
        )
    assert all(
        any(_protected(p) for p in sc.fill if p["spec"]["nodeName"] == n)
        for n in ("h100-00", "h100-01", "h100-05")
    )
    assert summarize(steps, sc.fill)["budget_violations"] == 0
    off = offline_gangs(sc, _whole_policy(tmp_path / "off.yaml", False))
    assert summarize(off, sc.fill)["placed"] == 0 and all(not s.gone for s in off)
