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
