"""PodDisruptionBudgets in topoplace's preemption (scheduler/core/disruption.py and
core/preemption.py), read as kube-scheduler's DefaultPreemption reads them.

PodDisruptionBudget objects in the ``policy/v1`` shape the API server serves (status as
the disruption controller of kube-controller-manager writes it); DGX H100 nodes and pods
as users write them, with the ``spec.priority`` the Priority admission plugin writes.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from benchmarks.clusters import make_pod
from scheduler.cli.clusterfile import parse_cluster
from scheduler.core.disruption import (
    BUDGETS_EXTRA,
    budgets_from,
    label_selector_matches,
    violating,
)
from scheduler.core.model import PodInfo
from scheduler.core.objects import request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.preemption import select_victims
from scheduler.core.snapshot import build_snapshot
from tests.health.builders import dgx

SP = SchedParams()


def pdb(
    name: str,
    selector: Any,
    allowed: int | None = 0,
    namespace: str = "default",
    disrupted: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A PodDisruptionBudget as ``kubectl get pdb -o json`` prints it."""
    obj: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-pdb-{name}",
            "resourceVersion": "4242",
            "generation": 1,
        },
        "spec": {"minAvailable": 1, "selector": selector},
    }
    if allowed is not None:
        obj["status"] = {
            "observedGeneration": 1,
            "disruptionsAllowed": allowed,
            "currentHealthy": 2,
            "desiredHealthy": 2 - allowed,
            "expectedPods": 2,
            "conditions": [
                {
                    "type": "DisruptionAllowed",
                    "status": "True" if allowed else "False",
                    "reason": "SufficientPods" if allowed else "InsufficientPods",
                    "message": "",
                    "lastTransitionTime": "2026-12-03T05:00:00Z",
                    "observedGeneration": 1,
                }
            ],
        }
        if disrupted:
            obj["status"]["disruptedPods"] = disrupted
    return obj


def _pod(name: str, gpus: int, priority: int = 0, **kw: Any) -> dict[str, Any]:
    p = make_pod(name, gpus, **kw)
    p["spec"]["priority"] = priority
    return p


def _info(name: str, labels: dict[str, str] | None, namespace: str = "default") -> PodInfo:
    raw = make_pod(name, 1, namespace=namespace, labels=labels)
    return PodInfo(
        key=f"{namespace}/{name}", uid=raw["metadata"]["uid"], node="a", gpus=(0,), raw=raw
    )


def _extra(*budgets: dict[str, Any]) -> dict[str, Any]:
    return {
        BUDGETS_EXTRA: {f"{b['metadata']['namespace']}/{b['metadata']['name']}": b for b in budgets}
    }


LABELS = {"app": "serve", "tier": "gold"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ({"matchLabels": {"app": "serve"}}, True),
        ({"matchLabels": {"app": "train"}}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold", "x"]}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, True),
        ({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, False),
        (
            {
                "matchLabels": {"app": "serve"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["silver"]}],
            },
            False,
        ),
        # kube: a nil or empty selector matches nothing, an invalid one is skipped
        (None, False),
        ({}, False),
        ({"matchLabels": {}, "matchExpressions": []}, False),
        ({"matchExpressions": [{"key": "app", "operator": "In", "values": []}]}, False),
        ({"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}, False),
        ({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}, False),
        ({"matchLabels": {"app": 3}}, False),
    ],
)
def test_a_budget_covers_pods_by_its_selector_as_kube_reads_it(
    selector: Any, matches: bool
) -> None:
    (b,) = budgets_from([pdb("p", selector)])
    assert b.covers(_info("x", LABELS)) is matches


def test_a_budget_covers_only_labelled_pods_of_its_namespace_not_yet_disrupted() -> None:
    sel = {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}
    (b,) = budgets_from([pdb("p", sel)])
    assert not b.covers(_info("bare", None))  # a pod without labels matches no budget
    assert b.covers(_info("other", {"team": "x"}))
    (b,) = budgets_from([pdb("p", {"matchLabels": {"app": "serve"}}, disrupted={"gone": "t"})])
    assert not b.covers(_info("x", LABELS, namespace="prod"))
    assert not b.covers(_info("gone", LABELS))
    assert b.covers(_info("x", LABELS))
    assert label_selector_matches({"matchLabels": {"app": "serve"}}, LABELS)


def test_disruptions_allowed_are_charged_most_important_pod_first() -> None:
    pods = [_info(f"p{i}", LABELS) for i in range(4)]
    both = budgets_from(
        [
            pdb("one", {"matchLabels": {"app": "serve"}}, 1),
            pdb("two", {"matchLabels": {"tier": "gold"}}, 2),
        ]
    )
    # "one" allows one disruption: p1..p3 violate it; "two" would allow p0, p1.
    assert violating(pods, both) == {"default/p1", "default/p2", "default/p3"}
    assert violating(pods[::-1], both) == {"default/p2", "default/p1", "default/p0"}
    # No status yet (the disruption controller has not seen it): nothing may go.
    assert violating(
        pods[:1], budgets_from([pdb("new", {"matchLabels": {"app": "serve"}}, None)])
    ) == {"default/p0"}
    assert violating(pods, ()) == frozenset()


def _two_full_nodes(**labels_of: dict[str, str]) -> tuple[list[Any], list[dict[str, Any]]]:
    pods = [
        _pod(
            f"{n}-{i}",
            4,
            node=n,
            gpu_indices=[4 * i + g for g in range(4)],
            labels=labels_of.get(f"{n}-{i}"),
        )
        for n in ("a", "b")
        for i in (0, 1)
    ]
    return [dgx("a"), dgx("b")], pods


def _uids(pods: list[dict[str, Any]], node: str) -> set[str]:
    return {p["metadata"]["uid"] for p in pods if p["spec"]["nodeName"] == node}


def test_the_node_whose_victims_violate_no_budget_is_chosen() -> None:
    nodes, pods = _two_full_nodes(**{"a-0": LABELS, "a-1": LABELS})
    req = request_from_pod(_pod("train", 8, 1000), SP.fabric)
    kube = {"a": _uids(pods, "a"), "b": _uids(pods, "b")}
    # Without a budget a and b cost the same: a wins by name.
    plain = select_victims(build_snapshot(nodes, pods, SP), req, kube, SP)
    assert plain.chosen.node == "a" and plain.chosen.pdb_violations == 0
    snap = build_snapshot(
        nodes, pods, SP, extra=_extra(pdb("serve", {"matchLabels": {"app": "serve"}}, 1))
    )
    d = select_victims(snap, req, kube, SP)
    assert d.chosen.node == "b" and d.chosen.pdb_violations == 0
    (a,) = [o for o in d.options if o.node == "a"]
    assert a.pdb_violations == 1  # one of the two may go, the other violates
    assert a.as_dict()["pdb_violations"] == 1


def test_a_protected_pod_is_given_back_first_on_its_node() -> None:
    # A 4-GPU pod needs one of a's two 4-GPU pods to go: a-1 by name, unless protected.
    nodes, pods = _two_full_nodes(**{"a-1": LABELS})
    req = request_from_pod(_pod("infer", 4, 1000), SP.fabric)
    snap = build_snapshot([nodes[0]], pods[:2], SP)
    assert [
        v.pod for v in select_victims(snap, req, {"a": _uids(pods, "a")}, SP).chosen.victims
    ] == ["default/a-1"]
    snap = build_snapshot(
        [nodes[0]], pods[:2], SP, extra=_extra(pdb("serve", {"matchLabels": {"app": "serve"}}))
    )
    d = select_victims(snap, req, {"a": _uids(pods, "a")}, SP)
    assert [v.pod for v in d.chosen.victims] == ["default/a-0"] and d.chosen.pdb_violations == 0


def test_a_violation_that_cannot_be_avoided_is_counted_not_refused() -> None:
    # kube-scheduler preempts through a budget when nothing else helps, and says so.
    nodes, pods = _two_full_nodes(**{"a-0": LABELS, "a-1": LABELS})
    snap = build_snapshot(
        [nodes[0]], pods[:2], SP, extra=_extra(pdb("serve", {"matchLabels": {"app": "serve"}}))
    )
    req = request_from_pod(_pod("train", 8, 1000), SP.fabric)
    d = select_victims(snap, req, {"a": _uids(pods, "a")}, SP)
    assert d.chosen.node == "a" and len(d.chosen.victims) == 2 and d.chosen.pdb_violations == 2


def test_a_gang_member_whose_teardown_a_budget_refuses_costs_a_violation() -> None:
    # On a the victim would be a gang member of priority 0; its other member on b is
    # protected. On c a lone pod of priority 10 goes. Without counting the member's
    # budget a wins (lower priority); its teardown would be refused by the Eviction API.
    train = {"job": "llm"}
    pods = [
        _pod(
            "g-0", 8, 0, node="a", gpu_indices=list(range(8)), gang="g", gang_size=2, labels=train
        ),
        _pod(
            "g-1",
            8,
            0,
            node="b",
            gpu_indices=list(range(8)),
            gang="g",
            gang_size=2,
            labels={"job": "llm", "keep": "y"},
        ),
        _pod("lone", 8, 10, node="c", gpu_indices=list(range(8))),
    ]
    nodes = [dgx("a"), dgx("b"), dgx("c")]
    req = request_from_pod(_pod("urgent", 8, 1000), SP.fabric)
    kube = {"a": {pods[0]["metadata"]["uid"]}, "c": {pods[2]["metadata"]["uid"]}}
    assert select_victims(build_snapshot(nodes, pods, SP), req, kube, SP).chosen.node == "a"
    snap = build_snapshot(
        nodes, pods, SP, extra=_extra(pdb("keep", {"matchLabels": {"keep": "y"}}))
    )
    d = select_victims(snap, req, kube, SP)
    assert d.chosen.node == "c"
    (a,) = [o for o in d.options if o.node == "a"]
    assert (a.pdb_violations, a.members_pdb_violations) == (0, 1)


def test_a_cluster_file_keeps_its_budgets_for_preemption() -> None:
    nodes, pods = _two_full_nodes()
    budget = pdb("serve", {"matchLabels": {"app": "serve"}})
    _, _, extra = parse_cluster(
        orjson.dumps({"kind": "List", "items": [*nodes, *pods, budget]}).decode()
    )
    assert extra[BUDGETS_EXTRA] == {"default/serve": budget}


def test_the_budget_index_charges_exactly_the_budgets_a_scan_would() -> None:
    # Budgets by matchLabels (one or two pairs), by expressions alone, in two namespaces,
    # some matching nothing; pods with random labels. The index must find every budget
    # that covers a pod, and no other.
    import random

    rnd = random.Random(5)
    keys, values = ("app", "tier", "team"), ("a", "b", "c")

    def selector() -> Any:
        kind = rnd.randrange(4)
        if kind == 0:
            return {"matchLabels": {rnd.choice(keys): rnd.choice(values)}}
        if kind == 1:
            return {"matchLabels": {k: rnd.choice(values) for k in rnd.sample(keys, 2)}}
        if kind == 2:
            op = rnd.choice(("In", "NotIn", "Exists", "DoesNotExist"))
            e: dict[str, Any] = {"key": rnd.choice(keys), "operator": op}
            if op in ("In", "NotIn"):
                e["values"] = rnd.sample(values, 2)
            return {"matchExpressions": [e]}
        return {}

    objs = [
        pdb(f"b{i}", selector(), rnd.randrange(3), rnd.choice(("default", "prod")))
        for i in range(60)
    ]
    budgets = budgets_from(objs)
    pods = [
        _info(
            f"p{i}",
            {k: rnd.choice(values) for k in keys if rnd.random() < 0.6} or None,
            rnd.choice(("default", "prod")),
        )
        for i in range(200)
    ]
    left = {b.key: b.allowed for b in budgets}
    scan = set()
    for p in pods:
        assert [budgets[j] for j in budgets.covering(p)] == [b for b in budgets if b.covers(p)]
        for b in budgets:
            if b.covers(p):
                left[b.key] -= 1
                if left[b.key] < 0:
                    scan.add(p.key)
    assert violating(pods, budgets) == scan and 0 < len(scan) < len(pods)
