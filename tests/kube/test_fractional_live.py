"""Fractional GPUs live: 200 HAMi pods through the real kube-scheduler (opt-in, ``kube``).

Nodes carry HAMi's ``hami.io/node-nvidia-register`` (added here, as HAMi's device plugin
would) and advertise ``nvidia.com/gpu`` as HAMi's split replicas. 200 pods of mixed sizes
(``nvidia.com/gpu`` + ``nvidia.com/gpumem`` + ``nvidia.com/gpucores``; some ask for two
devices) go through kube-scheduler with topoplace's shipped configuration. Checked:

* every pod is bound and carries HAMi's annotations in HAMi's exact format (UUIDs of its
  node, ``to-allocate == allocated``, ``bind-phase=allocating``, times);
* the annotations arrived in the same write that set ``spec.nodeName`` (a watch never
  shows the pod bound without them);
* summed memory per GPU never exceeds the registered memory (nor compute 100 %, nor the
  split count), recomputed here from the pods' annotations alone;
* topoplace killed mid-run and restarted rebuilds the same ledger (every pod's shares);
* HAMi's node lock is released (``sharing.hami_lock: release``: no HAMi device plugin
  here to release it after Allocate).
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from scheduler.core.quantity import parse_quantity_int
from tests.kube.conftest import REPO, Topoplace, make_gpu_node
from tests.kube.test_live import wait_for
from tests.sharing.builders import T4_MIB, register

N_NODES = 12
GPUS = 4
SPLIT = 10
N_PODS = 200
HAMI_VALUE = re.compile(r"^(?:(?:GPU-[A-Za-z0-9-]+,NVIDIA,\d+,\d+:)*;)+$")
MEMS = (1000, 1500, 2000, 3000, 4000)
CORES = (0, 5, 10, 15, 20)


class ConfiguredTopoplace(Topoplace):
    """``topoplace serve`` with a policy file (``--config``)."""

    def __init__(self, *args: Any, config: Path, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.config = config

    def _tls_args(self) -> list[str]:
        return [*super()._tls_args(), "--config", str(self.config)]


def make_hami_nodes(
    core: Any,
    names: list[str],
    run_id: str,
    labels: dict[str, str],
    gpus: int = GPUS,
    **register_kw: Any,
) -> None:
    """Nodes of ``gpus`` GPUs registered as HAMi's device plugin registers them (its
    ``hami.io/node-nvidia-register`` annotation, ``gpus x SPLIT`` replicas advertised);
    ``register_kw`` goes to :func:`tests.sharing.builders.register` (memory, GPU type)."""
    for n in names:
        make_gpu_node(core, n, run_id, gpus=gpus, labels=labels)
        reg = register(n, gpus, **register_kw)
        core.patch_node(n, {"metadata": {"annotations": {"hami.io/node-nvidia-register": reg}}})
        replicas = str(gpus * SPLIT)  # HAMi's device plugin advertises split replicas
        core.patch_node_status(
            n,
            {
                "status": {
                    "capacity": {"nvidia.com/gpu": replicas},
                    "allocatable": {"nvidia.com/gpu": replicas},
                }
            },
        )


def delete_nodes(core: Any, names: list[str]) -> None:
    for n in names:
        with contextlib.suppress(Exception):
            core.delete_node(n)


@pytest.fixture(scope="module")
def hami_nodes(core: Any, run_id: str) -> Iterator[list[str]]:
    names = [f"tp-hami-{run_id}-{i:02d}" for i in range(N_NODES)]
    labels = {"nvidia.com/gpu.product": "Tesla-T4", "topoplace-it-frac": run_id}
    make_hami_nodes(core, names, run_id, labels)
    yield names
    delete_nodes(core, names)


@contextlib.contextmanager
def lock_released(topoplace: Topoplace, d: Path) -> Iterator[Topoplace]:
    """The suite's topoplace restarted with ``sharing.hami_lock: release`` (no HAMi device
    plugin here releases the node lock after Allocate); the original is started again after."""
    policy = yaml.safe_load((REPO / "config" / "policy.yaml").read_text())
    policy.setdefault("sharing", {})["hami_lock"] = "release"
    cfg = d / "policy.yaml"
    cfg.write_text(yaml.safe_dump(policy))
    topoplace.kill(signal.SIGTERM)
    tp = ConfiguredTopoplace(topoplace.kubeconfig, topoplace.port, d, topoplace.tls_dir, config=cfg)
    try:
        tp.start()
        tp.wait_ready()
        yield tp
    finally:
        tp.kill(signal.SIGTERM)
        topoplace.start()
        topoplace.wait_ready()


@pytest.fixture(scope="module")
def frac_topoplace(
    topoplace: Topoplace, hami_nodes: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Topoplace]:
    with lock_released(topoplace, tmp_path_factory.mktemp("frac")) as tp:
        yield tp


def share_pod(name: str, i: int, scheduler: str, run_id: str) -> dict[str, Any]:
    mem, cores = MEMS[i % len(MEMS)], CORES[(i // len(MEMS)) % len(CORES)]
    count = 2 if i % 17 == 0 else 1
    limits = {
        "nvidia.com/gpu": str(count),
        "nvidia.com/gpumem": str(mem),
        "nvidia.com/gpucores": str(cores),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {"topoplace-it-frac": run_id},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "server",
                    "image": "registry.k8s.io/pause:3.9",
                    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": limits},
                }
            ],
        },
    }


class BindWatch:
    """Watches the namespace; records pods ever seen bound without HAMi's annotations."""

    def __init__(self, core: Any, ns: str) -> None:
        from kubernetes import watch

        self.core, self.ns = core, ns
        self.w = watch.Watch()
        self.bound_without: list[str] = []
        self.bound_seen: set[str] = set()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        with contextlib.suppress(Exception):
            for ev in self.w.stream(self.core.list_namespaced_pod, self.ns, timeout_seconds=900):
                p = ev["object"]
                if p.spec.node_name and p.metadata.name not in self.bound_seen:
                    self.bound_seen.add(p.metadata.name)
                    ann = p.metadata.annotations or {}
                    if "hami.io/vgpu-devices-allocated" not in ann:
                        self.bound_without.append(p.metadata.name)

    def stop(self) -> None:
        self.w.stop()


def ledger_of(tp: Topoplace, ns: str) -> dict[str, Any]:
    out = {}
    for p in tp.get("/v1/inspect/placements")["placements"]:
        if p["pod"].startswith(ns + "/"):
            out[p["pod"]] = (p["node"], p["shares"], p["state"])
    return out


def test_200_fractional_pods_hami_handoff_and_restart(
    core: Any,
    frac_topoplace: Topoplace,
    hami_nodes: list[str],
    namespace: str,
    scheduler_name: str,
    run_id: str,
) -> None:
    tp = frac_topoplace
    wait_for(
        lambda: {n["name"] for n in tp.get("/v1/inspect/nodes")["nodes"]} >= set(hami_nodes),
        30,
        "HAMi nodes seen by topoplace",
    )
    watch = BindWatch(core, namespace)
    names = [f"frac-{i:03d}" for i in range(N_PODS)]
    half = N_PODS // 2

    def bound_count(subset: list[str]) -> int:
        pods = core.list_namespaced_pod(namespace).items
        return sum(1 for p in pods if p.metadata.name in subset and p.spec.node_name)

    try:
        for i, n in enumerate(names[:half]):
            core.create_namespaced_pod(namespace, share_pod(n, i, scheduler_name, run_id))
        wait_for(lambda: bound_count(names[:half]) == half, 240, "first 100 pods bound", 1)
        before = ledger_of(tp, namespace)
        assert len(before) == half
        # Restart mid-run: a crash (SIGKILL), then the ledger from the API alone.
        tp.kill(signal.SIGKILL)
        tp.start()
        tp.wait_ready()
        after = ledger_of(tp, namespace)
        assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in before.items()}
        for i, n in enumerate(names[half:], half):
            core.create_namespaced_pod(namespace, share_pod(n, i, scheduler_name, run_id))
        wait_for(lambda: bound_count(names) == N_PODS, 300, "all 200 pods bound", 1)
    finally:
        watch.stop()

    pods = [p for p in core.list_namespaced_pod(namespace).items if p.metadata.name in names]
    assert len(pods) == N_PODS
    nodes = {n: core.read_node(n) for n in hami_nodes}
    uuids = {
        n: {
            d["id"]: d
            for d in orjson.loads(node.metadata.annotations["hami.io/node-nvidia-register"])
        }
        for n, node in nodes.items()
    }
    mem: dict[tuple[str, str], int] = defaultdict(int)
    cores: dict[tuple[str, str], int] = defaultdict(int)
    tasks: dict[tuple[str, str], int] = defaultdict(int)
    for p in pods:
        ann = p.metadata.annotations or {}
        node = p.spec.node_name
        value = ann["hami.io/vgpu-devices-allocated"]
        assert HAMI_VALUE.match(value), value
        assert ann["hami.io/vgpu-devices-to-allocate"] == value
        assert ann["hami.io/vgpu-node"] == node
        assert ann["hami.io/bind-phase"] == "allocating"
        assert ann["hami.io/bind-time"].isdigit() and ann["hami.io/vgpu-time"].isdigit()
        spec = p.spec.containers[0].resources.limits
        entries = [e for e in value.rstrip(";").split(":") if e]
        assert len(entries) == int(spec["nvidia.com/gpu"])
        assert len({e.split(",")[0] for e in entries}) == len(entries)
        for e in entries:
            uuid, typ, m, c = e.split(",")
            assert uuid in uuids[node] and typ == "NVIDIA"
            # the API server canonicalizes quantities ("1000" comes back as "1k")
            want = (spec["nvidia.com/gpumem"], spec["nvidia.com/gpucores"])
            assert (int(m), int(c)) == tuple(parse_quantity_int(q) for q in want)
            mem[node, uuid] += int(m)
            cores[node, uuid] += int(c)
            tasks[node, uuid] += 1
    for key, used in mem.items():
        assert used <= T4_MIB, f"GPU {key} holds {used} MiB > {T4_MIB}"
        assert cores[key] <= 100 and tasks[key] <= SPLIT
    # The annotations came with the binding, never after it.
    assert set(names) <= watch.bound_seen
    assert watch.bound_without == []
    # HAMi's node lock was taken and released on every node
    for n in hami_nodes:
        assert "hami.io/mutex.lock" not in (core.read_node(n).metadata.annotations or {})
    # topoplace's ledger equals the annotations
    led = ledger_of(tp, namespace)
    assert len(led) == N_PODS
    per_gpu: dict[tuple[str, int], int] = defaultdict(int)
    for node, shares, _ in led.values():
        for g, m, _c in shares:
            per_gpu[node, g] += m
    by_index = {
        (n, d.get("index", 0)): m
        for n in hami_nodes
        for uid, d in uuids[n].items()
        if (m := mem.get((n, uid)))
    }
    assert dict(per_gpu) == by_index
