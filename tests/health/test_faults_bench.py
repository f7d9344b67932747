"""The failure-injection benchmark: deterministic, and topoplace never places on hardware
whose failure was already published."""

from __future__ import annotations

from benchmarks.engine.run import run_one
from benchmarks.engine.scenarios.faults.metrics import Metrics, summarize
from benchmarks.engine.scenarios.faults.run import faults_scenario
from benchmarks.engine.scenarios.faults.scenario import Scenario, llama3_rates
from benchmarks.registry import main as bench

SMALL = Scenario(days=2.0, racks=1, dgx_nodes=16, rate_multiplier=40.0, flap_share=0.1)


def simulate(seed: int, policy: str) -> Metrics:
    """One run of the scenario ``SMALL`` under the health policy ``policy``."""
    m = run_one(faults_scenario(SMALL, [seed], [1.0], [policy]).runs()[0])
    assert isinstance(m, Metrics)
    return m


def test_llama3_rates_are_derived_as_documented() -> None:
    gpu, node, local = llama3_rates()
    assert gpu == 419 * 0.587 / (16_384 * 54 * 24)
    assert node == (419 - 246 - 54) / (2_048 * 54 * 24)
    assert local == 91 / 256


def test_topoplace_never_places_on_signalled_failures_and_baseline_does() -> None:
    top = simulate(3, "topoplace")
    base = simulate(3, "ready-only")
    assert top.outages > 0 and top.outages == base.outages  # same ground truth
    assert top.bad_signalled == 0
    assert base.bad_signalled > 0
    assert base.gang_restarts > top.gang_restarts
    assert summarize([top])["goodput"] > summarize([base])["goodput"]
    again = simulate(3, "topoplace")
    assert again == top  # deterministic for a seed


def test_run_prints_a_table_with_conditions(capsys, tmp_path) -> None:  # noqa: ANN001
    assert bench(["faults", "--days", "0.5", "--seeds", "1", "--multipliers", "20",
                  "--policies", "topoplace", "kube-default", "--out", str(tmp_path)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "arXiv:2407.21783" in out and "| topoplace |" in out and "| kube-default |" in out
