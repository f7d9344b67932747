"""Replays of payloads recorded from a real kube-apiserver v1.28.7 (tests/fixtures/kube).

Two stand-ins for the API server, used only where no API server can run (CI):

* :class:`RecordedApiServer`: a loopback HTTP/1.1 server answering with recorded bodies
  and status codes (watches are sent chunked, split mid-line), so the real ``kubernetes``
  client and :class:`scheduler.kube.client.KubeApi` run unchanged over real HTTP;
* :class:`RecordedApiFake`: the :class:`~scheduler.kube.client.KubeApi` surface replaying
  recorded lists, watch streams and error bodies in-process (errors are decoded by the
  same :func:`~scheduler.kube.client.decode_status` the real client uses).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from scheduler.kube.client import ApiError, ResourceKind, decode_status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kube"
SHARED_EXTENDER = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "extender"


def recorded(name: str) -> Any:
    """A recorded JSON body (fresh copy)."""
    return json.loads((FIXTURES / name).read_text())


def recorded_stream(name: str) -> list[dict[str, Any]]:
    """A recorded watch stream as a list of events."""
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


def recorded_raw(name: str) -> tuple[bytes, str]:
    """(body bytes, content type) of a recorded response; non-JSON answers were recorded
    as ``{"httpStatus", "contentType", "body"}``."""
    obj = recorded(name)
    if isinstance(obj, dict) and "httpStatus" in obj and "body" in obj:
        return obj["body"].encode(), obj["contentType"]
    return json.dumps(obj).encode(), "application/json"


def recorded_error(name: str, status: int) -> ApiError:
    """The ApiError the client raises for a recorded error body."""
    body, _ = recorded_raw(name)
    return decode_status(body, status)


class _Stream:
    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.closed = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for item in self.items:
            if self.closed:
                return
            if isinstance(item, BaseException):
                raise item
            yield copy.deepcopy(item)

    def close(self) -> None:
        self.closed = True


class RecordedApiFake:
    """In-process stand-in for :class:`~scheduler.kube.client.KubeApi` replaying
    recorded payloads. Script it through the public attributes.

    Attributes:
        lists: kind name -> recorded list object (copied on every call).
        resources: (group, version) -> APIResourceList, absent = not served.
        watches: kind name -> queue of scripted watch requests; each is a list of events
            (an exception in the list is raised at that point) or an exception raised
            when the watch is opened. An empty queue yields an empty stream.
        binding_results: queue of answers to ``create_binding`` (a dict, or an exception
            to raise); empty queue -> the recorded 201 Status.
        pods: "ns/name" -> pod object or exception for ``get_pod``.
        bindings: bodies received by ``create_binding``.
        watch_calls: (kind name, resourceVersion) of every watch request.
        calls: call counts by "method:kind".
    """

    def __init__(self) -> None:
        self.lists: dict[str, dict[str, Any]] = {}
        self.resources: dict[tuple[str, str], dict[str, Any]] = {}
        self.watches: dict[str, deque[Any]] = {}
        self.binding_results: deque[Any] = deque()
        self.pods: dict[str, Any] = {}
        self.bindings: list[dict[str, Any]] = []
        self.watch_calls: list[tuple[str, str]] = []
        self.calls: Counter[str] = Counter()
        self.bind_gate: threading.Event | None = None

    def list(self, kind: ResourceKind) -> dict[str, Any]:
        self.calls[f"list:{kind.name}"] += 1
        lst = self.lists.get(kind.name)
        if isinstance(lst, BaseException):
            raise lst
        if lst is None:
            raise ApiError(404, "NotFound", f"{kind.name} not recorded")
        out = copy.deepcopy(lst)
        from scheduler.kube.client import strip_object

        for item in out.get("items") or ():
            strip_object(item, kind)
        return out

    def watch(self, kind: ResourceKind, resource_version: str, timeout_seconds: Any = None) -> Any:
        self.calls[f"watch:{kind.name}"] += 1
        self.watch_calls.append((kind.name, resource_version))
        q = self.watches.get(kind.name)
        item = q.popleft() if q else []
        if isinstance(item, BaseException):
            raise item
        return _Stream(list(item))

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls["get:pods"] += 1
        obj = self.pods.get(f"{namespace}/{name}")
        if obj is None:
            raise recorded_error("get_pod_404.json", 404)
        if isinstance(obj, BaseException):
            raise obj
        return copy.deepcopy(obj)

    def create_binding(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.calls["create:bindings"] += 1
        self.bindings.append(copy.deepcopy(dict(body)))
        if self.bind_gate is not None:
            self.bind_gate.wait(10)
        res = self.binding_results.popleft() if self.binding_results else None
        if isinstance(res, BaseException):
            raise res
        return res if res is not None else recorded("binding_201_created.json")

    def api_resources(self, group: str, version: str) -> dict[str, Any] | None:
        self.calls[f"discovery:{group}/{version}"] += 1
        return copy.deepcopy(self.resources.get((group, version)))

    def close(self) -> None:
        self.calls["close"] += 1


class _Route:
    def __init__(self, status: int, body: bytes, ctype: str, delay: float, chunk: int) -> None:
        self.status = status
        self.body = body
        self.ctype = ctype
        self.delay = delay
        self.chunk = chunk


class RecordedApiServer:
    """Loopback HTTP/1.1 server answering with recorded bodies (see module docstring).

    Routes are keyed by (method, path, is_watch); several answers for one route are
    served in order, the last one repeatedly.
    """

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str, bool], list[_Route]] = {}
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                url = urlsplit(self.path)
                q = parse_qs(url.query)
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                watch = q.get("watch", ["false"])[0] == "true"
                outer.requests.append(
                    {
                        "method": method,
                        "path": url.path,
                        "query": q,
                        "body": body,
                        "watch": watch,
                        "authorization": self.headers.get("Authorization"),
                        "content_type": self.headers.get("Content-Type"),
                        "accept": self.headers.get("Accept"),
                    }
                )
                answers = outer.routes.get((method, url.path, watch))
                if not answers:
                    r = _Route(404, b"404 page not found\n", "text/plain; charset=utf-8", 0, 0)
                else:
                    r = answers.pop(0) if len(answers) > 1 else answers[0]
                if r.delay:
                    time.sleep(r.delay)
                try:
                    self.send_response(r.status)
                    self.send_header("Content-Type", r.ctype)
                    if r.chunk:
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        for i in range(0, len(r.body), r.chunk):
                            part = r.body[i : i + r.chunk]
                            self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                            self.wfile.flush()
                        self.wfile.write(b"0\r\n\r\n")
                    else:
                        self.send_header("Content-Length", str(len(r.body)))
                        self.end_headers()
                        self.wfile.write(r.body)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PATCH(self) -> None:
                self._serve("PATCH")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def add(
        self,
        method: str,
        path: str,
        status: int,
        body: Any,
        *,
        watch: bool = False,
        content_type: str = "application/json",
        delay: float = 0.0,
        chunk: int = 0,
    ) -> None:
        """Answer ``method path`` with ``body`` (bytes, a fixture name, or an object)."""
        if isinstance(body, str) and (FIXTURES / body).is_file():
            if body.endswith(".jsonl"):
                raw = (FIXTURES / body).read_bytes()
            else:
                raw, content_type = recorded_raw(body)
        elif isinstance(body, bytes):
            raw = body
        else:
            raw = json.dumps(body).encode()
        self.routes.setdefault((method, path, watch), []).append(
            _Route(status, raw, content_type, delay, chunk)
        )

    def __enter__(self) -> RecordedApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def api(self, read_timeout: float = 5.0) -> Any:
        """A real :class:`~scheduler.kube.client.KubeApi` pointed at this server."""
        from kubernetes import client

        from scheduler.kube.client import KubeApi, Timeouts

        cfg = client.Configuration(host=self.url)
        cfg.retries = False
        return KubeApi(
            client.ApiClient(cfg), Timeouts(connect=2.0, read=read_timeout, watch_seconds=5)
        )
