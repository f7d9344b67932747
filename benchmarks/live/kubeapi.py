"""A small raw-REST client for the benchmark (httpx + orjson, one connection per thread).

The benchmark creates hundreds of nodes and thousands of pods and watches every binding;
the ``kubernetes`` client's model classes would cost more than the API server does. Only
what a loopback control plane needs: a kubeconfig with a server, a CA (data or file, or
``insecure-skip-tls-verify``) and a bearer token or a client certificate.
"""

from __future__ import annotations

import base64
import contextlib
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


class ApiError(RuntimeError):
    """The API server answered with a non-2xx status."""

    def __init__(self, status: int, body: bytes, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:300]!r}")
        self.status = status


def _data_or_file(entry: Mapping[str, Any], key: str, tmp: Path) -> str | None:
    """Path of a kubeconfig ``key`` (``key-data`` written to a temp file)."""
    if entry.get(f"{key}-data"):
        p = tmp / key
        p.write_bytes(base64.b64decode(entry[f"{key}-data"]))
        return str(p)
    return entry.get(key)


class Api:
    """Raw JSON calls against the API server named by a kubeconfig."""

    def __init__(self, kubeconfig: str | Path, timeout: float = 30.0) -> None:
        kc = yaml.safe_load(Path(kubeconfig).read_text())
        ctx_name = kc.get("current-context")
        ctx = next(c["context"] for c in kc["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in kc["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in kc["users"] if u["name"] == ctx["user"])
        self.server = cluster["server"].rstrip("/")
        self._tmp = tempfile.TemporaryDirectory(prefix="livebench-kc-")
        tmp = Path(self._tmp.name)
        if cluster.get("insecure-skip-tls-verify"):
            self._verify: Any = False
        else:
            ca = _data_or_file(cluster, "certificate-authority", tmp)
            self._verify = ssl.create_default_context(cafile=ca) if ca else True
        cert = _data_or_file(user, "client-certificate", tmp)
        key = _data_or_file(user, "client-key", tmp)
        if cert and key and not isinstance(self._verify, bool):
            self._verify.load_cert_chain(cert, key)
        self._headers = {"Accept": "application/json"}
        if user.get("token"):
            self._headers["Authorization"] = f"Bearer {user['token']}"
        self.timeout = timeout
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()

    def _client(self) -> httpx.Client:
        c = getattr(self._local, "client", None)
        if c is None:
            c = httpx.Client(
                base_url=self.server,
                verify=self._verify,
                headers=self._headers,
                timeout=self.timeout,
            )
            self._local.client = c
            with self._lock:
                self._clients.append(c)
        return c

    def close(self) -> None:
        with self._lock:
            for c in self._clients:
                c.close()
            self._clients.clear()
        self._tmp.cleanup()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: Mapping[str, Any] | None = None,
        ok: tuple[int, ...] = (),
    ) -> Any:
        """One request; the decoded JSON answer. Statuses in ``ok`` return None."""
        headers = {"Content-Type": content_type} if body is not None else None
        r = self._client().request(
            method,
            path,
            content=orjson.dumps(body) if body is not None else None,
            headers=headers,
            params=params,
        )
        if r.status_code in ok:
            return None
        if r.status_code >= 300:
            raise ApiError(r.status_code, r.content, f"{method} {path}")
        return orjson.loads(r.content) if r.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params=params or None)

    def version(self) -> str:
        return str(self.get("/version").get("gitVersion", ""))

    # ---- nodes ----------------------------------------------------------------------------

    def create_ready_node(self, node: Mapping[str, Any]) -> None:
        """Create a Node with its status (Ready, capacity: a create keeps the status it is
        given, as for a kubelet's registration) and lift the not-ready taint that
        the TaintNodesByCondition admission plugin adds at creation (no node lifecycle
        controller here). An existing node of that name is replaced."""
        name = node["metadata"]["name"]
        got = self.call("POST", "/api/v1/nodes", node, ok=(409,))
        if got is None:  # exists: take its labels and status from us
            self.call(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"metadata": {"labels": node["metadata"].get("labels") or {}}},
                content_type=MERGE_PATCH,
            )
            if node.get("status"):
                self.call(
                    "PATCH",
                    f"/api/v1/nodes/{name}/status",
                    {"status": node["status"]},
                    content_type=MERGE_PATCH,
                )
            got = self.get(f"/api/v1/nodes/{name}")
        for _ in range(20):
            taints = (got.get("spec") or {}).get("taints") or []
            keep = [t for t in taints if t.get("key") not in NOT_READY_TAINTS]
            if len(keep) == len(taints):
                return
            rv = got["metadata"]["resourceVersion"]
            try:
                self.call(
                    "PATCH",
                    f"/api/v1/nodes/{name}",
                    {"metadata": {"resourceVersion": rv}, "spec": {"taints": keep or None}},
                    content_type=MERGE_PATCH,
                )
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
            got = self.get(f"/api/v1/nodes/{name}")
        raise RuntimeError(f"could not lift the not-ready taint of {name}")

    def create_nodes(self, nodes: list[dict[str, Any]], workers: int = 8) -> float:
        """Create ``nodes`` in parallel (``workers`` connections); seconds taken."""
        t0 = time.monotonic()
        parallel(self.create_ready_node, nodes, workers)
        return time.monotonic() - t0

    def list_nodes(self, label_selector: str = "") -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        items = self.call("GET", "/api/v1/nodes", params=params).get("items") or []
        for it in items:
            it.setdefault("apiVersion", "v1")
            it.setdefault("kind", "Node")
        return sorted(items, key=lambda n: n["metadata"]["name"])

    def delete_nodes(self, label_selector: str) -> None:
        self.call("DELETE", "/api/v1/nodes", params={"labelSelector": label_selector})

    # ---- namespaces and pods --------------------------------------------------------------

    def ensure_namespace(self, ns: str) -> None:
        self.call(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            ok=(409,),
        )

    def create_pod(self, ns: str, pod: Mapping[str, Any]) -> dict[str, Any]:
        return self.call("POST", f"/api/v1/namespaces/{ns}/pods", pod)  # type: ignore[no-any-return]

    def ungate_pod(self, ns: str, name: str) -> None:
        """Remove every scheduling gate of a pod (``spec.schedulingGates``): from then on
        the scheduler may try it."""
        self.call(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/{name}",
            [{"op": "remove", "path": "/spec/schedulingGates"}],
            content_type=JSON_PATCH,
        )

    def bind_pod(self, ns: str, name: str, node: str) -> None:
        """POST the pod's ``binding`` subresource (what a scheduler's bind writes)."""
        self.call(
            "POST",
            f"/api/v1/namespaces/{ns}/pods/{name}/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": ns},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            },
        )

    def get_text(self, url: str, timeout: float = 30.0) -> str:
        """GET another loopback server that authenticates with this kubeconfig's token
        (kube-scheduler's ``/metrics``; its self-signed certificate is not verified)."""
        r = httpx.get(url, headers=self._headers, verify=False, timeout=timeout)
        if r.status_code >= 300:
            raise ApiError(r.status_code, r.content, f"GET {url}")
        return r.text

    def list_pods(self, ns: str, label_selector: str = "") -> dict[str, Any]:
        """The PodList (items and ``metadata.resourceVersion``)."""
        params = {"labelSelector": label_selector} if label_selector else {}
        return self.get(f"/api/v1/namespaces/{ns}/pods", **params)  # type: ignore[no-any-return]

    def delete_pod(self, ns: str, name: str) -> None:
        """Delete one pod at once (grace 0: no kubelet confirms); gone already is fine."""
        self.call(
            "DELETE",
            f"/api/v1/namespaces/{ns}/pods/{name}",
            {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
            ok=(404,),
        )

    def delete_pods(self, ns: str, timeout: float = 120.0) -> float:
        """Delete every pod of ``ns`` at once (grace 0: no kubelet confirms) and wait until
        none is left; seconds taken."""
        t0 = time.monotonic()
        self.call(
            "DELETE",
            f"/api/v1/namespaces/{ns}/pods",
            {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
        )
        while time.monotonic() - t0 < timeout:
            left = self.list_pods(ns).get("items") or []
            if not left:
                return time.monotonic() - t0
            for p in left:  # stragglers (Terminating): delete one by one, grace 0
                with contextlib.suppress(ApiError):
                    self.call(
                        "DELETE",
                        f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}",
                        {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                    )
            time.sleep(0.5)
        raise RuntimeError(f"pods of {ns} not gone after {timeout}s")

    def watch(
        self,
        path: str,
        resource_version: str,
        on_event: Callable[[str, dict[str, Any], float], None],
        stop: threading.Event,
        server_timeout: int = 10,
        label_selector: str = "",
    ) -> None:
        """Watch ``path`` from ``resource_version`` until ``stop`` is set, calling
        ``on_event(type, object, monotonic receipt time)``; re-watches from the last seen
        resourceVersion when the server closes the stream (every ``server_timeout`` seconds,
        which bounds how long ``stop`` takes when nothing happens). Runs in the caller's
        thread."""
        rv = resource_version
        client = httpx.Client(
            base_url=self.server,
            verify=self._verify,
            headers=self._headers,
            timeout=httpx.Timeout(self.timeout, read=server_timeout + 30.0),
        )
        try:
            while not stop.is_set():
                params = {
                    "watch": "1",
                    "resourceVersion": rv,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": str(server_timeout),
                }
                if label_selector:
                    params["labelSelector"] = label_selector
                with client.stream("GET", path, params=params) as r:
                    if r.status_code >= 300:
                        raise ApiError(r.status_code, r.read(), f"watch {path}")
                    for line in r.iter_lines():
                        if not line:
                            continue
                        t = time.monotonic()
                        ev = orjson.loads(line)
                        obj = ev.get("object") or {}
                        if ev.get("type") == "ERROR":
                            raise ApiError(int(obj.get("code") or 500), line.encode(), "watch")
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if ev.get("type") != "BOOKMARK":
                            on_event(ev["type"], obj, t)
                        if stop.is_set():
                            return
        finally:
            client.close()


def parallel(fn: Callable[[Any], Any], items: list[Any], workers: int) -> list[Any]:
    """``fn`` over ``items`` on a thread pool; results in order; the first error raised."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(fn, items))
