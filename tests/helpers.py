"""Shared test helpers: paths to ../shared, cache/app builders, an ASGI client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.server.app import create_app
from scheduler.server.extender import Extender

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures" / "extender"


def fixture(name: str) -> Any:
    """Load a JSON payload from ../shared/fixtures/extender (skip if absent)."""
    path = FIXTURES / name
    if not path.exists():
        pytest.skip(f"shared fixture {path} not present")
    return json.loads(path.read_text())


def with_reasons(params: SchedParams | None = None) -> SchedParams:
    """``params`` (default: the defaults) with ``extender.reasons_when_placed`` on: filter
    replies carry the failed nodes' reasons even when they offer a node."""
    from dataclasses import replace

    params = params or SchedParams()
    return replace(params, extender=replace(params.extender, reasons_when_placed=True))


def fixture_cache(params: SchedParams | None = None) -> ClusterCache:
    """The fixtures' 4 x DGX H100 cluster with the running 6-GPU pod on dgx-h100-04."""
    params = params or SchedParams()
    nodes = fixture("filter_args_nodes.json")["Nodes"]["items"]
    pods = fixture("existing_pods.json")["items"]
    return ClusterCache.from_objects(nodes, pods, params)


def asgi_client(extender: Extender, **kw: Any) -> httpx.Client:
    """An httpx client speaking HTTP to the app through the ASGI transport (sync wrapper)."""
    app = create_app(extender, **kw)
    return SyncASGIClient(app)


class SyncASGIClient:
    """Minimal sync facade over httpx.AsyncClient + ASGITransport (real HTTP semantics,
    no socket)."""

    def __init__(self, app: Any) -> None:
        import anyio

        self._anyio = anyio
        self._app = app

    def request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self._app)
            async with httpx.AsyncClient(transport=transport, base_url="http://extender") as c:
                return await c.request(method, url, **kw)

        return self._anyio.run(go)

    def post(self, url: str, **kw: Any) -> httpx.Response:
        return self.request("POST", url, **kw)

    def get(self, url: str, **kw: Any) -> httpx.Response:
        return self.request("GET", url, **kw)
