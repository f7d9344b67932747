"""Memory-sized GPU shares pack near the optimum live (opt-in, ``kube``).

The case of ``tests/sharing/test_memory_sized_packing.py`` through the real kube-scheduler
with the configuration topoplace ships: 48 HAMi pods of 10, 20, 40 and 30 GiB of GPU memory
(12 of each, in turn), each with 25 % of the SMs, on eight nodes of 8 x A100-80GB registered
as HAMi's device plugin registers them. 1,200 GiB over 80 GiB GPUs: 15 GPUs at the least;
FGD's one-number measure takes 23. Each pod is created once the one before it is bound, so
the arrival order is exactly the offline test's. The GPUs used are read back from the
``hami.io/vgpu-devices-allocated`` annotations alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.kube.conftest import Topoplace
from tests.kube.test_fractional_live import (
    delete_nodes,
    lock_released,
    make_hami_nodes,
)
from tests.kube.test_live import wait_for

A100_80GB_MIB = 81920
N_NODES = 8
SIZES_GIB = (10, 20, 40, 30)
IN_TURN = [SIZES_GIB[i % 4] for i in range(48)]
LABEL = "topoplace-it-pack"


@pytest.fixture(scope="module")
def a100_nodes(core: Any, run_id: str) -> Iterator[list[str]]:
    names = [f"tp-a100-{run_id}-{i}" for i in range(N_NODES)]
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", LABEL: run_id}
    make_hami_nodes(
        core,
        names,
        run_id,
        labels,
        gpus=8,
        memory_mib=A100_80GB_MIB,
        gpu_type="NVIDIA-A100-SXM4-80GB",
    )
    yield names
    delete_nodes(core, names)


@pytest.fixture(scope="module")
def pack_topoplace(
    topoplace: Topoplace, a100_nodes: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Topoplace]:
    with lock_released(topoplace, tmp_path_factory.mktemp("pack")) as tp:
        yield tp


def _pod(name: str, gib: int, scheduler: str, run_id: str) -> dict[str, Any]:
    limits = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": str(gib * 1024),
        "nvidia.com/gpucores": "25",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {LABEL: run_id},
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


def test_48_memory_sized_shares_take_at_most_16_gpus(
    core: Any, pack_topoplace: Topoplace, namespace: str, scheduler_name: str, run_id: str
) -> None:
    per_gpu: dict[str, list[int]] = {}
    try:
        for k, gib in enumerate(IN_TURN):
            name = f"pk-{k:02d}-{gib}g"
            core.create_namespaced_pod(namespace, _pod(name, gib, scheduler_name, run_id))
            pod = wait_for(
                lambda n=name: (p := core.read_namespaced_pod(n, namespace)).spec.node_name and p,
                60,
                f"{name} bound",
            )
            value = (pod.metadata.annotations or {})["hami.io/vgpu-devices-allocated"]
            uuid, _, mib, cores = value.rstrip(":;").split(",")
            assert (int(mib), int(cores)) == (gib * 1024, 25), value
            per_gpu.setdefault(uuid, []).append(gib)
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    assert sum(len(v) for v in per_gpu.values()) == 48
    assert all(sum(v) <= 80 and len(v) <= 4 for v in per_gpu.values()), per_gpu  # no overcommit
    assert 15 <= len(per_gpu) <= 16, sorted(per_gpu.items())
