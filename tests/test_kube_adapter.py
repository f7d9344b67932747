"""The Kubernetes adapter against payloads recorded from a real kube-apiserver v1.28.7.

No API server runs in CI. The recorded bodies (tests/fixtures/kube, see its manifest.json)
are replayed either over real HTTP by ``RecordedApiServer`` (so the ``kubernetes`` client
and ``KubeApi`` run unchanged) or in-process by ``RecordedApiFake``. The live suite is
tests/kube (marker ``kube``).
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import ssl
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from scheduler.core.disruption import BUDGETS_EXTRA, budgets_from
from scheduler.core.model import PLACEMENT_ANNOTATION
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import build_snapshot
from scheduler.kube import binder as kb
from scheduler.kube import protobuf
from scheduler.kube.client import (
    NODES,
    PDBS,
    PODS,
    ApiError,
    ApiUnavailable,
    KubeApi,
    Timeouts,
    load_api_client,
)
from scheduler.kube.recovery import recover, recover_gang_plans
from scheduler.kube.runner import (
    ERR_NOT_READY,
    ERR_SHUTTING_DOWN,
    InFlight,
    KubeOptions,
    build_kube_runtime,
)
from scheduler.kube.watcher import (
    POD_GROUP_KINDS,
    PODGROUPS_EXTRA,
    Backoff,
    KubeWatcher,
    WatchOptions,
    feeds_cache,
)
from scheduler.runtime.cache import ClusterCache
from tests.kube.recorded import (
    SHARED_EXTENDER,
    RecordedApiFake,
    RecordedApiServer,
    recorded,
    recorded_error,
    recorded_stream,
)

PG = POD_GROUP_KINDS[0]

BIND_PATHS = ("thread", "event-loop")
"""The two ways a bind reaches the API: ``KubeBinder.bind`` (urllib3, in a worker thread)
and ``KubeBinder.bind_async`` (``scheduler.kube.aio.AsyncPoster`` on the event loop)."""


def bind_via(path: str, binder: kb.KubeBinder, pod: Any, node: str, ann: Any) -> str:
    """``binder.bind`` or ``binder.bind_async`` (run on a fresh event loop)."""
    if path == "thread":
        return binder.bind(pod, node, ann)
    return asyncio.run(binder.bind_async(pod, node, ann))


PG_DISCOVERY = ("scheduling.x-k8s.io", "v1alpha1")
BINDING_PATH = "/api/v1/namespaces/rec/pods/train-a/binding"
POD_PATH = "/api/v1/namespaces/rec/pods/train-a"


class Clock:
    """A hand-driven monotonic clock."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def fake_api(podgroups: bool = True) -> RecordedApiFake:
    """The recorded cluster: 2 nodes, the pod list, and (optionally) the PodGroup API."""
    api = RecordedApiFake()
    api.lists[NODES.name] = recorded("node_list.json")
    api.lists[PODS.name] = recorded("pod_list.json")
    if podgroups:
        api.resources[PG_DISCOVERY] = recorded("discovery_scheduling.x-k8s.io_v1alpha1.json")
        api.lists[PG.name] = recorded("podgroup_list.json")
    return api


def empty_cache(params: SchedParams | None = None, clock: Any = None) -> ClusterCache:
    params = params or SchedParams()
    kw = {} if clock is None else {"clock": clock}
    return ClusterCache(build_snapshot([], [], params), params, **kw)


def watcher(api: Any, clock: Any = None, **opts: Any) -> tuple[KubeWatcher, list[float]]:
    slept: list[float] = []
    w = KubeWatcher(
        api,
        empty_cache(clock=clock),
        WatchOptions(**opts),
        clock=clock or time.monotonic,
        sleep=slept.append,
    )
    return w, slept


def bound_pod() -> dict[str, Any]:
    """rec/train-a as the API returned it after our binding (recorded)."""
    return recorded("get_pod_bound.json")


def pending_train_a() -> dict[str, Any]:
    pod = bound_pod()
    pod["spec"].pop("nodeName")
    pod["metadata"].pop("annotations")
    return pod


# ---- binder: the Binding we send --------------------------------------------------------


def test_binding_body_is_the_default_binders_plus_annotations() -> None:
    path = SHARED_EXTENDER / "binding_request.json"
    if not path.exists():
        pytest.skip(f"shared fixture {path} not present")
    want = json.loads(path.read_text())
    pod = {"metadata": dict(want["metadata"])}
    assert kb.binding_body(pod, want["target"]["name"]) == want
    ann = {PLACEMENT_ANNOTATION: '{"gpus":[0,1,2,3],"node":"dgx-h100-01","v":1}'}
    with_ann = kb.binding_body(pod, "dgx-h100-01", ann)
    assert with_ann == {**want, "metadata": {**want["metadata"], "annotations": ann}}


@pytest.mark.parametrize("path", BIND_PATHS)
def test_binder_posts_exactly_the_recorded_binding_over_http(path: str) -> None:
    sent = recorded("binding_request_sent.json")
    with RecordedApiServer() as srv:
        srv.add("POST", BINDING_PATH, 201, "binding_201_created.json")
        binder = kb.KubeBinder(srv.api())
        err = bind_via(
            path, binder, pending_train_a(), "rec-node-0", sent["metadata"]["annotations"]
        )
        assert err == ""
        (req,) = srv.requests
    assert req["method"] == "POST" and req["path"] == BINDING_PATH
    if path == "thread":
        assert json.loads(req["body"]) == sent
    else:  # the same Binding, in protobuf as kube-scheduler sends it (test_kube_protobuf)
        assert req["content_type"] == protobuf.CONTENT_TYPE
        assert req["body"] == protobuf.binding(sent)


# ---- binder: recorded error answers -> errors (table-driven) ----------------------------

BIND_ROWS = [
    # (description, status, body fixture, GET pod answer, target node, expected)
    (
        "409 and the pod is on that node: an idempotent retry",
        409,
        "binding_409_already_bound_same_node.json",
        "bound",
        "rec-node-0",
        "",
    ),
    (
        "409 and the pod is on another node: a conflict",
        409,
        "binding_409_already_bound_other_node.json",
        "bound",
        "rec-node-1",
        kb.ERR_CONFLICT + ": Operation cannot be fulfilled on pods/binding",
    ),
    (
        "409 UID precondition (pod recreated): a conflict even if the name is bound there",
        409,
        "binding_409_uid_precondition.json",
        "other-uid",
        "rec-node-0",
        kb.ERR_CONFLICT,
    ),
    (
        "404: the pod is gone",
        404,
        "binding_404_pod_missing.json",
        None,
        "rec-node-0",
        kb.ERR_POD_GONE + ': pods "no-such-pod" not found',
    ),
    (
        "503 text/plain from the API server",
        503,
        "list_503_service_unavailable.json",
        None,
        "rec-node-0",
        kb.ERR_SERVER + " 503: service unavailable",
    ),
    (
        "500 (the server's answer to an invalid Binding)",
        500,
        "binding_invalid_empty_target.json",
        None,
        "rec-node-0",
        kb.ERR_SERVER + " 500: target.name: Required value",
    ),
]


@pytest.mark.parametrize("path", BIND_PATHS)
@pytest.mark.parametrize(
    "desc,status,body,get,node,expected", BIND_ROWS, ids=[r[0] for r in BIND_ROWS]
)
def test_bind_errors_map_over_http(
    desc: str, status: int, body: str, get: str | None, node: str, expected: str, path: str
) -> None:
    with RecordedApiServer() as srv:
        srv.add("POST", BINDING_PATH, status, body)
        if get == "bound":
            srv.add("GET", POD_PATH, 200, "get_pod_bound.json")
        elif get == "other-uid":
            other = bound_pod()
            other["metadata"]["uid"] = "0279f382-0000-0000-0000-000000000000"
            srv.add("GET", POD_PATH, 200, other)
        else:
            srv.add("GET", POD_PATH, 404, "get_pod_404.json")
        err = bind_via(path, kb.KubeBinder(srv.api()), pending_train_a(), node, {})
    if expected == "":
        assert err == ""
    else:
        assert err.startswith(expected), err


@pytest.mark.parametrize("path", BIND_PATHS)
def test_bind_timeout_is_an_error_unless_the_pod_is_bound(path: str) -> None:
    with RecordedApiServer() as srv:
        srv.add("POST", BINDING_PATH, 201, "binding_201_created.json", delay=1.0)
        srv.add("GET", POD_PATH, 404, "get_pod_404.json")
        binder = kb.KubeBinder(srv.api(read_timeout=0.3))
        err = bind_via(path, binder, pending_train_a(), "rec-node-0", {})
        assert err == kb.ERR_TIMEOUT
    with RecordedApiServer() as srv:  # the answer was lost but the binding happened
        srv.add("POST", BINDING_PATH, 201, "binding_201_created.json", delay=1.0)
        srv.add("GET", POD_PATH, 200, "get_pod_bound.json")
        binder = kb.KubeBinder(srv.api(read_timeout=0.3))
        err = bind_via(path, binder, pending_train_a(), "rec-node-0", {})
        assert err == ""


@pytest.mark.parametrize("path", BIND_PATHS)
def test_bind_to_an_unreachable_server_is_an_error(path: str) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    from kubernetes import client

    cfg = client.Configuration(host=f"http://127.0.0.1:{port}")
    cfg.retries = False
    api = KubeApi(client.ApiClient(cfg), Timeouts(connect=0.5, read=0.5))
    err = bind_via(path, kb.KubeBinder(api), pending_train_a(), "rec-node-0", {})
    assert err.startswith(kb.ERR_UNAVAILABLE)


def test_fetch_pod_strips_managed_fields_and_maps_404_to_none() -> None:
    with RecordedApiServer() as srv:
        srv.add("GET", POD_PATH, 200, "get_pod_bound.json")
        b = kb.KubeBinder(srv.api())
        pod = b.fetch_pod("rec", "train-a")
        assert pod is not None and "managedFields" not in pod["metadata"]
        assert pod["spec"]["nodeName"] == "rec-node-0" and pod["kind"] == "Pod"
        assert b.fetch_pod("rec", "nope") is None


def test_extender_bind_through_kube_binder_confirms_or_releases() -> None:
    api = fake_api()
    api.lists[PODS.name]["items"] = []
    cache = empty_cache()
    w = KubeWatcher(api, cache, WatchOptions(podgroups=False))
    w.sync()
    from scheduler.server.extender import Extender

    binder = kb.KubeBinder(api)
    ext = Extender(cache, binder, fetch_pod=binder.fetch_pod)
    pod = pending_train_a()
    api.pods["rec/train-a"] = pod
    args = {
        "PodName": "train-a",
        "PodNamespace": "rec",
        "PodUID": pod["metadata"]["uid"],
        "Node": "rec-node-0",
    }
    # The API refuses (404: deleted meanwhile): the assumption is released.
    api.binding_results.append(recorded_error("binding_404_pod_missing.json", 404))
    assert ext.bind(args)["Error"].startswith(kb.ERR_POD_GONE)
    assert "rec/train-a" not in cache.snapshot().pods
    # Accepted: held as bound with the annotation sent on the Binding.
    assert ext.bind(args) == {"Error": ""}
    held = cache.snapshot().pods["rec/train-a"]
    assert not held.assumed and held.node == "rec-node-0" and len(held.gpus) == 4
    sent = api.bindings[-1]
    assert json.loads(sent["metadata"]["annotations"][PLACEMENT_ANNOTATION])["gpus"] == list(
        held.gpus
    )


# ---- watcher: initial list, events, relist ---------------------------------------------


def test_initial_sync_from_recorded_lists() -> None:
    api = fake_api()
    w, _ = watcher(api)
    w.sync()
    snap = w.cache.snapshot()
    assert w.synced and [n.name for n in snap.nodes] == ["rec-node-0", "rec-node-1"]
    # train-a (4 GPUs) and train-b (2 GPUs) are bound with placement records; done-job
    # Succeeded; gang-w-0 pending; web-cpu-only neither GPU, bound nor gang.
    assert {k: (p.node, p.gpus, p.gpu_indices_known) for k, p in snap.pods.items()} == {
        "rec/train-a": ("rec-node-0", (0, 1, 2, 3), True),
        "rec/train-b": ("rec-node-1", (0, 1), True),
    }
    stored = {o["metadata"]["name"] for o in w.objects(PODS)}
    assert stored == {"train-a", "train-b", "done-job", "gang-w-0"}
    assert all("managedFields" not in o["metadata"] and o["kind"] == "Pod" for o in w.objects(PODS))
    assert list(snap.extra[PODGROUPS_EXTRA]) == ["rec/llm", "rec/tmp"]
    # Pending GPU/gang pods are remembered for bind (no filter call needed after restart).
    assert w.cache.pending("rec/gang-w-0") is not None
    assert w.cache.pending("rec/train-a") is None and w.cache.pending("rec/done-job") is None
    assert [k.name for k in w.kinds] == ["nodes", "pods", PG.name]
    assert w.streams["pods"].rv == recorded("pod_list.json")["metadata"]["resourceVersion"]


def test_podgroup_apis_not_served_are_skipped_quietly() -> None:
    api = fake_api(podgroups=False)
    w, _ = watcher(api)
    w.sync()
    assert [k.name for k in w.kinds] == ["nodes", "pods"]
    assert w.cache.snapshot().extra[PODGROUPS_EXTRA] == {}
    assert all(api.calls[f"discovery:{k.group}/{k.version}"] == 1 for k in POD_GROUP_KINDS)


def test_feeds_cache_filter() -> None:
    pods = {p["metadata"]["name"]: p for p in recorded("pod_list.json")["items"]}
    assert {n for n, p in pods.items() if feeds_cache(p)} == {
        "train-a",
        "train-b",
        "done-job",
        "gang-w-0",
    }


def _start_from_stream_origin(api: RecordedApiFake) -> KubeWatcher:
    """A watcher synced to the state right before watch_pods_stream.jsonl began."""
    api.lists[PODS.name] = {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "234"},
        "items": [],
    }
    w, _ = watcher(api)
    w.sync()
    return w


def test_recorded_pod_watch_stream_applied_to_the_cache() -> None:
    api = fake_api(podgroups=False)
    w = _start_from_stream_origin(api)
    s = w.streams["pods"]
    held = []
    for ev in recorded_stream("watch_pods_stream.jsonl"):
        w.apply_event(s, ev)
        held.append(sorted((k, p.node, p.gpus) for k, p in w.cache.snapshot().pods.items()))
    types = [e["type"] for e in recorded_stream("watch_pods_stream.jsonl")]
    assert types == ["ADDED"] * 4 + ["MODIFIED"] * 2 + ["ADDED"] + ["MODIFIED"] * 3 + ["DELETED"]
    assert held[3] == []  # four pending pods hold nothing
    assert held[4] == [("rec/train-a", "rec-node-0", (0, 1, 2, 3))]  # bound + annotation
    assert held[5][1] == ("rec/train-b", "rec-node-1", (0, 1))
    assert ("rec/done-job", "rec-node-1", (2, 3)) in held[7]  # bound without a record
    assert all(k != "rec/done-job" for k, _, _ in held[8])  # Succeeded releases
    assert held[-1] == [("rec/train-b", "rec-node-1", (0, 1))]  # DELETED releases
    assert s.rv == "245"
    assert "rec/web-cpu-only" not in s.store and "rec/train-a" not in s.store


def test_bookmark_moves_the_resource_version_only() -> None:
    api = fake_api(podgroups=False)
    w, _ = watcher(api)
    w.sync()
    s = w.streams["pods"]
    before = w.cache.snapshot().generation
    bookmark = recorded_stream("watch_pods_bookmark_stream.jsonl")[-1]
    assert bookmark["type"] == "BOOKMARK"
    w.apply_event(s, bookmark)
    assert s.rv == "3278" and w.cache.snapshot().generation == before


def test_error_410_event_relists_and_keeps_assumptions() -> None:
    api = fake_api(podgroups=False)
    w, slept = watcher(api)
    w.sync()
    # A bind in flight: assumed, not yet visible in the API.
    from scheduler.core.model import PodInfo

    w.cache.assume(PodInfo(key="rec/inflight", uid="u", node="rec-node-0", gpus=(6, 7)))
    api.watches["pods"] = deque([recorded_stream("watch_pods_410_stream.jsonl")])
    s = w.streams["pods"]
    w.step(s)
    assert s.need_relist and slept == []  # 410: relist at once, no backoff
    # The cluster moved on meanwhile: train-b is gone.
    api.lists[PODS.name]["items"] = [
        p for p in api.lists[PODS.name]["items"] if p["metadata"]["name"] != "train-b"
    ]
    api.lists[PODS.name]["metadata"]["resourceVersion"] = "3300"
    w.step(s)
    assert api.calls["list:pods"] == 2 and not s.need_relist and s.rv == "3300"
    pods = w.cache.snapshot().pods
    assert "rec/train-b" not in pods and "rec/train-a" in pods
    assert pods["rec/inflight"].assumed and pods["rec/inflight"].gpus == (6, 7)
    assert api.watch_calls[-1] == ("pods", "3300")
    assert w.metrics.relists.labels(resource="pods")._value.get() == 1


def test_410_answer_to_the_watch_request_relists() -> None:
    api = fake_api(podgroups=False)
    w, _ = watcher(api)
    w.sync()
    status = recorded_stream("watch_pods_410_stream.jsonl")[0]["object"]
    api.watches["nodes"] = deque([ApiError.from_status(status, 410)])
    s = w.streams["nodes"]
    w.step(s)
    assert s.need_relist
    w.step(s)
    assert api.calls["list:nodes"] == 2


def test_podgroup_watch_stream_updates_extra() -> None:
    api = fake_api()
    api.lists[PG.name]["items"] = []
    w, _ = watcher(api)
    w.sync()
    seen = []
    for ev in recorded_stream("watch_podgroups_stream.jsonl"):
        w.apply_event(w.streams[PG.name], ev)
        seen.append(sorted(w.cache.snapshot().extra[PODGROUPS_EXTRA]))
    assert seen == [["rec/llm"], ["rec/llm", "rec/tmp"], ["rec/llm"]]
    assert w.cache.snapshot().extra[PODGROUPS_EXTRA]["rec/llm"]["spec"]["minMember"] == 2


def test_pod_event_before_its_node_is_applied_when_the_node_arrives() -> None:
    api = fake_api(podgroups=False)
    api.lists[NODES.name]["items"] = [
        n for n in api.lists[NODES.name]["items"] if n["metadata"]["name"] == "rec-node-0"
    ]
    api.lists[PODS.name]["items"] = []
    w, _ = watcher(api)
    w.sync()
    ev = next(
        e
        for e in recorded_stream("watch_pods_stream.jsonl")
        if e["type"] == "MODIFIED" and e["object"]["metadata"]["name"] == "train-b"
    )
    w.apply_event(w.streams["pods"], ev)
    assert "rec/train-b" not in w.cache.snapshot().pods  # rec-node-1 unknown yet
    node1 = next(
        n for n in recorded("node_list.json")["items"] if n["metadata"]["name"] == "rec-node-1"
    )
    w.apply_event(w.streams["nodes"], {"type": "ADDED", "object": node1})
    assert w.cache.snapshot().pods["rec/train-b"].gpus == (0, 1)
    w.apply_event(w.streams["nodes"], {"type": "DELETED", "object": copy.deepcopy(node1)})
    assert "rec/train-b" not in w.cache.snapshot().pods
    assert w.cache.snapshot().node("rec-node-1") is None


def test_a_deleted_pod_is_told_to_the_gone_hook_with_its_uid() -> None:
    api = fake_api(podgroups=False)
    w, _ = watcher(api)
    w.sync()
    gone: list[str] = []
    w.on_pod_gone = gone.append
    pod = next(p for p in api.lists[PODS.name]["items"] if p["spec"].get("nodeName"))
    w.apply_event(w.streams["pods"], {"type": "DELETED", "object": copy.deepcopy(pod)})
    assert gone == [pod["metadata"]["uid"]]
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    assert f"{ns}/{name}" not in w.cache.snapshot().pods


# ---- backoff and readiness --------------------------------------------------------------


def test_backoff_is_capped_exponential_with_seeded_jitter() -> None:
    import random

    a = Backoff(0.5, 4.0, 0.25, random.Random(3))
    b = Backoff(0.5, 4.0, 0.25, random.Random(3))
    da = [a.next() for _ in range(8)]
    assert da == [b.next() for _ in range(8)]
    bases = [0.5, 1, 2, 4, 4, 4, 4, 4]
    assert all(0.75 * base <= d <= base for d, base in zip(da, bases, strict=True))
    a.reset()
    assert a.next() <= 0.5


def test_readiness_follows_sync_recovery_and_watch_health() -> None:
    clock = Clock()
    api = fake_api(podgroups=False)
    opts = KubeOptions(watch=WatchOptions(broken_after_s=30, podgroups=False), expire_interval_s=0)
    rt = build_kube_runtime(api, SchedParams(), options=opts, gangs=None, clock=clock)
    ext, ready = rt.extender, rt.readiness
    assert not ready()
    filt = ext.filter({"Pod": pending_train_a(), "NodeNames": ["rec-node-0"], "Nodes": None})
    assert filt["Error"] == ERR_NOT_READY
    assert ext.bind({"PodName": "train-a", "PodNamespace": "rec", "PodUID": "", "Node": "x"}) == {
        "Error": ERR_NOT_READY
    }
    rt.watcher.sync()
    assert not ready()  # synced, not recovered
    rt.watcher.on_synced()
    assert ready() and rt.readiness.report is not None and rt.readiness.report.placements == 2
    # A watch breaks: still ready within the threshold, then not.
    pods = rt.watcher.streams["pods"]
    api.watches["pods"] = deque([ApiUnavailable("connection reset", timeout=False)])
    rt.watcher._sleep = lambda s: None
    rt.watcher.step(pods)
    assert pods.broken_since == clock.t
    clock.t += 30
    assert ready()
    clock.t += 1
    assert not ready() and rt.watcher.last_healthy == clock.t - 31
    assert ext.filter({"Pod": pending_train_a(), "NodeNames": ["rec-node-0"]})["Error"] == (
        ERR_NOT_READY
    )
    # Reconnected: healthy again.
    rt.watcher.step(pods)
    assert pods.broken_since is None and ready()


def test_stop_refuses_new_binds_and_waits_for_in_flight_ones() -> None:
    api = fake_api(podgroups=False)
    api.lists[PODS.name]["items"] = []
    api.pods["rec/train-a"] = pending_train_a()
    # The recorded pod names this scheduler; topoplace binds only for its own profiles.
    opts = KubeOptions(
        watch=WatchOptions(podgroups=False),
        expire_interval_s=0,
        scheduler_names=("not-scheduled-by-anyone",),
    )
    rt = build_kube_runtime(api, SchedParams(), options=opts, gangs=None)
    rt.watcher.sync()
    rt.watcher.on_synced()
    api.bind_gate = threading.Event()
    args = {
        "PodName": "train-a",
        "PodNamespace": "rec",
        "PodUID": pending_train_a()["metadata"]["uid"],
        "Node": "rec-node-0",
    }
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(rt.extender.bind(args)))
    t.start()
    for _ in range(200):
        if rt.extender.inflight.count == 1 and api.bindings:
            break
        time.sleep(0.01)
    stopped: list[bool] = []
    s = threading.Thread(target=lambda: stopped.append(rt.stop(timeout=5)))
    s.start()
    time.sleep(0.1)
    assert not stopped  # waiting for the bind
    assert rt.extender.bind(args) == {"Error": ERR_SHUTTING_DOWN}
    api.bind_gate.set()
    s.join(5)
    t.join(5)
    assert stopped == [True] and out == [{"Error": ""}]
    assert rt.cache.snapshot().pods["rec/train-a"].node == "rec-node-0"


def test_inflight_wait_times_out() -> None:
    f = InFlight()
    assert f.enter()
    assert not f.wait_idle(0.05)
    f.exit()
    assert f.wait_idle(0.05)
    f.close()
    assert not f.enter()


# ---- the real client over HTTP: lists and a chunked watch --------------------------------


def test_watcher_threads_over_http_with_recorded_stream() -> None:
    with RecordedApiServer() as srv:
        srv.add("GET", "/api/v1/nodes", 200, "node_list.json")
        start = {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "234"},
            "items": [],
        }
        srv.add("GET", "/api/v1/pods", 200, start)
        # Chunks of 333 bytes split events mid-line, as a real chunked stream may.
        srv.add("GET", "/api/v1/pods", 200, "watch_pods_stream.jsonl", watch=True, chunk=333)
        srv.add("GET", "/api/v1/pods", 200, b"", watch=True, delay=0.2)
        srv.add("GET", "/api/v1/nodes", 200, b"", watch=True, delay=0.2)
        cache = empty_cache()
        w = KubeWatcher(srv.api(), cache, WatchOptions(podgroups=False, backoff_initial_s=0.05))
        w.start()
        assert w.wait_synced(5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and w.streams["pods"].rv != "245":
            time.sleep(0.02)
        w.stop(timeout=3)
    assert w.streams["pods"].rv == "245"
    assert {k: p.gpus for k, p in cache.snapshot().pods.items()} == {"rec/train-b": (0, 1)}
    watch_reqs = [r for r in srv.requests if r["watch"] and r["path"] == "/api/v1/pods"]
    assert watch_reqs[0]["query"]["resourceVersion"] == ["234"]
    assert watch_reqs[0]["query"]["allowWatchBookmarks"] == ["true"]
    assert watch_reqs[1]["query"]["resourceVersion"] == ["245"]


def test_discovery_404_text_plain_means_not_served() -> None:
    with RecordedApiServer() as srv:
        srv.add(
            "GET",
            "/apis/scheduling.x-k8s.io/v1alpha1",
            404,
            "discovery_404_scheduling.x-k8s.io_v1alpha1.json",
        )
        srv.add(
            "GET",
            "/apis/scheduling.volcano.sh/v1beta1",
            200,
            {
                "kind": "APIResourceList",
                "groupVersion": "scheduling.volcano.sh/v1beta1",
                "resources": [],
            },
        )
        w = KubeWatcher(srv.api(), empty_cache())
        assert w.discover_podgroups() == []
    with RecordedApiServer() as srv:
        srv.add(
            "GET",
            "/apis/scheduling.x-k8s.io/v1alpha1",
            200,
            "discovery_scheduling.x-k8s.io_v1alpha1.json",
        )
        assert KubeWatcher(srv.api(), empty_cache()).discover_podgroups() == [PG]


def test_list_errors_are_api_errors() -> None:
    with RecordedApiServer() as srv:
        srv.add("GET", "/api/v1/nodes", 503, "list_503_service_unavailable.json")
        with pytest.raises(ApiError) as info:
            srv.api().list(NODES)
    assert info.value.status == 503 and info.value.message == "service unavailable"


def test_load_api_client_from_kubeconfig_and_env(tmp_path: Path, monkeypatch: Any) -> None:
    kc = tmp_path / "kc"
    kc.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n"
        "    server: http://127.0.0.1:1\nusers:\n- name: u\n  user:\n    token: t0k\n"
        "contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
    )
    api = load_api_client(str(kc))
    assert api.configuration.host == "http://127.0.0.1:1"
    assert api.configuration.auth_settings()["BearerToken"]["value"] == "Bearer t0k"
    monkeypatch.setenv("KUBECONFIG", str(kc))
    assert load_api_client().configuration.host == "http://127.0.0.1:1"
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ApiUnavailable):
        load_api_client()


# ---- recovery ---------------------------------------------------------------------------


def test_recovery_counts_recorded_placements_and_calls_the_gang_layer() -> None:
    from scheduler.server.extender import Extender

    api = fake_api(podgroups=False)
    cache = empty_cache()
    KubeWatcher(api, cache, WatchOptions(podgroups=False)).sync()

    class Gangs:
        def __init__(self) -> None:
            self.seen: list[Any] = []

        def recover(self, e: Any) -> int:
            self.seen.append(e)
            return 1

    g = Gangs()
    ext = Extender(cache, gangs=g)  # type: ignore[arg-type]
    report = recover(ext)
    assert (report.pods, report.placements, report.inferred) == (2, 2, 0)
    assert (report.gangs, report.gang_source) == (1, "Gangs.recover") and g.seen == [ext]


def _gang_member_cache() -> ClusterCache:
    api = fake_api(podgroups=False)
    for p in api.lists[PODS.name]["items"]:
        if p["metadata"]["name"] == "train-a":
            p["metadata"]["annotations"][PLACEMENT_ANNOTATION] = (
                '{"gang":"rec/llm","gpus":[0,1,2,3],"node":"rec-node-0","plan":"p-1","v":1}'
            )
            p["metadata"]["annotations"]["topoplace.io/gang"] = "llm"
            p["metadata"]["annotations"]["topoplace.io/gang-size"] = "2"
    cache = empty_cache()
    KubeWatcher(api, cache, WatchOptions(podgroups=False)).sync()
    return cache


def test_gang_plans_rebuilt_from_member_annotations() -> None:
    gangs_mod = pytest.importorskip("scheduler.runtime.gangs")
    from scheduler.server.extender import Extender

    cache = _gang_member_cache()
    ext = Extender(cache, gangs=gangs_mod.GangRuntime())
    n, source = recover_gang_plans(ext)
    assert (n, source) == (1, "GangRuntime.recover")
    assert list(cache.plans) == ["rec/llm"]
    # The bound member keeps its GPUs; nothing else may take them.
    assert cache.snapshot().pods["rec/train-a"].gpus == (0, 1, 2, 3)


def gang_member_with_plan_api(other_slot: tuple[str, list[int]]) -> Any:
    """The recorded cluster's fake API with rec/train-a bound as the only member of rec/llm
    (size 2), its record carrying the whole plan: its own slot and ``other_slot`` (node,
    GPUs) for the member not created."""
    api = fake_api(podgroups=False)
    for p in api.lists[PODS.name]["items"]:
        if p["metadata"]["name"] == "train-a":
            node, gpus = other_slot
            rec = {
                "v": 1,
                "node": "rec-node-0",
                "gpus": [0, 1, 2, 3],
                "gang": "rec/llm",
                "plan": "p-2",
                "policy": "topoplace",
                "created": 1_700_000_000.0,
                "ttl": 60.0,
                "slots": [["llm", "rec-node-0", [0, 1, 2, 3]], ["llm", node, gpus]],
            }
            ann = p["metadata"]["annotations"]
            ann[PLACEMENT_ANNOTATION] = json.dumps(rec)
            ann.update({"topoplace.io/gang": "llm", "topoplace.io/gang-size": "2"})
            ann["topoplace.io/role"] = "llm"
    return api


def _gang_member_with_plan_cache(other_slot: tuple[str, list[int]]) -> ClusterCache:
    """The cache synced from :func:`gang_member_with_plan_api`."""
    cache = empty_cache(clock=Clock())
    KubeWatcher(gang_member_with_plan_api(other_slot), cache, WatchOptions(podgroups=False)).sync()
    return cache


def test_recovery_reserves_the_slot_of_a_member_not_created_yet() -> None:
    gangs_mod = pytest.importorskip("scheduler.runtime.gangs")
    from scheduler.server.extender import Extender

    cache = _gang_member_with_plan_cache(("rec-node-1", [4, 5, 6, 7]))
    ext = Extender(cache, gangs=gangs_mod.GangRuntime())
    report = recover(ext)
    assert (report.gangs, report.gang_source) == (1, "GangRuntime.recover")
    held = {k: p for k, p in cache.snapshot().pods.items() if k.startswith("gang-reservation:")}
    assert [(p.node, p.gpus) for p in held.values()] == [("rec-node-1", (4, 5, 6, 7))]
    assert all(cache.expiry_of(k) == cache.now() + 60.0 for k in held)
    assert cache.plans["rec/llm"].plan_id == "p-2"


def test_recovery_never_reserves_gpus_another_pod_holds() -> None:
    gangs_mod = pytest.importorskip("scheduler.runtime.gangs")
    from scheduler.server.extender import Extender

    # The recorded slot overlaps rec/train-b (GPUs 0-1 of rec-node-1): the API wins.
    cache = _gang_member_with_plan_cache(("rec-node-1", [0, 1, 2, 3]))
    ext = Extender(cache, gangs=gangs_mod.GangRuntime())
    recover(ext)
    snap = cache.snapshot()
    held = [p for k, p in snap.pods.items() if k.startswith("gang-reservation:")]
    assert len(held) == 1 and held[0].gpus and len(held[0].gpus) == 4
    train_b = snap.pods["rec/train-b"]
    assert not (held[0].node == train_b.node and set(held[0].gpus) & set(train_b.gpus))
    assert cache.plans["rec/llm"].details["recovery"] == "replanned"


def test_gang_plans_without_a_gang_handler_are_only_counted() -> None:
    pytest.importorskip("scheduler.core.gang")
    from scheduler.server.extender import Extender

    cache = _gang_member_cache()
    n, source = recover_gang_plans(Extender(cache))
    assert n == 1 and source.startswith("scheduler.core.gang.recover_plans")
    assert dict(cache.plans) == {}


def _recovered_ext(bound_member: bool, gang_runtime: Any) -> Any:
    """rec/train-b deleted (and rec/train-a, when it is not the bound member), so the
    8-GPU members fit."""
    from scheduler.server.extender import Extender

    cache = _gang_member_cache() if bound_member else empty_cache()
    if not bound_member:
        KubeWatcher(fake_api(podgroups=False), cache, WatchOptions(podgroups=False)).sync()
        cache.delete_pod("rec/train-a")
    cache.delete_pod("rec/train-b")
    return Extender(cache, gangs=gang_runtime)


@pytest.mark.parametrize(
    "desc,bound_member,names,replanned",
    [
        ("a foreign scheduler's pending gang gets no reservation", False, (), 0),
        (
            "pending gang of a profile that calls topoplace is planned",
            False,
            ("not-scheduled-by-anyone",),
            1,
        ),
        ("gang with a member bound by topoplace is completed", True, (), 1),
    ],
)
def test_pending_gangs_are_reserved_again_after_restart(
    desc: str, bound_member: bool, names: tuple[str, ...], replanned: int
) -> None:
    gangs_mod = pytest.importorskip("scheduler.runtime.gangs")
    ext = _recovered_ext(bound_member, gangs_mod.GangRuntime())
    pending = [
        p for p in fake_api().lists[PODS.name]["items"] if p["metadata"]["name"] == "gang-w-0"
    ]
    report = recover(ext, pending, names)
    assert report.replanned == replanned, desc
    reserved = [k for k in ext.cache.snapshot().pods if k.startswith("gang-reservation:")]
    assert bool(reserved) == bool(replanned)


def test_options_from_env() -> None:
    from scheduler.kube.runner import options_from_env

    o = options_from_env(
        {
            "TOPOPLACE_SCHEDULER_NAMES": "topoplace, topology-gpu",
            "TOPOPLACE_WATCH_BROKEN_AFTER_S": "12.5",
            "TOPOPLACE_SLICE_REBUILD_DELAY_S": "2",
        }
    )
    assert o.scheduler_names == ("topoplace", "topology-gpu")
    assert o.watch.broken_after_s == 12.5
    assert o.watch.slice_rebuild_delay_s == 2.0
    assert options_from_env({}) == KubeOptions()
    assert options_from_env({}).watch.slice_rebuild_delay_s == 0.5
    for bad in ("-1", "nan", "soon", "601"):
        with pytest.raises(ValueError, match="TOPOPLACE_SLICE_REBUILD_DELAY_S must be 0..600"):
            options_from_env({"TOPOPLACE_SLICE_REBUILD_DELAY_S": bad})


# ---- snapshot command -------------------------------------------------------------------


def test_snapshot_list_round_trips_through_the_cluster_file_reader() -> None:
    from scheduler.cli.clusterfile import parse_cluster
    from scheduler.cli.kubecmd import snapshot_list

    lst = snapshot_list(fake_api())
    assert all(i.get("kind") and i.get("apiVersion") for i in lst["items"])
    assert all("managedFields" not in i["metadata"] for i in lst["items"])
    assert [i["kind"] for i in lst["items"]] == ["Node"] * 2 + ["Pod"] * 4 + ["PodGroup"] * 2
    nodes, pods, extra = parse_cluster(json.dumps(lst))
    snap = build_snapshot(nodes, pods, SchedParams(), extra)
    assert {k: p.gpus for k, p in snap.pods.items()} == {
        "rec/train-a": (0, 1, 2, 3),
        "rec/train-b": (0, 1),
    }
    assert sorted(snap.extra["podgroups"]) == ["rec/llm", "rec/tmp"]
    assert len(snapshot_list(fake_api(), all_pods=True)["items"]) == 9


# ---- TLS / mTLS over real loopback HTTP ------------------------------------------------


def _certs(tmp: Path) -> dict[str, str]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(stem: str, key: Any, cert: Any) -> None:
        (tmp / f"{stem}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        (tmp / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("test-ca"))
        .issuer_name(name("test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    write("ca", ca_key, ca)

    def leaf(stem: str, cn: str, usage: Any, san: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        b = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if san:
            import ipaddress

            b = b.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        write(stem, key, b.sign(ca_key, hashes.SHA256()))

    leaf("server", "topoplace", ExtendedKeyUsageOID.SERVER_AUTH, True)
    leaf("client", "kube-scheduler", ExtendedKeyUsageOID.CLIENT_AUTH, False)
    return {
        k: str(tmp / k) for k in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")
    }


def test_mtls_refuses_clients_without_a_certificate(tmp_path: Path) -> None:
    import http.client

    import uvicorn

    from scheduler.kube.tls import uvicorn_ssl_kwargs
    from scheduler.server.app import create_app
    from scheduler.server.extender import Extender

    c = _certs(tmp_path)
    kw = uvicorn_ssl_kwargs(c["server.crt"], c["server.key"], c["ca.crt"])
    assert kw["ssl_cert_reqs"] == ssl.CERT_REQUIRED and kw["ssl_ca_certs"] == c["ca.crt"]
    assert "ssl_cert_reqs" not in uvicorn_ssl_kwargs(c["server.crt"], c["server.key"])
    with pytest.raises(FileNotFoundError):
        uvicorn_ssl_kwargs(c["server.crt"], str(tmp_path / "missing.key"))

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    app = create_app(Extender(empty_cache()))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", **kw)
    )
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.02)
        assert server.started

        def get(with_cert: bool) -> int:
            ctx = ssl.create_default_context(cafile=c["ca.crt"])
            if with_cert:
                ctx.load_cert_chain(c["client.crt"], c["client.key"])
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
            try:
                conn.request("GET", "/healthz")
                return conn.getresponse().status
            finally:
                conn.close()

        assert get(True) == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(False)
    finally:
        server.should_exit = True
        t.join(5)


@pytest.mark.parametrize("path", BIND_PATHS)
def test_bind_reuses_credentials_and_refreshes_them_after_a_401(path: str) -> None:
    """The Binding POST keeps the token it computed (no kubeconfig refresh per bind); a 401
    refreshes it at once and retries once, with the new token."""
    tokens = iter(["Bearer t1", "Bearer t2", "Bearer t3"])
    with RecordedApiServer() as srv:
        srv.add("POST", BINDING_PATH, 201, "binding_201_created.json")
        api = srv.api()
        cfg = api.api_client.configuration
        cfg.api_key = {"authorization": "unused"}
        cfg.refresh_api_key_hook = lambda c: c.api_key.update(authorization=next(tokens))
        binder = kb.KubeBinder(api)
        assert bind_via(path, binder, pending_train_a(), "rec-node-0", {}) == ""
        assert bind_via(path, binder, pending_train_a(), "rec-node-0", {}) == ""
        srv.routes[("POST", BINDING_PATH, False)][:] = []
        srv.add(
            "POST", BINDING_PATH, 401, {"kind": "Status", "code": 401, "reason": "Unauthorized"}
        )
        srv.add("POST", BINDING_PATH, 201, "binding_201_created.json")
        assert bind_via(path, binder, pending_train_a(), "rec-node-0", {}) == ""
    assert [r["authorization"] for r in srv.requests] == ["Bearer t1"] * 3 + ["Bearer t2"]


def test_disruption_budgets_are_listed_and_watched_into_extra() -> None:
    api = fake_api()
    api.lists[PDBS.name] = recorded("pdb_list.json")
    w, _ = watcher(api)
    w.sync()
    assert PDBS in w.kinds
    listed = w.cache.snapshot().extra[BUDGETS_EXTRA]
    assert sorted(listed) == ["rec/serve", "rec/train"]
    assert "managedFields" not in listed["rec/serve"]["metadata"]
    assert [(b.key, b.allowed) for b in budgets_from(listed.values())] == [
        ("rec/serve", 1),
        ("rec/train", 0),
    ]
    # The recorded watch from before they existed: added, the status written, one deleted.
    api.lists[PDBS.name]["items"] = []
    w, _ = watcher(api)
    w.sync()
    seen = []
    for ev in recorded_stream("watch_pdbs_stream.jsonl"):
        w.apply_event(w.streams[PDBS.name], ev)
        budgets = budgets_from(w.cache.snapshot().extra[BUDGETS_EXTRA].values())
        seen.append([(b.key, b.allowed) for b in budgets])
    assert seen == [
        [("rec/serve", 0)],
        [("rec/serve", 0), ("rec/train", 0)],
        [("rec/serve", 1), ("rec/train", 0)],
        [("rec/serve", 1)],
        [("rec/serve", 1)],  # bookmarks
        [("rec/serve", 1)],
    ]
    # a relist rebuilds the cache and keeps them
    w.relist(w.streams[NODES.name])
    assert list(w.cache.snapshot().extra[BUDGETS_EXTRA]) == ["rec/serve"]


def test_disruption_budgets_the_api_refuses_are_skipped() -> None:
    api = fake_api(podgroups=False)
    api.lists[PDBS.name] = recorded_error("eviction_403_forbidden.json", 403)
    w, _ = watcher(api)
    w.sync()
    assert PDBS not in w.kinds and BUDGETS_EXTRA not in w.cache.snapshot().extra
    assert w.synced


# ---- the parked-pod waker's patch, raw over HTTP -----------------------------------------


def test_waker_patch_is_a_strategic_merge_of_one_annotation_over_http() -> None:
    """The waker's PATCH goes out raw (not through the generated client) with the content
    type the generated ``patch_namespaced_pod`` would pick for an object, the credentials,
    and exactly the annotation; a recorded 404 is "gone", a 503 "error", an unreachable
    server "error" too, and the worker thread keeps going after each."""
    import datetime

    from scheduler.kube.metrics import KubeMetrics
    from scheduler.kube.waker import WAKE_ANNOTATION, PodWaker

    path = "/api/v1/namespaces/rec/pods/train-a"
    stamp = datetime.datetime(2026, 12, 7, 14, 30, 0, 123456, tzinfo=datetime.UTC)
    with RecordedApiServer() as srv:
        srv.add("PATCH", path, 200, "get_pod_bound.json")
        srv.add("PATCH", "/api/v1/namespaces/rec/pods/no-such-pod", 404, "get_pod_404.json")
        srv.add(
            "PATCH", "/api/v1/namespaces/rec/pods/busy", 503, "list_503_service_unavailable.json"
        )
        api = srv.api()
        api.api_client.configuration.api_key = {"authorization": "Bearer recorded-token"}
        metrics = KubeMetrics()
        waker = PodWaker(api, metrics, now=lambda: stamp)
        assert waker.wake_now("rec/train-a", "gang g has room") == "ok"
        assert waker.wake_now("rec/no-such-pod", "gang g has room") == "gone"
        assert waker.wake_now("rec/busy", "gang g has room") == "error"
        ok, gone, busy = srv.requests
    assert ok["method"] == "PATCH" and ok["path"] == path
    assert ok["content_type"] == "application/strategic-merge-patch+json"
    assert ok["authorization"] == "Bearer recorded-token"
    want = {
        "metadata": {
            "annotations": {WAKE_ANNOTATION: "2026-12-07T14:30:00.123456Z gang g has room"}
        }
    }
    assert json.loads(ok["body"]) == want
    assert gone["path"] == "/api/v1/namespaces/rec/pods/no-such-pod"
    counts = {
        s.labels["outcome"]: s.value
        for m in metrics.wakes.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert counts == {"ok": 1.0, "gone": 1.0, "error": 1.0}


def test_pod_patch_quotes_names_and_maps_a_dead_server() -> None:
    """Namespace and name are path-quoted; a server that is not there is ApiUnavailable
    (the waker counts it as an error and logs it, never raises)."""
    with RecordedApiServer() as srv:
        srv.add("PATCH", "/api/v1/namespaces/a%2Fb/pods/c%20d", 200, "get_pod_bound.json")
        got = srv.api().patch_pod_annotations("a/b", "c d", {"k": "v"})
        (req,) = srv.requests
        dead = srv.api()
    assert got["metadata"]["name"] == "train-a"
    assert req["path"] == "/api/v1/namespaces/a%2Fb/pods/c%20d"
    with pytest.raises(ApiUnavailable):
        dead.patch_pod_annotations("rec", "train-a", {"k": "v"})
