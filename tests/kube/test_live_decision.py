"""Through the real kube-scheduler with the configuration topoplace ships: the live placement
is the engine's, and a gang member refused in a race comes back and completes its gang.

Needs ``KUBE_BIN`` (the suite then runs kube-scheduler with ``config/deploy/
scheduler-config.yaml``; see conftest.py). Each test makes its own fresh nodes, labelled
apart from the session's, so it starts from an empty cluster and other tests' pods cannot
land on them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from scheduler.core.health import REASON_GPU_CORDON
from scheduler.core.params import SchedParams
from scheduler.kube.waker import WAKE_ANNOTATION
from tests.kube.conftest import NODE_LABEL, Topoplace, make_gpu_node
from tests.kube.test_live import (
    assert_no_double_booking,
    bound,
    delete_pods,
    gang_annotations,
    placement,
    wait_for,
)

RACE_RUNS = int(os.environ.get("TOPOPLACE_RACE_RUNS", "3"))
NOMINATION_TTL_S = SchedParams().extender.nomination_ttl_seconds


def parks_extender_refusals(version: tuple[int, int]) -> bool:
    """kube-scheduler before 1.32 keeps a pod refused only by an extender in its
    unschedulable queue through every cluster event (``podMatchesEvent`` needs a rejecting
    plugin), so only topoplace's wake brings it back; 1.32+ requeues it on any event of
    interest (``isPodWorthRequeuing``: no rejector plugins -> queue after backoff). On 1.32+
    the test still forces the race and requires the whole gang; the wake itself is required
    only where it is the only way back."""
    return version < (1, 32)


def _pod(name: str, gpus: int, scheduler: str, label: str, **kw: Any) -> dict[str, Any]:
    res = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": kw.get("annotations") or {}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {NODE_LABEL: label, **kw.get("selector", {})},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.9",
                    "resources": {"requests": res, "limits": res},
                }
            ],
        },
    }


@contextlib.contextmanager
def fresh_nodes(core: Any, tp: Topoplace, prefix: str, label: str, n: int) -> Iterator[list[str]]:
    names = [f"{prefix}-{i}" for i in range(n)]
    for name in names:
        make_gpu_node(core, name, label)

    def seen() -> bool:
        got = {x["name"]: x["free_gpus"] for x in tp.get("/v1/inspect/nodes")["nodes"]}
        return all(got.get(name) == 8 for name in names)

    wait_for(seen, 30, "topoplace sees the fresh nodes")
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(Exception):
                core.delete_node(name)


def test_sixteen_one_gpu_pods_land_on_two_nodes(
    core: Any,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    shipped_scheduler: Any,
    run_id: str,
) -> None:
    label = f"{run_id}-pack"
    with fresh_nodes(core, topoplace, f"tp-pack-{run_id}", label, 8):
        pods = [f"one-{i:02d}" for i in range(16)]
        for name in pods:  # one after another, as fast as the API takes them
            core.create_namespaced_pod(namespace, _pod(name, 1, scheduler_name, label))
        got = wait_for(
            lambda: (b := bound(core, namespace, pods)) and len(b) == 16 and b, 60, "16 bound"
        )
        used = sorted({p.spec.node_name for p in got.values()})
        assert len(used) == 2, f"16 one-GPU pods spread over {used}"
        assert_no_double_booking(list(got.values()))
        # In arrival order: the first eight fill one node, the next eight the other.
        by_arrival = [got[n].spec.node_name for n in pods]
        assert len(set(by_arrival[:8])) == 1 and len(set(by_arrival[8:])) == 1, by_arrival
        delete_pods(core, namespace, pods)


def _scheduled_condition(pod: Any) -> Any:
    return next(
        (c for c in (pod.status.conditions or []) if c.type == "PodScheduled"),
        None,
    )


def _unschedulable(core: Any, namespace: str, name: str) -> bool:
    """Whether kube-scheduler last found no node for the pod (PodScheduled False)."""
    c = _scheduled_condition(core.read_namespaced_pod(name, namespace))
    return c is not None and c.status == "False" and c.reason == "Unschedulable"


def _cordoned_in_topoplace(tp: Topoplace, node: str) -> bool:
    got = {x["name"]: x["reasons"] for x in tp.get("/v1/inspect/nodes")["nodes"]}
    return REASON_GPU_CORDON in got.get(node, [])


@pytest.mark.parametrize("run", range(RACE_RUNS))
def test_gang_member_refused_in_a_race_comes_back(
    run: int,
    core: Any,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    shipped_scheduler: Any,
    run_id: str,
    kube_version: tuple[int, int],
) -> None:
    """The race of issue 11, forced. Member A is refused by topoplace alone (no in-tree
    plugin objects: kube-scheduler counts 8 free GPUs on both nodes, topoplace sees one GPU
    of the second node cordoned, as it sees a deletion its watch has not delivered yet), so
    kube-scheduler parks A; QueueingHints are off, as in kube-scheduler <= 1.31, so no
    cluster event brings A back, only an update of A itself. Then the GPU comes back and
    member B arrives. A must come back at once (topoplace wakes it) and the gang must bind
    whole, never stay half bound until the plan's TTL runs out."""
    label = f"{run_id}-race{run}"
    with fresh_nodes(core, topoplace, f"tp-race{run}-{run_id}", label, 2) as nodes:
        cordon = {"metadata": {"annotations": {"volcano.sh/gpu-unhealthy-ids": "3"}}}
        core.patch_node(nodes[1], cordon)
        wait_for(lambda: _cordoned_in_topoplace(topoplace, nodes[1]), 30, "GPU 3 cordoned")
        gang = f"race{run}"
        a, b = f"{gang}-a", f"{gang}-b"
        ann = gang_annotations(gang, 2)
        core.create_namespaced_pod(namespace, _pod(a, 8, scheduler_name, label, annotations=ann))

        def refused() -> bool:
            return _unschedulable(core, namespace, a)

        wait_for(refused, 30, "member A refused while topoplace sees 15 usable GPUs")
        # Let any retry from kube-scheduler's backoff queue happen: in a quiet cluster it is
        # refused again and A lands in the unschedulable queue for good.
        time.sleep(3)
        assert refused() and not bound(core, namespace, [a])
        core.patch_node(
            nodes[1], {"metadata": {"annotations": {"volcano.sh/gpu-unhealthy-ids": None}}}
        )
        wait_for(lambda: not _cordoned_in_topoplace(topoplace, nodes[1]), 30, "GPU 3 back")
        t0 = time.monotonic()
        core.create_namespaced_pod(namespace, _pod(b, 8, scheduler_name, label, annotations=ann))
        got = wait_for(
            lambda: (x := bound(core, namespace, [a, b])) and len(x) == 2 and x,
            20,
            "the whole gang bound (A woken, not left parked)",
            every=0.1,
        )
        assert time.monotonic() - t0 < 20
        assert {p.spec.node_name for p in got.values()} == set(nodes)
        assert len({placement(p)["plan"] for p in got.values()}) == 1
        assert_no_double_booking(list(got.values()))
        if parks_extender_refusals(kube_version):
            woken = core.read_namespaced_pod(a, namespace).metadata.annotations or {}
            assert WAKE_ANNOTATION in woken, "member A came back without being woken"
        delete_pods(core, namespace, [a, b])


def test_a_pod_refused_for_gpus_only_topoplace_held_comes_back_when_they_lapse(
    core: Any,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    shipped_scheduler: Any,
    run_id: str,
) -> None:
    """GPUs held by topoplace alone: a filter call for a pod that never binds (the test
    plays kube-scheduler) nominates all 8 GPUs of the one node, for the nomination's TTL.
    A pod asking 8 GPUs there is refused by topoplace alone, and kube-scheduler parks it.
    When the nomination lapses nothing happens in the cluster, so on every kube-scheduler
    version no event brings the pod back before the 5-minute flush; topoplace wakes it
    (``scheduler.runtime.parked``) and it binds within seconds of the lapse."""
    label = f"{run_id}-park"
    with fresh_nodes(core, topoplace, f"tp-park-{run_id}", label, 1) as (node,):
        ghost = _pod("ghost", 8, scheduler_name, label)
        ghost["metadata"].update({"namespace": namespace, "uid": f"ghost-{run_id}"})
        r = httpx.post(
            topoplace.url + "/scheduler/filter",
            json={"Pod": ghost, "NodeNames": [node]},
            timeout=10,
        )
        assert r.status_code == 200 and r.json()["NodeNames"] == [node], r.text
        held_at = time.monotonic()  # the ghost's 8 GPUs are nominated from now
        name = "parked-a"
        core.create_namespaced_pod(namespace, _pod(name, 8, scheduler_name, label))

        def refused() -> bool:
            return _unschedulable(core, namespace, name)

        wait_for(refused, 20, "the pod refused while topoplace holds the node's GPUs")
        time.sleep(3)  # any retry from the backoff queue: refused again, parked for good
        assert refused() and not bound(core, namespace, [name])
        got = wait_for(
            lambda: (x := bound(core, namespace, [name])) and x,
            NOMINATION_TTL_S + 20,
            "the pod bound once the nomination lapsed (woken, not left parked)",
            every=0.2,
        )
        after = time.monotonic() - held_at
        print(f"\nbound {after:.1f} s after the nomination (TTL {NOMINATION_TTL_S:.0f} s)")
        assert after >= NOMINATION_TTL_S - 1  # not before the GPUs were free
        assert got[name].spec.node_name == node
        woken = core.read_namespaced_pod(name, namespace).metadata.annotations or {}
        assert WAKE_ANNOTATION in woken, "the pod came back without being woken"
        delete_pods(core, namespace, [name])
