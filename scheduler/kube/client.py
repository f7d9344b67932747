"""Kubernetes API access for topoplace: client construction and raw-JSON calls.

Everything the adapter needs from the API goes through :class:`KubeApi`, a narrow surface
(list, watch, get pod, create binding, discovery) that speaks **raw JSON**: objects come
back as the camelCase dicts the API server sends (and kube-scheduler forwards), never as
the ``kubernetes`` client's model classes. That keeps the cache fed with exactly the
shapes the extender payloads carry, and costs one ``orjson.loads`` per response.

Errors are normalised into :class:`ApiError` (the server answered with a non-2xx status;
``status`` and the decoded ``Status`` body are kept) and :class:`ApiUnavailable` (no
answer: connection refused, TLS failure, timeout). Callers never see urllib3 or
``kubernetes.client.exceptions`` types. (Those two, :class:`Timeouts` and the decoding
helpers live in ``apitypes.py``, shared with the asyncio poster of ``aio.py``, and are
importable from here.)

Configuration precedence (:func:`load_api_client`): an explicit kubeconfig path, then the
``KUBECONFIG`` variable, then the in-cluster ServiceAccount (``KUBERNETES_SERVICE_HOST``),
then ``~/.kube/config``. Every request carries a (connect, read) timeout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson

from scheduler.kube import protobuf
from scheduler.kube.apitypes import (
    ApiError,
    ApiUnavailable,
    Timeouts,
    decode_status,
    json_object,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ResourceKind:
    """A listable, watchable resource.

    Attributes:
        group: API group ("" for the core group).
        version: API version.
        plural: resource name in URLs.
        kind: object kind (set on list items, which the API leaves without it).
    """

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        """``apiVersion`` of the objects."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        """Short identifier for logs and metrics: ``plural`` or ``plural.group``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


NODES = ResourceKind("", "v1", "nodes", "Node")
PODS = ResourceKind("", "v1", "pods", "Pod")
PDBS = ResourceKind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")


def strip_object(obj: dict[str, Any], kind: ResourceKind | None = None) -> dict[str, Any]:
    """Drop ``metadata.managedFields`` (as kube-scheduler's informers do) and set
    ``kind``/``apiVersion`` when missing (list items come without them). In place."""
    m = obj.get("metadata")
    if isinstance(m, dict):
        m.pop("managedFields", None)
    if kind is not None:
        obj.setdefault("kind", kind.kind)
        obj.setdefault("apiVersion", kind.api_version)
    return obj


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A ``kubernetes.client.ApiClient`` for one cluster (never the global default).

    Precedence: ``kubeconfig``, ``$KUBECONFIG`` (first file), in-cluster config when
    ``KUBERNETES_SERVICE_HOST`` is set, then ``~/.kube/config``.

    Raises:
        ApiUnavailable: no usable configuration was found.
    """
    from kubernetes import client, config

    cfg = client.Configuration()
    path = kubeconfig or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or None
    try:
        if path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
            source = "in-cluster ServiceAccount"
        else:
            config.load_kube_config(
                config_file=path, context=context, client_configuration=cfg, persist_config=False
            )
            source = path or "~/.kube/config"
    except (config.ConfigException, OSError) as exc:
        raise ApiUnavailable(f"no usable Kubernetes configuration: {exc}") from None
    # One connection per watch (nodes, pods, up to three PodGroup APIs) plus binds and
    # GETs running concurrently in the server's thread pool.
    cfg.connection_pool_maxsize = max(int(cfg.connection_pool_maxsize or 0), 32)
    log.info("Kubernetes API %s (configuration from %s)", cfg.host, source)
    api = client.ApiClient(cfg)
    api.user_agent = "topoplace-extender"
    return api


class WatchStream:
    """Events of one watch request, decoded, in order. Closable from another thread.

    Iterating yields ``{"type": ..., "object": {...}}`` dicts until the server ends the
    request (its ``timeoutSeconds`` passed) or :meth:`close` is called.

    Raises (while iterating):
        ApiUnavailable: the connection broke or timed out.
    """

    def __init__(self, response: Any) -> None:
        self._resp = response
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        buf = b""
        try:
            for chunk in self._resp.stream(65536, decode_content=True):
                if self._closed.is_set():
                    return
                buf += chunk
                start = 0
                while True:  # every whole line of the read, without copying the rest each time
                    nl = buf.find(b"\n", start)
                    if nl < 0:
                        break
                    line = buf[start:nl]
                    start = nl + 1
                    if line.strip():
                        yield orjson.loads(line)
                buf = buf[start:]
            if buf.strip() and not self._closed.is_set():
                yield orjson.loads(buf)
        except orjson.JSONDecodeError as exc:
            raise ApiUnavailable(f"malformed watch event: {exc}") from None
        except Exception as exc:  # urllib3 / socket errors while streaming
            if self._closed.is_set():
                return
            raise _unavailable(exc) from None
        finally:
            self._release()

    def close(self) -> None:
        """Stop the stream; a blocked read in another thread returns (idempotent)."""
        self._closed.set()
        shutdown = getattr(self._resp, "shutdown", None)
        try:
            if callable(shutdown):
                shutdown()
            self._resp.close()
        except Exception:  # closing a broken socket may raise; nothing to do
            pass

    def _release(self) -> None:
        with contextlib.suppress(Exception):
            self._resp.release_conn()


def _unavailable(exc: BaseException) -> ApiUnavailable:
    name = type(exc).__name__
    text = str(exc)
    timeout = "timeout" in name.lower() or "timed out" in text.lower()
    return ApiUnavailable(f"{name}: {text}"[:500], timeout=timeout)


AUTH_HEADERS_TTL_S = 60.0
"""How long the credentials of a raw POST are reused (bound service-account tokens live an
hour and are refreshed by the kubelet well before they expire; a 401 refreshes at once)."""


STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


def _node_path(name: str) -> str:
    return f"/api/v1/nodes/{quote(name, safe='')}"


def _pod_path(namespace: str, name: str, sub: str = "") -> str:
    """The path of a pod, or of its subresource ``sub`` (binding, eviction)."""
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
    return f"{path}/{sub}" if sub else path


def _annotations_patch(
    annotations: Mapping[str, str | None], resource_version: str = ""
) -> dict[str, Any]:
    """A merge patch of an object's annotations (None deletes a key); with
    ``resource_version`` it is conditional (409 Conflict if the object changed)."""
    md: dict[str, Any] = {"annotations": dict(annotations)}
    if resource_version:
        md["resourceVersion"] = resource_version
    return {"metadata": md}


class KubeApi:
    """The raw-JSON calls topoplace makes. Thread-safe (one urllib3 pool).

    Args:
        api_client: a ``kubernetes.client.ApiClient`` (see :func:`load_api_client`).
        timeouts: request timeouts.
    """

    def __init__(self, api_client: Any, timeouts: Timeouts | None = None) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.timeouts = timeouts or Timeouts()
        self._core = client.CoreV1Api(api_client)
        self._auth_headers: tuple[float, dict[str, str]] | None = None
        self._custom = client.CustomObjectsApi(api_client)
        self._poster: Any = False  # AsyncPoster, made on first use (None: not usable)

    @classmethod
    def from_config(
        cls,
        kubeconfig: str | None = None,
        context: str | None = None,
        timeouts: Timeouts | None = None,
    ) -> KubeApi:
        """Build from a kubeconfig / in-cluster configuration (:func:`load_api_client`)."""
        return cls(load_api_client(kubeconfig, context), timeouts)

    @property
    def host(self) -> str:
        """The API server URL."""
        return str(self.api_client.configuration.host)

    # ---- plumbing -------------------------------------------------------------------

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call a generated method with ``_preload_content=False``; returns the urllib3
        response. Maps every failure to ApiError / ApiUnavailable."""
        from kubernetes.client.exceptions import ApiException

        kwargs.setdefault("_request_timeout", self.timeouts.request)
        try:
            return fn(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            if not exc.status:
                raise ApiUnavailable(str(exc.reason or exc)[:500]) from None
            raise decode_status(exc.body, int(exc.status), str(exc.reason or "")) from None
        except ApiError:
            raise
        except Exception as exc:  # urllib3.exceptions.HTTPError, OSError, ...
            if _is_validation_error(exc):
                raise
            raise _unavailable(exc) from None

    def _json(self, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        resp = self._call(fn, *args, **kwargs)
        try:
            data = resp.data
        except Exception as exc:
            raise _unavailable(exc) from None
        return json_object(data)

    def _lister(self, kind: ResourceKind) -> tuple[Any, tuple[Any, ...]]:
        if kind == NODES:
            return self._core.list_node, ()
        if kind == PODS:
            return self._core.list_pod_for_all_namespaces, ()
        return self._custom.list_cluster_custom_object, (kind.group, kind.version, kind.plural)

    # ---- calls ----------------------------------------------------------------------

    def list(self, kind: ResourceKind) -> dict[str, Any]:
        """A consistent list of every object of ``kind`` (all namespaces), raw JSON.

        Items get ``kind``/``apiVersion`` and lose ``managedFields``.
        """
        fn, args = self._lister(kind)
        out = self._json(fn, *args)
        for item in out.get("items") or ():
            if isinstance(item, dict):
                strip_object(item, kind)
        return out

    def watch(
        self, kind: ResourceKind, resource_version: str, timeout_seconds: int | None = None
    ) -> WatchStream:
        """Open a watch from ``resource_version`` with bookmarks.

        Raises:
            ApiError: the server refused (410 when the version is too old).
            ApiUnavailable: no answer.
        """
        secs = int(timeout_seconds or self.timeouts.watch_seconds)
        fn, args = self._lister(kind)
        resp = self._call(
            fn,
            *args,
            watch=True,
            resource_version=resource_version or None,
            allow_watch_bookmarks=True,
            timeout_seconds=secs,
            _request_timeout=self.timeouts.watch(secs),
        )
        return WatchStream(resp)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """GET one pod (raw JSON, without managedFields). Raises ApiError (404...)."""
        return strip_object(self._json(self._core.read_namespaced_pod, name, namespace), PODS)

    def create_binding(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``pods/{name}/binding``; returns the server's answer (a ``Status``).

        The one write per pod on the hot path, so it skips the generated client's model
        layer: the body is serialized with orjson and POSTed on the client's own urllib3
        pool, with its TLS settings, default headers and auth (token refresh included, as
        ``update_params_for_auth`` does for the generated calls). Errors map as for every
        other call (:func:`decode_status`, :class:`ApiUnavailable`)."""
        path = _pod_path(namespace, name, "binding")
        return self._post_json(path, orjson.dumps(dict(body)))

    def evict_pod(
        self, namespace: str, name: str, delete_options: Mapping[str, Any]
    ) -> dict[str, Any]:
        """POST ``pods/{name}/eviction`` (``policy/v1``; PodDisruptionBudgets apply: a
        refusal is a 429 ``ApiError``)."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": dict(delete_options),
        }
        return self._post_json(_pod_path(namespace, name, "eviction"), orjson.dumps(body))

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST an ``events.k8s.io/v1`` Event into ``namespace``."""
        path = f"/apis/events.k8s.io/v1/namespaces/{quote(namespace, safe='')}/events"
        return self._post_json(path, orjson.dumps(dict(body)))

    async def create_binding_async(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """:meth:`create_binding` from the event loop, on the connections of
        :class:`scheduler.kube.aio.AsyncPoster` (no worker thread); the same Binding,
        credentials and errors, with the body in protobuf as kube-scheduler sends it
        (``scheduler/kube/protobuf.py``) and the answer in JSON. Falls back to the blocking call in a thread when the
        configuration needs what the poster does not do (a proxy)."""
        path = _pod_path(namespace, name, "binding")
        poster = self._async_poster()
        if poster is None:
            import asyncio

            return await asyncio.to_thread(self._post_json, path, orjson.dumps(dict(body)))
        # As kube-scheduler's own binder: the Binding in protobuf, the answer in JSON
        # (scheduler/kube/protobuf.py: the API server skips a strict JSON decode).
        return await poster.post_json(path, protobuf.binding(body), protobuf.CONTENT_TYPE)

    def _async_poster(self) -> Any:
        if self._poster is False:
            from scheduler.kube.aio import AsyncPoster

            self._poster = AsyncPoster.from_api(self)
        return self._poster

    def _post_headers(self, fresh: bool = False) -> dict[str, str]:
        """Headers of a raw POST: the client's defaults, JSON, and its credentials.

        Computing the credentials runs the kubeconfig's token refresh (an exec plugin, a
        token file), which the generated client does on every call; here they are kept for
        :data:`AUTH_HEADERS_TTL_S` and recomputed early after a 401 (``fresh``)."""
        now = time.monotonic()
        cached = self._auth_headers
        if fresh or cached is None or now - cached[0] > AUTH_HEADERS_TTL_S:
            headers = dict(self.api_client.default_headers)
            headers["Content-Type"] = "application/json"
            headers["Accept"] = "application/json"
            self.api_client.update_params_for_auth(headers, [], ["BearerToken"], "", "POST", None)
            cached = (now, headers)
            self._auth_headers = cached
        return dict(cached[1])

    def _post_json(self, path: str, data: bytes) -> dict[str, Any]:
        return self._request("POST", path, data)

    def request_json(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """A raw JSON request to ``path`` (GET/PUT/PATCH/POST/DELETE) on the client's pool,
        with its credentials (as :meth:`create_binding`); the answer decoded. For the few
        writes that have no generated method shape worth using (claim status, JSON
        patches). Errors map as for every other call."""
        return self._request(
            method, path, None if body is None else orjson.dumps(body), content_type
        )

    def _request(
        self, method: str, path: str, data: bytes | None, content_type: str = "application/json"
    ) -> dict[str, Any]:
        """``data`` sent raw to ``path`` with the cached credentials (refreshed and tried once
        more after a 401); the answer as a JSON object, or the mapped error."""
        import urllib3

        client = self.api_client
        connect, read = self.timeouts.request
        for attempt in (0, 1):
            headers = self._post_headers(fresh=attempt > 0)
            headers["Content-Type"] = content_type
            try:
                resp = client.rest_client.pool_manager.request(
                    method,
                    client.configuration.host + path,
                    body=data,
                    headers=headers,
                    timeout=urllib3.Timeout(connect=connect, read=read),
                    preload_content=True,
                    retries=False,
                )
            except Exception as exc:  # urllib3.exceptions.HTTPError, OSError, ...
                raise _unavailable(exc) from None
            if resp.status != 401:
                break  # a 401 with cached credentials: refresh them and try once more
        if not 200 <= resp.status < 300:
            raise decode_status(resp.data, int(resp.status), str(resp.reason or ""))
        return json_object(resp.data)

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> dict[str, Any]:
        """Merge ``annotations`` into a pod's metadata (a strategic merge patch, the
        content type the generated ``patch_namespaced_pod`` picks for an object body).

        Sent raw on the client's pool (as :meth:`request_json`): the parked-pod waker
        patches once or more per pod it wakes, and the generated method's argument
        validation and response handling cost more than the request itself (profiled in
        the live soak: the waker's patches were 8 % of the serving process's CPU)."""
        body = orjson.dumps({"metadata": {"annotations": dict(annotations)}})
        return self._request("PATCH", _pod_path(namespace, name), body, STRATEGIC_MERGE_PATCH)

    def get_node(self, name: str) -> dict[str, Any]:
        """GET one node (raw JSON, without managedFields). Raises ApiError (404...)."""
        return strip_object(self._json(self._core.read_node, name), NODES)

    def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str = ""
    ) -> dict[str, Any]:
        """Merge ``annotations`` into a node's metadata (None deletes a key); with
        ``resource_version`` the patch is conditional (409 Conflict if the node changed)."""
        return self._json(
            self._core.patch_node, name, _annotations_patch(annotations, resource_version)
        )

    async def get_node_async(self, name: str) -> dict[str, Any]:
        """:meth:`get_node` from the event loop (:meth:`request_async`)."""
        return strip_object(await self.request_async("GET", _node_path(name)), NODES)

    async def patch_node_annotations_async(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str = ""
    ) -> dict[str, Any]:
        """:meth:`patch_node_annotations` from the event loop: a JSON merge patch of the
        node's metadata (``resourceVersion`` in it makes the patch conditional, 409 if the
        node changed)."""
        body = orjson.dumps(_annotations_patch(annotations, resource_version))
        obj = await self.request_async(
            "PATCH", _node_path(name), body, "application/merge-patch+json"
        )
        return strip_object(obj, NODES)

    async def request_async(
        self, method: str, path: str, data: bytes = b"", content_type: str = "application/json"
    ) -> dict[str, Any]:
        """A raw JSON request from the event loop, on the connections of
        :class:`scheduler.kube.aio.AsyncPoster` (the Binding's), with the same credentials
        and errors as :meth:`request_json`; in a worker thread when the configuration needs
        what the poster does not do (a proxy)."""
        poster = self._async_poster()
        if poster is None:
            import asyncio

            return await asyncio.to_thread(self._request, method, path, data or None, content_type)
        return await poster.request_json(method, path, data, content_type)

    def api_resources(self, group: str, version: str) -> dict[str, Any] | None:
        """The ``APIResourceList`` of ``group/version``, or None when it is not served."""
        try:
            return self._json(self._custom.get_api_resources, group, version)
        except ApiError as exc:
            if exc.status in (404, 403):
                return None
            raise

    def close(self) -> None:
        """Release the connection pools."""
        if self._poster:
            self._poster.close()
        with contextlib.suppress(Exception):
            self.api_client.close()


def _is_validation_error(exc: BaseException) -> bool:
    """A pydantic argument-validation error of the generated client (a bug, not I/O)."""
    return type(exc).__name__ == "ValidationError"
