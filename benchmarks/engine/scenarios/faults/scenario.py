"""The failure-injection scenario: cluster, workload, failure rates and their sources.

Everything here is data plus seeded generators (the ``llama3-gangs`` arrival and ``llama3``
fault generators of scenario files, :mod:`benchmarks.engine.sources`); the one engine
(:mod:`benchmarks.engine`) runs it and :mod:`benchmarks.engine.scenarios.faults.metrics` accounts for it.

Failure rates (per hour) come from Meta's Llama 3 report, the largest published census of
failures in one synchronous training job:

    A. Grattafiori et al. (Meta), "The Llama 3 Herd of Models", arXiv:2407.21783, 2024,
    section 3.3.4 "Reliability and Operational Challenges" and Table 5. The 405B
    pre-training ran on 16,384 H100 GPUs (2,048 eight-GPU Grand Teton servers); a 54-day
    snapshot had 466 job interruptions, 47 planned and 419 unexpected; 58.7 % of the
    unexpected ones were GPU issues, 54 (12.9 %) software bugs. Table 5 lists the GPU
    categories: faulty GPU 148, GPU HBM3 memory 72, GPU SRAM memory 19, GPU system
    processor 17 (plus smaller NVLink / thermal / SDC rows).

Derivation (see :func:`llama3_rates`):

* GPU-related interruptions: 0.587 x 419 = 246 over 16,384 GPUs x 1,296 h
  -> 1.16e-5 per GPU-hour (one per GPU every ~9.9 years).
* Node-level (host, network, NIC, storage, power, maintenance) interruptions: the rest
  minus software bugs: 419 - 246 - 54 = 119 over 2,048 servers x 1,296 h
  -> 4.48e-5 per node-hour (one per server every ~2.5 years). GB200 trays are charged
  the same per-node rate.
* Which GPU faults stay GPU-local: memory faults (HBM3 72 + SRAM 19 = 91) out of the four
  large GPU categories (256) -> 35 % are contained to one GPU (row remap / GPU reset: the
  device plugin or DRA driver marks that device unhealthy, the node keeps serving the
  other GPUs); the other 65 % need the node (XID 79 "fallen off the bus" and similar:
  NVSentinel raises a fatal ``GpuXidError`` condition and cordons the node).

Assumptions the report does not give (each is a parameter, stated in the output):

* repair times (exponential means): GPU-local 24 h (reset or RMA), node-level GPU fault
  4 h (NVSentinel drain + remediation), host fault 2 h (reboot);
* detection: kube-controller-manager marks a node NotReady after its 40 s
  ``node-monitor-grace-period``; NVSentinel's condition and cordon 30 s; DRA device
  taint 10 s; a job notices the failure of one of its pods and is re-queued 5 min after
  the fault (NCCL / elastic-agent timeouts);
* early warning: 30 % of GPU faults are preceded, over 30 min, by three non-fatal XIDs
  (DRA ``gpu.nvidia.com/xid`` taints with effect None, e.g. XID 94/63 before a row-remap
  failure); 20 % of host faults by a stalled kubelet (Ready but ``lastHeartbeatTime``
  frozen) for 30 min;
* flapping: 2 % of nodes flap, down 10 min every 8 h on average (the OPT-175B logbook,
  Zhang et al. 2022, and ByteDance's MegaScale, Jiang et al., NSDI '24, both describe
  machines that fail repeatedly and return to the pool; neither publishes a rate);
* training jobs checkpoint every hour and lose 10 min to restart (launch + checkpoint
  load); a job placed on hardware that is already broken crashes after 5 min.

``rate_multiplier`` scales the failure rates (the tables report 1x, the published rate,
and an accelerated 10x, which gives more failures per simulated day on a small cluster).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.engine.health import GpuFault, Outage
from benchmarks.engine.jobs import Job
from scheduler.core.objects import node_gpus

HOUR = 3600.0
DAY = 24 * HOUR

# Llama 3 (arXiv:2407.21783), section 3.3.4 / Table 5.
LLAMA3_GPUS = 16_384
LLAMA3_SERVERS = 2_048
LLAMA3_DAYS = 54
LLAMA3_UNEXPECTED = 419
LLAMA3_GPU_SHARE = 0.587
LLAMA3_SOFTWARE_BUGS = 54
LLAMA3_GPU_CATEGORIES = {"faulty GPU": 148, "GPU HBM3 memory": 72, "GPU SRAM memory": 19,
                         "GPU system processor": 17}  # fmt: skip


def llama3_rates() -> tuple[float, float, float]:
    """(GPU faults per GPU-hour, node faults per node-hour, GPU-local share) from Llama 3."""
    hours = LLAMA3_DAYS * 24
    gpu_events = LLAMA3_UNEXPECTED * LLAMA3_GPU_SHARE
    node_events = LLAMA3_UNEXPECTED - round(gpu_events) - LLAMA3_SOFTWARE_BUGS
    c = LLAMA3_GPU_CATEGORIES
    local = (c["GPU HBM3 memory"] + c["GPU SRAM memory"]) / sum(c.values())
    return gpu_events / (LLAMA3_GPUS * hours), node_events / (LLAMA3_SERVERS * hours), local


@dataclass(frozen=True, slots=True)
class Scenario:
    """All knobs of one failure-injection run (durations in seconds)."""

    days: float = 60.0
    racks: int = 4
    dgx_nodes: int = 64
    load: float = 0.8
    rate_multiplier: float = 1.0
    gpu_local_share: float = field(default_factory=lambda: llama3_rates()[2])
    repair_gpu_local: float = 24 * HOUR
    repair_gpu_node: float = 4 * HOUR
    repair_host: float = 2 * HOUR
    detect_not_ready: float = 40.0
    detect_nvsentinel: float = 30.0
    detect_dra: float = 10.0
    requeue_delay: float = 300.0
    warn_share_gpu: float = 0.3
    warn_share_host: float = 0.2
    warn_lead: float = 1800.0
    warn_xids: int = 3
    flap_share: float = 0.02
    flap_down: float = 600.0
    flap_every: float = 8 * HOUR
    checkpoint_every: float = HOUR
    restart_overhead: float = 600.0
    crash_after: float = 300.0
    sizes: tuple[tuple[int, float], ...] = (
        (8, 0.30), (16, 0.20), (32, 0.20), (64, 0.15), (128, 0.10), (256, 0.04), (512, 0.01)
    )  # fmt: skip
    median_hours: float = 4.0
    sigma: float = 1.0
    max_hours: float = 48.0

    def describe(self) -> list[str]:
        """Lines stating the conditions (printed above the result table)."""
        g, n, _ = llama3_rates()
        m = self.rate_multiplier
        return [
            f"cluster: {self.racks} GB200 NVL72 racks ({self.racks * 18} trays x 4 GPUs) + "
            f"{self.dgx_nodes} DGX H100 (8 GPUs); {self.days:g} days; offered load {self.load:g}",
            f"workload: gangs of {'/'.join(str(s) for s, _ in self.sizes)} GPUs (8-GPU pods on "
            f"H100, 4-GPU pods on GB200), lognormal durations median {self.median_hours:g} h "
            f"(sigma {self.sigma:g}, cap {self.max_hours:g} h), checkpoint every "
            f"{self.checkpoint_every / HOUR:g} h, restart cost {self.restart_overhead / 60:g} min",
            f"failure rates: Llama 3 (arXiv:2407.21783, Table 5) x {m:g}: GPU {g * m:.3g}/GPU-h, "
            f"host {n * m:.3g}/node-h; {self.gpu_local_share:.0%} of GPU faults GPU-local",
            f"detection: NotReady {self.detect_not_ready:g} s, NVSentinel {self.detect_nvsentinel:g}"
            f" s, DRA {self.detect_dra:g} s; job re-queued {self.requeue_delay / 60:g} min after "
            "a fault",
            f"early warning (assumed): {self.warn_share_gpu:.0%} of GPU faults after "
            f"{self.warn_xids} non-fatal XIDs, {self.warn_share_host:.0%} of host faults after a "
            f"stalled heartbeat, lead {self.warn_lead / 60:g} min; flapping: "
            f"{self.flap_share:.0%} of nodes, down {self.flap_down / 60:g} min every "
            f"{self.flap_every / HOUR:g} h",
        ]


POOLS = {"gb200": ("NVIDIA-GB200", 4), "h100": ("NVIDIA-H100-80GB-HBM3", 8)}


def node_sources(sc: Scenario) -> tuple[dict[str, Any], ...]:
    """The scenario ``nodes`` entries of the cluster (real-shaped, ``benchmarks.clusters``)."""
    return ({"nvl72": {"racks": sc.racks}}, {"dgx-h100": {"count": sc.dgx_nodes}})


WORKLOAD_KNOBS = ("load", "sizes", "median_hours", "sigma", "max_hours")
"""Knobs of the ``llama3-gangs`` arrival generator (besides ``days``)."""
FAULT_KNOBS = (
    "rate_multiplier", "gpu_local_share", "repair_gpu_local", "repair_gpu_node", "repair_host",
    "detect_not_ready", "detect_nvsentinel", "detect_dra", "warn_share_gpu", "warn_share_host",
    "warn_lead", "warn_xids", "flap_share", "flap_down", "flap_every",
)  # fmt: skip
"""Knobs of the ``llama3`` fault generator (besides ``days``)."""


def knobs(params: Mapping[str, Any], run: Any) -> Scenario:
    """The knobs of a generator entry of run ``run``: ``days`` default to the run's horizon
    and the fault rates are scaled by the run's ``fault_rate``.

    Raises:
        ValueError: unknown knobs.
    """
    p = dict(params)
    bad = set(p) - {"days", *WORKLOAD_KNOBS, *FAULT_KNOBS}
    if bad:
        raise ValueError(f"unknown llama3 generator knobs {sorted(bad)}")
    if "days" not in p and run.horizon is not None:
        p["days"] = run.horizon / DAY
    if "sizes" in p:
        p["sizes"] = tuple((int(s), float(w)) for s, w in p["sizes"])
    p["rate_multiplier"] = float(p.get("rate_multiplier", 1.0)) * run.fault_rate
    return Scenario(**p)


def workload(sc: Scenario, seed: int, nodes: Sequence[Mapping[str, Any]]) -> list[Job]:
    """Seeded gang arrivals (Poisson) at the offered load, split by pool capacity (the GPUs
    of ``nodes`` per pool product); each gang's members must run on its pool's product."""
    rng = random.Random(f"jobs/{seed}")
    cap = {
        pool: sum(
            node_gpus(n)[0]
            for n in nodes
            if (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.product") == prod
        )
        for pool, (prod, _) in POOLS.items()
    }
    total = sum(cap.values())
    sizes = [s for s, _ in sc.sizes]
    weights = [w for _, w in sc.sizes]
    mean_size = sum(s * w for s, w in sc.sizes) / sum(weights)
    mean_hours = min(sc.max_hours, sc.median_hours * math.exp(sc.sigma**2 / 2))
    rate = sc.load * total / (mean_size * mean_hours * HOUR)  # jobs per second
    jobs = []
    t = 0.0
    horizon = sc.days * DAY
    i = 0
    while True:
        t += rng.expovariate(rate)
        if t >= horizon:
            break
        pool = "gb200" if rng.random() < cap["gb200"] / total else "h100"
        size = min(rng.choices(sizes, weights)[0], cap[pool] // 2)
        per = POOLS[pool][1]
        hours = min(sc.max_hours, rng.lognormvariate(math.log(sc.median_hours), sc.sigma))
        jobs.append(
            Job(
                f"job-{i:05d}",
                t,
                pods=max(1, size // per),
                gpus_per_pod=per,
                gang=True,
                node_selector={"nvidia.com/gpu.product": POOLS[pool][0]},
                duration=max(hours, 0.1) * HOUR,
            )
        )
        i += 1
    return jobs


def faults(
    sc: Scenario, nodes: Sequence[Mapping[str, Any]], seed: int
) -> tuple[list[Outage], list[GpuFault]]:
    """Seeded node outages and GPU faults over the horizon (independent per node and GPU)."""
    rng = random.Random(f"faults/{seed}")
    g_rate, n_rate, _ = llama3_rates()
    g_rate *= sc.rate_multiplier / HOUR  # per second
    n_rate *= sc.rate_multiplier / HOUR
    horizon = sc.days * DAY
    outages: list[Outage] = []
    gpu_faults: list[GpuFault] = []
    names = [n["metadata"]["name"] for n in nodes]
    flappers = set(rng.sample(names, round(sc.flap_share * len(names))))
    for node in nodes:
        name = node["metadata"]["name"]
        gpus = int(node["status"]["capacity"]["nvidia.com/gpu"])
        busy_until = 0.0
        t = 0.0
        while True:  # host faults
            t += rng.expovariate(n_rate)
            if t >= horizon:
                break
            warn = t - sc.warn_lead if rng.random() < sc.warn_share_host else None
            end = t + rng.expovariate(1 / sc.repair_host)
            if t >= busy_until:
                outages.append(Outage(name, "host", t, end, t + sc.detect_not_ready, warn))
                busy_until = end
        for g in range(gpus):
            t = 0.0
            while True:
                t += rng.expovariate(g_rate)
                if t >= horizon:
                    break
                warned = rng.random() < sc.warn_share_gpu
                xids = (
                    tuple(
                        t - sc.warn_lead + k * sc.warn_lead / sc.warn_xids
                        for k in range(sc.warn_xids)
                    )
                    if warned
                    else ()
                )
                if rng.random() < sc.gpu_local_share:
                    end = t + rng.expovariate(1 / sc.repair_gpu_local)
                    gpu_faults.append(GpuFault(name, g, t, end, t + sc.detect_dra, xids))
                else:
                    end = t + rng.expovariate(1 / sc.repair_gpu_node)
                    outages.append(Outage(name, "gpu-node", t, end, t + sc.detect_nvsentinel))
                    if xids:  # the warning shows on the GPU that is about to fail
                        gpu_faults.append(GpuFault(name, g, t, t, t, xids))
        if name in flappers:
            t = 0.0
            while True:
                t += rng.expovariate(1 / sc.flap_every)
                if t >= horizon:
                    break
                outages.append(Outage(name, "flap", t, t + sc.flap_down, t + sc.detect_not_ready))
    outages.sort(key=lambda o: (o.start, o.node))
    gpu_faults.sort(key=lambda f: (f.start, f.node, f.gpu))
    return outages, gpu_faults


def arrivals(
    params: Mapping[str, Any], run: Any, nodes: Sequence[Mapping[str, Any]], inp: Any
) -> list[Job]:
    """The ``llama3-gangs`` arrivals generator of the engine's scenario files
    (:data:`benchmarks.engine.sources.GENERATORS`): :func:`knobs` from ``params``, recorded
    in ``inp.info["faults_knobs"]``, then :func:`workload`."""
    sc = knobs(params, run)
    inp.info["faults_knobs"] = sc
    return workload(sc, run.seed, nodes)


def fault_source(
    params: Mapping[str, Any], run: Any, nodes: Sequence[Mapping[str, Any]], inp: Any
) -> tuple[list[Outage], list[GpuFault]]:
    """The ``llama3`` fault generator of the engine's scenario files: :func:`knobs` from
    ``params``, recorded in ``inp.info["faults_knobs"]``, then :func:`faults`."""
    sc = knobs(params, run)
    inp.info["faults_knobs"] = sc
    return faults(sc, list(nodes), run.seed)
