"""The live fractional benchmark's objects and offline side (``benchmarks/live/fractional.py``);
its live side needs a control plane and runs by hand (``python -m benchmarks.live.fractional``).
Needs the openb trace in ``../shared/data`` (skipped without it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.live import fractional as frac
from scheduler.core.fractional import hami_devices, resolve, share_request, task_milli
from scheduler.core.params import SchedParams

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"
needs_trace = pytest.mark.skipif(
    not (DATA / "openb_node_list_gpu_node.csv").is_file(),
    reason="needs the openb trace in ../shared/data/alibaba-gpu-v2023",
)


def _uids(nodes: list[dict]) -> list[dict]:
    for n in nodes:
        n["metadata"]["uid"] = "uid-" + n["metadata"]["name"]
    return nodes


@needs_trace
def test_nodes_are_the_trace_nodes_registered_as_hami_does() -> None:
    nodes = frac.node_objects(DATA, 40, "t")
    assert len(nodes) == 40
    for n in nodes:
        devs = hami_devices(n["metadata"]["annotations"][frac.HAMI_REGISTER])
        gpus = len(devs)
        assert gpus >= 1 and [d.index for d in devs] == list(range(gpus))
        assert all(d.split == frac.SPLIT and d.cores == 100 and d.memory_mib > 0 for d in devs)
        assert n["status"]["allocatable"]["nvidia.com/gpu"] == str(gpus * frac.SPLIT)
        model = n["metadata"]["labels"][frac.PRODUCT_LABEL]
        assert devs[0].memory_mib == frac.MEMORY_MIB.get(model, frac.OTHER_MIB)


@needs_trace
def test_workload_stays_within_the_fill_and_asks_hami_for_the_trace_share() -> None:
    work = frac.workload(DATA, "default", 100, 8, 0.5, None)
    asked = sum(t.gpus * t.milli for t in work)
    assert asked <= 0.5 * 100 * 1000 and asked > 0.45 * 100 * 1000
    assert len({t.name for t in work}) == len(work) and work == sorted(work, key=lambda t: t.name)
    assert any(t.milli < 1000 for t in work) and any(t.milli == 1000 for t in work)
    assert len(frac.workload(DATA, "default", 100, 8, 0.5, 7)) == 7
    # Each pod, read as topoplace reads it, asks exactly the task's share of a device.
    (node,) = frac.node_objects(DATA, 1, "t")
    (dev,) = hami_devices(node["metadata"]["annotations"][frac.HAMI_REGISTER])[:1]
    for t in work[:50]:
        req = share_request(frac.pod_object(t), 100, SchedParams().sharing)
        assert req is not None and req.devices == t.gpus
        share = resolve(req.containers[0], dev)
        assert task_milli(share, dev) == -(-t.milli // 10) * 10


def test_shares_and_overcommit_read_from_the_annotations_alone() -> None:
    value = "GPU-a,NVIDIA,4000,30:GPU-b,NVIDIA,1000,10:;"
    assert frac.shares("n", value) == [("GPU-a", 4000, 30), ("GPU-b", 1000, 10)]
    # gpushare: the device plugin's annotations, GPU index, its GiB and the pod's GiB.
    ann = {
        "ALIYUN_COM_GPU_MEM_IDX": "1",
        "ALIYUN_COM_GPU_MEM_DEV": "15",
        "ALIYUN_COM_GPU_MEM_POD": "6",
        "ALIYUN_COM_GPU_MEM_ASSIGNED": "false",
    }
    assert frac.allocation(ann) == "1,15,6"
    assert frac.shares("n", "1,15,6") == [("n/1", 6, 0)]
    gib = {"n/1": {"mem": 15, "core": 100, "count": 1 << 30}}
    assert frac.overcommitted({"p": ("n", "1,15,6"), "q": ("n", "1,15,9")}, gib) == 0
    assert frac.overcommitted({"p": ("n", "1,15,6"), "q": ("n", "1,15,10")}, gib) == 1
    devices = {"GPU-a": {"mem": 16000, "core": 100, "count": 2}}
    ok = {"p1": ("n", "GPU-a,NVIDIA,8000,50:;"), "p2": ("n", "GPU-a,NVIDIA,8000,50:;")}
    assert frac.overcommitted(ok, devices) == 0
    assert frac.overcommitted({**ok, "p3": ("n", "GPU-a,NVIDIA,1,0:;")}, devices) == 1  # count
    assert frac.overcommitted({"p": ("n", "GPU-a,NVIDIA,16001,10:;")}, devices) == 1  # memory
    assert frac.overcommitted({"p": ("n", "GPU-a,NVIDIA,1,101:;")}, devices) == 1  # compute
    assert frac.overcommitted({"p": ("n", "GPU-x,NVIDIA,1,1:;")}, devices) == 1  # unknown GPU


@needs_trace
def test_offline_places_the_sample_without_overcommit_and_deterministically(
    tmp_path: Path,
) -> None:
    nodes = _uids(frac.node_objects(DATA, 30, "t"))
    devices = frac.devices_of(nodes)
    work = frac.workload(DATA, "default", len(devices), 8, 0.85, None)
    policy = frac.policy_file(tmp_path / "policy.yaml")
    want = frac.offline(nodes, work, policy)
    fig = frac.figures(want, work, devices)
    assert fig["bound"] == len(want) >= 0.95 * len(work)
    assert fig["overcommitted_gpus"] == 0
    assert 0.8 <= fig["allocation"] <= 0.85
    assert all(v[1] and v[1].endswith(";") for v in want.values())
    assert frac.offline(_uids(frac.node_objects(DATA, 30, "t")), work, policy) == want


@needs_trace
def test_gpushare_nodes_pods_and_offline_replay(tmp_path: Path) -> None:
    nodes = _uids(frac.node_objects(DATA, 30, "t", "gpushare"))
    devices = frac.devices_of(nodes)
    for n in nodes:
        cap = n["status"]["capacity"]
        gpus = int(cap["aliyun.com/gpu-count"])
        model = n["metadata"]["labels"][frac.PRODUCT_LABEL]
        gib = frac.MEMORY_MIB.get(model, frac.OTHER_MIB) // 1024
        assert int(cap["aliyun.com/gpu-mem"]) == gpus * gib
        assert frac.HAMI_REGISTER not in (n["metadata"].get("annotations") or {})
        assert all(devices[f"{n['metadata']['name']}/{i}"]["mem"] == gib for i in range(gpus))
    work = frac.workload(DATA, "default", len(devices), 1, 0.8, None)
    assert work and all(t.gpus == 1 for t in work)
    for t in work[:30]:
        req = share_request(frac.pod_object(t, backend="gpushare"), 100, SchedParams().sharing)
        assert req is not None and req.form == "gpushare"
        assert req.units == max(1, -(-t.milli * frac.GPUSHARE_TASK_GIB // 1000))
    with pytest.raises(ValueError):
        frac.pod_object(frac.Task("x", 2, 1000), backend="gpushare")
    want = frac.offline(nodes, work, frac.policy_file(tmp_path / "p.yaml"), "gpushare")
    fig = frac.figures(want, work, devices)
    assert fig["bound"] == len(want) >= 0.9 * len(work)
    assert fig["overcommitted_gpus"] == 0
    assert all(v[1].count(",") == 2 for v in want.values())


def test_default_arm_counts_tasks_in_gpu_replicas() -> None:
    from benchmarks.live.fractional import Task, pod_object, replicas

    assert replicas(Task("a", 1, 250)) == 3  # 25 % of a GPU: 2.5 replicas, rounded up
    assert replicas(Task("b", 1, 100)) == 1
    assert replicas(Task("c", 2, 1000)) == 20  # two whole GPUs, 10 replicas each
    pod = pod_object(Task("c", 2, 1000), "default-scheduler", "replicas")
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "20"}


def test_bind_times_come_from_kube_schedulers_log(tmp_path: Any) -> None:
    from benchmarks.live.fractional import NAMESPACE, pods_per_s, scheduler_bind_times

    lines = [
        'I1207 23:59:59.500000   1 schedule_one.go:481] "Successfully bound pod to node" '
        f'pod="{NAMESPACE}/a00000-x" node="n0" evaluatedNodes=3 feasibleNodes=3',
        'I1207 23:59:59.600000   1 schedule_one.go:481] "Successfully bound pod to node" '
        'pod="other/p" node="n0" evaluatedNodes=3 feasibleNodes=3',
        'I1207 23:59:59.700000   1 schedule_one.go:300] "Unable to schedule pod" pod="x/y"',
        'I1208 00:00:00.500000   1 schedule_one.go:481] "Successfully bound pod to node" '
        f'pod="{NAMESPACE}/a00001-y" node="n1" evaluatedNodes=3 feasibleNodes=3',
    ]
    log = tmp_path / "kube-scheduler.log"
    log.write_text("\n".join(lines) + "\n")
    times = scheduler_bind_times(log)
    assert times == [86399.5, 86400.5]  # the other namespace left out; midnight crossed
    assert pods_per_s(times) == 1.0
