"""Gangs declared by Grove's PodGang and by Kubernetes' own PodGroup, through the real
kube-scheduler with the configuration topoplace ships.

* Grove (``scheduler.grove.io/v1alpha1`` PodGang, pods labelled ``grove.io/podgang``): the
  test installs the PodGang CRD (Grove's operator is not needed: the PodGang is what it
  would create), restarts topoplace so that it discovers the API, and checks that the gang
  is sized by ``minReplicas`` and kept in one leaf by ``packConstraint.required``.
* Kubernetes (``scheduling.k8s.io/v1alpha2`` PodGroup, pods naming it in
  ``spec.schedulingGroup``): served from 1.35 with the alpha gate ``GenericWorkload``, which
  the suite's own plane turns on; skipped with the reason where the API is not served.

The four test nodes sit on two leaves (nodes 0-1 on leaf-0, 2-3 on leaf-1). With 4 GPUs
held on node 0 and on node 2, a gang of three 4-GPU members fits in one leaf only as 4 + 8
GPUs; packing alone would take the two half-full nodes, across both leaves.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from tests.kube.conftest import Topoplace
from tests.kube.test_live import bound, delete_pods, gpu_pod, placement, wait_all_free, wait_for

LEAF = "network.topology.nvidia.com/leaf"

PODGANG_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podgangs.scheduler.grove.io"},
    "spec": {
        "group": "scheduler.grove.io",
        "scope": "Namespaced",
        "names": {"plural": "podgangs", "singular": "podgang", "kind": "PodGang"},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def _served(api: Any, group: str, version: str, plural: str) -> bool:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        res = client.CustomObjectsApi(api).get_api_resources(group, version)
    except ApiException:
        return False
    return any(r.name == plural for r in (res.resources or []))


def _blockers(core: Any, ns: str, scheduler: str, run_id: str, nodes: list[str]) -> None:
    for i in (0, 2):
        core.create_namespaced_pod(ns, gpu_pod(f"half-{i}", 4, scheduler, run_id, node=nodes[i]))
    wait_for(lambda: len(bound(core, ns, ["half-0", "half-2"])) == 2, 60, "blockers bound")


def _assert_one_leaf(core: Any, ns: str, members: list[str], nodes: list[str], gang: str) -> None:
    got = wait_for(
        lambda: (b := bound(core, ns, members)) and len(b) == len(members) and b, 90, "gang bound"
    )
    used = {p.spec.node_name for p in got.values()}
    leaves = {nodes.index(n) // 2 for n in used}
    assert len(leaves) == 1, f"gang spread over leaves: {sorted(used)}"
    assert {placement(p).get("gang") for p in got.values()} == {f"{ns}/{gang}"}


def _member(name: str, scheduler: str, run_id: str, **extra: Any) -> dict[str, Any]:
    pod = gpu_pod(name, 4, scheduler, run_id)
    pod["metadata"].setdefault("labels", {}).update(extra.get("labels", {}))
    pod["spec"].update(extra.get("spec", {}))
    return pod


def test_grove_podgang_sizes_and_packs_the_gang(
    core: Any,
    kubeconfig: str,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    run_id: str,
    gpu_nodes: list[str],
) -> None:
    from kubernetes import client

    api = core.api_client
    ext = client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    with contextlib.suppress(client.exceptions.ApiException):
        ext.create_custom_resource_definition(PODGANG_CRD)
    wait_for(
        lambda: _served(api, "scheduler.grove.io", "v1alpha1", "podgangs"), 30, "PodGang served"
    )
    members = [f"pg-w-{i}" for i in range(3)]
    gang = {
        "apiVersion": "scheduler.grove.io/v1alpha1",
        "kind": "PodGang",
        "metadata": {"name": "pg", "namespace": namespace},
        "spec": {
            "podgroups": [
                {
                    "name": "pg-w",
                    "podReferences": [{"namespace": namespace, "name": m} for m in members],
                    "minReplicas": 3,
                }
            ],
            "topologyConstraint": {"packConstraint": {"required": LEAF}},
        },
    }
    custom.create_namespaced_custom_object(
        "scheduler.grove.io", "v1alpha1", namespace, "podgangs", gang
    )
    try:
        with topoplace.restarted():  # discovers the new API at start
            _blockers(core, namespace, scheduler_name, run_id, gpu_nodes)
            for m in members:
                core.create_namespaced_pod(
                    namespace,
                    _member(m, scheduler_name, run_id, labels={"grove.io/podgang": "pg"}),
                )
            _assert_one_leaf(core, namespace, members, gpu_nodes, "pg")
            delete_pods(core, namespace, [*members, "half-0", "half-2"])
            wait_all_free(topoplace, gpu_nodes)
    finally:
        with contextlib.suppress(client.exceptions.ApiException):
            custom.delete_namespaced_custom_object(
                "scheduler.grove.io", "v1alpha1", namespace, "podgangs", "pg"
            )


def test_kubernetes_podgroup_sizes_and_packs_the_gang(
    core: Any,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    run_id: str,
    gpu_nodes: list[str],
) -> None:
    from kubernetes import client

    api = core.api_client
    if not _served(api, "scheduling.k8s.io", "v1alpha2", "podgroups"):
        pytest.skip(
            "scheduling.k8s.io/v1alpha2 PodGroups are not served (Kubernetes >= 1.35 with "
            "the GenericWorkload gate; the suite's own plane turns it on)"
        )
    custom = client.CustomObjectsApi(api)
    members = [f"kg-w-{i}" for i in range(3)]
    group = {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "kg", "namespace": namespace},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 3}},
            "schedulingConstraints": {"topology": [{"key": LEAF}]},
        },
    }
    custom.create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", namespace, "podgroups", group
    )
    try:
        # topoplace discovered the API at its start (the plane served it already); wait
        # until its watch holds the object.
        time.sleep(1.0)
        _blockers(core, namespace, scheduler_name, run_id, gpu_nodes)
        for m in members:
            core.create_namespaced_pod(
                namespace,
                _member(
                    m, scheduler_name, run_id, spec={"schedulingGroup": {"podGroupName": "kg"}}
                ),
            )
        _assert_one_leaf(core, namespace, members, gpu_nodes, "kg")
        delete_pods(core, namespace, [*members, "half-0", "half-2"])
        wait_all_free(topoplace, gpu_nodes)
    finally:
        with contextlib.suppress(client.exceptions.ApiException):
            custom.delete_namespaced_custom_object(
                "scheduling.k8s.io", "v1alpha2", namespace, "podgroups", "kg"
            )
