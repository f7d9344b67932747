"""Each health signal, and combinations of them, one described row per case."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.health import (
    REASON_CORDONED,
    REASON_DEGRADED_CONDITION,
    REASON_DEVICE_TAINT,
    REASON_DEVICE_UNMONITORED,
    REASON_FAULT_TAINT,
    REASON_GPU_ALLOCATABLE,
    REASON_GPU_CORDON,
    REASON_GPU_FAULT,
    REASON_GPU_UNRESOLVED,
    REASON_HEARTBEAT_STALE,
    REASON_NOT_READY,
    REASON_NVSENTINEL,
    REASON_XID_BURST,
    HealthParams,
    assess,
    assess_node,
    devices_by_node,
    merge,
    xid_signals,
)
from scheduler.core.model import Health, NodeHealth
from scheduler.core.objects import node_gpus
from tests.health.builders import (
    HEARTBEAT,
    UUIDS,
    condition,
    device,
    dgx,
    resource_slice,
    taint,
)

H, D, U = Health.HEALTHY, Health.DEGRADED, Health.UNHEALTHY
P = HealthParams()
NOW = HEARTBEAT + 60.0  # a fresh heartbeat
XID = "gpu.nvidia.com/xid"
T0 = "2026-11-29T19:50:00Z"  # 11 min before NOW
T_OLD = "2026-11-29T17:00:00Z"  # 3 h before NOW


def with_uuids(**kw: Any) -> dict[str, Any]:
    ann = {"topoplace.io/gpu-uuids": ",".join(UUIDS), **kw.pop("annotations", {})}
    return dgx(annotations=ann, **kw)


def not_ready_unknown() -> dict[str, Any]:
    n = dgx()
    n["status"]["conditions"][0]["status"] = "Unknown"
    return n


def no_ready_condition() -> dict[str, Any]:
    n = dgx()
    n["status"]["conditions"] = []
    return n


@dataclass(frozen=True)
class Row:
    desc: str
    node: dict[str, Any]
    state: Health
    reasons: tuple[str, ...] = ()
    bad: tuple[int, ...] = ()
    risk: tuple[float, float] = (0.0, 0.0)
    unschedulable: bool = False
    now: float | None = NOW
    devices: tuple[dict[str, Any], ...] = ()
    params: HealthParams = field(default_factory=HealthParams)
    first_reason: str | None = None


ROWS = [
    Row("healthy DGX H100", dgx(), H),
    Row(
        "Ready=False (with the taint the node controller adds)",
        dgx(ready=False),
        U,
        (REASON_NOT_READY, REASON_FAULT_TAINT),
        risk=(1, 1),
        first_reason=REASON_NOT_READY,
    ),
    Row(
        "Ready=Unknown (node controller lost the kubelet)",
        not_ready_unknown(),
        U,
        (REASON_NOT_READY,),
        risk=(1, 1),
    ),
    Row("no Ready condition at all", no_ready_condition(), U, (REASON_NOT_READY,), risk=(1, 1)),
    Row(
        "cordoned only: unschedulable, not a fault",
        dgx(unschedulable=True),
        H,
        (REASON_CORDONED,),
        unschedulable=True,
    ),
    Row(
        "fatal NVSentinel condition + NVSentinel cordon",
        dgx(
            conditions=[condition("GpuXidError")],
            unschedulable=True,
            labels={"dgxc.nvidia.com/nvsentinel-state": "quarantined"},
        ),
        U,
        (REASON_GPU_FAULT, REASON_NVSENTINEL, REASON_CORDONED),
        risk=(1, 1),
        unschedulable=True,
    ),
    Row(
        "fatal condition reported healthy (status False)",
        dgx(conditions=[condition("GpuXidError", "False")]),
        H,
    ),
    Row(
        "SysLogsGPUFallenOff (fatal by default)",
        dgx(conditions=[condition("SysLogsGPUFallenOff")]),
        U,
        (REASON_GPU_FAULT,),
        risk=(1, 1),
    ),
    Row(
        "thermal watch: degraded with risk",
        dgx(conditions=[condition("GpuThermalWatch")]),
        D,
        (REASON_DEGRADED_CONDITION,),
        risk=(0.3, 0.3),
    ),
    Row(
        "unknown NVSentinel check True: degraded",
        dgx(conditions=[condition("GpuFooWatch")]),
        D,
        (REASON_DEGRADED_CONDITION,),
        risk=(0.3, 0.3),
    ),
    Row(
        "kubelet pressure condition False is fine",
        dgx(conditions=[condition("MemoryPressure", "False")]),
        H,
    ),
    Row(
        "NVSentinel remediation-succeeded is usable",
        dgx(labels={"dgxc.nvidia.com/nvsentinel-state": "remediation-succeeded"}),
        H,
    ),
    Row(
        "NVSentinel draining",
        dgx(labels={"dgxc.nvidia.com/nvsentinel-state": "draining"}),
        U,
        (REASON_NVSENTINEL,),
        risk=(1, 1),
    ),
    Row(
        "fault taint NoExecute",
        dgx(taints=[{"key": "nvidia.com/gpu-xid-error", "effect": "NoExecute"}]),
        U,
        (REASON_FAULT_TAINT,),
        risk=(1, 1),
    ),
    Row(
        "fault taint PreferNoSchedule is advisory",
        dgx(taints=[{"key": "nvidia.com/gpu-xid-error", "effect": "PreferNoSchedule"}]),
        H,
    ),
    Row(
        "GPU taint that GPU pods tolerate is not a fault",
        dgx(taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
        H,
    ),
    Row(
        "NotReady adds the not-ready taint too: one state, both reasons",
        dgx(ready=False, conditions=[condition("GpuThermalWatch")]),
        U,
        (REASON_NOT_READY, REASON_FAULT_TAINT, REASON_DEGRADED_CONDITION),
        risk=(1, 1),
        first_reason=REASON_NOT_READY,
    ),
    # Per-GPU exclusions.
    Row(
        "HAMi device-cordon by index",
        dgx(annotations={"hami.io/device-cordon": "3"}),
        D,
        (REASON_GPU_CORDON,),
        bad=(3,),
        risk=(0.2, 0.2),
    ),
    Row(
        "HAMi device-cordon by UUID",
        with_uuids(annotations={"hami.io/device-cordon": UUIDS[6]}),
        D,
        (REASON_GPU_CORDON,),
        bad=(6,),
        risk=(0.2, 0.2),
    ),
    Row(
        "Volcano unhealthy ids, two GPUs",
        dgx(annotations={"volcano.sh/gpu-unhealthy-ids": "1, 2"}),
        D,
        (REASON_GPU_CORDON,),
        bad=(1, 2),
        risk=(0.2, 0.2),
    ),
    Row(
        "cordon naming an unknown UUID removes one GPU conservatively",
        dgx(annotations={"hami.io/device-cordon": "GPU-nope"}),
        D,
        (REASON_GPU_UNRESOLVED,),
        bad=(7,),
        risk=(0.2, 0.2),
    ),
    Row(
        "cordon index beyond capacity is unresolvable",
        dgx(annotations={"hami.io/device-cordon": "12"}),
        D,
        (REASON_GPU_UNRESOLVED,),
        bad=(7,),
        risk=(0.2, 0.2),
    ),
    # Allocatable below capacity.
    Row(
        "allocatable 7 of 8: highest index removed",
        dgx(allocatable_gpus=7),
        D,
        (REASON_GPU_ALLOCATABLE,),
        bad=(7,),
        risk=(0.2, 0.2),
    ),
    Row(
        "allocatable 6 + cordon on 3: cordoned one counted, one more removed",
        dgx(allocatable_gpus=6, annotations={"hami.io/device-cordon": "3"}),
        D,
        (REASON_GPU_CORDON, REASON_GPU_ALLOCATABLE),
        bad=(3, 7),
        risk=(0.36, 0.36),
    ),
    Row(
        "allocatable 7 explained by the cordon: nothing more removed",
        dgx(allocatable_gpus=7, annotations={"hami.io/device-cordon": "3"}),
        D,
        (REASON_GPU_CORDON,),
        bad=(3,),
        risk=(0.2, 0.2),
    ),
    Row(
        "allocatable 0: every GPU gone, node still Ready",
        dgx(allocatable_gpus=0),
        D,
        (REASON_GPU_ALLOCATABLE,),
        bad=tuple(range(8)),
        risk=(0.2, 0.2),
    ),
    # Heartbeat.
    Row("heartbeat 1 min old: fine", dgx(), H, now=HEARTBEAT + 60),
    Row(
        "heartbeat 10 min old while Ready: suspect",
        dgx(),
        D,
        (REASON_HEARTBEAT_STALE,),
        risk=(0.5, 0.5),
        now=HEARTBEAT + 600,
    ),
    Row("no clock given: heartbeat not judged", dgx(), H, now=None),
    Row(
        "NotReady with a stale heartbeat: just not ready",
        dgx(ready=False),
        U,
        (REASON_NOT_READY, REASON_FAULT_TAINT),
        risk=(1, 1),
        now=HEARTBEAT + 3600,
    ),
    Row("heartbeat in the future (clock skew) is not stale", dgx(), H, now=HEARTBEAT - 900),
    # DRA device taints.
    Row(
        "DRA xid NoSchedule on index 2",
        dgx(),
        D,
        (REASON_DEVICE_TAINT,),
        bad=(2,),
        risk=(0.2, 0.2),
        devices=(device(2, taints=[taint(XID, "NoSchedule", "48")]),),
    ),
    Row(
        "DRA gpu-lost NoExecute mapped by UUID",
        with_uuids(),
        D,
        (REASON_DEVICE_TAINT,),
        bad=(5,),
        risk=(0.2, 0.2),
        devices=(
            device(
                None,
                uuid=UUIDS[5],
                name="gpu-x",
                taints=[taint("gpu.nvidia.com/gpu-lost", "NoExecute")],
            ),
        ),
    ),
    Row(
        "DRA taint in v1beta1 'basic' layout",
        dgx(),
        D,
        (REASON_DEVICE_TAINT,),
        bad=(4,),
        risk=(0.2, 0.2),
        devices=(device(4, beta=True, taints=[taint("gpu.nvidia.com/gpu-lost")]),),
    ),
    Row(
        "DRA taint on a MIG slice removes its parent GPU",
        dgx(),
        D,
        (REASON_DEVICE_TAINT,),
        bad=(1,),
        risk=(0.2, 0.2),
        devices=(
            device(
                3, name="gpu-1-mig-1g10gb-0", mig_parent=1, taints=[taint(XID, "NoSchedule", "94")]
            ),
        ),
    ),
    Row(
        "DRA device mapped by its canonical name gpu-6",
        dgx(),
        D,
        (REASON_DEVICE_TAINT,),
        bad=(6,),
        risk=(0.2, 0.2),
        devices=(device(None, name="gpu-6", taints=[taint("gpu.nvidia.com/gpu-lost")]),),
    ),
    Row(
        "DRA device that maps to no GPU: one removed conservatively",
        dgx(),
        D,
        (REASON_DEVICE_TAINT,),
        bad=(7,),
        risk=(0.2, 0.2),
        devices=(
            device(None, uuid="GPU-unknown", name="odd", taints=[taint("gpu.nvidia.com/gpu-lost")]),
        ),
    ),
    Row(
        "DRA unmonitored (effect None): risk only",
        dgx(),
        H,
        (REASON_DEVICE_UNMONITORED,),
        risk=(0.1, 0.1),
        devices=(device(0, taints=[taint("gpu.nvidia.com/unmonitored", "None")]),),
    ),
    Row(
        "one non-fatal XID: not a burst",
        dgx(),
        H,
        devices=(device(0, taints=[taint(XID, "None", "31", T0)]),),
    ),
    Row(
        "three non-fatal XIDs within the hour: suspect before anything cordons",
        dgx(),
        D,
        (REASON_XID_BURST,),
        risk=(0.5, 0.5),
        devices=tuple(device(i, taints=[taint(XID, "None", "94", T0)]) for i in range(3)),
    ),
    Row(
        "three non-fatal XIDs, hours ago: no longer a burst",
        dgx(),
        H,
        devices=tuple(device(i, taints=[taint(XID, "None", "94", T_OLD)]) for i in range(3)),
    ),
    Row(
        "NVSentinel check configured as non-fatal XID counts towards a burst",
        dgx(conditions=[condition("SysLogsXIDError", when=T0), condition("GpuXidWarn", when=T0)]),
        D,
        (REASON_XID_BURST,),
        risk=(0.5, 0.5),
        devices=(device(0, taints=[taint(XID, "None", "13", T0)]),),
        params=HealthParams(fatal_conditions=(), xid_conditions=("SysLogsXIDError", "GpuXidWarn")),
    ),
    # Combinations.
    Row(
        "degraded condition + lost GPU: risks combine as independent failures",
        dgx(allocatable_gpus=7, conditions=[condition("GpuPowerWatch")]),
        D,
        (REASON_DEGRADED_CONDITION, REASON_GPU_ALLOCATABLE),
        bad=(7,),
        risk=(0.44, 0.44),
    ),
    Row(
        "fatal condition + GPU cordon + cordon: unhealthy reason first",
        dgx(
            unschedulable=True,
            conditions=[condition("GpuMemWatch")],
            annotations={"hami.io/device-cordon": "0"},
        ),
        U,
        (REASON_GPU_FAULT, REASON_GPU_CORDON, REASON_CORDONED),
        bad=(0,),
        risk=(1, 1),
        unschedulable=True,
        first_reason=REASON_GPU_FAULT,
    ),
    Row(
        "stale heartbeat + XID burst",
        dgx(),
        D,
        (REASON_HEARTBEAT_STALE, REASON_XID_BURST),
        risk=(0.75, 0.75),
        now=HEARTBEAT + 900,
        devices=tuple(device(i, taints=[taint(XID, "None", "94", T0)]) for i in range(4)),
    ),
    # Parameters: what counts is configurable.
    Row(
        "thermal made fatal by policy",
        dgx(conditions=[condition("GpuThermalWatch")]),
        U,
        (REASON_GPU_FAULT,),
        risk=(1, 1),
        params=HealthParams(fatal_conditions=("GpuThermalWatch",)),
    ),
    Row(
        "Ready-only baseline ignores everything but Ready",
        dgx(
            unschedulable=True,
            allocatable_gpus=6,
            conditions=[condition("GpuXidError")],
            annotations={"hami.io/device-cordon": "1"},
            labels={"dgxc.nvidia.com/nvsentinel-state": "quarantined"},
        ),
        H,
        now=HEARTBEAT + 3600,
        devices=(device(2, taints=[taint("gpu.nvidia.com/gpu-lost")]),),
        params=HealthParams.ready_only(),
    ),
    Row(
        "Ready-only baseline still sees NotReady (not the taint)",
        dgx(ready=False),
        U,
        (REASON_NOT_READY,),
        risk=(1, 1),
        params=HealthParams.ready_only(),
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.desc for r in ROWS])
def test_signal(row: Row) -> None:
    cap, alloc = node_gpus(row.node)
    v = assess_node(row.node, cap, alloc, row.params, now=row.now, devices=row.devices)
    assert v.state == row.state
    assert set(v.reasons) == set(row.reasons), v.reasons
    assert v.bad_mask == sum(1 << i for i in row.bad)
    assert row.risk[0] - 1e-6 <= v.risk <= row.risk[1] + 1e-6
    assert v.unschedulable == row.unschedulable
    if row.first_reason:
        assert v.reasons[0] == row.first_reason


@pytest.mark.parametrize("row", ROWS, ids=[r.desc for r in ROWS])
def test_xid_signals_are_what_assess_reads(row: Row) -> None:
    """The health history's XID reader (no grading) gives exactly the assessment's XIDs,
    on every signal row, and with the XID-counting conditions configured too."""
    cap, alloc = node_gpus(row.node)
    counting = HealthParams(fatal_conditions=(), xid_conditions=("GpuXidError", "GpuXidWarn"))
    for params in (row.params, counting):
        want = assess(row.node, cap, alloc, params, now=row.now, devices=row.devices).xids
        assert xid_signals(row.node, cap, params, row.devices) == want


def test_xid_signals_read_conditions_and_non_blocking_device_taints() -> None:
    params = HealthParams(fatal_conditions=(), xid_conditions=("GpuXidWarn",))
    node = dgx(conditions=[condition("GpuXidWarn", when=T0), condition("Other", when=T0)])
    devs = (
        device(0, taints=[taint(XID, "None", "94", T_OLD)]),
        device(1, taints=[taint(XID, "NoSchedule", "48", T0)]),  # blocking: a fault, not an XID
        device(2, taints=[taint("other/key", "None", "1", T0)]),
    )
    got = xid_signals(node, 8, params, devs)
    assert [k for _, k in got] == [f"dra/gpu-0/94/{T_OLD}", f"condition/GpuXidWarn/{T0}"]
    assert xid_signals(node, 0, params, devs) == got[1:]  # no GPUs: device taints not read
    assert xid_signals("not a node", 8, params, devs) == ()  # type: ignore[arg-type]


def test_per_gpu_breakdown_names_the_lost_gpus() -> None:
    node = dgx(allocatable_gpus=6, annotations={"hami.io/device-cordon": "2"})
    devs = (device(4, taints=[taint(XID, "None", "31", T0)]),)
    rep = assess(node, 8, 6, P, now=NOW, devices=devs)
    states = {g.index: g.state for g in rep.gpus}
    assert states == {0: H, 1: H, 2: U, 3: H, 4: D, 5: H, 6: H, 7: U}
    assert rep.gpus[2].reasons == (REASON_GPU_CORDON,)
    assert rep.gpus[7].reasons == (REASON_GPU_ALLOCATABLE,)
    assert len(rep.xids) == 1


def test_resource_slices_are_indexed_by_node_and_driver() -> None:
    slices = [
        resource_slice("a", [device(0), device(1)]),
        resource_slice("b", [device(0)]),
        resource_slice("a", [device(0, taints=[taint("x")])], driver="other.example.com"),
        {"kind": "ResourceSlice", "spec": "garbage"},
        "not an object",
    ]
    idx = devices_by_node(slices, P)
    assert sorted(idx) == ["a", "b"]
    assert [d["name"] for d in idx["a"]] == ["gpu-0", "gpu-1"]
    assert devices_by_node(None) == {}


def test_from_config_accepts_shipped_keys_and_new_ones() -> None:
    p = HealthParams.from_config(
        {
            "fatal_conditions": ["GpuXidError"],
            "degraded_conditions": ["GpuThermalWatch"],
            "heartbeat_stale_seconds": 120,
            "flap_half_life_seconds": 3600,
            "settle_seconds": 600,
        }
    )
    assert p.fatal_conditions == ("GpuXidError",) and p.heartbeat_stale_seconds == 120
    assert HealthParams.from_config(None) == HealthParams()
    for bad in (
        {"nope": 1},
        {"settle_risk": 2.0},
        {"settle_seconds": -1},
        {"history_max_events": 0},
    ):
        with pytest.raises(ValueError):
            HealthParams.from_config(bad)


def test_merge_orders_reasons_by_severity_and_combines_risk() -> None:
    a = NodeHealth(D, ("a",), 0.5, bad_mask=1)
    b = NodeHealth(U, ("b",), 0.5, bad_mask=2, unschedulable=True)
    m = merge(a, b)
    assert m == NodeHealth(U, ("b", "a"), 0.75, 3, True)
    assert merge(NodeHealth(), NodeHealth()) == NodeHealth()


# ---- malformed input never raises -------------------------------------------------------------

MALFORMED: list[tuple[str, Any, Any]] = [
    ("not a mapping", "node", ()),
    ("empty object", {}, ()),
    (
        "metadata is a list",
        {"metadata": [], "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        (),
    ),
    ("conditions is a string", {"status": {"conditions": "Ready"}}, ()),
    ("condition entries not objects", {"status": {"conditions": [1, None, "x"]}}, ()),
    ("taints is a mapping", {"spec": {"taints": {"key": "x"}}}, ()),
    ("taint entries are strings", {"spec": {"taints": ["nvidia.com/gpu-error"]}}, ()),
    (
        "labels is None, annotations a list",
        {"metadata": {"labels": None, "annotations": ["x"]}},
        (),
    ),
    (
        "annotation values not strings",
        {"metadata": {"annotations": {"hami.io/device-cordon": 3, "topoplace.io/gpu-uuids": None}}},
        (),
    ),
    (
        "HAMi register is broken JSON",
        {
            "metadata": {
                "annotations": {
                    "hami.io/node-nvidia-register": "[{",
                    "hami.io/device-cordon": "GPU-1",
                }
            }
        },
        (),
    ),
    (
        "heartbeat is garbage",
        {
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True", "lastHeartbeatTime": "yesterday"}
                ]
            }
        },
        (),
    ),
    (
        "heartbeat is a bool",
        {
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": True}]
            }
        },
        (),
    ),
    ("devices not a list", dgx(), 5),
    ("device entries not objects", dgx(), [None, 1, "gpu-0"]),
    ("device attributes garbage", dgx(), [{"name": "gpu-1", "attributes": [1], "taints": "x"}]),
    (
        "device index negative / huge / bool",
        dgx(),
        [
            device(None, taints=[taint(XID)]) | {"attributes": {"index": {"int": v}}}
            for v in (-1, 99, True)
        ],
    ),
    ("taint without key or effect", dgx(), [device(0, taints=[{}])]),
    ("taint time garbage", dgx(), [device(0, taints=[taint(XID, "None", "1", "soon")])]),
]


@pytest.mark.parametrize("desc,node,devices", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_signals_never_raise(desc: str, node: Any, devices: Any) -> None:
    v = assess_node(node, 8, 8, P, now=NOW, devices=devices)
    assert xid_signals(node, 8, P, devices) == assess(node, 8, 8, P, now=NOW, devices=devices).xids
    assert isinstance(v, NodeHealth)
    assert 0.0 <= v.risk <= 1.0
    assert 0 <= v.bad_mask < 1 << 8


json_leaf = st.none() | st.booleans() | st.integers(-5, 20) | st.text(max_size=12)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
node_keys = st.sampled_from(
    [
        "metadata",
        "spec",
        "status",
        "labels",
        "annotations",
        "conditions",
        "taints",
        "type",
        "status",
        "unschedulable",
        "key",
        "effect",
        "lastHeartbeatTime",
        "hami.io/device-cordon",
        "name",
    ]
)
structured = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(node_keys, inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None)
@given(
    node=structured | json_value,
    devices=structured,
    cap=st.integers(-2, 16),
    alloc=st.integers(-2, 16),
    now=st.none() | st.floats(0, 2e9),
)
def test_fuzzed_objects_never_raise(
    node: Any, devices: Any, cap: int, alloc: int, now: float | None
) -> None:
    devs = devices if isinstance(devices, list) else ()
    v = assess_node(node, cap, alloc, P, now=now, devices=devs)
    assert (
        xid_signals(node, cap, P, devs) == assess(node, cap, alloc, P, now=now, devices=devs).xids
    )
    assert 0.0 <= v.risk <= 1.0
    assert v.bad_mask >= 0
