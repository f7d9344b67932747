"""The chaos runner's pure parts (benchmarks/live/chaos.py): the seeded work stream, the
fault schedule, quantiles and the result table."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from benchmarks.live.chaos import (
    FAULT_KINDS,
    POD_KINDS,
    Driver,
    FaultRecord,
    Job,
    Result,
    Workload,
    fault_schedule,
    parse_args,
    quantile,
    rows,
)
from benchmarks.live.invariants import GANG_PARTLY_BOUND, ApiState, Violation
from scheduler.core.objects import gang_of, pod_gpus


def _gpus(job) -> int:
    return sum(pod_gpus(p) for p in job.pods)


def test_the_stream_is_seeded_and_every_job_fits_its_pool() -> None:
    a = [Workload(5, dra_version="v1").next() for _ in range(1)]
    w1, w2 = Workload(5, dra_version="v1"), Workload(5, dra_version="v1")
    jobs1 = [w1.next() for _ in range(300)]
    jobs2 = [w2.next() for _ in range(300)]
    assert [(j.name, j.kind, j.pods, j.claims) for j in jobs1] == [
        (j.name, j.kind, j.pods, j.claims) for j in jobs2
    ]
    assert a[0].pods == jobs1[0].pods
    w4 = Workload(6, dra_version="v1")
    other = [w4.next().pods for _ in range(300)]
    assert [j.pods for j in jobs1] != other
    kinds = Counter(j.kind for j in jobs1)
    assert set(kinds) == set(POD_KINDS)
    w3 = Workload(5)
    no_dra = Counter(w3.next().kind for _ in range(300))
    assert set(no_dra) == set(POD_KINDS) - {"dra", "dra-gated"}
    for j in jobs1:
        if j.kind.startswith("dra"):
            (pod,), (claim,) = j.pods, j.claims
            spec = pod["spec"]
            assert spec["resourceClaims"] == [
                {"name": "gpus", "resourceClaimName": claim["metadata"]["name"]}
            ]
            assert spec["nodeSelector"] == {"topoplace-chaos": "dra"}
            assert (
                "limits" not in spec["containers"][0]["resources"]
                or not (spec["containers"][0]["resources"]["limits"])
            )
            want = [{"name": "topoplace.io/allocate"}] if j.kind == "dra-gated" else None
            assert spec.get("schedulingGates") == want
            req = claim["spec"]["devices"]["requests"][0]["exactly"]
            assert req["deviceClassName"] == "gpu.nvidia.com" and req["count"] in (1, 2, 4, 8)
            assert claim["apiVersion"] == "resource.k8s.io/v1"
            continue
        assert j.claims == []
        spec = j.pods[0]["spec"]
        assert all(p["spec"]["terminationGracePeriodSeconds"] == 0 for p in j.pods)
        if j.kind.startswith("gang"):
            gang, size = gang_of(j.pods[0])
            assert gang == f"chaos/{j.name}" and size == len(j.pods)
            assert spec["nodeSelector"] == {"topoplace-chaos": "work"}
            limit = 16 if j.kind == "gang-topology" else 32  # a leaf; the 4 work nodes
            assert _gpus(j) <= limit and all(pod_gpus(p) <= 8 for p in j.pods)
            ann = j.pods[0]["metadata"]["annotations"]
            assert (ann.get("topoplace.io/topology-required") == "leaf") == (
                j.kind == "gang-topology"
            )
        elif j.kind == "share":
            assert spec["nodeSelector"] == {"topoplace-chaos": "hami"}
            assert "nvidia.com/gpumem" in spec["containers"][0]["resources"]["limits"]
        else:
            assert 1 <= _gpus(j) <= 8 and "affinity" in spec


def test_fault_schedule_rounds_cover_every_kind() -> None:
    n = len(FAULT_KINDS)
    assert n == 15
    got = fault_schedule(3, FAULT_KINDS, 3 * n + 5)
    assert len(got) == 3 * n + 5 and got == fault_schedule(3, FAULT_KINDS, 3 * n + 5)
    for r in range(3):
        assert sorted(got[r * n : (r + 1) * n]) == sorted(FAULT_KINDS)
    assert got != fault_schedule(4, FAULT_KINDS, 3 * n + 5)
    assert fault_schedule(3, [], 10) == []  # a soak: no faults, and no endless loop


def test_quantile_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert quantile(xs, 0.5) == 50.0 and quantile(xs, 0.99) == 99.0
    assert quantile([3.0], 0.99) == 3.0 and math.isnan(quantile([], 0.5))


def test_table_counts_faults_pods_and_violations() -> None:
    r = Result(seed=9, duration=60.0, settle_bound=120.0)
    r.faults = [
        FaultRecord("tp-kill", "topoplace", 0, 1, recovery=2.0),
        FaultRecord("tp-kill", "topoplace", 5, 6, recovery=4.0),
        FaultRecord("api-kill", "kube-apiserver", 9, 10, recovery=math.nan),
        FaultRecord("node-labels", "", 11, 12, recovery=0.1, note="failed: ApiError(422)"),
    ]
    r.created.update(whole=3, gang=1)
    r.waits = {"whole": [float(i) for i in range(1, 101)], "gang": [1680.0]}
    r.violations = [(1.0, Violation(GANG_PARTLY_BOUND, "chaos/j1", "1/2 bound"))]
    table = {(m, k): (v, p50, p99) for _, m, k, v, p50, p99 in rows(r)}
    assert table[("faults", "tp-kill")] == (2, 2.0, 4.0)
    assert table[("faults", "api-kill")][0] == 1 and math.isnan(table[("faults", "api-kill")][1])
    assert table[("faults", "all")][0] == 3  # the failed injection is not a fault
    assert ("faults", "node-labels") not in table
    assert table[("faults not injected (the injection failed)", "")][0] == 1
    assert table[("jobs created", "whole")][0] == 3
    assert table[("bind wait s (jobs)", "whole")] == (100, 50.0, 99.0)
    assert table[("longest bind wait s", "whole")][0] == 100.0
    assert table[("bind wait s (jobs)", "gang")] == (1, 1680.0, 1680.0)
    assert table[("bind wait s (jobs)", "share")] == (0, "nan", "nan")
    assert table[("violations", GANG_PARTLY_BOUND)][0] == 1
    assert table[("violations", "gpu-held-twice")][0] == 0


def test_a_job_waits_from_its_creation_until_every_pod_is_bound() -> None:
    """The job controller's pass over one API read: a gang with one member bound is still
    waiting; once both are, its wait (creation to that pass) is recorded under its kind,
    once. The Driver is built without a plane: no arrival is due, so it touches none."""
    import argparse
    import time

    d = Driver.__new__(Driver)
    d.args = argparse.Namespace(max_pending=0)
    d.result = Result(seed=1, duration=60.0)
    pods = [{"metadata": {"name": f"g-{i}"}, "spec": {}} for i in range(2)]
    created = time.monotonic() - 40.0
    d.jobs = {"g": Job("g", "gang", pods, lifetime=600.0, created=created)}
    node = {"metadata": {"name": "n1"}}

    def state(bound: int) -> ApiState:
        out = [
            {"metadata": p["metadata"], "spec": {"nodeName": "n1"} if i < bound else {}}
            for i, p in enumerate(pods)
        ]
        return ApiState(nodes=(node,), pods=tuple(out))

    d.tick(state(1), arrivals=False, next_arrival=math.inf)
    assert d.result.waits == {} and d.result.bound["gang"] == 0
    d.tick(state(2), arrivals=False, next_arrival=math.inf)
    (wait,) = d.result.waits["gang"]
    assert 40.0 <= wait < 45.0 and d.result.pods_bound == 2
    d.tick(state(2), arrivals=False, next_arrival=math.inf)
    assert len(d.result.waits["gang"]) == 1


def test_flags_are_checked() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--faults", "tp-kill,meteor"])
    with pytest.raises(SystemExit):
        parse_args(["--nodes", "2"])
    a = parse_args(["--faults", "tp-kill,proxy-drop", "--topoplace-port", "7000"])
    assert a.faults == ["tp-kill", "proxy-drop"] and a.topoplace_port == 7000
    assert a.replicas == 1
    assert parse_args(["--faults", "leader-kill,tp-kill"]).replicas == 2
    with pytest.raises(SystemExit):
        parse_args(["--faults", "leader-kill", "--replicas", "1"])


def test_seeds_combine_into_one_table(tmp_path) -> None:
    """Two seeds' outputs pool: fault counts and recovery quantiles over both, jobs and
    violations summed, each seed's own settle rows kept."""
    from benchmarks.live.chaos import combine, write

    outs = []
    for seed, recs in ((1, (1.0, 3.0)), (2, (2.0, 10.0))):
        r = Result(seed=seed, duration=60.0, settle_bound=120.0)
        r.faults = [FaultRecord("leader-kill", "chaos-a", 0, 1, recovery=x) for x in recs]
        r.faults.append(FaultRecord("api-throttle", "api-proxy", 2, 3, recovery=0.5))
        r.faults.append(FaultRecord("node-labels", "", 4, 5, note="failed: ApiError(422)"))
        r.created.update(dra=seed, share=1)
        if seed == 2:
            r.violations = [(1.0, Violation(GANG_PARTLY_BOUND, "chaos/j1", "1/2 bound"))]
        args = parse_args(["--seed", str(seed), "--faults", "leader-kill,api-throttle"])
        out = tmp_path / f"s{seed}"
        out.mkdir()
        write(out, r, args, "v1.36.2", f"python -m benchmarks.live.chaos --seed {seed}")
        outs.append(out)
    table, commands, conditions = combine(outs)
    got = {(s, m, k): (v, p50, p99) for s, m, k, v, p50, p99 in table}
    assert got[("all", "faults", "leader-kill")] == (4, 2.0, 10.0)
    assert got[("all", "faults", "api-throttle")] == (2, 0.5, 0.5)
    assert got[("all", "faults", "all")][0] == 6
    assert got[("all", "jobs created", "dra")][0] == 3
    assert got[("all", "jobs created", "share")][0] == 2
    assert got[("all", "violations", GANG_PARTLY_BOUND)][0] == 1
    assert {s for s, m, *_ in table if m == "ledger differences"} == {"1", "2"}
    assert commands == [f"python -m benchmarks.live.chaos --seed {s}" for s in (1, 2)]
    assert len(conditions) == 2 and "2 replica(s)" in conditions[0]
