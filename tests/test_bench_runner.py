"""``topoplace bench``: the list names every benchmark, every name has its results file,
and one offline and one micro benchmark run through the runner end to end (seconds)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from benchmarks import registry
from scheduler.cli.main import main as topoplace

OFFLINE = {"fgd-openb", "gangs", "faults", "rightsize"}
MICRO = {"pod-path", "extender-latency", "gang-solver", "topology", "verb-cost",
         "preemption-latency", "sharing-latency", "background-cpu", "memory", "ui-render"}  # fmt: skip
LIVE = {"live-mix", "live-dra", "live-fractional", "live-faults", "live-preemption", "live-chaos",
        "live-soak"}  # fmt: skip


def test_the_registry_holds_exactly_the_named_benchmarks() -> None:
    kinds = {n: b.kind for n, b in registry.BENCHMARKS.items()}
    assert kinds == {**dict.fromkeys(OFFLINE, "offline"), **dict.fromkeys(MICRO, "micro"),
                     **dict.fromkeys(LIVE, "live")}  # fmt: skip


def test_list_names_every_benchmark_and_its_results_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert topoplace(["bench", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = {line.split()[0]: line for line in lines[1:]}
    for name, b in registry.BENCHMARKS.items():
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name)
        assert b.results_file == registry.RESULTS_DIR / f"{name}.md"
        assert listed[name].split()[1] == b.kind
        assert listed[name].endswith(f"->  benchmarks/results/{name}.md")
    # every scenario file is listed too, under its stem or (a registered name) its path
    for path in sorted((registry.REPO / "benchmarks" / "scenarios").glob("*.yaml")):
        key = (
            path.stem
            if path.stem not in registry.BENCHMARKS
            else f"benchmarks/scenarios/{path.name}"
        )
        assert key in listed and listed[key].split()[1] == "offline"


def test_a_common_flag_a_benchmark_does_not_take_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        registry.main(["gangs", "--runs", "3", "--out", "/nonexistent"])
    assert exc.value.code == 2 and "gangs does not take --runs" in capsys.readouterr().err
    assert registry.BENCHMARKS["live-dra"].takes() == {"runs", "kube_bin"}
    assert "seeds" in registry.BENCHMARKS["live-mix"].takes()  # translated to its --seed


def test_a_live_benchmark_needs_the_kubernetes_binaries() -> None:
    with pytest.raises(SystemExit) as exc:
        registry.main(["live-dra", "--out", "/nonexistent"])
    assert exc.value.code == 2


def test_an_offline_benchmark_through_the_runner(tmp_path: Path) -> None:
    out = tmp_path / "faults"
    argv = ["bench", "faults", "--days", "0.5", "--seeds", "1", "--multipliers", "20",
            "--policies", "topoplace", "ready-only", "--workers", "1", "--out", str(out),
            "--quiet"]  # fmt: skip
    assert topoplace(argv) == 0
    with (out / "figures.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["multiplier"], r["policy"]) for r in rows] == [("20.0", "topoplace"),
                                                              ("20.0", "ready-only")]  # fmt: skip
    top, ready = rows
    # topoplace never places on hardware whose failure was signalled; Ready-only does
    assert float(top["placed on signalled-failed HW"]) == 0
    assert float(ready["placed on signalled-failed HW"]) > 0
    assert 0 < float(ready["goodput"]) < float(top["goodput"]) <= 1
    assert (out / "report.md").is_file() and (out / "results.csv").is_file()
    assert "conditions: days: 0.5; seeds: 1" in (out / "figures.md").read_text()


def test_a_micro_benchmark_writes_its_results_file(tmp_path: Path) -> None:
    results = tmp_path / "results"
    argv = ["--nodes", "20", "--pods", "30", "--runs", "2", "--out", str(tmp_path / "o"),
            "--write-results"]  # fmt: skip
    assert registry.run("pod-path", argv, results_dir=results) == 0
    with (results / "pod-path.csv").open() as f:
        rows = {r["stage"]: r for r in csv.DictReader(f)}
    stages = ["watch ADDED", "filter", "bind", "watch MODIFIED", "all stages (sum of means)",
              "  of which: decision record", "  of which: why line",
              "explain the record (on request)"]  # fmt: skip
    assert list(rows) == stages
    for stage in ("watch ADDED", "filter", "bind", "watch MODIFIED"):
        assert 0 <= float(rows[stage]["median ms"]) <= float(rows[stage]["p99 ms"]) < 1000
        assert len(rows[stage]["run means ms"].split(", ")) == 2  # one mean per run
    assert float(rows["filter"]["median ms"]) > 0  # filter does the placing: never free
    md = (results / "pod-path.md").read_text()
    assert md.startswith("# pod-path\n")
    assert "```bash\ntopoplace bench pod-path --nodes 20 --pods 30 --runs 2\n```" in md
    for condition in ("nodes: 20", "pods per run: 30", "runs: 2", "machine: ", "commit: "):
        assert condition in md
    assert "| stage | median ms | p99 ms | run means ms |" in md
    assert md.endswith("The numbers: [pod-path.csv](pod-path.csv).\n")
