"""The flags the test cluster picks per Kubernetes version (no binaries needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.cluster.cluster import Ports, apiserver_args, etcd_args
from benchmarks.cluster.flags import (
    DEFAULT_ON,
    LOCKED,
    SINCE,
    PlaneFlags,
    VersionError,
    gate_on,
    parse_gates,
    parse_version,
    plane_flags,
    queueing_hints_off,
    separate_counter_slices,
    slice_api_version,
)
from benchmarks.cluster.pki import Pki

K8S_136 = Path("/root/src-k8s-1.36/pkg/features/kube_features.go")
K8S_133 = Path("/root/src-k8s-1.33/pkg/features/kube_features.go")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("Kubernetes v1.36.2", (1, 36)),
        ("Kubernetes v1.33.0", (1, 33)),
        ("v1.28.7", (1, 28)),
        ("1.36+", (1, 36)),
        ("Kubernetes v1.34.0-rc.1+abc", (1, 34)),
    ],
)
def test_parse_version(text: str, want: tuple[int, int]) -> None:
    assert parse_version(text) == want


def test_parse_version_refuses_text_without_a_version() -> None:
    with pytest.raises(VersionError):
        parse_version("Kubernetes")


def test_parse_gates_later_entries_win_and_bad_ones_are_refused() -> None:
    assert parse_gates(["A=true,B=false", "A=false", ""]) == {"A": False, "B": False}
    with pytest.raises(ValueError, match="Name=true"):
        parse_gates(["A"])
    with pytest.raises(ValueError):
        parse_gates(["A=yes"])


@pytest.mark.parametrize(
    ("version", "extra", "gates", "runtime_config"),
    [
        # 1.33: DRA beta and off; v1beta1 (what its kube-scheduler reads) and v1beta2 served
        (
            (1, 33),
            (),
            {"DynamicResourceAllocation": True},
            ("resource.k8s.io/v1beta1=true", "resource.k8s.io/v1beta2=true"),
        ),
        # 1.33 with device taints: DeviceTaintRules only in v1alpha3
        (
            (1, 33),
            ("DRADeviceTaints=true",),
            {"DynamicResourceAllocation": True, "DRADeviceTaints": True},
            (
                "resource.k8s.io/v1beta1=true",
                "resource.k8s.io/v1beta2=true",
                "resource.k8s.io/v1alpha3=true",
            ),
        ),
        # 1.32: v1beta1 only
        ((1, 32), (), {"DynamicResourceAllocation": True}, ("resource.k8s.io/v1beta1=true",)),
        # 1.34: GA, v1 served by default, nothing to switch on
        ((1, 34), (), {}, ()),
        # 1.36: DRA gate locked; a caller's DynamicResourceAllocation entry is dropped
        ((1, 36), ("DynamicResourceAllocation=true",), {}, ()),
        # 1.36: QueueingHints locked on: =false would stop kube-scheduler from starting
        ((1, 36), ("SchedulerQueueingHints=false",), {}, ()),
        # 1.33: QueueingHints may still be switched off
        (
            (1, 33),
            ("SchedulerQueueingHints=false",),
            {"DynamicResourceAllocation": True, "SchedulerQueueingHints": False},
            ("resource.k8s.io/v1beta1=true", "resource.k8s.io/v1beta2=true"),
        ),
        # 1.36: DeviceTaintRules are served in v1beta2, off by default
        (
            (1, 36),
            ("DRADeviceTaintRules=true",),
            {"DRADeviceTaintRules": True},
            ("resource.k8s.io/v1beta2=true",),
        ),
    ],
)
def test_plane_flags_per_version(
    version: tuple[int, int],
    extra: tuple[str, ...],
    gates: dict[str, bool],
    runtime_config: tuple[str, ...],
) -> None:
    got = plane_flags(version, dra=True, gates=extra)
    assert got.gates == gates
    assert got.runtime_config == runtime_config


def test_without_dra_only_the_callers_entries() -> None:
    got = plane_flags((1, 33), dra=False, gates=("DRAPartitionableDevices=true",))
    assert got == PlaneFlags({"DRAPartitionableDevices": True}, ())


def test_dra_before_1_32_is_refused() -> None:
    with pytest.raises(VersionError, match="1.32"):
        plane_flags((1, 31), dra=True)
    assert plane_flags((1, 31), dra=False).gates == {}


def test_queueing_hints_off_only_where_not_locked() -> None:
    assert queueing_hints_off((1, 33)) == ("--feature-gates", "SchedulerQueueingHints=false")
    assert queueing_hints_off((1, 28)) == ("--feature-gates", "SchedulerQueueingHints=false")
    assert queueing_hints_off((1, 34)) == ()
    assert queueing_hints_off((1, 36)) == ()


def test_gate_on_follows_defaults_locks_and_choices() -> None:
    assert not gate_on((1, 33), "DRAPartitionableDevices", {})
    assert gate_on((1, 33), "DRAPartitionableDevices", {"DRAPartitionableDevices": True})
    assert gate_on((1, 36), "DRAPartitionableDevices", {})
    assert gate_on((1, 36), "SchedulerQueueingHints", {"SchedulerQueueingHints": False})


def test_slices_version_and_counter_layout() -> None:
    assert slice_api_version((1, 33)) == "v1beta1"
    assert slice_api_version((1, 36)) == "v1"
    assert slice_api_version((1, 33), ["v1beta2"]) == "v1beta2"  # what is served wins
    with pytest.raises(VersionError):
        slice_api_version((1, 36), ["v1alpha3"])
    assert not separate_counter_slices((1, 34))
    assert separate_counter_slices((1, 35)) and separate_counter_slices((1, 36))


def test_apiserver_and_etcd_arguments(tmp_path: Path) -> None:
    pki = Pki(*(tmp_path / n for n in ("ca", "crt", "key", "sa", "pub", "tok")), token="t")
    ports = Ports(api=16555, etcd=23111, etcd_peer=23112)
    args = apiserver_args(tmp_path, pki, ports, plane_flags((1, 33), dra=True))
    pairs = dict(zip(args[::2], args[1::2], strict=False))
    assert pairs["--secure-port"] == "16555"
    assert pairs["--etcd-servers"] == "http://127.0.0.1:23111"
    assert pairs["--bind-address"] == "127.0.0.1"
    assert pairs["--service-account-key-file"] == str(tmp_path / "pub")
    assert pairs["--service-account-signing-key-file"] == str(tmp_path / "sa")
    assert args[args.index("--feature-gates") + 1] == "DynamicResourceAllocation=true"
    assert args[args.index("--runtime-config") + 1] == (
        "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"
    )
    assert "--feature-gates" not in apiserver_args(
        tmp_path, pki, ports, plane_flags((1, 36), dra=True)
    )
    e = etcd_args(tmp_path, ports)
    assert e[e.index("--listen-client-urls") + 1] == "http://127.0.0.1:23111"
    assert e[e.index("--initial-cluster") + 1] == "topoplace=http://127.0.0.1:23112"


def _versioned_spec(source: str, gate: str) -> list[tuple[tuple[int, int], bool, bool]]:
    """[(version, default, locked)] of ``gate`` in a kube_features.go."""
    m = re.search(rf"\n\t{gate}: \{{\n(.*?)\n\t\}},", source, re.S)
    assert m, gate
    rows = []
    for line in m.group(1).splitlines():
        v = re.search(r'MustParse\("(\d+)\.(\d+)"\), Default: (true|false)', line)
        if v:
            rows.append(
                (
                    (int(v.group(1)), int(v.group(2))),
                    v.group(3) == "true",
                    "LockToDefault: true" in line,
                )
            )
    return rows


@pytest.mark.skipif(not K8S_136.is_file(), reason="needs the Kubernetes 1.36 source tree")
def test_gate_facts_match_the_kubernetes_1_36_tree() -> None:
    src = K8S_136.read_text()
    for gate, (since, value) in LOCKED.items():
        rows = _versioned_spec(src, gate)
        locked = [(v, d) for v, d, lock in rows if lock]
        assert locked and locked[0] == (since, value), gate
    for gate, since in DEFAULT_ON.items():
        rows = _versioned_spec(src, gate)
        assert min(v for v, d, _ in rows if d) == since, gate


@pytest.mark.skipif(not K8S_133.is_file(), reason="needs the Kubernetes 1.33 source tree")
def test_gate_facts_match_the_kubernetes_1_33_tree() -> None:
    """In 1.33 nothing this harness passes is locked, DRA is off by default, and what
    :func:`gate_on` says of 1.33 is what the tree's newest row for 1.33 says."""
    src = K8S_133.read_text()
    for gate in (*LOCKED, *DEFAULT_ON, "DRADeviceTaints"):
        rows = [r for r in _versioned_spec(src, gate) if r[0] <= (1, 33)]
        assert not any(lock for _, _, lock in rows), gate
        assert gate_on((1, 33), gate, {}) == rows[-1][1], gate


def test_gates_a_version_does_not_know_are_dropped() -> None:
    """kube-apiserver refuses to start with an unknown gate: 1.32 has no DRADeviceTaints."""
    got = plane_flags((1, 32), dra=True, gates=("DRADeviceTaints=true",))
    assert got.gates == {"DynamicResourceAllocation": True}
    assert "resource.k8s.io/v1alpha3=true" not in got.runtime_config


def test_workloads_serve_podgroups_from_1_36_only() -> None:
    got = plane_flags((1, 36), dra=True, workloads=True)
    assert got.gates == {"GenericWorkload": True}
    assert got.runtime_config == ("scheduling.k8s.io/v1alpha2=true",)
    assert plane_flags((1, 33), dra=True, workloads=True) == plane_flags((1, 33), dra=True)


@pytest.mark.skipif(not K8S_136.is_file(), reason="needs the Kubernetes 1.36 source tree")
def test_first_versions_match_the_kubernetes_1_36_tree() -> None:
    src = K8S_136.read_text()
    for gate, since in SINCE.items():
        assert _versioned_spec(src, gate)[0][0] == since, gate
