"""The extender's fractional branch end to end (snapshot mode, a recording binder):
decisions, the hand-off annotations in HAMi's / gpushare's exact format, one ledger with
whole GPUs, and the ledger rebuilt from the bound pods alone (a restart)."""

from __future__ import annotations

import re
from typing import Any

import orjson

from benchmarks.clusters import make_node, make_pod
from scheduler.core.fractional import describe_ledger, node_devices
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import build_snapshot
from scheduler.runtime.cache import ClusterCache
from scheduler.server.extender import Extender
from tests.helpers import with_reasons
from tests.sharing.builders import (
    RecordingBinder,
    aliyun_pod,
    gpushare_node,
    hami_node,
    share_pod,
)

HAMI_DEVICES = re.compile(r"^(?:(?:GPU-[A-Za-z0-9-]+,NVIDIA,\d+,\d+:)*;)+$")
NAMES = ["dgx-0", "infer-a", "infer-b", "share-0"]


def _ext() -> tuple[Extender, RecordingBinder, list[dict[str, Any]]]:
    nodes = [
        make_node("dgx-0", 8, "h100"),
        hami_node("infer-a", 4),
        hami_node("infer-b", 2),
        gpushare_node("share-0", 2, 16),
    ]
    binder = RecordingBinder()
    # Every verdict is sent, also beside an offered node (extender.reasons_when_placed).
    cache = ClusterCache.from_objects(nodes, [], with_reasons(SchedParams()))
    return Extender(cache, binder), binder, nodes


def _place(ext: Extender, pod: dict[str, Any], names: list[str] = NAMES) -> tuple[dict, dict]:
    r = orjson.loads(ext.filter_json({"Pod": pod, "NodeNames": names}))
    if not r["NodeNames"]:
        return r, {}
    m = pod["metadata"]
    b = ext.bind(
        {
            "PodName": m["name"],
            "PodNamespace": m["namespace"],
            "PodUID": m["uid"],
            "Node": r["NodeNames"][0],
        }
    )
    return r, b


def test_fractional_pods_get_node_gpu_and_hami_annotations() -> None:
    ext, binder, _ = _ext()
    r, b = _place(ext, share_pod("p0", mem=6000, cores=30))
    assert r["Error"] == "" and r["NodeNames"] == ["infer-a"] and b == {"Error": ""}
    assert r["FailedAndUnresolvableNodes"] == {
        "dgx-0": "node has no GPU-sharing backend for this request",
        "share-0": "node has no GPU-sharing backend for this request",
    }
    _, node, ann = binder.calls[-1]
    assert node == "infer-a"
    assert ann["hami.io/vgpu-devices-allocated"] == "GPU-infer-a-00,NVIDIA,6000,30:;"
    assert ann["hami.io/vgpu-devices-to-allocate"] == ann["hami.io/vgpu-devices-allocated"]
    assert ann["hami.io/vgpu-node"] == "infer-a" and ann["hami.io/bind-phase"] == "allocating"
    assert (
        ann["hami.io/bind-time"].isdigit() and ann["hami.io/vgpu-time"] == ann["hami.io/bind-time"]
    )
    assert "topoplace.io/placement" not in ann
    # topoplace-share: the workload seen so far is 6000 MiB / 30 % shares only. A second one
    # on GPU 0 leaves 3360 MiB no such share fits, but so would the GPU a fresh one opens
    # (every GPU holding them ends that way), so it packs GPU 0 and GPU 1 stays idle; the
    # 9360 MiB / 70 % share fits GPU 0 no more and opens GPU 1.
    _place(ext, share_pod("p1", mem=6000, cores=30))
    assert (
        binder.calls[-1][2]["hami.io/vgpu-devices-allocated"] == "GPU-infer-a-00,NVIDIA,6000,30:;"
    )
    _place(ext, share_pod("p2", mem=9360, cores=70))
    assert (
        binder.calls[-1][2]["hami.io/vgpu-devices-allocated"] == "GPU-infer-a-01,NVIDIA,9360,70:;"
    )
    led = describe_ledger(ext.cache.snapshot().node("infer-a"))  # type: ignore[arg-type]
    assert [(g["memory_used_mib"], g["compute_used_milli"], g["tasks"]) for g in led] == [
        (12000, 600, 2),
        (9360, 700, 1),
        (0, 0, 0),
        (0, 0, 0),
    ]


def test_multi_container_and_multi_device_format() -> None:
    ext, binder, _ = _ext()
    pod = share_pod("p", mem=2000, cores=10, count=2, containers=2)
    pod["spec"]["containers"].reverse()  # the GPU container second: an empty slot first
    _, b = _place(ext, pod)
    assert b == {"Error": ""}
    value = binder.calls[-1][2]["hami.io/vgpu-devices-allocated"]
    assert HAMI_DEVICES.match(value), value
    first, second, tail = value.split(";")
    assert first == "" and tail == "" and second.count(":") == 2
    uuids = [e.split(",")[0] for e in second.split(":") if e]
    assert len(set(uuids)) == 2  # one container's devices are distinct GPUs


def test_whole_gpus_never_take_a_shared_gpu_and_are_handed_to_hami() -> None:
    ext, binder, _ = _ext()
    _place(ext, share_pod("s", mem=1000, cores=10), ["infer-b"])
    r, _ = _place(ext, make_pod("whole2", 2, namespace="infer"), ["infer-b"])
    assert r["NodeNames"] == [] and "infer-b" in r["FailedNodes"]
    r, b = _place(ext, make_pod("whole1", 1, namespace="infer"), ["infer-b"])
    assert r["NodeNames"] == ["infer-b"] and b == {"Error": ""}
    ann = binder.calls[-1][2]
    assert ann["hami.io/vgpu-devices-allocated"] == "GPU-infer-b-01,NVIDIA,15360,100:;"
    assert orjson.loads(ann["topoplace.io/placement"])["gpus"] == [1]
    # now both GPUs are taken: no share fits (one is whole, one is shared with room)
    r, _ = _place(ext, share_pod("s2", mem=15000, cores=10), ["infer-b"])
    assert r["NodeNames"] == [] and r["FailedNodes"] == {
        "infer-b": "not enough free GPU memory or compute on any GPU"
    }


def test_gpushare_handoff() -> None:
    ext, binder, _ = _ext()
    _, b = _place(ext, aliyun_pod("g", 6))
    assert b == {"Error": ""}
    name, node, ann = binder.calls[-1]
    assert node == "share-0"
    assert {k: v for k, v in ann.items() if k != "ALIYUN_COM_GPU_MEM_ASSUME_TIME"} == {
        "ALIYUN_COM_GPU_MEM_IDX": "0",
        "ALIYUN_COM_GPU_MEM_DEV": "16",
        "ALIYUN_COM_GPU_MEM_POD": "6",
        "ALIYUN_COM_GPU_MEM_ASSIGNED": "false",
    }
    assert ann["ALIYUN_COM_GPU_MEM_ASSUME_TIME"].isdigit()


def test_hostile_pod_is_an_error_not_a_crash() -> None:
    ext, _, _ = _ext()
    r = orjson.loads(ext.filter_json({"Pod": share_pod("x", mem="1e99999"), "NodeNames": NAMES}))
    assert r["Error"].startswith("invalid pod:") and r["NodeNames"] is None


def test_restart_rebuilds_the_same_ledger_and_decisions_are_deterministic() -> None:
    ext, binder, nodes = _ext()
    sizes = [(3000, 20), (9000, 50), (1500, 10), (12000, 0), (5000, 30), (7000, 40), (2000, 100)]
    for i, (mem, cores) in enumerate(sizes * 2):
        _place(ext, share_pod(f"p{i}", mem=mem, cores=cores))
    _place(ext, make_pod("whole", 1, namespace="infer"), ["infer-a"])
    snap = ext.cache.snapshot()
    bound = [p.raw for p in snap.pods.values()]
    rebuilt = build_snapshot(nodes, bound, SchedParams())
    for name in ("infer-a", "infer-b"):
        a, b = snap.node(name), rebuilt.node(name)
        assert a is not None and b is not None
        assert (a.share_used, a.used_mask) == (b.share_used, b.used_mask)
        for g in node_devices(a):
            mem, _, _ = a.share_used[g.index] if a.share_used else (0, 0, 0)
            assert mem <= g.memory_mib
    assert {k: p.shares for k, p in snap.pods.items()} == {
        k: p.shares for k, p in rebuilt.pods.items()
    }
    # the same requests on a fresh extender give the same placements
    ext2, binder2, _ = _ext()
    for i, (mem, cores) in enumerate(sizes * 2):
        _place(ext2, share_pod(f"p{i}", mem=mem, cores=cores))
    strip = lambda calls: [(n, node, a["hami.io/vgpu-devices-allocated"]) for n, node, a in calls]  # noqa: E731
    assert strip(binder2.calls) == strip(binder.calls[: len(binder2.calls)])


def test_pods_of_other_schedulers_and_kai_are_counted() -> None:
    nodes = [hami_node("infer-a", 2), make_node("gfd-0", 2, "a100")]
    hami_bound = share_pod(
        "theirs",
        node="infer-a",
        annotations={
            "hami.io/vgpu-devices-allocated": "GPU-infer-a-01,NVIDIA,8000,25:;",
            "hami.io/bind-phase": "success",
        },
    )
    kai = make_pod("kai", 0, namespace="infer", node="gfd-0", annotations={"gpu-fraction": "0.5"})
    snap = build_snapshot(nodes, [hami_bound, kai], SchedParams())
    a = snap.node("infer-a")
    assert a is not None and a.share_used[1] == (8000, 250, 1) and a.used_mask == 0b10
    g = snap.node("gfd-0")
    # half of an 80 GiB A100 (GFD's nvidia.com/gpu.memory), half its compute
    assert g is not None and g.share_used[0] == (40960, 500, 1) and g.used_mask == 0b01
    assert snap.pods["infer/theirs"].gpu_indices_known
    assert not snap.pods["infer/kai"].gpu_indices_known
