"""The gang benchmark runs end to end on a small fleet (the real figures come from
``topoplace bench gang-solver``)."""

from __future__ import annotations

import io

from benchmarks.micro.gang_solver import dgx_fleet, fmt_levels, run


def test_fleet_is_deterministic_and_partly_used() -> None:
    a = dgx_fleet(200, seed=5)
    b = dgx_fleet(200, seed=5)
    assert a == b
    nodes, pods = a
    assert len(nodes) == 200 and 0 < len(pods) < 200


def test_benchmark_smoke() -> None:
    out = io.StringIO()
    rows = run(sizes=[200], gangs=[8, 40], runs=2, mixed=True, out=out)
    text = out.getvalue()
    assert "CP-SAT: workers 1, seed 7" in text and "| scenario | nodes |" in text
    ours = [r for r in rows if r.policy == "topoplace"]
    assert ours and all(r.stable for r in rows)
    for r in ours:
        assert r.status in ("optimal", "feasible") if r.ok else r.reason.startswith("needs ")
    assert all(r.ok for r in ours if r.scenario == "dgx")
    policies = {r.policy for r in rows}
    assert {
        "first-fit",
        "kai-binpack",
        "kueue-bestfit",
        "kueue-balanced",
        "greedy-topology",
    } <= policies
    assert fmt_levels({"leaf": 2, "spine": 1}, {"leaf": 2, "spine": 1}, {"leaf": 2}) == (
        "leaf 2/2[2] spine 1/1"
    )
