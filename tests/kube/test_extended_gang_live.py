"""Gangs of plain ``nvidia.com/gpu`` pods on DRA nodes, against a real API server and a real
kube-scheduler (>= 1.34, ``DRAExtendedResource``; on by default in 1.36).

A gang of 4-GPU pods (``topoplace.io/gang`` + ``topoplace.io/gang-size``) on nodes that
publish their GPUs as ResourceSlice devices, behind a DeviceClass naming ``nvidia.com/gpu``:
topoplace plans it whole, predicting the first fit kube-scheduler's allocator gives each
member's special claim, and kube-scheduler binds it through the shipped configuration. The
same pods on device-plugin nodes land on the same nodes of their pair with the same GPUs.
Skips where the server drops ``DeviceClass.spec.extendedResourceName`` (before 1.34).
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from scheduler.core.gang import DRA_CHOICE_ANNOTATION
from tests.kube.conftest import NODE_LABEL, Topoplace, make_gpu_node
from tests.kube.test_dra import (  # noqa: F401  (fixtures)
    DGX1,
    Claims,
    DraCluster,
    _gpu_set,
    _wait_nodes,
    claims,
    cluster,
    dra_version,
    er_class,
    kube_api,
)
from tests.kube.test_live import wait_for

pytestmark = pytest.mark.kube

MEMBERS = 3
GPUS = 4


def _member(
    core: Any,
    ns: str,
    gang: str,
    i: int,
    profile: str,
    selector: dict,
    gpus: int = GPUS,
    gated: bool = False,
) -> str:
    """Member ``i`` of ``gang`` (:data:`MEMBERS`): a pod asking ``nvidia.com/gpu: gpus``
    (``gated``: with the scheduling gate ``topoplace.io/allocate``)."""
    name = f"{gang}-{i}"
    core.create_namespaced_pod(
        ns,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": ns,
                "annotations": {
                    "topoplace.io/gang": gang,
                    "topoplace.io/gang-size": str(MEMBERS),
                },
            },
            "spec": {
                "schedulerName": profile,
                "nodeSelector": selector,
                "terminationGracePeriodSeconds": 0,
                **({"schedulingGates": [{"name": "topoplace.io/allocate"}]} if gated else {}),
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
    return name


def _plan(tp: Topoplace, key: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(node, GPUs, member) of every slot of gang ``key``'s plan, as topoplace shows it."""
    plan = tp.get("/v1/inspect/placements")["gangs"][key]
    return [(s["node"], tuple(s["gpus"]), s["member"]) for s in plan["slots"]]


def test_a_gang_of_gpu_pods_binds_whole_on_dra_nodes_as_on_device_plugin_nodes(
    topoplace: Topoplace,
    scheduler_name: str,
    cluster: DraCluster,  # noqa: F811
    er_class: str,  # noqa: F811
    claims: Claims,  # noqa: F811
    core: Any,
    run_id: str,
    namespace: str,
) -> None:
    """Three members of 4 GPUs, two 8-GPU nodes on each side: every member binds, each on
    the node and with the GPUs of topoplace's plan (on the DRA side the GPUs its special
    claim holds), and the device-plugin side lands identically (node of its pair, GPU set)."""
    dp = [f"tp-dpg-{run_id}-{cluster.tag}-{i}"[:63] for i in range(2)]
    for n in dp:
        make_gpu_node(core, n, run_id, gpus=8, labels={"topoplace-dpg": cluster.tag})
    try:
        dra_nodes = cluster.add_nodes(2)
        _wait_nodes(topoplace, dra_nodes)
        _wait_nodes(topoplace, dp)
        got: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
        for side, nodes, label in (
            ("dra", dra_nodes, {"topoplace-dra": cluster.tag}),
            ("dp", dp, {"topoplace-dpg": cluster.tag}),
        ):
            gang = f"eg-{side}"
            sel = {NODE_LABEL: run_id, **label}
            names = [_member(core, namespace, gang, i, scheduler_name, sel) for i in range(MEMBERS)]
            claims.pods += names
            for n in names:
                wait_for(lambda n=n: claims.node_of(n), 60, f"{n} bound")
            held = {f"{namespace}/{n}": _gpu_set(claims, namespace, n) for n in names}
            plan = _plan(topoplace, f"{namespace}/{gang}")
            assert sorted((node, gpus) for node, gpus, _ in plan) == sorted(held.values())
            for node, gpus, member in plan:
                assert held[member] == (node, gpus), (member, plan, held)
            got[side] = sorted((sorted(nodes).index(node), gpus) for node, gpus in held.values())
            print(f"\n{side}: {got[side]}")
        assert got["dra"] == got["dp"]
        assert sorted(i for i, _ in got["dra"]) in ([0, 0, 1], [0, 1, 1])
        for _, gpus in got["dra"]:
            assert len(gpus) == GPUS
    finally:
        for n in dp:
            with contextlib.suppress(Exception):
                core.delete_node(n)


def test_gated_members_get_the_plans_nvlink_pairs_in_their_claims(
    topoplace: Topoplace,
    scheduler_name: str,
    cluster: DraCluster,  # noqa: F811
    er_class: str,  # noqa: F811
    claims: Claims,  # noqa: F811
    core: Any,
    run_id: str,
    namespace: str,
) -> None:
    """Three members of 2 GPUs on DGX-1 (V100) nodes, gated with ``topoplace.io/allocate``
    on the DRA side (the allocator removes the gates and writes the choice annotation): the
    plan keeps the solver's NVLink pairs and each member's special claim (made by
    kube-scheduler's first fit) is given its pair at bind; the device-plugin side, ungated,
    lands on the same node of its pair with the same GPUs."""
    from topology.select import ring_bottleneck
    from topology.shape import CATALOG

    dp = [f"tp-dpn-{run_id}-{cluster.tag}-{i}"[:63] for i in range(2)]
    for n in dp:
        make_gpu_node(core, n, run_id, gpus=8, labels={"topoplace-dpn": cluster.tag})
        core.patch_node(n, {"metadata": {"annotations": DGX1}})
    try:
        dra_nodes = cluster.add_nodes(2, annotations=DGX1)
        _wait_nodes(topoplace, dra_nodes, "dgx1-v100")
        _wait_nodes(topoplace, dp, "dgx1-v100")
        got: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
        for side, nodes, label in (
            ("dra", dra_nodes, {"topoplace-dra": cluster.tag}),
            ("dp", dp, {"topoplace-dpn": cluster.tag}),
        ):
            gang = f"egn-{side}"
            sel = {NODE_LABEL: run_id, **label}
            gated = side == "dra"
            names = [
                _member(core, namespace, gang, i, scheduler_name, sel, gpus=2, gated=gated)
                for i in range(MEMBERS)
            ]
            claims.pods += names
            for n in names:
                wait_for(lambda n=n: claims.node_of(n), 60, f"{n} bound")
            held = {f"{namespace}/{n}": _gpu_set(claims, namespace, n) for n in names}
            for node, gpus, member in _plan(topoplace, f"{namespace}/{gang}"):
                assert held[member] == (node, gpus), (member, held)
            if gated:
                for n in names:
                    notes = core.read_namespaced_pod(n, namespace).metadata.annotations
                    assert notes.get(DRA_CHOICE_ANNOTATION) == "true", n
            got[side] = sorted((sorted(nodes).index(node), gpus) for node, gpus in held.values())
        shape = CATALOG["dgx1-v100"]
        bw = [ring_bottleneck(shape, list(g)) for _, g in got["dra"]]
        print(f"\nDRA (gated):    {got['dra']} {bw} GB/s\ndevice plugin:  {got['dp']}")
        assert got["dra"] == got["dp"]
        assert all(b >= 50.0 for b in bw), bw  # pairs joined by two NVLinks each
    finally:
        for n in dp:
            with contextlib.suppress(Exception):
                core.delete_node(n)
