"""The test cluster's process handling without Kubernetes binaries: what it refuses before
starting anything, and stopping exactly the processes it recorded."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.cluster.__main__ import main as cli
from benchmarks.cluster.cluster import (
    Cluster,
    ClusterError,
    Ports,
    binary_version,
    recorded_pid,
    scheduler_config,
    stop_recorded,
)
from benchmarks.cluster.flags import VersionError


def _fake_bin(folder: Path, version: str) -> Path:
    """A folder whose etcd and kube-apiserver only print a version."""
    folder.mkdir()
    for b in ("etcd", "kube-apiserver"):
        p = folder / b
        p.write_text(f"#!/bin/sh\necho 'Kubernetes {version}'\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ports() -> Ports:
    return Ports(
        api=_free_port(), etcd=_free_port(), etcd_peer=_free_port(), scheduler=_free_port()
    )


def test_missing_binaries_are_named(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="lacks etcd, kube-apiserver "):
        Cluster(tmp_path, tmp_path / "w", ports=_ports()).up()
    kb = _fake_bin(tmp_path / "bin", "v1.36.2")
    with pytest.raises(ClusterError, match="lacks kube-scheduler "):
        Cluster(kb, tmp_path / "w", ports=_ports(), scheduler=True).up()


def test_version_is_read_and_dra_refused_before_1_32(tmp_path: Path) -> None:
    kb = _fake_bin(tmp_path / "bin", "v1.31.4")
    assert binary_version(kb / "kube-apiserver") == "v1.31.4"
    with pytest.raises(VersionError, match="1.32"):
        Cluster(kb, tmp_path / "w", ports=_ports(), dra=True).up()
    assert not (tmp_path / "w" / "pids").exists()  # nothing was started


def test_a_busy_port_is_refused(tmp_path: Path) -> None:
    kb = _fake_bin(tmp_path / "bin", "v1.36.2")
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        ports = Ports(api=port, etcd=_free_port(), etcd_peer=_free_port())
        with pytest.raises(ClusterError, match=str(port)):
            Cluster(kb, tmp_path / "w", ports=ports).up()


def test_etcd_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    kb = _fake_bin(tmp_path / "bin", "v1.36.2")
    (kb / "etcd").write_text("#!/bin/sh\necho 'etcd: no space left'; exit 3\n")
    c = Cluster(kb, tmp_path / "w", ports=_ports(), ready_timeout=20)
    with pytest.raises(ClusterError, match="(?s)etcd exited.*no space left"):
        c.up()
    assert c.version == (1, 36) and c.release == "v1.36.2"
    assert list((tmp_path / "w" / "pids").glob("*.pid")) == []


def _sleeper(work: Path, name: str) -> subprocess.Popen[bytes]:
    """A process whose command line names ``name`` and ``work``, recorded as up does."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", name, str(work)],
        start_new_session=True,
    )
    (work / "pids").mkdir(parents=True, exist_ok=True)
    (work / "pids" / f"{name}.pid").write_text(f"{proc.pid}\n")
    return proc


def test_down_stops_what_was_recorded_and_leaves_other_processes(tmp_path: Path) -> None:
    work = tmp_path / "w"
    etcd = _sleeper(work, "etcd")
    api = _sleeper(work, "kube-apiserver")
    other = _sleeper(tmp_path / "elsewhere", "etcd")  # another plane's etcd
    # a pid file naming a process that is not what it says (this test's own pid)
    (work / "pids" / "kube-scheduler.pid").write_text(f"{os.getpid()}\n")
    try:
        assert recorded_pid(work, "etcd") == etcd.pid
        assert recorded_pid(work, "kube-scheduler") is None
        assert recorded_pid(work, "claim-controller") is None
        assert stop_recorded(work) == ["kube-apiserver", "etcd"]  # etcd last
        assert etcd.wait(10) is not None and api.wait(10) is not None
        assert other.poll() is None
        assert list((work / "pids").glob("*.pid")) == []
        assert cli(["down", str(work), "--purge"]) == 0
        assert not work.exists()
    finally:
        for p in (etcd, api, other):
            p.kill()
            p.wait(10)


def test_env_and_scheduler_configuration(tmp_path: Path) -> None:
    c = Cluster(tmp_path / "bin", tmp_path / "w", ports=Ports(api=16999))
    c.release = "v1.33.0"
    env = c.env()
    assert env["KUBECONFIG"] == str((tmp_path / "w" / "kubeconfig").resolve())
    assert env["KUBECACHEDIR"].endswith("kube-cache")
    assert env["TOPOPLACE_KUBE_VERSION"] == "v1.33.0"
    assert c.server == "https://127.0.0.1:16999"
    cfg = scheduler_config("/k", ("default-scheduler", "other"))
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["default-scheduler", "other"]
    assert "extenders" not in cfg


def test_down_of_a_folder_without_a_plane_is_harmless(tmp_path: Path) -> None:
    t0 = time.monotonic()
    assert cli(["down", str(tmp_path / "none")]) == 0
    assert time.monotonic() - t0 < 5
