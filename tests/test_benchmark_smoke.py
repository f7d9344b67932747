"""A tiny run of the extender latency benchmark, so it keeps working (figures come from
``python -m benchmarks.extender_latency``, not from here)."""

from __future__ import annotations

from benchmarks import extender_latency


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
    for figures in out.values():
        assert 0 < figures["p50_ms"] <= figures["p99_ms"]
        assert figures["rps"] > 0


def test_plumbing_benchmark_drives_filter_and_bind_and_counts_connections(capsys) -> None:
    from benchmarks import plumbing

    args = ["--nodes", "40", "--pods", "12", "--warmup", "3", "--runs", "1", "--new-conn", "1"]
    assert plumbing.main(args) == 0
    assert plumbing.main([*args, "--unknown"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| /")]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert 0 < float(cells[1]) <= float(cells[2])  # median <= p99, server CPU seen
        assert cells[4] == "24"  # every request on a new connection: 2 per measured pod


def test_slice_event_benchmark_times_both_kinds(capsys) -> None:
    from benchmarks import slice_event

    assert slice_event.main(["--nodes", "6", "--events", "4", "--burst", "4"]) == 0
    out = capsys.readouterr().out
    rows = [r for r in out.splitlines() if r.startswith("| 6 |")]
    assert [r.split("|")[2].strip() for r in rows[:2]] == [
        "a device taint",
        "a device left out / back",
    ]
    burst = [c.strip() for c in rows[2].strip("|").split("|")]
    assert float(burst[1]) > 0 and burst[2] == "1"  # four changes, one rebuild
    assert int(burst[3]) > 0 and float(burst[4]) >= float(burst[5]) >= 0
    taint, device = ([c.strip() for c in r.strip("|").split("|")] for r in rows[:2])
    assert 0 <= float(taint[2]) <= float(taint[3]) and 0 < float(device[2]) <= float(device[3])
    assert taint[4] == "1"  # the last event cleared the taint: that node's health changed
    assert device[4] == "0"  # the last event put the device back: no health changed


def test_health_refresh_benchmark_times_both_cases(capsys) -> None:
    from benchmarks import health_refresh

    assert health_refresh.main(["--nodes", "12", "--runs", "2"]) == 0
    assert health_refresh.main(["--nodes", "12", "--runs", "2", "--slices"]) == 0
    out = capsys.readouterr().out
    assert "no DRA slices" in out and "one 8-GPU DRA ResourceSlice per node" in out
    rows = [r for r in out.splitlines() if r.startswith("| 12 |")]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0 and 0 <= float(cells[2]) <= float(cells[3])
        assert cells[4] == "0"  # nothing changed between refreshes
        assert float(cells[5]) >= 0


def test_parked_poll_benchmark_times_both_cases(capsys) -> None:
    from benchmarks import parked_poll

    assert parked_poll.main(["--nodes", "6", "--parked", "4", "--polls", "3"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 6 |")]
    assert [r.split("|")[3].strip() for r in rows] == ["idle", "freed", "joined"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == "4"  # every refused pod parked
        assert 0 <= float(cells[3]) <= float(cells[4])
        assert cells[5] == "4"  # three nodes freed (8, 16, 24 free GPUs): all four woken


def test_node_slices_give_every_node_its_dra_devices() -> None:
    """The benchmarks' per-node slices are a pool per node: one pool shared by every
    node's slice is incomplete (more slices than ``resourceSliceCount``), and the
    allocator, like topoplace's inventory, would use none of its devices."""
    from benchmarks.health_refresh import node_slices
    from scheduler.core import dra

    names = ["n-0", "n-1", "n-2"]
    inv = dra.inventory(node_slices(names))
    assert sorted(inv.by_node) == names
    assert all(len(inv.by_node[n]) == 8 and inv.gpus[n] == 8 for n in names)


def test_dra_latency_benchmark_times_both_verbs(capsys) -> None:
    from benchmarks import dra_latency

    assert dra_latency.main(["--nodes", "10", "--pods", "4", "--held", "0.4"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 10 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["filter", "prioritize"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert 0 < float(cells[2]) <= float(cells[3])
        # claims of 1, 2, 4, 8 GPUs: every node offered for the first three, the six
        # without a held claim for the last (median 10); filter keeps all of them
        assert cells[5] == "10" and cells[6] == "10"


def test_remediation_check_benchmark_finds_the_failed_gang(capsys) -> None:
    from benchmarks import remediation_check

    assert remediation_check.main(["--nodes", "40", "--runs", "2"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 40 ")]
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    # healthy: nothing due; node 0 failed: its pod and the 9 other members of its gang
    # (every fourth node's pod is in it); 1 % of 40 nodes is node 0 again
    assert [(c[2], c[5]) for c in cells] == [("0", "0"), ("1", "10"), ("1", "10")]
    assert all(0 <= float(c[3]) <= float(c[4]) for c in cells)
