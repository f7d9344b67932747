"""Re-placement after a hardware failure, through the real kube-scheduler.

A training gang of two 8-GPU members and a pod alone run on nodes of their own. NVSentinel's
fatal XID condition appears on one member's node: topoplace (the shipped policy's
``remediation``, with a short ``after_seconds``) evicts that member *and the other one*,
whose hardware is fine (a gang cannot run with a member missing), through the Eviction API;
the pod alone, on another node, is left running. The test then does what the job
controller does, recreates the members, and the real kube-scheduler, with topoplace as its
extender, binds them on healthy nodes; topoplace counts them as re-placements. When the API
server serves DRA, a second case taints one GPU in the node's ResourceSlice (the DRA
driver's XID taint): only the pod holding that GPU is evicted, and its successor gets
another GPU of the same node.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube.conftest import REPO, Topoplace, make_gpu_node
from tests.kube.test_dra import _metric, kube_api  # noqa: F401 (a fixture)
from tests.kube.test_health_live import fail_node
from tests.kube.test_live import (  # noqa: F401 (clean: autouse)
    bound,
    clean,
    gang_annotations,
    gpu_pod,
    placement,
    wait_for,
)

AFTER_S = 2


def _policy(tmp_path: Path) -> Path:
    """The shipped policy with a short remediation delay."""
    policy = yaml.safe_load((REPO / "config" / "policy.yaml").read_text())
    assert policy["remediation"]["mode"] == "evict"  # what the shipped policy does
    policy["remediation"].update(after_seconds=AFTER_S, check_seconds=0.5)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


def _placement(pod: Any) -> tuple[str, tuple[int, ...]]:
    rec = placement(pod)
    return rec["node"], tuple(rec["gpus"])


def _all_bound(core: Any, namespace: str, names: list[str]) -> dict[str, Any]:
    """Every one of ``names`` bound (name -> pod), else {} (``bound`` gives any subset)."""
    got = bound(core, namespace, names)
    return got if len(got) == len(names) else {}


def _gone(core: Any, namespace: str, names: list[str], uids: dict[str, str]) -> bool:
    """Every one of ``names`` deleted (or replaced by a namesake)."""
    live = {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(namespace).items}
    return all(live.get(n) != uids[n] for n in names)


def test_a_failed_node_takes_its_gang_out_and_the_gang_comes_back_whole_elsewhere(
    core: Any,
    namespace: str,
    topoplace: Topoplace,
    scheduler_name: str,
    run_id: str,
    tmp_path: Path,
    kube_api: Any,  # noqa: F811
) -> None:
    label = f"{run_id}-remedy"
    nodes = [f"tp-it-{run_id}-remedy-{i}" for i in range(4)]
    for n in nodes:
        make_gpu_node(core, n, label)
    ann = gang_annotations("train", 2)
    try:
        with topoplace.restarted(args=("--config", str(_policy(tmp_path)))):
            before = {
                k: _metric(
                    topoplace,
                    f'topoplace_remediation_evictions_total{{kind="{k}",outcome="evicted"}}',
                )
                for k in ("node", "gang")
            }
            for name in ("w0", "w1"):
                core.create_namespaced_pod(
                    namespace, gpu_pod(name, 8, scheduler_name, label, annotations=ann)
                )
            core.create_namespaced_pod(namespace, gpu_pod("solo", 8, scheduler_name, label))
            first = wait_for(
                lambda: _all_bound(core, namespace, ["w0", "w1", "solo"]), 60, "all bound"
            )
            where = {n: p.spec.node_name for n, p in first.items()}
            uids = {n: p.metadata.uid for n, p in first.items()}
            assert len(set(where.values())) == 3, where
            broken = where["w0"]
            fail_node(core, broken)
            wait_for(
                lambda: _gone(core, namespace, ["w0", "w1"], uids),
                AFTER_S + 30,
                "topoplace to evict both gang members",
            )
            assert core.read_namespaced_pod("solo", namespace).metadata.uid == uids["solo"]
            # Each eviction's Event is written after the pod is gone, then it is counted.
            wait_for(
                lambda: (
                    {f"{namespace}/w0", f"{namespace}/w1"}
                    <= {r["pod"] for r in topoplace.get("/v1/inspect/remediation")["recent"]}
                ),
                10,
                "both evictions recorded",
            )
            # Why they went, where kubectl describe and kubectl get events show it.
            events = kube_api.request_json(
                "GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
            )["items"]
            told = {
                e["regarding"]["uid"]: e["note"]
                for e in events
                if e.get("reason") == "HardwareFailure" and e.get("action") == "Evict"
            }
            # (the namespace is the suite's: other tests' evictions are told there too)
            assert {uids["w0"], uids["w1"]} <= set(told) and uids["solo"] not in told, told
            assert "GPU fault condition" in told[uids["w0"]]
            # and what topoplace says it did
            done = topoplace.get("/v1/inspect/remediation")["recent"]
            mine = {(r["pod"], r["kind"], r["outcome"]) for r in done}
            assert {
                (f"{namespace}/w0", "node", "evicted"),
                (f"{namespace}/w1", "gang", "evicted"),
            } <= mine, done
            after = {
                k: _metric(
                    topoplace,
                    f'topoplace_remediation_evictions_total{{kind="{k}",outcome="evicted"}}',
                )
                for k in ("node", "gang")
            }
            assert after == {"node": before["node"] + 1, "gang": before["gang"] + 1}
            # The job controller's part: the members again, under new UIDs.
            for name in ("w0", "w1"):
                core.create_namespaced_pod(
                    namespace, gpu_pod(name, 8, scheduler_name, label, annotations=ann)
                )
            again = wait_for(lambda: _all_bound(core, namespace, ["w0", "w1"]), 60, "re-placed")
            placed = {n: p.spec.node_name for n, p in again.items()}
            assert broken not in placed.values() and where["solo"] not in placed.values()
            assert len(set(placed.values())) == 2, placed
            wait_for(
                lambda: (
                    _metric(topoplace, 'topoplace_replacements_total{kind="gang"}') >= 1
                    and _metric(topoplace, 'topoplace_replacements_total{kind="node"}') >= 1
                ),
                15,
                "topoplace to count both successors as re-placements",
            )
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        for n in nodes:
            core.delete_node(n)


def test_a_tainted_gpu_takes_out_only_the_pod_that_holds_it(
    core: Any,
    namespace: str,
    topoplace: Topoplace,
    scheduler_name: str,
    run_id: str,
    tmp_path: Path,
    kube_api: Any,  # noqa: F811
) -> None:
    version = _dra_version(kube_api)
    if version is None:
        pytest.skip("the API server does not serve resource.k8s.io (run the DRA control plane)")
    label = f"{run_id}-gpu"
    node = f"tp-it-{run_id}-gpu-0"
    make_gpu_node(core, node, label)
    slice_name = f"{node}-gpu.nvidia.com"
    base = f"/apis/resource.k8s.io/{version}/resourceslices"

    def devices(tainted: int | None) -> list[dict[str, Any]]:
        out = []
        for i in range(8):
            body: dict[str, Any] = {"attributes": {"index": {"int": i}, "type": {"string": "gpu"}}}
            if i == tainted:
                body["taints"] = [
                    {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}
                ]
            out.append({"name": f"gpu-{i}", **({"basic": body} if version == "v1beta1" else body)})
        return out

    def slice_obj(tainted: int | None, generation: int) -> dict[str, Any]:
        return {
            "apiVersion": f"resource.k8s.io/{version}",
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                "devices": devices(tainted),
            },
        }

    try:
        kube_api.request_json("POST", base, slice_obj(None, 1))
        with topoplace.restarted(args=("--config", str(_policy(tmp_path)))):
            for name in ("pair-a", "pair-b"):
                core.create_namespaced_pod(namespace, gpu_pod(name, 2, scheduler_name, label))
            first = wait_for(
                lambda: _all_bound(core, namespace, ["pair-a", "pair-b"]), 60, "both bound"
            )
            uids = {n: p.metadata.uid for n, p in first.items()}
            _, gpus = _placement(first["pair-a"])
            current = kube_api.request_json("GET", f"{base}/{slice_name}")
            new = slice_obj(gpus[0], 2)
            new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            got = kube_api.request_json("PUT", f"{base}/{slice_name}", new)
            dev = got["spec"]["devices"][gpus[0]]
            if not dev.get("basic", dev).get("taints"):
                pytest.skip(
                    "kube-apiserver dropped device taints (FEATURE_GATES=DRADeviceTaints=true)"
                )
            wait_for(
                lambda: _gone(core, namespace, ["pair-a"], uids),
                AFTER_S + 30,
                "topoplace to evict the pod on the tainted GPU",
            )
            assert core.read_namespaced_pod("pair-b", namespace).metadata.uid == uids["pair-b"]
            core.create_namespaced_pod(namespace, gpu_pod("pair-a", 2, scheduler_name, label))
            again = wait_for(lambda: bound(core, namespace, ["pair-a"]), 60, "re-placed")
            n, new_gpus = _placement(again["pair-a"])
            assert n == node and gpus[0] not in new_gpus, (gpus, new_gpus)
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        with contextlib.suppress(Exception):
            kube_api.request_json("DELETE", f"{base}/{slice_name}")
        core.delete_node(node)


def _dra_version(api: Any) -> str | None:
    from scheduler.kube.dra import served_version

    return served_version(api)
