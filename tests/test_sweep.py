"""The sweep layer: every scenario's runs give the same outputs inline, on local processes and
on a real local Ray instance.

Outputs are compared byte for byte after dropping the one measured column of each CSV
(``seconds`` in fgd-openb, ``wall_s`` in gangs; faults has none). The Ray tests start one
local instance for the module (2 CPUs, no dashboard) and skip only if Ray cannot be imported.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchmarks import registry, sweep
from benchmarks.engine.locality import POLLUX_DIR
from benchmarks.engine.scenario import parse_seeds
from benchmarks.engine.scenarios.gangs.workload import HELIOS_SUMMARY
from scheduler.cli import bench
from tests.engine.golden import csv_without
from tests.sim.synthetic import tiny_openb

HAVE_GANG_DATA = HELIOS_SUMMARY.exists() and POLLUX_DIR.exists()


def _pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


# --------------------------------------------------------------------------- executors


@pytest.mark.parametrize("workers", [1, 2])
def test_local_results_come_back_in_input_order(workers: int) -> None:
    items = ["1-3", "7", "4,5", "10-12", "2"]
    seen: list[int] = []
    with sweep.LocalExecutor(workers) as ex:
        got = ex.map(
            parse_seeds, items, order=[3, 1, 4, 0, 2], on_result=lambda i, _: seen.append(i)
        )
    assert got == [parse_seeds(x) for x in items]
    assert sorted(seen) == list(range(len(items)))
    if workers == 1:  # inline: exactly the submission order
        assert seen == [3, 1, 4, 0, 2]


def test_local_processes_are_other_processes_and_inline_is_this_one() -> None:
    pids = {pid for _, pid in sweep.LocalExecutor(2).map(_pid, [1, 2, 3, 4])}
    assert os.getpid() not in pids
    assert {pid for _, pid in sweep.LocalExecutor(1).map(_pid, [1, 2])} == {os.getpid()}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_run_raises(workers: int) -> None:
    with pytest.raises(ValueError):
        sweep.LocalExecutor(workers).map(parse_seeds, ["1", "x", "2"])


def test_order_must_be_a_permutation() -> None:
    with pytest.raises(ValueError, match="permutation"):
        sweep.LocalExecutor(1).map(parse_seeds, ["1", "2"], order=[0, 0])


def test_executor_from_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = registry.common_parser("topoplace bench faults")

    def ex(*flags: str) -> sweep.Executor:
        return sweep.from_args(parser.parse_args(["--out", "x", *flags]))

    default = ex()
    assert isinstance(default, sweep.LocalExecutor) and default.workers == (os.cpu_count() or 1)
    assert ex("--workers", "1").describe() == "1 process (inline)"
    assert ex("--workers", "3").describe() == "3 local processes"
    with pytest.raises(sweep.SweepError, match="at least 1"):
        ex("--workers", "0")
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(sweep.SweepError, match=r"pip install 'topoplace\[ray\]'"):
        ex("--ray", "local")


def test_bench_reports_a_missing_ray_as_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    args = ["--days", "0.1", "--seeds", "1", "--multipliers", "1", "--ray", "local"]
    assert registry.main(["faults", *args, "--out", str(tmp_path)]) == 2
    assert "pip install 'topoplace[ray]'" in capsys.readouterr().out


# --------------------------------------------------------------------------- scenarios


def _fgd(out: Path, flags: list[str]) -> dict[str, str]:
    """fgd-openb through ``topoplace bench``: 2 policies x 2 seeds on the tiny traces."""
    parser = argparse.ArgumentParser(prog="topoplace")
    bench.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["bench", "fgd-openb", "--data", str(tiny_openb(out.parent)),
         "--workloads", "tiny", "--policies", "fgd,bestfit", "--seeds", "42,43",
         "--expected", str(out.parent / "absent"), "--out", str(out), "--quiet", *flags]
    )  # fmt: skip
    assert args.func(args) == 0
    text = csv_without(out / "results.csv", "seconds")
    assert text.count("\n") == 5  # header + 4 runs
    return {"results.csv": text}


def _faults(out: Path, flags: list[str]) -> dict[str, str]:
    """faults: 2 health policies x 2 seeds, half a day at 20x the failure rates."""
    args = ["--days", "0.5", "--seeds", "1,2", "--multipliers", "20",
            "--policies", "topoplace", "ready-only", "--out", str(out), *flags]  # fmt: skip
    assert registry.main(["faults", *args]) == 0
    text = (out / "results.csv").read_text()
    assert text.count("\n") == 5
    return {"results.csv": text, "results.json": (out / "results.json").read_text()}


def _gangs(out: Path, flags: list[str]) -> dict[str, str]:
    """gangs: 2 policies x 2 queueing modes, one seed, 15 gangs on 2 NVL72 racks."""
    if not HAVE_GANG_DATA:
        pytest.skip("../shared/data (helios, pollux-placement-throughput) is not present")
    args = ["--clusters", "nvl72", "--nvl72-racks", "2", "--policies", "topoplace,first-fit",
            "--seeds", "1", "--jobs", "15", "--quiet", "--out", str(out), *flags]  # fmt: skip
    assert registry.main(["gangs", *args]) == 0
    text = csv_without(out / "results.csv", "wall_s")
    assert text.count("\n") == 5
    return {"results.csv": text}


SCENARIOS: dict[str, Callable[[Path, list[str]], dict[str, str]]] = {
    "fgd-openb": _fgd,
    "faults": _faults,
    "gangs": _gangs,
}


@pytest.fixture(scope="module")
def inline(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, str]]:
    """Each scenario's outputs run inline (``--workers 1``), computed once per module."""
    cache: dict[str, dict[str, str]] = {}

    def get(name: str) -> dict[str, str]:
        if name not in cache:
            cache[name] = SCENARIOS[name](
                tmp_path_factory.mktemp(f"{name}-inline") / "out", ["--workers", "1"]
            )
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_processes_give_the_inline_outputs(
    name: str, inline: Callable[[str], dict[str, str]], tmp_path: Path
) -> None:
    assert SCENARIOS[name](tmp_path / "out", ["--workers", "2"]) == inline(name)


# --------------------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def ray_local() -> Iterator[sweep.RayExecutor]:
    """One local Ray instance for the module: 2 CPUs, no dashboard, shut down at the end."""
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.skip("ray cannot be imported (pip install 'topoplace[ray]'; the test extra has it)")
    with sweep.RayExecutor("local", workers=2) as ex:
        ex.map(parse_seeds, ["1"])  # starts it: ray.init(num_cpus=2, include_dashboard=False)
        yield ex


def test_ray_results_come_back_in_input_order(ray_local: sweep.RayExecutor) -> None:
    import ray

    assert ray.cluster_resources()["CPU"] == 2
    items = ["1-3", "7", "4,5", "10-12", "2"]
    seen: list[int] = []
    got = ray_local.map(
        parse_seeds, items, order=[4, 3, 2, 1, 0], on_result=lambda i, _: seen.append(i)
    )
    assert got == [parse_seeds(x) for x in items]
    assert sorted(seen) == list(range(len(items)))
    assert ray_local.describe() == "Ray at local (2 CPUs)"
    with pytest.raises(ValueError):  # Ray's task error is also the run's exception type
        ray_local.map(parse_seeds, ["1", "x"])


def test_ray_refuses_functions_of_main(ray_local: sweep.RayExecutor) -> None:
    def run(x: str) -> list[int]:
        return parse_seeds(x)

    run.__module__ = "__main__"  # as under `python -m benchmarks...` without the re-import
    with pytest.raises(sweep.SweepError, match="__main__"):
        ray_local.map(run, ["1"])


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_ray_gives_the_inline_outputs(
    name: str,
    ray_local: sweep.RayExecutor,
    inline: Callable[[str], dict[str, str]],
    tmp_path: Path,
) -> None:
    # --ray local finds the module's instance already running and uses it (and leaves it up).
    assert SCENARIOS[name](tmp_path / "out", ["--ray", "local"]) == inline(name)
