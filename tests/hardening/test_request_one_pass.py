"""The request reader reads GPUs, CPU and memory in one pass over a pod's containers
(``objects._strict_requests``); it must give what reading them one resource at a time
(``objects._strict_resource`` for ``nvidia.com/gpu``, then ``cpu``, then ``memory``, as
``request_from_pod`` did) gives: the same values for a valid pod, and the same ObjectError,
message included, for the same malformed one.

Pods start from the real-shaped fixture pod and get hostile containers: wrong types at
every level, malformed, fractional, huge and negative quantities, values split between
requests and limits, init containers larger than the sum, several errors in one pod (so
which one comes first is checked too).
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.model import GPU_RESOURCE, MAX_NODE_GPUS
from scheduler.core.objects import (
    ObjectError,
    _strict_requests,
    _strict_resource,
    request_from_pod,
)
from scheduler.core.params import SchedParams

RESOURCES = (GPU_RESOURCE, "cpu", "memory")

QUANTITIES = st.one_of(
    st.sampled_from(
        [
            "1",
            "2",
            "8",
            "9",
            "100",
            "0",
            "500m",
            "1.5",
            "1Gi",
            "64Gi",
            "2063562Mi",
            "1e3",
            "1e40",
            "-1",
            "lots",
            "",
            " 2 ",
            "NaN",
            "Infinity",
            "0.001m",
            "9007199254740993",
            "4503599627370496",
        ]
    ),
    st.integers(min_value=-5, max_value=2**60),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.booleans(),
    st.none(),
    st.just([1]),
    st.just({"a": 1}),
)


def _quantities() -> Any:
    return st.dictionaries(
        st.sampled_from(RESOURCES + RESOURCES + ("nvidia.com/gpu.shared",)),
        QUANTITIES,
        max_size=4,
    )


def _hostile() -> Any:
    return st.one_of(st.none(), st.just("x"), st.just(3), st.just([]), st.just([{}]))


CONTAINER = st.one_of(
    st.fixed_dictionaries(
        {"name": st.just("c")},
        optional={
            "resources": st.one_of(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "requests": st.one_of(_quantities(), _hostile()),
                        "limits": st.one_of(_quantities(), _hostile()),
                    },
                ),
                _hostile(),
            )
        },
    ),
    _hostile(),
)


def _containers() -> Any:
    return st.one_of(
        st.lists(CONTAINER, max_size=4), st.lists(CONTAINER, max_size=2).map(tuple), _hostile()
    )


SPEC = st.fixed_dictionaries(
    {}, optional={"containers": _containers(), "initContainers": _containers()}
)


def _one_at_a_time(pod: dict[str, Any]) -> tuple[int, int, int] | str:
    """The readings as ``request_from_pod`` made them before: one pass per resource."""
    try:
        return (
            _strict_resource(pod, GPU_RESOURCE, high=MAX_NODE_GPUS, whole=True),
            _strict_resource(pod, "cpu", scale10=3),
            _strict_resource(pod, "memory"),
        )
    except ObjectError as exc:
        return f"ObjectError: {exc}"


def _one_pass(spec: dict[str, Any]) -> tuple[int, int, int] | str:
    try:
        return _strict_requests(spec)
    except ObjectError as exc:
        return f"ObjectError: {exc}"


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=SPEC)
def test_one_pass_reads_as_one_resource_at_a_time(spec: dict[str, Any]) -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}
    assert _one_pass(spec) == _one_at_a_time(pod)


def test_the_fuzzed_pods_reach_every_outcome() -> None:
    """The comparison above is worth something only if its pods reach valid readings and
    each kind of error; these hand-made ones do, and both readers agree on them."""
    base = {"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}
    cases = {
        "valid": {
            "containers": [base],
            "initContainers": [{"resources": {"limits": {GPU_RESOURCE: "2"}}}],
        },
        "containers not a list": {"containers": {"a": 1}},
        "entry not an object": {"containers": [base, 3]},
        "resources not an object": {"containers": [{"resources": []}]},
        "requests not an object": {"containers": [{"resources": {"requests": "x"}}]},
        "limits not an object": {"containers": [{"resources": {"limits": 7}}]},
        "gpu malformed": {"containers": [{"resources": {"requests": {GPU_RESOURCE: "1.5"}}}]},
        "gpu total": {
            "containers": [{"resources": {"limits": {GPU_RESOURCE: str(MAX_NODE_GPUS)}}}] * 2
        },
        "cpu malformed before a later structure error": {
            "containers": [{"resources": {"requests": {"cpu": "lots"}}}],
            "initContainers": [[]],
        },
        "gpu malformed before a later structure error": {
            "containers": [{"resources": {"limits": {GPU_RESOURCE: "x"}}}, {"resources": 3}]
        },
        "cpu malformed before memory malformed": {
            "containers": [{"resources": {"requests": {"cpu": "x", "memory": "y"}}}]
        },
        "memory malformed": {"containers": [{"resources": {"requests": {"memory": "NaN"}}}]},
        "memory total": {"containers": [{"resources": {"requests": {"memory": "5e15"}}}] * 2},
        "cpu total": {"containers": [{"resources": {"requests": {"cpu": "5e12"}}}] * 2},
    }
    seen = {}
    for what, spec in cases.items():
        pod = {"metadata": {"name": "p"}, "spec": copy.deepcopy(spec)}
        got = _one_pass(pod["spec"])
        assert got == _one_at_a_time(pod), what
        seen[what] = got
    assert seen["valid"] == (2, 1000, 2**30)
    assert seen["containers not a list"] == "ObjectError: spec.containers must be a list"
    assert seen["cpu malformed before a later structure error"] == (
        "ObjectError: spec.initContainers entries must be objects"
    )
    assert seen["gpu malformed before a later structure error"] == (
        f"ObjectError: {GPU_RESOURCE} request: not a number"
    )
    assert seen["cpu malformed before memory malformed"] == (
        "ObjectError: cpu request: not a number"
    )
    assert seen["gpu total"] == (
        f"ObjectError: {GPU_RESOURCE} request: out of range (0..{MAX_NODE_GPUS})"
    )
    assert seen["memory total"].startswith("ObjectError: memory request: out of range")
    assert seen["cpu total"].startswith("ObjectError: cpu request: out of range")


def test_request_from_pod_uses_the_one_pass_reading() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "250m", "memory": "1Gi", GPU_RESOURCE: "1"}}},
                {"resources": {"limits": {"cpu": "1", GPU_RESOURCE: "2"}}},
            ],
            "initContainers": [{"resources": {"requests": {"memory": "3Gi"}}}],
        },
    }
    req = request_from_pod(pod, SchedParams().fabric)
    assert (req.gpus, req.cpu_milli, req.memory_bytes) == (3, 1250, 3 * 2**30)
