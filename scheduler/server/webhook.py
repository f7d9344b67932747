"""The right-sizer's mutating admission webhook (mode ``initial``; ``docs/rightsizing.md``).

``POST /mutate/rightsize`` answers an ``admission.k8s.io/v1`` ``AdmissionReview`` for a pod
CREATE with a JSONPatch that writes its workload's recommended size into the pod in the form
of the sharing backend the pod already uses:

* HAMi (a container limit ``nvidia.com/gpumem``, ``nvidia.com/gpumem-percentage`` or
  ``nvidia.com/gpucores``): ``nvidia.com/gpumem`` in MiB and ``nvidia.com/gpucores`` in
  percent of the SMs (``gpumem-percentage`` removed: HAMi reads one of the two); an
  ``exclusive`` recommendation removes the memory limit and sets 100 % of the cores;
* gpushare (``aliyun.com/gpu-mem``): the memory in the device plugin's unit (GiB by default),
  rounded up.

Requests of those resources, where the container states them, are set to the same values
(Kubernetes requires extended-resource requests to equal limits). The pod also gets the
annotation ``topoplace.io/rightsize`` with what was applied and why.

Allowed unchanged, with the reason in ``status.message``: a pod outside the right-sized
namespaces, a workload without a recommendation, a pod in no memory-share backend's form
(whole-GPU ``nvidia.com/gpu`` pods, DRA claims: a DRA capacity request lives in the
ResourceClaimTemplate, not in the pod), or a recommended mode the backend cannot express
(MIG, time-slicing). A review that cannot be read is answered 400 with a one-line error
(never a 500); with ``failurePolicy: Ignore`` the API server creates the pod unchanged, as it
does when the webhook is down or slower than ``timeoutSeconds``.

:class:`WebhookServer` serves the ASGI app over TLS on a listener of its own, on a thread of
its own (``topoplace serve --webhook-port``), so the extender's port, its transport and
client-certificate rules stay as they are.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from scheduler.core.rightsize import EXCLUSIVE, MEMORY_SHARE, MPS, MiB, Recommendation

log = logging.getLogger(__name__)

PATH = "/mutate/rightsize"
ANNOTATION = "topoplace.io/rightsize"
HAMI_MEM = "nvidia.com/gpumem"
HAMI_MEM_PCT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"
GPUSHARE_MEM = "aliyun.com/gpu-mem"
HAMI = "hami"
GPUSHARE = "gpushare"
SHARE_MODES = frozenset({MEMORY_SHARE, MPS, EXCLUSIVE})
"""Recommended modes a memory-share backend expresses (MPS as a HAMi core cap)."""
MAX_BODY = 3 << 20
"""Largest review read (the API server's own request limit is 3 MiB)."""

Lookup = Callable[[Mapping[str, Any], str], "Recommendation | None | str"]
"""``(pod, namespace) -> recommendation``, or a string: why the pod is left alone."""


class ReviewError(ValueError):
    """The body is not an AdmissionReview topoplace can answer (400, one line)."""


def _escape(key: str) -> str:
    """A JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _quantity_mib(value: object) -> int | None:
    """An integer resource value (``"4096"``, ``4096``) or None."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def pod_backend(pod: Mapping[str, Any]) -> str | None:
    """``hami`` or ``gpushare`` when a container of ``pod`` asks for a memory share in that
    backend's form, else None."""
    for c in (pod.get("spec") or {}).get("containers") or ():
        limits = ((c or {}).get("resources") or {}).get("limits") or {}
        if HAMI_MEM in limits or HAMI_MEM_PCT in limits or HAMI_CORES in limits:
            return HAMI
        if GPUSHARE_MEM in limits:
            return GPUSHARE
    return None


def pod_memory_bytes(pod: Mapping[str, Any], gpushare_unit_mib: int = 1024) -> int | None:
    """The GPU memory the pod's first share container is limited to, in bytes (HAMi
    ``nvidia.com/gpumem`` MiB, gpushare units); None when not stated that way."""
    for c in (pod.get("spec") or {}).get("containers") or ():
        limits = ((c or {}).get("resources") or {}).get("limits") or {}
        if HAMI_MEM in limits:
            v = _quantity_mib(limits[HAMI_MEM])
            return None if v is None else v * MiB
        if GPUSHARE_MEM in limits:
            v = _quantity_mib(limits[GPUSHARE_MEM])
            return None if v is None else v * gpushare_unit_mib * MiB
    return None


def resize_values(
    backend: str, rec: Recommendation, gpushare_unit_mib: int = 1024
) -> dict[str, str | None]:
    """The resource values ``rec`` becomes in ``backend``'s form (None: remove the key)."""
    if backend == HAMI:
        if rec.mode == EXCLUSIVE:
            return {HAMI_MEM: None, HAMI_MEM_PCT: None, HAMI_CORES: "100"}
        cores = max(1, min(100, round(rec.gpu_compute_ratio * 100)))
        return {
            HAMI_MEM: str(math.ceil(rec.gpu_memory_limit_bytes / MiB)),
            HAMI_MEM_PCT: None,
            HAMI_CORES: str(cores),
        }
    unit = gpushare_unit_mib * MiB
    return {GPUSHARE_MEM: str(max(1, math.ceil(rec.gpu_memory_limit_bytes / unit)))}


def resize_patch(
    pod: Mapping[str, Any], rec: Recommendation, gpushare_unit_mib: int = 1024
) -> tuple[list[dict[str, Any]], str]:
    """The JSONPatch that writes ``rec`` into ``pod``, and a one-line summary; an empty patch
    with the reason when the pod is left alone. Pure: ``pod`` is not changed."""
    backend = pod_backend(pod)
    if backend is None:
        return [], "the pod asks for no HAMi or gpushare memory share"
    if rec.mode not in SHARE_MODES:
        return [], f"recommended mode {rec.mode} is not expressible in {backend}'s form"
    values = resize_values(backend, rec, gpushare_unit_mib)
    ops: list[dict[str, Any]] = []
    for i, c in enumerate((pod.get("spec") or {}).get("containers") or ()):
        res = (c or {}).get("resources") or {}
        limits = res.get("limits") or {}
        if pod_backend({"spec": {"containers": [c]}}) != backend:
            continue
        for section, stated in (("limits", limits), ("requests", res.get("requests"))):
            if section == "requests" and not any(k in (stated or {}) for k in values):
                continue  # requests default to the limits
            base = f"/spec/containers/{i}/resources/{section}"
            for key, value in values.items():
                path = f"{base}/{_escape(key)}"
                if value is None:
                    if key in (stated or {}):
                        ops.append({"op": "remove", "path": path})
                elif (stated or {}).get(key) != value:
                    ops.append({"op": "add", "path": path, "value": value})
    shown = ", ".join(f"{k}={v}" for k, v in values.items() if v is not None)
    summary = f"{rec.workload}: {shown} ({rec.mode}; {rec.reason})"
    note = orjson.dumps(
        {
            "workload": rec.workload,
            "gpu_memory_limit_bytes": rec.gpu_memory_limit_bytes,
            "gpu_compute_ratio": rec.gpu_compute_ratio,
            "mode": rec.mode,
            "backend": backend,
            "reason": rec.reason,
        }
    ).decode()
    if (pod.get("metadata") or {}).get("annotations") is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION: note}})
    else:
        ops.append(
            {"op": "add", "path": f"/metadata/annotations/{_escape(ANNOTATION)}", "value": note}
        )
    return ops, summary


def review_response(review: Any, lookup: Lookup, gpushare_unit_mib: int = 1024) -> dict[str, Any]:
    """The AdmissionReview answering ``review`` (a decoded JSON value).

    Raises:
        ReviewError: not an ``admission.k8s.io/v1`` AdmissionReview with a request uid.
    """
    if not isinstance(review, Mapping):
        raise ReviewError("expected an AdmissionReview object")
    if review.get("apiVersion") != "admission.k8s.io/v1" or review.get("kind") != "AdmissionReview":
        raise ReviewError(
            f"expected apiVersion admission.k8s.io/v1, kind AdmissionReview; got "
            f"{review.get('apiVersion')!r}, {review.get('kind')!r}"
        )
    req = review.get("request")
    if not isinstance(req, Mapping) or not isinstance(req.get("uid"), str) or not req["uid"]:
        raise ReviewError("AdmissionReview.request.uid is missing")
    answer: dict[str, Any] = {"uid": req["uid"], "allowed": True}
    out = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}
    kind = req.get("kind") or {}
    pod = req.get("object")
    why: str
    if (kind.get("group"), kind.get("kind")) != ("", "Pod") or req.get("operation") != "CREATE":
        why = "not a pod creation"
    elif not isinstance(pod, Mapping):
        why = "request.object is not a pod"
    else:
        namespace = str(req.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "")
        found = lookup(pod, namespace)
        if isinstance(found, str) or found is None:
            why = found or "no recommendation"
        else:
            ops, why = resize_patch(pod, found, gpushare_unit_mib)
            if ops:
                answer["patchType"] = "JSONPatch"
                answer["patch"] = base64.b64encode(orjson.dumps(ops)).decode()
    answer["status"] = {"code": 200, "message": why}
    return out


class WebhookApp:
    """The ASGI app: ``POST /mutate/rightsize`` and ``GET /healthz``; 404 elsewhere.

    Args:
        lookup: the right-sizer's recommendation for a pod (see :data:`Lookup`).
        gpushare_unit_mib: the gpushare device plugin's memory unit.
    """

    def __init__(self, lookup: Lookup, gpushare_unit_mib: int = 1024) -> None:
        self.lookup = lookup
        self.gpushare_unit_mib = gpushare_unit_mib
        self.answered = 0
        self.patched = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if path == "/healthz" and method == "GET":
            await _send(send, 200, b'{"status":"ok"}')
            return
        if path != PATH:
            await _send(send, 404, _error(f"not found: {path}"))
            return
        if method != "POST":
            await _send(send, 405, _error("POST an AdmissionReview"))
            return
        body = bytearray()
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if len(body) > MAX_BODY:
                await _send(send, 413, _error(f"review larger than {MAX_BODY} bytes"))
                return
            if not msg.get("more_body"):
                break
        try:
            review = orjson.loads(bytes(body))
        except orjson.JSONDecodeError as exc:
            await _send(send, 400, _error(f"not JSON: {exc}"))
            return
        try:
            out = review_response(review, self.lookup, self.gpushare_unit_mib)
        except ReviewError as exc:
            await _send(send, 400, _error(str(exc)))
            return
        except Exception as exc:  # a bug: still an answer the API server reads (Ignore)
            log.exception("right-size webhook failed")
            await _send(send, 400, _error(f"review not processed: {type(exc).__name__}: {exc}"))
            return
        self.answered += 1
        if "patch" in out["response"]:
            self.patched += 1
        log.info(
            "webhook %s: %s",
            "patched" if "patch" in out["response"] else "allowed",
            out["response"]["status"]["message"],
        )
        await _send(send, 200, orjson.dumps(out))


def _error(message: str) -> bytes:
    return orjson.dumps({"error": message})


async def _send(send: Any, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class WebhookServer:
    """Serves a :class:`WebhookApp` over HTTPS on ``sock`` from a daemon thread with its own
    event loop; :meth:`stop` ends it (idempotent). The process's signals stay with the main
    server."""

    def __init__(self, app: WebhookApp, sock: socket.socket, ssl: Mapping[str, Any]) -> None:
        import uvicorn

        class _Quiet(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Any:  # uvicorn >= 0.29
                yield

            def install_signal_handlers(self) -> None:  # older uvicorn
                pass

        host, port = sock.getsockname()[:2]
        self.sock = sock
        self.server = _Quiet(
            uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off", **ssl)
        )
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start serving (once)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])),
                name="rightsize-webhook",
                daemon=True,
            )
            self._thread.start()

    @property
    def started(self) -> bool:
        """True once the listener accepts connections."""
        return bool(self.server.started)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and close the socket."""
        self.server.should_exit = True
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout)
        self.sock.close()
