"""The right-sizer loop: its policy section, the workload of a pod, the recommendations it
publishes from Prometheus answers (Prometheus' own ``query_range`` JSON shape), and Recreate
against recorded kube-apiserver answers (tests/fixtures/kube) over real HTTP."""

from __future__ import annotations

import copy
import json
import math
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from scheduler.core.params import RightsizeParams, SchedParams
from scheduler.core.rightsize import GiB, MiB, Recommendation
from scheduler.kube.prometheus import PrometheusReader
from scheduler.kube.rightsizer import RightSizer, rec_json, workload_of
from scheduler.server.webhook import PodSizing
from tests.kube.recorded import RecordedApiServer

NS = "serving"
T0 = 1_760_000_000.0
PODS = ("infer-7d9f8b6c5d-x2x4k", "infer-7d9f8b6c5d-q8wzn")


class Prom:
    """Answers ``/api/v1/query_range`` as Prometheus does, from a function of time: two HAMi
    pods of one Deployment using ``used(t)`` GPU memory at 25 % of the SMs."""

    def __init__(self, used: Any) -> None:
        self.used = used
        self.calls: list[tuple[str, float, float]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        q = parse_qs(request.url.query.decode())
        name, start, end, step = (
            q["query"][0],
            float(q["start"][0]),
            float(q["end"][0]),
            float(q["step"][0]),
        )
        self.calls.append((name, start, end))
        result = []
        times = [start + k * step for k in range(int((end - start) // step) + 1)]
        for pod in PODS:
            labels = {
                "__name__": name,
                "podnamespace": NS,
                "podname": pod,
                "ctrname": "server",
                "deviceuuid": "GPU-0",
                "job": "hami",
            }
            if name == "hami_vgpu_memory_used_bytes":
                values = [[t, str(self.used(t))] for t in times]
            elif name == "hami_vgpu_memory_limit_bytes":
                values = [[t, str(20 * GiB)] for t in times]
            elif name == "hami_container_device_utilization_ratio":
                values = [[t, "0.25"] for t in times]
            else:
                continue
            result.append({"metric": labels, "values": values})
        body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
        return httpx.Response(200, json=body)


def settings(**kw: Any) -> RightsizeParams:
    base = {
        "prometheus_url": "http://prometheus.monitoring:9090",
        "lookback_seconds": 6 * 3600,
        "step_seconds": 300,
        "interval_seconds": 60,
    }
    base.update(kw)
    return RightsizeParams.from_config(base)


def sizer(prom: Prom, clock: list[float], api: Any = None, **kw: Any) -> RightSizer:
    reader = PrometheusReader(
        "http://prometheus.monitoring:9090",
        client=httpx.Client(transport=httpx.MockTransport(prom)),
    )
    return RightSizer(api, settings(**kw), reader=reader, wall=lambda: clock[0])


# ---- policy section ----------------------------------------------------------------


def test_policy_section_enables_and_validates() -> None:
    assert SchedParams.from_config({}).rightsize.enabled is False
    p = SchedParams.from_config(
        {
            "rightsize": {
                "prometheus_url": "http://prom:9090",
                "mode": "initial",
                "interval_seconds": 30,
                "namespaces": ["serving"],
                "policies": {"default": {"max_memory": "40Gi"}},
            }
        }
    ).rightsize
    assert (p.enabled, p.mode, p.interval_seconds, p.namespaces) == (
        True,
        "initial",
        30.0,
        ("serving",),
    )
    assert (p.min_replicas, p.min_change, p.annotate) == (2, 0.1, True)


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ({"prometheus_url": "http://p", "modee": "off"}, "unknown rightsize settings: ['modee']"),
        ({"mode": "off"}, "prometheus_url"),
        ({"prometheus_url": "http://p", "mode": "auto"}, "rightsize.mode"),
        ({"prometheus_url": "http://p", "min_replicas": 1}, "min_replicas"),
        ({"prometheus_url": "http://p", "interval_seconds": 0}, "interval_seconds"),
        (
            {"prometheus_url": "http://p", "policies": {"default": {"max_mem": 1}}},
            "rightsize.policies: default: unknown key",
        ),
        (
            {"prometheus_url": "http://p", "policies": {}, "policies_file": "/x.yaml"},
            "exclusive",
        ),
    ],
)
def test_policy_section_errors(section: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=None) as exc:
        SchedParams.from_config({"rightsize": section})
    assert error in str(exc.value)


def test_shipped_policy_file_loads() -> None:
    import yaml

    from tests.helpers import REPO

    data = yaml.safe_load((REPO / "config" / "policy.yaml").read_text())
    SchedParams.from_config(data)


# ---- workload of a pod -------------------------------------------------------------


@pytest.mark.parametrize(
    ("desc", "meta", "want"),
    [
        (
            "ReplicaSet's pod: its Deployment",
            {
                "name": "x",
                "ownerReferences": [
                    {"kind": "ReplicaSet", "name": "infer-7d9f8b6c5d", "controller": True}
                ],
            },
            "serving/infer",
        ),
        (
            "StatefulSet's pod: the StatefulSet",
            {
                "name": "db-0",
                "ownerReferences": [{"kind": "StatefulSet", "name": "db", "controller": True}],
            },
            "serving/db",
        ),
        ("no owner, Deployment-like name", {"name": "infer-7d9f8b6c5d-x2x4k"}, "serving/infer"),
        (
            "no name yet: generateName",
            {"generateName": "infer-7d9f8b6c5d-"},
            "serving/infer-7d9f8b6c5d",
        ),
        ("bare pod", {"name": "debug"}, "serving/debug"),
    ],
)
def test_workload_of(desc: str, meta: dict[str, Any], want: str) -> None:
    assert workload_of({"metadata": meta}, NS) == want, desc


# ---- off mode: publish -------------------------------------------------------------


def test_recommendation_published_from_prometheus_and_refreshed_incrementally() -> None:
    prom = Prom(lambda t: 6 * GiB + (2 * GiB if int(t) % 3600 < 60 else 0))  # hourly peak
    clock = [T0]
    rs = sizer(prom, clock, step_seconds=60)
    rs.tick()
    starts = {start for _, start, _ in prom.calls}
    assert starts == {T0 - 6 * 3600}  # the first round reads the lookback
    rec = rs.for_workload("serving/infer")
    assert rec is not None
    # six hours at one sample a minute: a quarter day of confidence, headroom
    # 1.15 x (1 + 1/0.25)^0.2016 = 1.59 over the 8 GiB peak, in force from now (the
    # replayed history's own decisions were never applied)
    assert "peak 8.0 GiB x 1.59 (0.25 days of history)" in rec.reason
    assert rec.timestamp == T0
    target = 8 * GiB * 1.15 * (1 + 1 / 0.25) ** 0.2016
    assert rec.gpu_memory_limit_bytes == math.ceil(target / MiB) * MiB
    assert rec.mode == "memory-share" and rec.gpu_compute_ratio == 0.3
    # a pod of the workload gets it, with what placement reads: the measured compute p95
    # (every utilisation sample 0.25) and the default policy's 8 tenants and whole GPU;
    # another namespace's pod gets nothing
    pod = {"metadata": {"name": PODS[0], "namespace": NS}}
    assert rs.for_pod(pod) == PodSizing(rec, 0.25, 8, 1.0)
    assert "no recommendation" in str(rs.for_pod({"metadata": {"name": "x", "namespace": "other"}}))
    view = rs.view()
    assert view["reads"] == {"ok": 1, "error": 0}
    assert view["workloads"][0]["containers"] == ["server"]
    assert view["workloads"][0]["gpu_memory_limit_bytes"] == rec.gpu_memory_limit_bytes
    assert view["workloads"][0]["compute_p95"] == 0.25
    assert view["workloads"][0]["max_tenants_per_gpu"] == 8
    assert view["workloads"][0]["gpu_compute_limit"] == 1.0
    # metrics
    reg = CollectorRegistry()
    reg.register(rs)
    labels = {"namespace": "serving", "workload": "infer", "container": "server"}
    got = reg.get_sample_value("topoplace_rightsize_memory_bytes", labels)
    assert got == rec.gpu_memory_limit_bytes
    assert reg.get_sample_value("topoplace_rightsize_compute_ratio", labels) == 0.3
    mode = {"namespace": "serving", "workload": "infer", "mode": "memory-share"}
    assert reg.get_sample_value("topoplace_rightsize_mode", mode) == 1.0
    assert "topoplace_rightsize_reads_total" in generate_latest(reg).decode()
    # the next round reads only what is new
    prom.calls.clear()
    clock[0] = T0 + 600
    rs.tick()
    assert {start for _, start, _ in prom.calls} == {T0 + 60}
    assert rs.view()["reads"]["ok"] == 2


def test_pod_sizing_carries_the_workloads_policy_and_measured_p95() -> None:
    """A workload policy's tenancy limits reach the pod's sizing, the namespace default
    stays for other workloads; a workload with memory samples only has no measured p95."""
    prom = Prom(lambda t: 6 * GiB)
    clock = [T0]
    policies = {
        "default": {"max_tenants_per_gpu": 4},
        "workloads": {"serving/infer": {"max_tenants_per_gpu": 3, "gpu_compute_limit": 0.8}},
    }
    rs = sizer(prom, clock, policies=policies)
    rs.tick()
    got = rs.for_pod({"metadata": {"name": PODS[0], "namespace": NS}})
    assert isinstance(got, PodSizing)
    assert (got.compute_p95, got.max_tenants_per_gpu, got.gpu_compute_limit) == (0.25, 3, 0.8)
    assert rec_json(got)["gpu_compute_limit"] == 0.8
    # no utilisation series: the p95 is not stated (placement falls back to the share)
    bare = Prom(lambda t: 6 * GiB)
    bare_call = bare.__call__

    def memory_only(request: httpx.Request) -> httpx.Response:
        if b"utilization" in request.url.query:
            body = {"status": "success", "data": {"resultType": "matrix", "result": []}}
            return httpx.Response(200, json=body)
        return bare_call(request)

    rs2 = RightSizer(
        None,
        settings(policies=policies),
        reader=PrometheusReader(
            "http://prometheus.monitoring:9090",
            client=httpx.Client(transport=httpx.MockTransport(memory_only)),
        ),
        wall=lambda: clock[0],
    )
    rs2.tick()
    got2 = rs2.sizing_of("serving/infer")
    assert got2 is not None and got2.compute_p95 is None
    assert "compute_p95" not in got2.note_fields()
    assert got2.note_fields() == {"max_tenants_per_gpu": 3, "gpu_compute_limit": 0.8}


def test_prometheus_down_keeps_the_recommendation_and_counts_the_error() -> None:
    prom = Prom(lambda t: 6 * GiB)
    clock = [T0]
    rs = sizer(prom, clock)
    rs.tick()
    before = rs.for_workload("serving/infer")

    def down(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"status": "error", "error": "overloaded"})

    rs.reader.client = httpx.Client(transport=httpx.MockTransport(down))
    clock[0] = T0 + 600
    rs.tick()
    assert rs.for_workload("serving/infer") == before
    assert rs.view()["reads"] == {"ok": 1, "error": 1}
    assert "overloaded" in rs.view()["last_error"]


def test_namespaces_limit_scope() -> None:
    rs = sizer(Prom(lambda t: 6 * GiB), [T0], namespaces=["other"])
    rs.tick()
    assert rs.for_workload("serving/infer") is None
    assert "not right-sized" in str(rs.for_pod({"metadata": {"name": PODS[0], "namespace": NS}}))


# ---- recreate ----------------------------------------------------------------------


def pod(name: str, uid: str, gpumem_mib: int, created: str, deleting: bool = False) -> dict:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": uid,
        "creationTimestamp": created,
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "infer-7d9f8b6c5d",
                "uid": "rs-uid",
                "controller": True,
            }
        ],
    }
    if deleting:
        meta["deletionTimestamp"] = "2025-10-09T08:50:00Z"
    limits = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": str(gpumem_mib),
        "nvidia.com/gpucores": "30",
    }
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": {"containers": [{"name": "server", "resources": {"limits": limits}}]},
    }


def pod_list(*pods: dict) -> dict:
    return {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "9"},
        "items": list(pods),
    }


# T0 = 2025-10-09T08:53:20Z
OLD, YOUNG = "2025-10-09T07:00:00Z", "2025-10-09T08:52:00Z"
PODS_PATH = f"/api/v1/namespaces/{NS}/pods"


def recreate_sizer(srv: RecordedApiServer, clock: list[float], **kw: Any) -> RightSizer:
    rs = sizer(
        Prom(lambda t: 6 * GiB),
        clock,
        api=srv.api(),
        **{"mode": "recreate", "annotate": False, "min_age_seconds": 600, **kw},
    )
    rs.refresh(clock[0])
    return rs


def evictions(srv: RecordedApiServer) -> list[str]:
    return [r["path"] for r in srv.requests if r["method"] == "POST"]


def test_recreate_evicts_the_oldest_pod_off_by_more_than_the_threshold() -> None:
    clock = [T0]
    with RecordedApiServer() as srv:
        srv.add("GET", PODS_PATH, 200, pod_list())
        rs = recreate_sizer(srv, clock)
        want = rs.for_workload("serving/infer")
        assert want is not None
        right = want.gpu_memory_limit_bytes // MiB
        srv.routes.clear()
        items = pod_list(
            pod("infer-7d9f8b6c5d-aaaaa", "u-right", right, OLD),
            pod("infer-7d9f8b6c5d-bbbbb", "u-young", 20000, YOUNG),
            pod("infer-7d9f8b6c5d-ccccc", "u-off", 20000, OLD),
        )
        srv.add("GET", PODS_PATH, 200, items)
        path = f"{PODS_PATH}/infer-7d9f8b6c5d-ccccc/eviction"
        srv.add("POST", path, 201, "eviction_201_created.json")
        rs.recreate(clock[0])
        assert evictions(srv) == [path]
        sent = json.loads(srv.requests[-1]["body"])
        assert sent["kind"] == "Eviction" and sent["deleteOptions"] == {
            "preconditions": {"uid": "u-off"}
        }
        assert rs.view()["evictions"] == {"evicted": 1}
        # one at a time: the evicted pod is still listed (terminating or not) -> nothing
        clock[0] += 3600
        rs.recreate(clock[0])
        assert len(evictions(srv)) == 1
        # replaced by a right-sized pod: the next pod off (old enough by now) goes
        srv.routes.clear()
        srv.add(
            "GET",
            PODS_PATH,
            200,
            pod_list(
                pod("infer-7d9f8b6c5d-aaaaa", "u-right", right, OLD),
                pod("infer-7d9f8b6c5d-bbbbb", "u-young", 20000, YOUNG),
                pod("infer-7d9f8b6c5d-ddddd", "u-new", right, "2025-10-09T09:00:00Z"),
            ),
        )
        path2 = f"{PODS_PATH}/infer-7d9f8b6c5d-bbbbb/eviction"
        srv.add("POST", path2, 201, "eviction_201_created.json")
        rs.recreate(clock[0])
        assert evictions(srv) == [path, path2]


def test_recreate_waits_on_a_disruption_budget_and_the_rate_limit() -> None:
    clock = [T0]
    with RecordedApiServer() as srv:
        srv.add(
            "GET",
            PODS_PATH,
            200,
            pod_list(
                pod("infer-7d9f8b6c5d-aaaaa", "u-a", 20000, OLD),
                pod("infer-7d9f8b6c5d-bbbbb", "u-b", 20000, OLD),
            ),
        )
        path = f"{PODS_PATH}/infer-7d9f8b6c5d-aaaaa/eviction"
        srv.add("POST", path, 429, "eviction_429_disruption_budget.json")
        srv.add("POST", path, 201, "eviction_201_created.json")
        rs = recreate_sizer(srv, clock, min_eviction_interval_seconds=120)
        rs.recreate(clock[0])
        assert rs.view()["evictions"] == {"blocked": 1}
        assert rs.view()["recent"][-1]["action"] == "blocked"
        clock[0] += 60  # within the interval: no new try
        rs.recreate(clock[0])
        assert len(evictions(srv)) == 1
        clock[0] += 61
        rs.recreate(clock[0])
        assert evictions(srv) == [path, path]
        assert rs.view()["evictions"] == {"blocked": 1, "evicted": 1}


@pytest.mark.parametrize(
    ("desc", "pods", "kw"),
    [
        ("one replica", [("aaaaa", 20000, OLD, False)], {}),
        ("too young", [("aaaaa", 20000, YOUNG, False), ("bbbbb", 20000, YOUNG, False)], {}),
        ("a pod terminating", [("aaaaa", 20000, OLD, False), ("bbbbb", 20000, OLD, True)], {}),
        (
            "change under the threshold",
            [("aaaaa", None, OLD, False), ("bbbbb", None, OLD, False)],
            {},
        ),
        ("mode off", [("aaaaa", 20000, OLD, False), ("bbbbb", 20000, OLD, False)], {"mode": "off"}),
    ],
)
def test_recreate_leaves_alone(desc: str, pods: list[Any], kw: dict[str, Any]) -> None:
    clock = [T0]
    with RecordedApiServer() as srv:
        srv.add("GET", PODS_PATH, 200, pod_list())
        rs = recreate_sizer(srv, clock, **kw)
        rec = rs.for_workload("serving/infer")
        assert isinstance(rec, Recommendation)
        near = int(rec.gpu_memory_limit_bytes / MiB * 1.05)
        srv.routes.clear()
        items = [pod(f"infer-7d9f8b6c5d-{n}", f"u-{n}", m or near, c, d) for n, m, c, d in pods]
        srv.add("GET", PODS_PATH, 200, pod_list(*items))
        srv.add(
            "POST", f"{PODS_PATH}/infer-7d9f8b6c5d-aaaaa/eviction", 201, "eviction_201_created.json"
        )
        srv.add(
            "POST", f"{PODS_PATH}/infer-7d9f8b6c5d-bbbbb/eviction", 201, "eviction_201_created.json"
        )
        rs.tick()
        assert evictions(srv) == [], desc


def test_shipped_policy_example_section_loads() -> None:
    """The commented ``rightsize:`` example at the end of config/policy.yaml, uncommented."""
    import yaml

    from tests.helpers import REPO

    text = (REPO / "config" / "policy.yaml").read_text().split("# rightsize:")[1]
    body = "\n".join(line[1:] for line in text.splitlines() if line.startswith("#"))
    p = SchedParams.from_config(yaml.safe_load("rightsize:\n" + body)).rightsize
    assert (p.enabled, p.mode, p.step_seconds, p.min_replicas) == (True, "off", 60.0, 2)


# ---- the inspect API and explain's data ---------------------------------------------


def test_inspect_rightsize_and_the_pods_recommendation_in_decisions() -> None:
    from scheduler.cli.clusterfile import build_file_extender
    from scheduler.server.app import create_app
    from tests.helpers import SyncASGIClient

    extender, _ = build_file_extender(None, SchedParams())
    app = create_app(extender)
    c = SyncASGIClient(app)
    off = c.get("/v1/inspect/rightsize").json()
    assert off["mode"] is None and "off" in off["why_not"]
    assert "rightsize" not in c.get("/v1/inspect/decisions", params={"pod": "a/b"}).json()
    rs = sizer(Prom(lambda t: 6 * GiB), [T0], step_seconds=60)
    rs.tick()
    app.state.rightsizer = rs
    view = c.get("/v1/inspect/rightsize").json()
    assert [w["workload"] for w in view["workloads"]] == ["serving/infer"]
    assert view["mode"] == "off"
    got = c.get("/v1/inspect/decisions", params={"pod": f"{NS}/{PODS[1]}"}).json()["rightsize"]
    rec = rs.for_workload("serving/infer")
    assert rec is not None
    assert got["gpu_memory_limit_bytes"] == rec.gpu_memory_limit_bytes
    assert got["reason"] == rec.reason and got["mode"] == "memory-share"
    other = c.get("/v1/inspect/decisions", params={"pod": f"{NS}/lonely"}).json()["rightsize"]
    assert other == {"why_not": "no recommendation for workload serving/lonely"}


def test_rightsize_show_over_the_inspect_api(capsys: pytest.CaptureFixture[str]) -> None:
    """``topoplace rightsize show`` reads a running extender (here its ASGI app through
    httpx) and prints each workload's size and why, or one pod's."""
    from scheduler.cli.clusterfile import build_file_extender
    from scheduler.cli.rightsize import fetch_show, render_show
    from scheduler.server.app import create_app

    extender, _ = build_file_extender(None, SchedParams())
    app = create_app(extender)

    def client() -> httpx.Client:
        import anyio

        class Sync:
            def get(self, url: str, **kw: Any) -> httpx.Response:
                async def go() -> httpx.Response:
                    transport = httpx.ASGITransport(app=app)
                    async with httpx.AsyncClient(transport=transport) as c:
                        return await c.get(url, **kw)

                return anyio.run(go)

        return Sync()  # type: ignore[return-value]

    off = fetch_show("http://x", None, client())
    assert render_show(off)[0].startswith("the right-sizer is off")
    rs = sizer(Prom(lambda t: 6 * GiB), [T0], step_seconds=60)
    rs.tick()
    app.state.rightsizer = rs
    rec = rs.for_workload("serving/infer")
    assert rec is not None
    lines = render_show(fetch_show("http://x", None, client()))
    assert lines[0].startswith("right-sizer: mode off, Prometheus http://prometheus.monitoring")
    assert lines[1] == (
        f"serving/infer: {rec.gpu_memory_limit_bytes / GiB:.1f} GiB GPU memory, 30% of the SMs,"
        f" memory-share\n  why: {rec.reason}"
    )
    one = fetch_show("http://x", f"{NS}/{PODS[0]}", client())
    assert render_show(one)[0].startswith(f"{NS}/{PODS[0]} -> serving/infer: ")
    lonely = fetch_show("http://x", f"{NS}/lonely", client())
    assert render_show(lonely) == [f"{NS}/lonely: no recommendation for workload serving/lonely"]
    from scheduler.cli.rightsize import SeriesError

    with pytest.raises(SeriesError, match="NAMESPACE/NAME"):
        fetch_show("http://x", "lonely", client())


def test_recreate_compares_with_what_the_webhook_would_write() -> None:
    """A pod is recreated only if its replacement would differ: gpushare rounds up to its
    unit, an exclusive HAMi GPU has no memory cap, and MIG is not written by the webhook."""
    reader = PrometheusReader(
        "http://p", client=httpx.Client(transport=httpx.MockTransport(Prom(lambda t: 0)))
    )
    rs = RightSizer(None, settings(mode="recreate"), reader=reader, gpushare_unit_mib=1024)
    share = Recommendation(T0, "serving/infer", 9 * GiB + 300 * MiB, 0.3, "memory-share", "r")
    hami = pod("p", "u", 20000, OLD)
    gpushare = copy.deepcopy(hami)
    gpushare["spec"]["containers"][0]["resources"] = {"limits": {"aliyun.com/gpu-mem": "10"}}
    assert rs.admitted_memory(hami, share) == (9 * 1024 + 300) * MiB
    assert rs.admitted_memory(gpushare, share) == 10 * GiB  # 9.3 GiB in GiB units: 10
    exclusive = Recommendation(T0, "serving/infer", 78 * GiB, 1.0, "exclusive", "r")
    assert rs.admitted_memory(hami, exclusive) is None
    mig = Recommendation(T0, "serving/infer", 20 * GiB, 2 / 7, "mig:2g.20gb", "r")
    assert rs.admitted_memory(hami, mig) is False
    whole = copy.deepcopy(hami)
    whole["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert rs.admitted_memory(whole, share) is False


@pytest.mark.parametrize(
    ("desc", "limits", "rec", "evicted"),
    [
        (
            "gpushare at the rounded size",
            {"aliyun.com/gpu-mem": "10"},
            ("memory-share", 9.3),
            False,
        ),
        ("gpushare off", {"aliyun.com/gpu-mem": "20"}, ("memory-share", 9.3), True),
        ("MIG: the webhook would not write it", None, ("mig:2g.20gb", 20), False),
        ("exclusive: capped pod goes", None, ("exclusive", 78), True),
    ],
)
def test_recreate_by_backend(desc: str, limits: Any, rec: tuple[str, float], evicted: bool) -> None:
    clock = [T0]
    with RecordedApiServer() as srv:
        srv.add("GET", PODS_PATH, 200, pod_list())
        rs = recreate_sizer(srv, clock)
        mode, gib = rec
        rs.current["serving/infer"] = Recommendation(
            T0, "serving/infer", int(gib * GiB), 0.3, mode, "r"
        )
        pods = [pod(f"infer-7d9f8b6c5d-{n}", f"u-{n}", 20000, OLD) for n in ("aaaaa", "bbbbb")]
        if limits is not None:
            for p in pods:
                p["spec"]["containers"][0]["resources"] = {"limits": limits}
        srv.routes.clear()
        srv.add("GET", PODS_PATH, 200, pod_list(*pods))
        path = f"{PODS_PATH}/infer-7d9f8b6c5d-aaaaa/eviction"
        srv.add("POST", path, 201, "eviction_201_created.json")
        rs.recreate(clock[0])
        assert evictions(srv) == ([path] if evicted else []), desc


def test_annotation_is_tried_again_after_a_failed_write() -> None:
    """The workload's annotation is written through its controller; a refused write (the
    API server answers the PATCH 503) leaves it due, so the next round tries again."""
    clock = [T0]
    with RecordedApiServer() as srv:
        srv.add("GET", PODS_PATH, 200, pod_list(pod("infer-7d9f8b6c5d-aaaaa", "u-a", 20000, OLD)))
        rs_path = f"/apis/apps/v1/namespaces/{NS}/replicasets/infer-7d9f8b6c5d"
        srv.add(
            "GET",
            rs_path,
            200,
            {
                "kind": "ReplicaSet",
                "apiVersion": "apps/v1",
                "metadata": {"name": "infer-7d9f8b6c5d"},
            },
        )
        srv.add("PATCH", rs_path, 503, "list_503_service_unavailable.json")
        rs = sizer(Prom(lambda t: 6 * GiB), clock, api=srv.api(), step_seconds=60)
        rs.tick()
        assert "serving/infer" not in rs.annotated
        clock[0] += 60
        rs.tick()
        gets = [r for r in srv.requests if r["path"] == rs_path and r["method"] == "GET"]
        patches = [r for r in srv.requests if r["path"] == rs_path and r["method"] == "PATCH"]
        assert len(gets) == 2 and len(patches) == 2
        assert [a for a in rs.view()["recent"] if a["action"] == "annotated"] == []


def test_rightsize_line_for_explain() -> None:
    from scheduler.cli.rightsize import rightsize_lines

    assert rightsize_lines({"pod": "a/b", "decisions": []}) == []
    assert rightsize_lines({"rightsize": {"why_not": "no recommendation for workload a/b"}}) == [
        "  right-size: no recommendation for workload a/b"
    ]
    rec = Recommendation(T0, "serving/infer", 43950 * MiB, 0.3, "memory-share", "peak 32.3 GiB")
    from scheduler.kube.rightsizer import rec_json

    assert rightsize_lines({"rightsize": rec_json(rec)}) == [
        "  right-size: serving/infer gets 42.9 GiB GPU memory, 30% of the SMs, memory-share"
        " (peak 32.3 GiB)"
    ]


def test_explain_text_carries_the_rightsize_line() -> None:
    from scheduler.cli.explain import render
    from scheduler.kube.rightsizer import rec_json

    rec = Recommendation(T0, "serving/infer", 43950 * MiB, 0.3, "memory-share", "peak 32.3 GiB")
    line = (
        "  right-size: serving/infer gets 42.9 GiB GPU memory, 30% of the SMs, memory-share"
        " (peak 32.3 GiB)"
    )
    empty = render({"pod": "serving/infer-0", "decisions": [], "rightsize": rec_json(rec)})
    assert empty[-1] == line and empty[0].startswith("serving/infer-0: no decision held")
    one = {"pod": "serving/infer-0", "verb": "bind", "summary": "bound on n0"}
    assert render({"decisions": [one], "rightsize": rec_json(rec)}) == [
        "serving/infer-0 [bind] bound on n0",
        line,
    ]
