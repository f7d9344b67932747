"""The right-sizer's model: values of the OOM bump, policy clamps, the latency guard, the
sharing mode, KV-cache sizing of preallocating servers, no look-ahead and the change bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler.core.rightsize import (
    A100_80GB_MIG,
    KV_CAPACITY,
    KV_USAGE,
    MEMORY,
    OOM_EVENTS,
    REQUESTS_WAITING,
    UTILIZATION,
    GiB,
    Guard,
    MiB,
    Params,
    Policy,
    PolicySet,
    RightsizeError,
    Sample,
    choose_mode,
    policies_from_dict,
    replay,
)

P = Params()


def headroom(c_days: float) -> float:
    """The documented headroom at ``c_days`` of confidence."""
    c = max(c_days, 1e-3)  # the recommender's floor
    return (1 + P.margin) * (1 + 1 / c) ** P.confidence_exponent


def ceil_mib(x: float) -> int:
    return math.ceil(x / MiB) * MiB


def flat(wl: str, start: float, minutes: int, value: float, metric: str = MEMORY) -> list[Sample]:
    return [Sample(start + 60 * i, wl, f"{wl}-0", "main", metric, value) for i in range(minutes)]


def sort(samples: list[Sample]) -> list[Sample]:
    return sorted(samples, key=lambda s: s.timestamp)


def test_first_recommendation_is_peak_times_confidence_headroom() -> None:
    # 1,440 one-minute samples then one at t = 86,400: a day of history, 1,441 samples.
    s = flat("w", 0, 1440, 10 * GiB) + [Sample(86_400, "w", "w-0", "main", MEMORY, 10 * GiB)]
    rows, rec = replay(s)
    first = rows[0]
    assert first.timestamp == 60  # decided from the first sample alone, in force from the next
    c = min(60 / 86_400, 1 / 1440)
    assert first.gpu_memory_limit_bytes == ceil_mib(10 * GiB * headroom(c))
    tgt = rec.target("w", 86_400)
    assert tgt is not None
    c = min(86_400 / 86_400, 1441 / 1440)
    assert tgt.gpu_memory_limit_bytes == ceil_mib(10 * GiB * headroom(c))


def test_usage_at_the_limit_is_an_oom_and_raises_at_once() -> None:
    s = flat("w", 0, 2 * 1440, 10 * GiB)
    t_oom = 2 * 1440 * 60.0
    s += [Sample(t_oom, "w", "w-0", "main", MEMORY, 40 * GiB)]
    s += [Sample(t_oom + 60, "w", "w-0", "main", MEMORY, 10 * GiB)]
    rows, rec = replay(s)
    before = [r for r in rows if r.timestamp <= t_oom][-1]
    assert before.gpu_memory_limit_bytes < 40 * GiB
    bump = [r for r in rows if r.timestamp == t_oom + 60]
    assert len(bump) == 1 and bump[0].oom
    c = min((t_oom + 60) / 86_400, (2 * 1440 + 1) / 1440)
    # the target from the new peak is above 1.2 x the usage, so it wins
    assert bump[0].gpu_memory_limit_bytes == ceil_mib(40 * GiB * headroom(c))
    assert bump[0].gpu_memory_limit_bytes >= 1.2 * 40 * GiB


def test_recorded_oom_bumps_to_1_2_times_the_limit_even_with_no_budget_left() -> None:
    # a policy clamp at 30 GiB keeps the target below the bump, so the bump is what shows
    s = flat("w", 0, 600, 10 * GiB)
    t = 600 * 60.0
    s += [
        Sample(t, "w", "w-0", "main", OOM_EVENTS, 1.0),
        Sample(t + 60, "w", "w-0", "main", MEMORY, 10 * GiB),
    ]
    rows, rec = replay(sort(s))
    st = rec.states["w"]
    lim_before = [r for r in rows if r.timestamp <= t][-1].gpu_memory_limit_bytes
    after = [r for r in rows if r.timestamp == t + 60]
    assert after and after[0].oom
    assert after[0].gpu_memory_limit_bytes == ceil_mib(lim_before * 1.2)
    # exhaust the budget by hand: an OOM still raises
    st.changes.extend([t + 61] * P.max_changes_per_day)
    rec.observe(Sample(t + 120, "w", "w-0", "main", OOM_EVENTS, 1.0))
    r = rec.decide("w", t + 180)
    assert r is not None and r.oom
    assert r.gpu_memory_limit_bytes == ceil_mib(after[0].gpu_memory_limit_bytes * 1.2)


@pytest.mark.parametrize(
    ("policy", "usage", "want_limit", "clamped"),
    [
        ({"min_memory": "20Gi"}, 1 * GiB, 20 * GiB, True),
        ({"max_memory": "8Gi"}, 10 * GiB, 8 * GiB, True),
        ({"gpu_memory": "24Gi", "max_memory": "80Gi"}, 30 * GiB, 24 * GiB, True),
        ({}, 10 * GiB, None, False),
    ],
    ids=["min", "max", "gpu-size", "none"],
)
def test_policy_clamps(
    policy: dict[str, str], usage: float, want_limit: int | None, clamped: bool
) -> None:
    ps = policies_from_dict({"workloads": {"ns/w": policy}})
    rows, rec = replay(flat("ns/w", 0, 120, usage), ps)
    for r in rows:
        pol = ps.for_workload("ns/w")
        assert pol.min_memory_bytes <= r.gpu_memory_limit_bytes <= pol.max_memory_bytes
    last = rows[-1]
    if want_limit is not None:
        assert last.gpu_memory_limit_bytes == want_limit
    assert ("clamped by policy" in last.reason) is clamped


def test_policy_file_most_specific_block_wins() -> None:
    ps = policies_from_dict(
        {
            "default": {"max_tenants_per_gpu": 4},
            "namespaces": {"prod": {"modes": ["exclusive", "mig"], "mig_profiles": "a100-80gb"}},
            "workloads": {"prod/api": {"guard": {"metric": "requests_waiting", "objective": 2}}},
        }
    )
    assert ps.for_workload("other").max_tenants_per_gpu == 4
    assert ps.for_workload("prod/batch").modes == ("exclusive", "mig")
    api = ps.for_workload("prod/api")
    assert api.guard == Guard(REQUESTS_WAITING, 2.0)
    assert api.mig_profiles == A100_80GB_MIG and api.max_tenants_per_gpu == 4


def test_policy_gpu_compute_limit_is_parsed_and_inherited() -> None:
    """The whole GPU by default; a block's value holds for the blocks under it."""
    ps = policies_from_dict(
        {
            "namespaces": {"serving": {"gpu_compute_limit": 0.8}},
            "workloads": {"serving/llm": {"gpu_compute_limit": 1}},
        }
    )
    assert ps.for_workload("other").gpu_compute_limit == 1.0
    assert ps.for_workload("serving/batch").gpu_compute_limit == 0.8
    assert ps.for_workload("serving/llm").gpu_compute_limit == 1.0
    assert isinstance(ps.for_workload("serving/llm").gpu_compute_limit, float)


@pytest.mark.parametrize("value", [0, -0.2, 1.5, "0.8", True, float("nan")])
def test_policy_gpu_compute_limit_outside_0_1_is_refused(value: object) -> None:
    with pytest.raises(
        RightsizeError, match=r"default.gpu_compute_limit: .* not a number in \(0, 1\]"
    ):
        policies_from_dict({"default": {"gpu_compute_limit": value}})
    if not isinstance(value, str):
        with pytest.raises(RightsizeError, match="gpu_compute_limit"):
            Policy(gpu_compute_limit=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        {"default": {"colour": 1}},
        {"default": {"modes": ["turbo"]}},
        {"default": {"min_memory": "9Gi", "max_memory": "8Gi"}},
    ],
)
def test_policy_errors(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        policies_from_dict(bad)


def _shrinking_series(waiting: float) -> list[Sample]:
    """40 GiB for an hour, then 10 GiB for two days (the peak leaves the 24 h horizon)."""
    s = flat("w", 0, 60, 40 * GiB) + flat("w", 3600, 2 * 1440, 10 * GiB)
    s += flat("w", 0, 60 + 2 * 1440, waiting, REQUESTS_WAITING)
    return sort(s)


def test_guard_blocks_shrink() -> None:
    ps = PolicySet(Policy(guard=Guard(REQUESTS_WAITING, 5.0)))
    calm, _ = replay(_shrinking_series(0.0), ps)
    busy, _ = replay(_shrinking_series(9.0), ps)
    first_calm = calm[0].gpu_memory_limit_bytes
    assert (
        min(r.gpu_memory_limit_bytes for r in calm) < 0.5 * first_calm
    )  # it does shrink when calm
    limits = [r.gpu_memory_limit_bytes for r in busy]
    assert limits == sorted(limits)  # never a shrink while the queue breaches
    assert max(limits) >= 40 * GiB
    assert busy[-1].mode == "exclusive" and "latency guard" in busy[-1].reason


@pytest.mark.parametrize(
    ("desc", "policy", "limit_gib", "util_p", "guard", "want"),
    [
        ("low compute: memory-isolated share", Policy(), 10, 0.1, False, "memory-share"),
        ("medium compute: MPS", Policy(), 10, 0.5, False, "mps"),
        ("busy: exclusive", Policy(), 10, 0.8, False, "exclusive"),
        ("more than 90 % of the memory: exclusive", Policy(), 73, 0.1, False, "exclusive"),
        ("half the memory still shares", Policy(), 50, 0.1, False, "memory-share"),
        ("guard breached: exclusive", Policy(), 10, 0.1, True, "exclusive"),
        ("one tenant per GPU", Policy(max_tenants_per_gpu=1), 10, 0.1, False, "exclusive"),
        (
            "MIG: smallest profile with memory and SMs",
            Policy(mig_profiles=A100_80GB_MIG),
            15,
            0.35,
            False,
            "mig:3g.40gb",
        ),
        (
            "MIG: small memory, small compute, guard set",
            Policy(mig_profiles=A100_80GB_MIG, guard=Guard(REQUESTS_WAITING, 1)),
            8,
            0.1,
            False,
            "mig:1g.10gb",
        ),
        ("MIG not offered: MPS", Policy(mig_profiles=()), 15, 0.35, False, "mps"),
        (
            "only time-slicing allowed",
            Policy(modes=("time-slicing",)),
            10,
            0.1,
            False,
            "time-slicing",
        ),
        (
            "busy but exclusive not allowed",
            Policy(modes=("memory-share",)),
            10,
            0.8,
            False,
            "memory-share",
        ),
    ],
    ids=lambda x: x if isinstance(x, str) and " " in x else "",
)
def test_mode_choice(
    desc: str, policy: Policy, limit_gib: int, util_p: float, guard: bool, want: str
) -> None:
    mode, why = choose_mode(policy, limit_gib * GiB, util_p, util_p / 2, guard, False)
    assert mode == want, desc
    assert why


def test_mode_in_replay_follows_utilisation() -> None:
    s = flat("busy", 0, 200, 10 * GiB) + flat("busy", 0, 200, 0.9, UTILIZATION)
    s += flat("idle", 0, 200, 10 * GiB) + flat("idle", 0, 200, 0.02, UTILIZATION)
    rows, rec = replay(sort(s))
    busy, idle = rec.current("busy"), rec.current("idle")
    assert busy is not None and idle is not None
    assert busy.mode == "exclusive" and busy.gpu_compute_ratio == 1.0
    assert idle.mode == "memory-share"
    assert idle.gpu_compute_ratio == 0.05  # p95 0.02 x 1.15, rounded up to 0.05


def test_preallocating_server_is_sized_from_kv_cache_use() -> None:
    n = 2 * 1440
    s = flat("llm", 0, n, 72 * GiB)  # flat: vLLM preallocates its pool
    s += flat("llm", 0, n, 50 * GiB, KV_CAPACITY)
    s += [
        Sample(60 * i, "llm", "llm-0", "main", KV_USAGE, 0.2 if i % 100 == 0 else 0.1)
        for i in range(n)
    ]
    rows, rec = replay(sort(s))
    now = 60.0 * n
    tgt = rec.target("llm", now)
    assert tgt is not None
    c = min((now - 0) / 86_400, n / 1440)
    assert tgt.gpu_memory_limit_bytes == ceil_mib(22 * GiB + 50 * GiB * 0.2 * headroom(c))
    assert tgt.gpu_memory_limit_bytes < 40 * GiB < 72 * GiB  # not the flat used memory
    assert "preallocating" in tgt.reason


def test_preallocating_server_pool_from_policy_weights() -> None:
    ps = PolicySet(Policy(model_weights_bytes=16 * GiB))
    s = flat("llm", 0, 1440, 72 * GiB) + flat("llm", 0, 1440, 0.25, KV_USAGE)
    _, rec = replay(sort(s), ps)
    tgt = rec.target("llm", 1440 * 60.0)
    assert tgt is not None
    c = min(1440 * 60 / 86_400, 1440 / 1440)
    assert tgt.gpu_memory_limit_bytes == ceil_mib(16 * GiB + 56 * GiB * 0.25 * headroom(c))


def _noisy_series(seed: int) -> list[Sample]:
    """Five days; each day memory climbs from 5 GiB by 20 % every two hours (noise on top),
    utilisation random: every step wants a larger limit, more often than the budget allows."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(5 * 1440):
        level = 5.0 * 1.2 ** ((i % 1440) // 120)
        v = max(1.0, level * float(rng.uniform(0.9, 1.0)))
        out.append(Sample(60.0 * i, "w", "w-0", "main", MEMORY, v * GiB))
        out.append(Sample(60.0 * i, "w", "w-0", "main", UTILIZATION, float(rng.uniform(0, 1) ** 3)))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_hysteresis_bounds_changes_per_day(seed: int) -> None:
    rows, _ = replay(_noisy_series(seed))
    times = [r.timestamp for r in rows[1:] if not r.oom]
    most = 0
    for i, t in enumerate(times):
        in_day = [x for x in times[i:] if x < t + 86_400]
        assert len(in_day) <= P.max_changes_per_day, (t, in_day)
        most = max(most, len(in_day))
    assert most == P.max_changes_per_day  # the series wants more: the bound is what holds it


def test_no_look_ahead() -> None:
    base = _noisy_series(4)
    cut = 2.5 * 86_400
    changed = [
        s
        if s.timestamp < cut
        else Sample(
            s.timestamp,
            s.workload,
            s.pod,
            s.container,
            s.metric,
            s.value * (3 if s.metric == MEMORY else 0.1),
        )
        for s in base
    ]
    a, _ = replay(base)
    b, _ = replay(changed)
    head_a = [r for r in a if r.timestamp <= cut]
    head_b = [r for r in b if r.timestamp <= cut]
    assert head_a == head_b and len(head_a) > 1
    assert a != b  # the change after the cut does show


def test_stated_weights_take_no_headroom() -> None:
    s = flat("llm", 0, 1440, 20 * GiB) + [
        Sample(1440 * 60.0, "llm", "llm-0", "main", MEMORY, 22 * GiB)
    ]
    plain, _ = replay(s)
    known, rec = replay(s, PolicySet(Policy(model_weights_bytes=16 * GiB)))
    tgt = rec.target("llm", 1441 * 60.0)
    assert tgt is not None
    c = min(1441 * 60 / 86_400, 1441 / 1440)
    widen = headroom(c) / 1.15
    assert tgt.gpu_memory_limit_bytes == ceil_mib(1.15 * (16 * GiB + (22 - 16) * GiB * widen))
    assert known[0].gpu_memory_limit_bytes < plain[0].gpu_memory_limit_bytes
    # weights above the lowest use seen are not trusted: the floor is the lowest use
    _, rec = replay(s, PolicySet(Policy(model_weights_bytes=30 * GiB)))
    tgt = rec.target("llm", 1441 * 60.0)
    assert tgt is not None
    assert tgt.gpu_memory_limit_bytes == ceil_mib(1.15 * (20 * GiB + (22 - 20) * GiB * widen))
    assert not any(r.oom for r in known)


def test_a_new_pod_gets_the_recommendation_in_force_at_its_first_sample() -> None:
    s = flat("w", 0, 120, 10 * GiB)
    s += [Sample(60.0 * i, "w", "w-new", "main", MEMORY, 50 * GiB) for i in range(100, 102)]
    rows, _ = replay(sort(s))
    first_new = next(r for r in rows if r.pod == "w-new")
    in_force = [r for r in rows if r.pod == "w-0" and r.timestamp <= 6000][-1]
    assert first_new.timestamp == 6000  # its first sample, decided without it
    assert first_new.gpu_memory_limit_bytes == in_force.gpu_memory_limit_bytes
    oom = [r for r in rows if r.timestamp == 6060]
    assert {r.pod for r in oom} == {"w-0", "w-new"} and all(r.oom for r in oom)
