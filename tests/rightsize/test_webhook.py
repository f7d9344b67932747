"""The right-sizer's admission webhook over HTTP (the ASGI app through httpx), with
AdmissionReview v1 payloads shaped as kube-apiserver sends them for a ReplicaSet's pod."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from typing import Any

import httpx
import pytest

from scheduler.core.fractional import TenantLimits, tenant_limits
from scheduler.core.rightsize import EXCLUSIVE, MEMORY_SHARE, GiB, MiB, Policy, Recommendation
from scheduler.kube.rightsizer import workload_of
from scheduler.server.webhook import (
    ANNOTATION,
    PATH,
    PodSizing,
    WebhookApp,
    pod_memory_bytes,
    resize_patch,
)
from tests.helpers import SyncASGIClient

REC = Recommendation(1000.0, "serving/infer", 9 * GiB + 512 * MiB, 0.3, MEMORY_SHARE, "peak 6 GiB")


def hami_pod(**limits: str) -> dict[str, Any]:
    """A Deployment's pod as the API server shows it to a webhook at CREATE (no name yet)."""
    lim = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "50"}
    lim.update(limits)
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "generateName": "infer-7d9f8b6c5d-",
            "namespace": "serving",
            "labels": {"app": "infer", "pod-template-hash": "7d9f8b6c5d"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "infer-7d9f8b6c5d",
                    "uid": "0b6f1c3e-7d52-4b8f-9a1e-2f5d8c7b6a41",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "schedulerName": "topoplace",
            "containers": [
                {"name": "sidecar", "image": "envoy:1.30", "resources": {}},
                {
                    "name": "server",
                    "image": "vllm/vllm-openai:v0.6.3",
                    "resources": {"limits": lim},
                },
            ],
        },
        "status": {},
    }


def review(pod: Any, uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002", **req: Any) -> dict:
    body = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "serving",
        "operation": "CREATE",
        "userInfo": {
            "username": "system:serviceaccount:kube-system:replicaset-controller",
            "groups": ["system:serviceaccounts", "system:authenticated"],
        },
        "object": pod,
        "oldObject": None,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    body.update(req)
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": body}


def apply_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 ``add`` / ``remove`` (all the webhook emits) on a copy of ``doc``."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        if op["op"] == "add":
            parent[parts[-1]] = op["value"]
        elif op["op"] == "remove":
            del parent[parts[-1]]
        else:
            raise AssertionError(op)
    return doc


def lookup_of(recs: Mapping[str, Recommendation | PodSizing]) -> Any:
    def lookup(pod: Mapping[str, Any], ns: str) -> Recommendation | PodSizing | str:
        wl = workload_of(pod, ns)
        return recs.get(wl) or f"no recommendation for workload {wl}"

    return lookup


def post(app: WebhookApp, body: Any) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return SyncASGIClient(app).post(
        PATH, content=data, headers={"content-type": "application/json"}
    )


def answer(app: WebhookApp, pod: Any, **req: Any) -> dict[str, Any]:
    r = post(app, review(pod, **req))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == review(pod, **req)["request"]["uid"]
    assert out["response"]["allowed"] is True
    return out["response"]


def test_hami_pod_gets_the_recommended_memory_and_cores() -> None:
    app = WebhookApp(lookup_of({"serving/infer": REC}))
    pod = hami_pod()
    resp = answer(app, pod)
    assert resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    after = apply_patch(pod, ops)
    limits = after["spec"]["containers"][1]["resources"]["limits"]
    assert limits == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "9728",  # 9.5 GiB in MiB
        "nvidia.com/gpucores": "30",
    }
    assert after["spec"]["containers"][0] == pod["spec"]["containers"][0]  # no GPU: untouched
    note = json.loads(after["metadata"]["annotations"][ANNOTATION])
    assert note == {
        "workload": "serving/infer",
        "gpu_memory_limit_bytes": 9728 * MiB,
        "gpu_compute_ratio": 0.3,
        "mode": MEMORY_SHARE,
        "backend": "hami",
        "reason": "peak 6 GiB",
    }
    assert "serving/infer" in resp["status"]["message"]
    assert pod_memory_bytes(after) == 9728 * MiB
    assert app.patched == 1 and app.answered == 1


def test_pod_sizing_publishes_what_share_placement_reads() -> None:
    """With the workload's measured p95 and its policy's limits (a :class:`PodSizing`), the
    note carries them under the keys and in the units ``fractional.tenant_limits`` reads;
    the resources written are those of the bare recommendation."""
    sizing = PodSizing.of(REC, Policy(max_tenants_per_gpu=3, gpu_compute_limit=0.8), 0.23)
    app = WebhookApp(lookup_of({"serving/infer": sizing}))
    pod = hami_pod()
    resp = answer(app, pod)
    after = apply_patch(pod, json.loads(base64.b64decode(resp["patch"])))
    bare = apply_patch(pod, resize_patch(pod, REC)[0])
    assert after["spec"] == bare["spec"]
    note = json.loads(after["metadata"]["annotations"][ANNOTATION])
    assert note == {
        **json.loads(bare["metadata"]["annotations"][ANNOTATION]),
        "compute_p95": 0.23,
        "max_tenants_per_gpu": 3,
        "gpu_compute_limit": 0.8,
    }
    assert tenant_limits(after["metadata"]["annotations"]) == TenantLimits(230, 3, 800)
    # the bare recommendation's note: placement reads its compute share as the p95, no caps
    assert tenant_limits(bare["metadata"]["annotations"]) == TenantLimits(300, 0, 0)


@pytest.mark.parametrize(
    ("desc", "sizing", "fields", "limits"),
    [
        (
            "default policy, measured",
            PodSizing.of(REC, Policy(), 0.05),
            {"compute_p95": 0.05, "max_tenants_per_gpu": 8, "gpu_compute_limit": 1.0},
            TenantLimits(50, 8, 1000),
        ),
        (
            "nothing measured: the compute share stands in",
            PodSizing.of(REC, Policy(max_tenants_per_gpu=1), None),
            {"max_tenants_per_gpu": 1, "gpu_compute_limit": 1.0},
            TenantLimits(300, 1, 1000),
        ),
        (
            "a p95 off the 4-decimal grid is rounded there",
            PodSizing(REC, 0.123456, 0, 0.0),
            {"compute_p95": 0.1235},
            TenantLimits(124, 0, 0),
        ),
    ],
)
def test_pod_sizing_note_fields(
    desc: str, sizing: PodSizing, fields: dict[str, Any], limits: TenantLimits
) -> None:
    assert sizing.note_fields() == fields, desc
    after = apply_patch(hami_pod(), resize_patch(hami_pod(), sizing)[0])
    assert tenant_limits(after["metadata"]["annotations"]) == limits, desc


def test_stated_requests_follow_and_percentage_is_replaced() -> None:
    pod = hami_pod(**{"nvidia.com/gpumem-percentage": "50"})
    del pod["spec"]["containers"][1]["resources"]["limits"]["nvidia.com/gpumem"]
    pod["spec"]["containers"][1]["resources"]["requests"] = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem-percentage": "50",
    }
    pod["metadata"]["annotations"] = {"team": "a"}
    ops, _ = resize_patch(pod, REC)
    after = apply_patch(pod, ops)
    res = after["spec"]["containers"][1]["resources"]
    for section in ("limits", "requests"):
        assert "nvidia.com/gpumem-percentage" not in res[section]
        assert res[section]["nvidia.com/gpumem"] == "9728"
        assert res[section]["nvidia.com/gpucores"] == "30"
    assert after["metadata"]["annotations"]["team"] == "a"
    assert ANNOTATION in after["metadata"]["annotations"]


def test_exclusive_on_hami_drops_the_memory_cap() -> None:
    rec = Recommendation(1.0, "serving/infer", 78 * GiB, 1.0, EXCLUSIVE, "busy")
    after = apply_patch(hami_pod(), resize_patch(hami_pod(), rec)[0])
    assert after["spec"]["containers"][1]["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpucores": "100",
    }


def test_gpushare_pod_gets_memory_in_device_plugin_units() -> None:
    pod = hami_pod()
    pod["spec"]["containers"][1]["resources"] = {"limits": {"aliyun.com/gpu-mem": "16"}}
    app = WebhookApp(lookup_of({"serving/infer": REC}), gpushare_unit_mib=1024)
    resp = answer(app, pod)
    after = apply_patch(pod, json.loads(base64.b64decode(resp["patch"])))
    assert after["spec"]["containers"][1]["resources"]["limits"] == {"aliyun.com/gpu-mem": "10"}
    assert pod_memory_bytes(after) == 10 * GiB
    app = WebhookApp(lookup_of({"serving/infer": REC}), gpushare_unit_mib=256)
    resp = answer(app, pod)
    after = apply_patch(pod, json.loads(base64.b64decode(resp["patch"])))
    assert after["spec"]["containers"][1]["resources"]["limits"] == {"aliyun.com/gpu-mem": "38"}


@pytest.mark.parametrize(
    ("desc", "pod", "recs", "message"),
    [
        (
            "workload without a recommendation",
            hami_pod(),
            {},
            "no recommendation for workload serving/infer",
        ),
        (
            "whole-GPU pod",
            {
                **hami_pod(),
                "spec": {
                    "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
                },
            },
            {"serving/infer": REC},
            "no HAMi or gpushare memory share",
        ),
        (
            "MIG recommendation",
            hami_pod(),
            {
                "serving/infer": Recommendation(
                    1.0, "serving/infer", 20 * GiB, 2 / 7, "mig:2g.20gb", "x"
                )
            },
            "not expressible",
        ),
    ],
)
def test_pods_allowed_unchanged(desc: str, pod: Any, recs: Any, message: str) -> None:
    resp = answer(WebhookApp(lookup_of(recs)), pod)
    assert "patch" not in resp and "patchType" not in resp, desc
    assert message in resp["status"]["message"], desc


def test_update_and_other_kinds_are_allowed_unchanged() -> None:
    app = WebhookApp(lookup_of({"serving/infer": REC}))
    resp = answer(app, hami_pod(), operation="UPDATE")
    assert (
        "patch" not in resp and resp["status"]["message"] == "not a pod or ResourceClaim creation"
    )
    resp = answer(app, hami_pod(), kind={"group": "apps", "version": "v1", "kind": "Deployment"})
    assert "patch" not in resp


def test_namespace_outside_the_policy_is_left_alone() -> None:
    def lookup(pod: Mapping[str, Any], ns: str) -> str:
        return f"namespace {ns!r} is not right-sized"

    resp = answer(WebhookApp(lookup), hami_pod())
    assert "patch" not in resp and "not right-sized" in resp["status"]["message"]


@pytest.mark.parametrize(
    ("desc", "body", "error"),
    [
        ("not JSON", b"{not json", "not JSON"),
        ("a list", [], "expected an AdmissionReview object"),
        (
            "v1beta1",
            {**review(hami_pod()), "apiVersion": "admission.k8s.io/v1beta1"},
            "admission.k8s.io/v1",
        ),
        (
            "no request",
            {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"},
            "request.uid",
        ),
        ("no uid", review(hami_pod(), uid=""), "request.uid"),
    ],
)
def test_malformed_review_is_a_clear_400(desc: str, body: Any, error: str) -> None:
    r = post(WebhookApp(lookup_of({"serving/infer": REC})), body)
    assert r.status_code == 400, desc
    assert error in r.json()["error"], desc


def test_a_failing_lookup_is_a_400_never_a_500() -> None:
    def broken(pod: Mapping[str, Any], ns: str) -> Recommendation:
        raise KeyError("boom")

    r = post(WebhookApp(broken), review(hami_pod()))
    assert r.status_code == 400
    assert "KeyError" in r.json()["error"]


def test_garbage_object_is_allowed_unchanged() -> None:
    resp = answer(WebhookApp(lookup_of({"serving/infer": REC})), "not a pod")
    assert "patch" not in resp and "not a pod" in resp["status"]["message"]


def test_other_paths_and_methods() -> None:
    c = SyncASGIClient(WebhookApp(lookup_of({})))
    assert c.get(PATH).status_code == 405
    assert c.post("/mutate/other", content=b"{}").status_code == 404
    assert c.get("/healthz").json() == {"status": "ok"}


def test_webhook_server_answers_over_tls_and_stops(tmp_path: Any) -> None:
    """The listener ``serve --webhook-port`` runs: HTTPS with a pair from ``topoplace certs``,
    verified against its CA as the API server does, on a thread of its own; stop() closes it."""
    import shutil
    import socket
    import ssl
    import time

    from scheduler.cli.main import main
    from scheduler.kube.tls import uvicorn_ssl_kwargs
    from scheduler.server.webhook import WebhookServer

    if shutil.which("openssl") is None:
        pytest.skip("topoplace certs needs openssl")
    assert main(["certs", "--out", str(tmp_path)]) == 0
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = WebhookApp(lookup_of({"serving/infer": REC}))
    server = WebhookServer(
        app, sock, uvicorn_ssl_kwargs(str(tmp_path / "server.crt"), str(tmp_path / "server.key"))
    )
    server.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "webhook listener did not start"
            time.sleep(0.05)
        ca = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        with httpx.Client(verify=ca, timeout=5) as c:
            r = c.post(f"https://127.0.0.1:{port}{PATH}", json=review(hami_pod()))
            assert r.status_code == 200
            ops = json.loads(base64.b64decode(r.json()["response"]["patch"]))
            limits = apply_patch(hami_pod(), ops)["spec"]["containers"][1]["resources"]["limits"]
            assert limits["nvidia.com/gpumem"] == "9728"
            with pytest.raises(httpx.TransportError):  # plain HTTP is not served
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"https://127.0.0.1:{port}/healthz", verify=ca, timeout=2)


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["serve", "--webhook-cert", "x.crt"], "need --webhook-port"),
        (["serve", "--webhook-port", "18443"], "needs a Kubernetes API and a rightsize: policy"),
    ],
)
def test_serve_webhook_flag_errors(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from scheduler.cli.main import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("topoplace: error: ") and error in err
