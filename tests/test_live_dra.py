"""The live DRA benchmark's offline side and objects (``benchmarks/live/dra.py``); its live
side needs a control plane and runs by hand (``python -m benchmarks.live.dra``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from benchmarks.clusters import node_slices
from benchmarks.live import dra as live_dra

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kube" / "dra-1.33"


def _cluster(n: int) -> tuple[list[dict], list[dict], list[dict]]:
    nodes = live_dra.node_objects(n, "t")
    slices = [
        dict(s, kind="ResourceSlice") for s in node_slices([o["metadata"]["name"] for o in nodes])
    ]
    classes = json.loads((FIXTURES / "deviceclasses.v1beta1.json").read_text())["items"]
    return nodes, slices, [dict(c, kind="DeviceClass") for c in classes]


def test_dra_nodes_advertise_no_device_plugin_gpus() -> None:
    (node,) = live_dra.node_objects(1, "t")
    assert "nvidia.com/gpu" not in node["status"]["capacity"]
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"


def test_claims_have_the_shape_of_their_api_version() -> None:
    old = live_dra.claim_object("c", 4, "v1beta1")["spec"]["devices"]["requests"][0]
    new = live_dra.claim_object("c", 4, "v1beta2")["spec"]["devices"]["requests"][0]
    assert (old["count"], old["deviceClassName"]) == (4, "gpu.nvidia.com")
    assert (new["exactly"]["count"], new["exactly"]["deviceClassName"]) == (4, "gpu.nvidia.com")


def test_offline_replay_packs_the_claims_pod_after_pod_without_sharing_a_device() -> None:
    """1, 2, 4, 8 GPUs in turn (12 pods, 45 GPUs) on eight nodes: every pod placed, with as
    many devices as its claim asks, no device twice, on six nodes (45 GPUs need six;
    topoplace packs) and the 8-GPU claims on nodes of their own."""
    nodes, slices, classes = _cluster(8)
    work = live_dra.workload(12)
    got = live_dra.offline(nodes, slices, classes, "v1beta2", work)
    assert sorted(got) == [p for p, _, _ in work]
    taken = [(node, d) for node, devs in got.values() for d in devs]
    assert len(taken) == len(set(taken)) == 45
    for pod, _, size in work:
        assert len(got[pod][1]) == size
    per_node = Counter(node for node, _ in taken)
    assert len(per_node) == 6 and max(per_node.values()) == 8
    eights = [got[p][0] for p, _, size in work if size == 8]
    assert all(per_node[n] == 8 and sum(1 for v in got.values() if v[0] == n) == 1 for n in eights)


def test_gated_pods_carry_the_allocate_gate_and_the_others_none() -> None:
    gated = live_dra.pod_object("p", "c", "topoplace", gated=True)
    plain = live_dra.pod_object("p", "c", "topoplace")
    assert gated["spec"]["schedulingGates"] == [{"name": "topoplace.io/allocate"}]
    assert "schedulingGates" not in plain["spec"]
    assert gated["spec"]["resourceClaims"] == plain["spec"]["resourceClaims"]
    assert live_dra.ARMS["gated"] == live_dra.ARMS["topoplace"] == "topoplace"


def test_percentile_is_nearest_rank() -> None:
    ms = [float(v) for v in range(1, 201)]  # 1..200
    assert live_dra.percentile(ms, 50) == 100.0
    assert live_dra.percentile(ms, 99) == 198.0
    assert live_dra.percentile(ms, 100) == 200.0
    assert live_dra.percentile([7.0], 99) == 7.0
    assert live_dra.percentile([], 50) != live_dra.percentile([], 50)  # nan


def test_bind_ms_from_the_create_call_to_the_first_nodename_seen() -> None:
    created = {"a": 10.0, "b": 10.2, "c": 10.4}
    bound = {"a": 10.05, "b": 12.7, "x": 11.0}  # c never bound, x not ours
    got = live_dra.bind_ms(created, bound)
    assert sorted(got) == ["a", "b"]
    assert abs(got["a"] - 50.0) < 1e-6 and abs(got["b"] - 2500.0) < 1e-6


def test_bind_watch_keeps_the_first_sight_of_the_gate_gone_and_of_the_node() -> None:
    watch = live_dra.BindWatch(api=None)  # type: ignore[arg-type]  # on_event needs no API
    gated = live_dra.pod_object("g", "c", "topoplace", gated=True)
    watch.on_event("ADDED", gated, 1.0)
    assert watch.ungated == {} and watch.bound == {}
    ungated = dict(gated, spec={**gated["spec"], "schedulingGates": []})
    watch.on_event("MODIFIED", ungated, 3.0)
    watch.on_event("MODIFIED", ungated, 3.5)
    bound = dict(ungated, spec={**ungated["spec"], "nodeName": "dra-00001"})
    watch.on_event("MODIFIED", bound, 3.2)
    watch.on_event("MODIFIED", bound, 4.0)
    watch.on_event("DELETED", bound, 9.0)
    assert watch.ungated == {"g": 3.0} and watch.bound == {"g": 3.2}
    plain = live_dra.pod_object("p", "c", "topoplace")
    watch.on_event("ADDED", plain, 5.0)
    assert watch.ungated["p"] == 5.0 and "p" not in watch.bound


def _rows() -> list[dict]:
    """Recorded per-pod samples of two runs of two arms (ms)."""
    ungated = [[40.0 + i for i in range(100)], [45.0 + i for i in range(100)]]
    gated = [[2400.0 + 2 * i for i in range(100)], [2500.0 + 2 * i for i in range(100)]]
    rows = []
    for arm, runs in (("topoplace", ungated), ("gated", gated)):
        for run, ms in enumerate(runs, 1):
            rows.append(
                {"arm": arm, "run": run, "bind_samples": ms, **live_dra.latency_figures(ms)}
            )
    return rows


def test_gated_overhead_pools_the_runs_and_subtracts_the_ungated_arm() -> None:
    got = live_dra.gated_overhead(_rows())
    # ungated pooled: 40..139 and 45..144; 200 samples, rank 100 is 92, rank 198 is 142
    assert got["topoplace"]["pods"] == 200
    assert (got["topoplace"]["bind_p50_ms"], got["topoplace"]["bind_p99_ms"]) == (92.0, 142.0)
    # gated pooled: 2400..2598 and 2500..2698 by 2; rank 100 is 2548, rank 198 is 2694
    assert (got["gated"]["bind_p50_ms"], got["gated"]["bind_p99_ms"]) == (2548.0, 2694.0)
    diff = got["gated minus ungated"]
    assert (diff["bind_p50_ms"], diff["bind_p99_ms"]) == (2456.0, 2552.0)
    assert "gated minus ungated" not in live_dra.gated_overhead(_rows()[:2])


def test_summary_and_csv_carry_the_time_to_bind(tmp_path: Path) -> None:
    rows = _rows()
    for r in rows:
        r.update(
            bound=100,
            pods_per_s=5.0,
            nodes_used=60,
            whole_nodes_free=440,
            placed_as_offline=100,
            placed={},
            **{f"{v}_{k}": 1.0 for v in ("filter", "prioritize") for k in ("mean_ms", "p99_ms")},
            ungate_p50_ms=float("nan"),
            ungate_p99_ms=float("nan"),
            ungate_to_bind_p50_ms=float("nan"),
            ungate_to_bind_p99_ms=float("nan"),
        )
    args = live_dra.parse_args(
        ["--out", str(tmp_path), "--kube-bin", "/x", "--pace", "5", "--pods", "100"]
    )
    live_dra.write(tmp_path, args, "v1", rows, 100, 60)
    summary = (tmp_path / "summary.md").read_text()
    assert "created one by one at 5 pods/s" in summary
    assert "| gated | 200 | 2548 | 2694 | 2698 |" in summary
    assert "| topoplace | 200 | 92 | 142 | 144 |" in summary
    assert "| gated minus ungated |  | 2456 | 2552 |  |" in summary
    with open(tmp_path / "runs.csv") as f:
        header = f.readline().strip().split(",")
    assert header[-7:-5] == ["bind_p50_ms", "bind_p99_ms"]
