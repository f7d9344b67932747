"""Locality model: how much slower a gang runs for the way its GPUs are spread.

Calibrated on measured data: ``../shared/data/pollux-placement-throughput/<model>_placements.csv``
(Qiao et al., "Pollux", OSDI '21; petuum/adaptdl commit de25dcc, ``simulator/traces/<model>/
placements.csv``), columns ``placement`` (GPUs used on each node, one digit per node),
``local_bsz`` (per-GPU batch size) and ``step_time`` (seconds per iteration), for six real
training jobs: bert, cifar10, deepspeech2, imagenet, ncf, yolov3.

Which measurements. The clusters modelled here are rail-optimised: every GPU has its own
400 Gb/s NIC (DGX H100: 8 ConnectX-7 for 8 GPUs; GB200 tray: 4 for 4), so traffic leaving an
NVLink domain never shares a NIC. The Pollux testbed placements with one GPU per node
(``11``, ``111``, ``1111``) are the measured analogue (one NIC per GPU); placements with
several GPUs per node on that PCIe testbed share one NIC and are *slower* than the spread
ones (``22`` vs ``1111``; see the data README), an effect that does not exist on our
fabrics, so they are not used for the fit. "Packed" is the same number of GPUs on one node
(``2``, ``3``, ``4``).

The fit, per model m (done in :func:`fit_model`):

* ``ratio(m, k, b) = step_time(placement = "1" * k, local_bsz = b) /
  step_time(placement = str(k), local_bsz = b)`` for k = 2, 3, 4 (the spread range that was
  measured) and every batch size b measured for both placements;
* ``spread[m]`` = median of all those ratios (over k and b) = the least-absolute-deviation
  fit of a constant (robust to the few smallest batch sizes, where communication dominates
  and ratios reach 2-2.6). A constant in k because a ring all-reduce across k nodes moves
  ``2 (k - 1) / k`` of the gradients through each NIC, which changes by at most 1.5x between
  k = 2 and 4, and the data show no monotone trend in k (bert: 1.96, 1.63, 1.77, medians over
  batch sizes); values below 1 are clamped to 1;
* ``cap[m]`` = the largest slowdown measured for the model at all: the maximum over every
  multi-node placement of at most 4 GPUs of the median (over batch sizes) ratio to the
  packed placement of the same GPU count (bert: ``22`` vs ``4``, 2.83).

The slowdown of a placement (:meth:`LocalityModel.slowdown`):

* all GPUs inside one NVLink domain (one DGX H100 node, or any trays of one NVL72 rack):
  1 (the durations are packed run times);
* spread over several NVLink domains ("islands") whose slowest ring hop is ``B`` GB/s:
  ``mean over models of min(cap[m], 1 + (spread[m] - 1) * B_leaf / B)``. With every island
  under one leaf (``B = B_leaf``, 50 GB/s per GPU in ``topology.fabric``) this is the
  measured spread factor; a ring through a spine (25 GB/s) or the core (12.5 GB/s) scales
  the measured communication overhead by the bandwidth ratio (ASSUMPTION: communication time
  inversely proportional to the bottleneck bandwidth; the tier bandwidths above the leaf are
  the fabric's assumed oversubscription), capped at the measured range so the model never
  predicts a slowdown worse than one observed. The number of islands beyond 2 does not
  change the factor (the fit is constant in k, and counts above the measured 4 nodes are
  not extrapolated).

Caveat: the testbed (T4 GPUs on PCIe, per the data README, unverified) has a different
compute/communication balance from GB200 or H100 clusters; the model transfers the measured
*relative* cost of leaving the node, not absolute times.
"""

from __future__ import annotations

import csv
import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scheduler.core.gang import NVLINK_LEVEL
from scheduler.core.objects import HOSTNAME_LEVEL
from scheduler.core.params import SchedParams
from scheduler.core.schedule import Assignment
from scheduler.core.snapshot import ClusterSnapshot
from topology.fabric import Fabric

POLLUX_DIR = (
    Path(__file__).resolve().parents[2].parent / "shared" / "data" / "pollux-placement-throughput"
)
"""``<repo>/../shared/data/pollux-placement-throughput``."""
MODELS: tuple[str, ...] = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
SPREAD_KS: tuple[int, ...] = (2, 3, 4)
"""Spread widths measured with one GPU per node and a packed counterpart."""
MAX_MEASURED_GPUS = 4
"""Largest packed placement in the data (4 GPUs per node)."""
REFERENCE_LEVEL = "leaf"
"""The fabric tier the Pollux testbed's network stands for (one switch between nodes)."""

StepTable = Mapping[str, Mapping[int, float]]
"""placement -> local_bsz -> step_time."""


def load_steps(model: str, directory: Path | None = None) -> dict[str, dict[int, float]]:
    """``placement -> local_bsz -> step_time`` from ``<model>_placements.csv``.

    Raises:
        FileNotFoundError: the shared data is absent.
    """
    path = (directory or POLLUX_DIR) / f"{model}_placements.csv"
    out: dict[str, dict[int, float]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            out.setdefault(row["placement"], {})[int(row["local_bsz"])] = float(row["step_time"])
    return out


def ratios(steps: StepTable, placement: str, packed: str) -> list[float]:
    """``step_time(placement, b) / step_time(packed, b)`` for every shared batch size b
    (ascending b)."""
    a, p = steps.get(placement, {}), steps.get(packed, {})
    return [a[b] / p[b] for b in sorted(set(a) & set(p))]


@dataclass(frozen=True, slots=True)
class ModelFit:
    """The calibrated numbers of one model (see the module docstring).

    Attributes:
        model: model name.
        spread: fitted slowdown of leaving the node (>= 1).
        per_k: median ratio over batch sizes for each spread width k (for the report).
        cap: largest median slowdown measured for any multi-node placement.
        cap_placement: the placement where ``cap`` was measured.
        samples: ratios that entered the fit.
    """

    model: str
    spread: float
    per_k: Mapping[int, float]
    cap: float
    cap_placement: str
    samples: int


def fit_model(model: str, steps: StepTable) -> ModelFit:
    """Fit one model's spread factor and cap (see the module docstring).

    Raises:
        ValueError: the table lacks every spread/packed pair.
    """
    every: list[float] = []
    per_k: dict[int, float] = {}
    for k in SPREAD_KS:
        rs = ratios(steps, "1" * k, str(k))
        if rs:
            per_k[k] = statistics.median(rs)
            every += rs
    if not every:
        raise ValueError(f"{model}: no spread/packed pairs")
    spread = max(1.0, statistics.median(every))
    cap, cap_p = spread, "1" * SPREAD_KS[0]
    for p in sorted(steps):
        g = sum(int(c) for c in p)
        if len(p) < 2 or g > MAX_MEASURED_GPUS:
            continue
        rs = ratios(steps, p, str(g))
        if rs and statistics.median(rs) > cap:
            cap, cap_p = statistics.median(rs), p
    return ModelFit(model, spread, per_k, cap, cap_p, len(every))


@dataclass(frozen=True, slots=True)
class PlacementProfile:
    """How a placed gang is spread.

    Attributes:
        nodes: nodes used.
        gpus_per_node: GPUs used on each node, ascending.
        islands: NVLink domains used (a node without an NVLink-domain label is its own).
        domains: distinct domains per fabric level (unlabelled nodes count one each), and
            nodes under ``node``.
        bottleneck_gbps: ring all-reduce bottleneck of the placement
            (:meth:`topology.fabric.Fabric.collective_bandwidth`).
    """

    nodes: int
    gpus_per_node: tuple[int, ...]
    islands: int
    domains: Mapping[str, int]
    bottleneck_gbps: float


def profile(
    snap: ClusterSnapshot, assignments: Sequence[Assignment], fabric: Fabric
) -> PlacementProfile:
    """The spread of ``assignments`` on ``snap`` (nodes must exist in ``snap``)."""
    per_node: dict[str, list[int]] = {}
    for a in assignments:
        per_node.setdefault(a.node, []).extend(a.gpus)
    names = sorted(per_node)
    infos = [snap.nodes[snap.index[n]] for n in names]
    domains: dict[str, int] = {}
    for i, lv in enumerate(fabric.levels):
        seen = {
            nd.fabric_path[i] if nd.fabric_path[i] is not None else "\0" + nd.name for nd in infos
        }
        domains[lv.name] = len(seen)
    domains[HOSTNAME_LEVEL] = len(names)
    members = [(nd.fabric_path, nd.shape, tuple(sorted(per_node[nd.name]))) for nd in infos]
    return PlacementProfile(
        nodes=len(names),
        gpus_per_node=tuple(sorted(len(per_node[n]) for n in names)),
        islands=domains.get(NVLINK_LEVEL, len(names)),
        domains=domains,
        bottleneck_gbps=float(fabric.collective_bandwidth(members)),
    )


@dataclass(frozen=True, slots=True)
class LocalityModel:
    """Slowdown of a placement, from per-model fits (see the module docstring)."""

    fits: tuple[ModelFit, ...]
    reference_gbps: float

    @property
    def mean_spread(self) -> float:
        """The slowdown of a gang spread over islands under one leaf."""
        return sum(f.spread for f in self.fits) / len(self.fits)

    def slowdown(self, islands: int, bottleneck_gbps: float) -> float:
        """Factor >= 1 on a gang's packed duration."""
        if islands <= 1:
            return 1.0
        scale = self.reference_gbps / bottleneck_gbps if bottleneck_gbps > 0 else math.inf
        scale = max(1.0, scale)
        vals = [min(f.cap, 1.0 + (f.spread - 1.0) * scale) for f in self.fits]
        return max(1.0, sum(vals) / len(vals))

    def of(self, p: PlacementProfile) -> float:
        """Slowdown of a profiled placement."""
        return self.slowdown(p.islands, p.bottleneck_gbps)

    def describe(self) -> list[str]:
        """Markdown table rows of the per-model fit."""
        rows = [
            "| model | 11 vs 2 | 111 vs 3 | 1111 vs 4 | fitted spread | cap (placement) | ratios |",
            "|---|---|---|---|---|---|---|",
        ]
        for f in self.fits:
            ks = " | ".join(f"{f.per_k[k]:.2f}" if k in f.per_k else "n/a" for k in SPREAD_KS)
            rows.append(
                f"| {f.model} | {ks} | {f.spread:.3f} | {f.cap:.2f} ({f.cap_placement}) | "
                f"{f.samples} |"
            )
        rows.append(
            f"| **mean** | | | | **{self.mean_spread:.3f}** | | "
            f"{sum(f.samples for f in self.fits)} |"
        )
        return rows


@functools.lru_cache(maxsize=1)
def model() -> LocalityModel:
    """The model calibrated for the default fabric (once per process).

    Raises:
        FileNotFoundError: the shared data is absent.
    """
    return calibrate(SchedParams().fabric)


def calibrate(fabric: Fabric, directory: Path | None = None) -> LocalityModel:
    """Fit every model from the Pollux CSVs; reference bandwidth from ``fabric``'s leaf tier.

    Raises:
        FileNotFoundError: the shared data is absent.
    """
    fits = tuple(fit_model(m, load_steps(m, directory)) for m in MODELS)
    ref = fabric.levels[fabric.level_index(REFERENCE_LEVEL)].bandwidth_gbps
    return LocalityModel(fits, float(ref))
