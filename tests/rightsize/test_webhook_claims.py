"""The webhook's DRA path: a ResourceClaim created from a pod's ResourceClaimTemplate gets the
right-sized memory in its capacity requests, rounded to the device's requestPolicy. Objects
are the ones a v1.36.2 kube-apiserver returned (``tests/rightsize/data/dra-v1.36/``); the
claim is shown to the webhook as at CREATE (no name, uid or resourceVersion yet)."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from scheduler.core.params import RightsizeParams
from scheduler.core.rightsize import EXCLUSIVE, MEMORY_SHARE, GiB, MiB, Recommendation
from scheduler.kube.rightsizer import RightSizer
from scheduler.server.webhook import (
    ANNOTATION,
    ClaimSizing,
    PodSizing,
    RequestPolicy,
    WebhookApp,
    capacity_policies,
    claim_patch,
    quantity,
)
from tests.kube.recorded import RecordedApiServer
from tests.rightsize.test_webhook import post

DATA = Path(__file__).parent / "data" / "dra-v1.36"
NS = "rs-rec"
WL = f"{NS}/llama"
CLASS = "rs-gpu-share"
REC = Recommendation(1000.0, WL, 42 * GiB + 300 * MiB, 0.25, MEMORY_SHARE, "peak 32.3 GiB x 1.33")
STEP_1GI = RequestPolicy(min=GiB, step=GiB, max=80 * GiB)


def load(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def claim_at_create() -> dict[str, Any]:
    """The recorded claim as the API server shows it to a webhook at CREATE."""
    (claim,) = load("resourceclaims-from-template.json")["items"]
    claim = copy.deepcopy(claim)
    for k in ("name", "uid", "resourceVersion", "creationTimestamp"):
        claim["metadata"].pop(k, None)
    claim.pop("status", None)
    return claim


def claim_review(claim: Any, operation: str = "CREATE") -> dict[str, Any]:
    gvk = {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"}
    gvr = {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"}
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "3c1f0b52-8a0e-4f38-9d0a-6a3f2b1c9e77",
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "namespace": NS,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:resource-claim-controller"},
            "object": claim,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def patched(resp: dict[str, Any], claim: Any) -> Any:
    assert resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    return jsonpatch.apply_patch(claim, ops)


def memory_of(claim: Any, i: int = 0) -> str:
    return claim["spec"]["devices"]["requests"][i]["exactly"]["capacity"]["requests"]["memory"]


@pytest.mark.parametrize(
    "desc, policy, want, got",
    [
        ("range with step: up to the next step", STEP_1GI, 42 * GiB + 300 * MiB, 43 * GiB),
        ("range: on a step stays", STEP_1GI, 43 * GiB, 43 * GiB),
        ("range: below min rises to min", STEP_1GI, 300 * MiB, GiB),
        ("range: above max is refused", STEP_1GI, 81 * GiB, None),
        (
            "range with an offset min: min + n x step",
            RequestPolicy(min=10 * GiB, step=4 * GiB),
            15 * GiB,
            18 * GiB,
        ),
        ("range without step or max", RequestPolicy(min=GiB), 5 * GiB + 1, 5 * GiB + 1),
        (
            "valid values: the next one",
            RequestPolicy(values=(10 * GiB, 20 * GiB, 40 * GiB)),
            21 * GiB,
            40 * GiB,
        ),
        ("valid values: above all", RequestPolicy(values=(10 * GiB, 20 * GiB)), 21 * GiB, None),
    ],
)
def test_request_policy_rounds_up(
    desc: str, policy: RequestPolicy, want: int, got: int | None
) -> None:
    assert policy.round_up(want) == got, desc


def test_policies_from_the_recorded_device_class_and_slice() -> None:
    cls, sl = load("deviceclass.json"), load("resourceslice-shareable.json")
    assert capacity_policies([cls], [sl]) == {CLASS: STEP_1GI}
    # a device that does not allow multiple allocations is not a capacity device
    whole = copy.deepcopy(sl)
    whole["spec"]["devices"][0]["allowMultipleAllocations"] = False
    assert capacity_policies([cls], [whole]) == {}
    # devices of one driver that disagree: nothing single to round to
    other = copy.deepcopy(sl)
    other["metadata"]["name"] = "rs-node-b-gpus"
    rp = other["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]
    rp["validRange"]["step"] = "2Gi"
    assert capacity_policies([cls], [sl, other]) == {}
    # a class of another driver learns nothing from this slice
    foreign = copy.deepcopy(cls)
    foreign["metadata"]["name"] = "other"
    foreign["spec"]["selectors"][0]["cel"]["expression"] = 'device.driver == "gpu.nvidia.com"'
    assert capacity_policies([foreign], [sl]) == {}


def test_webhook_writes_the_rounded_size_into_a_template_claim() -> None:
    claim = claim_at_create()
    assert memory_of(claim) == "75Gi"

    def lookup(obj: Any, ns: str) -> ClaimSizing | str:
        assert obj["kind"] == "ResourceClaim" and ns == NS
        return ClaimSizing(REC, {CLASS: STEP_1GI}, f"{NS}/llama-7d9f8b6c5d-q8wzn")

    app = WebhookApp(lookup)
    resp = post(app, claim_review(claim)).json()["response"]
    assert resp["allowed"] is True
    out = patched(resp, claim)
    assert memory_of(out) == "43Gi"  # 42.3 GiB up to the 1Gi step
    note = json.loads(out["metadata"]["annotations"][ANNOTATION])
    assert note["backend"] == "dra-capacity" and note["requests"] == {"0/exactly": "43Gi"}
    assert note["pod"] == f"{NS}/llama-7d9f8b6c5d-q8wzn"
    assert "requestPolicy (min 1Gi step 1Gi max 80Gi)" in note["reason"]
    # the controller's annotation stays
    assert out["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    assert out["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == CLASS
    assert "43Gi" in resp["status"]["message"]


def test_a_pod_sizing_answered_for_a_claim_sizes_it_from_its_recommendation() -> None:
    """A lookup answering a pod's :class:`PodSizing` for a claim: the claim is sized from
    the recommendation (no requestPolicy known: whole MiB), its note has no pod limits."""
    sizing = PodSizing(REC, 0.2, 2, 0.8)
    resp = post(WebhookApp(lambda obj, ns: sizing), claim_review(claim_at_create()))
    out = patched(resp.json()["response"], claim_at_create())
    assert memory_of(out) == quantity(42 * GiB + 300 * MiB)
    note = json.loads(out["metadata"]["annotations"][ANNOTATION])
    assert note["backend"] == "dra-capacity" and "compute_p95" not in note


def test_without_a_known_policy_the_size_is_whole_mib() -> None:
    claim = claim_at_create()
    ops, _ = claim_patch(claim, ClaimSizing(REC))
    assert memory_of(jsonpatch.apply_patch(claim, ops)) == quantity(42 * GiB + 300 * MiB)
    assert quantity(42 * GiB + 300 * MiB) == f"{42 * 1024 + 300}Mi"


def test_first_available_alternatives_are_sized_each_with_its_class() -> None:
    claim = claim_at_create()
    exactly = claim["spec"]["devices"]["requests"][0].pop("exactly")
    small = {**copy.deepcopy(exactly), "deviceClassName": "small-gpu"}
    small["capacity"]["requests"]["memory"] = "20Gi"
    claim["spec"]["devices"]["requests"][0]["firstAvailable"] = [
        {"name": "big", **exactly},
        {"name": "small", **small},
    ]
    sizing = ClaimSizing(
        REC, {CLASS: STEP_1GI, "small-gpu": RequestPolicy(values=(24 * GiB, 48 * GiB))}
    )
    out = jsonpatch.apply_patch(claim, claim_patch(claim, sizing)[0])
    alts = out["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert [a["capacity"]["requests"]["memory"] for a in alts] == ["43Gi", "48Gi"]


@pytest.mark.parametrize(
    "desc, edit, rec, policies, message",
    [
        (
            "a whole-device request (no capacity) is not sized",
            lambda c: c["spec"]["devices"]["requests"][0]["exactly"].pop("capacity"),
            REC,
            {},
            "requests no memory capacity",
        ),
        (
            "an exclusive recommendation is not a capacity request",
            lambda c: None,
            Recommendation(1.0, WL, 70 * GiB, 1.0, EXCLUSIVE, "busy"),
            {},
            "not a capacity request",
        ),
        (
            "a size above the device's requestPolicy is left to the author",
            lambda c: None,
            Recommendation(1.0, WL, 90 * GiB, 0.2, MEMORY_SHARE, "big"),
            {CLASS: STEP_1GI},
            "above its requestPolicy",
        ),
    ],
)
def test_claims_left_alone(
    desc: str, edit: Any, rec: Recommendation, policies: Any, message: str
) -> None:
    claim = claim_at_create()
    edit(claim)
    resp = post(WebhookApp(lambda o, ns: ClaimSizing(rec, policies)), claim_review(claim)).json()
    assert "patch" not in resp["response"], desc
    assert message in resp["response"]["status"]["message"], desc


def test_claim_update_is_not_touched() -> None:
    resp = post(
        WebhookApp(lambda o, ns: ClaimSizing(REC)), claim_review(claim_at_create(), "UPDATE")
    )
    assert "patch" not in resp.json()["response"]


def sizer(api: Any) -> RightSizer:
    rs = RightSizer(
        api, RightsizeParams(enabled=True, prometheus_url="http://127.0.0.1:9", namespaces=(NS,))
    )
    rs.current[WL] = REC
    return rs


def test_right_sizer_finds_the_claim_s_pod_and_workload_through_the_api() -> None:
    pod = load("pod-of-replicaset.json")
    with RecordedApiServer() as srv:
        srv.add("GET", f"/api/v1/namespaces/{NS}/pods/llama-7d9f8b6c5d-q8wzn", 200, pod)
        srv.add(
            "GET",
            "/apis/resource.k8s.io/v1/deviceclasses",
            200,
            {"items": [load("deviceclass.json")]},
        )
        srv.add(
            "GET",
            "/apis/resource.k8s.io/v1/resourceslices",
            200,
            {"items": [load("resourceslice-shareable.json")]},
        )
        rs = sizer(srv.api())
        rs.read_device_policies(100.0)
        got = rs.for_pod({**claim_at_create(), "kind": "ResourceClaim"}, NS)
        assert isinstance(got, ClaimSizing), got
        assert got.rec is REC and got.pod == f"{NS}/llama-7d9f8b6c5d-q8wzn"
        assert got.policies == {CLASS: STEP_1GI}
        # the pod was read (its ReplicaSet owner names the workload)
        assert any(r["path"].endswith("/pods/llama-7d9f8b6c5d-q8wzn") for r in srv.requests)
        # a second read within DEVICE_POLICY_EVERY_S does not list again
        n = len(srv.requests)
        rs.read_device_policies(105.0)
        assert len(srv.requests) == n


def test_claim_of_a_replaced_pod_falls_back_to_the_pod_s_name() -> None:
    pod = load("pod-of-replicaset.json")
    pod["metadata"]["uid"] = "another-uid"  # the name was reused by a newer pod
    pod["metadata"]["ownerReferences"][0]["name"] = "somebody-else"
    with RecordedApiServer() as srv:
        srv.add("GET", f"/api/v1/namespaces/{NS}/pods/llama-7d9f8b6c5d-q8wzn", 200, pod)
        got = sizer(srv.api()).for_claim(claim_at_create(), NS)
    assert isinstance(got, ClaimSizing) and got.rec is REC  # llama-7d9f8b6c5d-q8wzn -> llama


def test_claims_the_right_sizer_leaves_alone() -> None:
    rs = sizer(None)
    mine = claim_at_create()
    hand_written = copy.deepcopy(mine)
    hand_written["metadata"].pop("ownerReferences")
    assert "no pod owner" in str(rs.for_claim(hand_written, NS))
    assert "not right-sized" in str(rs.for_claim(mine, "elsewhere"))
    other = copy.deepcopy(mine)
    other["metadata"]["ownerReferences"][0]["name"] = "batch-0"
    assert "no recommendation for workload rs-rec/batch" in str(rs.for_claim(other, NS))
