"""Read GPU usage series from Prometheus into the right-sizer's samples.

One HTTP call per source metric to Prometheus' ``/api/v1/query_range`` (httpx); the matrix
results become :class:`scheduler.core.rightsize.Sample` rows in the replay's units, keyed by
the pod's owner (its workload). Sources, with the label names each exporter uses:

========================================  ============================  ==========================
metric (exporter)                         sample                        labels (namespace/pod/ctr)
========================================  ============================  ==========================
``hami_vgpu_memory_used_bytes`` (HAMi)     ``gpu_memory_used_bytes``     podnamespace/podname/ctrname
``hami_vgpu_memory_limit_bytes``           OOM when used >= limit        podnamespace/podname/ctrname
``hami_container_device_utilization_ratio`` ``gpu_utilization_ratio``    podnamespace/podname/ctrname
``vGPU_device_memory_usage_in_bytes``      (HAMi before 2.9) as above    podnamespace/podname/ctrname
``vGPU_device_memory_limit_in_bytes``      (HAMi before 2.9) as above    podnamespace/podname/ctrname
``Device_utilization_desc_of_container``   percent -> ratio              podnamespace/podname/ctrname
``DCGM_FI_DEV_FB_USED`` (dcgm-exporter)    MiB -> bytes                  namespace/pod/container
``DCGM_FI_DEV_GPU_UTIL``                   percent -> ratio              namespace/pod/container
``vllm:kv_cache_usage_perc`` (vLLM)        ``kv_cache_usage_ratio`` 0..1 namespace/pod/container
``vllm:num_requests_waiting``              ``requests_waiting``          namespace/pod/container
========================================  ============================  ==========================

vLLM's names are also read with ``_`` for ``:`` (what prometheus_client's OpenMetrics
output writes when Prometheus asks for it). dcgm-exporter's labels also come as ``exported_pod`` / ``exported_namespace`` /
``exported_container`` when Prometheus renames them; both are read. When one container is
measured by several sources at the same instant, the first source in :data:`SOURCES` wins
(HAMi's per-container figures over DCGM's per-device ones). A container's GPU memory summed
over its devices is one sample.

The workload is ``namespace/owner``: the owner from ``kube_pod_owner`` (kube-state-metrics)
when Prometheus has it, else from the pod's name (``name-<replicaset hash>-<suffix>`` ->
``name``, StatefulSet / LeaderWorkerSet ``name-<ordinal>`` -> ``name``).
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from scheduler.core.rightsize import (
    KV_USAGE,
    MEMORY,
    OOM_EVENTS,
    REQUESTS_WAITING,
    UTILIZATION,
    Sample,
)

log = logging.getLogger(__name__)

HAMI_LABELS = ("podnamespace", "podname", "ctrname")
KUBE_LABELS = ("namespace", "pod", "container")


@dataclass(frozen=True, slots=True)
class Source:
    """One Prometheus metric and how it maps to a sample: ``kind`` is a replay metric, or
    ``limit`` (a memory limit, read to detect OOMs); ``scale`` multiplies the value."""

    name: str
    kind: str
    scale: float
    labels: tuple[str, str, str]


SOURCES: tuple[Source, ...] = (
    Source("hami_vgpu_memory_used_bytes", MEMORY, 1.0, HAMI_LABELS),
    Source("vGPU_device_memory_usage_in_bytes", MEMORY, 1.0, HAMI_LABELS),
    Source("DCGM_FI_DEV_FB_USED", MEMORY, float(1 << 20), KUBE_LABELS),
    Source("hami_vgpu_memory_limit_bytes", "limit", 1.0, HAMI_LABELS),
    Source("vGPU_device_memory_limit_in_bytes", "limit", 1.0, HAMI_LABELS),
    Source("hami_container_device_utilization_ratio", UTILIZATION, 1.0, HAMI_LABELS),
    Source("Device_utilization_desc_of_container", UTILIZATION, 0.01, HAMI_LABELS),
    Source("DCGM_FI_DEV_GPU_UTIL", UTILIZATION, 0.01, KUBE_LABELS),
    Source("vllm:kv_cache_usage_perc", KV_USAGE, 1.0, KUBE_LABELS),
    Source("vllm_kv_cache_usage_perc", KV_USAGE, 1.0, KUBE_LABELS),
    Source("vllm:num_requests_waiting", REQUESTS_WAITING, 1.0, KUBE_LABELS),
    Source("vllm_num_requests_waiting", REQUESTS_WAITING, 1.0, KUBE_LABELS),
)
"""Read in this order; for one container, metric and instant the first source wins."""

_RS_POD = re.compile(
    r"^(?P<owner>.+)-[bcdfghjklmnpqrstvwxz2456789]{6,10}-[bcdfghjklmnpqrstvwxz2456789]{5}$"
)
_ORDINAL_POD = re.compile(r"^(?P<owner>.+?)-\d+(-\d+)?$")


class PrometheusError(RuntimeError):
    """Prometheus answered with an error or could not be reached (I/O, not bad input)."""


def owner_from_pod_name(pod: str) -> str:
    """The owning workload's name guessed from a pod name: a Deployment's pod
    ``name-<hash>-<suffix>`` gives ``name``; a StatefulSet's or LeaderWorkerSet's
    ``name-<n>`` (or ``name-<n>-<m>``) gives ``name``; anything else is its own owner."""
    m = _RS_POD.match(pod) or _ORDINAL_POD.match(pod)
    return m.group("owner") if m else pod


def _label(metric: Mapping[str, str], name: str) -> str:
    return metric.get(name) or metric.get("exported_" + name) or ""


class PrometheusReader:
    """Series from one Prometheus server (``base_url``, e.g. ``http://127.0.0.1:9090``).

    Thread-compatible (one httpx client); :meth:`close` releases it.
    """

    def __init__(
        self, base_url: str, *, timeout_s: float = 10.0, client: httpx.Client | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.client = client or httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()

    def query_range(
        self, query: str, start: float, end: float, step: float
    ) -> list[dict[str, object]]:
        """The ``result`` list of a ``query_range`` call (a matrix).

        Raises:
            PrometheusError: transport error, non-2xx status or ``status != success``.
        """
        try:
            r = self.client.get(
                f"{self.base_url}/api/v1/query_range",
                params={
                    "query": query,
                    "start": f"{start:.3f}",
                    "end": f"{end:.3f}",
                    "step": f"{step:g}",
                },
            )
        except httpx.HTTPError as exc:
            raise PrometheusError(f"query_range {query!r}: {exc}") from exc
        try:
            body = r.json()
        except ValueError:
            raise PrometheusError(
                f"query_range {query!r}: HTTP {r.status_code}, not JSON"
            ) from None
        if r.status_code >= 300 or body.get("status") != "success":
            raise PrometheusError(
                f"query_range {query!r}: HTTP {r.status_code}: {body.get('error', body)}"
            )
        data = body.get("data") or {}
        return list(data.get("result") or [])

    def owners(self, start: float, end: float, step: float) -> dict[tuple[str, str], str]:
        """``(namespace, pod) -> owner name`` from kube-state-metrics' ``kube_pod_owner`` (a
        ReplicaSet owner is reported as its name minus the hash: its Deployment)."""
        out: dict[tuple[str, str], str] = {}
        for series in self.query_range("kube_pod_owner", start, end, step):
            m = series.get("metric") or {}
            assert isinstance(m, dict)
            name, kind = m.get("owner_name", ""), m.get("owner_kind", "")
            if not name or name == "<none>":
                continue
            if kind == "ReplicaSet":
                name = name.rsplit("-", 1)[0] if re.search(r"-[a-z0-9]{6,10}$", name) else name
            out[(m.get("namespace", ""), m.get("pod", ""))] = name
        return out

    def read(
        self,
        start: float,
        end: float,
        step: float = 60.0,
        *,
        sources: tuple[Source, ...] = SOURCES,
        owner_of: Callable[[str, str], str] | None = None,
    ) -> list[Sample]:
        """Every source's series between ``start`` and ``end`` (seconds) at ``step``, as
        samples sorted by time; HAMi limits become ``oom_events`` where the used memory
        reached them. ``owner_of(namespace, pod)`` names the workload's owner (default:
        ``kube_pod_owner`` if present, else :func:`owner_from_pod_name`).

        Raises:
            PrometheusError: Prometheus failed.
        """
        if owner_of is None:
            known = self.owners(start, end, step)

            def owner_of(ns: str, pod: str) -> str:
                return known.get((ns, pod)) or owner_from_pod_name(pod)

        # (ns, pod, ctr, kind, t) -> value, first source wins; per source, devices summed
        values: dict[tuple[str, str, str, str, float], float] = {}
        for src in sources:
            mine: dict[tuple[str, str, str, str, float], float] = defaultdict(float)
            for series in self.query_range(src.name, start, end, step):
                m = series.get("metric") or {}
                assert isinstance(m, dict)
                ns, pod, ctr = (_label(m, k) for k in src.labels)
                if not pod:
                    continue
                for t, v in series.get("values") or []:  # type: ignore[union-attr]
                    mine[(ns, pod, ctr, src.kind, float(t))] += float(v) * src.scale
            for k, v in mine.items():
                values.setdefault(k, v)
        out: list[Sample] = []
        for (ns, pod, ctr, kind, t), v in values.items():
            wl = f"{ns}/{owner_of(ns, pod)}" if ns else owner_of(ns, pod)
            if kind == "limit":
                used = values.get((ns, pod, ctr, MEMORY, t))
                if used is not None and v > 0 and used >= v:
                    out.append(Sample(t, wl, pod, ctr, OOM_EVENTS, 1.0))
                continue
            if kind in (UTILIZATION, KV_USAGE):
                v = min(1.0, max(0.0, v))
            out.append(Sample(t, wl, pod, ctr, kind, v))
        out.sort(key=lambda s: (s.timestamp, s.workload, s.pod, s.container, s.metric))
        log.debug("read %d samples from %s", len(out), self.base_url)
        return out
