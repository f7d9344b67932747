"""Issue 12, finding 8: members of one gang declaring different sizes (2, then 4) are
refused with a reason instead of silently turning all-or-nothing into one-by-one binding.

Decision (documented in ``scheduler/core/gang.py``, "Declared sizes"): topoplace does not
guess. Planning the smaller size binds half of the larger gang; planning the larger waits
for pods that may not exist. Every member that comes while the declarations disagree
(pending members, or members already holding resources) is refused with the constant
reason ``REASON_GANG_SIZE_CONFLICT``; a PodGroup's minMember still decides the size when
present, but does not make disagreeing annotations acceptable.

Before the fix ``gang_request`` planned whatever size the current member declared.
"""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.gang import (
    PODGROUPS_KEY,
    REASON_GANG_SIZE_CONFLICT,
    REASON_GANG_SIZE_INVALID,
    GangSizeError,
    RecoveredPlan,
    declared_size,
    gang_request,
    gang_size,
    member_size_conflict,
    recovery_request,
)
from scheduler.core.model import MAX_GANG_SIZE
from scheduler.core.objects import request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.schedule import Assignment
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.server.extender import Extender
from tests.builders import cluster, dgx_su, gang_pod, make_node, snapshot_of

P = SchedParams()
FABRIC = P.fabric


def req(name: str, size: int | None, **kw: Any) -> Any:
    return request_from_pod(gang_pod(name, 4, "train", size, **kw), FABRIC)


def podgroup(min_member: Any) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"minMember": min_member},
    }


def test_pending_members_declaring_different_sizes_are_refused() -> None:
    with pytest.raises(GangSizeError) as err:
        gang_request([req("w-0", 2), req("w-1", 4)], size=2)
    assert err.value.reason == REASON_GANG_SIZE_CONFLICT
    with pytest.raises(GangSizeError):
        gang_size(req("w-1", 4), snapshot_of([make_node("n0")]), [req("w-0", 2)])


def test_members_without_a_size_join_the_declared_one() -> None:
    g = gang_request([req("w-0", None), req("w-1", 4)], size=0)
    assert g.size == 4 and g.member_size == 4
    assert gang_size(req("w-0", None), snapshot_of([make_node("n0")]), [req("w-1", 4)]) == 4


def test_a_member_disagreeing_with_bound_members_is_refused() -> None:
    bound = [
        gang_pod(f"w-{i}", 4, "train", 2, node="n0", gpu_indices=[4 * i + j for j in range(4)])
        for i in (0, 1)
    ]
    snap = snapshot_of([make_node("n0"), make_node("n1")], bound)
    late = req("w-2", 4)
    with pytest.raises(GangSizeError) as err:
        gang_size(late, snap, [late])
    assert err.value.reason == REASON_GANG_SIZE_CONFLICT
    # declared_size (read by recovery) never raises; a member that agrees is fine.
    assert declared_size(late, snap) == 4
    assert gang_size(req("w-2", 2), snap) == 2
    assert gang_size(req("w-2", None), snap) == 2  # takes the bound members' declaration


def test_a_podgroup_decides_the_size_but_not_disagreeing_annotations() -> None:
    snap = snapshot_of([make_node("n0")], extra={PODGROUPS_KEY: {"default/train": podgroup(6)}})
    assert gang_size(req("w-0", 3), snap, [req("w-1", 3)]) == 6  # PodGroup wins, as before
    with pytest.raises(GangSizeError):
        gang_size(req("w-0", 2), snap, [req("w-1", 4)])


@pytest.mark.parametrize("min_member", [MAX_GANG_SIZE + 1, 2**31 - 1])
def test_a_gang_above_the_limit_is_refused_and_recovery_stays_bounded(min_member: int) -> None:
    snap = snapshot_of(
        [make_node("n0")], extra={PODGROUPS_KEY: {"default/train": podgroup(min_member)}}
    )
    w = req("w-0", None)
    with pytest.raises(GangSizeError) as err:
        gang_size(w, snap)
    assert err.value.reason == REASON_GANG_SIZE_INVALID
    with pytest.raises(GangSizeError):
        gang_request([w], declared_size(w, snap))
    plan = RecoveredPlan("default/train", (Assignment("default/w-0", "n0", (0, 1, 2, 3)),), ("p",))
    assert recovery_request(plan, [w], declared_size(w, snap)) is None


@pytest.mark.parametrize("min_member", ["1e1000000", "NaN", 2**64, -3, "x"])
def test_unreadable_podgroup_sizes_are_ignored(min_member: Any) -> None:
    snap = snapshot_of(
        [make_node("n0")], extra={PODGROUPS_KEY: {"default/train": podgroup(min_member)}}
    )
    assert declared_size(req("w-0", 4), snap) == 4


def test_a_member_declaring_another_size_may_not_claim_a_live_plan_slot() -> None:
    planned = gang_request([req("w-0", 2)], size=2)
    assert member_size_conflict(planned, req("w-1", 4)) == REASON_GANG_SIZE_CONFLICT
    assert member_size_conflict(planned, req("w-1", 2)) == ""
    assert member_size_conflict(planned, req("w-1", None)) == ""


def test_through_the_extender_the_disagreeing_member_gets_the_reason() -> None:
    nodes, pods = cluster(dgx_su("su", nodes=4))
    ext = Extender(ClusterCache.from_objects(nodes, pods, P), gangs=GangRuntime())
    names = [n["metadata"]["name"] for n in nodes]
    first = ext.filter({"Pod": gang_pod("w-0", 4, "train", 2), "NodeNames": names})
    assert len(first["NodeNames"]) == 1  # a plan of 2 (w-0 and one slot)
    for name in ("w-1", "w-2", "w-3"):
        out = ext.filter({"Pod": gang_pod(name, 4, "train", 4), "NodeNames": names})
        assert out["NodeNames"] == []
        reasons = {**out["FailedNodes"], **out["FailedAndUnresolvableNodes"]}
        assert set(reasons) == set(names)
        assert set(reasons.values()) == {REASON_GANG_SIZE_CONFLICT}
