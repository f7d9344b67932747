"""Figures of one arm of a run (live topoplace, live default-scheduler, offline engine).

Placement figures come from where the pods ended up; timing figures (live arms only) from
when each pod was created and when its binding was seen on a watch; gang integrity from
the bind times of each gang's members.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.live.kubesched import cpu_seconds
from benchmarks.live.scenario import LEAF_LABEL, Scenario


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return float(s[k])


@dataclass(slots=True)
class Figures:
    """One arm of one run. Timing and gang-timing fields are NaN for the offline arm."""

    arm: str
    run: int
    pods: int = 0
    pods_bound: int = 0
    gpus_requested: int = 0
    gpus_bound: int = 0
    allocation_ratio: float = math.nan
    """GPUs bound / GPUs requested (the scenario only requests what fits)."""
    nodes_used: int = 0
    whole_nodes_free: int = 0
    whole_8gpu_nodes_free: int = 0
    frag_free_gpus: int = 0
    """Free GPUs on nodes that are partly used (fragmentation)."""
    frag_share: float = math.nan
    """frag_free_gpus / all free GPUs."""
    best_nodes_used: int = 0
    best_whole_free: int = 0
    release: str = ""
    """How pods reached the scheduler (``cold``, ``ungate`` or ``create``: see
    ``benchmarks.live.run.RELEASES``)."""
    seconds: float = math.nan
    """First pod released (create or ungate request sent) to last binding seen; ``cold``:
    first binding to last."""
    pods_per_s: float = math.nan
    """Bound pods / ``seconds`` (``cold``: bound pods - 1, the pods scheduled between the
    first binding and the last)."""
    startup_s: float = math.nan
    """``cold``: kube-scheduler launched -> first binding (start-up and informer sync)."""
    create_seconds: float = math.nan
    """First release sent -> last release returned (creating, or ungating, every pod)."""
    release_per_s: float = math.nan
    drain_s: float = math.nan
    """Last binding seen - last release returned. Near 0: the scheduler kept up with the
    releases, and pods/s measures the client (a lower bound on the scheduler's rate)."""
    latency_p50: float = math.nan
    """Release request sent -> binding seen on the watch, seconds (in a backlog, mostly
    the time spent queued behind the pods released before)."""
    latency_p99: float = math.nan
    cpu_topoplace_s: float = math.nan
    """CPU seconds (user + system) of the process during the arm, from ``/proc/<pid>/stat``."""
    cpu_kube_scheduler_s: float = math.nan
    cpu_apiserver_s: float = math.nan
    cpu_etcd_s: float = math.nan
    cpu_ms_per_pod_topoplace: float = math.nan
    cpu_ms_per_pod_kube_scheduler: float = math.nan
    host_busy_share: float = math.nan
    """Share of the host's CPU time in use during the arm (all processes, /proc/stat)."""
    bench_cpu_share: float = math.nan
    """Share of the host's CPU time used by topoplace, kube-scheduler, kube-apiserver and
    etcd during the arm (the rest of ``host_busy_share``: everything else on the host)."""
    pods_per_cpu_s: float = math.nan
    """Pods bound per CPU second of topoplace + kube-scheduler + kube-apiserver + etcd: the
    arm's throughput on a machine where those processes are CPU-bound, whatever share of
    the host they get."""
    load1_start: float = math.nan
    load1_end: float = math.nan
    sched_attempt_mean_ms: float = math.nan
    """kube-scheduler's ``scheduling_attempt_duration_seconds`` (result scheduled): from
    the start of the pod's scheduling cycle to the end of its binding (extender calls and
    the bind included; binding cycles run concurrently, so this is not the cost of a pod
    in the serial scheduling loop)."""
    sched_attempt_p99_ms: float = math.nan
    sched_bind_mean_ms: float = math.nan
    """kube-scheduler's Bind extension point (DefaultBinder's API write; default arms only,
    a 10 % sample as kube-scheduler records framework metrics)."""
    tp_filter_mean_ms: float = math.nan
    """topoplace's own latency per verb (server side, ``topoplace_request_seconds``)."""
    tp_filter_p99_ms: float = math.nan
    tp_bind_mean_ms: float = math.nan
    tp_bind_p50_ms: float = math.nan
    tp_bind_p99_ms: float = math.nan
    gangs: int = 0
    gangs_complete: int = 0
    gangs_partial_at_end: int = 0
    gang_partial_max_s: float = math.nan
    """Longest time a gang was partly bound (first member bound -> last member bound, or
    -> end of the arm when it never completed)."""
    gang_partial_total_s: float = math.nan
    gangs_partial_max_concurrent: int = 0
    gang_leaves_max: int = 0
    """Most distinct leaves one complete gang spans (0: no leaf labels / no gangs)."""
    wait_mean_scn_s: float = math.nan
    """Scenarios where pods leave or arrive over time: mean wait from arrival to bound, in
    scenario seconds (live: seconds x time scale; a backlog arrives at the first bind)."""
    pods_deleted: int = 0
    """Pods deleted while the arm ran because the scenario says they leave."""
    same_node_as_offline: int = -1
    first_divergence: int = -1
    """Arrival index of the first pod placed on another node than offline (-1: none)."""
    pending_reasons: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        d.update({f"x_{k}": v for k, v in sorted(extra.items())})
        return d


def placement_figures(
    fig: Figures, scenario: Scenario, nodes_of: Mapping[str, str], labels: Mapping[str, Any]
) -> Figures:
    """Fill the placement figures of ``fig`` from ``nodes_of`` (pod name -> node name of
    the pods that were bound / placed) and node labels (name -> labels)."""
    gpus_of = {p.name: p.gpus for p in scenario.pods}
    cap = {n.name: n.gpus for n in scenario.nodes}
    used: dict[str, int] = {}
    for pod, node in nodes_of.items():
        used[node] = used.get(node, 0) + gpus_of.get(pod, 0)
    fig.pods = len(scenario.pods)
    fig.pods_bound = sum(1 for p in scenario.pods if p.name in nodes_of)
    fig.gpus_requested = scenario.gpus_requested
    fig.gpus_bound = sum(gpus_of[p] for p in nodes_of if p in gpus_of)
    fig.allocation_ratio = fig.gpus_bound / fig.gpus_requested if fig.gpus_requested else math.nan
    busy = {n for n, u in used.items() if u > 0}
    fig.nodes_used = len(busy)
    fig.whole_nodes_free = sum(1 for n, g in cap.items() if g > 0 and n not in busy)
    fig.whole_8gpu_nodes_free = sum(1 for n, g in cap.items() if g >= 8 and n not in busy)
    fig.frag_free_gpus = sum(max(0, cap.get(n, 0) - used[n]) for n in busy)
    free_all = sum(cap.values()) - sum(used.values())
    fig.frag_share = fig.frag_free_gpus / free_all if free_all > 0 else 0.0
    fig.best_nodes_used = scenario.best_nodes_used()
    fig.best_whole_free = scenario.best_whole_free()
    gangs = scenario.gangs()
    fig.gangs = len(gangs)
    leaves = 0
    for members in gangs.values():
        if all(m in nodes_of for m in members):
            fig.gangs_complete += 1
            ls = {(labels.get(nodes_of[m]) or {}).get(LEAF_LABEL) for m in members}
            ls.discard(None)
            leaves = max(leaves, len(ls))
    fig.gang_leaves_max = leaves
    return fig


def timing_figures(
    fig: Figures,
    scenario: Scenario,
    created: Mapping[str, float],
    bound: Mapping[str, float],
    t_created_all: float,
    t_end: float,
) -> Figures:
    """Throughput, latency and gang timing (monotonic seconds) of a live arm.

    Args:
        created: pod -> when it was released to the scheduler (create or ungate request
            sent).
        bound: pod -> when its binding was first seen on the watch.
        t_created_all: when the last release request returned.
        t_end: when the arm stopped waiting.
    """
    if created:
        t0 = min(created.values())
        fig.create_seconds = t_created_all - t0
        if fig.create_seconds > 0:
            fig.release_per_s = len(created) / fig.create_seconds
        if bound:
            fig.seconds = max(bound.values()) - t0
            fig.drain_s = max(bound.values()) - t_created_all
            fig.pods_per_s = len(bound) / fig.seconds if fig.seconds > 0 else math.nan
        lat = [bound[p] - created[p] for p in bound if p in created]
        fig.latency_p50 = percentile(lat, 50)
        fig.latency_p99 = percentile(lat, 99)
    windows: list[tuple[float, float]] = []
    for members in scenario.gangs().values():
        times = [bound[m] for m in members if m in bound]
        if not times:
            continue
        complete = len(times) == len(members)
        if not complete:
            fig.gangs_partial_at_end += 1
        end = max(times) if complete else t_end
        if end > min(times) or not complete:
            windows.append((min(times), end))
    if scenario.gangs():
        durations = [b - a for a, b in windows]
        fig.gang_partial_max_s = max(durations, default=0.0)
        fig.gang_partial_total_s = sum(durations)
        events = sorted([(a, 1) for a, _ in windows] + [(b, -1) for _, b in windows])
        cur = peak = 0
        for _, d in events:
            cur += d
            peak = max(peak, cur)
        fig.gangs_partial_max_concurrent = peak
    return fig


def compare_with_offline(
    fig: Figures, scenario: Scenario, nodes_of: Mapping[str, str], offline: Mapping[str, str]
) -> Figures:
    """Pods on the same node as offline, and the arrival index of the first that is not.

    A gang's members are identical and interchangeable (which member lands on which of the
    gang's nodes is the planner's naming, not a placement decision): a member counts as
    placed as offline when the multiset of its gang's nodes live and offline share one more
    node, members taken in arrival order."""
    same = 0
    first = -1
    gangs = scenario.gangs()
    matched: dict[str, int] = {}
    for g, members in gangs.items():
        live = Counter(nodes_of[m] for m in members if m in nodes_of)
        off = Counter(offline[m] for m in members if m in offline)
        unplaced = min(
            sum(1 for m in members if m not in nodes_of),
            sum(1 for m in members if m not in offline),
        )
        matched[g] = sum((live & off).values()) + unplaced
    seen: Counter[str] = Counter()
    for i, p in enumerate(scenario.pods):
        if p.gang and p.gang in matched:
            seen[p.gang] += 1
            ok = seen[p.gang] <= matched[p.gang]
        else:
            ok = nodes_of.get(p.name) == offline.get(p.name)
        if ok:
            same += 1
        elif first < 0:
            first = i
    fig.same_node_as_offline = same
    fig.first_divergence = first
    return fig


_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _labels(key: str) -> tuple[str, dict[str, str]]:
    name, _, rest = key.partition("{")
    return name, dict(_LABEL.findall(rest))


def histogram_delta(
    before: Mapping[str, float], after: Mapping[str, float], name: str, **match: str
) -> tuple[list[tuple[float, float]], float, float]:
    """The growth of histogram ``name`` between two scrapes, summed over the series whose
    labels include ``match``: (cumulative buckets as (le, count) sorted by le, count, sum)."""
    buckets: dict[float, float] = {}
    count = total = 0.0
    for key, v in after.items():
        base, labels = _labels(key)
        if not base.startswith(name) or any(labels.get(k) != w for k, w in match.items()):
            continue
        d = v - before.get(key, 0.0)
        if base == f"{name}_bucket":
            le = labels.get("le", "+Inf")
            b = math.inf if le == "+Inf" else float(le)
            buckets[b] = buckets.get(b, 0.0) + d
        elif base == f"{name}_count":
            count += d
        elif base == f"{name}_sum":
            total += d
    return sorted(buckets.items()), count, total


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float:
    """Prometheus' ``histogram_quantile`` (linear within a bucket) over cumulative
    ``(le, count)`` buckets; ``q`` in 0..1. NaN without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def histogram_ms(
    before: Mapping[str, float], after: Mapping[str, float], name: str, **match: str
) -> dict[str, float]:
    """count, mean_ms, p50_ms and p99_ms of a histogram's growth between two scrapes."""
    buckets, count, total = histogram_delta(before, after, name, **match)
    if count <= 0:
        return {"count": 0.0, "mean_ms": math.nan, "p50_ms": math.nan, "p99_ms": math.nan}
    return {
        "count": count,
        "mean_ms": 1000 * total / count,
        "p50_ms": 1000 * histogram_quantile(buckets, 0.5),
        "p99_ms": 1000 * histogram_quantile(buckets, 0.99),
    }


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_prometheus(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample line."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                continue
    return out


def metric_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Topoplace's request counts, mean latency per verb, binds and gang events during an
    arm (differences of counters)."""
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    out: dict[str, float] = {}
    for k, v in d.items():
        if not v:
            continue
        if k.startswith("topoplace_request_seconds_count"):
            verb = re.search(r'verb="([^"]+)"', k)
            if verb:
                name = verb.group(1)
                out[f"{name}_calls"] = out.get(f"{name}_calls", 0.0) + v
                s = d.get(k.replace("_count", "_sum"), 0.0)
                out[f"{name}_sum_s"] = out.get(f"{name}_sum_s", 0.0) + s
        elif k.startswith(("topoplace_binds_total", "topoplace_gang_events_total")):
            lab = re.search(r'(?:result|event)="([^"]+)"', k)
            base = "binds" if k.startswith("topoplace_binds") else "gang"
            out[f"{base}_{lab.group(1) if lab else ''}"] = v
        elif k.startswith("topoplace_filter_errors_total"):
            out["filter_errors"] = out.get("filter_errors", 0.0) + v
        elif k.startswith('topoplace_http_connections_total{outcome="accepted",port="main"'):
            out["connections_accepted"] = v  # kube-scheduler keeps only 2 idle ones
    for verb in ("filter", "prioritize", "bind"):
        n = out.pop(f"{verb}_calls", 0.0)
        s = out.pop(f"{verb}_sum_s", 0.0)
        if n:
            out[f"{verb}_calls"] = n
            out[f"{verb}_mean_ms"] = round(1000 * s / n, 3)
    return out


API_SERIES = ("apiserver_request_total{", "apiserver_watch_events_total{")


def apiserver_calls(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Requests the API server served during an arm, by verb, resource and subresource
    (``api_<VERB>_<resource>[_<subresource>]``), and the Pod events it sent to watchers
    (``api_watch_events_pod``), from ``apiserver_request_total`` and
    ``apiserver_watch_events_total``. Requests of every client: the arm's scheduler(s),
    topoplace and this benchmark's own watch."""
    out: dict[str, float] = {}
    for key, v in after.items():
        if not key.startswith(API_SERIES):
            continue
        d = v - before.get(key, 0.0)
        if d <= 0:
            continue
        base, labels = _labels(key)
        if base == "apiserver_request_total":
            name = f"api_{labels.get('verb', '')}_{labels.get('resource', '')}"
            if labels.get("subresource"):
                name += f"_{labels['subresource']}"
        elif labels.get("kind") == "Pod":
            name = "api_watch_events_pod"
        else:
            continue
        out[name] = out.get(name, 0.0) + d
    return out


def _cpu_s(pid: int | None) -> float:
    """:func:`~benchmarks.live.kubesched.cpu_seconds`, 0 for no process or one gone."""
    c = cpu_seconds(pid)
    return 0.0 if math.isnan(c) else c


class HostCost:
    """What an arm cost the host, as a ``with`` block around its scheduling: the CPU
    seconds of each named process (``pids`` maps a name to a function giving its pid, read
    at entry and at exit, so a process started inside the block counts from 0) and the API
    server's requests (:func:`apiserver_calls`, when ``apiserver_metrics`` reads its
    ``/metrics``). :meth:`figures` divides them by the pods placed: on a host whose cores
    the whole control plane shares, pods/s follows the sum."""

    def __init__(
        self,
        pids: Mapping[str, Callable[[], int | None]],
        apiserver_metrics: Callable[[], str] | None = None,
    ) -> None:
        self.pids = pids
        self.apiserver_metrics = apiserver_metrics
        self.cpu_s: dict[str, float] = {}
        self.calls: dict[str, float] = {}
        self._start: dict[str, tuple[int | None, float]] = {}
        self._api: dict[str, float] = {}

    def _api_now(self) -> dict[str, float]:
        if self.apiserver_metrics is None:
            return {}
        try:
            return parse_prometheus(self.apiserver_metrics())
        except Exception:  # the figures go without the API's counts, never the run
            return {}

    def __enter__(self) -> HostCost:
        self._api = self._api_now()
        for name, pid_of in self.pids.items():
            pid = pid_of()
            self._start[name] = (pid, _cpu_s(pid))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, pid_of in self.pids.items():
            pid = pid_of()
            start_pid, start = self._start.get(name, (None, 0.0))
            self.cpu_s[name] = _cpu_s(pid) - (start if pid == start_pid else 0.0)
        after = self._api_now()
        self.calls = apiserver_calls(self._api, after) if after else {}

    def figures(self, pods: int, prefix: str = "") -> dict[str, float]:
        """``{prefix}cpu_ms_<name>`` per pod for each process, ``{prefix}cpu_ms_total``,
        and the API server's writes per pod: ``{prefix}writes_per_pod`` (every request but
        GET, LIST and WATCH) and ``{prefix}node_writes_per_pod`` (those on nodes)."""
        n = max(pods, 1)
        out = {f"{prefix}cpu_ms_{k}": 1000.0 * v / n for k, v in self.cpu_s.items()}
        out[f"{prefix}cpu_ms_total"] = 1000.0 * sum(self.cpu_s.values()) / n
        if self.calls:
            writes = {
                k: v
                for k, v in self.calls.items()
                if k.startswith("api_")
                and k.split("_")[1] not in ("GET", "LIST", "WATCH")
                and k != "api_watch_events_pod"
            }
            out[f"{prefix}writes_per_pod"] = sum(writes.values()) / n
            out[f"{prefix}node_writes_per_pod"] = (
                sum(v for k, v in writes.items() if k.split("_", 2)[2].startswith("nodes")) / n
            )
        return out
