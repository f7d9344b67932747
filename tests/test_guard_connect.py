"""The guarded protocol's connection set-up (``guard.py``, ``_connected``) over real
uvicorn and real sockets: the same connection state as uvicorn's own ``connection_made``,
without its address helpers (a socket object per call under uvloop).

A spy subclass of the protocol ``serve`` runs records, for each connection, the state
``connection_made`` left and what uvicorn's helpers say for the same transport.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import orjson
import pytest
import uvicorn.protocols.http.httptools_impl as httptools_impl
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.utils import get_local_addr, get_remote_addr, is_ssl

from benchmarks.clusters import make_pod
from scheduler.cli.demo import ServerThread
from scheduler.server.app import create_app
from scheduler.server.guard import GuardState, guarded_protocol
from tests.test_fastlane import cluster_extender, post, read_responses, split


def recording(protocol: type[Any], seen: list[dict[str, Any]]) -> type[Any]:
    """``protocol`` that records its state after ``connection_made`` (a spy)."""

    class Recording(protocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            seen.append(
                {
                    "server": self.server,
                    "client": self.client,
                    "scheme": self.scheme,
                    "flow": self.flow,
                    "registered": self in self.connections,
                    "uvicorn": (
                        get_local_addr(transport),
                        get_remote_addr(transport),
                        "https" if is_ssl(transport) else "http",
                    ),
                    "peer": transport.get_extra_info("peername"),
                }
            )

    return Recording


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        pytest.param("::1", marks=pytest.mark.skipif(not _ipv6(), reason="no IPv6 loopback here")),
    ],
)
def test_connection_state_is_uvicorns_and_the_caller_reaches_the_audit_line(
    host: str, fast: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="topoplace.bind")
    calls: list[str] = []

    def spy(name: str, real: Any) -> Any:
        def counted(transport: Any) -> Any:
            calls.append(name)
            return real(transport)

        return counted

    # Spies on uvicorn's address helpers as its protocol module calls them.
    monkeypatch.setattr(httptools_impl, "get_local_addr", spy("local", get_local_addr))
    monkeypatch.setattr(httptools_impl, "get_remote_addr", spy("remote", get_remote_addr))
    ext = cluster_extender()
    app = create_app(ext)
    seen: list[dict[str, Any]] = []
    proto = recording(guarded_protocol(GuardState(), app.verbs if fast else None), seen)
    names = [n.name for n in ext.cache.snapshot().nodes]
    pod = make_pod("c0", 1, namespace="conn", cpu="1", memory="1Gi")
    pod["metadata"]["uid"] = "uid-c0"
    with ServerThread(app, host=host, http=proto) as srv:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        socks = []
        for _ in range(3):
            s = socket.socket(family)
            s.connect((host, srv.port))
            socks.append(s)
        s = socks[0]
        s.sendall(post("/scheduler/filter", orjson.dumps({"Pod": pod, "NodeNames": names})))
        (node,) = orjson.loads(split(read_responses(s, 1)[0])[2])["NodeNames"]
        bind = {"PodName": "c0", "PodNamespace": "conn", "PodUID": "uid-c0", "Node": node}
        s.sendall(post("/scheduler/bind", orjson.dumps(bind)))
        assert orjson.loads(split(read_responses(s, 1)[0])[2]) == {"Error": ""}
        mine = [x.getsockname() for x in socks]
        for x in socks:
            x.close()
    assert len(seen) == 3
    for rec, local in zip(seen, mine, strict=True):
        assert (rec["server"], rec["client"], rec["scheme"]) == rec["uvicorn"]
        assert rec["client"] == (local[0], local[1])  # the client's own address
        assert rec["server"] == (host, srv.port)
        assert isinstance(rec["flow"], FlowControl) and rec["registered"]
    assert calls == []  # uvicorn's helpers (a socket object per call) were not needed
    (line,) = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "topoplace.bind"]
    assert line["result"] == "bound" and line["caller"] == f"{mine[0][0]}:{mine[0][1]}"


def _assigned(func: Any) -> set[str]:
    """The ``self.<name>`` attributes a method assigns, read from its source."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    return {
        t.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


def test_connected_sets_what_uvicorns_connection_made_sets() -> None:
    # guard._connected re-does uvicorn's connection_made with cheaper address reads; a
    # uvicorn that starts setting more state there must be followed (this fails first).
    proto = guarded_protocol(GuardState())
    uvicorns = _assigned(httptools_impl.HttpToolsProtocol.connection_made)
    assert uvicorns == {"transport", "flow", "server", "client", "scheme"}
    assert _assigned(proto._connected) == uvicorns
