"""Chaos through the real control plane: a seeded stream of work while a seeded schedule of
faults hurts every component, with invariants checked from the API server all along.

    python -m benchmarks.live.chaos --kube-bin ~/kube-bin-1.36 --seed 1 --duration 600 \\
        --out out/live-chaos

What runs, on loopback (ports: :class:`ChaosPorts`):

* **The plane**: the project's test cluster (:class:`benchmarks.cluster.Cluster`: etcd,
  kube-apiserver, DRA served); kube-scheduler with the configuration topoplace ships
  (:class:`benchmarks.live.kubesched.KubeScheduler`), its extender URL pointing at a
  :class:`benchmarks.live.proxy.FaultProxy` in front of ``topoplace serve`` (the shipped
  policy with ``sharing.hami_lock: release``: no HAMi device plugin here).
  With ``--replicas 2`` (the default when ``leader-kill`` is asked) two replicas of the
  shipped Deployment run: each a kube-scheduler with leader election on a Lease
  (``topoplace-system/topoplace-chaos``, client-go's 15 s lease) in a UTS namespace of its
  own (hostname ``chaos-a`` / ``chaos-b``) and a topoplace following that Lease
  (:class:`Replica`); a watchdog starts again a kube-scheduler that exited (it does when it
  loses the Lease), as the kubelet would. Faults to one component hit the leader's. When an
  API fault is asked, topoplace and kube-scheduler reach kube-apiserver through a TLS fault
  proxy (:class:`benchmarks.live.proxy.FaultProxy` with the apiserver's serving pair and a
  kubeconfig of its own); the runner's own reads go direct.
* **Nodes**: ``--nodes`` 8-GPU H100 nodes on two leaves (pool ``work``), ``--hami-nodes``
  HAMi nodes (pool ``hami``: whole-GPU pods and shares mix there), ``--dra-nodes`` nodes
  whose GPUs are DRA devices (pool ``dra``: no ``nvidia.com/gpu``, one ResourceSlice each,
  DeviceClass ``gpu.nvidia.com``; a claim controller stand-in,
  :class:`benchmarks.cluster.claims.ClaimController`, deallocates the claims of deleted
  pods), and one probe node (pool ``probe``, never faulted, used only to time recovery).
  A kubelet-like heartbeat.
* **Work** (:class:`Workload`, seeded): every ``--arrival`` seconds on average a job:
  a whole-GPU pod of 1, 2, 4 or 8 GPUs; a gang of 2-4 members (4 or 8 GPUs each), half of
  them with ``topoplace.io/topology-required: leaf``; a HAMi share (memory and cores); or a
  DRA claim pod (a ResourceClaim of 1, 2, 4 or 8 GPUs created first), ungated
  (kube-scheduler allocates it) or gated with ``topoplace.io/allocate`` (topoplace
  allocates it and lifts the gate).
  Three PriorityClasses (low, mid, high; high preempts). A job runs ``--lifetime`` seconds
  (seeded spread) after its last member binds, then the runner deletes its pods (the job
  ends). A job some of whose pods disappeared (preempted, evicted by remediation) or sit
  on a deleted node is ended the same way (the job controller and pod GC). At most
  ``--max-pending`` pods wait at once; arrivals wait while more do.
* **Faults** (:func:`fault_schedule`, seeded, one at a time, ``--gap`` seconds apart):
  ``tp-kill`` (SIGKILL topoplace, restart), ``tp-stop`` (SIGSTOP longer than the
  extender's ``httpTimeout``, SIGCONT), ``ks-kill`` (SIGKILL kube-scheduler, restart),
  ``api-kill`` (SIGKILL kube-apiserver, restart), ``etcd-compact`` (``etcdctl compact`` at
  the current revision: watches resumed from before it get 410 Gone and relist),
  ``proxy-drop`` (the kube-scheduler -> topoplace connections reset for a few seconds),
  ``proxy-delay`` (held longer than ``httpTimeout``), ``node-notready`` (a work node's
  Ready condition False for a while), ``gpu-fault`` (NVSentinel's ``GpuXidError`` condition
  on a work node for a while), ``node-delete`` (a work node deleted, re-created later),
  ``leader-kill`` (SIGKILL both processes of the leading replica: the standby takes the
  Lease; the killed one comes back as standby), ``api-throttle`` / ``api-error`` (the API
  proxy cuts open connections, watches included, and answers every request itself with 429
  and ``Retry-After``, or 500 / 503, for a few seconds), ``api-slow`` (every chunk a client
  sends kube-apiserver waits 0.5-3 s), ``node-labels`` (a node's GPU Feature Discovery and
  topology labels removed, renamed or given odd values, then restored). ``--hold`` scales
  how long the lasting ones are held.
* **Recovery** of a fault: seconds from its end (the component answers again, the condition
  is lifted) until a fresh 1-GPU probe pod on the probe node is bound.
* **Invariants** (:mod:`benchmarks.live.invariants`): the API server is read every
  ``--poll`` seconds and each read checked; a violation is counted once per (kind,
  subject).
* **Settle**: after the last fault no more work arrives; running jobs still end. Every
  pending pod must then be bound within ``--settle`` seconds (the bound stated in the
  table; every job created fits the empty cluster), and topoplace's ledger
  (``GET /v1/inspect/placements``, bound entries) must equal the one rebuilt from the API
  server (:func:`benchmarks.live.invariants.rebuilt_ledger`) within 15 s of that.

Output (``--out``): ``summary.md``, ``summary.csv``, ``faults.csv`` (every fault with its
times), ``violations.txt``, the plane's and topoplace's logs; ``--results`` also writes the
table to ``benchmarks/results/live-chaos.md`` and ``.csv``. Seeds run in parallel on
planes of their own (their own ports) are pooled into one table by
``python -m benchmarks.live.chaos --combine OUT... [--results]`` (:func:`combine`).

A soak (the stream without faults, sampled for drift) is :mod:`benchmarks.live.soak`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
import os
import random
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.cluster.claims import FINALIZER, ClaimController
from benchmarks.cluster.cluster import Cluster, Ports, apiserver_args, recorded_pid
from benchmarks.cluster.dra import delete_slices, publish
from benchmarks.cluster.nodes import Heartbeat, gpu_node, now_rfc3339
from benchmarks.cluster.pki import write_kubeconfig
from benchmarks.clusters import resource_claim
from benchmarks.live.invariants import (
    KINDS,
    ApiState,
    Violation,
    check,
    ledger_diff,
    live_bound,
    read_state,
    rebuilt_ledger,
    topoplace_ledger,
)
from benchmarks.live.kubeapi import Api
from benchmarks.live.kubesched import REPO, KubeScheduler, Topoplace, load_shipped, render_config
from benchmarks.live.proxy import FaultProxy

NAMESPACE = "chaos"
PROFILE = "topoplace"
POOL_LABEL = "topoplace-chaos"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
HTTP_TIMEOUT = 5.0
"""The shipped extender ``httpTimeout`` (config/deploy/scheduler-config.yaml)."""
FAULT_KINDS = (
    "tp-kill",
    "tp-stop",
    "ks-kill",
    "api-kill",
    "etcd-compact",
    "proxy-drop",
    "proxy-delay",
    "node-notready",
    "gpu-fault",
    "node-delete",
    "leader-kill",
    "api-throttle",
    "api-error",
    "api-slow",
    "node-labels",
)
FAILED = "failed:"
"""How the note of a fault whose injection failed begins (it is not counted as injected)."""
HA_FAULTS = frozenset({"leader-kill"})
"""Fault kinds that need the standby replica (``--replicas 2``)."""
API_FAULTS = frozenset({"api-throttle", "api-error", "api-slow"})
"""Fault kinds done by the API proxy in front of kube-apiserver."""
DRA_VARIANT = REPO / "config" / "deploy" / "dra" / "scheduler-config-dra.yaml"
"""The shipped configuration for claim pods (no ``managedResources``: kube-scheduler calls
topoplace for every pod; docs/dra.md)."""
HAMI_IGNORED = ("nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores")
"""HAMi's per-device resources: not node resources. The default configuration says so with
``managedResources: ignoredByScheduler``; the DRA variant has no ``managedResources``, so
with DRA nodes the runner lists them in ``NodeResourcesFit``'s ``ignoredResources`` (else
no HAMi share fits anywhere)."""
LEASE_NS = "topoplace-system"
LEASE = "topoplace-chaos"
LEASE_TIMING = {"leaseDuration": "15s", "renewDeadline": "10s", "retryPeriod": "2s"}
"""kube-scheduler's (client-go's) defaults, spelled out."""
POD_KINDS = ("whole", "gang", "gang-topology", "share", "dra", "dra-gated")
DRA_GATE = "topoplace.io/allocate"
"""The scheduling gate of ``dra-gated`` pods: topoplace allocates their claims."""
DRA_CLASS = "gpu.nvidia.com"
PRIORITIES = {"low": 0, "mid": 100, "high": 1000}
GANG_SHAPES = ((2, 4), (2, 8), (2, 8), (3, 4), (3, 8), (4, 4), (4, 8))
"""(members, GPUs each) of gangs without a constraint: at most the 4 work nodes."""
LEAF_GANG_SHAPES = ((2, 4), (2, 8), (3, 4), (4, 4))
"""(members, GPUs each) of gangs that must fit one leaf (two 8-GPU work nodes)."""


@dataclass(frozen=True, slots=True)
class ChaosPorts:
    """Loopback ports of one chaos run (apiserver, etcd, kube-scheduler, topoplace, the
    extender proxy; the standby replica's three; the API proxy)."""

    api: int = 19443
    etcd: int = 26790
    etcd_peer: int = 26800
    scheduler: int = 13259
    topoplace: int = 6888
    proxy: int = 6890
    standby_proxy: int = 6891
    api_proxy: int = 6892
    standby_topoplace: int = 6895
    standby_scheduler: int = 6896


def log(msg: str) -> None:
    """A progress line on stderr."""
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the seeded stream of work ----------------------------------------------------------------


@dataclass
class Job:
    """One job of the stream: its pods (created together) and its life.

    Attributes:
        name: job name (pod names are ``<name>`` or ``<name>-<i>``).
        kind: one of :data:`POD_KINDS`.
        pods: the Pod objects to create.
        claims: the ResourceClaims its pods name (created before them, deleted after).
        lifetime: seconds it runs once every pod is bound.
        created / bound / ended: monotonic times (0: not yet).
        why_ended: ``done``, ``lost`` (a pod vanished or its node did), ``settle``.
    """

    name: str
    kind: str
    pods: list[dict[str, Any]]
    lifetime: float
    claims: list[dict[str, Any]] = field(default_factory=list)
    created: float = 0.0
    bound: float = 0.0
    ended: float = 0.0
    why_ended: str = ""

    @property
    def names(self) -> list[str]:
        return [p["metadata"]["name"] for p in self.pods]

    @property
    def claim_names(self) -> list[str]:
        return [c["metadata"]["name"] for c in self.claims]


def _pod(
    name: str,
    limits: Mapping[str, str],
    priority: str,
    pools: Sequence[str],
    annotations: Mapping[str, str] | None = None,
    claim: str = "",
    gated: bool = False,
) -> dict[str, Any]:
    """A pod of the shipped profile, grace 0 (no kubelet confirms a deletion), on ``pools``:
    a ``nodeSelector`` for one pool, a required node affinity for several (only whole-GPU
    pods ask for several: topoplace plans gangs with the members' ``nodeSelector`` but not
    their node affinity, see the report in benchmarks/results/live-chaos.md). ``claim``: its
    GPUs are that ResourceClaim (no GPU limits then); ``gated``: created with the scheduling
    gate :data:`DRA_GATE`."""
    resources: dict[str, Any] = {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": dict(limits),
    }
    if claim:
        resources["claims"] = [{"name": "gpus"}]
    spec: dict[str, Any] = {
        "schedulerName": PROFILE,
        "priorityClassName": f"chaos-{priority}",
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.9",
                "resources": resources,
            }
        ],
    }
    if claim:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim}]
    if gated:
        spec["schedulingGates"] = [{"name": DRA_GATE}]
    if len(pools) == 1:
        spec["nodeSelector"] = {POOL_LABEL: pools[0]}
    else:
        term = {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": list(pools)}]}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": dict(annotations or {})},
        "spec": spec,
    }


class Workload:
    """The seeded stream of jobs (see the module docstring). Deterministic: the same seed
    gives the same jobs in the same order, whatever happens to them."""

    def __init__(
        self, seed: int, lifetime: float = 40.0, dra_version: str = "", gangs: bool = True
    ) -> None:
        """``dra_version``: the ``resource.k8s.io`` version served ("" : no DRA jobs);
        ``gangs``: False leaves gangs out (a plane without enough work nodes)."""
        self.rng = random.Random(seed)
        self.lifetime = lifetime
        self.dra_version = dra_version
        self.gangs = gangs
        self.count = 0

    def next(self) -> Job:
        """The next job."""
        r = self.rng
        self.count += 1
        name = f"j{self.count:05d}"
        prio = r.choices(list(PRIORITIES), weights=(6, 3, 1))[0]
        life = self.lifetime * r.uniform(0.5, 1.5)
        weights = [5, 2, 1, 3, 2, 2]
        if not self.dra_version:
            weights[4] = weights[5] = 0
        if not self.gangs:
            weights[1] = weights[2] = 0
        kind = r.choices(POD_KINDS, weights=weights)[0]
        if kind in ("dra", "dra-gated"):
            gpus = r.choice((1, 1, 2, 4, 8))
            claim = resource_claim(name, gpus, self.dra_version, NAMESPACE, DRA_CLASS)
            del claim["metadata"]["uid"]  # the API server gives it
            pod = _pod(name, {}, prio, ("dra",), claim=name, gated=kind == "dra-gated")
            return Job(name, kind, [pod], life, claims=[claim])
        if kind == "whole":
            gpus = r.choice((1, 1, 2, 4, 8))
            pods = [_pod(name, {"nvidia.com/gpu": str(gpus)}, prio, ("work", "hami"))]
        elif kind == "share":
            mem = r.choice((10000, 20000, 40000))
            cores = r.choice((10, 25, 50))
            limits = {
                "nvidia.com/gpu": "1",
                "nvidia.com/gpumem": str(mem),
                "nvidia.com/gpucores": str(cores),
            }
            pods = [_pod(name, limits, prio, ("hami",))]
        else:
            # A leaf holds two 8-GPU work nodes: a gang bound to one must fit 16 GPUs.
            shapes = GANG_SHAPES if kind == "gang" else LEAF_GANG_SHAPES
            size, gpus = r.choice(shapes)
            ann = {"topoplace.io/gang": name, "topoplace.io/gang-size": str(size)}
            if kind == "gang-topology":
                ann["topoplace.io/topology-required"] = "leaf"
            pods = [
                _pod(f"{name}-{i}", {"nvidia.com/gpu": str(gpus)}, prio, ("work",), ann)
                for i in range(size)
            ]
        return Job(name, kind, pods, life)


def probe_pod(i: int) -> dict[str, Any]:
    """The ``i``-th recovery probe: 1 GPU on the probe node, high priority."""
    return _pod(f"probe-{i:04d}", {"nvidia.com/gpu": "1"}, "high", ("probe",))


def fault_schedule(seed: int, kinds: Sequence[str], count: int) -> list[str]:
    """``count`` fault kinds drawn from ``kinds``, seeded: every kind in turn in a shuffled
    round, round after round (each kind equally often, order random)."""
    rng = random.Random(seed * 7919 + 1)
    out: list[str] = []
    while kinds and len(out) < count:
        rnd = list(kinds)
        rng.shuffle(rnd)
        out += rnd
    return out[:count]


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (nan when empty)."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


# ---- the plane and its faults ----------------------------------------------------------------


@dataclass
class FaultRecord:
    """One injected fault: kind, target, monotonic start and end, recovery seconds (nan:
    the probe did not bind within its timeout)."""

    kind: str
    target: str
    start: float
    end: float
    recovery: float = math.nan
    note: str = ""


def policy_file(work: Path) -> Path:
    """The shipped policy with ``sharing.hami_lock: release`` (no HAMi device plugin here
    releases the node lock)."""
    policy = yaml.safe_load((REPO / "config" / "policy.yaml").read_text())
    policy.setdefault("sharing", {})["hami_lock"] = "release"
    path = work / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


def _keep_log(path: Path) -> None:
    """Move a process's log aside (``<name>.<n>.log``) before it is started again (the
    process classes open their log anew at each start)."""
    n = 1
    while (kept := path.with_name(f"{path.stem}.{n}{path.suffix}")).exists():
        n += 1
    with contextlib.suppress(OSError):
        path.rename(kept)


def dra_variant_config(kubeconfig: str, url: str) -> dict[str, Any]:
    """The DRA variant of the shipped configuration for a loopback run, with HAMi's
    per-device resources in ``NodeResourcesFit``'s ``ignoredResources`` (:data:`HAMI_IGNORED`)."""
    cfg = render_config(load_shipped(DRA_VARIANT), kubeconfig, url)
    for prof in cfg.get("profiles") or []:
        for pc in prof.setdefault("pluginConfig", []):
            if pc.get("name") == "NodeResourcesFit":
                args = pc.setdefault("args", {})
                args["ignoredResources"] = sorted(
                    {*args.get("ignoredResources", ()), *HAMI_IGNORED}
                )
                break
        else:
            prof["pluginConfig"].append(
                {"name": "NodeResourcesFit", "args": {"ignoredResources": list(HAMI_IGNORED)}}
            )
    return cfg


@dataclass
class Replica:
    """One pod of the shipped Deployment: kube-scheduler and topoplace beside it (the
    extender hop through a fault proxy of its own). With leader election each
    kube-scheduler runs in a UTS namespace of its own under ``name`` as hostname (its Lease
    identity is ``<name>_<uuid>``) and topoplace follows that Lease as ``name``.

    Attributes:
        busy: a fault is being done to it (the watchdog leaves it alone).
        restarts: kube-scheduler restarts by the watchdog (it exits when it loses the
            Lease, as a container the kubelet restarts).
    """

    name: str
    tp: Topoplace
    ks: KubeScheduler
    proxy: FaultProxy
    busy: bool = False
    restarts: int = 0


def _unshare_wrapper(path: Path, kube_scheduler: Path, hostname: str) -> Path:
    """A script that runs ``kube_scheduler`` with the script's arguments in a UTS namespace
    of its own whose hostname is ``hostname``; every step ``exec``s, so the pid started is
    kube-scheduler's."""
    path.write_text(
        "#!/bin/sh\n"
        f'exec unshare -u /bin/sh -c \'hostname "$0" && exec "$@"\' {hostname} '
        f'{kube_scheduler} "$@"\n'
    )
    path.chmod(0o755)
    return path


class Plane:
    """The processes of a run and the faults done to them (each fault method returns when
    the fault is over: the component answers again, or the condition is lifted)."""

    def __init__(
        self,
        kube_bin: Path,
        work: Path,
        ports: ChaosPorts,
        rng: random.Random,
        cluster: Cluster | None = None,
        replicas: int = 1,
        api_proxy: bool = False,
        hold_scale: float = 1.0,
    ) -> None:
        """``cluster``: a plane that is up already (the live suite's), used as it is and
        left up (its API server is restarted in place by ``api-kill``); None: a plane of
        this run's own on ``ports``, brought up and down with it. Either way its
        kube-apiserver, etcd and etcdctl come from its ``kube_bin``. ``replicas``: 1, or 2
        (leader election on a Lease, the second replica standing by); ``api_proxy``:
        topoplace and kube-scheduler reach kube-apiserver through a TLS fault proxy (the
        runner's own reads go direct). ``hold_scale``: multiplies how long the faults
        that last (a condition, a node away, a proxy mode) are held; a hang of topoplace
        and the extender delay always outlast ``httpTimeout``."""
        if replicas not in (1, 2):
            raise ValueError("replicas must be 1 or 2")
        self.owned = cluster is None
        self.cluster = cluster or Cluster(
            kube_bin,
            work / "plane",
            ports=Ports(api=ports.api, etcd=ports.etcd, etcd_peer=ports.etcd_peer),
            dra=True,
            feature_gates=("DRADeviceTaints=true",),
        )
        self.kube_bin = self.cluster.kube_bin
        self.work = work
        self.ports = ports
        self.rng = rng
        self.api: Api | None = None
        self.n_replicas = replicas
        self.hold_scale = hold_scale
        self.replicas: list[Replica] = []
        self.lead = 0
        self.use_api_proxy = api_proxy
        self.api_proxy: FaultProxy | None = None
        self.takeovers: list[float] = []
        self._watchdog_stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self.heartbeat: Heartbeat | None = None
        self.work_nodes: list[str] = []
        self.dra_nodes: list[str] = []
        self.dra_version = ""
        self.claim_controller: ClaimController | None = None
        self.deleted: dict[str, dict[str, Any]] = {}
        self._api_proc: subprocess.Popen[bytes] | None = None

    # ---- the leading replica ------------------------------------------------------------------

    @property
    def tp(self) -> Topoplace | None:
        """The leading replica's topoplace (None before :meth:`up`)."""
        return self.replicas[self.lead].tp if self.replicas else None

    @property
    def ks(self) -> KubeScheduler | None:
        """The leading replica's kube-scheduler."""
        return self.replicas[self.lead].ks if self.replicas else None

    @property
    def proxy(self) -> FaultProxy | None:
        """The leading replica's extender proxy."""
        return self.replicas[self.lead].proxy if self.replicas else None

    def leading(self, rep: Replica) -> bool:
        """``rep``'s topoplace says it acts (``topoplace_leader 1``); always True with one
        replica."""
        if self.n_replicas == 1:
            return True
        try:
            text = rep.tp.metrics()
        except Exception:
            return False
        return "topoplace_leader 1.0" in text.splitlines()

    def sync_leader(self, timeout: float = 0.0) -> bool:
        """Point :attr:`lead` at the replica whose topoplace leads; with ``timeout`` wait
        that long for one to. False when none leads (the last one is kept)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, rep in enumerate(self.replicas):
                if self.leading(rep):
                    self.lead = i
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)

    def _replica(self, i: int, kc: str) -> Replica:
        """Replica ``i`` (0: the ports of :class:`ChaosPorts`; 1: the standby's)."""
        name = f"chaos-{'ab'[i]}"
        p = self.ports
        tp_port, px_port, ks_port = (
            (p.topoplace, p.proxy, p.scheduler)
            if i == 0
            else (p.standby_topoplace, p.standby_proxy, p.standby_scheduler)
        )
        env = {"TOPOPLACE_SCHEDULER_NAMES": PROFILE}
        if self.n_replicas > 1:
            env |= {
                "TOPOPLACE_LEADER_LEASE": f"{LEASE_NS}/{LEASE}",
                "TOPOPLACE_LEADER_IDENTITY": name,
            }
        tp = Topoplace(
            kc, self.work / "topoplace", port=tp_port, policy=policy_file(self.work), env=env
        )
        url = f"http://127.0.0.1:{px_port}/scheduler"
        config = None
        if self.dra_nodes:
            config = dra_variant_config(kc, url)
        if self.n_replicas > 1:
            config = config or render_config(load_shipped(), kc, url)
            config["leaderElection"] = {
                "leaderElect": True,
                "resourceLock": "leases",
                "resourceName": LEASE,
                "resourceNamespace": LEASE_NS,
                **LEASE_TIMING,
            }
        ks = KubeScheduler(
            kc,
            url,
            self.work / "kube-scheduler",
            port=ks_port,
            kube_bin=self.kube_bin,
            extra_args=tuple(self.cluster.flags.scheduler_args()),
            config=config,
        )
        if self.n_replicas > 1:
            (self.work / "kube-scheduler").mkdir(parents=True, exist_ok=True)
            ks.binary = _unshare_wrapper(
                self.work / "kube-scheduler" / f"kube-scheduler-{name}.sh",
                Path(self.kube_bin) / "kube-scheduler",
                name,
            )
        return Replica(name, tp, ks, FaultProxy(px_port, tp_port))

    def start_ks(self, rep: Replica) -> float:
        """Start ``rep``'s kube-scheduler (under its hostname); seconds to healthy."""
        _keep_log(rep.ks.log_file)
        return rep.ks.start()

    def _watch(self) -> None:
        """The kubelet's part: a kube-scheduler that exited (it does when it loses the
        Lease) and that no fault is being done to is started again."""
        while not self._watchdog_stop.wait(1.0):
            for rep in self.replicas:
                proc = rep.ks.proc
                if rep.busy or proc is None or proc.poll() is None:
                    continue
                rep.busy = True
                try:
                    log(
                        f"watchdog: kube-scheduler of {rep.name} exited ({proc.returncode}); restarting"
                    )
                    rep.restarts += 1
                    self.start_ks(rep)
                except Exception as exc:
                    log(f"watchdog: restart of {rep.name} failed: {exc!r}")
                finally:
                    rep.busy = False

    # ---- up and down ----------------------------------------------------------------------

    def claim_path(self, name: str = "") -> str:
        """The chaos namespace's ResourceClaims (``name``: one of them)."""
        base = f"/apis/resource.k8s.io/{self.dra_version}/namespaces/{NAMESPACE}/resourceclaims"
        return f"{base}/{name}" if name else base

    def up(self, nodes: int, hami_nodes: int, dra_nodes: int = 0) -> None:
        """Plane, nodes (``dra_nodes`` publish their GPUs as ResourceSlices, a claim
        controller stand-in runs), PriorityClasses, namespace, proxy, topoplace,
        kube-scheduler."""
        if self.owned:
            self.cluster.up()
        kc = self.cluster.kubeconfig
        self.api = Api(kc, timeout=10.0)
        objs = [
            gpu_node(
                f"chaos-w{i}",
                leaf=f"leaf-{i // 2}",
                spine="spine-0",
                labels={POOL_LABEL: "work"},
            )
            for i in range(nodes)
        ]
        objs += [
            gpu_node(f"chaos-h{i}", sharing="hami", labels={POOL_LABEL: "hami"})
            for i in range(hami_nodes)
        ]
        objs += [
            gpu_node(f"chaos-d{i}", sharing="dra", leaf="leaf-dra", labels={POOL_LABEL: "dra"})
            for i in range(dra_nodes)
        ]
        objs.append(gpu_node("chaos-probe", leaf="leaf-probe", labels={POOL_LABEL: "probe"}))
        self.node_objs = {o["metadata"]["name"]: o for o in objs}
        self.api.create_nodes(objs)
        self.dra_nodes = [f"chaos-d{i}" for i in range(dra_nodes)]
        if self.dra_nodes:
            self.dra_version = publish(self.api, self.cluster.version, self.dra_nodes)
            self.claim_controller = ClaimController(self.api, interval=0.5)
            self.claim_controller.start()
        self.work_nodes = [
            o["metadata"]["name"] for o in objs if o["metadata"]["name"] != "chaos-probe"
        ]
        self.heartbeat = Heartbeat(self.api, list(self.node_objs), interval=20.0).start()
        for cls, v in PRIORITIES.items():
            self.api.call(
                "POST",
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": f"chaos-{cls}"},
                    "value": v,
                    "preemptionPolicy": "PreemptLowerPriority" if cls == "high" else "Never",
                },
                ok=(409,),
            )
        self.api.ensure_namespace(NAMESPACE)
        if self.use_api_proxy:
            assert self.cluster.pki is not None
            pki = self.cluster.pki
            server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server.load_cert_chain(str(pki.cert), str(pki.key))
            server.set_alpn_protocols(["http/1.1"])
            upstream = ssl.create_default_context(cafile=str(pki.ca))
            upstream.set_alpn_protocols(["http/1.1"])
            self.api_proxy = FaultProxy(
                self.ports.api_proxy,
                self.cluster.ports.api,
                server_ssl=server,
                upstream_ssl=upstream,
            ).start()
            kc = str(
                write_kubeconfig(
                    self.work / "kubeconfig-api-proxy",
                    f"https://127.0.0.1:{self.ports.api_proxy}",
                    pki,
                )
            )
        if self.n_replicas > 1:
            self.api.ensure_namespace(LEASE_NS)
        self.replicas = [self._replica(i, kc) for i in range(self.n_replicas)]
        for rep in self.replicas:
            rep.proxy.start()
            rep.tp.start()
        for rep in self.replicas:
            self.start_ks(rep)
        if self.n_replicas > 1:
            if not self.sync_leader(120):
                raise RuntimeError("no replica took the lead within 120 s")
            self._watchdog = threading.Thread(
                target=self._watch, name="chaos-watchdog", daemon=True
            )
            self._watchdog.start()

    def down(self) -> None:
        """Stop everything this run started (by pid); idempotent. On a plane it does not
        own, its objects (pods, nodes, PriorityClasses, namespace) are deleted instead."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self._watchdog_stop.set()
        if self._watchdog is not None:
            self._watchdog.join(30)
        for rep in self.replicas:
            if rep.tp.proc is not None and rep.tp.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rep.tp.proc.pid, signal.SIGCONT)
            for stop in (rep.ks.stop, rep.tp.stop, rep.proxy.stop):
                with contextlib.suppress(Exception):
                    stop()
        if self.api_proxy is not None:
            with contextlib.suppress(Exception):
                self.api_proxy.stop()
        if not self.owned:
            if self.api is not None:
                self.cleanup()
                self.api.close()
            if self.claim_controller is not None:
                self.claim_controller.stop()
            return
        if self.claim_controller is not None:
            self.claim_controller.stop()
        if self._api_proc is not None and self._api_proc.poll() is None:
            self._api_proc.kill()
        if self.api is not None:
            self.api.close()
        self.cluster.down()

    def cleanup(self) -> None:
        """Delete what :meth:`up` created in the API server (best effort)."""
        assert self.api is not None
        api = self.api
        steps: list[Callable[[], Any]] = [
            lambda: api.delete_pods(NAMESPACE, timeout=60),
            self._delete_claims,
            lambda: delete_slices(api, self.dra_version, self.dra_nodes),
            lambda: api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}", ok=(404,)),
            lambda: api.delete_nodes(POOL_LABEL),
            *[
                lambda c=c: api.call(
                    "DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/chaos-{c}", ok=(404,)
                )
                for c in PRIORITIES
            ],
        ]
        for step in steps:
            with contextlib.suppress(Exception):
                step()

    def _delete_claims(self) -> None:
        """Delete the namespace's claims, their finalizers dropped (best effort)."""
        if not self.dra_version or self.api is None:
            return
        for c in self.api.get(self.claim_path()).get("items") or []:
            name = c["metadata"]["name"]
            fins = [f for f in c["metadata"].get("finalizers") or [] if f != FINALIZER]
            if fins != (c["metadata"].get("finalizers") or []):
                c["metadata"]["finalizers"] = fins
                with contextlib.suppress(Exception):
                    self.api.call("PUT", self.claim_path(name), c)
            with contextlib.suppress(Exception):
                self.api.call("DELETE", self.claim_path(name), ok=(404,))

    # ---- readiness probes -------------------------------------------------------------------

    def api_ready(self) -> bool:
        """kube-apiserver answers ``/readyz`` ok."""
        assert self.cluster.pki is not None
        ca = ssl.create_default_context(cafile=str(self.cluster.pki.ca))
        try:
            r = httpx.get(
                f"{self.cluster.server}/readyz",
                headers={"Authorization": f"Bearer {self.cluster.pki.token}"},
                verify=ca,
                timeout=2,
            )
        except httpx.HTTPError:
            return False
        return r.text.strip() == "ok"

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} did not come back within {timeout:.0f}s")

    # ---- faults -----------------------------------------------------------------------------

    def inject(self, kind: str) -> tuple[str, str]:
        """Do fault ``kind`` and return (target, note) once it is over. Faults to one
        component hit the leading replica's."""
        self.sync_leader()
        rep = self.replicas[self.lead]
        rep.busy = True
        try:
            return getattr(self, "_" + kind.replace("-", "_"))()  # type: ignore[no-any-return]
        finally:
            rep.busy = False

    def _hold(self, lo: float, hi: float) -> float:
        """A seeded hold time in [lo, hi] seconds, times ``hold_scale``."""
        return self.rng.uniform(lo, hi) * self.hold_scale

    def _tp_kill(self) -> tuple[str, str]:
        assert self.tp is not None and self.tp.proc is not None
        self.tp.proc.send_signal(signal.SIGKILL)
        self.tp.proc.wait(30)
        time.sleep(self.rng.uniform(0.5, 3.0))
        _keep_log(self.tp.log_file)
        took = self.tp.start()
        return "topoplace", f"ready {took:.1f}s after start"

    def _leader_kill(self) -> tuple[str, str]:
        """SIGKILL both processes of the leading replica (its Lease is not released), wait
        until the standby's topoplace leads, then start the killed replica again (it
        stands by)."""
        if len(self.replicas) < 2:
            raise RuntimeError("leader-kill needs the standby replica (--replicas 2)")
        old = self.replicas[self.lead]
        other = self.replicas[1 - self.lead]
        for proc in (old.ks.proc, old.tp.proc):
            assert proc is not None
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        t0 = time.monotonic()
        self._wait(lambda: self.leading(other), 120, f"standby {other.name} taking the lead")
        took = time.monotonic() - t0
        self.takeovers.append(took)
        self.lead = 1 - self.lead
        time.sleep(self.rng.uniform(0.5, 2.0))
        _keep_log(old.tp.log_file)
        old.tp.start()
        self.start_ks(old)
        return old.name, f"{other.name} leads {took:.1f}s after the kill"

    def _api_answer(self, statuses: Sequence[int]) -> tuple[str, str]:
        """The API proxy cuts the open connections (watches end) and answers every new
        request itself with one of ``statuses`` for a few seconds (shorter than
        kube-scheduler's lease ``renewDeadline``)."""
        if self.api_proxy is None:
            raise RuntimeError("API faults need the API proxy")
        hold = self._hold(3.0, 8.0)
        status = self.rng.choice(list(statuses))
        self.api_proxy.set_mode("answer", status=status)
        time.sleep(hold)
        self.api_proxy.set_mode("pass")
        return "api-proxy", f"answered {status} for {hold:.1f}s"

    def _api_throttle(self) -> tuple[str, str]:
        return self._api_answer((429,))

    def _api_error(self) -> tuple[str, str]:
        return self._api_answer((500, 503))

    def _api_slow(self) -> tuple[str, str]:
        """Every chunk a client sends to kube-apiserver waits 0.5-3 s for a few seconds."""
        if self.api_proxy is None:
            raise RuntimeError("API faults need the API proxy")
        hold = self._hold(4.0, 8.0)
        delay = self.rng.uniform(0.5, 3.0)
        self.api_proxy.set_mode("delay", delay)
        time.sleep(hold)
        self.api_proxy.set_mode("pass")
        return "api-proxy", f"delayed {delay:.1f}s per chunk for {hold:.1f}s"

    def _node_labels(self) -> tuple[str, str]:
        """A node's GPU Feature Discovery / topology labels change shape for a while:
        removed, renamed (the old keys gone, the values under other keys) or given odd
        values; then the original labels come back. The pool label stays (pods select
        on it)."""
        assert self.api is not None
        node = self._live_work_node()
        orig = self.node_objs[node]["metadata"]["labels"]
        keys = [k for k in orig if k.startswith(("nvidia.com/gpu.", "network.topology."))]
        how = self.rng.choice(("removed", "renamed", "odd"))
        patch: dict[str, str | None] = {}
        if how == "removed":
            patch = {k: None for k in self.rng.sample(keys, self.rng.randint(1, len(keys)))}
        elif how == "renamed":
            for k in self.rng.sample(keys, self.rng.randint(1, len(keys))):
                patch[k] = None
                patch[k.replace("nvidia.com/", "nvidia.com/old-").replace("network.", "net.")] = (
                    orig[k]
                )
        else:
            # odd, but valid label values (the API server refuses the invalid ones)
            odd = ("", "0", "999999", "abc", "8.5", "NaN", "x" * 63)
            patch = {
                k: self.rng.choice(odd)
                for k in self.rng.sample(keys, self.rng.randint(1, len(keys)))
            }
        hold = self._hold(5.0, 12.0)
        self._patch_labels(node, patch)
        try:
            time.sleep(hold)
        finally:
            back: dict[str, str | None] = {k: None for k in patch if k not in orig}
            back |= {k: orig[k] for k in patch if k in orig}
            self._patch_labels(node, back, tries=60)
        return node, f"{how} {sorted(patch)} {hold:.1f}s"

    def _patch_labels(self, node: str, labels: Mapping[str, str | None], tries: int = 1) -> None:
        """Merge-patch ``labels`` (None: remove) on ``node``; ``tries`` attempts 0.5 s apart
        (the restore must get through an API fault)."""
        assert self.api is not None
        for i in range(tries):
            try:
                self.api.call(
                    "PATCH",
                    f"/api/v1/nodes/{node}",
                    {"metadata": {"labels": dict(labels)}},
                    content_type="application/merge-patch+json",
                    ok=(404,),
                )
                return
            except Exception:
                if i == tries - 1:
                    raise
                time.sleep(0.5)

    def _tp_stop(self) -> tuple[str, str]:
        assert self.tp is not None and self.tp.proc is not None
        hold = HTTP_TIMEOUT + self.rng.uniform(1.0, 4.0)
        self.tp.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(hold)
        finally:
            self.tp.proc.send_signal(signal.SIGCONT)
        return "topoplace", f"stopped {hold:.1f}s"

    def _ks_kill(self) -> tuple[str, str]:
        assert self.ks is not None and self.ks.proc is not None
        self.ks.proc.send_signal(signal.SIGKILL)
        self.ks.proc.wait(30)
        time.sleep(self.rng.uniform(0.5, 3.0))
        took = self.start_ks(self.replicas[self.lead])
        return "kube-scheduler", f"healthy {took:.1f}s after start"

    def _api_kill(self) -> tuple[str, str]:
        pid = recorded_pid(self.cluster.work, "kube-apiserver")
        if pid is None:
            raise RuntimeError("kube-apiserver is not running")
        os.kill(pid, signal.SIGKILL)
        if self._api_proc is not None:
            self._api_proc.wait(30)
        self._wait(lambda: recorded_pid(self.cluster.work, "kube-apiserver") is None, 30, "kill")
        time.sleep(self.rng.uniform(0.5, 3.0))
        assert self.cluster.pki is not None
        argv = [
            str(self.kube_bin / "kube-apiserver"),
            *apiserver_args(
                self.cluster.work, self.cluster.pki, self.cluster.ports, self.cluster.flags
            ),
        ]
        t0 = time.monotonic()
        with open(self.cluster.work / "logs" / "kube-apiserver.log", "ab") as out:
            self._api_proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.cluster.work,
            )
        (self.cluster.work / "pids" / "kube-apiserver.pid").write_text(f"{self._api_proc.pid}\n")
        self._wait(self.api_ready, 120, "kube-apiserver")
        return "kube-apiserver", f"ready {time.monotonic() - t0:.1f}s after start"

    def _etcd_compact(self) -> tuple[str, str]:
        ep = f"--endpoints=http://127.0.0.1:{self.cluster.ports.etcd}"
        ctl = str(self.kube_bin / "etcdctl")
        out = subprocess.run(
            [ctl, ep, "endpoint", "status", "--write-out=json"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            env={**os.environ, "ETCDCTL_API": "3"},
        ).stdout
        rev = int(json.loads(out)[0]["Status"]["header"]["revision"])
        subprocess.run(
            [ctl, ep, "compact", str(rev)],
            capture_output=True,
            timeout=30,
            check=True,
            env={**os.environ, "ETCDCTL_API": "3"},
        )
        return "etcd", f"compacted at revision {rev}"

    def _proxy_drop(self) -> tuple[str, str]:
        hold = self._hold(2.0, 6.0)
        assert self.proxy is not None
        self.proxy.set_mode("drop")
        time.sleep(hold)
        self.proxy.set_mode("pass")
        return "proxy", f"dropped {hold:.1f}s"

    def _proxy_delay(self) -> tuple[str, str]:
        hold = self._hold(4.0, 8.0)
        delay = HTTP_TIMEOUT + 1.0
        assert self.proxy is not None
        self.proxy.set_mode("delay", delay)
        time.sleep(hold)
        self.proxy.set_mode("pass")
        return "proxy", f"delayed {delay:.0f}s per chunk for {hold:.1f}s"

    def _live_work_node(self) -> str:
        names = [n for n in self.work_nodes if n not in self.deleted]
        return self.rng.choice(names)

    def _conditions(self, node: str, ready: bool, xid: bool) -> None:
        assert self.api is not None
        now = now_rfc3339()
        conds = [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "KubeletReady" if ready else "KubeletNotReady",
                "message": "chaos",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            },
            {
                "type": "GpuXidError",
                "status": "True" if xid else "False",
                "reason": "GpuXidErrorIsNotHealthy" if xid else "GpuXidErrorIsHealthy",
                "message": "ErrorCode:79 GPU has fallen off the bus" if xid else "",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            },
        ]
        self.api.call(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            {"status": {"conditions": conds}},
            content_type=STRATEGIC_MERGE,
        )

    def _node_notready(self) -> tuple[str, str]:
        node = self._live_work_node()
        hold = self._hold(5.0, 12.0)
        self._conditions(node, ready=False, xid=False)
        time.sleep(hold)
        self._conditions(node, ready=True, xid=False)
        return node, f"NotReady {hold:.1f}s"

    def _gpu_fault(self) -> tuple[str, str]:
        node = self._live_work_node()
        hold = self._hold(5.0, 12.0)
        self._conditions(node, ready=True, xid=True)
        time.sleep(hold)
        self._conditions(node, ready=True, xid=False)
        return node, f"GpuXidError {hold:.1f}s"

    def _node_delete(self) -> tuple[str, str]:
        assert self.api is not None
        node = self._live_work_node()
        self.deleted[node] = self.node_objs[node]
        self.api.call("DELETE", f"/api/v1/nodes/{node}", ok=(404,))
        hold = self._hold(4.0, 10.0)
        time.sleep(hold)
        obj = json.loads(json.dumps(self.node_objs[node]))
        obj["metadata"].pop("resourceVersion", None)
        self.api.create_ready_node(obj)
        self.deleted.pop(node, None)
        return node, f"deleted {hold:.1f}s"


# ---- the invariant poller -----------------------------------------------------------------------


class Poller:
    """Reads the API server every ``interval`` seconds in a thread, checks each read, keeps
    the latest read and every violation (first seen, per (kind, subject))."""

    def __init__(self, api: Api, dra_version: str, interval: float, grace: float) -> None:
        self.api = api
        self.dra_version = dra_version
        self.interval = interval
        self.grace = grace
        self.latest: ApiState | None = None
        self.latest_at = 0.0
        self.reads = 0
        self.read_errors = 0
        self.violations: dict[tuple[str, str], tuple[float, Violation]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-poller", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def read(self) -> ApiState:
        """One read now (raises when the API server does not answer)."""
        return read_state(self.api, NAMESPACE, POOL_LABEL, self.dra_version)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                state = self.read()
            except Exception:  # the API server is down (a fault): the next read tries again
                self.read_errors += 1
                continue
            self.reads += 1
            now = time.monotonic()
            found = check(state, (PROFILE,), self.grace)
            with self._lock:
                self.latest, self.latest_at = state, now
                for v in found:
                    if v.key() not in self.violations:
                        self.violations[v.key()] = (now, v)
                        log(f"VIOLATION {v.kind} {v.subject}: {v.detail}")

    def snapshot(self) -> ApiState | None:
        with self._lock:
            return self.latest


# ---- the run ------------------------------------------------------------------------------------


@dataclass
class Result:
    """What one run measured."""

    seed: int
    duration: float
    faults: list[FaultRecord] = field(default_factory=list)
    created: Counter[str] = field(default_factory=Counter)
    bound: Counter[str] = field(default_factory=Counter)
    pods_bound: int = 0
    ks_restarts: int = 0
    lost: Counter[str] = field(default_factory=Counter)
    violations: list[tuple[float, Violation]] = field(default_factory=list)
    reads: int = 0
    read_errors: int = 0
    settle_bound: float = 0.0
    settle_s: float = math.nan
    pending_after_settle: list[str] = field(default_factory=list)
    ledger_diff: list[str] = field(default_factory=list)
    ledger_checked: bool = False
    probes_unbound: int = 0
    waits: dict[str, list[float]] = field(default_factory=dict)
    """Seconds from a job's creation to every pod of it seen bound, by kind."""


def wait_figures(waits: Sequence[float]) -> tuple[float, float, float]:
    """(p50, p99, max) seconds of a kind's bind waits (nan when none was bound)."""
    if not waits:
        return math.nan, math.nan, math.nan
    return quantile(waits, 0.5), quantile(waits, 0.99), max(waits)


class Driver:
    """The job controller: arrivals, completions, lost jobs; and the fault thread."""

    def __init__(self, plane: Plane, poller: Poller, args: argparse.Namespace) -> None:
        self.plane = plane
        self.api = plane.api
        self.poller = poller
        self.args = args
        self.work = Workload(args.seed, args.lifetime, plane.dra_version)
        self.rng = random.Random(args.seed * 31 + 5)
        self.jobs: dict[str, Job] = {}
        self.result = Result(args.seed, args.duration, settle_bound=args.settle)
        self.stop_faults = threading.Event()
        self.faults_done = threading.Event()
        self._probes = 0

    # ---- API calls that tolerate a dead API server ---------------------------------------------

    def _try(self, fn: Callable[[], Any]) -> bool:
        try:
            fn()
            return True
        except Exception:
            return False

    def _delete_job(self, job: Job, why: str) -> None:
        assert self.api is not None
        ok = all(
            [self._try(lambda n=n: self.api.delete_pod(NAMESPACE, n)) for n in job.names]  # type: ignore[union-attr]
        )
        # a claim's deletion waits on its finalizer: the claim controller drops it once the
        # pod is gone and the claim deallocated
        ok = ok and all(
            [
                self._try(lambda c=c: self.api.call("DELETE", self.plane.claim_path(c), ok=(404,)))  # type: ignore[union-attr]
                for c in job.claim_names
            ]
        )
        if ok:
            job.ended, job.why_ended = time.monotonic(), why
            if why == "lost":
                self.result.lost[job.kind] += 1

    # ---- arrivals and completions -------------------------------------------------------------

    def tick(self, state: ApiState, arrivals: bool, next_arrival: float) -> float:
        """One pass of the job controller over ``state``; the next arrival time."""
        now = time.monotonic()
        pods = {p["metadata"]["name"]: p for p in state.pods}
        nodes = {n["metadata"]["name"] for n in state.nodes}
        pending = 0
        for job in self.jobs.values():
            if job.ended:
                continue
            if now - job.created < 3.0:  # its pods may not be in this read yet
                pending += len(job.pods)
                continue
            got = [pods.get(n) for n in job.names]
            gone = (
                not got
                or any(p is None for p in got)
                or any((node := live_bound(p)) and node not in nodes for p in got if p is not None)
            )
            if gone:
                self._delete_job(job, "lost")
                continue
            unbound = [p for p in got if p is not None and not live_bound(p)]
            pending += len(unbound)
            if not unbound and not job.bound:
                job.bound = now
                self.result.bound[job.kind] += 1
                self.result.waits.setdefault(job.kind, []).append(now - job.created)
                self.result.pods_bound += len(job.pods)
            if job.bound and now - job.bound > job.lifetime:
                self._delete_job(job, "done")
        if arrivals and now >= next_arrival and pending < self.args.max_pending:
            job = self.work.next()
            created = 0
            claims = [
                self._try(lambda c=c: self.api.call("POST", self.plane.claim_path(), c))  # type: ignore[union-attr]
                for c in job.claims
            ]
            if not all(claims):  # an API fault: the claims made are deleted with the job
                job.pods = []
            for p in job.pods:
                created += self._try(lambda p=p: self.api.create_pod(NAMESPACE, p))  # type: ignore[union-attr]
            if created or any(claims):
                job.created = now
                self.jobs[job.name] = job
                self.result.created[job.kind] += 1
                if created < len(job.pods) or not job.pods:  # partly created (API fault)
                    self._delete_job(job, "lost")
            next_arrival = now + self.rng.expovariate(1.0 / self.args.arrival)
        return next_arrival

    # ---- faults --------------------------------------------------------------------------------

    def _probe(self, end: float) -> float:
        """Seconds from ``end`` until a fresh probe pod is bound (nan after the timeout)."""
        assert self.api is not None
        self._probes += 1
        pod = probe_pod(self._probes)
        name = pod["metadata"]["name"]
        deadline = time.monotonic() + self.args.probe_timeout
        created = False
        got = math.nan
        while time.monotonic() < deadline:
            if not created:
                created = self._try(lambda: self.api.create_pod(NAMESPACE, pod))  # type: ignore[union-attr]
            if created:
                try:
                    p = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
                    if live_bound(p):
                        got = time.monotonic() - end
                        break
                except Exception:
                    pass
            time.sleep(0.1)
        for _ in range(50):
            if self._try(lambda: self.api.delete_pod(NAMESPACE, name)):  # type: ignore[union-attr]
                break
            time.sleep(0.5)
        if math.isnan(got):
            self.result.probes_unbound += 1
        return got

    def fault_loop(self, kinds: Sequence[str]) -> None:
        """Inject ``kinds`` in order, ``--gap`` apart, each followed by its recovery probe,
        until done or stopped."""
        try:
            for kind in kinds:
                if self.stop_faults.wait(self.rng.uniform(0.5, 1.5) * self.args.gap):
                    break
                start = time.monotonic()
                try:
                    target, note = self.plane.inject(kind)
                except Exception as exc:
                    log(f"fault {kind} failed: {exc!r}")
                    target, note = "", f"{FAILED} {exc!r}"[:200]
                end = time.monotonic()
                rec = FaultRecord(kind, target, start, end, note=note)
                rec.recovery = self._probe(end)
                self.result.faults.append(rec)
                log(
                    f"fault {len(self.result.faults)} {kind} {target} ({note}): recovered in {rec.recovery:.2f}s"
                )
        finally:
            self.faults_done.set()

    # ---- the whole run -------------------------------------------------------------------------

    def run(self) -> Result:
        args = self.args
        kinds = fault_schedule(args.seed, args.faults, args.fault_count)
        t0 = time.monotonic()
        faults = threading.Thread(
            target=self.fault_loop, args=(kinds,), name="chaos-faults", daemon=True
        )
        faults.start()
        next_arrival = t0
        # without faults (a soak) the run lasts --duration; with faults, until they are done
        while time.monotonic() - t0 < args.duration and not (kinds and self.faults_done.is_set()):
            state = self.poller.snapshot()
            if state is not None:
                next_arrival = self.tick(state, True, next_arrival)
            time.sleep(0.25)
        self.stop_faults.set()
        log("waiting for the fault in progress to end")
        faults.join(600)
        self.settle()
        self.result.reads, self.result.read_errors = self.poller.reads, self.poller.read_errors
        self.result.violations = sorted(self.poller.violations.values(), key=lambda tv: tv[0])
        return self.result

    def settle(self) -> None:
        """No more arrivals: every pending pod bound within ``--settle`` s, then the
        ledgers compared (see the module docstring)."""
        assert self.plane.tp is not None
        t0 = time.monotonic()
        pending: list[str] = []
        while time.monotonic() - t0 < self.args.settle:
            try:
                state = self.poller.read()
            except Exception:
                time.sleep(0.5)
                continue
            self.tick(state, False, math.inf)
            pending = sorted(
                p["metadata"]["name"]
                for p in state.pods
                if not live_bound(p) and not (p["metadata"].get("deletionTimestamp"))
            )
            if not pending:
                self.result.settle_s = time.monotonic() - t0
                break
            time.sleep(0.5)
        self.result.pending_after_settle = pending
        log(f"settle: {len(pending)} pending after {time.monotonic() - t0:.1f}s")
        # the ledgers (the leading replica's): no job ends while they are compared
        self.plane.sync_leader(30)
        deadline = time.monotonic() + 15
        diff: list[str] = ["not compared"]
        while time.monotonic() < deadline:
            try:
                state = self.poller.read()
                assert self.plane.tp is not None
                served = self.plane.tp.get("/v1/inspect/placements")
                state2 = self.poller.read()
            except Exception as exc:
                diff = [f"read failed: {exc!r}"]
                time.sleep(0.5)
                continue
            if [p["metadata"].get("resourceVersion") for p in state.pods] != [
                p["metadata"].get("resourceVersion") for p in state2.pods
            ]:
                time.sleep(0.3)
                continue
            diff = ledger_diff(topoplace_ledger(served), rebuilt_ledger(state))
            if not diff:
                break
            time.sleep(0.5)
        self.result.ledger_checked = True
        self.result.ledger_diff = diff


def dra_version(api: Api) -> str:
    """The ``resource.k8s.io`` version served (preferred), or ""."""
    try:
        g = api.get("/apis/resource.k8s.io")
    except Exception:
        return ""
    return str((g.get("preferredVersion") or {}).get("version") or "")


# ---- output ---------------------------------------------------------------------------------------


COLUMNS = ("seed", "measure", "kind", "value", "p50_s", "p99_s")


def _r1(x: float) -> float | str:
    return "nan" if math.isnan(x) else round(x, 1)


def rows(r: Result) -> list[tuple[Any, ...]]:
    """The table: faults by kind with recovery p50/p99, jobs by kind (created, bound, lost;
    the wait from creation to every pod bound, p50/p99 and longest), violations by kind,
    settle and ledger rows."""
    out: list[tuple[Any, ...]] = []
    by_kind: dict[str, list[float]] = defaultdict(list)
    counts: Counter[str] = Counter()
    failed = 0
    for f in r.faults:
        if f.note.startswith(FAILED):
            failed += 1
            continue
        counts[f.kind] += 1
        if not math.isnan(f.recovery):
            by_kind[f.kind].append(f.recovery)
    for k in FAULT_KINDS:
        if counts[k]:
            rec = by_kind[k]
            out.append(
                (
                    r.seed,
                    "faults",
                    k,
                    counts[k],
                    round(quantile(rec, 0.5), 2),
                    round(quantile(rec, 0.99), 2),
                )
            )
    allrec = [x for v in by_kind.values() for x in v]
    out.append(
        (
            r.seed,
            "faults",
            "all",
            sum(counts.values()),
            round(quantile(allrec, 0.5), 2),
            round(quantile(allrec, 0.99), 2),
        )
    )
    for k in POD_KINDS:
        out.append((r.seed, "jobs created", k, r.created[k], "", ""))
        out.append((r.seed, "jobs bound", k, r.bound[k], "", ""))
        out.append((r.seed, "jobs lost", k, r.lost[k], "", ""))
    for k in POD_KINDS:
        waits = r.waits.get(k, [])
        p50, p99, longest = wait_figures(waits)
        out.append((r.seed, "bind wait s (jobs)", k, len(waits), _r1(p50), _r1(p99)))
        out.append((r.seed, "longest bind wait s", k, _r1(longest), "", ""))
    c = Counter(v.kind for _, v in r.violations)
    for k in KINDS:
        out.append((r.seed, "violations", k, c.get(k, 0), "", ""))
    out.append((r.seed, "faults not injected (the injection failed)", "", failed, "", ""))
    out.append((r.seed, "probes unbound", "", r.probes_unbound, "", ""))
    out.append((r.seed, "kube-scheduler restarts (lost Lease)", "", r.ks_restarts, "", ""))
    out.append(
        (
            r.seed,
            "pending after settle",
            f"bound {r.settle_bound:.0f}s",
            len(r.pending_after_settle),
            "",
            "",
        )
    )
    out.append(
        (
            r.seed,
            "settle time",
            "",
            round(r.settle_s, 2) if not math.isnan(r.settle_s) else "nan",
            "",
            "",
        )
    )
    out.append((r.seed, "ledger differences", "", len(r.ledger_diff), "", ""))
    out.append((r.seed, "API reads (failed)", "", f"{r.reads} ({r.read_errors})", "", ""))
    return out


def markdown(table: Sequence[tuple[Any, ...]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table]
    return "\n".join(lines)


def csv_text(table: Sequence[tuple[Any, ...]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    w.writerows(table)
    return buf.getvalue()


def write(out: Path, r: Result, args: argparse.Namespace, version: str, command: str) -> str:
    """summary.md / summary.csv / faults.csv / violations.txt in ``out``; the Markdown."""
    table = rows(r)
    conditions = (
        f"Kubernetes {version} (the project's test cluster, DRA served), kube-scheduler with "
        f"the shipped configuration{' (its DRA variant, HAMi resources ignored by NodeResourcesFit)' if args.dra_nodes else ''} through a fault proxy, topoplace with the shipped policy "
        f"(hami_lock: release), {args.replicas} replica(s) of the two"
        f"{' (leader election on a Lease, 15 s)' if args.replicas > 1 else ''}"
        f"{'; both reach kube-apiserver through a TLS fault proxy' if API_FAULTS & set(args.faults) else ''}"
        f"; {args.nodes} 8-GPU work nodes on {max(1, args.nodes // 2)} "
        f"leaves, {args.hami_nodes} HAMi nodes, {args.dra_nodes} DRA nodes (GPUs as "
        f"ResourceSlices, claims allocated by kube-scheduler or, gated, by topoplace), "
        f"one probe node; seed {r.seed}; "
        f"{len(r.faults)} faults over {args.duration:.0f}s at most (gap ~{args.gap:.0f}s, holds x{args.hold:g}), "
        f"arrivals every {args.arrival:.1f}s on average, lifetime ~{args.lifetime:.0f}s, "
        f"at most {args.max_pending} pods pending; invariants read every {args.poll}s; "
        f"gang grace {args.gang_grace:.0f}s past the plan TTL; settle bound {args.settle:.0f}s; "
        f"{os.cpu_count()} cores shared with other work."
    )
    md = "\n".join(
        [
            "# live-chaos",
            "",
            "Faults injected through the real control plane while a seeded stream of work "
            "runs; invariants checked from the API server (benchmarks/live/chaos.py).",
            "",
            "Command:",
            "",
            "```bash",
            command,
            "```",
            "",
            f"Conditions: {conditions}",
            "",
            markdown(table),
            "",
            "Recovery: seconds from a fault's end (component answering again, condition "
            "lifted) until a fresh 1-GPU probe pod on the never-faulted probe node is bound. "
            "Jobs lost: ended by the runner because a pod vanished (preempted, evicted) or its "
            "node was deleted. Violations: distinct (kind, subject) pairs seen in any read.",
            "",
        ]
    )
    (out / "summary.md").write_text(md)
    (out / "summary.csv").write_text(csv_text(table))
    with open(out / "faults.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("kind", "target", "start_s", "end_s", "recovery_s", "note"))
        for x in r.faults:
            w.writerow(
                (x.kind, x.target, round(x.start, 3), round(x.end, 3), round(x.recovery, 3), x.note)
            )
    (out / "violations.txt").write_text(
        "".join(f"{t:.1f} {v.kind} {v.subject}: {v.detail}\n" for t, v in r.violations)
        + "".join(f"ledger: {d}\n" for d in r.ledger_diff)
        + "".join(f"pending after settle: {p}\n" for p in r.pending_after_settle)
    )
    return md


# ---- several seeds in one table -------------------------------------------------------------------


def combine(outs: Sequence[Path]) -> tuple[list[tuple[Any, ...]], list[str], list[str]]:
    """The runs written in ``outs`` (each a run's ``--out``: summary.csv, faults.csv,
    summary.md) as one table: faults by kind over every seed with recovery p50/p99 pooled,
    jobs and violations summed (seed ``all``), then each seed's own settle, ledger, probe,
    restart and read rows. Also each run's command and conditions lines."""
    recs: dict[str, list[float]] = defaultdict(list)
    counts: Counter[str] = Counter()
    sums: Counter[tuple[str, str]] = Counter()
    per_seed: list[tuple[Any, ...]] = []
    commands: list[str] = []
    conditions: list[str] = []
    for out in outs:
        with open(out / "faults.csv") as f:
            for row in csv.DictReader(f):
                if row["note"].startswith(FAILED):
                    continue
                counts[row["kind"]] += 1
                rec = float(row["recovery_s"])
                if not math.isnan(rec):
                    recs[row["kind"]].append(rec)
        with open(out / "summary.csv") as f:
            for row in csv.DictReader(f):
                m = row["measure"]
                if m in ("jobs created", "jobs bound", "jobs lost", "violations"):
                    sums[(m, row["kind"])] += int(row["value"])
                elif m != "faults":
                    per_seed.append(tuple(row[c] for c in COLUMNS))
        md = (out / "summary.md").read_text().splitlines()
        i = md.index("```bash")
        commands.append(md[i + 1])
        conditions += [line for line in md if line.startswith("Conditions:")]
    table: list[tuple[Any, ...]] = []
    for k in FAULT_KINDS:
        if counts[k]:
            r = recs[k]
            table.append(
                (
                    "all",
                    "faults",
                    k,
                    counts[k],
                    round(quantile(r, 0.5), 2),
                    round(quantile(r, 0.99), 2),
                )
            )
    allrec = [x for v in recs.values() for x in v]
    table.append(
        (
            "all",
            "faults",
            "all",
            sum(counts.values()),
            round(quantile(allrec, 0.5), 2),
            round(quantile(allrec, 0.99), 2),
        )
    )
    for m in ("jobs created", "jobs bound", "jobs lost"):
        for k in POD_KINDS:
            table.append(("all", m, k, sums[(m, k)], "", ""))
    for k in KINDS:
        table.append(("all", "violations", k, sums[("violations", k)], "", ""))
    return table + per_seed, commands, conditions


def write_combined(outs: Sequence[Path], dest: Path | None) -> str:
    """:func:`combine` as Markdown (and CSV beside it when ``dest`` names the .md)."""
    table, commands, conditions = combine(outs)
    md = "\n".join(
        [
            "# live-chaos",
            "",
            "Faults injected through the real control plane while a seeded stream of work "
            "runs; invariants checked from the API server (benchmarks/live/chaos.py). Several "
            "seeds, each on a plane of its own, run at the same time; the rows of seed `all` "
            "pool them.",
            "",
            "Commands (one per seed, run in parallel), then combined with "
            "`python -m benchmarks.live.chaos --combine OUT... --results`:",
            "",
            "```bash",
            *commands,
            "```",
            "",
            *conditions,
            "",
            markdown(table),
            "",
            "Recovery: seconds from a fault's end (component answering again, condition "
            "lifted; leader-kill: the standby leads and the killed replica is back as standby) "
            "until a fresh 1-GPU probe pod on the never-faulted probe node is bound. Jobs "
            "lost: ended by the runner because a pod vanished (preempted, evicted) or its node "
            "was deleted. Violations: distinct (kind, subject) pairs seen in any read.",
            "",
        ]
    )
    if dest is not None:
        dest.write_text(md)
        dest.with_suffix(".csv").write_text(csv_text(table))
    return md


# ---- command line ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.live.chaos", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--kube-bin",
        type=Path,
        default=Path(os.environ.get("KUBE_BIN") or Path.home() / "kube-bin"),
    )
    p.add_argument("--out", type=Path, default=Path("out/live-chaos"))
    p.add_argument("--runs", type=int, default=1, help="accepted for the runner; one run per seed")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--duration", type=float, default=600.0, help="seconds of faults and work at most"
    )
    p.add_argument("--fault-count", type=int, default=1000, help="faults at most")
    p.add_argument(
        "--faults", type=lambda s: [k for k in s.split(",") if k], default=list(FAULT_KINDS)
    )
    p.add_argument("--gap", type=float, default=4.0, help="mean seconds between faults")
    p.add_argument(
        "--hold",
        type=float,
        default=1.0,
        help="scale of how long lasting faults are held (conditions, node away, proxy modes)",
    )
    p.add_argument("--arrival", type=float, default=1.5, help="mean seconds between jobs")
    p.add_argument("--lifetime", type=float, default=30.0, help="mean seconds a job runs")
    p.add_argument("--max-pending", type=int, default=12)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--hami-nodes", type=int, default=2)
    p.add_argument(
        "--dra-nodes", type=int, default=2, help="8-GPU DRA nodes (0: no DRA claim pods)"
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="1, or 2 (leader election, a standby); default 2 when leader-kill is asked",
    )
    p.add_argument("--poll", type=float, default=0.5)
    p.add_argument("--gang-grace", type=float, default=30.0)
    p.add_argument("--settle", type=float, default=120.0)
    p.add_argument("--probe-timeout", type=float, default=120.0)
    p.add_argument("--keep", action="store_true", help="keep the plane's work folder")
    p.add_argument(
        "--results", action="store_true", help="also write benchmarks/results/live-chaos.md/.csv"
    )
    for f in fields(ChaosPorts):
        p.add_argument(f"--{f.name.replace('_', '-')}-port", type=int, default=f.default)
    args = p.parse_args(argv)
    if args.nodes < 4:
        p.error("--nodes must be at least 4 (the largest gang takes four 8-GPU nodes)")
    bad = [k for k in args.faults if k not in FAULT_KINDS]
    if bad:
        p.error(f"unknown fault kinds {bad}; known: {', '.join(FAULT_KINDS)}")
    if args.replicas == 0:
        args.replicas = 2 if HA_FAULTS & set(args.faults) else 1
    if args.replicas not in (1, 2):
        p.error("--replicas must be 1 or 2")
    if args.replicas == 1 and HA_FAULTS & set(args.faults):
        p.error("leader-kill needs --replicas 2")
    return args


def ports_of(args: argparse.Namespace) -> ChaosPorts:
    """The ports the ``--<name>-port`` flags name."""
    return ChaosPorts(**{f.name: getattr(args, f"{f.name}_port") for f in fields(ChaosPorts)})


def run(
    args: argparse.Namespace,
    cluster: Cluster | None = None,
    observe: Callable[[Plane, Driver], Callable[[], None]] | None = None,
) -> tuple[Result, str]:
    """One seeded chaos run (see the module docstring): (result, Kubernetes version).
    ``cluster``: run on that plane (up already, left up; see :class:`Plane`). ``observe``:
    called with the plane and the driver once the plane is up and before the work starts;
    the callable it returns is called when the work and the settle are over (a soak's
    sampler)."""
    ports = ports_of(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="topoplace-chaos-"))
    plane = Plane(
        Path(args.kube_bin),
        work,
        ports,
        random.Random(args.seed * 131 + 17),
        cluster=cluster,
        replicas=args.replicas,
        api_proxy=bool(API_FAULTS & set(args.faults)),
        hold_scale=args.hold,
    )
    poller: Poller | None = None
    try:
        plane.up(args.nodes, args.hami_nodes, args.dra_nodes)
        assert plane.api is not None
        version = plane.api.version()
        poller = Poller(plane.api, dra_version(plane.api), args.poll, args.gang_grace).start()
        log(f"plane up ({version}) in {work}; {len(plane.node_objs)} nodes")
        driver = Driver(plane, poller, args)
        stop = observe(plane, driver) if observe is not None else None
        try:
            result = driver.run()
        finally:
            if stop is not None:
                stop()
        result.ks_restarts = sum(r.restarts for r in plane.replicas)
        return result, version
    finally:
        if poller is not None:
            poller.stop()
        plane.down()
        for src in (work / "plane" / "logs", work / "topoplace", work / "kube-scheduler"):
            if src.is_dir():
                shutil.copytree(src, out / "logs" / src.name, dirs_exist_ok=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def stop_on_sigterm() -> None:
    """SIGTERM (and SIGINT, ignored in a background job) end the run as an exception does:
    the plane is stopped and its logs kept (``finally`` blocks run)."""

    def _raise(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGINT, _raise)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--combine":
        outs = [Path(a) for a in argv[1:] if a != "--results"]
        dest = REPO / "benchmarks" / "results" / "live-chaos.md" if "--results" in argv else None
        print(write_combined(outs, dest))
        return 0
    args = parse_args(argv)
    stop_on_sigterm()
    for b in ("etcd", "etcdctl", "kube-apiserver", "kube-scheduler"):
        if not os.access(Path(args.kube_bin) / b, os.X_OK):
            print(f"{args.kube_bin} lacks {b}", file=sys.stderr)
            return 2
    command = "python -m benchmarks.live.chaos " + " ".join(sys.argv[1:] if argv is None else argv)
    result, version = run(args)
    md = write(Path(args.out), result, args, version, command)
    print(md)
    if args.results:
        res = REPO / "benchmarks" / "results"
        shutil.copy(Path(args.out) / "summary.md", res / "live-chaos.md")
        shutil.copy(Path(args.out) / "summary.csv", res / "live-chaos.csv")
    bad = result.violations or result.pending_after_settle or result.ledger_diff
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
