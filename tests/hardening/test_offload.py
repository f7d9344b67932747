"""Issue 12, finding 4: gang planning never runs on the event loop, has a deadline below
kube-scheduler's extender ``httpTimeout``, and a planning past it is refused whole.

The app is served over the ASGI transport inside a real event loop (the same code path
uvicorn runs). A mock gang policy (``mock-blocking``, registered here) blocks the planner
until the test lets it go: while it is blocked, ``/healthz`` and ``/readyz`` must answer and
the planner must not be the event loop's thread. On today's main the verb planned inline,
so ``/healthz`` could not answer until the planner returned (the test then fails on its
"health answered while planning" check after the mock's safety timeout, never by timing).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from scheduler.core.gang import reservation_key
from scheduler.core.params import GangParams, SchedParams
from scheduler.core.policies.registry import GANG_POLICIES, get_policy
from scheduler.core.schedule import PlacementResult
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import (
    PLAN_DEADLINE,
    GangRuntime,
    PlanOffLoop,
    on_event_loop,
)
from scheduler.server.app import create_app
from scheduler.server.extender import Extender
from tests.builders import cluster, gang_pod, make_node

REPO = Path(__file__).resolve().parents[2]
SAFETY_S = 20.0
"""Only a safety net so a regression fails instead of hanging; nothing is timed."""


class MockBlockingPolicy:
    """A gang policy mock: records the thread it runs on, waits for ``release``, then plans
    with the real CP-SAT policy (optionally moving a fake deadline clock past the deadline
    first)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: list[int] = []
        self.on_loop: list[bool] = []
        self.after: Any = None

    def __call__(self, snap: Any, gang: Any, params: Any) -> PlacementResult:
        self.threads.append(threading.get_ident())
        self.on_loop.append(on_event_loop())
        self.entered.set()
        self.release.wait(SAFETY_S)
        if self.after is not None:
            self.after()
        return get_policy("topoplace")(snap, gang, params)


@pytest.fixture
def mock_policy() -> Any:
    pol = MockBlockingPolicy()
    GANG_POLICIES["mock-blocking"] = pol
    try:
        yield pol
    finally:
        GANG_POLICIES.pop("mock-blocking", None)


def _extender(gangs: GangRuntime, params: SchedParams | None = None) -> Extender:
    nodes, pods = cluster([make_node(f"n{i}", 8) for i in range(4)])
    cache = ClusterCache.from_objects(nodes, pods, params or SchedParams())
    return Extender(cache, gangs=gangs)


def _filter_body(name: str = "m-0", gang: str = "train", size: int = 2) -> bytes:
    pod = gang_pod(name, 8, gang, size, namespace="ml")
    return orjson.dumps({"Pod": pod, "NodeNames": [f"n{i}" for i in range(4)]})


def test_gang_is_planned_off_the_event_loop_and_health_answers_meanwhile(
    mock_policy: MockBlockingPolicy,
) -> None:
    ext = _extender(GangRuntime(policy="mock-blocking"))
    app = create_app(ext)
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            seen["loop_thread"] = threading.get_ident()
            verb = asyncio.create_task(c.post("/scheduler/filter", content=_filter_body()))
            entered = await asyncio.to_thread(mock_policy.entered.wait, SAFETY_S)
            assert entered, "the planner never started"
            seen["healthz"] = (await c.get("/healthz")).status_code
            seen["readyz"] = (await c.get("/readyz")).status_code
            seen["answered_while_planning"] = not mock_policy.release.is_set()
            mock_policy.release.set()
            seen["filter"] = await verb

    asyncio.run(scenario())
    assert seen["answered_while_planning"], "health could not answer while a gang was planned"
    assert seen["healthz"] == 200 and seen["readyz"] == 200
    assert mock_policy.threads and seen["loop_thread"] not in mock_policy.threads
    assert mock_policy.on_loop == [False]
    r = seen["filter"]
    assert r.status_code == 200
    out = r.json()
    assert out["Error"] == "" and len(out["NodeNames"]) == 1, out


def test_filter_on_an_event_loop_thread_raises_before_changing_anything() -> None:
    """The verb raises PlanOffLoop on a loop thread and leaves no plan or reservation; the
    same call off the loop plans."""
    ext = _extender(GangRuntime())
    body = orjson.loads(_filter_body())

    async def on_loop() -> None:
        with pytest.raises(PlanOffLoop):
            ext.filter(body)

    asyncio.run(on_loop())
    assert ext.cache.plans == {}
    assert not any(k.startswith("gang-reservation:") for k in ext.cache.snapshot().pods)
    out = ext.filter(body)
    assert out["Error"] == "" and len(out["NodeNames"]) == 1
    assert set(ext.cache.plans) == {"ml/train"}


def test_planning_past_its_deadline_is_refused_whole_and_not_remembered(
    mock_policy: MockBlockingPolicy,
) -> None:
    """The deadline clock passes the deadline while the solver runs: nothing is reserved,
    the member gets the gang refusal, the refusal is not held for the next member, and the
    next filter (within its deadline) plans the gang."""
    clock = [100.0]
    gangs = GangRuntime(policy="mock-blocking", deadline_clock=lambda: clock[0])
    ext = _extender(gangs)
    mock_policy.release.set()
    mock_policy.after = lambda: clock.__setitem__(0, clock[0] + 10.0)
    token = PLAN_DEADLINE.set(105.0)
    try:
        out = ext.filter(orjson.loads(_filter_body()))
    finally:
        PLAN_DEADLINE.reset(token)
    assert out["NodeNames"] == [] and out["Error"] == ""
    assert set(out["FailedNodes"].values()) == {"the pod's gang cannot be placed as a whole now"}
    assert ext.cache.plans == {}
    snap = ext.cache.snapshot()
    assert reservation_key("ml/train", "m-0") not in snap.pods
    assert not any(k.startswith("gang-reservation:") for k in snap.pods)
    assert "ml/train" not in gangs._refusals
    events = {
        s.labels["event"]: s.value
        for m in ext.metrics.gang_events.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert events.get("refused") == 1.0
    mock_policy.after = None
    out = ext.filter(orjson.loads(_filter_body("m-1")))
    assert out["Error"] == "" and len(out["NodeNames"]) == 1
    assert set(ext.cache.plans) == {"ml/train"}


def test_a_queued_planning_whose_deadline_passed_does_not_solve(
    mock_policy: MockBlockingPolicy,
) -> None:
    """A planning that gets its turn after its deadline refuses without calling the
    solver (so a queue of gang filters cannot hold the planner for longer)."""
    gangs = GangRuntime(policy="mock-blocking", deadline_clock=lambda: 50.0)
    ext = _extender(gangs)
    token = PLAN_DEADLINE.set(49.0)
    try:
        out = ext.filter(orjson.loads(_filter_body()))
    finally:
        PLAN_DEADLINE.reset(token)
    assert mock_policy.threads == []
    assert out["NodeNames"] == [] and ext.cache.plans == {}


def test_verb_answers_an_error_when_the_planner_overruns(mock_policy: MockBlockingPolicy) -> None:
    """The HTTP layer stops waiting at the deadline plus its grace and answers a filter
    error; the planner, let go afterwards, reserves nothing."""
    params = SchedParams(gang=GangParams(plan_deadline_seconds=0.05))
    ext = _extender(GangRuntime(policy="mock-blocking"), params)
    app = create_app(ext)

    async def scenario() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            return await c.post("/scheduler/filter", content=_filter_body())

    r = asyncio.run(scenario())
    mock_policy.release.set()
    assert r.status_code == 200
    assert "deadline" in r.json()["Error"]
    app.verbs._planner.shutdown(wait=True)  # the planner finished: past its deadline
    assert ext.cache.plans == {}
    assert not any(k.startswith("gang-reservation:") for k in ext.cache.snapshot().pods)


def _duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0}
    for unit in ("ms", "s", "m"):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    raise ValueError(text)


def test_shipped_deadline_is_below_the_extender_http_timeout() -> None:
    cm = yaml.safe_load((REPO / "config/deploy/scheduler-config.yaml").read_text())
    cfg = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    timeout = _duration_s(cfg["extenders"][0]["httpTimeout"])
    for path in ("config/policy.yaml", "config/deploy/policy-configmap.yaml"):
        doc = yaml.safe_load((REPO / path).read_text())
        policy = yaml.safe_load(doc["data"]["policy.yaml"]) if "data" in doc else doc
        params = SchedParams.from_config(policy)
        assert 0 < params.gang.plan_deadline_seconds < timeout, path


def test_plan_deadline_must_be_positive() -> None:
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="plan_deadline_seconds"):
            SchedParams.from_config({"gang": {"plan_deadline_seconds": bad}})
