"""Required node affinity of gang members: read strictly from the pod, matched as
kube-scheduler's NodeAffinity plugin matches it, and applied by the gang plan to every
member (the members not seen yet included)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.gang import gang_request, role_name
from scheduler.core.model import FIELD_NODE_NAME, affinity_matches
from scheduler.core.objects import ObjectError, node_affinity_of, request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.policies.registry import DEFAULT_GANG_POLICY, get_policy
from tests.builders import dgx_su, gang_pod, snapshot_of

P = SchedParams()


def _spec(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


def _expr(key: str, op: str, *values: str) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


@pytest.mark.parametrize(
    ("term", "labels", "name", "expect"),
    [
        ({"matchExpressions": [_expr("pool", "In", "a", "b")]}, {"pool": "b"}, "n", True),
        ({"matchExpressions": [_expr("pool", "In", "a")]}, {"pool": "b"}, "n", False),
        ({"matchExpressions": [_expr("pool", "NotIn", "a")]}, {}, "n", True),
        ({"matchExpressions": [_expr("pool", "NotIn", "a")]}, {"pool": "a"}, "n", False),
        ({"matchExpressions": [_expr("gpu", "Exists")]}, {"gpu": ""}, "n", True),
        ({"matchExpressions": [_expr("gpu", "DoesNotExist")]}, {"gpu": "x"}, "n", False),
        ({"matchExpressions": [_expr("gen", "Gt", "8")]}, {"gen": "9"}, "n", True),
        ({"matchExpressions": [_expr("gen", "Lt", "8")]}, {"gen": "9"}, "n", False),
        ({"matchExpressions": [_expr("gen", "Gt", "8")]}, {"gen": "nine"}, "n", False),
        ({"matchFields": [_expr("metadata.name", "In", "n1")]}, {}, "n1", True),
        ({"matchFields": [_expr("metadata.name", "NotIn", "n1")]}, {}, "n1", False),
        (
            {"matchExpressions": [_expr("pool", "In", "a"), _expr("zone", "In", "z")]},
            {"pool": "a", "zone": "y"},
            "n",
            False,  # every requirement of a term must hold
        ),
        ({}, {"pool": "a"}, "n", False),  # an empty term matches nothing
    ],
)
def test_matching_follows_kube_scheduler(
    term: dict[str, Any], labels: dict[str, str], name: str, expect: bool
) -> None:
    assert affinity_matches(node_affinity_of(_spec(term)), labels, name) is expect


def test_any_term_may_match_and_none_means_every_node() -> None:
    aff = node_affinity_of(
        _spec(
            {"matchExpressions": [_expr("pool", "In", "a")]},
            {"matchExpressions": [_expr("pool", "In", "b")]},
        )
    )
    assert affinity_matches(aff, {"pool": "b"}, "n")
    assert node_affinity_of({}) == ()
    assert affinity_matches((), {}, "n")
    field = node_affinity_of(_spec({"matchFields": [_expr("metadata.name", "In", "x")]}))
    assert field == (((FIELD_NODE_NAME, "In", ("x",)),),)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"affinity": []}, "spec.affinity must be an object"),
        (_spec({"matchExpressions": [_expr("k", "Near", "a")]}), "unknown operator 'Near'"),
        (_spec({"matchExpressions": [{"key": "k", "operator": 7}]}), "unknown operator 'int'"),
        (_spec({"matchExpressions": [{"key": "k", "operator": "In", "values": [1]}]}), "strings"),
        (_spec({"matchFields": [_expr("spec.x", "In", "a")]}), "only metadata.name"),
        (_spec(*[{}] * 33), "more than 32"),
    ],
)
def test_malformed_affinity_is_a_clear_error(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ObjectError, match=message):
        node_affinity_of(spec)


def test_the_plan_keeps_every_member_on_allowed_nodes() -> None:
    # Six free DGX H100 nodes; the gang of four 8-GPU members may use only su-b's nodes.
    nodes = dgx_su("su-a", nodes=3) + dgx_su("su-b", nodes=3)
    for n in nodes:
        n["metadata"]["labels"]["pool"] = n["metadata"]["name"][:4]
    term = {"matchExpressions": [_expr("pool", "In", "su-b")]}
    pod = gang_pod("w-0", 8, "train", 3)
    pod["spec"].update(_spec(term))
    req = request_from_pod(pod, P.fabric)
    assert req.node_affinity and "-aff" in role_name(req)
    snap = snapshot_of(nodes)
    result = get_policy(DEFAULT_GANG_POLICY)(snap, gang_request([req], 3), P)
    assert result.ok
    assert {a.node for a in result.assignments} == {"su-b-n00", "su-b-n01", "su-b-n02"}
    # Four members do not fit the three allowed nodes: refused, not spread onto su-a.
    refused = get_policy(DEFAULT_GANG_POLICY)(snap, gang_request([req], 4), P)
    assert not refused.ok
