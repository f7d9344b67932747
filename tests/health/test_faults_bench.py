"""The failure-injection benchmark: deterministic, and topoplace never places on hardware
whose failure was already published."""

from __future__ import annotations

from benchmarks.faults.engine import health_policies, simulate, summarize
from benchmarks.faults.run import main
from benchmarks.faults.scenario import Scenario, llama3_rates

SMALL = Scenario(days=2.0, racks=1, dgx_nodes=16, rate_multiplier=40.0, flap_share=0.1)


def test_llama3_rates_are_derived_as_documented() -> None:
    gpu, node, local = llama3_rates()
    assert gpu == 419 * 0.587 / (16_384 * 54 * 24)
    assert node == (419 - 246 - 54) / (2_048 * 54 * 24)
    assert local == 91 / 256


def test_topoplace_never_places_on_signalled_failures_and_baseline_does() -> None:
    pol = health_policies()
    top = simulate(SMALL, 3, "topoplace", pol["topoplace"])
    base = simulate(SMALL, 3, "ready-only", pol["ready-only"])
    assert top.outages > 0 and top.outages == base.outages  # same ground truth
    assert top.bad_signalled == 0
    assert base.bad_signalled > 0
    assert base.gang_restarts > top.gang_restarts
    assert summarize([top])["goodput"] > summarize([base])["goodput"]
    again = simulate(SMALL, 3, "topoplace", pol["topoplace"])
    assert again == top  # deterministic for a seed


def test_run_prints_a_table_with_conditions(capsys) -> None:  # noqa: ANN001
    assert main(["--days", "0.5", "--seeds", "1", "--multipliers", "20", "--policies",
                 "topoplace", "kube-default"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "arXiv:2407.21783" in out and "| topoplace |" in out and "| kube-default |" in out
