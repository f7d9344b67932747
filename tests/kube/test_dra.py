"""DRA GPUs against a real API server and a real kube-scheduler (>= 1.32 with DRA on).

Skips unless the server serves ``resource.k8s.io`` (the test cluster does) and
``KUBE_BIN`` holds kube-scheduler: this module runs its own kube-scheduler with the DRA
variant of the shipped configuration (``config/deploy/dra/``: no ``managedResources``,
profile renamed ``topoplace-dra``, feature gate ``DynamicResourceAllocation`` on 1.32/1.33),
calling the suite's topoplace. Slices are published by the test cluster's publisher
(:func:`benchmarks.cluster.dra.publish`: the NVIDIA driver's shape); pods never run.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scheduler.cli.clusterfile import parse_cluster
from scheduler.core import dra
from scheduler.core.params import SchedParams
from scheduler.kube.waker import WAKE_ANNOTATION
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.dra import DraRouter
from tests.kube.conftest import NODE_LABEL, REPO, Topoplace, make_gpu_node
from tests.kube.test_live import wait_for

VARIANT = REPO / "config" / "deploy" / "dra" / "scheduler-config-dra.yaml"
PROFILE = "topoplace-dra"
DRA_SCHED_PORT = int(
    os.environ.get(
        "TOPOPLACE_KUBE_DRA_SCHED_PORT",
        str(int(os.environ.get("TOPOPLACE_KUBE_SCHED_PORT", "10269")) + 1),
    )
)
CLASS = "gpu.nvidia.com"


# ---- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kube_api(kubeconfig: str, core: Any) -> Iterator[Any]:
    from scheduler.kube.client import KubeApi

    api = KubeApi.from_config(kubeconfig)
    yield api
    api.close()


@pytest.fixture(scope="module")
def dra_version(kube_api: Any) -> str:
    from scheduler.kube.dra import served_version

    v = served_version(kube_api)
    if v is None:
        pytest.skip(
            "the API server does not serve resource.k8s.io (DRA): start the control plane "
            "with DRA on Kubernetes >= 1.32 (benchmarks.cluster does by default)"
        )
    return v


@pytest.fixture(scope="module")
def dra_scheduler(
    kubeconfig: str,
    port: int,
    tls_dir: Path | None,
    dra_version: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Any]:
    """kube-scheduler with the DRA variant of the shipped configuration."""
    from tests.kube.conftest import shipped_scheduler_wanted

    if not shipped_scheduler_wanted():
        pytest.skip("needs KUBE_BIN with kube-scheduler (the DRA variant configuration is run)")
    from benchmarks.live.kubesched import KubeScheduler, binary_version

    kube_bin = os.environ["KUBE_BIN"]
    version = binary_version(Path(kube_bin) / "kube-scheduler")
    gates = "DynamicResourceAllocation=true" if version.startswith(("v1.32", "v1.33")) else ""
    ks = KubeScheduler(
        kubeconfig,
        f"http://127.0.0.1:{port}/scheduler",
        tmp_path_factory.mktemp("kube-scheduler-dra"),
        port=DRA_SCHED_PORT,
        kube_bin=kube_bin,
        scheduler_name=PROFILE,
        config_path=VARIANT,
        extra_args=("--feature-gates", gates) if gates else (),
        tls_dir=tls_dir,
    )
    with ks:
        yield ks


class DraCluster:
    """DRA nodes of one test: Node objects (no ``nvidia.com/gpu``) plus their slices."""

    def __init__(self, core: Any, kubeconfig: str, run_id: str, tag: str) -> None:
        self.core = core
        self.kubeconfig = kubeconfig
        self.run_id = run_id
        self.tag = tag
        self.nodes: list[str] = []

    def add_nodes(
        self,
        count: int,
        *,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        pcie_root: bool = True,
    ) -> list[str]:
        names = [f"tp-dra-{self.run_id}-{self.tag}-{len(self.nodes) + i}" for i in range(count)]
        for n in names:
            make_gpu_node(
                self.core,
                n,
                self.run_id,
                gpus=0,
                labels={"nvidia.com/gpu.count": "8", "topoplace-dra": self.tag, **(labels or {})},
            )
            if annotations:
                self.core.patch_node(n, {"metadata": {"annotations": annotations}})
        from benchmarks.cluster.dra import GpuShape, publish
        from benchmarks.cluster.flags import parse_version
        from benchmarks.live.kubeapi import Api

        api = Api(self.kubeconfig)
        try:
            publish(api, parse_version(api.version()), names, shape=GpuShape(pcie_root=pcie_root))
        finally:
            api.close()
        self.nodes += names
        return names

    def slice_name(self, node: str) -> str:
        return f"{node}-{CLASS}"

    def delete(self, kube_api: Any, version: str) -> None:
        for n in self.nodes:
            with contextlib.suppress(Exception):
                kube_api.request_json(
                    "DELETE", f"/apis/resource.k8s.io/{version}/resourceslices/{self.slice_name(n)}"
                )
            with contextlib.suppress(Exception):
                self.core.delete_node(n)


@pytest.fixture
def cluster(
    core: Any, kubeconfig: str, run_id: str, kube_api: Any, dra_version: str, request: Any
) -> Iterator[DraCluster]:
    c = DraCluster(core, kubeconfig, run_id, request.node.name[-24:].replace("_", "-").strip("-"))
    yield c
    c.delete(kube_api, dra_version)


@pytest.fixture
def claims(kube_api: Any, dra_version: str, namespace: str, core: Any) -> Iterator[Claims]:
    c = Claims(kube_api, dra_version, namespace, core)
    yield c
    c.cleanup()


class Claims:
    """ResourceClaims and their pods in the test namespace; cleaned up after (pods force
    deleted, finalizers dropped: there is no kube-controller-manager or kubelet)."""

    def __init__(self, api: Any, version: str, ns: str, core: Any) -> None:
        self.api = api
        self.version = version
        self.ns = ns
        self.core = core
        self.claims: list[str] = []
        self.pods: list[str] = []

    def path(self, name: str = "", sub: str = "") -> str:
        p = f"/apis/resource.k8s.io/{self.version}/namespaces/{self.ns}/resourceclaims"
        return p + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def create(self, name: str, count: int, constraints: list[dict] | None = None) -> dict:
        if self.version == "v1beta1":
            req = {"name": "gpus", "deviceClassName": CLASS, "count": count}
        else:
            req = {"name": "gpus", "exactly": {"deviceClassName": CLASS, "count": count}}
        body = {
            "apiVersion": f"resource.k8s.io/{self.version}",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"devices": {"requests": [req], "constraints": constraints or []}},
        }
        self.claims.append(name)
        return self.api.request_json("POST", self.path(), body)

    def get(self, name: str) -> dict:
        return self.api.request_json("GET", self.path(name))

    def pod(
        self,
        name: str,
        claim: str,
        run_id: str,
        *,
        gated: bool = False,
        selector: dict | None = None,
        annotations: dict | None = None,
        more_claims: tuple[str, ...] = (),
    ) -> dict:
        names = ("gpu", *(f"c{i}" for i in range(len(more_claims))))
        refs = [
            {"name": n, "resourceClaimName": c}
            for n, c in zip(names, (claim, *more_claims), strict=True)
        ]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.ns, "annotations": annotations or {}},
            "spec": {
                "schedulerName": PROFILE,
                "nodeSelector": {NODE_LABEL: run_id, **(selector or {})},
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": refs,
                **({"schedulingGates": [{"name": "topoplace.io/allocate"}]} if gated else {}),
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.9",
                        "resources": {
                            "requests": {"cpu": "1", "memory": "1Gi"},
                            "claims": [{"name": n} for n in names],
                        },
                    }
                ],
            },
        }
        self.pods.append(name)
        self.core.create_namespaced_pod(self.ns, body)
        return body

    def devices(self, name: str) -> tuple[str, list[str]]:
        """(node, device names) of an allocated claim."""
        c = self.get(name)
        return dra.allocation_node(c), [d for _, _, d in dra.allocated_ids(c)]

    def wait_allocated(self, name: str, timeout: float = 30) -> tuple[str, list[str]]:
        try:
            wait_for(lambda: dra.is_allocated(self.get(name)), timeout, f"claim {name} allocated")
        except AssertionError as exc:
            why = []
            for p in self.pods:
                with contextlib.suppress(Exception):
                    st = self.core.read_namespaced_pod(p, self.ns).status
                    why += [f"{p}: {c.reason}: {c.message}" for c in st.conditions or []]
            raise AssertionError(f"{exc}; pods: {why}") from None
        return self.devices(name)

    def node_of(self, pod: str) -> str:
        return self.core.read_namespaced_pod(pod, self.ns).spec.node_name or ""

    def cleanup(self) -> None:
        for p in self.pods:
            with contextlib.suppress(Exception):
                self.core.delete_namespaced_pod(p, self.ns, grace_period_seconds=0)
        for c in self.claims:
            with contextlib.suppress(Exception):
                cur = self.get(c)
                cur["metadata"]["finalizers"] = []
                self.api.request_json("PUT", self.path(c), cur)
            with contextlib.suppress(Exception):
                self.api.request_json("DELETE", self.path(c))


def topoplace_view(tp: Topoplace) -> ClusterCache:
    """topoplace's own live view (its /v1/inspect/snapshot, DRA objects included)."""
    nodes, pods, extra = parse_cluster(json.dumps(tp.get("/v1/inspect/snapshot")))
    return ClusterCache.from_objects(nodes, pods, SchedParams(), extra=extra)


def wait_seen(tp: Topoplace, claim_key: str, allocated: bool, timeout: float = 20) -> None:
    def seen() -> bool:
        claims = tp.get("/v1/inspect/snapshot")["items"]
        for c in claims:
            if c.get("kind") == "ResourceClaim" and dra.object_key(c) == claim_key:
                return dra.is_allocated(c) == allocated
        return False

    wait_for(seen, timeout, f"topoplace to see claim {claim_key}")


# ---- (2) kube-scheduler allocates; topoplace predicts and scores ------------------------------


def test_prediction_equals_the_real_first_fit_allocation(
    topoplace: Topoplace,
    dra_scheduler: Any,
    cluster: DraCluster,
    claims: Claims,
    run_id: str,
    namespace: str,
) -> None:
    """Claims of 1, 3, 2, 2 GPUs one after another on two DRA nodes: for each, the node
    topoplace scores best and the devices it predicts there are exactly the node and
    devices the real kube-scheduler allocated."""
    nodes = cluster.add_nodes(2)
    _wait_nodes(topoplace, nodes)
    for i, count in enumerate((1, 3, 2, 2, 5)):
        name = f"ff-{i}"
        claims.create(name, count)
        wait_seen(topoplace, f"{namespace}/{name}", allocated=False)
        view = topoplace_view(topoplace)
        pod = {
            "metadata": {"name": f"pod-{name}", "namespace": namespace},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": name}]},
        }
        router = DraRouter(view)
        plans = router.plans(pod, nodes)
        scores = dict(router.prioritize(pod, nodes))
        best = max(nodes, key=lambda n: (scores[n], n == min(nodes)))
        plan = next(p for p in plans if p.node == best)
        predicted = [d.name for c in plan.prediction.devices for d in c]
        claims.pod(f"pod-{name}", name, run_id, selector={"topoplace-dra": cluster.tag})
        node, devices = claims.wait_allocated(name)
        wait_for(lambda n=f"pod-{name}": claims.node_of(n), 30, f"pod-{name} bound")
        assert (node, devices) == (best, predicted), (scores, plans)
        assert claims.node_of(f"pod-{name}") == node
        wait_seen(topoplace, f"{namespace}/{name}", allocated=True)


def _metric(tp: Topoplace, sample: str) -> float:
    """One sample (name with its labels) of topoplace's ``/metrics``; 0 when absent."""
    r = httpx.get(tp.url + "/metrics", timeout=10, **tp._client_kw())
    r.raise_for_status()
    want = sample + " "
    for line in r.text.splitlines():
        if line.startswith(want):
            return float(line[len(want) :])
    return 0.0


def _slice_updates(tp: Topoplace, path: str) -> float:
    """``topoplace_kube_slice_updates_total{path=...}`` as topoplace's ``/metrics`` shows it."""
    return _metric(tp, f'topoplace_kube_slice_updates_total{{path="{path}"}}')


def tp_nodes(tp: Topoplace) -> list[dict[str, Any]]:
    return tp.get("/v1/inspect/nodes")["nodes"]


# ---- (3) topoplace allocates gated pods --------------------------------------------------------

DGX1 = {"topoplace.io/gpu-topology": "dgx1-v100"}


def _wait_nodes(tp: Topoplace, nodes: list[str], topology: str = "") -> None:
    def ok() -> bool:
        got = {n["name"]: n for n in tp_nodes(tp) if n["name"] in nodes}
        return len(got) == len(nodes) and all(
            n["gpus"] == 8 and (not topology or n["topology"] == topology) for n in got.values()
        )

    wait_for(ok, 30, f"topoplace to see {nodes} as 8-GPU {topology or 'DRA'} nodes")


def _index(devices: list[str]) -> tuple[int, ...]:
    return tuple(sorted(int(d.rsplit("-", 1)[1]) for d in devices))


def test_gated_pair_gets_nvlink_pair_and_ungated_gets_first_fit(
    topoplace: Topoplace, dra_scheduler: Any, cluster: DraCluster, claims: Claims, run_id: str
) -> None:
    """DGX-1 (V100) nodes: a 2-GPU claim kube-scheduler allocates gets gpu-0, gpu-1 (one
    NVLink, 25 GB/s); the same claim with the gate gets a doubled-NVLink pair (50 GB/s)."""
    from topology.select import ring_bottleneck
    from topology.shape import CATALOG

    (a,) = cluster.add_nodes(1, annotations=DGX1)
    (b,) = cluster.add_nodes(1, annotations=DGX1)
    _wait_nodes(topoplace, [a, b], "dgx1-v100")
    claims.create("ff", 2)
    claims.pod("pod-ff", "ff", run_id, selector={"kubernetes.io/hostname": a})
    claims.create("tp", 2)
    claims.pod("pod-tp", "tp", run_id, gated=True, selector={"kubernetes.io/hostname": b})
    ff_node, ff = claims.wait_allocated("ff")
    tp_node, tp = claims.wait_allocated("tp")
    assert (ff_node, ff) == (a, ["gpu-0", "gpu-1"])
    assert tp_node == b
    shape = CATALOG["dgx1-v100"]
    bw_ff, bw_tp = ring_bottleneck(shape, _index(ff)), ring_bottleneck(shape, _index(tp))
    assert (bw_ff, bw_tp) == (25.0, 50.0), (ff, tp)
    c = claims.get("tp")
    assert dra.DELETE_PROTECTION in c["metadata"]["finalizers"]
    assert c["metadata"]["annotations"][dra.ALLOCATED_BY] == "topoplace"
    wait_for(lambda: claims.node_of("pod-tp") == b, 30, "the gated pod bound to its node")
    wait_for(lambda: claims.get("tp").get("status", {}).get("reservedFor"), 10, "reservedFor")
    print(f"\nDGX-1 2-GPU claim: first fit {ff} {bw_ff} GB/s, topoplace {tp} {bw_tp} GB/s")


def test_fragmented_pcie_node_four_gpus(
    topoplace: Topoplace, dra_scheduler: Any, cluster: DraCluster, claims: Claims, run_id: str
) -> None:
    """A 2-socket PCIe node with GPU 0 taken: kube-scheduler's first fit gives a 4-GPU claim
    GPUs 1-4 across the sockets; topoplace gives 4-7 on one socket."""
    from topology.select import ring_bottleneck
    from topology.shape import CATALOG

    pcie = {"topoplace.io/gpu-topology": "pcie-8gpu-2socket"}
    (a,) = cluster.add_nodes(1, annotations=pcie, pcie_root=False)
    (b,) = cluster.add_nodes(1, annotations=pcie, pcie_root=False)
    _wait_nodes(topoplace, [a, b], "pcie-8gpu-2socket")
    for n in (a, b):
        claims.create(f"one-{n[-1]}", 1)
        claims.pod(
            f"pod-one-{n[-1]}", f"one-{n[-1]}", run_id, selector={"kubernetes.io/hostname": n}
        )
        assert claims.wait_allocated(f"one-{n[-1]}") == (n, ["gpu-0"])
    wait_seen(topoplace, f"{claims.ns}/one-{b[-1]}", allocated=True)
    claims.create("ff4", 4)
    claims.pod("pod-ff4", "ff4", run_id, selector={"kubernetes.io/hostname": a})
    claims.create("tp4", 4)
    claims.pod("pod-tp4", "tp4", run_id, gated=True, selector={"kubernetes.io/hostname": b})
    _, ff = claims.wait_allocated("ff4")
    _, tp = claims.wait_allocated("tp4")
    shape = CATALOG["pcie-8gpu-2socket"]
    assert _index(ff) == (1, 2, 3, 4)
    assert _index(tp) == (4, 5, 6, 7)
    bw_ff, bw_tp = ring_bottleneck(shape, _index(ff)), ring_bottleneck(shape, _index(tp))
    assert bw_tp > bw_ff
    print(
        f"\nPCIe 4-GPU claim, GPU 0 held: first fit {ff} {bw_ff} GB/s, topoplace {tp} {bw_tp} GB/s"
    )


def test_tainted_device_gets_no_new_claim(
    topoplace: Topoplace,
    dra_scheduler: Any,
    cluster: DraCluster,
    claims: Claims,
    run_id: str,
    kube_api: Any,
    dra_version: str,
) -> None:
    (a,) = cluster.add_nodes(1, annotations=DGX1)
    # The node's new slice, and slices other tests deleted, may wait for a rebuild (a
    # burst is gathered): a taint update then joins it instead of taking the node path.
    wait_for(
        lambda: (
            _metric(topoplace, "topoplace_kube_slices_pending") == 0
            and any(n["name"] == a and n["gpus"] == 8 for n in tp_nodes(topoplace))
        ),
        30,
        "topoplace to apply the new node's slice (no slice change pending)",
    )
    path = f"/apis/resource.k8s.io/{dra_version}/resourceslices/{cluster.slice_name(a)}"
    sl = kube_api.request_json("GET", path)
    devs = sl["spec"]["devices"]
    dev = next(d for d in devs if d["name"] == "gpu-5")
    body = dev.get("basic", dev)
    body["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    sl["spec"]["pool"]["generation"] += 1
    node_path = _slice_updates(topoplace, "node")
    got = kube_api.request_json("PUT", path, sl)
    kept = next(d for d in got["spec"]["devices"] if d["name"] == "gpu-5")
    if not kept.get("basic", kept).get("taints"):
        pytest.skip(
            "kube-apiserver dropped device taints (needs FEATURE_GATES=DRADeviceTaints=true)"
        )
    wait_for(
        lambda: any(
            n["name"] == a and 5 not in n["free"] and n["gpus"] == 8 for n in tp_nodes(topoplace)
        ),
        30,
        "topoplace to see the tainted GPU",
    )
    # Applied to that node alone (only its devices' taints changed), not by a rebuild.
    assert _slice_updates(topoplace, "node") == node_path + 1
    claims.create("eight", 8)
    claims.pod("pod-eight", "eight", run_id, gated=True, selector={"kubernetes.io/hostname": a})
    claims.create("seven", 7)
    claims.pod("pod-seven", "seven", run_id, gated=True, selector={"kubernetes.io/hostname": a})
    node, devices = claims.wait_allocated("seven")
    assert node == a and "gpu-5" not in devices and len(devices) == 7
    time.sleep(2)
    assert not dra.is_allocated(claims.get("eight"))  # no 8 healthy GPUs: it waits


def test_gang_of_eight_all_or_nothing_and_restart(
    topoplace: Topoplace,
    dra_scheduler: Any,
    cluster: DraCluster,
    claims: Claims,
    run_id: str,
    namespace: str,
) -> None:
    """Eight gated members x 2 GPUs on two DGX-1 nodes: nothing is allocated while seven
    exist (topoplace is restarted meanwhile); with the eighth, all eight are allocated
    (NVLink pairs, no device twice), ungated and bound."""
    from topology.select import ring_bottleneck
    from topology.shape import CATALOG

    nodes = cluster.add_nodes(2, annotations=DGX1)
    _wait_nodes(topoplace, nodes, "dgx1-v100")
    ann = {"topoplace.io/gang": "llm", "topoplace.io/gang-size": "8"}
    sel = {"topoplace-dra": cluster.tag}

    def member(i: int) -> None:
        claims.create(f"m{i}", 2)
        claims.pod(f"pod-m{i}", f"m{i}", run_id, gated=True, selector=sel, annotations=ann)

    for i in range(7):
        member(i)
    time.sleep(3)
    assert not any(dra.is_allocated(claims.get(f"m{i}")) for i in range(7))
    topoplace.kill()
    topoplace.start()
    topoplace.wait_ready()
    member(7)
    got = {f"m{i}": claims.wait_allocated(f"m{i}", 60) for i in range(8)}
    flat = [(n, d) for n, devs in got.values() for d in devs]
    assert len(flat) == len(set(flat)) == 16
    shape = CATALOG["dgx1-v100"]
    assert all(ring_bottleneck(shape, _index(d)) >= 25.0 for _, d in got.values())
    for i in range(8):
        wait_for(lambda i=i: claims.node_of(f"pod-m{i}"), 60, f"pod-m{i} bound")
        assert claims.node_of(f"pod-m{i}") == got[f"m{i}"][0]


def test_race_gated_and_ungated_claims_never_share_a_device(
    topoplace: Topoplace, dra_scheduler: Any, cluster: DraCluster, claims: Claims, run_id: str
) -> None:
    """The race, forced. Per round, twelve 1-GPU claims at once on two 8-GPU nodes (six
    pinned to each), half allocated by kube-scheduler and half by topoplace (gated): every
    claim is allocated and bound, no device twice. topoplace runs with
    ``TOPOPLACE_DRA_SETTLE_S=0`` (it checks its allocations against every claim at once
    after writing them, so kube-scheduler's allocations from a view without them land
    after that check); for the first :data:`RACE_ROUNDS` rounds also with
    ``TOPOPLACE_DRA_RECENT_S=0`` (its filter does not hold kube-scheduler off its fresh
    writes), so the conflicts happen and topoplace's bind check must undo them and keep
    kube-scheduler's count of allocated devices whole; then as shipped, for as many rounds."""
    rnd = 0
    for env in ({"TOPOPLACE_DRA_RECENT_S": "0"}, {}):
        with topoplace.restarted({"TOPOPLACE_DRA_SETTLE_S": "0", **env}):
            for _ in range(RACE_ROUNDS):
                _race_round(topoplace, cluster, claims, run_id, rnd)
                rnd += 1
            log = (topoplace.logdir / f"topoplace-{topoplace.starts}.log").read_text(
                errors="replace"
            )
        waits = log.count("waiting for their bind")
        fails = log.count("(kube-scheduler's) shares devices")
        yields = log.count("topoplace yields")
        print(
            f"\n{RACE_ROUNDS} rounds {env or 'as shipped'}: binds failed on a shared device "
            f"{fails}, topoplace waited for such a bind {waits}, yielded {yields}"
        )


def _race_round(
    topoplace: Topoplace, cluster: DraCluster, claims: Claims, run_id: str, rnd: int
) -> None:
    import threading

    nodes = cluster.add_nodes(2, annotations=DGX1)
    _wait_nodes(topoplace, nodes, "dgx1-v100")
    hosts = [{"kubernetes.io/hostname": n} for n in nodes]
    names = [f"r{rnd}-{i}" for i in range(12)]

    def make(i: int) -> None:
        claims.create(names[i], 1)
        host = hosts[i // 6]  # both sides on both nodes: they must meet
        claims.pod(f"pod-{names[i]}", names[i], run_id, gated=i % 2 == 0, selector=host)

    threads = [threading.Thread(target=make, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in names:
        wait_for(lambda n=n: claims.node_of(f"pod-{n}"), 120, f"pod-{n} bound")
    got = {n: claims.devices(n) for n in names}
    flat = [(node, d) for node, devs in got.values() for d in devs]
    assert len(flat) == len(set(flat)) == 12, (rnd, got)
    for n in names:
        assert claims.node_of(f"pod-{n}") == got[n][0]


RACE_ROUNDS = 3
"""Rounds of the forced race per setting (each a fresh pair of nodes)."""


# ---- (4) ComputeDomains ------------------------------------------------------------------------

CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"


def _publish_channels(kube_api: Any, version: str, nodes: list[str]) -> list[str]:
    """A channel DeviceClass and, per node, a slice of 8 IMEX channels in the shape of the
    NVIDIA driver's compute-domain kubelet plugin (driver compute-domain.nvidia.com)."""
    base = f"/apis/resource.k8s.io/{version}"
    cls = {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "DeviceClass",
        "metadata": {"name": CHANNEL_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{dra.CD_DRIVER}'"}}]},
    }
    with contextlib.suppress(Exception):
        kube_api.request_json("POST", f"{base}/deviceclasses", cls)
    names = []
    for n in nodes:
        devs = []
        for i in range(8):
            body = {"attributes": {"type": {"string": "channel"}, "id": {"int": i}}}
            devs.append(
                {"name": f"channel-{i}", "basic": body}
                if version == "v1beta1"
                else {"name": f"channel-{i}", **body}
            )
        name = f"{n}-{dra.CD_DRIVER}"
        kube_api.request_json(
            "POST",
            f"{base}/resourceslices",
            {
                "apiVersion": f"resource.k8s.io/{version}",
                "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {
                    "driver": dra.CD_DRIVER,
                    "nodeName": n,
                    "pool": {"name": n, "generation": 1, "resourceSliceCount": 1},
                    "devices": devs,
                },
            },
        )
        names.append(name)
    return names


def _channel_claim(claims: Claims, name: str, domain: str) -> None:
    if claims.version == "v1beta1":
        req = {"name": "channel", "deviceClassName": CHANNEL_CLASS}
    else:
        req = {"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}}
    body = {
        "apiVersion": f"resource.k8s.io/{claims.version}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": claims.ns},
        "spec": {
            "devices": {
                "requests": [req],
                "config": [
                    {
                        "requests": ["channel"],
                        "opaque": {
                            "driver": dra.CD_DRIVER,
                            "parameters": {
                                "apiVersion": "resource.nvidia.com/v1beta1",
                                "kind": "ComputeDomainChannelConfig",
                                "domainID": domain,
                            },
                        },
                    }
                ],
            }
        },
    }
    claims.claims.append(name)
    claims.api.request_json("POST", claims.path(), body)


def _cd_pod(claims: Claims, name: str, gpu: str, channel: str, run_id: str, **kw: Any) -> None:
    """A pod with a GPU claim and a ComputeDomain channel claim."""
    claims.pod(name, gpu, run_id, more_claims=(channel,), **kw)


def test_compute_domains_one_per_node_and_one_nvlink_domain(
    topoplace: Topoplace,
    dra_scheduler: Any,
    cluster: DraCluster,
    claims: Claims,
    run_id: str,
    kube_api: Any,
    dra_version: str,
) -> None:
    """Three DGX-1 nodes, a in NVLink partition X, b and c in Y. A ComputeDomain gang of two
    8-GPU members (gated) lands on b and c; a pod of a second domain (not gated: kube-scheduler
    allocates, topoplace filters) can only go to a; a pod of a third domain finds no node."""
    (a,) = cluster.add_nodes(1, annotations=DGX1, labels={"nvidia.com/gpu.clique": "feed.1"})
    b, c = cluster.add_nodes(2, annotations=DGX1, labels={"nvidia.com/gpu.clique": "feed.2"})
    channel_slices = _publish_channels(kube_api, dra_version, [a, b, c])
    try:
        _wait_nodes(topoplace, [a, b, c], "dgx1-v100")
        sel = {"topoplace-dra": cluster.tag}
        ann = {"topoplace.io/gang": "cd-gang", "topoplace.io/gang-size": "2"}
        for i in range(2):
            claims.create(f"g{i}", 8)
            _channel_claim(claims, f"g{i}-ch", "cd-g")
            _cd_pod(
                claims,
                f"pod-g{i}",
                f"g{i}",
                f"g{i}-ch",
                run_id,
                gated=True,
                selector=sel,
                annotations=ann,
            )
        nodes = sorted(claims.wait_allocated(f"g{i}", 60)[0] for i in range(2))
        assert nodes == sorted([b, c])
        for i in range(2):
            wait_for(lambda i=i: claims.node_of(f"pod-g{i}"), 60, f"pod-g{i} bound")
            ch_node, ch = claims.wait_allocated(f"g{i}-ch")
            assert ch_node == claims.node_of(f"pod-g{i}") and ch
        # claims and pod at once: kube-scheduler may ask before topoplace's watch shows
        # the claims; topoplace then refuses the pod everywhere and wakes it once it has
        # them (docs/dra.md section 4)
        claims.create("h", 1)
        _channel_claim(claims, "h-ch", "cd-h")
        _cd_pod(claims, "pod-h", "h", "h-ch", run_id, selector=sel)
        assert claims.wait_allocated("h", 60)[0] == a
        wait_for(lambda: claims.node_of("pod-h") == a, 60, "pod-h bound to a")
        h_meta = claims.core.read_namespaced_pod("pod-h", claims.ns).metadata
        woken = (h_meta.annotations or {}).get(WAKE_ANNOTATION, "not refused for its claims")
        print(f"\npod-h woken: {woken}")
        # a serves cd-h for topoplace from pod-h's bind on, before its watch shows h's
        # allocation (kube-scheduler wrote it in PreBind; docs/dra.md section 4)
        claims.create("i", 1)
        _channel_claim(claims, "i-ch", "cd-i")
        _cd_pod(claims, "pod-i", "i", "i-ch", run_id, selector=sel)

        def refused() -> str:
            st = claims.core.read_namespaced_pod("pod-i", claims.ns).status
            msgs = [x.message or "" for x in st.conditions or [] if x.type == "PodScheduled"]
            return next((m for m in msgs if dra.REASON_CD_NODE_BUSY in m), "")

        msg = wait_for(refused, 60, "pod-i refused: every node serves another ComputeDomain")
        assert not claims.node_of("pod-i")
        print(f"\nthird ComputeDomain: {msg}")
    finally:
        for name in channel_slices:
            with contextlib.suppress(Exception):
                kube_api.request_json(
                    "DELETE", f"/apis/resource.k8s.io/{dra_version}/resourceslices/{name}"
                )


# ---- a burst of ResourceSlices: pods refused while the cache was behind are woken ---------------


def test_a_claim_pod_refused_while_its_slices_wait_for_their_rebuild_is_woken(
    topoplace: Topoplace,
    dra_scheduler: Any,
    cluster: DraCluster,
    claims: Claims,
    run_id: str,
    namespace: str,
    core: Any,
) -> None:
    """The race of a DRA burst, forced. topoplace runs with
    ``TOPOPLACE_SLICE_REBUILD_DELAY_S=8``: a slice change within 8 s of the last rebuild
    waits 8 s for the rest of its burst. Node A's slices are published and applied; node
    B's follow at once. kube-scheduler sees B's slices at once and tries a claim pod that
    may only go to B; topoplace does not have B's GPUs yet and refuses it, and
    kube-scheduler parks it with no event to come. Once the rebuild is in, topoplace wakes
    the pods it refused since the slices fell behind: the pod binds on B, woken."""

    delay = 8.0
    with topoplace.restarted({"TOPOPLACE_SLICE_REBUILD_DELAY_S": str(delay)}):
        (a,) = cluster.add_nodes(1)
        wait_for(
            lambda: any(n["name"] == a and n["gpus"] == 8 for n in tp_nodes(topoplace)),
            30,
            "topoplace to see node A's GPUs",
        )
        (b,) = cluster.add_nodes(1)  # within 8 s of A's rebuild: B's slices wait
        t0 = time.monotonic()
        claims.create("burst", 8)
        claims.pod("pod-burst", "burst", run_id, selector={"kubernetes.io/hostname": b})

        def refused() -> bool:
            st = core.read_namespaced_pod("pod-burst", namespace).status
            c = next((x for x in st.conditions or [] if x.type == "PodScheduled"), None)
            return c is not None and c.status == "False" and c.reason == "Unschedulable"

        wait_for(refused, delay, "the pod refused while topoplace lacks B's slices")
        assert not any(n["name"] == b and n["gpus"] == 8 for n in tp_nodes(topoplace))
        wait_for(lambda: claims.node_of("pod-burst") == b, delay + 20, "the pod bound on B")
        print(f"\nbound {time.monotonic() - t0:.1f} s after B's slices (delay {delay:.0f} s)")
        woken = core.read_namespaced_pod("pod-burst", namespace).metadata.annotations or {}
        assert WAKE_ANNOTATION in woken, "the pod came back without being woken"


def test_a_burst_of_claim_pods_fills_the_nodes_exactly(
    topoplace: Topoplace,
    dra_scheduler: Any,
    cluster: DraCluster,
    claims: Claims,
    run_id: str,
    namespace: str,
) -> None:
    """Twelve claim pods created at once, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1 GPUs: the 32
    GPUs of four DRA nodes, largest first (whatever node each takes, the rest still fit).
    kube-scheduler filters them one after another, each before the claims of those before
    it show allocated in topoplace's view, so topoplace's filter counts the devices
    kube-scheduler may be allocating for those (its second pass, only where the first fit
    took one). It must refuse no node kube-scheduler can use: every pod binds, on the
    node of its claim's allocation, no device twice, the four nodes full."""
    nodes = cluster.add_nodes(4)
    _wait_nodes(topoplace, nodes)
    sizes = (5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1)
    for i, count in enumerate(sizes):
        claims.create(f"burst-{i}", count)
    for i in range(len(sizes)):
        wait_seen(topoplace, f"{namespace}/burst-{i}", allocated=False)
    for i in range(len(sizes)):
        claims.pod(f"pod-burst-{i}", f"burst-{i}", run_id, selector={"topoplace-dra": cluster.tag})
    taken: list[tuple[str, str]] = []
    for i, count in enumerate(sizes):
        node, devices = claims.wait_allocated(f"burst-{i}", timeout=60)
        assert len(devices) == count
        wait_for(lambda n=f"pod-burst-{i}": claims.node_of(n), 30, f"pod-burst-{i} bound")
        assert claims.node_of(f"pod-burst-{i}") == node
        taken += [(node, d) for d in devices]
    assert len(set(taken)) == len(taken) == 32
    assert sorted(n for n, _ in taken) == sorted(nodes * 8)


# ---- re-placement after a failure: claim pods are evicted like device-plugin pods -----------


def test_a_failed_node_evicts_the_gang_whose_claims_it_holds_and_nothing_else(
    topoplace: Topoplace,
    dra_scheduler: Any,
    cluster: DraCluster,
    claims: Claims,
    run_id: str,
    namespace: str,
    core: Any,
    tmp_path: Path,
) -> None:
    """Two claim pods of a gang on two nodes, a claim pod alone on a third (the shipped
    policy's remediation, with a short delay): NVSentinel's fatal XID condition on one
    gang member's node takes out both members (the other's claim sits on a healthy node)
    through the Eviction API; the pod alone stays."""
    from tests.kube.test_health_live import fail_node
    from tests.kube.test_remediation_live import AFTER_S, _gone, _policy

    nodes = cluster.add_nodes(3, annotations=DGX1)
    _wait_nodes(topoplace, nodes, "dgx1-v100")
    ann = {"topoplace.io/gang": "ft", "topoplace.io/gang-size": "2"}
    with topoplace.restarted(args=("--config", str(_policy(tmp_path)))):
        for i, n in enumerate(nodes):
            claims.create(f"c{i}", 8)
            claims.pod(
                f"pod-{i}",
                f"c{i}",
                run_id,
                gated=True,
                selector={"kubernetes.io/hostname": n},
                annotations=ann if i < 2 else None,
            )
        for i in range(3):
            claims.wait_allocated(f"c{i}", 60)
            wait_for(lambda i=i: claims.node_of(f"pod-{i}"), 60, f"pod-{i} bound")
        uids = {p: core.read_namespaced_pod(p, namespace).metadata.uid for p in claims.pods}
        fail_node(core, nodes[0])

        def gone(*names: str) -> bool:
            return _gone(core, namespace, list(names), uids)

        try:
            wait_for(lambda: gone("pod-0", "pod-1"), AFTER_S + 30, "the gang evicted")
        except AssertionError as exc:
            text = httpx.get(topoplace.url + "/metrics", timeout=10, **topoplace._client_kw()).text
            seen = [ln for ln in text.splitlines() if ln.startswith("topoplace_remediation")]
            raise AssertionError(f"{exc}; {seen}; {topoplace.log_tail(20)}") from None
        assert not gone("pod-2")


# ---- (5) nvidia.com/gpu backed by DRA (DRAExtendedResource, 1.34+, on by default in 1.36) ------


@pytest.fixture
def er_class(kube_api: Any, dra_version: str, run_id: str) -> Iterator[str]:
    """A DeviceClass of the GPU driver naming ``nvidia.com/gpu`` (``extendedResourceName``),
    deleted after the test: on nodes that do not advertise ``nvidia.com/gpu`` that resource
    then comes through DRA. Skips where the server does not keep the field (< 1.34, or the
    feature off)."""
    name = f"er-{run_id}.nvidia.com"
    path = f"/apis/resource.k8s.io/{dra_version}/deviceclasses"
    body = {
        "apiVersion": f"resource.k8s.io/{dra_version}",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [{"cel": {"expression": f"device.driver == '{CLASS}'"}}],
            "extendedResourceName": "nvidia.com/gpu",
        },
    }
    made = kube_api.request_json("POST", path, body)
    try:
        if (made.get("spec") or {}).get("extendedResourceName") != "nvidia.com/gpu":
            pytest.skip("the API server drops DeviceClass.spec.extendedResourceName")
        yield name
    finally:
        with contextlib.suppress(Exception):
            kube_api.request_json("DELETE", f"{path}/{name}")


def _gpu_pod(
    core: Any, ns: str, name: str, gpus: int, profile: str, selector: dict, gated: bool = False
) -> None:
    """A pod asking ``nvidia.com/gpu: gpus`` (gated with ``topoplace.io/allocate``)."""
    gates = {"schedulingGates": [{"name": dra.ALLOCATE_GATE}]} if gated else {}
    core.create_namespaced_pod(
        ns,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "schedulerName": profile,
                "nodeSelector": selector,
                "terminationGracePeriodSeconds": 0,
                **gates,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.9",
                        "resources": {
                            "requests": {"cpu": "1", "memory": "1Gi"},
                            "limits": {"nvidia.com/gpu": str(gpus)},
                        },
                    }
                ],
            },
        },
    )


def test_gpu_requests_backed_by_dra_bind_and_count_once(
    topoplace: Topoplace,
    scheduler_name: str,
    cluster: DraCluster,
    er_class: str,
    claims: Claims,
    run_id: str,
    namespace: str,
) -> None:
    """Plain ``nvidia.com/gpu`` pods on DRA nodes, through the shipped configuration: an
    8-GPU pod fills one node, a 2-GPU pod goes to the other; both bind (kube-scheduler's
    special claims hold the devices) and topoplace counts each GPU once."""
    nodes = cluster.add_nodes(2, annotations=DGX1)
    _wait_nodes(topoplace, nodes, "dgx1-v100")
    sel = {NODE_LABEL: run_id, "topoplace-dra": cluster.tag}
    claims.pods += ["er-eight", "er-two"]
    _gpu_pod(claims.core, namespace, "er-eight", 8, scheduler_name, sel)
    wait_for(lambda: claims.node_of("er-eight"), 30, "the 8-GPU pod bound")
    _gpu_pod(claims.core, namespace, "er-two", 2, scheduler_name, sel)
    wait_for(lambda: claims.node_of("er-two"), 30, "the 2-GPU pod bound")
    eight, two = claims.node_of("er-eight"), claims.node_of("er-two")
    assert eight != two and {eight, two} == set(nodes)
    pod = claims.core.read_namespaced_pod("er-two", namespace)
    made = pod.status.extended_resource_claim_status.resource_claim_name
    node, devices = claims.devices(made)
    assert node == two and len(devices) == 2

    def counted() -> bool:
        used = {n["name"]: n for n in tp_nodes(topoplace) if n["name"] in nodes}
        return used[eight]["free_gpus"] == 0 and used[two]["free_gpus"] == 6

    wait_for(counted, 20, "topoplace to count 8 + 2 GPUs once")


def _gpu_set(claims: Claims, namespace: str, pod: str) -> tuple[str, tuple[int, ...]]:
    """(node, GPU indices) a bound pod holds: from topoplace's placement record on a
    device-plugin node, from its special claim on a DRA node."""
    p = claims.core.read_namespaced_pod(pod, namespace)
    st = p.status.extended_resource_claim_status
    if st is not None and st.resource_claim_name:
        node, devices = claims.devices(st.resource_claim_name)
        return node, _index(devices)
    rec = json.loads((p.metadata.annotations or {})["topoplace.io/placement"])
    return p.spec.node_name, tuple(sorted(rec["gpus"]))


def test_same_pods_same_nodes_and_gpus_with_the_device_plugin_or_dra(
    topoplace: Topoplace,
    scheduler_name: str,
    cluster: DraCluster,
    er_class: str,
    claims: Claims,
    core: Any,
    run_id: str,
    namespace: str,
) -> None:
    """Two DGX-1 nodes with the device plugin, two publishing their GPUs through DRA: the
    same ``nvidia.com/gpu`` pods (2, 1, 4, 1 GPUs; on the DRA side gated with
    ``topoplace.io/allocate``) land on the same node of their pair with the same GPUs. Two
    more DRA nodes take the same pods ungated: kube-scheduler's first fit (the lowest free
    devices of the node), printed with the ring bandwidths for comparison."""
    from topology.select import ring_bottleneck
    from topology.shape import CATALOG

    dp = [f"tp-dp-{run_id}-{cluster.tag}-{i}"[:63] for i in range(2)]
    for n in dp:
        make_gpu_node(core, n, run_id, gpus=8, labels={"topoplace-dp": cluster.tag})
        core.patch_node(n, {"metadata": {"annotations": DGX1}})
    try:
        gated_nodes = cluster.add_nodes(2, annotations=DGX1, labels={"arm": "gated"})
        ff_nodes = cluster.add_nodes(2, annotations=DGX1, labels={"arm": "first-fit"})
        _wait_nodes(topoplace, gated_nodes + ff_nodes, "dgx1-v100")
        _wait_nodes(topoplace, dp, "dgx1-v100")
        got: dict[str, list[tuple[int, tuple[int, ...]]]] = {"dp": [], "dra": [], "ff": []}
        arms = (
            ("dp", dp, {"topoplace-dp": cluster.tag}),
            ("dra", gated_nodes, {"topoplace-dra": cluster.tag, "arm": "gated"}),
            ("ff", ff_nodes, {"topoplace-dra": cluster.tag, "arm": "first-fit"}),
        )
        for i, gpus in enumerate((2, 1, 4, 1)):
            for side, nodes, label in arms:
                name = f"same-{side}-{i}"
                claims.pods.append(name)
                body_sel = {NODE_LABEL: run_id, **label}
                gated = side == "dra"
                _gpu_pod(core, namespace, name, gpus, scheduler_name, body_sel, gated=gated)
                wait_for(lambda n=name: claims.node_of(n), 40, f"{name} bound")
                node, held = _gpu_set(claims, namespace, name)
                got[side].append((sorted(nodes).index(node), held))
        shape = CATALOG["dgx1-v100"]

        def bw(arm: str) -> list[float]:
            return [ring_bottleneck(shape, list(g)) if len(g) > 1 else 0.0 for _, g in got[arm]]

        print(f"\ndevice plugin: {got['dp']} {bw('dp')} GB/s")
        print(f"DRA (gated):   {got['dra']} {bw('dra')} GB/s")
        print(f"DRA first fit: {got['ff']} {bw('ff')} GB/s")
        assert got["dp"] == got["dra"]
        assert all(len(g) == n for (_, g), n in zip(got["dp"], (2, 1, 4, 1), strict=True))
        used: dict[int, set[int]] = {}
        for node_i, held in got["ff"]:  # each the lowest free GPUs of its node
            free = [g for g in range(8) if g not in used.setdefault(node_i, set())]
            assert held == tuple(free[: len(held)]), got["ff"]
            used[node_i].update(held)
    finally:
        for n in dp:
            with contextlib.suppress(Exception):
                core.delete_node(n)
