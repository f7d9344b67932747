"""FastAPI HTTP edge of the extender.

The verbs are answered by :class:`VerbRoutes` before FastAPI's stack sees them: bodies
are read raw and parsed with orjson, replies are bytes (no request objects, middleware or
pydantic on the hot path). FastAPI serves the rest: health, metrics, inspection.

Status codes follow STYLE.md's "not now / never / broken":

* 200 with the verb's result, including ``Error`` for platform faults kube-scheduler
  should see (filter, bind);
* 400 malformed JSON or a payload that is not an extender payload, 413 body too large,
  both with a JSON ``{"error": ...}`` body; 503 from ``/readyz`` until ready.

Nothing a client sends can crash the server or produce a 500: unexpected exceptions in a
verb are logged and answered with the protocol's failure channel.

Nothing heavy runs on the event loop, so ``/healthz`` and ``/readyz`` always answer: a
verb that must plan a gang (``GangRuntime.filter`` raises ``PlanOffLoop`` before changing
anything) is run again on a planner thread under the gang planning deadline, and a body
over :data:`OFFLOAD_BODY_BYTES` is parsed and served on a worker thread. Neither costs the
common request anything (one length comparison). Connection limits and read deadlines are
the HTTP protocol's (``guard.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from scheduler import __version__
from scheduler.core.fractional import describe_ledger
from scheduler.core.model import Health
from scheduler.runtime.gangs import PLAN_DEADLINE, PlanOffLoop
from scheduler.server import ui, wire
from scheduler.server.extender import Extender

log = logging.getLogger(__name__)
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("topoplace_caller", default="")
"""The client address (host:port) of the verb request being served, for the bind audit line
(the worker thread a verb runs on gets a copy of the request's context)."""

DEFAULT_MAX_BODY = 64 * 1024 * 1024
"""64 MiB: a full ``Nodes`` payload of 10,000 GPU nodes is about 50 MiB."""

OFFLOAD_BODY_BYTES = 1024 * 1024
"""Bodies larger than this (1 MiB; kube-scheduler's ``NodeNames`` for 5,000 nodes are about
150 KiB) are parsed and served on a worker thread, not on the event loop."""
PLAN_GRACE_S = 0.5
"""How long past the gang planning deadline a verb waits for its planner thread before it
answers with an error (the planner checks the deadline itself and then reserves nothing)."""
ERR_PLAN_DEADLINE = "gang planning did not finish within its deadline; retry"

JSON = "application/json"
JSON_BYTES = JSON.encode()


_CLOSE = ((b"connection", b"close"),)
"""Sent with 413: the connection is closed instead of reading the rest of the body."""


class BodyTooLarge(Exception):
    """The request body exceeds the configured limit."""


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type=JSON)


async def _read_body(scope: Any, receive: Any, limit: int) -> bytes | None:
    """The request body (None if the client went away). Raises BodyTooLarge."""
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                if int(value) > limit:
                    raise BodyTooLarge
            except ValueError:
                pass
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _send(send: Any, status: int, body: bytes, extra: tuple = ()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", JSON_BYTES),
                (b"content-length", str(len(body)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


Handler = Callable[[Any, bytes], Any]
"""A verb: (body, raw body) -> result (bytes, or a JSON-serializable value). The body is
the parsed JSON, or for a verb that reads its arguments from the bytes a
:class:`wire.RawBody` (a mapping that parses them on first use)."""
Route = tuple[str, Handler, Callable[[str], Any], bool, bool]
"""(verb name, handler, fallback for a crashed handler, run the handler in a worker thread,
the handler parses the raw body itself)."""


class VerbRoutes:
    """Answers the extender verbs straight from the ASGI scope.

    The verbs are the hot path (kube-scheduler waits on filter and prioritize for every
    pod), so :class:`ExtenderApp` hands them here before any of FastAPI's middleware,
    routing or request objects: raw body in, orjson parse, the verb, bytes out.

    filter and prioritize parse their own body (``wire.extender_args`` reads a
    :class:`wire.RawBody` without turning the candidate names into Python strings); a
    body that is not JSON is then refused by the verb with the same 400 answer.

    Args:
        verbs: path -> (verb name, handler, fallback for a crashed handler, run the
            handler in a worker thread, the handler parses the raw body itself).
        metrics: the extender's Prometheus metrics.
        max_body_bytes: larger bodies are refused with 413.
    """

    def __init__(
        self,
        verbs: dict[str, Route],
        metrics: Any,
        max_body_bytes: int,
        plan_deadline_s: float = 3.0,
    ) -> None:
        self.verbs = verbs
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.plan_deadline_s = plan_deadline_s
        self._planner: ThreadPoolExecutor | None = None
        self._counters: dict[tuple[str, int], tuple[Callable[[], None], Callable[[float], None]]]
        self._counters = {}

    async def handle(self, scope: Any, receive: Any, send: Any) -> bool:
        """Serve the request if it is for a verb; False if it is not."""
        verb = self.verbs.get(scope["path"]) if scope["type"] == "http" else None
        if verb is None:
            return False
        if scope["method"] != "POST":
            await _send(send, 405, _error_body("use POST"), ((b"allow", b"POST"),))
            return True
        start = time.perf_counter()
        try:
            body = await _read_body(scope, receive, self.max_body_bytes)
        except BodyTooLarge:
            status, reply = 413, self.too_large()
        else:
            if body is None:  # the client closed the connection: nobody to answer
                status, reply = 499, None
            else:
                client = scope.get("client")
                caller = f"{client[0]}:{client[1]}" if client else ""
                answer = self.answer(verb, body, caller, start)
                status, reply = answer if isinstance(answer, tuple) else await answer
        if reply is not None:
            await _send(send, status, reply, _CLOSE if status == 413 else ())
        self.count(verb[0], status, start)
        return True

    def too_large(self) -> bytes:
        """The 413 body."""
        return _error_body(f"request body larger than {self.max_body_bytes} bytes")

    def count(self, name: str, status: int, start: float) -> None:
        """Count one answered request of verb ``name`` and its latency from ``start``
        (``time.perf_counter``)."""
        counters = self._counters.get((name, status))
        if counters is None:  # once per verb and status: the labelled children's methods
            m = self.metrics
            counters = (
                m.child(m.requests, name, str(status)).inc,
                m.child(m.latency, name).observe,
            )
            self._counters[(name, status)] = counters
        inc, observe = counters
        inc()
        observe(time.perf_counter() - start)

    def answer(
        self, verb: Route, body: bytes, caller: str, start: float
    ) -> tuple[int, bytes] | Coroutine[Any, Any, tuple[int, bytes]]:
        """The status and reply body for a verb request whose body is ``body``, sent by
        ``caller`` (host:port, for the bind audit line) and received at ``start``
        (``time.perf_counter``; a gang plan's deadline counts from it).

        Decided on the spot when it can be (filter and prioritize: parsed and answered
        without leaving the caller's stack, see ``fastlane.py``); otherwise a
        coroutine to await that gives the answer: a body over
        :data:`OFFLOAD_BODY_BYTES` or a threaded verb (worker thread), a verb whose result
        is awaitable (bind's API write), a gang plan that must leave the event loop.
        """
        name, handler, fallback, threaded, lazy = verb
        CALLER.set(caller)
        if threaded or len(body) > OFFLOAD_BODY_BYTES:
            return self._off_loop(verb, body, start)
        payload: Any = wire.RawBody(body)
        if not lazy:
            try:
                payload = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                return 400, _error_body(f"malformed JSON: {exc}")
        try:
            result = handler(payload, body)
        except PlanOffLoop:
            return self._settle(verb, payload, body, start, None, plan=True)
        except Exception as exc:
            return _failed(name, fallback, exc)
        if inspect.isawaitable(result):
            return self._settle(verb, payload, body, start, result)
        return _ok(result)

    async def _off_loop(self, verb: Route, body: bytes, start: float) -> tuple[int, bytes]:
        """:meth:`answer` for a threaded verb or a large body: parsed and run on a worker
        thread (its failures are answered by :meth:`_settle`, as the inline verb's)."""
        name, handler, fallback, threaded, lazy = verb
        payload: Any = wire.RawBody(body)
        if not lazy:
            try:
                payload = await run_in_threadpool(orjson.loads, body)
            except orjson.JSONDecodeError as exc:
                return 400, _error_body(f"malformed JSON: {exc}")
        return await self._settle(
            verb, payload, body, start, run_in_threadpool(handler, payload, body)
        )

    async def _settle(
        self,
        verb: Route,
        payload: Any,
        body: bytes,
        start: float,
        result: Any,
        plan: bool = False,
    ) -> tuple[int, bytes]:
        """The answer from a verb's ``result`` once awaited, or (``plan``: the verb raised
        ``PlanOffLoop``) from running the verb again on the gang planner thread."""
        name, handler, fallback, _, _ = verb
        try:
            try:
                if plan:
                    raise PlanOffLoop
                if inspect.isawaitable(result):
                    result = await result
            except PlanOffLoop:
                result = await self._plan(handler, payload, body, start)
                if result is None:
                    result = fallback(ERR_PLAN_DEADLINE)
        except Exception as exc:
            return _failed(name, fallback, exc)
        return _ok(result)

    async def _plan(self, handler: Handler, payload: Any, body: bytes, start: float) -> Any:
        """Run ``handler`` on the planner thread with the gang planning deadline counted from
        the request's arrival (``start``, ``time.perf_counter``); None if it is not done by
        the deadline plus :data:`PLAN_GRACE_S` (the planner then reserves nothing)."""
        if self._planner is None:
            self._planner = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gang-planner")
        left = self.plan_deadline_s - (time.perf_counter() - start)
        ctx = contextvars.copy_context()
        ctx.run(PLAN_DEADLINE.set, time.monotonic() + left)
        fut = asyncio.get_running_loop().run_in_executor(
            self._planner, ctx.run, handler, payload, body
        )
        try:
            return await asyncio.wait_for(fut, max(left, 0.0) + PLAN_GRACE_S)
        except TimeoutError:
            log.warning("gang planning still running past its deadline; answered with an error")
            return None


def _asset(name: str) -> Response:
    """One of the cluster view's files, with headers that keep it self-contained."""
    return Response(ui.asset(name), media_type=ui.FILES[name], headers=ui.SECURITY_HEADERS)


def _ok(result: Any) -> tuple[int, bytes]:
    """200 with a verb's result (bytes as they are, anything else as JSON)."""
    return 200, result if isinstance(result, bytes) else orjson.dumps(result)


def _failed(name: str, fallback: Callable[[str], Any], exc: Exception) -> tuple[int, bytes]:
    """A verb that raised: 400 for a payload that is not the verb's
    (:class:`wire.WireError`), else a bug, logged and answered through the protocol's
    failure channel (``fallback``), never a crash."""
    if isinstance(exc, wire.WireError):
        return 400, _error_body(str(exc))
    log.error("%s failed", name, exc_info=exc)
    return _ok(fallback("internal error in topoplace; see its log"))


def _error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


class ExtenderApp(FastAPI):
    """FastAPI app whose extender verbs are served by :class:`VerbRoutes` first."""

    verbs: VerbRoutes | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.verbs is None or not await self.verbs.handle(scope, receive, send):
            await super().__call__(scope, receive, send)


def create_app(
    extender: Extender,
    url_prefix: str = "/scheduler",
    max_body_bytes: int = DEFAULT_MAX_BODY,
    description: str = "",
) -> FastAPI:
    """Build the ASGI app serving ``extender``.

    Args:
        extender: the verbs.
        url_prefix: path prefix of the verbs (kube-scheduler's ``urlPrefix`` path).
        max_body_bytes: larger bodies are refused with 413.
        description: where the cluster view comes from, shown by ``/version``.
    """
    prefix = "/" + url_prefix.strip("/") if url_prefix.strip("/") else ""
    app = ExtenderApp(title="topoplace", version=__version__, docs_url=None, redoc_url=None)
    app.state.extender = extender
    metrics = extender.metrics

    routes = (
        (
            "filter",
            extender.filter_json,
            lambda e: wire.filter_result(None, None, {}, {}, e),
            False,
            True,
        ),
        ("prioritize", extender.prioritize_json, lambda e: [], False, True),
        (
            # On the event loop when the extender can (the API write is awaited: no worker
            # thread per bind); an extender without bind_async binds in a worker thread.
            ("bind", lambda p, _: extender.bind_async(p, CALLER.get()), lambda e: {"Error": e})
            + (False, False)
            if hasattr(extender, "bind_async")
            else ("bind", lambda p, _: extender.bind(p, CALLER.get()), lambda e: {"Error": e})
            + (True, False)
        ),
        (
            # Off the event loop: rare, and a gang member's answer plans its whole gang.
            "preempt",
            lambda p, _: extender.preempt(p),
            lambda e: {"NodeNameToMetaVictims": None},
            True,
            False,
        ),
    )

    app.verbs = VerbRoutes(
        {f"{prefix}/{r[0]}": r for r in routes},
        metrics,
        max_body_bytes,
        float(extender.params.gang.plan_deadline_seconds),
    )

    @app.get("/healthz")
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        if extender.ready():
            return _json({"status": "ready"})
        return _json({"status": "not ready"}, 503)

    @app.get("/version")
    async def version() -> Response:
        return _json({"version": __version__, "cluster": description})

    @app.get("/metrics")
    async def prom() -> Response:
        snap = extender.cache.snapshot()
        a = snap.arrays
        metrics.nodes.set(len(snap.nodes))
        metrics.assumed_topology.set(snap.assumed_topology_nodes)
        metrics.free_gpus.set(int(a.free.sum()))
        metrics.unhealthy_nodes.set(int((a.state >= int(Health.UNHEALTHY)).sum()))
        metrics.unmodeled_nodes.set(snap.unmodeled_nodes)
        metrics.parked_pods.set(len(extender.parked))
        metrics.free_gpus_by_domain.clear()
        for (product, domain), free in ui.free_by_domain(snap, extender.params.fabric).items():
            metrics.free_gpus_by_domain.labels(product=product, domain=domain).set(free)
        for state, count in ui.health_counts(snap).items():
            metrics.nodes_by_health.labels(state=state).set(count)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/inspect/snapshot")
    async def inspect_snapshot() -> Response:
        return _json(extender.snapshot_list())

    @app.get("/v1/inspect/placements")
    async def inspect_placements() -> Response:
        return _json(extender.placements())

    @app.get("/v1/inspect/decisions")
    async def inspect_decisions(pod: str | None = None, limit: int = 20) -> Response:
        if pod is not None and (pod.count("/") != 1 or not all(pod.split("/"))):
            return _json({"error": "pod must be NAMESPACE/NAME"}, 400)
        if not 1 <= limit <= 1000:
            return _json({"error": "limit must be in 1..1000"}, 400)
        log_ = extender.decisions
        # Explaining is CPU work over a snapshot: off the event loop.
        found = await run_in_threadpool(log_.explain_pod if pod else _explain_all, pod, limit)
        out = {"pod": pod, "decisions": found, "ring": log_.stats()}
        if pod is not None and getattr(app.state, "rightsizer", None) is not None:
            out["rightsize"] = _rightsize_of(pod)
        return _json(out)

    def _rightsize_of(key: str) -> dict[str, Any]:
        """The right-sizer's recommendation for the workload of pod ``key`` (the pod from
        the cache when it holds it, else its name), or why there is none."""
        from scheduler.kube.rightsizer import rec_json

        ns, _, name = key.partition("/")
        info = extender.cache.snapshot().pods.get(key)
        raw = getattr(info, "raw", None)
        pod = raw if isinstance(raw, dict) else {"metadata": {"namespace": ns, "name": name}}
        found = app.state.rightsizer.for_pod(pod, ns)
        return {"why_not": found} if isinstance(found, str) else rec_json(found)

    def _explain_all(_: Any, limit: int) -> list[Any]:
        log_ = extender.decisions
        return [log_.explained(r) for r in log_.records(None, limit)]

    @app.get("/v1/inspect/preemptions")
    async def inspect_preemptions() -> Response:
        return _json({**extender.preemptions.view(), "stranded": extender.stranded.view()})

    @app.get("/v1/inspect/state")
    async def inspect_state() -> Response:
        return _json({"stores": extender.state_sizes()})

    @app.get("/v1/inspect/remediation")
    async def inspect_remediation() -> Response:
        view = extender.remediation_view
        return _json(await run_in_threadpool(view if view is not None else _no_remediation))

    def _no_remediation() -> dict[str, Any]:
        """Without an API server nothing is evicted; the pods on failed hardware are shown."""
        from scheduler.core.remediation import fault_rows, on_failed_hardware

        p = extender.params
        profiles = extender.profiles if extender.profiles is not None else ("topoplace",)
        faults, failed, gpu_nodes = on_failed_hardware(
            extender.cache.snapshot(), p.remediation, p.health, profiles
        )
        return {
            "mode": p.remediation.mode,
            "acting": False,
            "why_not": "no Kubernetes API (a cluster file or the demo): nothing is evicted",
            "failed_gpu_nodes": failed,
            "gpu_nodes": gpu_nodes,
            "on_failed_hardware": fault_rows(faults),
        }

    @app.get("/v1/inspect/rightsize")
    async def inspect_rightsize() -> Response:
        rs = getattr(app.state, "rightsizer", None)
        if rs is None:
            why = (
                "the right-sizer is off (no rightsize: section in the policy, or no Kubernetes API)"
            )
            return _json({"mode": None, "why_not": why, "workloads": []})
        return _json(rs.view())

    @app.get("/v1/inspect/view")
    async def inspect_view() -> Response:
        return _json(await run_in_threadpool(ui.view_model, extender, description))

    @app.get("/ui")
    async def ui_page() -> Response:
        return _asset("index.html")

    @app.get("/ui/{name}")
    async def ui_file(name: str) -> Response:
        if name not in ui.FILES:
            return _json({"error": "not found"}, 404)
        return _asset(name)

    @app.get("/v1/inspect/nodes")
    async def inspect_nodes() -> Response:
        snap = extender.cache.snapshot()
        return _json(
            {
                "nodes": [
                    {
                        "name": n.name,
                        "gpus": n.gpu_capacity,
                        "free_gpus": n.free_gpus,
                        "unmodeled": n.unmodeled,
                        "free": [i for i in range(n.gpu_capacity) if n.free_mask >> i & 1],
                        "health": n.health.state.name.lower(),
                        "reasons": list(n.health.reasons),
                        "risk": n.health.risk,
                        "topology": n.shape.name,
                        "topology_source": n.shape_source,
                        "sharing": n.sharing,
                        "gpu_ledger": describe_ledger(n) if n.sharing or n.share_used else [],
                        "fabric": dict(
                            zip(
                                [lvl.name for lvl in extender.params.fabric.levels],
                                n.fabric_path,
                                strict=True,
                            )
                        ),
                    }
                    for n in snap.nodes
                ],
                "assumed_topology_nodes": snap.assumed_topology_nodes,
            }
        )

    return app
