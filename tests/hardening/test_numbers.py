"""Issue 12, finding 1: every number read from an object is parsed with bounded cost, and
anything malformed or out of range is a clear refusal for that pod (an ObjectError), never
another exception and never a stall.

Before the fix ``topoplace.io/gang-size: "1e1000000"`` took over a minute (a Decimal with
a million-digit exponent, converted to int), ``"NaN"`` / ``"Infinity"`` raised ValueError /
OverflowError ("internal error" at the edge) and sizes above 2**63 were accepted.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from scheduler.core.health import HealthParams, assess, parse_time
from scheduler.core.model import MAX_GANG_SIZE
from scheduler.core.objects import ObjectError, request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.quantity import (
    REASON_NOT_A_QUANTITY,
    REASON_NOT_WHOLE,
    REASON_OUT_OF_RANGE,
    REASON_TOO_LONG,
    QuantityError,
    cpu_milli,
    parse_quantity_int,
    quantity_int,
)
from scheduler.core.snapshot import build_snapshot
from tests.builders import make_node, make_pod
from tests.hardening.objects import GPU, gpu_pod, member, set_path

P = SchedParams()
FABRIC = P.fabric
BUDGET_S = 0.05
"""Per-object time bound (generous: a parse costs microseconds)."""


def short(v: Any) -> str:
    """A short test id for a hostile value (``repr`` of a 5000-digit int raises)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"int<{v.bit_length()} bits>"
    r = repr(v) if not isinstance(v, dict) else "kw"
    return r if len(r) <= 24 else r[:21] + "..."


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t0 = time.thread_time()
    try:
        out: Any = fn(*args)
    except Exception as exc:  # the row says which exception is expected
        out = exc
    return out, time.thread_time() - t0


# ---- the parser ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kw", "expect"),
    [
        ("500m", {}, 1),
        ("500m", {"scale10": 3}, 500),
        ("1.5", {}, 2),
        ("512Gi", {}, 512 * 2**30),
        ("1e3", {}, 1000),
        ("1E3", {}, 1000),
        ("2k", {}, 2000),
        ("1E", {"high": 10**18}, 10**18),
        (" 3 ", {}, 3),
        ("+4", {}, 4),
        (8, {}, 8),
        (0.5, {}, 1),
        ("0e9999999", {}, 0),
        ("1e-1000000", {}, 1),
        ("1e1000000", {}, REASON_OUT_OF_RANGE),
        ("1e300000", {}, REASON_OUT_OF_RANGE),
        ("9" * 64, {}, REASON_OUT_OF_RANGE),
        ("9" * 65, {}, REASON_TOO_LONG),
        (2**64, {}, REASON_OUT_OF_RANGE),
        (10**5000, {}, REASON_OUT_OF_RANGE),
        (-1, {}, REASON_OUT_OF_RANGE),
        ("-1", {}, REASON_OUT_OF_RANGE),
        ("NaN", {}, REASON_NOT_A_QUANTITY),
        ("Infinity", {}, REASON_NOT_A_QUANTITY),
        ("-inf", {}, REASON_NOT_A_QUANTITY),
        (float("nan"), {}, REASON_NOT_A_QUANTITY),
        (float("inf"), {}, REASON_NOT_A_QUANTITY),
        (True, {}, REASON_NOT_A_QUANTITY),
        (None, {}, REASON_NOT_A_QUANTITY),
        ([1], {}, REASON_NOT_A_QUANTITY),
        ("²", {}, REASON_NOT_A_QUANTITY),
        ("٣", {}, REASON_NOT_A_QUANTITY),
        ("1e", {}, REASON_NOT_A_QUANTITY),
        ("", {}, REASON_NOT_A_QUANTITY),
        ("2.5", {"whole": True}, REASON_NOT_WHOLE),
        ("500m", {"whole": True}, REASON_NOT_WHOLE),
        ("1e-1000000", {"whole": True}, REASON_NOT_WHOLE),
        ("63", {"high": 62}, REASON_OUT_OF_RANGE),
    ],
    ids=short,
)
def test_parse_quantity_int_is_bounded_and_exact(
    value: Any, kw: dict[str, Any], expect: Any
) -> None:
    out, took = timed(lambda: parse_quantity_int(value, **kw))
    assert took < BUDGET_S
    if isinstance(expect, str):
        assert isinstance(out, QuantityError) and out.reason == expect
    else:
        assert out == expect


def test_lenient_readers_default_instead_of_raising() -> None:
    for bad in ("NaN", "Infinity", "1e1000000", str(2**64), "-1", [1], {"a": 1}):
        assert quantity_int(bad, 7) == 7
        assert cpu_milli(bad, 3) == 3


# ---- pods: every number is a clear refusal ------------------------------------------------


def _gpu_request(value: Any) -> dict[str, Any]:
    return gpu_pod(gpus=value)


def _cpu_request(value: Any) -> dict[str, Any]:
    return set_path(make_pod("p", 1), "spec.containers.0.resources.requests.cpu", value)


def _memory_request(value: Any) -> dict[str, Any]:
    return set_path(make_pod("p", 1), "spec.containers.0.resources.requests.memory", value)


def _priority(value: Any) -> dict[str, Any]:
    return set_path(make_pod("p", 1), "spec.priority", value)


@pytest.mark.parametrize(
    ("pod", "match"),
    [
        (member("w-0", "1e1000000"), "gang-size: out of range"),
        (member("w-0", "NaN"), "gang-size: not a number"),
        (member("w-0", "Infinity"), "gang-size: not a number"),
        (member("w-0", str(2**63)), "gang-size: out of range"),
        (member("w-0", str(2**64 + 1)), "gang-size: out of range"),
        (member("w-0", str(MAX_GANG_SIZE + 1)), "gang-size: out of range"),
        (member("w-0", "-2"), "gang-size: out of range"),
        (member("w-0", "2.5"), "gang-size: not a whole number"),
        (member("w-0", 4), "must map strings to strings"),
        (_gpu_request("1e300000"), f"{GPU} request: out of range"),
        (_gpu_request("1e1000000"), f"{GPU} request: out of range"),
        (_gpu_request("NaN"), f"{GPU} request: not a number"),
        (_gpu_request("80"), f"{GPU} request: out of range \\(0..62\\)"),
        (_gpu_request("0.5"), f"{GPU} request: not a whole number"),
        (_gpu_request(float("inf")), f"{GPU} request: not a number"),
        (_cpu_request("1e300000"), "cpu request: out of range"),
        (_cpu_request("NaN"), "cpu request: not a number"),
        (_memory_request("Infinity"), "memory request: not a number"),
        (_memory_request("1e30"), "memory request: out of range"),
        (_priority("high"), "spec.priority: not a number"),
        (_priority(2**40), "spec.priority: out of range"),
        (_priority(float("nan")), "spec.priority: not a number"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_hostile_numbers_in_a_pod_are_a_clear_refusal(pod: dict[str, Any], match: str) -> None:
    out, took = timed(request_from_pod, pod, FABRIC)
    assert took < BUDGET_S, f"took {took:.3f}s"
    assert isinstance(out, ObjectError), out
    with pytest.raises(ObjectError, match=match):
        request_from_pod(pod, FABRIC)


def test_well_formed_numbers_still_read() -> None:
    r = request_from_pod(member("w-0", "16", gpus=8), FABRIC)
    assert (r.gang_size, r.gpus, r.cpu_milli, r.memory_bytes) == (16, 8, 8000, 64 * 2**30)
    assert request_from_pod(member("w-0", "", gpus=8), FABRIC).gang_size == 0
    assert request_from_pod(gpu_pod(gpus=62), FABRIC).gpus == 62
    assert request_from_pod(_priority(2**31 - 1), FABRIC).priority == 2**31 - 1


# ---- bound pods and nodes: never an exception, never a stall -------------------------------


@pytest.mark.parametrize(
    "value", ["NaN", "Infinity", "1e1000000", str(2**64), [1], "-3"], ids=short
)
def test_hostile_numbers_in_bound_pods_do_not_break_the_build(value: Any) -> None:
    pod = set_path(
        make_pod("bound", 2, node="n0"), f"spec.containers.0.resources.requests.[{GPU}]", value
    )
    pod = set_path(pod, "spec.containers.0.resources.requests.cpu", value)
    snap, took = timed(build_snapshot, [make_node("n0", 8)], [pod], P)
    assert took < 1.0
    assert not isinstance(snap, Exception), snap
    assert "default/bound" in snap.pods
    assert snap.pods["default/bound"].cpu_milli == 0


def test_health_numbers_are_bounded() -> None:
    assert parse_time(10**400) is None
    assert parse_time(float("nan")) is None
    assert parse_time("9" * 100_000) is None
    assert parse_time("2026-11-29T20:00:00Z") == 1795982400.0
    node = make_node("n0", 8)
    node["metadata"]["annotations"]["hami.io/device-cordon"] = "²," + "9" * 5000 + ",1"
    node["metadata"]["annotations"]["topoplace.io/gpu-uuids"] = ",".join(
        f"GPU-{i}" for i in range(50_000)
    )
    node["status"]["conditions"][0]["lastHeartbeatTime"] = 10**400
    rep, took = timed(lambda: assess(node, 8, 8, HealthParams(), now=1.8e9))
    assert took < BUDGET_S * 4
    assert rep.node.bad_mask & 0b10  # "1" resolved; the unreadable entries remove 2 more
    assert bin(rep.node.bad_mask).count("1") == 3
    # A count label "²" (str.isdigit is True, int() raises) and a 5000-digit one.
    for label in ("²", "1" * 5000):
        odd = make_node("n1", 8)
        odd["metadata"]["labels"]["nvidia.com/gpu.count"] = label
        snap = build_snapshot([odd], [], P)
        assert not snap.nodes[0].unmodeled and snap.nodes[0].gpu_capacity == 8
