"""Gang workload: the Helios-derived size law, durations, determinism of the generator."""

from __future__ import annotations

import math
import random

import pytest

from benchmarks.engine.scenarios.gangs.workload import (
    HELIOS_SUMMARY,
    HeliosStats,
    WorkloadSpec,
    capped_lognormal_mean,
    cluster_spec,
    derive,
    fit_size_ratio,
    generate,
    helios_stats,
    lognormal_params,
    size_distribution,
)

needs_data = pytest.mark.skipif(
    not HELIOS_SUMMARY.exists(), reason="../shared/data/helios is not present"
)

# Row ``total`` of helios_cluster_summary.csv, by hand (for tests without the data).
TOTAL = HeliosStats("total", 1580464, 3.716, 1.0, 6651.681, 206.0)


@needs_data
def test_helios_total_row() -> None:
    assert helios_stats("total") == TOTAL
    assert helios_stats("Venus").avg_gpu_num == 6.736


def test_size_ratio_reproduces_the_mean_and_median() -> None:
    r = fit_size_ratio(TOTAL.avg_gpu_num)
    w = [r**k for k in range(10)]
    mean = sum(2**k * x for k, x in enumerate(w)) / sum(w)
    assert mean == pytest.approx(3.716, rel=1e-9)
    assert r == pytest.approx(0.4557, abs=1e-4)
    assert w[0] / sum(w) >= 0.5  # median 1 GPU, as published
    with pytest.raises(ValueError):
        fit_size_ratio(0.5)


def test_size_distribution_on_powers_of_two() -> None:
    r = fit_size_ratio(TOTAL.avg_gpu_num)
    d = size_distribution(r, 8, 512)
    assert [g for g, _ in d] == [8, 16, 32, 64, 128, 256, 512]
    assert sum(p for _, p in d) == pytest.approx(1.0)
    assert [round(p * 100, 1) for _, p in d] == [54.7, 24.9, 11.4, 5.2, 2.4, 1.1, 0.5]
    for (_, a), (_, b) in zip(d, d[1:], strict=False):
        assert b / a == pytest.approx(r)


def test_lognormal_fit_and_capped_mean() -> None:
    mu, sigma = lognormal_params(206.0, 6651.681)
    assert math.exp(mu) == pytest.approx(206.0)
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(6651.681)
    assert capped_lognormal_mean(mu, sigma, 1e30) == pytest.approx(6651.681, rel=1e-6)
    rng = random.Random(3)
    cap = 48 * 3600.0
    mc = sum(min(cap, rng.lognormvariate(mu, sigma)) for _ in range(200_000)) / 200_000
    assert capped_lognormal_mean(mu, sigma, cap) == pytest.approx(mc, rel=0.05)


def test_clusters() -> None:
    nvl, h = cluster_spec("nvl72"), cluster_spec("h100")
    assert (nvl.capacity, len(nvl.nodes()), nvl.gpus_per_pod) == (576, 144, 4)
    assert (h.capacity, len(h.nodes()), h.gpus_per_pod) == (2048, 256, 8)
    assert all("network.topology.nvidia.com/core" in n["metadata"]["labels"] for n in h.nodes())
    with pytest.raises(ValueError):
        cluster_spec("tpu")


@pytest.mark.parametrize("name", ["nvl72", "h100"])
def test_generate_is_deterministic_and_well_formed(name: str) -> None:
    cl = cluster_spec(name)
    spec = WorkloadSpec(jobs=300, hours=1000.0)
    a = generate(cl, spec, 7, TOTAL)
    assert a == generate(cl, spec, 7, TOTAL)
    assert a != generate(cl, spec, 8, TOTAL)
    assert len(a) == 300
    assert [j.arrive for j in a] == sorted(j.arrive for j in a)
    top = 256 if name == "nvl72" else 512  # at most half the cluster
    for j in a:
        assert 8 <= j.gpus <= top and j.gpus & (j.gpus - 1) == 0
        assert j.pods * j.gpus_per_pod == j.gpus and j.gpus_per_pod == cl.gpus_per_pod
        assert 1.0 <= j.duration <= 48 * 3600.0
        assert not (j.required and j.preferred)
        if j.required:
            assert j.required == cl.locality_level and j.gpus <= cl.domain_gpus
    kinds = {j.constraint for j in a}
    assert kinds == {"required", "preferred", "none"}


def test_arrival_rate_gives_the_offered_load() -> None:
    cl = cluster_spec("h100")
    spec = WorkloadSpec(jobs=10**9, hours=2000.0, load=0.5)
    d = derive(cl, spec, TOTAL)
    assert d.rate_per_hour * d.mean_gpus * d.mean_duration / 3600.0 == pytest.approx(0.5 * 2048)
    jobs = generate(cl, spec, 1, TOTAL)
    assert jobs[-1].arrive < 2000 * 3600.0
    assert len(jobs) == pytest.approx(d.rate_per_hour * 2000, rel=0.05)
    # Hours bound the arrivals; jobs bound the count.
    assert len(generate(cl, WorkloadSpec(jobs=50, hours=2000.0), 1, TOTAL)) == 50
