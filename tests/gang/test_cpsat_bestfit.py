"""CP-SAT domain best fit: a tie-break towards the tightest domain, never above the rest.

Hand-checked on GB200 NVL72 racks (18 x 4-GPU trays, rack = NVLink domain = leaf, all racks
under one spine), whole-tray members (4 GPUs), so a rack's free capacity is its free trays.
"""

from __future__ import annotations

from dataclasses import replace

from scheduler.core.gang import simple_gang
from scheduler.core.params import SchedParams
from scheduler.core.policies.common import DEFAULT_WEIGHTS
from scheduler.core.policies.registry import get_policy
from scheduler.core.schedule import PlacementResult
from tests.builders import nvl72_rack, snapshot_of

P = SchedParams()
TOPOPLACE = get_policy("topoplace")


def busy(trays: int) -> dict[int, list[int]]:
    """The first ``trays`` trays fully busy."""
    return {t: [0, 1, 2, 3] for t in range(trays)}


def plan(nodes, gang, params: SchedParams = P) -> PlacementResult:
    return TOPOPLACE(snapshot_of(nodes, (), params), gang, params)


def racks(res: PlacementResult) -> set[str]:
    return {a.node.rsplit("-t", 1)[0] for a in res.assignments}


def no_bestfit() -> SchedParams:
    return replace(P, gang=replace(P.gang, weights={"bestfit": 0}))


def three_racks() -> list:
    # rack-a: 10 free trays, rack-b: 4 free, rack-c: 18 free (untouched).
    return (
        nvl72_rack("rack-a", used=busy(8))
        + nvl72_rack("rack-b", used=busy(14))
        + nvl72_rack("rack-c")
    )


def test_required_nvlink_gang_takes_the_tightest_rack() -> None:
    # 16 GPUs = 4 trays, required nvlink-domain: all three racks fit it in one domain at
    # every level (compactness, bandwidth and health equal); rack-c is untouched
    # (fragmentation). rack-a and rack-b tie on everything else; best fit leaves 0 free
    # trays in rack-b instead of 6 in rack-a.
    gang = simple_gang("ml/train", 4, 4, required="nvlink-domain")
    res = plan(three_racks(), gang)
    assert res.ok, res.reason
    assert racks(res) == {"rack-b"}
    d = res.details
    assert d["status"] == "optimal" and d["gap"] == 0
    assert d["weights"]["bestfit"] == DEFAULT_WEIGHTS["bestfit"] == 1.0
    # Tie-break value: rack-b's coefficient round(64 * 4 / 18) = 14 at the nvlink-domain
    # level and the same at the leaf level (rack = leaf); the spine level has one domain.
    assert d["bestfit_tiebreak"] == 2 * 14
    assert d["domains_used"]["nvlink-domain"] == 1


def test_tiebreak_is_the_only_difference() -> None:
    # Without the tie-break, the main objective is the same for both partly used racks:
    # the recorded objective (tie-break excluded) does not change.
    gang = simple_gang("ml/train", 4, 4, required="nvlink-domain")
    on = plan(three_racks(), gang)
    off = plan(three_racks(), gang, no_bestfit())
    assert on.ok and off.ok
    assert on.details["objective"] == off.details["objective"]
    assert "bestfit_tiebreak" not in off.details and off.details["weights"]["bestfit"] == 0
    assert racks(off) <= {"rack-a", "rack-b"}


def test_preferred_nvlink_gang_also_takes_the_tightest_rack() -> None:
    gang = simple_gang("ml/train", 4, 4, preferred="nvlink-domain")
    res = plan(three_racks(), gang)
    assert res.ok and racks(res) == {"rack-b"}


def test_compactness_wins_over_tightness() -> None:
    # 12 trays, no constraint. rack-a 10 free, rack-b 4 free, rack-c 16 free (2 busy).
    # rack-a + rack-b (14 free, 2 left) would be tighter than rack-c alone (4 left) and
    # has a smaller tie-break (round(64*10/16) + round(64*4/16) = 40 + 16 = 56 < 64 per
    # level), but it uses two racks: compactness keeps the gang in rack-c.
    nodes = (
        nvl72_rack("rack-a", used=busy(8))
        + nvl72_rack("rack-b", used=busy(14))
        + nvl72_rack("rack-c", used=busy(2))
    )
    res = plan(nodes, simple_gang("ml/train", 12, 4))
    assert res.ok and racks(res) == {"rack-c"}
    assert res.details["domains_used"]["nvlink-domain"] == 1
    assert res.details["bestfit_tiebreak"] == 2 * 64


def test_health_wins_over_tightness() -> None:
    # rack-b (4 free) has a degraded free tray (usable, with risk); rack-a (10 free) is
    # healthy: the gang takes rack-a, tightness does not buy risk.
    nodes = (
        nvl72_rack("rack-a", used=busy(8))
        + nvl72_rack("rack-b", used=busy(14), degraded=[15])
        + nvl72_rack("rack-c")
    )
    res = plan(nodes, simple_gang("ml/train", 4, 4, required="nvlink-domain"))
    assert res.ok and racks(res) == {"rack-a"}


def test_tightest_rack_among_several_partly_used_ones() -> None:
    # Free trays 9, 7, 5, 11: an 5-tray gang needing one rack takes the 5-free rack, a
    # 6-tray one the 7-free rack.
    nodes = (
        nvl72_rack("rack-a", used=busy(9))
        + nvl72_rack("rack-b", used=busy(11))
        + nvl72_rack("rack-c", used=busy(13))
        + nvl72_rack("rack-d", used=busy(7))
    )
    res5 = plan(nodes, simple_gang("ml/a", 5, 4, required="nvlink-domain"))
    res6 = plan(nodes, simple_gang("ml/b", 6, 4, required="nvlink-domain"))
    assert racks(res5) == {"rack-c"}
    assert racks(res6) == {"rack-b"}
