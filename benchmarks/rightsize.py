"""The GPU share right-sizer against baselines, on the shared GenAI pods and on LLM servers
driven by the Azure LLM inference trace.

Run: ``python -m benchmarks.rightsize [--data ../shared/data] [--out benchmarks/results]
[--only genai|azure]`` (or through the runner, ``topoplace bench rightsize``, whose ``--out``
defaults to ``out/rightsize``). Writes ``rightsize.md`` and ``rightsize.csv`` in ``--out``.

Inputs, turned into the replay's series format (``scheduler.cli.rightsize``):

* **GenAI** (``alibaba-genai-2026/``): per-pod GPU memory used (bytes) and duty cycle (percent,
  /100 -> ratio), one sample every 57 s. Each pod (``container_ip``) is one workload: the data
  names no owner.
* **Azure** (``azure-llm-inference-2023/``): each trace (code, conv) drives one workload of
  ``REPLICAS`` Llama-3-8B servers, requests dealt round-robin. A server runs at most
  ``MAX_BATCH`` requests at once (the others wait: ``requests_waiting``); a request holds its
  context tokens during prefill (``PREFILL_TOK_S`` tokens/s) and one more token per
  ``TPOT_S`` while it decodes its generated tokens. Memory = weights (8.03e9 parameters x 2
  bytes, bf16) + ``OVERHEAD`` (CUDA context, activations) + 128 KiB (``2 x 32 layers x 8 KV heads
  x 128 x 2 bytes``) per token in flight, the maximum over each ``SAMPLE_S``-second scrape;
  utilisation = share of the scrape's seconds with a request running. The hour is replayed once.

Policies compared (each gives the GPU-memory limit in force at every sample):

* ``whole-gpu``: the static request, one 80 GiB GPU per pod;
* ``vpa-recipe``: VPA's recommender applied to GPU memory (per-24 h peaks in a histogram with a
  24 h half-life, target p90 + 15 %, bounds p50 / p95 with confidence, OOM bump x1.2 or +100 MiB;
  the updater replaces the pod when the limit falls outside the bounds, or after an OOM);
* ``max-x1.3`` / ``max-x1.2``: the maximum seen so far (before the sample) x 1.3 / 1.2;
* ``hindsight-max``: each pod's own maximum over the whole trace, static (an oracle);
* ``topoplace``: ``scheduler.core.rightsize.replay`` with the default parameters, unchanged for
  both inputs, and for Azure a latency guard (``requests_waiting`` <= 0).

Scored after a warm-up from each pod's first sample (6 h for GenAI, 10 min for the Azure hour):
GPUs needed (the peak, over the instants after the warm-up from the first sample of all, of
first-fit-decreasing of every present pod's limit in force onto 80 GiB GPUs, at most 8 tenants
each; exclusive mode, a whole-GPU limit or no recommendation yet: a GPU alone), reserved / used (sum of limits over
sum of usage, all scored samples), OOM events (samples with usage above the limit in force),
latency-guard breaches (limit decreases while the server's queue is above the guard's
objective), and changes per pod per day (limit changes within the scored span).

Generalisation (GenAI): the pods are split in two halves by the parity of the SHA-256 of their
name; candidate memory models (max so far x k, max so far + A, steady floor + growth x k, a
decayed peak x k), each run under topoplace's change rules, get their parameter on the tuning
half and are scored on both; the hindsight optimum with the day's change budget bounds them all.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import hashlib
import math
import sys
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from scheduler.core.rightsize import (
    EXCLUSIVE,
    MEMORY,
    REQUESTS_WAITING,
    UTILIZATION,
    GiB,
    Guard,
    Params,
    Policy,
    PolicySet,
    Sample,
    replay,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data"
GPU_BYTES = 80 * GiB
MAX_TENANTS = 8
MAX_CHANGES = Params().max_changes_per_day
WARMUP = {"genai": 6 * 3600, "azure": 600}

# Azure LLM servers (stated assumptions).
REPLICAS = 4
MAX_BATCH = 16
PREFILL_TOK_S = 10_000.0
TPOT_S = 0.025
WEIGHTS = 8_030_000_000 * 2
OVERHEAD = 3 * GiB // 2
KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2
SAMPLE_S = 10
assert KV_PER_TOKEN == 128 * 1024


@dataclass
class Pod:
    """One pod's scored input: sample times, memory used, and (Azure) queue length."""

    workload: str
    name: str
    t: list[float]
    used: list[float]
    waiting: list[float]


# ---------------------------------------------------------------- inputs


def genai_series(data: Path) -> list[Sample]:
    """The GenAI pods in the replay's format: one workload per pod, container ``main``."""
    d = data / "alibaba-genai-2026"
    out: list[Sample] = []
    with (d / "pod_gpu_memory_used_bytes_anon.csv").open() as fh:
        for row in csv.DictReader(fh):
            pod = row["container_ip"]
            out.append(
                Sample(float(row["timestamp_anon"]), pod, pod, "main", MEMORY, float(row["value"]))
            )
    with (d / "pod_gpu_duty_cycle_anon.csv").open() as fh:
        for row in csv.DictReader(fh):
            pod = row["container_ip"]
            v = min(1.0, max(0.0, float(row["value"]) / 100.0))
            out.append(Sample(float(row["timestamp_anon"]), pod, pod, "main", UTILIZATION, v))
    out.sort(key=lambda s: s.timestamp)
    return out


def _azure_requests(path: Path) -> list[tuple[float, int, int]]:
    reqs = []
    t0: datetime | None = None
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            ts = row["TIMESTAMP"].strip()
            base, _, frac = ts.partition(".")
            dt = datetime.strptime(base, "%Y-%m-%d %H:%M:%S")
            if t0 is None:
                t0 = dt
            sec = (dt - t0).total_seconds() + (float("0." + frac) if frac else 0.0)
            reqs.append((sec, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    return reqs


def simulate_server(
    reqs: list[tuple[float, int, int]], horizon: int
) -> tuple[list[int], list[int], list[int]]:
    """Per second: bytes of GPU memory, requests running, requests waiting, of one server
    (continuous batching, FIFO admission up to ``MAX_BATCH``)."""
    mem, run_n, wait_n = [], [], []
    queue: list[tuple[float, int, int]] = []
    running: list[list[float]] = []  # [prefill_left_s, ctx, gen, generated]
    i = 0
    for sec in range(horizon):
        while i < len(reqs) and reqs[i][0] < sec + 1:
            queue.append(reqs[i])
            i += 1
        while queue and len(running) < MAX_BATCH:
            _, ctx, gen = queue.pop(0)
            running.append([ctx / PREFILL_TOK_S, float(ctx), float(max(1, gen)), 0.0])
        peak_tokens = sum(r[1] + r[3] for r in running)
        nxt = []
        for r in running:
            budget = 1.0
            if r[0] > 0:
                used = min(r[0], budget)
                r[0] -= used
                budget -= used
            r[3] = min(r[2], r[3] + budget / TPOT_S)
            if r[3] < r[2]:
                nxt.append(r)
        peak_tokens = max(peak_tokens, sum(r[1] + r[3] for r in running))
        mem.append(WEIGHTS + OVERHEAD + int(peak_tokens) * KV_PER_TOKEN)
        run_n.append(len(running))
        wait_n.append(len(queue))
        running = nxt
    return mem, run_n, wait_n


def azure_series(data: Path) -> list[Sample]:
    """The Azure-driven servers in the replay's format (see the module docstring)."""
    d = data / "azure-llm-inference-2023"
    out: list[Sample] = []
    for kind in ("code", "conv"):
        reqs = _azure_requests(d / f"AzureLLMInferenceTrace_{kind}.csv")
        horizon = int(math.ceil(reqs[-1][0])) + 60
        for rep in range(REPLICAS):
            mine = reqs[rep::REPLICAS]
            mem, run_n, wait_n = simulate_server(mine, horizon)
            wl, pod = f"azure/{kind}", f"{kind}-{rep}"
            for s0 in range(0, horizon - SAMPLE_S + 1, SAMPLE_S):
                t = float(s0 + SAMPLE_S)
                seg = slice(s0, s0 + SAMPLE_S)
                out.append(Sample(t, wl, pod, "vllm", MEMORY, float(max(mem[seg]))))
                busy = sum(1 for x in run_n[seg] if x > 0) / SAMPLE_S
                out.append(Sample(t, wl, pod, "vllm", UTILIZATION, busy))
                out.append(Sample(t, wl, pod, "vllm", REQUESTS_WAITING, float(max(wait_n[seg]))))
    out.sort(key=lambda s: s.timestamp)
    return out


def pods_of(samples: list[Sample]) -> dict[str, Pod]:
    """Per pod: memory samples in time order, with the queue length at the same instants."""
    pods: dict[str, Pod] = {}
    waits: dict[tuple[str, float], float] = {}
    for s in samples:
        if s.metric == REQUESTS_WAITING:
            waits[(s.pod, s.timestamp)] = s.value
    for s in samples:
        if s.metric != MEMORY:
            continue
        p = pods.setdefault(s.pod, Pod(s.workload, s.pod, [], [], []))
        p.t.append(s.timestamp)
        p.used.append(s.value)
        p.waiting.append(waits.get((s.pod, s.timestamp), 0.0))
    return pods


# ---------------------------------------------------------------- policies

Limits = dict[str, list[float]]
"""Per pod: the limit in force at each of its memory samples."""


def whole_gpu(pods: dict[str, Pod]) -> Limits:
    """One whole 80 GiB GPU per pod."""
    return {k: [float(GPU_BYTES)] * len(p.t) for k, p in pods.items()}


def max_so_far(factor: float) -> Callable[[dict[str, Pod]], Limits]:
    """The maximum before each sample x ``factor`` (the first sample: its own value)."""

    def f(pods: dict[str, Pod]) -> Limits:
        out: Limits = {}
        for k, p in pods.items():
            lim, m = [], p.used[0]
            for v in p.used:
                lim.append(m * factor)
                m = max(m, v)
            out[k] = lim
        return out

    return f


def hindsight(pods: dict[str, Pod]) -> Limits:
    """Each pod's maximum over the whole trace, from the start (an oracle)."""
    return {k: [max(p.used)] * len(p.t) for k, p in pods.items()}


class VpaHistogram:
    """VPA's memory histogram: exponential buckets (first 10 MB, ratio 1.05), weights decaying
    with a 24 h half-life, one sample per 24 h aggregation interval (its peak)."""

    def __init__(self) -> None:
        self.w: dict[int, float] = defaultdict(float)
        self.ref: float | None = None

    def _bucket(self, v: float) -> int:
        return 0 if v <= 1e7 else int(math.floor(math.log(v / 1e7) / math.log(1.05))) + 1

    def add(self, v: float, t: float, weight: float = 1.0) -> None:
        if self.ref is None:
            self.ref = t
        self.w[self._bucket(v)] += weight * 2 ** ((t - self.ref) / 86_400)

    def sub(self, v: float, t: float) -> None:
        assert self.ref is not None
        self.w[self._bucket(v)] -= 2 ** ((t - self.ref) / 86_400)

    def percentile(self, q: float) -> float:
        total = sum(x for x in self.w.values() if x > 0)
        acc = 0.0
        for b in sorted(self.w):
            acc += max(0.0, self.w[b])
            if acc >= q * total:
                return 1e7 * 1.05**b
        return 0.0


def vpa_recipe(pods: dict[str, Pod]) -> Limits:
    """VPA's recommender and updater applied to GPU memory (see the module docstring)."""
    out: Limits = {}
    for k, p in pods.items():
        h = VpaHistogram()
        t0 = p.t[0]
        interval_start, interval_peak = t0, None
        limit: float | None = None
        lim: list[float] = []
        for n, (t, v) in enumerate(zip(p.t, p.used, strict=True)):
            conf = max(1e-3, min((t - t0) / 86_400, n / 1440))
            if interval_peak is not None:
                target = h.percentile(0.9) * 1.15
                lower = h.percentile(0.5) * 1.15 * (1 + 0.001 / conf) ** -2
                upper = h.percentile(0.95) * 1.15 * (1 + 1 / conf)
                if limit is None or limit < lower or limit > upper:
                    limit = target
            lim.append(limit if limit is not None else v)
            if t - interval_start >= 86_400:
                interval_start, interval_peak = t, None
            if interval_peak is None:
                interval_peak = v
                h.add(v, t)
            elif v > interval_peak:
                h.sub(interval_peak, t)
                interval_peak = v
                h.add(v, t)
            if limit is not None and v > limit:
                # the OOM sample enters the histogram; the restarted pod gets the new target
                h.add(max(v * 1.2, v + 100 * 2**20), t)
                limit = h.percentile(0.9) * 1.15
        out[k] = lim
    return out


def topoplace(
    samples: list[Sample], pods: dict[str, Pod], policies: PolicySet, params: Params | None = None
) -> tuple[Limits, dict[str, list[str]]]:
    """The right-sizer's rows turned into the limit (and mode) in force at each sample."""
    rows, _ = replay(samples, policies, params or Params())
    by_pod: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for r in rows:
        by_pod[r.pod].append((r.timestamp, float(r.gpu_memory_limit_bytes), r.mode))
    out: Limits = {}
    modes: dict[str, list[str]] = {}
    for k, p in pods.items():
        steps = by_pod.get(k, [])
        ts = [s[0] for s in steps]
        lim, md = [], []
        for t in p.t:
            i = bisect.bisect_right(ts, t) - 1
            lim.append(steps[i][1] if i >= 0 else math.inf)
            md.append(steps[i][2] if i >= 0 else "")
        out[k] = lim
        modes[k] = md
    return out, modes


# ---------------------------------------------------------------- scoring


def ffd(sizes: list[float], exclusive: int) -> int:
    """GPUs for the limits by first-fit decreasing onto 80 GiB GPUs of at most ``MAX_TENANTS``,
    plus one GPU per exclusive pod."""
    bins: list[list[float]] = []
    for s in sorted(sizes, reverse=True):
        for b in bins:
            if b[0] + s <= GPU_BYTES and b[1] < MAX_TENANTS:
                b[0] += s
                b[1] += 1
                break
        else:
            bins.append([s, 1])
    return len(bins) + exclusive


@dataclass
class Score:
    """One policy's figures on one input."""

    gpus: int
    ratio: float
    ooms: int
    oom_pods: int
    guard_breaches: int
    changes_per_day: float
    max_changes_24h: int


def score(
    pods: dict[str, Pod], limits: Limits, warmup_s: float, modes: dict[str, list[str]] | None = None
) -> Score:
    """The figures of the module docstring, over samples at least ``warmup_s`` after each
    pod's first."""
    reserved = used = 0.0
    ooms = 0
    oom_pods = 0
    breaches = 0
    changes = 0.0
    pod_days = 0.0
    max24 = 0
    at: dict[float, tuple[list[float], int]] = {}
    t_first = min(p.t[0] for p in pods.values())
    for k, p in pods.items():
        lim = limits[k]
        start = p.t[0] + warmup_s
        pod_oom = 0
        change_times = []
        for i, (t, v, L) in enumerate(zip(p.t, p.used, lim, strict=True)):
            if t >= t_first + warmup_s:
                ex = bool(modes and modes[k][i] == EXCLUSIVE) or L >= GPU_BYTES
                sizes, nex = at.setdefault(t, ([], 0))
                if ex:
                    at[t] = (sizes, nex + 1)
                else:
                    sizes.append(L)
            if t < start:
                continue
            reserved += L
            used += v
            if v > L:
                pod_oom += 1
            if i > 0 and lim[i - 1] != L:
                change_times.append(t)
                if lim[i - 1] > L and p.waiting[i - 1] > 0:
                    breaches += 1
        ooms += pod_oom
        oom_pods += pod_oom > 0
        span = [t for t in p.t if t >= start]
        if span:
            pod_days += max(span[-1] - span[0], 60.0) / 86_400
        changes += len(change_times)
        for j, t in enumerate(change_times):
            max24 = max(max24, bisect.bisect_right(change_times, t + 86_400 - 1e-9) - j)
    gpus = max((ffd(s, n) for s, n in at.values()), default=0)
    return Score(
        gpus,
        reserved / used if used else math.nan,
        ooms,
        oom_pods,
        breaches,
        changes / pod_days if pod_days else 0.0,
        max24,
    )


# ---------------------------------------------------------------- generalisation


def split_of(pod: str) -> str:
    """``tune`` or ``held-out``: the pod's half, from the parity of the SHA-256 of its name
    (deterministic, independent of its series)."""
    return "held-out" if int(hashlib.sha256(pod.encode()).hexdigest(), 16) % 2 else "tune"


class FleetStats:
    """What the whole fleet showed before each instant, for priors on pods with little
    history: the quantiles of the peaks so far of pods with at least 6 h of history, and of
    the jumps of a sample above its pod's peak so far (pods past their first hour: start-up
    ramps aside). Online: at ``t`` only samples before ``t`` count."""

    def __init__(self, pods: dict[str, Pod]) -> None:
        self.times = sorted({t for p in pods.values() for t in p.t})
        self.peaks: list[list[float]] = []
        self.jumps: list[list[float]] = []
        events: list[tuple[float, float]] = []
        run: dict[str, list[float]] = {}
        for k, p in pods.items():
            m, out = 0.0, []
            for t, v in zip(p.t, p.used, strict=True):
                if m > 0 and v > m and t >= p.t[0] + 3600:
                    events.append((t, v - m))
                m = max(m, v)
                out.append(m)
            run[k] = out
        events.sort()
        seen: list[float] = []
        e = 0
        for t in self.times:
            while e < len(events) and events[e][0] < t:
                bisect.insort(seen, events[e][1])
                e += 1
            self.jumps.append(
                list(seen) if not self.jumps or len(seen) != len(self.jumps[-1]) else self.jumps[-1]
            )
            cur = []
            for k, p in pods.items():
                i = bisect.bisect_left(p.t, t) - 1
                if i >= 0 and t - p.t[0] >= 6 * 3600:
                    cur.append(run[k][i])
            self.peaks.append(sorted(cur))

    @staticmethod
    def _q(xs: list[float], q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0

    def peak(self, t: float, q: float) -> float:
        """The ``q`` quantile of the fleet's peaks so far at ``t`` (0 before any)."""
        return self._q(self.peaks[bisect.bisect_left(self.times, t)], q)

    def jump(self, t: float, q: float) -> float:
        """The ``q`` quantile of the fleet's jumps above a peak before ``t`` (0 before any)."""
        return self._q(self.jumps[bisect.bisect_left(self.times, t)], q)


class OnlineRule:
    """A candidate memory model: a target limit from a pod's samples before ``t``. Run by
    :func:`budgeted` under topoplace's change rules, so candidates differ only in the model."""

    label = ""

    def __init__(self, x: float, fleet: FleetStats | None = None) -> None:
        self.x = x
        self.fleet = fleet
        self.peak = 0.0
        self.floor = math.inf
        self.decayed = 0.0
        self.last_t: float | None = None

    def observe(self, t: float, v: float) -> None:
        """Take the sample ``v`` at ``t``."""
        if self.last_t is not None:
            self.decayed *= 2 ** (-(t - self.last_t) / 86_400)
        self.peak, self.floor = max(self.peak, v), min(self.floor, v)
        self.decayed, self.last_t = max(self.decayed, v), t

    def target(self, t: float) -> float:
        """The limit this model wants at ``t``."""
        raise NotImplementedError


class PeakTimes(OnlineRule):
    label = "max so far x k"

    def target(self, t: float) -> float:
        return self.peak * self.x


class PeakPlus(OnlineRule):
    label = "max so far + A GiB (growth headroom in bytes)"

    def target(self, t: float) -> float:
        return self.peak + self.x * GiB


class FloorPlusGrowth(OnlineRule):
    label = "steady floor + (max - floor) x k"

    def target(self, t: float) -> float:
        return self.floor + (self.peak - self.floor) * self.x


class DecayedPeak(OnlineRule):
    label = "decayed peak (24 h half-life) x k, shrinking slowly"

    def target(self, t: float) -> float:
        assert self.last_t is not None
        return self.decayed * 2 ** (-(t - self.last_t) / 86_400) * self.x


def budgeted(pods: dict[str, Pod], make: Callable[[], OnlineRule], margin: float = 0.15) -> Limits:
    """The limit in force at each sample for a candidate model under topoplace's change rules:
    the first limit at the second sample; grow when the target is above the limit, shrink when
    it is under ``(1 - margin)`` of it with two changes of the day's budget left; at most
    ``MAX_CHANGES`` in any 24 h; an OOM (usage above the limit) raises it to 1.2 x the usage at
    once, budget or not."""
    out: Limits = {}
    for k, p in pods.items():
        rule, limit, changes, lim = make(), None, deque[float](), []
        for i, (t, v) in enumerate(zip(p.t, p.used, strict=True)):
            if i > 0:
                tgt = rule.target(t)
                while changes and changes[0] <= t - 86_400:
                    changes.popleft()
                left = MAX_CHANGES - len(changes)
                if limit is None:
                    limit = tgt
                elif (tgt > limit and left >= 1) or (tgt < limit * (1 - margin) and left >= 2):
                    limit = tgt
                    changes.append(t)
            lim.append(limit if limit is not None else v)
            if limit is not None and v > limit:
                limit = 1.2 * v
            rule.observe(t, v)
        out[k] = lim
    return out


class FleetPeakPrior(OnlineRule):
    label = "max(max so far x 1.1, fleet's peaks so far at quantile q)"

    def target(self, t: float) -> float:
        assert self.fleet is not None
        return max(self.peak * 1.1, self.fleet.peak(t, self.x))


class FleetGrowthPrior(OnlineRule):
    label = "max so far + fleet's jumps above a peak at quantile q"

    def target(self, t: float) -> float:
        assert self.fleet is not None
        return self.peak + self.fleet.jump(t, self.x)


CANDIDATES: tuple[tuple[type[OnlineRule], tuple[float, ...], str], ...] = (
    (PeakTimes, (1.2, 1.3, 1.4, 1.5, 1.6), "k"),
    (PeakPlus, (8.0, 10.0, 12.0, 14.0, 16.0), "A"),
    (FloorPlusGrowth, (1.3, 1.5, 1.7, 1.9, 2.1), "k"),
    (DecayedPeak, (1.3, 1.4, 1.5, 1.6, 1.7), "k"),
    (FleetPeakPrior, (0.5, 0.75, 0.9, 1.0), "q"),
    (FleetGrowthPrior, (0.5, 0.9, 0.99, 1.0), "q"),
)


def oracle_piecewise(
    pods: dict[str, Pod], warmup_s: float, segments: int = 5, block: int = 5
) -> float:
    """Reserved / used of the hindsight optimum that may change each pod's limit
    ``segments - 1`` times in its scored span (4: the whole day's budget; the span is under a
    day), with no margin: a lower bound for any online model (limits constant over blocks of
    ``block`` samples, so it is slightly above the exact bound)."""
    reserved = used = 0.0
    for p in pods.values():
        u = [v for t, v in zip(p.t, p.used, strict=True) if t >= p.t[0] + warmup_s]
        if not u:
            continue
        bm = [max(u[i : i + block]) for i in range(0, len(u), block)]
        bl = [len(u[i : i + block]) for i in range(0, len(u), block)]
        n = len(bm)
        cum = [0]
        for x in bl:
            cum.append(cum[-1] + x)
        prev = [0.0] + [math.inf] * n
        best = math.inf
        for _ in range(segments):
            cur = [math.inf] * (n + 1)
            for j in range(1, n + 1):
                mx = 0.0
                for i in range(j - 1, -1, -1):
                    mx = max(mx, bm[i])
                    c = prev[i] + mx * (cum[j] - cum[i])
                    if c < cur[j]:
                        cur[j] = c
            prev = cur
            best = min(best, cur[n])
        reserved += best
        used += sum(u)
    return reserved / used


def ooms_with_budget_spent(
    pods: dict[str, Pod], limits: Limits, warmup_s: float
) -> tuple[int, int]:
    """(scored OOM samples that came with ``MAX_CHANGES`` limit changes already made in the
    24 h before, all scored OOM samples)."""
    spent = total = 0
    for k, p in pods.items():
        lim = limits[k]
        changes = [p.t[i] for i in range(1, len(lim)) if lim[i] != lim[i - 1]]
        for i, (t, v) in enumerate(zip(p.t, p.used, strict=True)):
            if t >= p.t[0] + warmup_s and v > lim[i]:
                total += 1
                lo, hi = bisect.bisect_right(changes, t - 86_400), bisect.bisect_left(changes, t)
                spent += hi - lo >= MAX_CHANGES
    return spent, total


def generalisation(samples: list[Sample], warmup_s: float) -> list[str]:
    """Candidate models tuned on one half of the pods and scored on the other (see the
    module docstring): each candidate's parameter is the one with the fewest OOM samples on
    the tuning half, then the least reserved."""
    pods = pods_of(samples)
    halves = {h: {k: p for k, p in pods.items() if split_of(k) == h} for h in ("tune", "held-out")}

    def fig(lim: Limits, h: str, modes: dict[str, list[str]] | None = None) -> Score:
        sub = halves[h]
        return score(sub, {k: lim[k] for k in sub}, warmup_s, modes and {k: modes[k] for k in sub})

    def cell(s: Score) -> str:
        return f"{s.ooms} ({s.oom_pods}) at {s.ratio:.2f}x, {s.changes_per_day:.2f}/day"

    out = [
        f"Pods split by the parity of SHA-256 of their name: {len(halves['tune'])} to tune, "
        f"{len(halves['held-out'])} held out. Each candidate runs under topoplace's change rules "
        "(4 a day, shrink with 2 left, OOM raise x1.2 at once); its parameter is chosen on the "
        "tuning half (fewest OOM samples, then least reserved), the held-out half is scored "
        "with it. Cells: OOM samples (pods) at reserved / used, changes / pod / day.",
        "",
        "| model | grid | chosen on tune | tune | held-out |",
        "|---|---|---:|---:|---:|",
    ]
    fleet = FleetStats(pods)
    lim, modes = topoplace(samples, pods, PolicySet())
    out.append(
        f"| topoplace (defaults, not tuned here) | - | - | {cell(fig(lim, 'tune', modes))} "
        f"| {cell(fig(lim, 'held-out', modes))} |"
    )
    spent = total = 0
    for cls, grid, name in CANDIDATES:
        runs = [(x, budgeted(pods, lambda x=x, cls=cls: cls(x, fleet))) for x in grid]
        x, best = min(runs, key=lambda r: (fig(r[1], "tune").ooms, fig(r[1], "tune").ratio))
        n_spent, n_all = ooms_with_budget_spent(pods, best, warmup_s)
        spent, total = spent + n_spent, total + n_all
        out.append(
            f"| {cls.label} | {name} in {', '.join(f'{g:g}' for g in grid)} | {name} = {x:g} "
            f"| {cell(fig(best, 'tune'))} | {cell(fig(best, 'held-out'))} |"
        )
    needed_k = needed_a = 0.0
    for p in pods.values():
        m = p.used[0]
        for t, v in zip(p.t[1:], p.used[1:], strict=True):
            if t >= p.t[0] + warmup_s and m > 0:
                needed_k, needed_a = max(needed_k, v / m), max(needed_a, v - m)
            m = max(m, v)
    k_all = score(pods, max_so_far(needed_k)(pods), warmup_s)
    a_all = score(
        pods,
        {k: [x + needed_a for x in lim_] for k, lim_ in max_so_far(1.0)(pods).items()},
        warmup_s,
    )
    out += [
        "",
        f"- With hindsight over all pods and no change budget: the smallest factor on the "
        f"maximum so far with 0 OOM is x{needed_k:.2f} ({k_all.ratio:.2f}x reserved); the "
        f"smallest headroom in bytes is {needed_a / GiB:.1f} GiB ({a_all.ratio:.2f}x). Both "
        "are tuned on the answer and still above 1.8x.",
        f"- The hindsight optimum with 4 changes in the scored span and no margin reserves "
        f"{oracle_piecewise(pods, warmup_s):.2f}x: the budget alone does not forbid the goal, "
        "foresight does. The bursts (a pod's hourly maximum jumping from about 24 to 44 GiB for "
        "an hour, then back) come without warning in the pod's own series or the fleet's, so "
        "a limit with 0 OOM must hold the burst level all day.",
        f"- Of the chosen candidates' {total} OOM samples, {spent} came when the pod had "
        "already made its 4 changes of the last 24 h (for the max-so-far rules all four in "
        "the first 3.5 hours, following the start-up growth closely), so a later burst could "
        "not be followed. topoplace's "
        "short-history widening starts wide and spends about one change a day.",
        "- Conclusion: on this half, 0 OOM at 1.8x or less is not reached by any model here "
        "without tuning on the answer; topoplace keeps 0 OOM on both halves at 2.30x / 2.39x, "
        "and the tuned candidates that reserve 1.8-2.1x have OOM samples on both halves.",
    ]
    return out


POLICY_ORDER = ("whole-gpu", "vpa-recipe", "max-x1.3", "max-x1.2", "hindsight-max", "topoplace")


def evaluate(
    name: str, samples: list[Sample], warmup_s: float, policies: PolicySet
) -> dict[str, Score]:
    """Every policy's score on one input."""
    pods = pods_of(samples)
    out: dict[str, Score] = {}
    out["whole-gpu"] = score(pods, whole_gpu(pods), warmup_s)
    out["vpa-recipe"] = score(pods, vpa_recipe(pods), warmup_s)
    out["max-x1.3"] = score(pods, max_so_far(1.3)(pods), warmup_s)
    out["max-x1.2"] = score(pods, max_so_far(1.2)(pods), warmup_s)
    out["hindsight-max"] = score(pods, hindsight(pods), warmup_s)
    lim, modes = topoplace(samples, pods, policies)
    out["topoplace"] = score(pods, lim, warmup_s, modes)
    return out


def validation(samples: list[Sample], warmup_s: float) -> list[str]:
    """The issue's figures for the simple rules, recomputed with their variants."""
    pods = pods_of(samples)
    whole_all = score(pods, whole_gpu(pods), 0.0).ratio
    per_pod = []
    for p in pods.values():
        sc = [(t, v) for t, v in zip(p.t, p.used, strict=True) if t >= p.t[0] + warmup_s]
        if sc:
            m = max(v for _, v in sc)
            per_pod.append(m * len(sc) / sum(v for _, v in sc))
    per_pod.sort()
    med = (
        per_pod[len(per_pod) // 2]
        if len(per_pod) % 2
        else sum(per_pod[len(per_pod) // 2 - 1 : len(per_pod) // 2 + 1]) / 2
    )
    return [
        f"- one whole GPU per pod over all samples (no warm-up): {whole_all:.2f}x (issue: 3.44x)",
        f"- hindsight static max of the scored span, median over pods of each pod's ratio: {med:.2f}x"
        " (issue: 1.53x); pooled over pods (the table's definition, the max of the whole trace): see table",
    ]


def late_peaks(samples: list[Sample], warmup_s: float) -> list[str]:
    """Why the 1.8x goal is hard on this input: how far peaks after the warm-up go beyond
    those before it, and what max-so-far x1.1 gives (computed, not quoted)."""
    pods = pods_of(samples)
    worst = (0.0, 0.0, 0.0)
    for p in pods.values():
        pre = [v for t, v in zip(p.t, p.used, strict=True) if t < p.t[0] + warmup_s]
        post = [v for t, v in zip(p.t, p.used, strict=True) if t >= p.t[0] + warmup_s]
        if pre and post and max(pre) > 0:
            worst = max(worst, (max(post) / max(pre), max(pre), max(post)))
    x11 = score(pods, max_so_far(1.1)(pods), warmup_s)
    return [
        f"- The goal is 0 OOM at 1.8x or less. The hindsight static maximum itself reserves "
        f"{score(pods, hindsight(pods), warmup_s).ratio:.2f}x; after the warm-up, peaks reach up to "
        f"{worst[0]:.2f}x the largest peak of a pod's first {warmup_s / 3600:g} hours "
        f"({worst[1] / GiB:.1f} -> {worst[2] / GiB:.1f} GiB); max-so-far x1.1 has {x11.ooms} OOM "
        f"samples at {x11.ratio:.2f}x. Zero OOM at 1.8x would need limits within about 1.1x of "
        "peaks not yet seen: topoplace keeps zero OOM and reserves more.",
    ]


def sensitivity(samples: list[Sample], warmup_s: float) -> list[str]:
    """topoplace with each parameter moved to a neighbouring value: how much the figures
    depend on the choice."""
    pods = pods_of(samples)
    base = Params()
    variants = [
        ("defaults", base),
        ("margin 0.10", replace(base, margin=0.10)),
        ("margin 0.20", replace(base, margin=0.20)),
        ("widening 1.10 at a day", replace(base, confidence_exponent=math.log2(1.10))),
        ("widening 1.20 at a day", replace(base, confidence_exponent=math.log2(1.20))),
        ("horizon 12 h", replace(base, horizon_s=43_200.0)),
    ]
    out = [
        "| topoplace parameters | reserved / used | OOM samples (pods) | changes / pod / day |",
        "|---|---:|---:|---:|",
    ]
    for name, params in variants:
        lim, modes = topoplace(samples, pods, PolicySet(), params)
        sc = score(pods, lim, warmup_s, modes)
        out.append(
            f"| {name} | {sc.ratio:.2f}x | {sc.ooms} ({sc.oom_pods}) | {sc.changes_per_day:.2f} |"
        )
    return out


def render(
    results: dict[str, dict[str, Score]], conditions: dict[str, str], extra: list[str], command: str
) -> tuple[str, list[list[str]]]:
    """Markdown and CSV rows."""
    md = [
        "# GPU share right-sizer: evaluation",
        "",
        f"Command: `{command}` (module docstring of `benchmarks/rightsize.py` for every definition).",
        "",
    ]
    csv_rows = [
        [
            "input",
            "policy",
            "gpus_needed",
            "reserved_over_used",
            "oom_samples",
            "oom_pods",
            "guard_breaches",
            "changes_per_pod_day",
            "max_changes_any_24h",
            "warmup_s",
            "command",
        ]
    ]
    for name, res in results.items():
        md += [f"## {name}", "", conditions[name], ""]
        md += [
            "| policy | GPUs needed | reserved / used | OOM samples (pods) | guard breaches | changes / pod / day | max changes in 24 h |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for pol in POLICY_ORDER:
            s = res[pol]
            gb = str(s.guard_breaches) if name.startswith("azure") else "n/a"
            md.append(
                f"| {pol} | {s.gpus} | {s.ratio:.2f}x | {s.ooms} ({s.oom_pods}) | {gb} | {s.changes_per_day:.2f} | {s.max_changes_24h} |"
            )
            csv_rows.append(
                [
                    name,
                    pol,
                    str(s.gpus),
                    f"{s.ratio:.4f}",
                    str(s.ooms),
                    str(s.oom_pods),
                    gb,
                    f"{s.changes_per_day:.3f}",
                    str(s.max_changes_24h),
                    str(WARMUP[name]),
                    command,
                ]
            )
        md.append("")
    md += extra
    return "\n".join(md) + "\n", csv_rows


def add_arguments(parser: Any) -> None:
    """The benchmark's own flags (a parser or an argument group). ``--out`` is the runner's
    common flag (``topoplace bench rightsize --out DIR``) or, standalone, added by
    :func:`main` with ``benchmarks/results`` as default."""
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument(
        "--only", choices=("genai", "azure"), help="one input only (printed, no files written)"
    )


def run(args: argparse.Namespace) -> int:
    """Evaluate, print the table, write ``rightsize.md`` / ``rightsize.csv`` into ``args.out``
    (full runs only). Returns the exit status."""
    t0 = time.perf_counter()
    results: dict[str, dict[str, Score]] = {}
    conditions: dict[str, str] = {}
    extra: list[str] = []
    if args.only in (None, "genai"):
        g = genai_series(args.data)
        npods = len({s.pod for s in g})
        results["genai"] = evaluate("genai", g, WARMUP["genai"], PolicySet())
        conditions["genai"] = (
            f"Alibaba GenAI 2026, shared half: {npods} pods with GPU series, one workload each, "
            "one sample / 57 s for 22.8 h; scored after 6 h from each pod's first sample; default policy. "
            "Guard breaches n/a: this half holds no latency or queue series."
        )
        extra += ["## Validation against the issue's figures (GenAI)", ""]
        extra += [
            "- max so far x1.3 and x1.2 (table rows): the issue's 1 OOM sample / 2.11x and 9 / 1.95x "
            "are reproduced with the limit from samples strictly before, warm-up from each pod's first sample, "
            "reserved / used pooled over all scored samples (2.117x, 1.954x: the issue truncates)."
        ]
        extra += validation(g, 6 * 3600)
        extra += [
            "",
            "## Reading the GenAI table",
            "",
            *late_peaks(g, 6 * 3600),
            "- GPUs needed is the busiest instant: with limits above 40 GiB no two of these pods "
            "share an 80 GiB GPU, so GPU count follows the limits only once they fall under half "
            "a GPU.",
            "- The recommender's parameters are VPA's (15 % margin, 24 h horizon and half-life, "
            "x1.2 OOM bump, confidence from history length), the exponent log2(1.15) (the "
            "short-history widening equals the margin at one day) and the 4-a-day budget. The "
            "exponent, and the rules (when compute alone may change a pod, when a limit is "
            "exclusive), were chosen while looking at this half: a smaller exponent has OOM "
            "samples here (see Sensitivity). The split below scores them on pods they were not "
            "tuned on.",
            "",
            "## Can 0 OOM at 1.8x be reached? Candidate models, tuned on half the pods (GenAI)",
            "",
            *generalisation(g, WARMUP["genai"]),
        ]
        extra += ["", "## Sensitivity (GenAI)", "", *sensitivity(g, WARMUP["genai"]), ""]
    if args.only in (None, "azure"):
        a = azure_series(args.data)
        guard = PolicySet(Policy(guard=Guard(REQUESTS_WAITING, 0.0), model_weights_bytes=WEIGHTS))
        results["azure"] = evaluate("azure", a, WARMUP["azure"], guard)
        conditions["azure"] = (
            f"Azure LLM inference 2023 (code, conv), each dealt round-robin to {REPLICAS} Llama-3-8B bf16 "
            f"servers (weights {WEIGHTS / GiB:.2f} GiB + {OVERHEAD / GiB:.1f} GiB overhead + 128 KiB per token in flight; "
            f"batch <= {MAX_BATCH}, prefill {PREFILL_TOK_S:.0f} tok/s, {TPOT_S * 1000:.0f} ms per output token); "
            f"one sample / {SAMPLE_S} s (the scrape's max) for the ~1 h trace; scored after 10 min; "
            "topoplace with a guard requests_waiting <= 0 and the policy stating the weights (model_weights). "
            "Changes per day are extrapolated from under an hour."
        )
    md, rows = render(
        results, conditions, extra, "topoplace bench rightsize --out benchmarks/results"
    )
    print(md)
    print(f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    if args.only is None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "rightsize.md").write_text(md, encoding="utf-8")
        with (args.out / "rightsize.csv").open("w", newline="", encoding="utf-8") as fh:
            csv.writer(fh, lineterminator="\n").writerows(rows)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.rightsize``."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.rightsize", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--out",
        type=Path,
        default=REPO / "benchmarks" / "results",
        help="where rightsize.md and rightsize.csv go (default: benchmarks/results)",
    )
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
