"""The claim-controller stand-in's decisions on objects recorded from a real v1.33.0 plane
(``tests/fixtures/kube/dra-1.33``: claims allocated and reserved by kube-scheduler)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from benchmarks.cluster.claims import (
    FINALIZER,
    POD_CLAIM_ANNOTATION,
    ClaimAction,
    claim_action,
    pod_done,
    pods_by_key,
    template_claims,
    terminating,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "kube" / "dra-1.33"


def _items(name: str) -> list[dict[str, Any]]:
    return json.loads((FIX / name).read_text())["items"]


def _claim(name: str) -> dict[str, Any]:
    return next(c for c in _items("resourceclaims.v1beta2.json") if c["metadata"]["name"] == name)


def _pods() -> list[dict[str, Any]]:
    return _items("pods.json")


def test_a_claim_reserved_for_a_live_pod_is_left_alone() -> None:
    claim = _claim("two-gpus")
    assert claim["status"]["reservedFor"][0]["name"] == "claim-pod-a"
    assert claim_action(claim, pods_by_key(_pods())) == ClaimAction()
    assert not claim_action(claim, pods_by_key(_pods())).any


def test_the_pod_gone_deallocates_and_frees_the_claim() -> None:
    claim = _claim("two-gpus")
    pods = [p for p in _pods() if p["metadata"]["name"] != "claim-pod-a"]
    act = claim_action(claim, pods_by_key(pods))
    assert act == ClaimAction(reserved_for=(), deallocate=True, drop_finalizer=True)
    assert act.any


def test_a_replaced_or_finished_pod_no_longer_holds_it() -> None:
    claim = _claim("pinned-seven")
    replaced = copy.deepcopy(_pods())
    pod = next(p for p in replaced if p["metadata"]["name"] == "claim-pod-b")
    pod["metadata"]["uid"] = "another-uid"
    assert claim_action(claim, pods_by_key(replaced)).deallocate
    finished = copy.deepcopy(_pods())
    pod = next(p for p in finished if p["metadata"]["name"] == "claim-pod-b")
    pod["status"]["phase"] = "Succeeded"
    assert pod_done(pod)
    assert claim_action(claim, pods_by_key(finished)).drop_finalizer


def test_other_consumers_are_not_judged() -> None:
    claim = _claim("same-root")
    claim["status"]["reservedFor"].append(
        {"apiGroup": "example.com", "resource": "jobs", "name": "j", "uid": "u"}
    )
    act = claim_action(claim, {})
    assert act.reserved_for == (claim["status"]["reservedFor"][1],)
    assert not act.deallocate and not act.drop_finalizer


def test_an_unallocated_claim_without_finalizer_needs_nothing() -> None:
    assert claim_action(_claim("pending-four"), pods_by_key(_pods())) == ClaimAction()


def test_a_deleted_claim_without_consumers_loses_its_finalizer() -> None:
    claim = _claim("two-gpus")
    claim["metadata"]["deletionTimestamp"] = "2026-12-01T02:00:00Z"
    claim["status"]["reservedFor"] = []
    act = claim_action(claim, pods_by_key(_pods()))
    assert act.drop_finalizer and act.reserved_for == ()


def _template_pod(name: str = "tp", uid: str = "pod-uid") -> dict[str, Any]:
    pod = copy.deepcopy(_pods()[0])
    pod["metadata"].update(name=name, uid=uid)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "two"}]
    pod["status"].pop("resourceClaimStatuses", None)
    return pod


TEMPLATE = {
    "metadata": {"name": "two", "namespace": "default"},
    "spec": {
        "metadata": {"labels": {"team": "a"}},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"count": 2}}]}},
    },
}


def test_template_claims_are_created_owned_by_the_pod() -> None:
    pod = _template_pod()
    ns = pod["metadata"]["namespace"]
    new, updates = template_claims([pod], [], {(ns, "two"): TEMPLATE}, "v1")
    (nc,) = new
    md = nc.body["metadata"]
    assert nc.pod == (ns, "tp") and nc.pod_claim == "gpu"
    assert md["generateName"] == "tp-gpu-" and md["labels"] == {"team": "a"}
    assert md["annotations"][POD_CLAIM_ANNOTATION] == "gpu"
    assert md["ownerReferences"][0]["uid"] == "pod-uid"
    assert md["ownerReferences"][0]["controller"] is True
    assert nc.body["spec"] == TEMPLATE["spec"]["spec"]
    assert nc.body["apiVersion"] == "resource.k8s.io/v1"
    assert [u.pod for u in updates] == [(ns, "tp")]
    # the same pass over a pod that already has its claim recorded: nothing
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "tp-gpu-x"}]
    assert template_claims([pod], [], {(ns, "two"): TEMPLATE}, "v1") == ([], [])


def test_an_orphan_from_an_interrupted_pass_is_adopted_not_duplicated() -> None:
    pod = _template_pod()
    ns = pod["metadata"]["namespace"]
    orphan = {
        "metadata": {
            "name": "tp-gpu-abcde",
            "namespace": ns,
            "annotations": {POD_CLAIM_ANNOTATION: "gpu"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": "tp",
                    "uid": "pod-uid",
                    "controller": True,
                }
            ],
        }
    }
    new, updates = template_claims([pod], [orphan], {(ns, "two"): TEMPLATE}, "v1")
    assert new == [] and updates[0].found == (("gpu", "tp-gpu-abcde"),)
    # generated for a pod that is gone: deleted once unreserved
    assert claim_action(orphan, {}).delete
    assert not claim_action(orphan, pods_by_key([pod])).delete


def test_missing_template_and_terminating_pods() -> None:
    pod = _template_pod()
    assert template_claims([pod], [], {}, "v1") == ([], [])
    gone = copy.deepcopy(pod)
    gone["metadata"]["deletionTimestamp"] = "2026-12-01T02:00:00Z"
    assert terminating([pod, gone]) == [(pod["metadata"]["namespace"], "tp")]
    assert FINALIZER == "resource.kubernetes.io/delete-protection"
