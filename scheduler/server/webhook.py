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
annotation ``topoplace.io/rightsize`` with what was applied and why and, when the lookup
answers a :class:`PodSizing`, what share placement reads from it
(``scheduler.core.fractional.tenant_limits``): ``compute_p95`` (the workload's measured
compute p95), ``max_tenants_per_gpu`` and ``gpu_compute_limit`` (its policy's), ratios of one
GPU's SMs where ratios.

The same endpoint answers a ``resource.k8s.io`` ResourceClaim CREATE (DRA consumable
capacity: the size lives in the claim, not in the pod). A claim the resourceclaim controller
creates from a pod's ResourceClaimTemplate names its pod as controller owner (and the pod's
claim entry in the annotation ``resource.kubernetes.io/pod-claim-name``); the lookup finds
that pod's workload. Every device request (``exactly``, or a ``firstAvailable`` alternative)
that states ``capacity.requests.memory`` gets the recommended memory, rounded up to the
device class's ``requestPolicy`` when it is known (:class:`RequestPolicy`: ``validValues``,
or ``validRange`` min / step / max), else to whole MiB; the claim gets the annotation.
Requests without a memory capacity request are left alone (whole devices), and so is a claim
with no pod owner (a claim written by hand: its size is its author's).

Allowed unchanged, with the reason in ``status.message``: a pod outside the right-sized
namespaces, a workload without a recommendation, a pod in no memory-share backend's form
(whole-GPU ``nvidia.com/gpu`` pods, pods with DRA claims: their claims are sized instead),
a recommended mode the backend cannot express (MIG, time-slicing; for a capacity claim also
exclusive), or a size the device's requestPolicy does not allow. A review that cannot be read is answered 400 with a one-line error
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
import re
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from scheduler.core.quantity import parse_quantity_int
from scheduler.core.rightsize import EXCLUSIVE, MEMORY_SHARE, MPS, GiB, MiB, Policy, Recommendation

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

DRA_GROUP = "resource.k8s.io"
DRA_CAPACITY = "dra-capacity"
CAPACITY_MEMORY = "memory"
"""The device capacity a claim's ``capacity.requests`` names for GPU memory."""
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
CLAIM_MODES = frozenset({MEMORY_SHARE, MPS})
"""Recommended modes a capacity request expresses (a share of a device's memory)."""


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """A device capacity's ``requestPolicy`` (``resource.k8s.io/v1`` CapacityRequestPolicy):
    what a claim may ask of a device that allows multiple allocations. The scheduler rounds a
    request up to the next valid amount and refuses one above every valid amount; the
    webhook writes the rounded amount, so the claim states what it will get.

    Attributes:
        values: ``validValues`` (bytes, ascending); empty when a range is given.
        min / step / max: ``validRange`` (bytes); ``step`` and ``max`` may be None.
    """

    values: tuple[int, ...] = ()
    min: int | None = None
    step: int | None = None
    max: int | None = None

    def round_up(self, want: int) -> int | None:
        """The smallest valid amount >= ``want``, or None when none is (above the range's
        max or every valid value)."""
        if self.values:
            return next((v for v in self.values if v >= want), None)
        x = max(want, self.min or 0)
        if self.step and self.min is not None:
            x = self.min + math.ceil((x - self.min) / self.step) * self.step
        if self.max is not None and x > self.max:
            return None
        return x

    def describe(self) -> str:
        """A short form for reasons: ``valid 8Gi, 16Gi`` or ``min 1Gi step 1Gi max 80Gi``."""
        if self.values:
            return "valid " + ", ".join(quantity(v) for v in self.values)
        parts = [
            f"{k} {quantity(v)}"
            for k, v in (("min", self.min), ("step", self.step), ("max", self.max))
            if v is not None
        ]
        return " ".join(parts) or "any"

    @classmethod
    def from_json(cls, data: Any) -> RequestPolicy | None:
        """From a capacity's ``requestPolicy`` object; None when absent or unreadable (then
        nothing is known and the webhook rounds to MiB)."""
        if not isinstance(data, Mapping):
            return None
        try:
            if data.get("validValues"):
                vals = sorted({parse_quantity_int(v) for v in data["validValues"]})
                return cls(values=tuple(vals))
            rng = data.get("validRange")
            if isinstance(rng, Mapping) and rng.get("min") is not None:
                return cls(
                    min=parse_quantity_int(rng["min"]),
                    step=parse_quantity_int(rng["step"]) if rng.get("step") else None,
                    max=parse_quantity_int(rng["max"]) if rng.get("max") else None,
                )
        except (TypeError, ValueError):
            return None
        return None


_DRIVER = re.compile(r"""device\.driver\s*==\s*["']([^"']+)["']""")


def class_drivers(device_class: Mapping[str, Any]) -> set[str]:
    """The drivers a DeviceClass selects (``device.driver == "..."`` in its CEL selectors)."""
    out: set[str] = set()
    for sel in ((device_class.get("spec") or {}).get("selectors")) or ():
        expr = ((sel or {}).get("cel") or {}).get("expression") or ""
        out.update(_DRIVER.findall(str(expr)))
    return out


def capacity_policies(
    classes: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]]
) -> dict[str, RequestPolicy]:
    """Device class name -> the ``memory`` requestPolicy of the shareable devices it selects:
    devices with ``allowMultipleAllocations`` in ResourceSlices of the class's drivers
    (v1 devices, or v1beta1's ``basic``). A class is left out when its devices state no
    policy, or state different ones (nothing single to round to). Pure."""
    by_driver: dict[str, set[RequestPolicy | None]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        driver = str(spec.get("driver") or "")
        for dev in spec.get("devices") or ():
            d = (dev or {}).get("basic") or dev or {}
            if not d.get("allowMultipleAllocations"):
                continue
            cap = (d.get("capacity") or {}).get(CAPACITY_MEMORY)
            if not isinstance(cap, Mapping):
                continue
            by_driver.setdefault(driver, set()).add(
                RequestPolicy.from_json(cap.get("requestPolicy"))
            )
    out: dict[str, RequestPolicy] = {}
    for c in classes:
        name = str((c.get("metadata") or {}).get("name") or "")
        seen: set[RequestPolicy | None] = set()
        for drv in class_drivers(c):
            seen |= by_driver.get(drv, set())
        if len(seen) == 1 and (only := next(iter(seen))) is not None:
            out[name] = only
    return out


def quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity: ``Gi`` or ``Mi`` when whole, else plain bytes."""
    if n and n % GiB == 0:
        return f"{n // GiB}Gi"
    if n and n % MiB == 0:
        return f"{n // MiB}Mi"
    return str(n)


@dataclass(frozen=True, slots=True)
class ClaimSizing:
    """What the lookup answers for a ResourceClaim: the recommendation of the workload of
    the pod the claim was created for, and the known requestPolicies (device class name ->
    :class:`RequestPolicy`)."""

    rec: Recommendation
    policies: Mapping[str, RequestPolicy] = field(default_factory=dict)
    pod: str = ""


@dataclass(frozen=True, slots=True)
class PodSizing:
    """What the lookup answers for a pod: the recommendation of its workload, and what share
    placement reads of the workload besides its size (``scheduler.core.fractional``'s
    ``tenant_limits``), written into the pod's note under these names.

    Attributes:
        rec: the recommendation in force.
        compute_p95: the workload's measured compute p95, a ratio of one GPU's SMs (the
            recommender's compute percentile of the utilisation, before its margin); None
            when no utilisation was measured (placement then counts the pod's compute share).
        max_tenants_per_gpu: its policy's most tenants on one GPU (0: not stated).
        gpu_compute_limit: its policy's limit on one GPU's tenants' p95s together, a ratio
            (0: not stated).
    """

    rec: Recommendation
    compute_p95: float | None = None
    max_tenants_per_gpu: int = 0
    gpu_compute_limit: float = 0.0

    @classmethod
    def of(cls, rec: Recommendation, policy: Policy, compute_p95: float | None) -> PodSizing:
        """``rec`` with ``policy``'s tenancy limits and the measured ``compute_p95``."""
        return cls(rec, compute_p95, policy.max_tenants_per_gpu, policy.gpu_compute_limit)

    def note_fields(self) -> dict[str, Any]:
        """The note's placement keys (those stated): ``compute_p95`` a ratio to 4 decimals,
        ``max_tenants_per_gpu`` an integer, ``gpu_compute_limit`` the policy's ratio."""
        out: dict[str, Any] = {}
        if self.compute_p95 is not None:
            out["compute_p95"] = round(self.compute_p95, 4)
        if self.max_tenants_per_gpu:
            out["max_tenants_per_gpu"] = self.max_tenants_per_gpu
        if self.gpu_compute_limit:
            out["gpu_compute_limit"] = self.gpu_compute_limit
        return out


Lookup = Callable[[Mapping[str, Any], str], "Recommendation | PodSizing | ClaimSizing | None | str"]
"""``(object, namespace) -> recommendation``, or a string: why the object is left alone. The
object is a pod, or a ResourceClaim (``kind: ResourceClaim``): for a pod the answer is a
:class:`PodSizing` (a bare recommendation: no placement limits are written), for a claim a
:class:`ClaimSizing` (a bare recommendation means no requestPolicy is known)."""


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
    pod: Mapping[str, Any], sizing: Recommendation | PodSizing, gpushare_unit_mib: int = 1024
) -> tuple[list[dict[str, Any]], str]:
    """The JSONPatch that writes ``sizing`` into ``pod``, and a one-line summary; an empty
    patch with the reason when the pod is left alone. The note (:data:`ANNOTATION`) states
    the size, mode and reason and, for a :class:`PodSizing`, its
    :meth:`~PodSizing.note_fields` (what share placement reads). Pure: ``pod`` is not
    changed."""
    rec = sizing.rec if isinstance(sizing, PodSizing) else sizing
    placement = sizing.note_fields() if isinstance(sizing, PodSizing) else {}
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
            **placement,
        }
    ).decode()
    if (pod.get("metadata") or {}).get("annotations") is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION: note}})
    else:
        ops.append(
            {"op": "add", "path": f"/metadata/annotations/{_escape(ANNOTATION)}", "value": note}
        )
    return ops, summary


def _claim_targets(claim: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(JSON Pointer of the device request, the request) for every ``exactly`` request and
    ``firstAvailable`` alternative of the claim."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    reqs = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ()
    for i, r in enumerate(reqs):
        if not isinstance(r, Mapping):
            continue
        if isinstance(r.get("exactly"), Mapping):
            out.append((f"/spec/devices/requests/{i}/exactly", r["exactly"]))
        for j, sub in enumerate(r.get("firstAvailable") or ()):
            if isinstance(sub, Mapping):
                out.append((f"/spec/devices/requests/{i}/firstAvailable/{j}", sub))
    return out


def claim_patch(claim: Mapping[str, Any], sizing: ClaimSizing) -> tuple[list[dict[str, Any]], str]:
    """The JSONPatch that writes ``sizing`` into a ResourceClaim's memory capacity requests,
    and a one-line summary; an empty patch with the reason when the claim is left alone.
    Pure: ``claim`` is not changed."""
    rec = sizing.rec
    targets = [
        (path, t)
        for path, t in _claim_targets(claim)
        if CAPACITY_MEMORY in (((t.get("capacity") or {}).get("requests")) or {})
    ]
    if not targets:
        return [], "the claim requests no memory capacity (whole devices)"
    if rec.mode not in CLAIM_MODES:
        return (
            [],
            f"recommended mode {rec.mode} is not a capacity request: the claim is left as written",
        )
    ops: list[dict[str, Any]] = []
    written: dict[str, str] = {}
    notes: list[str] = []
    for path, t in targets:
        cls = str(t.get("deviceClassName") or "")
        pol = sizing.policies.get(cls)
        want = math.ceil(rec.gpu_memory_limit_bytes / MiB) * MiB
        size = pol.round_up(want) if pol is not None else want
        if size is None:
            assert pol is not None
            notes.append(
                f"{cls}: {want / GiB:.1f} GiB is above its requestPolicy ({pol.describe()})"
            )
            continue
        value = quantity(size)
        stated = t["capacity"]["requests"][CAPACITY_MEMORY]
        try:
            same = parse_quantity_int(stated) == size
        except (TypeError, ValueError):
            same = False
        if not same:
            ops.append(
                {
                    "op": "replace",
                    "path": f"{path}/capacity/requests/{CAPACITY_MEMORY}",
                    "value": value,
                }
            )
        written[path.removeprefix("/spec/devices/requests/")] = value
        if pol is not None:
            notes.append(f"{cls}: rounded to its requestPolicy ({pol.describe()})")
    if not written:
        return [], "; ".join(notes)
    shown = ", ".join(f"{k} memory={v}" for k, v in written.items())
    summary = f"{rec.workload}: {shown} ({rec.mode}; {rec.reason})"
    note = orjson.dumps(
        {
            "workload": rec.workload,
            "pod": sizing.pod,
            "gpu_memory_limit_bytes": rec.gpu_memory_limit_bytes,
            "gpu_compute_ratio": rec.gpu_compute_ratio,
            "mode": rec.mode,
            "backend": DRA_CAPACITY,
            "requests": written,
            "reason": "; ".join([rec.reason, *notes]),
        }
    ).decode()
    if (claim.get("metadata") or {}).get("annotations") is None:
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
    kind = (req.get("kind") or {}).get("group"), (req.get("kind") or {}).get("kind")
    obj = req.get("object")
    why: str
    ops: list[dict[str, Any]] = []
    if kind not in (("", "Pod"), (DRA_GROUP, "ResourceClaim")) or req.get("operation") != "CREATE":
        why = "not a pod or ResourceClaim creation"
    elif not isinstance(obj, Mapping):
        why = "request.object is not a " + ("pod" if kind[1] == "Pod" else "ResourceClaim")
    else:
        namespace = str(req.get("namespace") or (obj.get("metadata") or {}).get("namespace") or "")
        if kind[1] == "ResourceClaim" and obj.get("kind") != "ResourceClaim":
            obj = {**obj, "kind": "ResourceClaim"}  # the lookup tells claims by their kind
        found = lookup(obj, namespace)
        if isinstance(found, str) or found is None:
            why = found or "no recommendation"
        elif kind[1] == "ResourceClaim":
            if isinstance(found, ClaimSizing):
                sizing = found
            else:
                sizing = ClaimSizing(found.rec if isinstance(found, PodSizing) else found)
            ops, why = claim_patch(obj, sizing)
        elif isinstance(found, ClaimSizing):
            why = "the lookup answered a claim sizing for a pod"
        else:
            ops, why = resize_patch(obj, found, gpushare_unit_mib)
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
