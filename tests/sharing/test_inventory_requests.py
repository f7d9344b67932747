"""Inventory from what nodes publish, and fractional requests in the forms clusters use.

Hostile values are refused with ShareError / an unmodeled node, never a crash."""

from __future__ import annotations

import orjson
import pytest

from scheduler.core.fractional import (
    BACKEND_GPUSHARE,
    BACKEND_HAMI,
    FORM_KAI,
    HAMI_REGISTER,
    ContainerAsk,
    ShareError,
    hami_devices,
    kai_request,
    share_request,
)
from scheduler.core.health import REASON_UNMODELED
from scheduler.core.params import SchedParams, SharingParams
from scheduler.core.snapshot import build_snapshot
from tests.sharing.builders import aliyun_pod, gpushare_node, hami_node, register, share_pod


def test_hami_json_register_reads_omitempty_fields() -> None:
    devs = hami_devices(register("n", 4, 15360, unhealthy=[2]))
    assert [d.index for d in devs] == [0, 1, 2, 3]  # index 0 left out by omitempty
    assert devs[0].uuid == "GPU-n-00" and devs[3].uuid == "GPU-n-03"
    assert [d.healthy for d in devs] == [True, True, False, True]  # no "health" = false
    assert {d.memory_mib for d in devs} == {15360}
    assert devs[0].split == 10 and devs[0].cores == 100 and devs[3].numa == 1


def test_hami_text_register_both_lengths() -> None:
    text = "GPU-a,10,32768,100,NVIDIA-A30,0,true:GPU-b,10,32768,100,NVIDIA-A30,1,false,1,hami-core:"
    devs = hami_devices(text)
    assert [(d.index, d.uuid, d.memory_mib, d.numa, d.healthy) for d in devs] == [
        (0, "GPU-a", 32768, 0, True),
        (1, "GPU-b", 32768, 1, False),
    ]


@pytest.mark.parametrize(
    "value",
    [
        "",
        "[]",
        "{}",
        "[1, 2]",
        '[{"id": "x", "devmem": "NaN", "health": true}]',
        '[{"id": "x", "devmem": 1e400, "health": true}]',
        '[{"id": "x", "devmem": -5, "health": true}]',
        '[{"id": "x", "devmem": 99999999999999, "health": true}]',
        '[{"id": "x", "devmem": 1000, "health": "yes"}]',
        '[{"id": 7, "devmem": 1000, "health": true}]',
        "GPU-a,10,1e999999999,100,T4,0,true:",
        "GPU-a,10,32768,100,T4,0,maybe:",
        "GPU-a,10,32768:",
        "[" + ",".join(['{"id":"x","devmem":1,"health":true}'] * 63) + "]",
        "x" * 70000,
    ],
)
def test_hostile_registers_are_refused(value: str) -> None:
    with pytest.raises(ShareError):
        hami_devices(value)


def test_hami_node_counts_physical_gpus_and_excludes_unhealthy_ones() -> None:
    # 4 GPUs split 10 ways: nvidia.com/gpu says 40, the register says 4.
    snap = build_snapshot([hami_node("infer-0", 4, unhealthy=[1])], [], SchedParams())
    n = snap.nodes[0]
    assert n.gpu_capacity == 4 and n.sharing == BACKEND_HAMI and not n.unmodeled
    assert n.health.bad_mask == 0b10


def test_malformed_register_makes_an_unmodeled_node_not_a_crash() -> None:
    node = hami_node("infer-0", 2)
    node["metadata"]["annotations"][HAMI_REGISTER] = '[{"id": "x", "devmem": "lots"}]'
    snap = build_snapshot([node, hami_node("infer-1", 2)], [], SchedParams())
    bad, good = snap.nodes
    assert bad.unmodeled and bad.health.reasons == (REASON_UNMODELED,)
    assert good.gpu_capacity == 2 and good.sharing == BACKEND_HAMI


def test_gpushare_and_gfd_inventory() -> None:
    snap = build_snapshot([gpushare_node("share-0", 2, 16)], [], SchedParams())
    n = snap.nodes[0]
    assert n.sharing == BACKEND_GPUSHARE
    assert [d.memory_mib for d in n.devices] == [16384, 16384]
    mib = SchedParams(sharing=SharingParams(gpushare_memory_unit_mib=1))
    assert (
        build_snapshot([gpushare_node("share-0", 2, 16)], [], mib).nodes[0].devices[0].memory_mib
        == 16
    )
    off = build_snapshot(
        [gpushare_node("share-0", 2, 16)],
        [],
        SchedParams(sharing=SharingParams(backends=("hami",))),
    ).nodes[0]
    assert off.sharing == "" and off.devices  # counted, not handed off


def test_backend_label_overrides() -> None:
    node = hami_node("infer-0", 2, labels={"topoplace.io/gpu-sharing": "none"})
    assert build_snapshot([node], [], SchedParams()).nodes[0].sharing == ""


def test_hami_request_forms() -> None:
    r = share_request(share_pod("p", mem=4000, cores=30, count=2), 2000)
    assert r is not None and r.form == BACKEND_HAMI and r.cpu_milli == 2000
    assert r.containers == (ContainerAsk(2, 4000, 0, 30),)
    r = share_request(share_pod("p", mem=None, cores=None, percent=25))
    assert r is not None and r.containers == (ContainerAsk(1, 0, 25, 0),)
    # only gpucores: HAMi's default memory is the whole device
    r = share_request(share_pod("p", mem=None, cores=50))
    assert r is not None and r.containers == (ContainerAsk(1, 0, 100, 50),)
    # no count: HAMi's webhook default of one device
    r = share_request(share_pod("p", mem=2000, cores=None, count=None, containers=2))
    assert r is not None and r.containers == (ContainerAsk(1, 2000, 0, 0), ContainerAsk(0))
    ann = {"nvidia.com/use-gputype": "A100,H100", "nvidia.com/nouse-gpuuuid": "GPU-x"}
    r = share_request(share_pod("p", annotations=ann))
    assert r is not None and r.use_types == ("A100", "H100") and r.nouse_uuids == ("GPU-x",)
    assert share_request(share_pod("p", mem=None, cores=None)) is None  # a whole-GPU pod


def test_gpushare_request() -> None:
    r = share_request(aliyun_pod("p", 4), 0, SharingParams())
    assert r is not None and r.form == BACKEND_GPUSHARE and r.units == 4
    assert r.containers[0].memory_mib == 4096
    pod = aliyun_pod("p", 4)
    pod["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-count"] = "2"
    with pytest.raises(ShareError, match="one GPU"):
        share_request(pod)


@pytest.mark.parametrize(
    "kw",
    [
        {"mem": "1e400"},
        {"mem": "-4000"},
        {"mem": "4Gi"},  # 4 Gi "MiB": out of range
        {"mem": "NaN"},
        {"mem": "4000.5"},
        {"cores": "101"},
        {"cores": "x" * 100},
        {"percent": "250"},
        {"count": "99"},
        {"count": "1.5"},
    ],
)
def test_hostile_requests_are_refused(kw: dict) -> None:
    with pytest.raises(ShareError):
        share_request(share_pod("p", **kw))


def test_kai_accounting_request() -> None:
    pod = share_pod("k", mem=None, cores=None, count=None, annotations={"gpu-fraction": "0.5"})
    r = kai_request(pod)
    assert r is not None and r.form == FORM_KAI and r.containers == (ContainerAsk(1, 0, 50, 50),)
    pod["metadata"]["annotations"] = {"gpu-memory": "8000", "gpu-fraction-num-devices": "2"}
    r = kai_request(pod)
    assert r is not None and r.containers == (ContainerAsk(2, 8000, 0, 0),)
    pod["metadata"]["annotations"] = {"gpu-fraction": "1e400"}
    assert kai_request(pod) is None  # lenient: an admitted pod's junk counts as absent


def test_register_json_is_what_hami_marshals() -> None:
    # The builder's register mirrors MarshalNodeDevices field names exactly.
    item = orjson.loads(register("n", 2))[1]
    assert set(item) == {
        "id",
        "index",
        "count",
        "devmem",
        "devcore",
        "type",
        "numa",
        "mode",
        "health",
    }
