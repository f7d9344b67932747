"""Node, ResourceSlice and DeviceClass objects of the test cluster, against objects
recorded from a real Kubernetes v1.33.0 control plane (``tests/fixtures/kube/dra-1.33``)
and read back by topoplace's own parsers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.cluster.dra import (
    MEMORY_SLICES,
    MIG_PROFILES,
    GpuShape,
    device_class,
    node_slices,
)
from benchmarks.cluster.nodes import fabric, gpu_node, gpu_nodes
from scheduler.core.health import HealthParams, assess_node, devices_by_node
from scheduler.core.objects import _hami_gpu_count, node_gpus

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "kube" / "dra-1.33"
SERVER_FIELDS = ("creationTimestamp", "resourceVersion", "uid", "generation", "managedFields")


def _items(name: str) -> list[dict[str, Any]]:
    return json.loads((FIX / name).read_text())["items"]


def _by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["metadata"]["name"]: i for i in items}


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_slice_is_what_the_real_server_stored(version: str) -> None:
    """gpu-node-0's slice as kube-apiserver v1.33.0 returned it, listed through each
    version (v1beta1 nests devices under ``basic``): the spec is the same, byte for byte."""
    recorded = _by_name(_items(f"resourceslices.{version}.json"))["gpu-node-0-gpu.nvidia.com"]
    (ours,) = node_slices("gpu-node-0", version)
    assert ours["spec"] == recorded["spec"]
    assert ours["metadata"]["name"] == recorded["metadata"]["name"]
    assert ours["apiVersion"] == f"resource.k8s.io/{version}"


def test_device_class_is_what_the_real_server_stored() -> None:
    recorded = _by_name(_items("deviceclasses.v1beta1.json"))["gpu.nvidia.com"]
    assert device_class("v1beta1")["spec"] == recorded["spec"]


def test_no_pcie_root_drops_both_attributes_and_roots_pair_up() -> None:
    (plain,) = node_slices("n", "v1", shape=GpuShape(pcie_root=False))
    for d in plain["spec"]["devices"]:
        assert "resource.kubernetes.io/pcieRoot" not in d["attributes"]
        assert "pcieBusID" not in d["attributes"]
    (quad,) = node_slices("n", "v1", shape=GpuShape(gpus_per_pcie_root=4))
    roots = [
        d["attributes"]["resource.kubernetes.io/pcieRoot"]["string"]
        for d in quad["spec"]["devices"]
    ]
    assert roots == ["pci0000:10"] * 4 + ["pci0000:20"] * 4


@pytest.mark.parametrize("separate", [False, True])
def test_mig_partitions_share_counters(separate: bool) -> None:
    """Every device consumes from a counter set of its pool, counter sets sit in their own
    slices from 1.35 (``separate``) and beside the devices before, and no two placements of
    one profile overlap."""
    slices = node_slices("n", "v1", gpus=8, mig=2, separate_counters=separate)
    names = [s["metadata"]["name"] for s in slices]
    want = ["n-gpu.nvidia.com-gpu-0", "n-gpu.nvidia.com-gpu-1", "n-gpu.nvidia.com-rest"]
    assert names == (["n-gpu.nvidia.com-counters-0", *want] if separate else want)
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    sets = {c["name"]: c for s in slices for c in s["spec"].get("sharedCounters") or []}
    assert set(sets) == {"gpu-0-counter-set", "gpu-1-counter-set"}
    for s in slices:
        has_devices, has_counters = bool(s["spec"].get("devices")), "sharedCounters" in s["spec"]
        assert not (separate and has_devices and has_counters)
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    per_gpu = sum(len(starts) for _, _, _, starts, _, _ in MIG_PROFILES)
    assert len(devices) == 8 + 2 * per_gpu
    for d in devices:
        for use in d.get("consumesCounters") or []:
            counters = sets[use["counterSet"]]["counters"]
            assert set(use["counters"]) <= set(counters)
            slots = [k for k in use["counters"] if k.startswith("memory-slice-")]
            assert all(int(k.rsplit("-", 1)[1]) < MEMORY_SLICES for k in slots)
    full = next(d for d in devices if d["name"] == "gpu-0")
    assert len(full["consumesCounters"][0]["counters"]) == MEMORY_SLICES + 1


def test_v1_slices_are_read_as_eight_gpus_per_node_by_topoplace() -> None:
    slices = [s for n in ("a", "b") for s in node_slices(n, "v1")]
    got = devices_by_node(slices, HealthParams())
    assert {n: len(d) for n, d in got.items()} == {"a": 8, "b": 8}


def test_node_has_the_recorded_nodes_shape() -> None:
    """A DRA node next to the one fake nodes were recorded as on v1.33.0: Ready, untainted,
    no ``nvidia.com/gpu``, GFD labels, the status fields a kubelet registers."""
    recorded = _by_name(_items("nodes.json"))["gpu-node-0"]
    ours = gpu_node("gpu-node-0", sharing="dra")
    assert ours["spec"] == recorded["spec"] == {}
    assert "uid" not in ours["metadata"]
    for k in ("kubernetes.io/hostname", "kubernetes.io/os", "nvidia.com/gpu.count",
              "nvidia.com/gpu.present", "nvidia.com/gpu.product"):  # fmt: skip
        assert ours["metadata"]["labels"][k] == recorded["metadata"]["labels"][k], k
    ready = next(c for c in ours["status"]["conditions"] if c["type"] == "Ready")
    rec_ready = next(c for c in recorded["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == (rec_ready["status"], rec_ready["reason"])
    assert set(ours["status"]["nodeInfo"]) >= set(recorded["status"]["nodeInfo"]) - {
        "kubeProxyVersion"
    }
    assert "nvidia.com/gpu" not in ours["status"]["capacity"]
    assert node_gpus(ours) == (0, 0)


def test_device_plugin_node_is_healthy_to_topoplace_now() -> None:
    node = gpu_node("x", gpus=4, clique="c1.1", leaf="l0", spine="s0")
    labels = node["metadata"]["labels"]
    assert (labels["nvidia.com/gpu.clique"], labels["network.topology.nvidia.com/leaf"]) == (
        "c1.1",
        "l0",
    )
    assert node_gpus(node) == (4, 4)
    verdict = assess_node(node, 4, 4, HealthParams(), now=time.time())
    assert verdict.state.name == "HEALTHY" and not verdict.reasons, verdict


def test_hami_node_registers_each_gpu_and_splits_the_count() -> None:
    node = gpu_node("h", gpus=2, sharing="hami", hami_split=5)
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "10"
    assert _hami_gpu_count(node["metadata"]["annotations"]) == 2
    reg = json.loads(node["metadata"]["annotations"]["hami.io/node-nvidia-register"])
    assert [d["count"] for d in reg] == [5, 5]


def test_fabric_and_bad_arguments() -> None:
    assert [fabric(i) for i in (0, 1, 2, 4)] == [
        {"leaf": "leaf-0", "spine": "spine-0"},
        {"leaf": "leaf-0", "spine": "spine-0"},
        {"leaf": "leaf-1", "spine": "spine-0"},
        {"leaf": "leaf-2", "spine": "spine-1"},
    ]
    names = [n["metadata"]["name"] for n in gpu_nodes(3, prefix="g-")]
    assert names == ["g-0", "g-1", "g-2"]
    with pytest.raises(ValueError, match="sharing"):
        gpu_node("x", sharing="mig")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        gpu_node("x", gpus=-1)


def test_heartbeat_patch_touches_only_the_ready_heartbeat() -> None:
    from benchmarks.cluster.nodes import heartbeat_patch

    assert heartbeat_patch("2026-12-07T00:00:00Z") == {
        "status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": "2026-12-07T00:00:00Z"}]}
    }


def test_a_node_is_degraded_once_its_heartbeat_is_older_than_topoplace_allows() -> None:
    """Why the suite's nodes heartbeat: the same node, 361 s later, is degraded."""
    node = gpu_node("x", now="2026-12-07T00:00:00Z")
    t0 = 1796601600.0  # 2026-12-07T00:00:00Z
    params = HealthParams()
    assert (
        assess_node(node, 8, 8, params, now=t0 + params.heartbeat_stale_seconds - 1).state.name
        == "HEALTHY"
    )
    late = assess_node(node, 8, 8, params, now=t0 + params.heartbeat_stale_seconds + 1)
    assert (late.state.name, late.reasons) == ("DEGRADED", ("node heartbeat stale",))
