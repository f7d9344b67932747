"""Gang membership, roles, declared sizes, slots and plan ids (pure core)."""

from __future__ import annotations

import pytest

from scheduler.core.gang import (
    GangRequest,
    declared_size,
    gang_request,
    is_placeholder,
    parse_reservation_key,
    placeholder,
    plan_id,
    reservation_key,
    role_name,
    simple_gang,
)
from scheduler.core.model import RESERVATION_PREFIX
from scheduler.core.objects import request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.schedule import Assignment
from tests.builders import gang_pod, make_node, snapshot_of

FABRIC = SchedParams().fabric


def req(pod):
    return request_from_pod(pod, FABRIC)


@pytest.mark.parametrize(
    ("key", "expect"),
    [
        ("topoplace", "team/train"),
        ("coscheduling", "team/train"),
        ("volcano", "team/train"),
        ("kai", "team/train"),
    ],
    ids=["topoplace annotation", "scheduler-plugins label", "volcano annotation", "kai label"],
)
def test_membership_from_every_convention(key: str, expect: str) -> None:
    r = req(gang_pod("w-0", 8, "train", namespace="team", key=key))
    assert r.gang == expect


def test_declared_size_prefers_podgroup_min_member() -> None:
    pod = gang_pod("w-0", 8, "train", 3, key="coscheduling")
    podgroup = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"minMember": 6},
    }
    snap = snapshot_of([make_node("n0")], extra={"podgroups": {"default/train": podgroup}})
    assert declared_size(req(pod), snap) == 6
    # Volcano's field name, and the annotation as fallback when no PodGroup is known.
    podgroup["spec"] = {"minAvailable": 5}
    snap = snapshot_of([make_node("n0")], extra={"podgroups": {"default/train": podgroup}})
    assert declared_size(req(pod), snap) == 5
    assert declared_size(req(pod), snapshot_of([make_node("n0")])) == 3
    assert declared_size(req(gang_pod("w-0", 8, "train")), snapshot_of([make_node("n0")])) == 0


def test_roles_by_annotation_and_by_shape() -> None:
    launcher = req(gang_pod("launcher", 0, "mpi", 5, role="launcher", cpu="4", memory="8Gi"))
    w = [req(gang_pod(f"w-{i}", 8, "mpi", 5)) for i in range(2)]
    g = gang_request([w[1], launcher, w[0]], size=5)
    assert [r.name for r in g.roles] == ["8gpu-8cpu-64Gi", "launcher"]
    workers, launch = g.roles
    # Two members are unseen: they are planned with the role of the first member seen
    # (w-1, a worker), so the plan holds 4 workers and 1 launcher.
    assert workers.count == 4 and workers.members == ("default/w-0", "default/w-1")
    assert launch.count == 1 and launch.members == ("default/launcher",)
    assert launch.gpus == 0 and launch.cpu_milli == 4000
    assert g.size == 5
    # Seen in another order, the launcher's role completes the gang instead.
    g2 = gang_request([launcher, *w], size=5)
    assert [r.count for r in g2.roles] == [2, 3]


def test_unseen_members_take_the_first_members_shape() -> None:
    w0 = req(gang_pod("w-0", 4, "train", 16, required="nvlink-domain"))
    g = gang_request([w0], size=16)
    assert g.size == 16 and len(g.roles) == 1
    role = g.roles[0]
    assert role.gpus == 4 and role.members == ("default/w-0",)
    assert g.topology.required == "nvlink-domain"
    slots = g.slots()
    assert slots[0][2] == "default/w-0"
    assert all(is_placeholder(p) for _, _, p in slots[1:])
    assert slots[1][2] == placeholder("default/train", f"{role.name}-1")


def test_size_counts_fixed_members() -> None:
    w = [req(gang_pod(f"w-{i}", 8, "train", 4)) for i in (2, 3)]
    fixed = [
        Assignment("default/w-0", "n0", tuple(range(8))),
        Assignment("default/w-1", "n1", tuple(range(8))),
    ]
    g = gang_request(w, size=4, fixed=fixed)
    assert g.size == 2 and len(g.fixed) == 2


def test_gang_request_rejects_mixed_gangs() -> None:
    with pytest.raises(ValueError, match="different gangs"):
        gang_request([req(gang_pod("a", 1, "x")), req(gang_pod("b", 1, "y"))])
    with pytest.raises(ValueError, match="at least one member"):
        gang_request([])


def test_reservation_keys_round_trip() -> None:
    key = reservation_key("ns/train", "worker-3")
    assert key.startswith(RESERVATION_PREFIX)
    assert key == f"{RESERVATION_PREFIX}ns/train#worker-3"
    assert parse_reservation_key(key) == ("ns/train", "worker-3")
    assert parse_reservation_key("ns/pod") is None


def test_plan_id_is_a_stable_digest() -> None:
    a = [Assignment("ns/a", "n1", (0, 1)), Assignment("ns/b", "n2", (2, 3))]
    assert plan_id("ns/g", a) == plan_id("ns/g", list(reversed(a)))
    assert plan_id("ns/g", a) != plan_id("ns/h", a)
    assert len(plan_id("ns/g", a)) == 12


def test_role_name_signature_and_describe() -> None:
    r = req(gang_pod("w", 8, "g", cpu="500m", memory="3Mi"))
    assert role_name(r) == "8gpu-500mcpu-3Mi"
    assert simple_gang("ns/g", 16, 4).describe() == "16 pods x 4 GPUs"
    assert isinstance(simple_gang("ns/g", 1, 8), GangRequest)
