"""Preemption through the real kube-scheduler with the configuration topoplace ships
(``preemptVerb: preempt``).

Two nodes, pods pinned to them at low priority, then a high-priority pod that fits
nowhere. kube-scheduler's DefaultPreemption runs its dry run and asks topoplace, which
answers with the node and victims it chooses:

1. a gang member and a pod alone of the same priority could go: the pod alone goes, the
   gang is left whole (kube-scheduler's own dry run cannot tell them apart);
2. only a gang member can go: it goes, and topoplace evicts the rest of its gang (the
   shipped policy's ``remediation``, with a short check period), so no member holds GPUs
   for a gang that cannot run;
3. a pod a PodDisruptionBudget protects stays while preempting on another node helps
   (kube-scheduler's first rule among candidate nodes, which topoplace keeps);
4. a HAMi pod: the victim is the pod whose GPU then has the memory the pod asks, not the
   one kube-scheduler's replica count picks;
5. a pod kube-scheduler sees room for (so it never preempts) while topoplace finds its GPUs
   taken: a HAMi pod on a free replica without the memory, a pod that needs NVLink on a
   DGX-1 whose four free GPUs form no ring. topoplace preempts on its own
   (``preemption.start``), holds the GPUs and wakes the pod;
6. a gang kube-scheduler sees room for member by member that topoplace cannot place whole
   (its members must share one node): topoplace evicts the pods of the lowest priority
   that free one node, plans the gang there and wakes its members.

Gangs preempting in whole, and a gang that cannot fit evicting nothing, are here too.
PriorityClasses are the suite's own (cluster-scoped, named after the run, deleted after).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from scheduler.core.model import PLACEMENT_ANNOTATION
from tests.kube.conftest import REPO, Topoplace, make_gpu_node, shipped_scheduler_wanted
from tests.kube.test_dra import _metric, kube_api  # noqa: F401 (a fixture)
from tests.kube.test_live import (  # noqa: F401 (clean: autouse)
    bound,
    clean,
    gang_annotations,
    gpu_pod,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    not shipped_scheduler_wanted(),
    reason="needs KUBE_BIN with kube-scheduler: the suite runs the shipped configuration, "
    "whose preemptVerb sends preemptions to topoplace",
)

LOW, MID, HIGH = 10, 500, 1000


@pytest.fixture(scope="module")
def priorities(core: Any, run_id: str) -> Iterator[dict[int, str]]:
    from kubernetes import client

    sched = client.SchedulingV1Api(core.api_client)
    names = {v: f"tp-it-{run_id}-p{v}" for v in (LOW, MID, HIGH)}
    for v, name in names.items():
        sched.create_priority_class(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": v,
                "preemptionPolicy": "PreemptLowerPriority",
            }
        )
    yield names
    for name in names.values():
        with contextlib.suppress(Exception):
            sched.delete_priority_class(name)


def _pod(
    name: str,
    gpus: int,
    scheduler: str,
    label: str,
    priority_class: str,
    node: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    p = gpu_pod(name, gpus, scheduler, label, node=node, annotations=annotations)
    p["spec"]["priorityClassName"] = priority_class
    return p


def _policy(tmp_path: Path) -> Path:
    """The shipped policy, the remediator checking every half second."""
    policy = yaml.safe_load((REPO / "config" / "policy.yaml").read_text())
    assert policy["remediation"]["mode"] == "evict" and policy["remediation"]["whole_gangs"]
    policy["remediation"].update(check_seconds=0.5)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


def _uids(core: Any, namespace: str) -> dict[str, str]:
    return {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(namespace).items}


@contextlib.contextmanager
def _nodes(
    core: Any,
    namespace: str,
    run_id: str,
    tag: str,
    count: int,
    labels: dict[str, str] | None = None,
) -> Iterator[tuple[str, list[str]]]:
    """``count`` fresh GPU nodes labelled for this test (DGX H100 unless ``labels`` say
    otherwise): (label, names); on the way out the namespace's pods are deleted and the
    nodes removed."""
    label = f"{run_id}-{tag}"
    nodes = [f"tp-it-{run_id}-{tag}-{i}" for i in range(count)]
    for n in nodes:
        make_gpu_node(core, n, label, labels=labels)
    try:
        yield label, nodes
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        for n in nodes:
            with contextlib.suppress(Exception):
                core.delete_node(n)


def _as_hami_t4s(core: Any, node: str, split: int) -> None:
    """Make a test node a HAMi node of two T4s split ``split`` ways, as HAMi's device
    plugin registers it (``nvidia.com/gpu`` advertised as the replicas)."""
    from tests.sharing.builders import register

    core.patch_node(
        node,
        {
            "metadata": {
                "labels": {"nvidia.com/gpu.product": "Tesla-T4"},
                "annotations": {"hami.io/node-nvidia-register": register(node, 2, split=split)},
            }
        },
    )
    replicas = str(2 * split)
    core.patch_node_status(
        node,
        {
            "status": {
                "capacity": {"nvidia.com/gpu": replicas},
                "allocatable": {"nvidia.com/gpu": replicas},
            }
        },
    )


ROOM_FILL = {"b0": (12000, 0), "a0": (2000, 0), "c1": (8000, 1), "d1": (6000, 1)}
"""HAMi pods (MiB, GPU) on two T4s split four ways: 1,360 MiB left on each GPU with four
replicas free, so a 10,000 MiB pod passes kube-scheduler's count and fits no GPU."""


def _fill_room(
    core: Any, namespace: str, topoplace: Topoplace, node: str, scheduler: str, label: str, pc: str
) -> None:
    """Make ``node`` a HAMi node of two T4s split four ways, bind :data:`ROOM_FILL` on it
    (each pod labelled ``app: keep-<name>``) and wait for topoplace to see their shares."""
    _as_hami_t4s(core, node, split=4)
    for name, (mem, gpu) in ROOM_FILL.items():
        pod = _hami_pod(name, mem, pc, scheduler, label, node, gpu)
        pod["metadata"]["labels"] = {"app": f"keep-{name}"}
        core.create_namespaced_pod(namespace, pod)
    wait_for(lambda: len(_placed_on(topoplace, node)) == 4, 10, "topoplace to see the four pods")


@contextlib.contextmanager
def _budget(core: Any, namespace: str, topoplace: Topoplace, name: str, app: str) -> Iterator[None]:
    """A PodDisruptionBudget ``name`` over the pods labelled ``app`` (``minAvailable: 1``;
    with no kube-controller-manager here its ``disruptionsAllowed`` reads 0), seen by
    topoplace before the block runs, deleted after it."""
    from kubernetes import client

    policy = client.PolicyV1Api(core.api_client)
    policy.create_namespaced_pod_disruption_budget(
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
        },
    )
    try:
        wait_for(
            lambda: any(
                i["kind"] == "PodDisruptionBudget" and i["metadata"]["name"] == name
                for i in topoplace.get("/v1/inspect/snapshot")["items"]
            ),
            10,
            "topoplace to see the budget",
        )
        yield
    finally:
        policy.delete_namespaced_pod_disruption_budget(name, namespace)


def _placed_on(topoplace: Topoplace, node: str) -> list[dict[str, Any]]:
    """topoplace's placements on ``node`` (``/v1/inspect/placements``)."""
    return [i for i in topoplace.get("/v1/inspect/placements")["placements"] if i["node"] == node]


def _pinned(
    core: Any,
    namespace: str,
    name: str,
    node: str,
    gpus: list[int],
    pc: str,
    label: str,
    scheduler: str,
) -> None:
    """A pod bound to ``node`` with topoplace's placement record for ``gpus`` (created
    bound, as a pod placed before: the API server takes ``spec.nodeName`` as is)."""
    p = _pod(name, len(gpus), scheduler, label, pc)
    p["spec"]["nodeName"] = node
    p["metadata"]["annotations"] = {
        PLACEMENT_ANNOTATION: orjson.dumps({"gpus": gpus, "node": node, "v": 1}).decode()
    }
    core.create_namespaced_pod(namespace, p)


def _started_by_topoplace(topoplace: Topoplace, namespace: str, pod: str) -> dict[str, Any]:
    """The one answer that named victims for ``pod``, asserted to be a preemption topoplace
    started itself (kube-scheduler asked nothing)."""
    mine = _named_victims(topoplace, namespace, pod)
    assert [a["by"] for a in mine] == ["topoplace"], mine
    return mine[0]


def _named_victims(topoplace: Topoplace, namespace: str, *pods: str) -> list[dict[str, Any]]:
    """topoplace's answers for ``pods`` that named victims (a retry before topoplace saw
    them go answers "waiting" and names none). The answers outlive a test (the suite's
    topoplace keeps running), so each test names its preemptors apart."""
    keys = {f"{namespace}/{p}" for p in pods}
    recent = topoplace.get("/v1/inspect/preemptions")["recent"]
    return [a for a in recent if a["pod"] in keys and a["chosen"]]


def test_a_lone_pod_is_preempted_and_the_gang_member_beside_it_is_left_whole(
    core: Any,
    namespace: str,
    topoplace: Topoplace,
    scheduler_name: str,
    run_id: str,
    priorities: dict[int, str],
) -> None:
    gang = gang_annotations("train", 2)
    lo, mid, hi = priorities[LOW], priorities[MID], priorities[HIGH]
    with _nodes(core, namespace, run_id, "preempt", 2) as (label, nodes):
        # x and y first, pinned; then the gang, which can only go one member per node
        core.create_namespaced_pod(namespace, _pod("x", 4, scheduler_name, label, lo, nodes[0]))
        core.create_namespaced_pod(namespace, _pod("y", 4, scheduler_name, label, mid, nodes[1]))
        wait_for(lambda: len(bound(core, namespace, ["x", "y"])) == 2, 60, "x and y bound")
        for name in ("g-0", "g-1"):
            core.create_namespaced_pod(
                namespace, _pod(name, 4, scheduler_name, label, lo, annotations=gang)
            )
        names = ["g-0", "g-1", "x", "y"]
        wait_for(lambda: len(bound(core, namespace, names)) == 4, 60, "the low pods bound")
        before = _uids(core, namespace)
        core.create_namespaced_pod(namespace, _pod("urgent", 4, scheduler_name, label, hi))
        got = wait_for(lambda: bound(core, namespace, ["urgent"]), 60, "urgent bound")
        assert got["urgent"].spec.node_name == nodes[0]
        after = _uids(core, namespace)
        assert "x" not in after or after["x"] != before["x"]  # the pod alone went
        for name in ("g-0", "g-1", "y"):  # the gang and the higher pod stayed
            assert after.get(name) == before[name], name
        (mine,) = _named_victims(topoplace, namespace, "urgent")  # once: no double preemption
        assert mine["chosen"]["node"] == nodes[0]
        assert [v["pod"] for v in mine["chosen"]["victims"]] == [f"{namespace}/x"]
        assert mine["chosen"]["gangs_broken"] == []


def test_a_preempted_gang_member_takes_its_whole_gang_with_it(
    core: Any,
    namespace: str,
    topoplace: Topoplace,
    scheduler_name: str,
    run_id: str,
    priorities: dict[int, str],
    tmp_path: Path,
    kube_api: Any,  # noqa: F811
) -> None:
    gang = gang_annotations("train", 2)
    lo, hi = priorities[LOW], priorities[HIGH]
    metric = 'topoplace_remediation_evictions_total{kind="preempted",outcome="evicted"}'
    with (
        _nodes(core, namespace, run_id, "preempt-gang", 2) as (label, nodes),
        topoplace.restarted(args=("--config", str(_policy(tmp_path)))),
    ):
        before_count = _metric(topoplace, metric)
        for name in ("g-0", "g-1"):  # one member per node: 8 GPUs each
            core.create_namespaced_pod(
                namespace, _pod(name, 8, scheduler_name, label, lo, annotations=gang)
            )
        wait_for(lambda: len(bound(core, namespace, ["g-0", "g-1"])) == 2, 60, "gang bound")
        before = _uids(core, namespace)
        core.create_namespaced_pod(namespace, _pod("urgent", 8, scheduler_name, label, hi))
        got = wait_for(lambda: bound(core, namespace, ["urgent"]), 60, "urgent bound")
        victim_node = got["urgent"].spec.node_name
        # ... and the other member is evicted by topoplace, not left holding 8 GPUs
        wait_for(
            lambda: all(_uids(core, namespace).get(n) != before[n] for n in ("g-0", "g-1")),
            30,
            "the whole gang to go",
        )
        # counted once its Event is written (the pod is gone before that)
        wait_for(lambda: _metric(topoplace, metric) == before_count + 1, 10, "the count")
        events = kube_api.request_json(
            "GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
        )["items"]
        told = [e for e in events if e.get("reason") == "GangMemberPreempted"]
        other = "g-1" if victim_node == nodes[0] else "g-0"
        assert [e["regarding"]["uid"] for e in told] == [before[other]], told
        (answer,) = _named_victims(topoplace, namespace, "urgent")
        assert answer["chosen"]["gangs_broken"] == [f"{namespace}/train"]
        assert answer["chosen"]["gang_members_torn_down"] == [f"{namespace}/{other}"]


def test_a_high_priority_gang_preempts_its_way_in_whole(
    core: Any,
    namespace: str,
    topoplace: Topoplace,
    scheduler_name: str,
    run_id: str,
    priorities: dict[int, str],
) -> None:
    # Two full nodes of low pods, one node full of pods of higher priority than the gang:
    # the gang's two 8-GPU members preempt on the two low nodes (the only placement its
    # gang has) and bind together; the high node is untouched.
    lo, mid, hi = priorities[LOW], priorities[MID], priorities[HIGH]
    with _nodes(core, namespace, run_id, "preempt-in", 3) as (label, nodes):
        fill = [f"f{i}-{k}" for i in range(3) for k in range(2)]
        for name in fill:
            i = int(name[1])
            pc = hi if i == 2 else lo
            core.create_namespaced_pod(
                namespace, _pod(name, 4, scheduler_name, label, pc, nodes[i])
            )
        wait_for(lambda: len(bound(core, namespace, fill)) == 6, 60, "the filler bound")
        before = _uids(core, namespace)
        gang = gang_annotations("urgent", 2)
        for name in ("u-0", "u-1"):
            core.create_namespaced_pod(
                namespace, _pod(name, 8, scheduler_name, label, mid, annotations=gang)
            )
        got = wait_for(
            lambda: (b := bound(core, namespace, ["u-0", "u-1"])) and len(b) == 2 and b,
            60,
            "the gang bound",
        )
        assert sorted(p.spec.node_name for p in got.values()) == nodes[:2]
        after = _uids(core, namespace)
        assert all(n not in after for n in ("f0-0", "f0-1", "f1-0", "f1-1"))
        assert after.get("f2-0") == before["f2-0"] and after.get("f2-1") == before["f2-1"]
        answers = _named_victims(topoplace, namespace, "u-0", "u-1")
        assert sorted(a["chosen"]["node"] for a in answers) == nodes[:2], answers


def test_a_gang_that_cannot_fit_even_by_preempting_evicts_nothing(
    core: Any,
    namespace: str,
    topoplace: Topoplace,
    scheduler_name: str,
    run_id: str,
    priorities: dict[int, str],
) -> None:
    # Three 8-GPU members, two nodes of low pods, one of higher pods: the gang cannot run
    # whatever is preempted. kube-scheduler's dry run, member by member, would evict both
    # low nodes for nothing.
    lo, mid, hi = priorities[LOW], priorities[MID], priorities[HIGH]
    with _nodes(core, namespace, run_id, "preempt-no", 3) as (label, nodes):
        fill = ["f0", "f1", "f2"]
        for i, name in enumerate(fill):
            pc = hi if i == 2 else lo
            core.create_namespaced_pod(
                namespace, _pod(name, 8, scheduler_name, label, pc, nodes[i])
            )
        wait_for(lambda: len(bound(core, namespace, fill)) == 3, 60, "the filler bound")
        before = _uids(core, namespace)
        gang = gang_annotations("toolarge", 3)
        members = [f"t-{k}" for k in range(3)]
        for name in members:
            core.create_namespaced_pod(
                namespace, _pod(name, 8, scheduler_name, label, mid, annotations=gang)
            )
        keys = {f"{namespace}/{m}" for m in members}

        def answers() -> list[dict[str, Any]]:
            return [
                a for a in topoplace.get("/v1/inspect/preemptions")["recent"] if a["pod"] in keys
            ]

        wait_for(answers, 30, "topoplace to answer a member's preemption")
        time.sleep(3)  # kube-scheduler retries the members meanwhile
        after = _uids(core, namespace)
        assert all(after.get(n) == before[n] for n in fill), after
        assert not bound(core, namespace, members)
        got = answers()
        assert all(a["chosen"] is None for a in got)
        assert got[0]["reason"].startswith("the gang does not fit even with every")


def test_a_pod_a_disruption_budget_protects_is_not_preempted_while_another_node_helps(
    core: Any,
    namespace: str,
    topoplace: Topoplace,
    scheduler_name: str,
    run_id: str,
    priorities: dict[int, str],
) -> None:
    # Two full nodes of equal low pods: topoplace would take the first node's pod (the
    # nodes tie, the name decides). A PodDisruptionBudget covers that pod (no
    # kube-controller-manager runs here, so its disruptionsAllowed reads 0, for
    # kube-scheduler and topoplace alike): the other node's pod goes instead, as
    # kube-scheduler's own preemption would choose.
    lo, hi = priorities[LOW], priorities[HIGH]
    with _nodes(core, namespace, run_id, "preempt-pdb", 2) as (label, nodes):
        for name, node in (("x", nodes[0]), ("y", nodes[1])):
            pod = _pod(name, 8, scheduler_name, label, lo, node)
            pod["metadata"]["labels"] = {"app": f"serve-{name}"}
            core.create_namespaced_pod(namespace, pod)
        wait_for(lambda: len(bound(core, namespace, ["x", "y"])) == 2, 60, "x and y bound")
        with _budget(core, namespace, topoplace, "serve-x", "serve-x"):
            before = _uids(core, namespace)
            core.create_namespaced_pod(namespace, _pod("urgent-pdb", 8, scheduler_name, label, hi))
            got = wait_for(lambda: bound(core, namespace, ["urgent-pdb"]), 60, "urgent bound")
            assert got["urgent-pdb"].spec.node_name == nodes[1]
            after = _uids(core, namespace)
            assert after.get("x") == before["x"] and "y" not in after
            (mine,) = _named_victims(topoplace, namespace, "urgent-pdb")
            assert mine["chosen"]["node"] == nodes[1]
            assert [v["pod"] for v in mine["chosen"]["victims"]] == [f"{namespace}/y"]
            assert mine["chosen"]["pdb_violations"] == 0


def test_a_hami_pod_preempts_the_pod_whose_gpu_then_has_its_memory(
    core: Any,
    namespace: str,
    topoplace: Topoplace,
    scheduler_name: str,
    run_id: str,
    priorities: dict[int, str],
) -> None:
    # A HAMi node of two T4s (15,360 MiB), two replicas each, full: a0 (2,000 MiB) and b0
    # (12,000) on GPU 0, c1 and d1 (6,000 each) on GPU 1. A pod asking 10,000 MiB arrives.
    # kube-scheduler counts replicas: freeing any one will do, and among equals its dry
    # run takes the pod started last, here a0, which leaves 3,360 MiB on GPU 0. topoplace
    # answers b0: GPU 0 then has the memory, and only one pod goes.
    lo, hi = priorities[LOW], priorities[HIGH]
    with _nodes(core, namespace, run_id, "preempt-hami", 1) as (label, nodes):
        (node,) = nodes
        _as_hami_t4s(core, node, split=2)

        def hami(name: str, mem: int, pc: str, gpu: int | None = None) -> dict[str, Any]:
            at = node if gpu is not None else None
            return _hami_pod(name, mem, pc, scheduler_name, label, at, gpu)

        fill = {"b0": (12000, 0), "c1": (6000, 1), "d1": (6000, 1), "a0": (2000, 0)}
        for k, (name, (mem, gpu)) in enumerate(fill.items()):
            core.create_namespaced_pod(namespace, hami(name, mem, lo, gpu))
            started = f"2026-12-03T0{k}:00:00Z"  # a0 started last: kube-scheduler's pick
            core.patch_namespaced_pod_status(
                name, namespace, {"status": {"phase": "Running", "startTime": started}}
            )
        wait_for(
            lambda: len(_placed_on(topoplace, node)) == 4, 10, "topoplace to see the four pods"
        )
        before = _uids(core, namespace)
        core.create_namespaced_pod(namespace, hami("urgent-hami", 10000, hi))
        got = wait_for(lambda: bound(core, namespace, ["urgent-hami"]), 60, "urgent bound")
        assert got["urgent-hami"].spec.node_name == node
        ann = got["urgent-hami"].metadata.annotations
        assert ann["hami.io/vgpu-devices-allocated"] == f"GPU-{node}-00,NVIDIA,10000,30:;"
        after = _uids(core, namespace)
        assert "b0" not in after
        assert all(after.get(n) == before[n] for n in ("a0", "c1", "d1")), after
        (mine,) = _named_victims(topoplace, namespace, "urgent-hami")
        assert mine["share"] == "hami"
        assert [v["pod"] for v in mine["chosen"]["victims"]] == [f"{namespace}/b0"]


def test_a_hami_pod_kube_scheduler_sees_room_for_gets_its_victims_from_topoplace(
    core: Any,
    namespace: str,
    topoplace: Topoplace,
    scheduler_name: str,
    run_id: str,
    priorities: dict[int, str],
) -> None:
    # A HAMi node of two T4s (15,360 MiB) split four ways: b0 (12,000 MiB) and a0 (2,000)
    # on GPU 0, c1 (8,000) and d1 (6,000) on GPU 1; four of eight replicas free, 1,360 MiB
    # free on each GPU. A pod asking 10,000 MiB passes kube-scheduler's replica count, so
    # its DefaultPreemption names no victim and never calls the preempt verb: without
    # topoplace's own preemption (preemption.start) the pod waits for ever. topoplace
    # evicts b0 (GPU 0 then has the memory; freeing GPU 1 would take two pods), holds
    # the shares and wakes the pod, which binds on GPU 0.
    from kubernetes import client

    lo, hi = priorities[LOW], priorities[HIGH]
    with _nodes(core, namespace, run_id, "started-hami", 1) as (label, nodes):
        (node,) = nodes
        _fill_room(core, namespace, topoplace, node, scheduler_name, label, lo)
        before = _uids(core, namespace)
        t0 = time.monotonic()
        core.create_namespaced_pod(
            namespace, _hami_pod("urgent-room", 10000, hi, scheduler_name, label)
        )
        got = wait_for(lambda: bound(core, namespace, ["urgent-room"]), 60, "urgent bound")
        took = time.monotonic() - t0
        assert got["urgent-room"].spec.node_name == node
        ann = got["urgent-room"].metadata.annotations
        assert ann["hami.io/vgpu-devices-allocated"] == f"GPU-{node}-00,NVIDIA,10000,30:;"
        after = _uids(core, namespace)
        assert "b0" not in after
        assert all(after.get(n) == before[n] for n in ("a0", "c1", "d1")), after
        mine = _started_by_topoplace(topoplace, namespace, "urgent-room")
        assert [v["pod"] for v in mine["chosen"]["victims"]] == [f"{namespace}/b0"]
        events = client.EventsV1Api(core.api_client).list_namespaced_event(namespace).items
        (ev,) = [e for e in events if e.regarding.uid == before["b0"]]
        assert (ev.reason, ev.action, ev.reporting_controller) == (
            "Preempted",
            "Evict",
            "topoplace.io/preemption",
        )
        assert f"{namespace}/urgent-room" in ev.note
        print(f"urgent-room bound {took:.1f}s after creation")


def _hami_pod(
    name: str,
    mem: int,
    pc: str,
    scheduler: str,
    label: str,
    node: str | None = None,
    gpu: int | None = None,
) -> dict[str, Any]:
    """A HAMi pod asking ``mem`` MiB and 30 % of a GPU; with ``node`` and ``gpu`` bound
    already, as HAMi's scheduler records it."""
    p = _pod(name, 1, scheduler, label, pc, node)
    p["spec"]["containers"][0]["resources"]["limits"].update(
        {"nvidia.com/gpumem": str(mem), "nvidia.com/gpucores": "30"}
    )
    if node is not None and gpu is not None:
        p["spec"]["nodeName"] = node
        p["metadata"]["annotations"] = {
            "hami.io/vgpu-devices-allocated": f"GPU-{node}-{gpu:02d},NVIDIA,{mem},30:;",
            "hami.io/vgpu-node": node,
            "hami.io/bind-phase": "success",
        }
    return p


def test_a_pod_that_needs_nvlink_gets_a_ring_kube_scheduler_cannot_see_freed_by_topoplace(
    core: Any,
    namespace: str,
    topoplace: Topoplace,
    scheduler_name: str,
    run_id: str,
    priorities: dict[int, str],
) -> None:
    # A DGX-1 V100 (hybrid cube-mesh) with one-GPU pods of low priority on GPUs 1, 2, 4
    # and 7: GPUs 0, 3, 5 and 6 are free, four by kube-scheduler's count but no NVLink
    # ring. A 4-GPU pod that needs NVLink passes kube-scheduler's filters, so it never
    # preempts; topoplace evicts the pods on 4 and 7 and the pod binds on the quad 4-7.
    dgx1 = {
        "nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB",
        "nvidia.com/gpu.machine": "DGX-1",
        "nvidia.com/gpu.family": "volta",
    }
    lo, hi = priorities[LOW], priorities[HIGH]
    with _nodes(core, namespace, run_id, "started-ring", 1, dgx1) as (label, nodes):
        (node,) = nodes
        for g in (1, 2, 4, 7):
            _pinned(core, namespace, f"one-{g}", node, [g], lo, label, scheduler_name)
        wait_for(
            lambda: (
                sorted(g for i in _placed_on(topoplace, node) for g in i["gpus"]) == [1, 2, 4, 7]
            ),
            10,
            "topoplace to see the four pods' GPUs",
        )
        before = _uids(core, namespace)
        nvlink = {"topoplace.io/min-link": "nvlink"}
        core.create_namespaced_pod(
            namespace, _pod("urgent-ring", 4, scheduler_name, label, hi, annotations=nvlink)
        )
        got = wait_for(lambda: bound(core, namespace, ["urgent-ring"]), 60, "urgent bound")
        assert got["urgent-ring"].spec.node_name == node
        record = orjson.loads(got["urgent-ring"].metadata.annotations[PLACEMENT_ANNOTATION])
        assert record["gpus"] == [4, 5, 6, 7]
        after = _uids(core, namespace)
        assert "one-4" not in after and "one-7" not in after
        assert all(after.get(n) == before[n] for n in ("one-1", "one-2")), after
        mine = _started_by_topoplace(topoplace, namespace, "urgent-ring")
        assert [v["pod"] for v in mine["chosen"]["victims"]] == [
            f"{namespace}/one-4",
            f"{namespace}/one-7",
        ]


def test_a_started_preemption_spares_the_pod_a_budget_protects(
    core: Any,
    namespace: str,
    topoplace: Topoplace,
    scheduler_name: str,
    run_id: str,
    priorities: dict[int, str],
) -> None:
    # The HAMi node of the test above (1,360 MiB free on each T4, a 10,000 MiB arrival that
    # kube-scheduler sees room for), with b0 under a PodDisruptionBudget (disruptionsAllowed
    # reads 0 here: no kube-controller-manager). Freeing GPU 0 would evict b0 alone;
    # topoplace frees GPU 1 instead (c1 and d1), and the pod binds there.
    lo, hi = priorities[LOW], priorities[HIGH]
    with _nodes(core, namespace, run_id, "started-pdb", 1) as (label, nodes):
        (node,) = nodes
        _fill_room(core, namespace, topoplace, node, scheduler_name, label, lo)
        with _budget(core, namespace, topoplace, f"keep-b0-{run_id}", "keep-b0"):
            before = _uids(core, namespace)
            core.create_namespaced_pod(
                namespace, _hami_pod("urgent-kept", 10000, hi, scheduler_name, label)
            )
            got = wait_for(lambda: bound(core, namespace, ["urgent-kept"]), 60, "urgent bound")
            ann = got["urgent-kept"].metadata.annotations
            assert ann["hami.io/vgpu-devices-allocated"] == f"GPU-{node}-01,NVIDIA,10000,30:;"
            after = _uids(core, namespace)
            assert "c1" not in after and "d1" not in after
            assert all(after.get(n) == before[n] for n in ("a0", "b0")), after
            mine = _started_by_topoplace(topoplace, namespace, "urgent-kept")
            assert mine["chosen"]["pdb_violations"] == 0


def test_a_gang_that_must_share_a_node_gets_its_victims_from_topoplace(
    core: Any,
    namespace: str,
    topoplace: Topoplace,
    scheduler_name: str,
    run_id: str,
    priorities: dict[int, str],
) -> None:
    # Two DGX H100 with four GPUs held on each: lo-0 (low) on node 0, mid-1 (mid) on node
    # 1. A high-priority gang of two 4-GPU members that must share one node passes
    # kube-scheduler's filters member by member (four GPUs free on both nodes), so it never
    # preempts; topoplace evicts lo-0, the lowest priority that frees a node, and the gang
    # binds whole on node 0.
    lo, mid, hi = priorities[LOW], priorities[MID], priorities[HIGH]
    with _nodes(core, namespace, run_id, "started-gang", 2) as (label, nodes):
        _pinned(core, namespace, "lo-0", nodes[0], [0, 1, 2, 3], lo, label, scheduler_name)
        _pinned(core, namespace, "mid-1", nodes[1], [4, 5, 6, 7], mid, label, scheduler_name)
        wait_for(
            lambda: all(len(_placed_on(topoplace, n)) == 1 for n in nodes),
            10,
            "topoplace to see the two pods",
        )
        before = _uids(core, namespace)
        gang = {**gang_annotations("tp", 2), "topoplace.io/topology-required": "node"}
        for name in ("tp-0", "tp-1"):
            core.create_namespaced_pod(
                namespace, _pod(name, 4, scheduler_name, label, hi, annotations=gang)
            )
        got = wait_for(
            lambda: (b := bound(core, namespace, ["tp-0", "tp-1"])) and len(b) == 2 and b,
            60,
            "the gang bound",
        )
        assert [p.spec.node_name for p in got.values()] == [nodes[0], nodes[0]]
        gpus = sorted(
            g
            for p in got.values()
            for g in orjson.loads(p.metadata.annotations[PLACEMENT_ANNOTATION])["gpus"]
        )
        assert gpus == list(range(8))
        after = _uids(core, namespace)
        assert "lo-0" not in after and after.get("mid-1") == before["mid-1"]
        recent = topoplace.get("/v1/inspect/preemptions")["recent"]
        mine = [a for a in recent if a.get("gang") == f"{namespace}/tp" and a["chosen"]]
        assert [a["by"] for a in mine] == ["topoplace"], mine
        assert [v["pod"] for v in mine[0]["chosen"]["victims"]] == [f"{namespace}/lo-0"]
