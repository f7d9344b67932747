"""Issue 12: a fuzzer over Node and Pod objects fed to the snapshot builder and the request
reader (not only over HTTP bodies).

Objects start real-shaped and get one to three fields replaced by hostile values: wrong
types anywhere, huge and non-finite numbers, ``NaN`` / ``Infinity`` text, odd GPU counts,
deep nesting, long strings, forged placement records, missing fields. Properties:

* :func:`node_from_object` returns a NodeInfo (possibly one topoplace cannot model) or
  raises ObjectError (no name); :func:`request_from_pod` returns an in-range PodRequest or
  raises ObjectError. Nothing else, and each object within :data:`BUDGET_S`.
* :func:`build_snapshot` over well-formed and hostile objects together never raises, and
  every well-formed node is still modelled and served (the filter gives it a GPU verdict,
  not "cannot model"), with no GPU held twice.
* :func:`with_node_object` with a hostile node leaves every other node as it was;
  :func:`pod_info_for` + :func:`with_pod` accept any hostile bound pod.

Timing is a generous bound on a modest number of examples (not a benchmark), measured as
the thread's CPU time (other processes on the machine do not count) with the garbage
collector paused. Nodes of 13-16 GPUs are exempt from it: the first use of a
shape of that size costs 0.3-2.7 s in ``topology.select`` whatever the object (memoized per
shape afterwards), a topology cost rather than parsing, reported separately; 9-12 are
warmed first for the same reason.
"""

from __future__ import annotations

import copy
import gc
import os
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.gang import podgroup_min_member
from scheduler.core.health import REASON_UNMODELED
from scheduler.core.model import MAX_GANG_SIZE, MAX_NODE_GPUS, NodeInfo, indices_to_mask
from scheduler.core.objects import ObjectError, node_from_object, node_gpus, request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.quantity import QUANTITY_MAX
from scheduler.core.schedule import filter_nodes
from scheduler.core.snapshot import build_snapshot, pod_info_for, with_node_object, with_pod
from tests.builders import gang_pod, make_node, make_pod
from tests.hardening.objects import GPU, deep

P = SchedParams()
FABRIC = P.fabric
BUDGET_S = 0.05
EXAMPLES = int(os.environ.get("TOPOPLACE_FUZZ_EXAMPLES", "0"))
"""Set (e.g. 2000) for a deeper, randomized run; CI runs 40 derandomized examples each."""
SETTINGS = settings(
    max_examples=EXAMPLES or 40,
    deadline=None,
    derandomize=not EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

GOOD_NODES = [make_node("good-0", 8), make_node("good-1", 4, "gb200"), make_node("good-2", 8)]
GOOD_PODS = [
    make_pod("held-0", 2, node="good-0", gpu_indices=[0, 1]),
    make_pod("held-1", 4, node="good-1", gpu_indices=[0, 1, 2, 3]),
    make_pod("held-2", 1, node="good-2"),
]


@pytest.fixture(scope="module", autouse=True)
def _warm_shapes() -> None:
    """First use of a shape of 9-12 GPUs costs up to 0.2 s in topology.select (docstring),
    the first YAML annotation imports pyyaml: one-time costs, paid before timing."""
    nodes = [
        mutate(
            base,
            [
                ("metadata.name", f"w{g}-{i}"),
                (f"status.capacity.[{GPU}]", str(g)),
                (f"status.allocatable.[{GPU}]", str(g)),
            ],
        )
        for g in range(13)
        for i, base in enumerate(NODE_BASES)
    ]
    # And the first YAML topology annotation imports pyyaml (tens of milliseconds, once).
    yaml_node = mutate(
        NODE_BASES[0], [("metadata.annotations.[topoplace.io/gpu-topology]", "a: 1")]
    )
    build_snapshot([*nodes, yaml_node], [], P)


# ---- hostile values -------------------------------------------------------------------------

PLACEMENTS = [
    '{"v":1,"node":"good-0","gpus":[0,1]}',  # forged: GPUs another pod holds
    '{"v":1,"node":"good-0","gpus":[9223372036854775807]}',
    '{"v":1,"node":"good-0","gpus":[61, 62, 63]}',
    '{"v":1,"node":"good-0","gpus":[-1]}',
    '{"v":1,"node":"good-0","gpus":[true]}',
    '{"v":1,"node":{"a":1},"gpus":[2]}',
    '{"v":1,"node":"good-0","gpus":[2],"gang":"x","plan":"p","slots":[["r","good-0",[1e18]]]}',
    "[" * 5000 + "]" * 5000,
    '{"v":1e999,"gpus":[]}',
]
NUMERIC_TEXT = [
    "0", "1", "2", "4", "8", "9", "12", "17", "62", "63", "64", "80", "640", "-8", "7.5",
    "1e1000000", "1e300000", "1e-1000000", "1E", "8Ei", "NaN", "Infinity", "-Infinity",
    "²", "٣", "1" * 5000, "0x10", "1_000", " 8 ", "", "500m", "512Gi", "9" * 64,
]  # fmt: skip
SCALARS = st.sampled_from(
    [
        None, True, False, 0, -1, 1, 8, 11, 62, 63, 64, 80, 2**31, 2**63, 2**64, 10**400,
        float("nan"), float("inf"), -float("inf"), 1e308, 0.5, "True", "Ready", "nvlink",
        "node", "rack", "GPU-0,GPU-1", "0,1,99,GPU-x", "gpu-3", "dgx-h100", "dgx2-v100",
        '{"gpus": 4}', '{"gpus": ' + "[" * 3000, "gpus: 99", "\tGPU0\tGPU1\nGPU0\t X \tNV1\n",
        "x" * 70_000, "2026-11-29T20:00:00Z", "0001-01-01T00:00:00+14:00",
        *NUMERIC_TEXT, *PLACEMENTS,
    ]
)  # fmt: skip
KEYS = st.sampled_from(["", "name", "gpus", "status", "type", "key", "effect", "id", GPU])
LEAVES = SCALARS | st.text(max_size=12) | st.integers() | st.floats()
HOSTILE = st.one_of(
    st.recursive(
        LEAVES,
        lambda c: (
            st.lists(c, max_size=3) | st.dictionaries(KEYS | st.text(max_size=6), c, max_size=3)
        ),
        max_leaves=6,
    ),
    st.integers(100, 4000).map(deep),
    st.integers(100, 4000).map(lambda d: {"a": deep(d)}),
)

NODE_PATHS = [
    "metadata", "metadata.name", "metadata.labels", "metadata.annotations",
    "metadata.labels.[nvidia.com/gpu.product]", "metadata.labels.[nvidia.com/gpu.count]",
    "metadata.labels.[nvidia.com/gpu.machine]", "metadata.labels.[nvidia.com/gpu.clique]",
    "metadata.labels.[network.topology.nvidia.com/leaf]",
    "metadata.labels.[dgxc.nvidia.com/nvsentinel-state]",
    "metadata.annotations.[topoplace.io/gpu-topology]",
    "metadata.annotations.[hami.io/device-cordon]",
    "metadata.annotations.[volcano.sh/gpu-unhealthy-ids]",
    "metadata.annotations.[topoplace.io/gpu-uuids]",
    "metadata.annotations.[hami.io/node-nvidia-register]",
    "spec", "spec.unschedulable", "spec.taints", "spec.taints.0",
    "status", "status.capacity", "status.allocatable",
    f"status.capacity.[{GPU}]", f"status.allocatable.[{GPU}]",
    "status.allocatable.cpu", "status.allocatable.memory",
    "status.conditions", "status.conditions.0", "status.conditions.0.status",
    "status.conditions.0.type", "status.conditions.0.lastHeartbeatTime",
    "status.conditions.1", "status.conditions.1.lastTransitionTime",
]  # fmt: skip
POD_PATHS = [
    "metadata", "metadata.name", "metadata.namespace", "metadata.uid",
    "metadata.labels", "metadata.annotations",
    "metadata.labels.[scheduling.x-k8s.io/pod-group]",
    "metadata.annotations.[topoplace.io/gang]", "metadata.annotations.[topoplace.io/gang-size]",
    "metadata.annotations.[topoplace.io/min-link]", "metadata.annotations.[topoplace.io/role]",
    "metadata.annotations.[topoplace.io/topology-required]",
    "metadata.annotations.[topoplace.io/placement]",
    "spec", "spec.nodeName", "spec.priority", "spec.nodeSelector", "spec.nodeSelector.zone",
    "spec.containers", "spec.containers.0", "spec.containers.0.resources",
    "spec.containers.0.resources.requests", "spec.containers.0.resources.limits",
    f"spec.containers.0.resources.requests.[{GPU}]", f"spec.containers.0.resources.limits.[{GPU}]",
    "spec.containers.0.resources.requests.cpu", "spec.containers.0.resources.requests.memory",
    "spec.initContainers", "spec.initContainers.0", "status", "status.phase",
]  # fmt: skip
NODE_BASES = [
    make_node("odd", 8),
    make_node("odd", 4, "gb200", clique="c.1"),
    make_node("odd", 0),
    make_node("odd", 8, degraded=True),
]
POD_BASES = [
    make_pod("p", 2),
    gang_pod("g", 4, "train", 4, required="leaf"),
    make_pod("b", 2, node="good-0", gpu_indices=[4, 5]),
    make_pod("c", 1, node="good-2"),
]


def _segments(path: str) -> list[str]:
    out: list[str] = []
    rest = path
    while rest:
        if rest.startswith("["):
            end = rest.index("]")
            out.append(rest[1:end])
            rest = rest[end + 1 :].lstrip(".")
        else:
            head, _, rest = rest.partition(".")
            out.append(head)
    return out


def mutate(base: dict[str, Any], changes: list[tuple[str, Any]]) -> dict[str, Any]:
    """A copy of ``base`` with each (path, value) set, creating objects on the way (the
    values are inserted as they are: never copied, so deep ones stay cheap)."""
    obj = copy.deepcopy(base)
    for path, value in changes:
        cur: Any = obj
        parts = _segments(path)
        for p in parts[:-1]:
            if isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
                cur = cur[int(p)]
                continue
            if not isinstance(cur, dict):
                break
            if not isinstance(cur.get(p), dict | list):
                cur[p] = {}
            cur = cur[p]
        else:
            last = parts[-1]
            if isinstance(cur, list) and last.isdigit() and int(last) < len(cur):
                cur[int(last)] = value
            elif isinstance(cur, dict):
                cur[last] = value
    return obj


def hostile_objects(bases: list[dict[str, Any]], paths: list[str]) -> st.SearchStrategy[Any]:
    changes = st.lists(st.tuples(st.sampled_from(paths), HOSTILE), min_size=1, max_size=3)
    return st.builds(mutate, st.sampled_from(bases), changes)


NODES = hostile_objects(NODE_BASES, NODE_PATHS)
PODS = hostile_objects(POD_BASES, POD_PATHS)


def timed(fn: Callable[[], Any]) -> tuple[Any, BaseException | None, float]:
    """(result, exception, CPU seconds of this thread) with the garbage collector paused."""
    gc.disable()
    t0 = time.thread_time()
    try:
        return fn(), None, time.thread_time() - t0
    except Exception as exc:
        return None, exc, time.thread_time() - t0
    finally:
        gc.enable()


def slow_shape(*objs: Any) -> bool:
    """Some object is a node of 13-16 GPUs (exempt from the time bound: see docstring)."""
    return any(13 <= node_gpus(o)[0] <= 16 for o in objs if isinstance(o, dict))


def check_node(info: NodeInfo) -> None:
    assert 0 <= info.gpu_capacity <= MAX_NODE_GPUS
    assert info.health.bad_mask & ~info.all_mask == 0
    if info.unmodeled:
        assert info.gpu_capacity == 0 and info.health.reasons == (REASON_UNMODELED,)
    elif info.gpu_capacity:
        assert info.shape.num_gpus == info.gpu_capacity


# ---- properties -------------------------------------------------------------------------------


@SETTINGS
@given(node=NODES)
def test_a_hostile_node_is_a_node_or_an_object_error(node: Any) -> None:
    info, exc, took = timed(lambda: node_from_object(node, FABRIC, P.health, now=1.8e9))
    assert exc is None or isinstance(exc, ObjectError), repr(exc)
    assert took < BUDGET_S or slow_shape(node), f"{took:.3f}s"
    if info is not None:
        check_node(info)


@SETTINGS
@given(pod=PODS)
def test_a_hostile_pod_is_a_request_or_an_object_error(pod: Any) -> None:
    req, exc, took = timed(lambda: request_from_pod(pod, FABRIC))
    assert exc is None or isinstance(exc, ObjectError), repr(exc)
    assert took < BUDGET_S, f"{took:.3f}s"
    if req is not None:
        assert 0 <= req.gpus <= MAX_NODE_GPUS
        assert 0 <= req.cpu_milli <= QUANTITY_MAX and 0 <= req.memory_bytes <= QUANTITY_MAX
        assert 0 <= req.gang_size <= MAX_GANG_SIZE
        assert -(2**31) <= req.priority < 2**31


@SETTINGS
@given(nodes=st.lists(NODES, max_size=4), pods=st.lists(PODS, max_size=4))
def test_a_batch_with_hostile_objects_still_serves_the_good_nodes(
    nodes: list[Any], pods: list[Any]
) -> None:
    hostile = [n for n in nodes if not _named_good(n)]
    objs = [*GOOD_NODES, *hostile]
    snap, exc, took = timed(lambda: build_snapshot(objs, [*GOOD_PODS, *pods], P))
    assert exc is None, repr(exc)
    assert took < BUDGET_S * (len(objs) + len(pods) + len(GOOD_PODS)) or slow_shape(*hostile)
    for n in snap.nodes:
        check_node(n)
        held = [indices_to_mask(p.gpus) for p in snap.pods_on(n.name)]
        assert sum(m.bit_count() for m in held) == (n.used_mask).bit_count()  # disjoint
    want = {"good-0": 8, "good-1": 4, "good-2": 8}
    for name, cap in want.items():
        node = snap.node(name)
        assert node is not None and not node.unmodeled and node.gpu_capacity == cap
    one = request_from_pod(make_pod("probe", 1), FABRIC)
    out = filter_nodes(snap, one, list(want), P)
    assert not set(out.unresolvable) & set(want)
    for name in want:  # served: a good node with a free GPU takes the probe
        assert (name in out.feasible) == (snap.node(name).free_gpus > 0)  # type: ignore[union-attr]


@SETTINGS
@given(node=NODES)
def test_a_hostile_node_update_leaves_the_others_alone(node: Any) -> None:
    base = build_snapshot(GOOD_NODES, GOOD_PODS, P)
    if _named_good(node):
        return
    snap, exc, took = timed(lambda: with_node_object(base, node, P))
    assert exc is None or isinstance(exc, ObjectError), repr(exc)
    assert took < BUDGET_S * 2 or slow_shape(node), f"{took:.3f}s"
    if snap is not None:
        for good in base.nodes:
            assert snap.node(good.name) == good
        assert dict(snap.pods) == dict(base.pods)


@SETTINGS
@given(pod=PODS)
def test_a_hostile_bound_pod_enters_the_snapshot(pod: Any) -> None:
    base = build_snapshot(GOOD_NODES, GOOD_PODS, P)
    info, exc, took = timed(lambda: pod_info_for(base, pod, "good-0", assumed=False))
    assert exc is None, repr(exc)
    assert took < BUDGET_S, f"{took:.3f}s"
    node = base.node("good-0")
    assert node is not None
    assert indices_to_mask(info.gpus) & ~node.all_mask == 0
    with_pod(base, info)  # never a double booking


@SETTINGS
@given(value=HOSTILE)
def test_hostile_podgroup_sizes_are_bounded(value: Any) -> None:
    n, exc, took = timed(lambda: podgroup_min_member({"spec": {"minMember": value}}))
    assert exc is None and 0 <= n < 2**31 and took < BUDGET_S


SLICE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "good-0-gpus"},
    "spec": {
        "nodeName": "good-0",
        "driver": "gpu.nvidia.com",
        "devices": [
            {
                "name": "gpu-0",
                "attributes": {"index": {"int": 0}, "uuid": {"string": "GPU-0"}},
                "taints": [
                    {
                        "key": "gpu.nvidia.com/xid",
                        "effect": "NoSchedule",
                        "timeAdded": "2026-11-29T20:00:00Z",
                    }
                ],
            }
        ],
    },
}
SLICE_PATHS = [
    "metadata", "spec", "spec.nodeName", "spec.driver", "spec.devices", "spec.devices.0",
    "spec.devices.0.name", "spec.devices.0.attributes", "spec.devices.0.attributes.index",
    "spec.devices.0.attributes.index.int", "spec.devices.0.attributes.uuid.string",
    "spec.devices.0.attributes.type", "spec.devices.0.attributes.parentIndex",
    "spec.devices.0.taints", "spec.devices.0.taints.0", "spec.devices.0.taints.0.effect",
    "spec.devices.0.taints.0.key", "spec.devices.0.taints.0.timeAdded",
    "spec.devices.0.taints.0.value", "spec.devices.0.basic",
]  # fmt: skip


@SETTINGS
@given(slices=st.lists(hostile_objects([SLICE], SLICE_PATHS), max_size=3), now=HOSTILE)
def test_hostile_resourceslices_and_clock_do_not_break_the_build(
    slices: list[Any], now: Any
) -> None:
    extra = {"resourceslices": [SLICE, *slices], "now": now}
    snap, exc, took = timed(lambda: build_snapshot(GOOD_NODES, GOOD_PODS, P, extra))
    assert exc is None, repr(exc)
    assert took < BUDGET_S * 8
    assert snap.unmodeled == ()
    for n in snap.nodes:
        check_node(n)


def _named_good(obj: Any) -> bool:
    m = obj.get("metadata") if isinstance(obj, dict) else None
    return isinstance(m, dict) and isinstance(m.get("name"), str) and m["name"].startswith("good")


def test_the_fuzzer_reaches_its_targets() -> None:
    """The strategies produce what the docstring promises (a guard against a fuzzer that
    silently stopped fuzzing): unmodeled nodes, refused pods, forged placement records."""
    odd = mutate(NODE_BASES[0], [(f"status.capacity.[{GPU}]", "80")])
    assert node_from_object(odd, FABRIC, P.health).unmodeled
    with pytest.raises(ObjectError):
        request_from_pod(mutate(POD_BASES[0], [("metadata.labels", ["x"])]), FABRIC)
    forged = mutate(
        POD_BASES[2], [("metadata.annotations.[topoplace.io/placement]", PLACEMENTS[0])]
    )
    assert orjson.loads(PLACEMENTS[0])["gpus"] == [0, 1]
    info = pod_info_for(build_snapshot(GOOD_NODES, GOOD_PODS, P), forged, "good-0")
    assert not set(info.gpus) & {0, 1}
