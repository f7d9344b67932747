"""topoplace in kube mode against a real API server and a real kube-scheduler.

kube-scheduler (profile ``$SCHEDULER_NAME``) calls topoplace for filter, prioritize and
bind; topoplace learns the cluster by list+watch and binds through ``pods/binding``.
Pods never run (no kubelet): being bound is the end of their story here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from scheduler.core.model import PLACEMENT_ANNOTATION
from tests.kube.conftest import NODE_LABEL, REPO, Topoplace

GANGS_PRESENT = importlib.util.find_spec("scheduler.runtime.gangs") is not None
needs_gangs = pytest.mark.xfail(
    not GANGS_PRESENT,
    reason="gang handler (scheduler/runtime/gangs.py) not present yet: gangs are scheduled pod by pod",
    strict=False,
)


def gpu_pod(
    name: str,
    gpus: int,
    scheduler: str,
    run_id: str,
    *,
    annotations: dict[str, str] | None = None,
    node: str | None = None,
    gated: bool = False,
) -> dict[str, Any]:
    res = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}
    selector = {NODE_LABEL: run_id}
    if node:
        selector["kubernetes.io/hostname"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": selector,
            "terminationGracePeriodSeconds": 0,
            **({"schedulingGates": [{"name": "topoplace.io/test-hold"}]} if gated else {}),
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.9",
                    "resources": {"requests": res, "limits": res},
                }
            ],
        },
    }


def gang_annotations(gang: str, size: int) -> dict[str, str]:
    return {"topoplace.io/gang": gang, "topoplace.io/gang-size": str(size)}


def wait_for(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def pods_by_name(core: Any, ns: str, names: list[str]) -> dict[str, Any]:
    out = {}
    for n in names:
        p = core.read_namespaced_pod(n, ns)
        out[n] = p
    return out


def bound(core: Any, ns: str, names: list[str]) -> dict[str, Any]:
    pods = pods_by_name(core, ns, names)
    return {n: p for n, p in pods.items() if p.spec.node_name}


def placement(pod: Any) -> dict[str, Any]:
    raw = (pod.metadata.annotations or {}).get(PLACEMENT_ANNOTATION)
    assert raw, f"pod {pod.metadata.name} has no {PLACEMENT_ANNOTATION} annotation"
    return json.loads(raw)


def delete_pods(core: Any, ns: str, names: list[str]) -> None:
    for n in names:
        with contextlib.suppress(Exception):
            core.delete_namespaced_pod(n, ns, grace_period_seconds=0)


def wait_all_free(tp: Topoplace, nodes: list[str], timeout: float = 30) -> None:
    def free() -> bool:
        got = {n["name"]: n["free_gpus"] for n in tp.get("/v1/inspect/nodes")["nodes"]}
        return all(got.get(n) == 8 for n in nodes)

    wait_for(free, timeout, "all test GPUs free in topoplace")


def assert_no_double_booking(pods: list[Any]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for p in pods:
        rec = placement(p)
        for g in rec["gpus"]:
            key = (p.spec.node_name, g)
            assert key not in seen, f"GPU {key} given to {seen[key]} and {p.metadata.name}"
            seen[key] = p.metadata.name


@pytest.fixture(autouse=True)
def clean(request: pytest.FixtureRequest) -> Any:
    """After each test: delete its pods and wait until topoplace shows the GPUs free."""
    yield
    if "namespace" not in request.fixturenames:
        return
    core = request.getfixturevalue("core")
    ns = request.getfixturevalue("namespace")
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(ns).items, 30, "test pods deleted")
    if "topoplace" in request.fixturenames:
        tp = request.getfixturevalue("topoplace")
        if tp.proc is not None:
            wait_all_free(tp, request.getfixturevalue("gpu_nodes"))


# ---- single pods -----------------------------------------------------------------------------


def test_ready_after_sync_and_sees_the_nodes(topoplace: Topoplace, gpu_nodes: list[str]) -> None:
    assert topoplace.get("/readyz") == {"status": "ready"}
    nodes = {n["name"]: n for n in topoplace.get("/v1/inspect/nodes")["nodes"]}
    for name in gpu_nodes:
        assert nodes[name]["gpus"] == 8 and nodes[name]["health"] == "healthy"


def test_pods_are_bound_where_the_placement_says(
    core: Any,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    run_id: str,
    gpu_nodes: list[str],
) -> None:
    sizes = {"solo-4a": 4, "solo-4b": 4, "solo-2": 2, "solo-1": 1}
    for name, g in sizes.items():
        core.create_namespaced_pod(namespace, gpu_pod(name, g, scheduler_name, run_id))
    got = wait_for(
        lambda: (b := bound(core, namespace, list(sizes))) and len(b) == len(sizes) and b,
        60,
        "4 pods bound",
    )
    held = {p["pod"]: p for p in topoplace.get("/v1/inspect/placements")["placements"]}
    for name, pod in got.items():
        rec = placement(pod)
        assert rec["node"] == pod.spec.node_name and rec["v"] == 1
        assert len(rec["gpus"]) == sizes[name] and pod.spec.node_name in gpu_nodes
        h = held[f"{namespace}/{name}"]
        assert (h["node"], h["gpus"], h["state"]) == (rec["node"], sorted(rec["gpus"]), "bound")
    assert_no_double_booking(list(got.values()))
    # 4+4 / 2+1 on as few nodes as possible: topoplace packs (16 GPUs over 4 nodes).
    assert len({p.spec.node_name for p in got.values()}) <= 3
    delete_pods(core, namespace, list(sizes))
    wait_all_free(topoplace, gpu_nodes)


def test_binder_against_the_real_binding_subresource(
    core: Any, kubeconfig: str, namespace: str, run_id: str, gpu_nodes: list[str]
) -> None:
    from scheduler.kube.binder import ERR_CONFLICT, ERR_POD_GONE, KubeBinder
    from scheduler.kube.client import KubeApi

    core.create_namespaced_pod(namespace, gpu_pod("direct", 2, "nobody-schedules-this", run_id))
    api = KubeApi.from_config(kubeconfig)
    b = KubeBinder(api)
    pod = b.fetch_pod(namespace, "direct")
    assert pod is not None and "managedFields" not in pod["metadata"]
    ann = {PLACEMENT_ANNOTATION: json.dumps({"gpus": [6, 7], "node": gpu_nodes[3], "v": 1})}
    assert b.bind(pod, gpu_nodes[3], ann) == ""
    assert b.bind(pod, gpu_nodes[3], ann) == ""  # retried: 409, bound there -> success
    err = b.bind(pod, gpu_nodes[2], ann)
    assert err.startswith(ERR_CONFLICT) and "already assigned" in err
    after = core.read_namespaced_pod("direct", namespace)
    assert after.spec.node_name == gpu_nodes[3]
    assert after.metadata.annotations[PLACEMENT_ANNOTATION] == ann[PLACEMENT_ANNOTATION]
    ghost = {**pod, "metadata": {**pod["metadata"], "name": "ghost"}}
    assert b.bind(ghost, gpu_nodes[3], ann).startswith(ERR_POD_GONE)
    delete_pods(core, namespace, ["direct"])
    api.close()


def test_deleted_pod_releases_its_gpus(
    core: Any,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    run_id: str,
    gpu_nodes: list[str],
) -> None:
    core.create_namespaced_pod(namespace, gpu_pod("short", 8, scheduler_name, run_id))
    pod = wait_for(lambda: bound(core, namespace, ["short"]).get("short"), 60, "pod bound")
    node = pod.spec.node_name

    def free_on() -> int:
        return next(
            n["free_gpus"] for n in topoplace.get("/v1/inspect/nodes")["nodes"] if n["name"] == node
        )

    assert free_on() == 0
    delete_pods(core, namespace, ["short"])
    wait_for(lambda: free_on() == 8, 20, "GPUs released after the DELETED event")


def test_restart_recovers_bound_placements(
    core: Any,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    run_id: str,
    gpu_nodes: list[str],
) -> None:
    names = ["keep-3", "keep-5"]
    core.create_namespaced_pod(namespace, gpu_pod("keep-3", 3, scheduler_name, run_id))
    core.create_namespaced_pod(namespace, gpu_pod("keep-5", 5, scheduler_name, run_id))
    wait_for(lambda: len(bound(core, namespace, names)) == 2, 60, "2 pods bound")
    before = {
        p["pod"]: (p["node"], p["gpus"])
        for p in topoplace.get("/v1/inspect/placements")["placements"]
    }
    topoplace.kill(signal.SIGKILL)
    topoplace.start()
    took = topoplace.wait_ready()
    after = {
        p["pod"]: (p["node"], p["gpus"])
        for p in topoplace.get("/v1/inspect/placements")["placements"]
    }
    assert after == before, "placements recovered from annotations must be identical"
    assert took < 30
    # New work lands around the recovered GPUs, never on them.
    core.create_namespaced_pod(namespace, gpu_pod("after-restart", 8, scheduler_name, run_id))
    wait_for(lambda: bound(core, namespace, ["after-restart"]), 60, "new pod bound")
    pods = list(pods_by_name(core, namespace, [*names, "after-restart"]).values())
    assert_no_double_booking(pods)
    delete_pods(core, namespace, [*names, "after-restart"])
    wait_all_free(topoplace, gpu_nodes)


def test_graceful_shutdown_then_restart(topoplace: Topoplace, gpu_nodes: list[str]) -> None:
    topoplace.kill(signal.SIGTERM)  # drains binds, closes watches, exits
    topoplace.start()
    topoplace.wait_ready()
    assert "kube mode stopped" in (
        topoplace.logdir / f"topoplace-{topoplace.starts - 1}.log"
    ).read_text(errors="replace")


# ---- gangs -------------------------------------------------------------------------------------


@needs_gangs
def test_gang_is_all_or_nothing(
    core: Any,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    run_id: str,
    gpu_nodes: list[str],
) -> None:
    # One GPU taken on the last node: only 3 whole nodes are free for a 4 x 8-GPU gang.
    core.create_namespaced_pod(
        namespace, gpu_pod("blocker", 1, scheduler_name, run_id, node=gpu_nodes[3])
    )
    wait_for(lambda: bound(core, namespace, ["blocker"]), 60, "blocker bound")
    members = [f"aon-{i}" for i in range(4)]
    for m in members:
        core.create_namespaced_pod(
            namespace,
            gpu_pod(m, 8, scheduler_name, run_id, annotations=gang_annotations("aon", 4)),
        )
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:  # nothing may bind while the gang cannot fit whole
        assert bound(core, namespace, members) == {}, "part of a gang was bound"
        time.sleep(0.5)
    delete_pods(core, namespace, ["blocker"])
    got = wait_for(
        lambda: (b := bound(core, namespace, members)) and len(b) == 4 and b, 90, "gang bound"
    )
    assert {p.spec.node_name for p in got.values()} == set(gpu_nodes)
    assert {placement(p).get("gang") for p in got.values()} == {f"{namespace}/aon"}
    assert_no_double_booking(list(got.values()))
    delete_pods(core, namespace, members)
    wait_all_free(topoplace, gpu_nodes)


@needs_gangs
def test_gang_reservations_hold_off_competitors(
    core: Any,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    run_id: str,
    gpu_nodes: list[str],
) -> None:
    """Control for the restart test: without a restart, a competitor arriving after member
    0 bound is refused while the plan reserves the other members' nodes."""
    ann = gang_annotations("hold", 4)
    core.create_namespaced_pod(
        namespace, gpu_pod("hold-0", 8, scheduler_name, run_id, annotations=ann)
    )
    wait_for(lambda: bound(core, namespace, ["hold-0"]), 60, "hold-0 bound")
    core.create_namespaced_pod(namespace, gpu_pod("rival-h", 8, scheduler_name, run_id))
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod("rival-h", namespace)
        assert not pod.spec.node_name, f"rival-h took {pod.spec.node_name} from the plan"
        time.sleep(0.5)
    members = [f"hold-{i}" for i in range(4)]
    for m in members[1:]:
        core.create_namespaced_pod(
            namespace, gpu_pod(m, 8, scheduler_name, run_id, annotations=ann)
        )
    got = wait_for(
        lambda: (b := bound(core, namespace, members)) and len(b) == 4 and b, 90, "gang bound"
    )
    assert {p.spec.node_name for p in got.values()} == set(gpu_nodes)


def ungate(core: Any, ns: str, name: str) -> None:
    core.patch_namespaced_pod(name, ns, {"spec": {"schedulingGates": None}})


def assert_rivals_wait(core: Any, ns: str, rivals: list[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for r in rivals:
            pod = core.read_namespaced_pod(r, ns)
            assert not pod.spec.node_name, (
                f"after the restart {r} took {pod.spec.node_name}, a node the gang had "
                "planned (its reservations did not survive the restart)"
            )
        time.sleep(0.5)


@needs_gangs
def test_restart_mid_gang_loses_nothing(
    core: Any,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    run_id: str,
    gpu_nodes: list[str],
) -> None:
    """A 4 x 8-GPU gang on exactly 4 free nodes. Member 0 binds; members 1-3 exist but are
    held back by a scheduling gate, so the gang is mid-way: one bound, three planned.
    topoplace is killed (SIGKILL); one competing 8-GPU pod arrives while it is down and
    another right after it restarts. Then the gates are lifted. The gang must complete,
    member 0 unchanged, and no competitor may get any of the gang's GPUs."""
    ann = gang_annotations("mid", 4)
    members = ["mid-0", "mid-1", "mid-2", "mid-3"]
    core.create_namespaced_pod(
        namespace, gpu_pod("mid-0", 8, scheduler_name, run_id, annotations=ann)
    )
    for m in members[1:]:
        core.create_namespaced_pod(
            namespace, gpu_pod(m, 8, scheduler_name, run_id, annotations=ann, gated=True)
        )
    first = wait_for(lambda: bound(core, namespace, ["mid-0"]).get("mid-0"), 60, "mid-0 bound")
    rec0 = placement(first)
    topoplace.kill(signal.SIGKILL)
    core.create_namespaced_pod(namespace, gpu_pod("rival", 8, scheduler_name, run_id))
    topoplace.start()
    topoplace.wait_ready()
    plans = topoplace.get("/v1/inspect/placements")["gangs"]
    assert f"{namespace}/mid" in plans, plans
    # A rival scheduled at once against the recovered state.
    core.create_namespaced_pod(namespace, gpu_pod("rival-2", 8, scheduler_name, run_id))
    assert_rivals_wait(core, namespace, ["rival", "rival-2"], 8)
    for m in members[1:]:
        ungate(core, namespace, m)
    got = wait_for(
        lambda: (b := bound(core, namespace, members)) and len(b) == 4 and b, 90, "gang bound"
    )
    assert placement(got["mid-0"]) == rec0, "the bound member's placement changed"
    assert {p.spec.node_name for p in got.values()} == set(gpu_nodes)
    for r in ("rival", "rival-2"):
        pod = core.read_namespaced_pod(r, namespace)
        assert not pod.spec.node_name, f"{r} took the gang's GPUs on {pod.spec.node_name}"
    assert_no_double_booking(list(got.values()))


@needs_gangs
def test_restart_before_the_other_members_exist(
    core: Any,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    run_id: str,
    gpu_nodes: list[str],
) -> None:
    """Like the test above, but members 1-3 are created only after the restart: the plan
    made at member 0 promised them three nodes, which a rival must not get meanwhile. The
    plan survives in late-0's placement record; when the members come they get exactly
    the promised slots, under the same plan id."""
    ann = gang_annotations("late", 4)
    members = ["late-0", "late-1", "late-2", "late-3"]
    core.create_namespaced_pod(
        namespace, gpu_pod("late-0", 8, scheduler_name, run_id, annotations=ann)
    )
    first = wait_for(lambda: bound(core, namespace, ["late-0"]).get("late-0"), 60, "late-0 bound")
    rec0 = placement(first)
    promised = {(node, tuple(gpus)) for _, node, gpus in rec0["slots"]}
    assert len(rec0["slots"]) == 4 and {n for n, _ in promised} == set(gpu_nodes)
    topoplace.kill(signal.SIGKILL)
    topoplace.start()
    topoplace.wait_ready()
    plan = topoplace.get("/v1/inspect/placements")["gangs"][f"{namespace}/late"]
    assert plan["plan"] == rec0["plan"] and plan["details"]["recovery"] == "replayed", plan
    assert sum(s["state"] == "reserved" for s in plan["slots"]) == 3, plan
    core.create_namespaced_pod(namespace, gpu_pod("rival-l", 8, scheduler_name, run_id))
    assert_rivals_wait(core, namespace, ["rival-l"], 8)
    for m in members[1:]:
        core.create_namespaced_pod(
            namespace, gpu_pod(m, 8, scheduler_name, run_id, annotations=ann)
        )
    got = wait_for(
        lambda: (b := bound(core, namespace, members)) and len(b) == 4 and b, 90, "gang bound"
    )
    assert placement(got["late-0"]) == rec0, "the bound member's placement changed"
    recs = {m: placement(p) for m, p in got.items()}
    assert {(r["node"], tuple(r["gpus"])) for r in recs.values()} == promised
    assert {r["plan"] for r in recs.values()} == {rec0["plan"]}
    pod = core.read_namespaced_pod("rival-l", namespace)
    assert not pod.spec.node_name, f"rival-l took the gang's GPUs on {pod.spec.node_name}"
    assert_no_double_booking(list(got.values()))


# ---- snapshot command ---------------------------------------------------------------------------


def test_snapshot_command_writes_a_readable_cluster_file(
    core: Any,
    kubeconfig: str,
    topoplace: Topoplace,
    namespace: str,
    scheduler_name: str,
    run_id: str,
    gpu_nodes: list[str],
    tmp_path: Any,
) -> None:
    from scheduler.cli.clusterfile import load_cluster
    from scheduler.core.params import SchedParams
    from scheduler.core.snapshot import build_snapshot

    core.create_namespaced_pod(namespace, gpu_pod("snap", 2, scheduler_name, run_id))
    wait_for(lambda: bound(core, namespace, ["snap"]), 60, "pod bound")
    out = tmp_path / "cluster.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler.cli.main",
            "snapshot",
            "--kubeconfig",
            kubeconfig,
            "-o",
            str(out),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=60,
    )
    nodes, pods, extra = load_cluster(out)
    snap = build_snapshot(nodes, pods, SchedParams(), extra)
    assert set(gpu_nodes) <= set(snap.index)
    live = {
        p["pod"]: (p["node"], p["gpus"])
        for p in topoplace.get("/v1/inspect/placements")["placements"]
    }
    held = snap.pods[f"{namespace}/snap"]
    assert held.gpu_indices_known and live[f"{namespace}/snap"] == (held.node, list(held.gpus))
    delete_pods(core, namespace, ["snap"])
    wait_all_free(topoplace, gpu_nodes)
