"""Tiny runs of the micro benchmarks, so they keep working (figures come from
``topoplace bench NAME``, not from here). Each run goes through the module's own flags as
the runner parses them and asserts on the figures it returns."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from benchmarks import registry
from benchmarks.micro import extender_latency


def figures(name: str, tmp: Path, *argv: str) -> registry.Figures:
    """Benchmark ``name``'s figures for ``argv`` (its flags and the common ones)."""
    mod = importlib.import_module(registry.BENCHMARKS[name].module)
    parser = registry.common_parser(name)
    mod.add_arguments(parser)
    out = mod.run(parser.parse_args([*argv, "--out", str(tmp)]))
    assert isinstance(out, registry.Figures)
    assert all(len(r) == len(out.columns) for r in out.rows)
    return out


def rows(fig: registry.Figures) -> list[dict[str, Any]]:
    """The figures' rows as column -> value."""
    return [dict(zip(fig.columns, r, strict=True)) for r in fig.rows]


def test_latency_benchmark_runs_every_case_over_real_http() -> None:
    out = extender_latency.run_size(60, requests=20, full_nodes=True)
    cases = {
        f"{prefix}{verb}/{mode}"
        for prefix in ("", "floor-")
        for verb, mode in (
            ("filter", "NodeNames"),
            ("prioritize", "NodeNames"),
            ("filter", "NodeNames-shuffled"),
            ("prioritize", "NodeNames-shuffled"),
            ("filter", "Nodes"),
        )
    }
    assert set(out) == cases
    for f in out.values():
        assert 0 < f["p50_ms"] <= f["p99_ms"]
        assert f["rps"] > 0


def test_plumbing_drives_filter_and_bind_and_counts_connections(tmp_path: Path) -> None:
    args = ["--kind", "plumbing", "--nodes", "40", "--pods", "12", "--warmup", "3",
            "--runs", "1", "--new-conn", "1"]  # fmt: skip
    for extra in ([], ["--unknown"]):
        (row,) = rows(figures("extender-latency", tmp_path, *args, *extra))
        assert 0 < row["median ms"] <= row["p99 ms"]  # server CPU seen
        assert row["connections opened"] == "24"  # every request new: 2 per measured pod


def test_slice_events_time_both_kinds(tmp_path: Path) -> None:
    fig = figures("verb-cost", tmp_path, "--kind", "slices", "--nodes", "6", "--events", "4",
                  "--burst", "4")  # fmt: skip
    taint, device = rows(fig)
    assert (taint["event"], device["event"]) == ("a device taint", "a device left out / back")
    assert 0 <= taint["median ms"] <= taint["p99 ms"]
    assert 0 < device["median ms"] <= device["p99 ms"]
    # the last event cleared the taint: that node's health changed; the device came back
    assert taint["nodes whose health the last event changed"] == 1
    assert device["nodes whose health the last event changed"] == 0
    (burst,) = fig.notes
    assert "4 slices" in burst and "1 rebuild(s)" in burst  # four changes, one rebuild


def test_verb_cost_times_every_pod_kind(tmp_path: Path) -> None:
    # 20 nodes, 8 holding 4 GPUs: 12 wholly free, room for the two gangs of 4 x 8 GPUs
    fig = figures("verb-cost", tmp_path, "--nodes", "20", "--pods", "8", "--held", "0.4",
                  "--runs", "1")  # fmt: skip
    by_kind = {r["pod kind"]: r for r in rows(fig)}
    assert list(by_kind) == ["whole GPU", "gang member", "HAMi share", "DRA claim"]
    for r in by_kind.values():
        assert 0 < r["filter median"] <= r["filter p99"]
        assert 0 < r["prioritize median"] <= r["prioritize p99"]
        assert r["both median"] <= r["both p99"]
    # claims of 1, 2, 4, 8 GPUs: every node offered for the first three, the twelve
    # without a held claim for the last (median 20); filter answers the chosen one
    assert by_kind["DRA claim"]["nodes offered (median)"] == 20
    assert by_kind["DRA claim"]["kept (median)"] == 1
    # the other kinds are offered every node; filter answers the chosen one
    assert by_kind["whole GPU"]["nodes offered (median)"] == 20
    assert by_kind["whole GPU"]["kept (median)"] == 1
    # a gang's first member plans the gang, its mates find the plan: p99 well above median
    assert by_kind["gang member"]["filter p99"] > 2 * by_kind["gang member"]["filter median"]


def test_background_loops_time_every_case(tmp_path: Path) -> None:
    fig = figures("background-cpu", tmp_path, "--nodes", "40", "--parked", "4",
                  "--polls", "3", "--runs", "2")  # fmt: skip
    by = {(r["loop"], r["case"]): r for r in rows(fig)}
    refresh = by[("health refresh", "next 2")]
    assert 0 <= refresh["median ms"] <= refresh["p99 ms"]
    assert refresh["detail"] == "nodes changed by the last: 0"  # nothing changed
    assert by[("health refresh", "first after the list")]["median ms"] > 0
    for case in ("idle", "freed", "joined"):
        r = by[("parked poll", f"4 parked, {case}")]
        assert 0 <= r["median ms"] <= r["p99 ms"]
        # three nodes freed (8, 16, 24 free GPUs): all four woken
        assert r["detail"] == "woken over the freed polls: 4"
    # healthy: nothing due; node 0 failed: its pod and the 9 other members of its gang
    # (every fourth node's pod is in it); 1 % of 40 nodes is node 0 again
    due = [r["detail"] for r in rows(fig) if r["loop"] == "remediation check"]
    assert due == ["40 pods, 0 due", "40 pods, 10 due", "40 pods, 10 due"]


def test_health_refresh_with_slices(tmp_path: Path) -> None:
    fig = figures("background-cpu", tmp_path, "--kind", "health", "--nodes", "12",
                  "--runs", "2", "--slices")  # fmt: skip
    first = rows(fig)[0]
    assert first["detail"] == "with DRA slices" and first["median ms"] > 0


def test_node_slices_give_every_node_its_dra_devices() -> None:
    """The benchmarks' per-node slices are a pool per node: one pool shared by every
    node's slice is incomplete (more slices than ``resourceSliceCount``), and the
    allocator, like topoplace's inventory, would use none of its devices."""
    from benchmarks.clusters import node_slices
    from scheduler.core import dra

    names = ["n-0", "n-1", "n-2"]
    inv = dra.inventory(node_slices(names))
    assert sorted(inv.by_node) == names
    assert all(len(inv.by_node[n]) == 8 and inv.gpus[n] == 8 for n in names)
