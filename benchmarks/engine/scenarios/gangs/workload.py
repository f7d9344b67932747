"""The gang scenario's clusters and its seeded gang workload.

Clusters (real-shaped Node objects from :mod:`benchmarks.clusters`, Topograph labels):

* ``nvl72``: GB200 NVL72 racks, 18 trays x 4 GPUs per rack; one rack = one NVLink domain
  (``nvidia.com/gpu.clique``) = one leaf; 4 racks per spine; one core above the spines.
  Default 8 racks = 576 GPUs. Pods are whole trays (4 GPUs).
* ``h100``: DGX H100 scalable units of 32 nodes (8 GPUs) per leaf, 4 leaves per spine, one
  core. Default 8 SUs = 256 nodes = 2,048 GPUs. Pods are whole nodes (8 GPUs).

The core label is added here (the builders stop at the spine) so that two spines meet at the
``core`` tier of :data:`topology.fabric.DEFAULT_LEVELS` rather than only sharing a zone.

Workload (every number below is derived in code from the files named, or is an assumption
stated as such; :meth:`WorkloadSpec.describe` prints them with each report):

**Gang sizes.** No per-job GPU-count column is available in ``../shared/data``: the Philly
job trace (``philly/README.md``: a Git-LFS pointer only; the flattened copy is held out)
and the Helios job logs (``helios/README.md``: ``cluster_log.csv`` not obtainable) are
absent. What is available is the Helios authors' per-cluster summary,
``../shared/data/helios/helios_cluster_summary.csv`` (Hu et al., SC '21; HeliosArtifact
commit 6345d9f), columns ``avg_gpu_num`` and ``med_gpu_num`` over 1,580,464 GPU jobs (row
``total``: mean 3.716 GPUs, median 1). We model a job's GPU count as ``2**K`` with
``K in 0..9`` (1..512 GPUs) and ``P(K = k)`` proportional to ``r**k`` (geometric in log2
size: every doubling of the size is ``r`` times as likely), fit ``r`` so that the mean equals
``avg_gpu_num`` (``r = 0.456`` for ``total``, which gives ``P(1 GPU) = 0.544``, consistent
with the published median of 1), and draw the gang sizes from this distribution conditioned
on 8 GPUs and more: 8: 54.7 %, 16: 24.9 %, 32: 11.4 %, 64: 5.2 %, 128: 2.4 %, 256: 1.1 %,
512: 0.5 %. Sizes are further truncated (renormalised) at the largest power of two not above
half the cluster's GPUs (NVL72, 576 GPUs: at most 256), because a gang needing nearly the
whole cluster only measures how long the queue starves it (assumption).

**Durations.** Lognormal with the median and mean of the same row (``med_run_time_gpu`` =
206 s, ``avg_run_time_gpu`` = 6,651.7 s): ``mu = ln(median)``,
``sigma = sqrt(2 ln(mean / median)) = 2.64``, capped at 48 h (assumption; the faults
benchmark uses the same cap) and floored at 1 s. The Helios summary does not split run time
by job size, so large and small gangs share one distribution (a limitation). A duration is
the time the job needs with all its GPUs inside one NVLink domain; the engine stretches it
by the locality slowdown (:mod:`benchmarks.engine.locality`).

**Arrivals.** Poisson; the rate gives the offered load ``load`` = arriving GPU-seconds per
second / cluster GPUs, computed with the exact mean of the truncated size distribution and
of the capped lognormal. Arrivals stop after ``jobs`` gangs or ``hours`` hours.

**Topology constraints** (assumption; how Kueue TAS and KAI users ask for topology, with
the annotations ``kueue.x-k8s.io/podset-required-topology`` / ``-preferred-topology``): a
gang that fits in one domain of the cluster's locality level (NVL72: ``nvlink-domain``, 72
GPUs; H100: ``leaf``, 256 GPUs) *requires* that level with probability
``required_share`` (0.5); every other gang *prefers* it with probability
``preferred_share`` (0.5) and has no constraint otherwise.

Everything is drawn from ``random.Random(f"gangsim/{cluster}/{seed}")`` in a fixed order per
gang, so the same (cluster, seed) gives the same gangs whatever the policy.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.engine.jobs import Job

HOUR = 3600.0

DATA_DIR = Path(__file__).resolve().parents[4].parent / "shared" / "data"
"""``<repo>/../shared/data``."""
HELIOS_SUMMARY = DATA_DIR / "helios" / "helios_cluster_summary.csv"
"""Helios per-cluster summary (SC '21; see ``helios/README.md``)."""

MAX_LOG2_SIZE = 9
"""Largest job modelled when fitting the size distribution: 2**9 = 512 GPUs."""
MIN_GANG_GPUS = 8
MAX_GANG_GPUS = 512
DURATION_CAP_S = 48 * HOUR
"""Assumption: longest job (the faults benchmark's cap)."""
DURATION_FLOOR_S = 1.0
CORE_LABEL = "network.topology.nvidia.com/core"


# ---- clusters -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A modelled cluster.

    Attributes:
        name: ``nvl72`` or ``h100``.
        units: NVL72 racks, or DGX H100 scalable units (32 nodes each).
        gpus_per_pod: GPUs per gang member (a whole GB200 tray or DGX node).
        locality_level: the fabric level whose domain is the natural home of a gang
            (required / preferred by the workload).
        domain_gpus: GPUs in one domain of that level.
    """

    name: str
    units: int
    gpus_per_pod: int
    locality_level: str
    domain_gpus: int

    @property
    def report_levels(self) -> tuple[str, ...]:
        """Levels whose domain counts the report shows (rack or SU, spine, node)."""
        return (self.locality_level, "spine", "node")

    @property
    def capacity(self) -> int:
        """GPUs in the cluster."""
        return self.units * self.domain_gpus

    def node_source(self) -> dict[str, Any]:
        """The scenario ``nodes`` entry of this cluster (builders of
        :mod:`benchmarks.clusters`), with a core label on every node."""
        if self.name == "nvl72":
            src: dict[str, Any] = {"nvl72": {"racks": self.units, "leaves_per_spine": 4,
                                             "prefix": "gb200"}}  # fmt: skip
        else:
            src = {"dgx-h100": {"count": self.units * 32, "nodes_per_leaf": 32,
                                "leaves_per_spine": 4, "prefix": "dgx-h100"}}  # fmt: skip
        return {**src, "labels": {CORE_LABEL: f"core-{self.name}"}}

    def nodes(self) -> list[dict[str, Any]]:
        """Node objects (fresh dicts), with a core label on every node."""
        from benchmarks.engine.sources import node_objects

        return node_objects([self.node_source()])

    def describe(self) -> str:
        """One line for the report."""
        if self.name == "nvl72":
            return (
                f"nvl72: {self.units} GB200 NVL72 racks x 18 trays x 4 GPUs = {self.capacity} "
                f"GPUs ({self.units * 18} nodes); rack = NVLink domain = leaf, 4 racks per "
                "spine, one core; pods of 4 GPUs (one tray)"
            )
        return (
            f"h100: {self.units} scalable units x 32 DGX H100 x 8 GPUs = {self.capacity} GPUs "
            f"({self.units * 32} nodes); SU = leaf, 4 leaves per spine, one core; pods of 8 "
            "GPUs (one node)"
        )


def cluster_spec(name: str, units: int | None = None) -> ClusterSpec:
    """The named cluster (``nvl72`` or ``h100``), ``units`` racks / SUs (default 8).

    Raises:
        ValueError: unknown name or non-positive size.
    """
    n = 8 if units is None else int(units)
    if n <= 0:
        raise ValueError("a cluster needs at least one rack / scalable unit")
    if name == "nvl72":
        return ClusterSpec("nvl72", n, 4, "nvlink-domain", 72)
    if name == "h100":
        return ClusterSpec("h100", n, 8, "leaf", 32 * 8)
    raise ValueError(f"unknown cluster {name!r}; known: nvl72, h100")


# ---- trace statistics -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeliosStats:
    """One row of ``helios_cluster_summary.csv`` (the columns we use)."""

    cluster: str
    gpu_jobs: int
    avg_gpu_num: float
    med_gpu_num: float
    avg_run_time_gpu: float
    med_run_time_gpu: float


def helios_stats(cluster: str = "total", path: Path | None = None) -> HeliosStats:
    """Read one row (``Venus``, ``Earth``, ``Saturn``, ``Uranus`` or ``total``).

    Raises:
        FileNotFoundError: the shared data is absent.
        KeyError: no such row.
    """
    p = path or HELIOS_SUMMARY
    with p.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["id"] == cluster:
                return HeliosStats(
                    cluster=cluster,
                    gpu_jobs=int(row["gpu_job_num"]),
                    avg_gpu_num=float(row["avg_gpu_num"]),
                    med_gpu_num=float(row["med_gpu_num"]),
                    avg_run_time_gpu=float(row["avg_run_time_gpu"]),
                    med_run_time_gpu=float(row["med_run_time_gpu"]),
                )
    raise KeyError(f"no row {cluster!r} in {p}")


def _geo_mean_size(r: float, kmax: int) -> float:
    w = [r**k for k in range(kmax + 1)]
    return sum(2**k * x for k, x in enumerate(w)) / sum(w)


def fit_size_ratio(mean_gpus: float, kmax: int = MAX_LOG2_SIZE) -> float:
    """``r`` such that ``2**K``, ``P(K=k)`` ~ ``r**k`` on ``0..kmax``, has mean ``mean_gpus``.

    Raises:
        ValueError: the mean is outside (1, 2**kmax).
    """
    if not 1.0 < mean_gpus < 2**kmax:
        raise ValueError("mean GPU count must lie strictly between 1 and 2**kmax")
    lo, hi = 1e-9, 1e3
    for _ in range(200):  # the mean increases with r: bisection
        mid = (lo + hi) / 2
        if _geo_mean_size(mid, kmax) < mean_gpus:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def size_distribution(
    r: float, min_gpus: int = MIN_GANG_GPUS, max_gpus: int = MAX_GANG_GPUS
) -> tuple[tuple[int, float], ...]:
    """((GPUs, probability), ...) on the powers of two in [min_gpus, max_gpus]."""
    ks = [k for k in range(0, 31) if min_gpus <= 2**k <= max_gpus]
    w = [r**k for k in ks]
    s = sum(w)
    return tuple((2**k, x / s) for k, x in zip(ks, w, strict=True))


def lognormal_params(median: float, mean: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this median and mean (mean > median > 0)."""
    return math.log(median), math.sqrt(2.0 * math.log(mean / median))


def capped_lognormal_mean(mu: float, sigma: float, cap: float) -> float:
    """``E[min(X, cap)]`` for ``X ~ Lognormal(mu, sigma)`` (exact)."""

    def phi(x: float) -> float:
        return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))

    lc = math.log(cap)
    below = math.exp(mu + sigma**2 / 2) * phi((lc - mu - sigma**2) / sigma)
    return below + cap * (1.0 - phi((lc - mu) / sigma))


# ---- workload -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Knobs of the workload (see the module docstring for their sources)."""

    jobs: int = 5000
    hours: float = 48.0
    load: float = 0.85
    required_share: float = 0.5
    preferred_share: float = 0.5
    helios_row: str = "total"
    duration_cap: float = DURATION_CAP_S


@dataclass(frozen=True, slots=True)
class Derived:
    """What the workload derives from the trace for one cluster."""

    stats: HeliosStats
    ratio: float
    sizes: tuple[tuple[int, float], ...]
    mu: float
    sigma: float
    mean_gpus: float
    mean_duration: float
    rate_per_hour: float


def derive(cluster: ClusterSpec, spec: WorkloadSpec, stats: HeliosStats | None = None) -> Derived:
    """Size distribution, duration law and arrival rate of ``spec`` on ``cluster``."""
    st = stats or helios_stats(spec.helios_row)
    r = fit_size_ratio(st.avg_gpu_num)
    top = 2 ** int(math.log2(max(MIN_GANG_GPUS, cluster.capacity // 2)))
    sizes = size_distribution(r, MIN_GANG_GPUS, min(MAX_GANG_GPUS, top))
    mu, sigma = lognormal_params(st.med_run_time_gpu, st.avg_run_time_gpu)
    mean_gpus = sum(g * p for g, p in sizes)
    mean_dur = capped_lognormal_mean(mu, sigma, spec.duration_cap)
    rate = spec.load * cluster.capacity / (mean_gpus * mean_dur)  # gangs per second
    return Derived(st, r, sizes, mu, sigma, mean_gpus, mean_dur, rate * HOUR)


def generate(
    cluster: ClusterSpec, spec: WorkloadSpec, seed: int, stats: HeliosStats | None = None
) -> list[Job]:
    """The seeded gangs of ``spec`` on ``cluster`` (deterministic for a seed): ``pods``
    members of ``gpus_per_pod`` GPUs, ``duration`` s of work when packed."""
    d = derive(cluster, spec, stats)
    rng = random.Random(f"gangsim/{cluster.name}/{seed}")
    rate = d.rate_per_hour / HOUR
    sizes = [g for g, _ in d.sizes]
    cum = []
    acc = 0.0
    for _, p in d.sizes:
        acc += p
        cum.append(acc)
    horizon = spec.hours * HOUR
    out: list[Job] = []
    t = 0.0
    while len(out) < spec.jobs:
        # Fixed draws per gang, whatever branch is taken, so streams stay aligned.
        t += rng.expovariate(rate)
        u_size, u_req, u_pref = rng.random(), rng.random(), rng.random()
        dur = rng.lognormvariate(d.mu, d.sigma)
        if t >= horizon:
            break
        gpus = sizes[_index(cum, u_size)]
        required = preferred = ""
        if gpus <= cluster.domain_gpus and u_req < spec.required_share:
            required = cluster.locality_level
        elif u_pref < spec.preferred_share:
            preferred = cluster.locality_level
        out.append(
            Job(
                name=f"{cluster.name}-{seed}-g{len(out):05d}",
                arrive=t,
                pods=gpus // cluster.gpus_per_pod,
                gpus_per_pod=cluster.gpus_per_pod,
                gang=True,
                duration=min(spec.duration_cap, max(DURATION_FLOOR_S, dur)),
                required=required,
                preferred=preferred,
            )
        )
    return out


def _index(cum: Sequence[float], u: float) -> int:
    for i, c in enumerate(cum):
        if u < c:
            return i
    return len(cum) - 1


def describe(cluster: ClusterSpec, spec: WorkloadSpec, d: Derived) -> list[str]:
    """Lines stating the workload's derivation (for the report)."""
    st = d.stats
    sizes = ", ".join(f"{g}: {p:.1%}" for g, p in d.sizes)
    return [
        f"gang sizes ({cluster.name}): 2**K GPUs, P(K=k) ~ r**k with r = {d.ratio:.4f} fit to "
        f"the mean GPU count of Helios '{st.cluster}' ({st.avg_gpu_num:g} GPUs over "
        f"{st.gpu_jobs:,} GPU jobs; median {st.med_gpu_num:g}), conditioned on >= "
        f"{MIN_GANG_GPUS} GPUs: {sizes} (mean {d.mean_gpus:.1f} GPUs)",
        f"durations: lognormal, median {st.med_run_time_gpu:g} s and mean "
        f"{st.avg_run_time_gpu:g} s of Helios '{st.cluster}' GPU jobs (mu {d.mu:.3f}, sigma "
        f"{d.sigma:.3f}), capped at {spec.duration_cap / HOUR:g} h (mean after cap "
        f"{d.mean_duration:.0f} s)",
        f"arrivals ({cluster.name}): Poisson, {d.rate_per_hour:.2f} gangs/h = offered load "
        f"{spec.load:g} of {cluster.capacity} GPUs; at most {spec.jobs} gangs or "
        f"{spec.hours:g} h",
        f"constraints: gangs of <= {cluster.domain_gpus} GPUs require '{cluster.locality_level}'"
        f" with probability {spec.required_share:g}; the others prefer it with probability "
        f"{spec.preferred_share:g} (assumption)",
    ]


def arrivals(
    params: Mapping[str, Any], run: Any, nodes: Sequence[Mapping[str, Any]], inp: Any
) -> list[Job]:
    """The ``helios-gangs`` arrivals generator of the engine's scenario files
    (:data:`benchmarks.engine.sources.GENERATORS`): ``cluster`` (a :func:`cluster_spec`
    name), optional ``units`` and :class:`WorkloadSpec` fields; records the cluster and the
    spec in ``inp.info`` (``cluster``, ``workload_spec``) for the gang report."""
    p = dict(params)
    cl = cluster_spec(str(p.pop("cluster")), p.pop("units", None))
    inp.info["cluster"] = cl
    inp.info["workload_spec"] = WorkloadSpec(**p)
    return generate(cl, inp.info["workload_spec"], run.seed)
