"""FastAPI HTTP edge of the extender.

Bodies are read raw and parsed with orjson (no pydantic on the hot path); replies are
written with orjson. Status codes follow STYLE.md's "not now / never / broken":

* 200 with the verb's result, including ``Error`` for platform faults kube-scheduler
  should see (filter, bind);
* 400 malformed JSON or a payload that is not an extender payload, 413 body too large,
  both with a JSON ``{"error": ...}`` body; 503 from ``/readyz`` until ready.

Nothing a client sends can crash the server or produce a 500: unexpected exceptions in a
verb are logged and answered with the protocol's failure channel.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from scheduler import __version__
from scheduler.core.model import Health
from scheduler.server import wire
from scheduler.server.extender import Extender

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 64 * 1024 * 1024
"""64 MiB: a full ``Nodes`` payload of 10,000 GPU nodes is about 50 MiB."""

JSON = "application/json"


class BodyTooLarge(Exception):
    """The request body exceeds the configured limit."""


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type=JSON)


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise BodyTooLarge
        except ValueError:
            pass
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


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
    app = FastAPI(title="topoplace", version=__version__, docs_url=None, redoc_url=None)
    app.state.extender = extender
    metrics = extender.metrics

    def verb(
        name: str, handler: Callable[[Any], Any], fallback: Callable[[str], Any], threaded: bool
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            start = time.perf_counter()
            code = 200
            try:
                body = await _read_body(request, max_body_bytes)
                try:
                    payload = orjson.loads(body)
                except orjson.JSONDecodeError as exc:
                    code = 400
                    return _error(400, f"malformed JSON: {exc}")
                try:
                    result = (
                        await run_in_threadpool(handler, payload) if threaded else handler(payload)
                    )
                except wire.WireError as exc:
                    code = 400
                    return _error(400, str(exc))
                except Exception:  # a bug: answer through the protocol, never crash
                    log.exception("%s failed", name)
                    result = fallback("internal error in topoplace; see its log")
                if isinstance(result, bytes):
                    return Response(result, media_type=JSON)
                return _json(result)
            except BodyTooLarge:
                code = 413
                return _error(413, f"request body larger than {max_body_bytes} bytes")
            finally:
                metrics.requests.labels(verb=name, code=str(code)).inc()
                metrics.latency.labels(verb=name).observe(time.perf_counter() - start)

        endpoint.__name__ = f"{name}_endpoint"
        return endpoint

    routes = (
        ("filter", extender.filter, lambda e: wire.filter_result(None, None, {}, {}, e), False),
        ("prioritize", extender.prioritize_json, lambda e: [], False),
        ("bind", extender.bind, lambda e: {"Error": e}, True),
        ("preempt", extender.preempt, lambda e: {"NodeNameToMetaVictims": None}, False),
    )
    for name, handler, fallback, threaded in routes:
        app.add_api_route(
            f"{prefix}/{name}", verb(name, handler, fallback, threaded), methods=["POST"]
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
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/inspect/snapshot")
    async def inspect_snapshot() -> Response:
        return _json(extender.snapshot_list())

    @app.get("/v1/inspect/placements")
    async def inspect_placements() -> Response:
        return _json(extender.placements())

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
                        "free": [i for i in range(n.gpu_capacity) if n.free_mask >> i & 1],
                        "health": n.health.state.name.lower(),
                        "reasons": list(n.health.reasons),
                        "risk": n.health.risk,
                        "topology": n.shape.name,
                        "topology_source": n.shape_source,
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
