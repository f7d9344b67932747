"""The live DRA benchmark's offline side and objects (``benchmarks/live/dra.py``); its live
side needs a control plane and runs by hand (``python -m benchmarks.live.dra``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from benchmarks.clusters import node_slices
from benchmarks.live import dra as live_dra

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kube" / "dra-1.33"


def _cluster(n: int) -> tuple[list[dict], list[dict], list[dict]]:
    nodes = live_dra.node_objects(n, "t")
    slices = [
        dict(s, kind="ResourceSlice") for s in node_slices([o["metadata"]["name"] for o in nodes])
    ]
    classes = json.loads((FIXTURES / "deviceclasses.v1beta1.json").read_text())["items"]
    return nodes, slices, [dict(c, kind="DeviceClass") for c in classes]


def test_dra_nodes_advertise_no_device_plugin_gpus() -> None:
    (node,) = live_dra.node_objects(1, "t")
    assert "nvidia.com/gpu" not in node["status"]["capacity"]
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"


def test_claims_have_the_shape_of_their_api_version() -> None:
    old = live_dra.claim_object("c", 4, "v1beta1")["spec"]["devices"]["requests"][0]
    new = live_dra.claim_object("c", 4, "v1beta2")["spec"]["devices"]["requests"][0]
    assert (old["count"], old["deviceClassName"]) == (4, "gpu.nvidia.com")
    assert (new["exactly"]["count"], new["exactly"]["deviceClassName"]) == (4, "gpu.nvidia.com")


def test_offline_replay_packs_the_claims_pod_after_pod_without_sharing_a_device() -> None:
    """1, 2, 4, 8 GPUs in turn (12 pods, 45 GPUs) on eight nodes: every pod placed, with as
    many devices as its claim asks, no device twice, on six nodes (45 GPUs need six;
    topoplace packs) and the 8-GPU claims on nodes of their own."""
    nodes, slices, classes = _cluster(8)
    work = live_dra.workload(12)
    got = live_dra.offline(nodes, slices, classes, "v1beta2", work)
    assert sorted(got) == [p for p, _, _ in work]
    taken = [(node, d) for node, devs in got.values() for d in devs]
    assert len(taken) == len(set(taken)) == 45
    for pod, _, size in work:
        assert len(got[pod][1]) == size
    per_node = Counter(node for node, _ in taken)
    assert len(per_node) == 6 and max(per_node.values()) == 8
    eights = [got[p][0] for p, _, size in work if size == 8]
    assert all(per_node[n] == 8 and sum(1 for v in got.values() if v[0] == n) == 1 for n in eights)
