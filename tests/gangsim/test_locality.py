"""Locality model: factors hand-checked against rows of the Pollux CSVs, and the mapping of
placements to islands, bottleneck and slowdown."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.clusters import nvl72_racks
from benchmarks.engine.locality import (
    POLLUX_DIR,
    LocalityModel,
    ModelFit,
    calibrate,
    fit_model,
    load_steps,
    profile,
    ratios,
)
from scheduler.core.params import SchedParams
from scheduler.core.schedule import Assignment
from scheduler.core.snapshot import build_snapshot
from topology.fabric import Fabric

needs_data = pytest.mark.skipif(
    not (POLLUX_DIR / "bert_placements.csv").exists(),
    reason="../shared/data/pollux-placement-throughput is not present",
)

# bert_placements.csv rows (placement, local_bsz -> step_time), copied here by hand so the
# expected numbers can be checked without running the code under test.
BERT_2 = {4: 0.4736032336950302, 6: 0.586463674902916, 8: 0.7121821641921997,
          11: 0.8626803159713745, 12: 0.9190408140420914}  # fmt: skip
BERT_11 = {4: 1.2252386063337326, 6: 1.3166910409927368, 8: 1.3986895978450775,
           11: 1.4583381712436676, 12: 1.4814671874046326}  # fmt: skip
BERT_4_8 = 0.740765243768692  # placement 4, local_bsz 8
BERT_1111_8 = 1.3081524074077606  # placement 1111, local_bsz 8
BERT_22_8 = 2.0965821593999863  # placement 22, local_bsz 8


@needs_data
def test_bert_ratios_match_the_csv_rows() -> None:
    steps = load_steps("bert")
    assert steps["2"] == BERT_2
    assert steps["11"] == BERT_11
    got = ratios(steps, "11", "2")
    assert got == pytest.approx([BERT_11[b] / BERT_2[b] for b in sorted(BERT_2)])
    # README: "11 vs 2" median 1.96 for bert.
    assert statistics.median(got) == pytest.approx(BERT_11[8] / BERT_2[8])
    assert round(statistics.median(got), 2) == 1.96


@needs_data
def test_bert_fit_spread_and_cap_are_single_rows() -> None:
    fit = fit_model("bert", load_steps("bert"))
    # 15 ratios (k = 2, 3, 4 at 5 batch sizes); their median is 1111 vs 4 at local_bsz 8.
    assert fit.samples == 15
    assert fit.spread == pytest.approx(BERT_1111_8 / BERT_4_8)
    assert fit.per_k[2] == pytest.approx(BERT_11[8] / BERT_2[8])
    # The worst measured spread of <= 4 GPUs: 22 vs 4, median at local_bsz 8 (README 2.83).
    assert fit.cap_placement == "22"
    assert fit.cap == pytest.approx(BERT_22_8 / BERT_4_8)


@needs_data
def test_calibrated_model_matches_the_readme_medians() -> None:
    model = calibrate(Fabric())
    by = {f.model: f for f in model.fits}
    assert sorted(by) == ["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]
    readme_11_vs_2 = {"bert": 1.96, "cifar10": 1.02, "deepspeech2": 1.09, "imagenet": 1.18,
                      "ncf": 1.83, "yolov3": 2.01}  # fmt: skip
    for m, v in readme_11_vs_2.items():
        rs = ratios(load_steps(m), "11", "2")
        # The README takes the upper median; with an even count (imagenet: 8 batch sizes) the
        # model's median averages the two middle ratios (1.10).
        assert round(statistics.median_high(rs), 2) == v
        assert by[m].per_k[2] == pytest.approx(statistics.median(rs))
    assert model.reference_gbps == 50.0
    assert model.slowdown(2, 50.0) == pytest.approx(model.mean_spread)
    assert 1.0 < model.mean_spread < max(f.cap for f in model.fits)


def _bert_only() -> LocalityModel:
    s = BERT_1111_8 / BERT_4_8
    return LocalityModel((ModelFit("bert", s, {}, BERT_22_8 / BERT_4_8, "22", 15),), 50.0)


def test_slowdown_by_islands_and_tier() -> None:
    m = _bert_only()
    s = BERT_1111_8 / BERT_4_8
    cap = BERT_22_8 / BERT_4_8
    assert m.slowdown(1, 900.0) == 1.0  # one NVLink domain: packed
    assert m.slowdown(1, 12.5) == 1.0
    assert m.slowdown(2, 50.0) == pytest.approx(s)  # under one leaf: the measured spread
    assert m.slowdown(7, 50.0) == pytest.approx(s)  # no extrapolation in island count
    assert m.slowdown(2, 25.0) == pytest.approx(1 + (s - 1) * 2)  # spine: 2x communication
    assert m.slowdown(2, 12.5) == pytest.approx(cap)  # core: capped at the measured range
    assert m.slowdown(2, 0.0) == pytest.approx(cap)


def test_profile_of_nvl72_placements() -> None:
    params = SchedParams()
    snap = build_snapshot(nvl72_racks(5), [], params)  # racks 0-3 under spine 0, rack 4 spine 1
    m = LocalityModel((ModelFit("x", 1.5, {}, 2.0, "22", 1),), 50.0)

    def gang(*nodes: str) -> list[Assignment]:
        return [Assignment(f"p{i}", n, (0, 1, 2, 3)) for i, n in enumerate(nodes)]

    one_rack = profile(snap, gang("gb200-r000-t00", "gb200-r000-t05"), params.fabric)
    assert (one_rack.islands, one_rack.nodes, one_rack.gpus_per_node) == (1, 2, (4, 4))
    assert one_rack.bottleneck_gbps == 900.0
    assert m.of(one_rack) == 1.0
    two_racks = profile(snap, gang("gb200-r000-t00", "gb200-r001-t00"), params.fabric)
    assert two_racks.islands == 2 and two_racks.domains["spine"] == 1
    assert two_racks.bottleneck_gbps == 25.0  # racks are leaves; they meet at the spine
    assert m.of(two_racks) == pytest.approx(2.0)  # 1 + 0.5 * 50/25 = 2.0 (= cap)
    far = profile(snap, gang("gb200-r000-t00", "gb200-r004-t00"), params.fabric)
    assert far.domains["spine"] == 2 and far.domains["node"] == 2
    assert far.bottleneck_gbps == 3.125  # no core label from the builder: zone tier
    assert m.of(far) == pytest.approx(2.0)
