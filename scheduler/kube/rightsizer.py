"""The right-sizer inside the running extender (policy.yaml ``rightsize:``;
``docs/rightsizing.md``).

Every ``interval_seconds`` (a :class:`~scheduler.kube.loop.Periodic`) it reads the GPU usage
series from Prometheus (:class:`~scheduler.kube.prometheus.PrometheusReader`), feeds them to
one long-lived :class:`~scheduler.core.rightsize.Recommender` (the first read covers
``lookback_seconds`` and is replayed, later reads only what is new) and decides each
workload's recommendation at the current time. Then, by mode:

The first read is replayed to learn (the VPA-style histories, peaks and OOMs) and the
recommendation in force then is each workload's target at that time, with the whole change
budget (nothing of the replayed decisions was applied). Later rounds feed the recommender
only samples newer than the last one and let its hysteresis decide.

* **off** (and every mode): publishes the recommendations: :meth:`RightSizer.view`
  (``GET /v1/inspect/rightsize``), :meth:`RightSizer.for_pod` (the admission webhook and
  ``topoplace explain``), the gauges ``topoplace_rightsize_memory_bytes`` and
  ``topoplace_rightsize_compute_ratio`` (``namespace, workload, container``) and
  ``topoplace_rightsize_mode`` (``namespace, workload, mode``: 1 for the mode in force), and,
  with ``annotate``, the annotation ``topoplace.io/rightsize`` on the workload (the pod's
  controller, a ReplicaSet's Deployment) when the recommendation changes (a failed write is
  tried again next round);
* **initial**: the webhook (``scheduler/server/webhook.py``) writes them into new pods,
  with what share placement reads in the pod's note: the workload's measured compute p95
  and its policy's ``max_tenants_per_gpu`` and ``gpu_compute_limit``
  (:class:`~scheduler.server.webhook.PodSizing`);
* **recreate**: at most one pod every ``min_eviction_interval_seconds`` is evicted through
  the Eviction API (the remediator's call, with the pod's UID as a precondition), and only a
  pod that: belongs to a workload with at least ``min_replicas`` live pods (counted from the
  pods, not the controller's spec), none of them terminating and none evicted by the
  right-sizer still being replaced; is at least ``min_age_seconds`` old; and states a GPU
  memory share (HAMi or gpushare) differing by more than ``min_change`` from what the
  webhook would write for it (the recommendation in the backend's rounding; no cap for an
  exclusive HAMi GPU). A recommendation the backend cannot express (MIG, time-slicing)
  recreates nothing. A 429 (a PodDisruptionBudget says no) is waited out: the next try comes a
  whole interval later. The workload's controller recreates the pod; the webhook sizes it.

Writes (annotations, evictions) happen only while ``may_act()`` (ready and, with HA,
leading). A failed Prometheus read keeps the recommendations in force and is counted
(``topoplace_rightsize_reads{outcome}``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import yaml
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from scheduler.core.params import RightsizeParams
from scheduler.core.rightsize import (
    MiB,
    PolicySet,
    Recommendation,
    Recommender,
    RightsizeError,
    policies_from_dict,
    replay,
)
from scheduler.kube.apitypes import ApiError, ApiUnavailable
from scheduler.kube.loop import Periodic
from scheduler.kube.prometheus import PrometheusError, PrometheusReader, owner_from_pod_name
from scheduler.server.webhook import (
    ANNOTATION,
    HAMI_MEM,
    SHARE_MODES,
    ClaimSizing,
    PodSizing,
    RequestPolicy,
    capacity_policies,
    pod_backend,
    pod_memory_bytes,
    resize_values,
)

log = logging.getLogger(__name__)

_RS_HASH = re.compile(r"^(?P<owner>.+)-[a-z0-9]{6,10}$")
RECENT = 50
"""Actions :meth:`RightSizer.view` shows."""
DEVICE_POLICY_EVERY_S = 10.0
"""Least time between two reads of DeviceClasses and ResourceSlices (the requestPolicies the
webhook rounds capacity claims to)."""


def load_rightsize_policies(settings: RightsizeParams) -> PolicySet:
    """The policies of ``settings``: its file, its inline mapping, or the defaults.

    Raises:
        ValueError: unreadable or malformed policies (the message names the file).
    """
    if settings.policies is not None:
        return policies_from_dict(settings.policies)
    if settings.policies_file is None:
        return PolicySet()
    path = Path(settings.policies_file)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return policies_from_dict(data)
    except OSError as exc:
        raise ValueError(f"rightsize.policies_file {path}: cannot read: {exc.strerror}") from None
    except (yaml.YAMLError, RightsizeError) as exc:
        raise ValueError(f"rightsize.policies_file {path}: {exc}") from None


def controller_of(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's controller ownerReference, or None."""
    for r in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(r, Mapping) and r.get("controller"):
            return r
    return None


def workload_of(pod: Mapping[str, Any], namespace: str = "") -> str:
    """The workload (``namespace/name``) a pod belongs to, named as the Prometheus reader
    names it: a ReplicaSet's pods are its Deployment's (the name minus the hash), another
    controller's pods its own; without a controller, from the pod's name (or
    ``generateName``) as :func:`~scheduler.kube.prometheus.owner_from_pod_name` does."""
    meta = pod.get("metadata") or {}
    ns = namespace or str(meta.get("namespace") or "")
    ref = controller_of(pod)
    if ref is not None:
        name = str(ref.get("name") or "")
        if ref.get("kind") == "ReplicaSet" and (m := _RS_HASH.match(name)):
            name = m.group("owner")
    else:
        name = str(meta.get("name") or "")
        if not name:
            name = str(meta.get("generateName") or "").rstrip("-")
        name = owner_from_pod_name(name)
    return f"{ns}/{name}" if ns else name


def _created(pod: Mapping[str, Any]) -> float | None:
    ts = (pod.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class RightSizer:
    """The periodic right-sizer (see the module docstring). Thread-safe: the loop thread
    writes, HTTP handlers read :meth:`view` and :meth:`for_pod` under one lock.

    Args:
        api: the Kubernetes client (``request_json``, ``evict_pod``); None: publish only.
        settings: policy.yaml's ``rightsize:``.
        policies: the right-sizer's policies.
        reader: the Prometheus reader (default: one on ``settings.prometheus_url``).
        may_act: True while this replica may write.
        wall: the clock (seconds since the epoch), injected for tests.
        gpushare_unit_mib: the gpushare device plugin's memory unit (what the webhook writes).
    """

    def __init__(
        self,
        api: Any,
        settings: RightsizeParams,
        policies: PolicySet | None = None,
        reader: PrometheusReader | None = None,
        may_act: Callable[[], bool] = lambda: True,
        wall: Callable[[], float] = time.time,
        gpushare_unit_mib: int = 1024,
    ) -> None:
        self.api = api
        self.gpushare_unit_mib = gpushare_unit_mib
        self.settings = settings
        self.policies = policies if policies is not None else load_rightsize_policies(settings)
        self.reader = reader or PrometheusReader(settings.prometheus_url)
        self.may_act = may_act
        self.wall = wall
        self.lock = threading.Lock()
        self.recommender: Recommender | None = None
        self.last_t: float | None = None
        self.current: dict[str, Recommendation] = {}
        self.compute_p95: dict[str, float] = {}
        """workload -> its measured compute p95 at the last round (absent: not measured)."""
        self.containers: dict[str, set[str]] = {}
        self.reads: dict[str, int] = {"ok": 0, "error": 0}
        self.evictions: dict[str, int] = {}
        self.last_error = ""
        self.annotated: dict[str, tuple[int, float, str]] = {}
        """workload -> the size last written on it (or found nothing to write on)."""
        self.recent: list[dict[str, Any]] = []
        self.last_eviction = float("-inf")
        self.awaiting: dict[str, tuple[str, int]] = {}
        """workload -> (UID of the pod the right-sizer evicted, live pods before it)."""
        self.capacity_policies: dict[str, RequestPolicy] = {}
        """device class name -> the memory requestPolicy of its shareable devices."""
        self.policies_read_at = float("-inf")
        self.loop = Periodic(
            "rightsize", self.tick, lambda: self.settings.interval_seconds, "right-sizing"
        )

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start the loop; the first tick runs at once."""
        self.loop.start()
        self.loop.poke()

    def stop(self) -> None:
        """Stop the loop and close the Prometheus client."""
        self.loop.stop()
        self.reader.close()

    # ---- what others read ----------------------------------------------------------

    def in_scope(self, namespace: str) -> bool:
        """Whether pods of ``namespace`` are right-sized."""
        return not self.settings.namespaces or namespace in self.settings.namespaces

    def for_workload(self, workload: str) -> Recommendation | None:
        """The recommendation in force for ``workload`` (``namespace/name``), or None."""
        with self.lock:
            return self.current.get(workload)

    def sizing_of(self, workload: str) -> PodSizing | None:
        """The recommendation in force for ``workload`` with what share placement reads of
        it (the measured compute p95 at the last round, the policy's tenancy limits), or
        None."""
        with self.lock:
            rec = self.current.get(workload)
            p95 = self.compute_p95.get(workload)
        if rec is None:
            return None
        return PodSizing.of(rec, self.policies.for_workload(workload), p95)

    def for_pod(self, pod: Mapping[str, Any], namespace: str = "") -> PodSizing | ClaimSizing | str:
        """The sizing of a (new) pod (:meth:`sizing_of` its workload), or why there is none (a
        string). For a ResourceClaim (``kind: ResourceClaim``, as the webhook passes it) the
        answer of :meth:`for_claim`."""
        if pod.get("kind") == "ResourceClaim":
            return self.for_claim(pod, namespace)
        ns = namespace or str((pod.get("metadata") or {}).get("namespace") or "")
        if not self.in_scope(ns):
            return f"namespace {ns!r} is not right-sized"
        wl = workload_of(pod, ns)
        sizing = self.sizing_of(wl)
        return sizing if sizing is not None else f"no recommendation for workload {wl}"

    def for_claim(self, claim: Mapping[str, Any], namespace: str = "") -> ClaimSizing | str:
        """The sizing of a (new) ResourceClaim created from a pod's template, or why there is
        none. The pod is the claim's controller owner (``kind: Pod``; the resourceclaim
        controller also writes ``resource.kubernetes.io/pod-claim-name``); it is read from
        the API to find its workload (a ReplicaSet's Deployment, ...); when it cannot be read
        (no API, an error, another UID) the workload comes from the pod's name, as the
        Prometheus reader names it. A claim with no pod owner is left to its author."""
        meta = claim.get("metadata") or {}
        ns = namespace or str(meta.get("namespace") or "")
        if not self.in_scope(ns):
            return f"namespace {ns!r} is not right-sized"
        ref = controller_of(claim)
        if ref is None or ref.get("kind") != "Pod" or not ref.get("name"):
            return "the claim was not created for a pod (no pod owner): its size is its author's"
        name, uid = str(ref["name"]), str(ref.get("uid") or "")
        pod: Mapping[str, Any] = {"metadata": {"name": name, "namespace": ns}}
        if self.api is not None:
            try:
                got = self.api.request_json(
                    "GET", f"/api/v1/namespaces/{quote(ns)}/pods/{quote(name)}"
                )
                if not uid or (got.get("metadata") or {}).get("uid") == uid:
                    pod = got
            except (ApiError, ApiUnavailable) as exc:
                log.debug("right-size claim: pod %s/%s not read: %s", ns, name, exc)
        wl = workload_of(pod, ns)
        rec = self.for_workload(wl)
        if rec is None:
            return f"no recommendation for workload {wl} (pod {name})"
        with self.lock:
            policies = dict(self.capacity_policies)
        return ClaimSizing(rec, policies, f"{ns}/{name}")

    def read_device_policies(self, now: float) -> None:
        """Read DeviceClasses and ResourceSlices (``resource.k8s.io/v1``) and keep each
        class's memory requestPolicy (:func:`~scheduler.server.webhook.capacity_policies`), at
        most every :data:`DEVICE_POLICY_EVERY_S`; a failed read keeps what is known (a
        cluster without v1 DRA has none: the webhook rounds to MiB)."""
        if self.api is None or now - self.policies_read_at < DEVICE_POLICY_EVERY_S:
            return
        self.policies_read_at = now
        try:
            classes = self.api.request_json("GET", "/apis/resource.k8s.io/v1/deviceclasses")
            slices = self.api.request_json("GET", "/apis/resource.k8s.io/v1/resourceslices")
        except (ApiError, ApiUnavailable) as exc:
            log.debug("right-size: device classes not read: %s", exc)
            return
        found = capacity_policies(classes.get("items") or (), slices.get("items") or ())
        with self.lock:
            self.capacity_policies = found

    def view(self) -> dict[str, Any]:
        """What ``GET /v1/inspect/rightsize`` shows."""
        with self.lock:
            return {
                "mode": self.settings.mode,
                "prometheus": self.settings.prometheus_url,
                "interval_seconds": self.settings.interval_seconds,
                "namespaces": list(self.settings.namespaces),
                "last_sample": self.last_t,
                "reads": dict(self.reads),
                "last_error": self.last_error,
                "evictions": dict(self.evictions),
                "workloads": [
                    _rec_json(
                        PodSizing.of(r, self.policies.for_workload(wl), self.compute_p95.get(wl)),
                        sorted(self.containers.get(wl, ())),
                    )
                    for wl, r in sorted(self.current.items())
                ],
                "recent": list(self.recent),
            }

    def collect(self) -> Iterator[Any]:
        """The right-sizer's metrics (a prometheus_client collector)."""
        mem = GaugeMetricFamily(
            "topoplace_rightsize_memory_bytes",
            "Recommended GPU memory limit per container of a workload",
            labels=["namespace", "workload", "container"],
        )
        cpu = GaugeMetricFamily(
            "topoplace_rightsize_compute_ratio",
            "Recommended share of a GPU's SMs per container of a workload",
            labels=["namespace", "workload", "container"],
        )
        mode = GaugeMetricFamily(
            "topoplace_rightsize_mode",
            "1 for the sharing mode recommended for a workload",
            labels=["namespace", "workload", "mode"],
        )
        reads = CounterMetricFamily(
            "topoplace_rightsize_reads", "Prometheus reads by outcome", labels=["outcome"]
        )
        ev = CounterMetricFamily(
            "topoplace_rightsize_evictions",
            "Recreate-mode evictions by outcome",
            labels=["outcome"],
        )
        with self.lock:
            for wl, r in sorted(self.current.items()):
                ns, _, name = wl.rpartition("/")
                for ctr in sorted(self.containers.get(wl, ())) or [""]:
                    mem.add_metric([ns, name, ctr], r.gpu_memory_limit_bytes)
                    cpu.add_metric([ns, name, ctr], r.gpu_compute_ratio)
                mode.add_metric([ns, name, r.mode], 1)
            for k, v in sorted(self.reads.items()):
                reads.add_metric([k], v)
            for k, v in sorted(self.evictions.items()):
                ev.add_metric([k], v)
        yield from (mem, cpu, mode, reads, ev)

    # ---- the loop ------------------------------------------------------------------

    def tick(self) -> None:
        """One round: read, decide, publish; then annotate and recreate where allowed."""
        now = self.wall()
        self.refresh(now)
        self.read_device_policies(now)
        if not self.may_act() or self.api is None:
            return
        if self.settings.annotate:
            with self.lock:
                due = [r for wl, r in self.current.items() if self.annotated.get(wl) != _size(r)]
            if due:
                self.annotate(due)
        if self.settings.mode == "recreate":
            self.recreate(now)

    def refresh(self, now: float) -> list[Recommendation]:
        """Read what is new from Prometheus, feed it and decide every workload at ``now``;
        returns the recommendations that changed (all of them on the first round)."""
        s = self.settings
        start = now - s.lookback_seconds if self.last_t is None else self.last_t + s.step_seconds
        if start > now:
            return []
        try:
            samples = self.reader.read(start, now, s.step_seconds)
        except PrometheusError as exc:
            with self.lock:
                self.reads["error"] += 1
                self.last_error = str(exc)[:300]
            log.warning("right-sizer: %s", exc)
            return []
        if self.recommender is None:
            # Learn from the lookback; none of its decisions were applied, so the first
            # recommendation is the target now, with the whole day's change budget.
            _, self.recommender = replay(samples, self.policies)
            self.recommender.start_at(now)
        else:
            for smp in samples:
                if self.last_t is None or smp.timestamp > self.last_t:
                    self.recommender.observe(smp)
        rec = self.recommender
        if samples:
            self.last_t = max(self.last_t or float("-inf"), samples[-1].timestamp)
        changed: list[Recommendation] = []
        fresh: dict[str, Recommendation] = {}
        p95s: dict[str, float] = {}
        containers: dict[str, set[str]] = {}
        for wl in sorted(rec.states):
            ns = wl.rpartition("/")[0]
            if not self.in_scope(ns):
                continue
            rec.decide(wl, now)
            cur = rec.current(wl)
            if cur is None:
                continue
            fresh[wl] = cur
            st = rec.states[wl]
            if st.util_n:  # the percentile the recommender's compute share is sized from
                p95s[wl] = st.util.percentile(rec.params.compute_percentile)
            containers[wl] = {c for _, c in st.pods}
        with self.lock:
            for wl, cur in fresh.items():
                old = self.current.get(wl)
                if old is None or _size(old) != _size(cur):
                    changed.append(cur)
            self.current = fresh
            self.compute_p95 = p95s
            self.containers = containers
            self.reads["ok"] += 1
            self.last_error = ""
        for r in changed:
            log.info(
                "right-sizer: %s -> %d MiB, compute %.2f, %s (%s)",
                r.workload,
                r.gpu_memory_limit_bytes // MiB,
                r.gpu_compute_ratio,
                r.mode,
                r.reason,
            )
        return changed

    # ---- writes --------------------------------------------------------------------

    def _pods(self, namespace: str) -> list[dict[str, Any]]:
        body = self.api.request_json("GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods")
        return [p for p in body.get("items") or () if isinstance(p, dict)]

    def annotate(self, changed: list[Recommendation]) -> None:
        """Write ``topoplace.io/rightsize`` on each workload's controller (a ReplicaSet's
        Deployment). A failure is logged and tried again next round; a workload without a
        live pod or a controller has nothing to annotate until its recommendation changes."""
        by_ns: dict[str, list[Recommendation]] = {}
        for r in changed:
            by_ns.setdefault(r.workload.rpartition("/")[0], []).append(r)
        for ns, recs in sorted(by_ns.items()):
            try:
                pods = self._pods(ns)
            except (ApiError, ApiUnavailable) as exc:
                log.warning("right-sizer: listing pods of %s failed: %s", ns, exc)
                continue
            for r in recs:
                pod = next((p for p in pods if workload_of(p, ns) == r.workload), None)
                ref = controller_of(pod) if pod is not None else None
                if ref is None:
                    self.annotated[r.workload] = _size(r)
                    continue
                try:
                    target = self._top_owner(ns, ref)
                    body = {"metadata": {"annotations": {ANNOTATION: _rec_note(r)}}}
                    self.api.request_json(
                        "PATCH", target, body, content_type="application/merge-patch+json"
                    )
                    self.annotated[r.workload] = _size(r)
                    self._record("annotated", r.workload, target.rsplit("/", 2)[-2:])
                except (ApiError, ApiUnavailable) as exc:
                    log.warning("right-sizer: annotating %s failed: %s", r.workload, exc)

    def _top_owner(self, ns: str, ref: Mapping[str, Any]) -> str:
        """The API path of the workload object: a ReplicaSet's controller when it has one."""
        path = _object_path(ns, ref)
        if ref.get("kind") == "ReplicaSet":
            rs = self.api.request_json("GET", path)
            up = controller_of(rs)
            if up is not None:
                return _object_path(ns, up)
        return path

    def recreate(self, now: float) -> None:
        """Evict at most one pod whose size is off (see the module docstring)."""
        s = self.settings
        if now - self.last_eviction < s.min_eviction_interval_seconds:
            return
        with self.lock:
            recs = sorted(self.current.items())
        pods_by_ns: dict[str, list[dict[str, Any]]] = {}
        for wl, r in recs:
            ns = wl.rpartition("/")[0]
            if ns not in pods_by_ns:
                try:
                    pods_by_ns[ns] = self._pods(ns)
                except (ApiError, ApiUnavailable) as exc:
                    log.warning("right-sizer: listing pods of %s failed: %s", ns, exc)
                    pods_by_ns[ns] = []
            mine = [p for p in pods_by_ns[ns] if workload_of(p, ns) == wl]
            live = [p for p in mine if not (p.get("metadata") or {}).get("deletionTimestamp")]
            if len(live) != len(mine):
                continue  # a pod is going: one at a time
            uids = {(p.get("metadata") or {}).get("uid") for p in live}
            waiting = self.awaiting.get(wl)
            if waiting is not None:
                if waiting[0] in uids or len(live) < waiting[1]:
                    continue  # the evicted pod is not replaced yet
                del self.awaiting[wl]
            if len(live) < s.min_replicas:
                continue
            for pod in sorted(live, key=lambda p: (_created(p) or now, _pod_name(p))):
                made = _created(pod)
                if made is None or now - made < s.min_age_seconds:
                    continue
                want = self.admitted_memory(pod, r)
                if want is False:
                    continue
                have = pod_memory_bytes(pod, self.gpushare_unit_mib)
                if have is None and want is None:
                    continue  # uncapped, as the recommendation wants
                if (
                    have is not None
                    and want is not None
                    and abs(have - want) <= s.min_change * want
                ):
                    continue
                self._evict(wl, pod, _mib(have), _mib(want), len(live), now)
                return

    def admitted_memory(self, pod: Mapping[str, Any], r: Recommendation) -> int | None | bool:
        """The GPU memory (bytes) the webhook would give a new pod like ``pod``, rounded as the
        backend states it; None for no cap (an exclusive HAMi GPU); False when the webhook
        would not size it (no share backend, or a mode the backend cannot express), so
        recreating the pod would change nothing."""
        backend = pod_backend(pod)
        if backend is None or r.mode not in SHARE_MODES:
            return False
        values = resize_values(backend, r, self.gpushare_unit_mib)
        if backend == "hami":
            mib = values[HAMI_MEM]
            return None if mib is None else int(mib) * MiB
        (units,) = values.values()
        return int(units or 0) * self.gpushare_unit_mib * MiB

    def _evict(
        self, wl: str, pod: Mapping[str, Any], have: str, want: str, live: int, now: float
    ) -> None:
        meta = pod.get("metadata") or {}
        ns, name, uid = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
        self.last_eviction = now
        try:
            self.api.evict_pod(ns, name, {"preconditions": {"uid": uid}})
        except ApiError as exc:
            outcome = (
                "blocked"
                if exc.status == 429
                else "gone"
                if exc.not_found or exc.conflict
                else "error"
            )
            log.warning("right-sizer: eviction of %s/%s %s: %s", ns, name, outcome, exc.message)
            self._count(outcome)
            self._record(outcome, wl, [ns, name])
            return
        except ApiUnavailable as exc:
            log.warning("right-sizer: eviction of %s/%s failed: %s", ns, name, exc)
            self._count("error")
            return
        self.awaiting[wl] = (uid, live)
        self._count("evicted")
        self._record("evicted", wl, [ns, name], f"{have} -> {want}")
        log.warning("right-sizer: evicted %s/%s (%s, recommended %s)", ns, name, have, want)

    def _count(self, outcome: str) -> None:
        with self.lock:
            self.evictions[outcome] = self.evictions.get(outcome, 0) + 1

    def _record(self, action: str, wl: str, obj: list[str], detail: str = "") -> None:
        with self.lock:
            self.recent.append(
                {
                    "time": self.wall(),
                    "action": action,
                    "workload": wl,
                    "object": "/".join(obj),
                    "detail": detail,
                }
            )
            del self.recent[:-RECENT]


def _mib(value: int | None) -> str:
    return "no cap" if value is None else f"{value // MiB} MiB"


def _size(r: Recommendation) -> tuple[int, float, str]:
    return (r.gpu_memory_limit_bytes, r.gpu_compute_ratio, r.mode)


def _pod_name(p: Mapping[str, Any]) -> str:
    return str((p.get("metadata") or {}).get("name") or "")


def _object_path(ns: str, ref: Mapping[str, Any]) -> str:
    """The namespaced API path of an ownerReference's object (plural: kind lowercased + s)."""
    api_version = str(ref.get("apiVersion") or "v1")
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    plural = str(ref.get("kind") or "").lower() + "s"
    return f"{base}/namespaces/{quote(ns, safe='')}/{plural}/{quote(str(ref.get('name')), safe='')}"


def _rec_json(
    sizing: Recommendation | PodSizing, containers: list[str] | None = None
) -> dict[str, Any]:
    r = sizing.rec if isinstance(sizing, PodSizing) else sizing
    out: dict[str, Any] = {
        "workload": r.workload,
        "since": r.timestamp,
        "gpu_memory_limit_bytes": r.gpu_memory_limit_bytes,
        "gpu_memory_limit_mib": r.gpu_memory_limit_bytes // MiB,
        "gpu_compute_ratio": r.gpu_compute_ratio,
        "mode": r.mode,
        "reason": r.reason,
    }
    if isinstance(sizing, PodSizing):
        out.update(sizing.note_fields())
    if containers is not None:
        out["containers"] = containers
    return out


def _rec_note(r: Recommendation) -> str:
    return orjson.dumps(_rec_json(r)).decode()


def rec_json(r: Recommendation | PodSizing) -> dict[str, Any]:
    """A recommendation (with a :class:`PodSizing`'s placement limits) as the inspect API and
    ``topoplace explain`` show it."""
    return _rec_json(r)


def build_rightsizer(
    kubeconfig: str | None,
    settings: RightsizeParams,
    extender: Any,
    options: Any = None,
    gpushare_unit_mib: int = 1024,
) -> RightSizer:
    """The right-sizer of ``topoplace serve --kubeconfig`` (not started): its own API client
    on ``kubeconfig``, writing only while ``extender`` is ready and, with HA, leading.

    Raises:
        ValueError: the policies cannot be loaded.
        ApiUnavailable: no usable Kubernetes configuration.
    """
    from scheduler.kube.client import KubeApi

    policies = load_rightsize_policies(settings)
    api = KubeApi.from_config(
        kubeconfig,
        getattr(options, "context", None),
        getattr(options, "timeouts", None),
    )

    def may_act() -> bool:
        lead = getattr(extender, "leadership", None)
        return bool(extender.ready()) and (lead is None or lead.active)

    return RightSizer(api, settings, policies, may_act=may_act, gpushare_unit_mib=gpushare_unit_mib)
