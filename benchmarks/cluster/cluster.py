"""A real Kubernetes control plane on loopback: etcd, kube-apiserver and (optionally)
kube-scheduler from binaries the user names, no kubelets and no controller-manager.

:class:`Cluster` starts the processes in a work folder (credentials under ``pki/``, etcd's
data, a log and a pid file per process, the kubeconfig), waits until each answers, and stops
exactly those processes again (by the pids it recorded, checked against the command line,
never by name). It reads the version from ``kube-apiserver --version`` and picks the flags
that version needs (:mod:`benchmarks.cluster.flags`).

Departures from a full cluster: no ServiceAccount admission (nothing would create the
``default`` ServiceAccount), no endpoint reconciler (a loopback advertise address is not a
valid Endpoints address), etcd without fsync. Nodes are API objects
(:mod:`benchmarks.cluster.nodes`), pods are bound but never run; a deleted bound pod stays
Terminating unless something force-deletes it (:mod:`benchmarks.cluster.claims`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import yaml

from benchmarks.cluster.flags import PlaneFlags, Version, parse_version, plane_flags
from benchmarks.cluster.pki import Pki, make_pki, write_kubeconfig

log = logging.getLogger(__name__)

BINARIES = ("etcd", "kube-apiserver")
PROCESS_ORDER = ("etcd", "kube-apiserver", "kube-scheduler", "claim-controller")
"""Start order; :func:`stop_recorded` stops in reverse."""


class ClusterError(RuntimeError):
    """The plane could not be brought up (a binary missing, a port busy, a process that
    exited or did not answer in time; the message carries its log's tail)."""


@dataclass(frozen=True, slots=True)
class Ports:
    """Loopback ports of one plane."""

    api: int = 16443
    etcd: int = 23790
    etcd_peer: int = 23800
    scheduler: int = 10259


def binary_version(binary: Path) -> str:
    """The version ``binary --version`` prints (``Kubernetes v1.36.2`` -> ``v1.36.2``), or
    "" when it cannot tell."""
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    parts = out.split()
    return parts[1] if len(parts) > 1 and parts[0] == "Kubernetes" else (parts[-1] if parts else "")


def port_busy(port: int) -> bool:
    """Something listens on 127.0.0.1:``port``."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """Exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def recorded_pid(work: Path, name: str) -> int | None:
    """The pid recorded for ``name`` in ``work/pids`` if that process still runs a command
    line naming ``name``'s program and ``work`` (a recycled pid is never taken for it)."""
    try:
        pid = int((work / "pids" / f"{name}.pid").read_text().strip())
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, ValueError):
        return None
    program = b"benchmarks.cluster" if name == "claim-controller" else name.encode()
    if program in cmd and str(work).encode() in cmd and _running(pid):
        return pid
    return None


def _stop_pid(pid: int, grace: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.1)
    if _running(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop_recorded(work: Path) -> list[str]:
    """Stop the processes recorded in ``work/pids`` (the scheduler and helpers first, etcd
    last); names stopped. Pid files are removed; unknown or stale ones are left alone."""
    stopped = []
    pids = work / "pids"
    if not pids.is_dir():
        return stopped
    names = [p.stem for p in sorted(pids.glob("*.pid"))]
    rank = {n: i for i, n in enumerate(PROCESS_ORDER)}
    for name in sorted(names, key=lambda n: -rank.get(n, len(rank))):
        pid = recorded_pid(work, name)
        if pid is not None:
            _stop_pid(pid)
            stopped.append(name)
        (pids / f"{name}.pid").unlink(missing_ok=True)
    return stopped


def scheduler_config(
    kubeconfig: str, profiles: Sequence[str] = ("default-scheduler",)
) -> dict[str, Any]:
    """A KubeSchedulerConfiguration with plain ``profiles`` (no extender), no leader election."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": p} for p in profiles],
    }


def apiserver_args(
    work: Path, pki: Pki, ports: Ports, flags: PlaneFlags, verbosity: int = 2
) -> list[str]:
    """kube-apiserver's arguments (without the binary).

    The requestheader flags only fill ``kube-system/extension-apiserver-authentication``,
    which kube-scheduler's delegated authentication reads (it logs errors without it); no
    front-proxy client certificate is ever issued.
    """
    return [
        "--etcd-servers", f"http://127.0.0.1:{ports.etcd}",
        "--bind-address", "127.0.0.1",
        "--advertise-address", "127.0.0.1",
        "--secure-port", str(ports.api),
        "--tls-cert-file", str(pki.cert),
        "--tls-private-key-file", str(pki.key),
        "--client-ca-file", str(pki.ca),
        "--requestheader-client-ca-file", str(pki.ca),
        "--requestheader-allowed-names", "topoplace-front-proxy",
        "--requestheader-username-headers", "X-Remote-User",
        "--requestheader-group-headers", "X-Remote-Group",
        "--requestheader-extra-headers-prefix", "X-Remote-Extra-",
        "--token-auth-file", str(pki.tokens),
        "--authorization-mode", "RBAC",
        "--service-account-issuer", "https://kubernetes.default.svc",
        "--service-account-key-file", str(pki.sa_pub),
        "--service-account-signing-key-file", str(pki.sa_key),
        "--service-cluster-ip-range", "10.96.0.0/24",
        "--endpoint-reconciler-type", "none",
        "--disable-admission-plugins", "ServiceAccount",
        "--cert-dir", str(work / "pki"),
        "--profiling=false",
        *flags.apiserver_args(),
        "--v", str(verbosity),
    ]  # fmt: skip


def etcd_args(work: Path, ports: Ports) -> list[str]:
    """etcd's arguments: one member on loopback, data in ``work/etcd-data``, no fsync."""
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    client = f"http://127.0.0.1:{ports.etcd}"
    return [
        "--name", "topoplace",
        "--data-dir", str(work / "etcd-data"),
        "--listen-client-urls", client,
        "--advertise-client-urls", client,
        "--listen-peer-urls", peer,
        "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"topoplace={peer}",
        "--initial-cluster-state", "new",
        "--unsafe-no-fsync",
    ]  # fmt: skip


class Cluster:
    """A loopback control plane in ``work_dir``, as a context manager (:meth:`up` on
    enter, :meth:`down` on exit).

    Args:
        kube_bin: folder with ``etcd`` and ``kube-apiserver`` (and ``kube-scheduler`` when
            ``scheduler`` is not False).
        work_dir: where credentials, data, logs, pid files and the kubeconfig go.
        ports: loopback ports.
        dra: serve ``resource.k8s.io`` (gates and runtime config for 1.32/1.33; DRA is on
            by default from 1.34). Refused below 1.32.
        feature_gates: extra ``Name=bool`` entries for kube-apiserver and kube-scheduler
            (gates the version locks are dropped).
        runtime_config: extra kube-apiserver ``--runtime-config`` entries.
        workloads: serve Kubernetes' own PodGroup API where known (see
            :func:`benchmarks.cluster.flags.plane_flags`).
        scheduler: False: no kube-scheduler (callers run their own); True: one with a plain
            ``default-scheduler`` profile; a mapping: that KubeSchedulerConfiguration (its
            ``clientConnection.kubeconfig`` is filled in).
        claims: run the claim controller stand-in (:mod:`benchmarks.cluster.claims`) as a
            process next to the plane.
        verbosity: ``--v`` of kube-apiserver and kube-scheduler.

    Attributes:
        kubeconfig: path of the admin kubeconfig (once up).
        version: (major, minor) of kube-apiserver.
        release: its full version string (``v1.36.2``).
        flags: the version-dependent flags chosen.
    """

    def __init__(
        self,
        kube_bin: str | Path,
        work_dir: str | Path,
        *,
        ports: Ports = Ports(),
        dra: bool = True,
        feature_gates: Sequence[str] = (),
        runtime_config: Sequence[str] = (),
        scheduler: bool | Mapping[str, Any] = False,
        claims: bool = False,
        workloads: bool = False,
        verbosity: int = 2,
        ready_timeout: float = 180.0,
    ) -> None:
        self.kube_bin = Path(kube_bin).resolve()
        self.work = Path(work_dir).resolve()
        self.ports = ports
        self.dra = dra
        self.feature_gates = tuple(feature_gates)
        self.runtime_config = tuple(runtime_config)
        self.scheduler = scheduler
        self.claims = claims
        self.workloads = workloads
        self.verbosity = verbosity
        self.ready_timeout = ready_timeout
        self.kubeconfig = str(self.work / "kubeconfig")
        self.release = ""
        self.version: Version = (0, 0)
        self.flags = PlaneFlags({}, ())
        self.pki: Pki | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # ---- what callers read ----------------------------------------------------------------

    @property
    def server(self) -> str:
        """The API server's URL."""
        return f"https://127.0.0.1:{self.ports.api}"

    def env(self) -> dict[str, str]:
        """Environment for clients of this plane: ``KUBECONFIG``, ``KUBE_BIN``,
        ``KUBECACHEDIR`` (kubectl caches discovery per host:port: after a plane of another
        version on the same port it would ask for API versions no longer served) and
        ``TOPOPLACE_KUBE_VERSION`` (``v1.36.2``)."""
        return {
            "KUBECONFIG": self.kubeconfig,
            "KUBE_BIN": str(self.kube_bin),
            "KUBECACHEDIR": str(self.work / "kube-cache"),
            "TOPOPLACE_KUBE_VERSION": self.release,
        }

    def api(self) -> Any:
        """A new :class:`benchmarks.live.kubeapi.Api` for this plane (close it after use)."""
        from benchmarks.live.kubeapi import Api

        return Api(self.kubeconfig)

    def pid(self, name: str) -> int | None:
        """The pid of process ``name`` (``etcd``, ``kube-apiserver``, ``kube-scheduler``,
        ``claim-controller``) if it runs."""
        return recorded_pid(self.work, name)

    # ---- up -------------------------------------------------------------------------------

    def _check(self) -> None:
        need = list(BINARIES) + (["kube-scheduler"] if self.scheduler is not False else [])
        missing = [b for b in need if not os.access(self.kube_bin / b, os.X_OK)]
        if missing:
            raise ClusterError(
                f"{self.kube_bin} lacks {', '.join(missing)} (missing or not executable)"
            )
        self.release = binary_version(self.kube_bin / "kube-apiserver")
        try:
            self.version = parse_version(self.release)
        except ValueError:
            raise ClusterError(
                f"cannot tell the version of {self.kube_bin / 'kube-apiserver'} "
                f"(--version said {self.release!r})"
            ) from None
        self.flags = plane_flags(
            self.version,
            dra=self.dra,
            gates=self.feature_gates,
            runtime_config=self.runtime_config,
            workloads=self.workloads,
        )
        ports = [self.ports.etcd, self.ports.etcd_peer, self.ports.api]
        if self.scheduler is not False:
            ports.append(self.ports.scheduler)
        busy = [p for p in ports if port_busy(p)]
        if busy:
            raise ClusterError(f"127.0.0.1 port(s) {busy} already in use (another plane?)")
        if any(recorded_pid(self.work, n) for n in PROCESS_ORDER):
            raise ClusterError(f"{self.work} has a running plane: bring it down first")

    def _start(self, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        logs = self.work / "logs"
        with open(logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.work,
            )
        (self.work / "pids" / f"{name}.pid").write_text(f"{proc.pid}\n")
        self._procs[name] = proc
        log.info("started %s pid %d", name, proc.pid)
        return proc

    def _wait(self, name: str, ready: Any) -> float:
        proc = self._procs[name]
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.ready_timeout:
            if proc.poll() is not None:
                raise ClusterError(
                    f"{name} exited ({proc.returncode}):\n{_tail(self.work / 'logs' / f'{name}.log')}"
                )
            with contextlib.suppress(httpx.HTTPError, OSError):
                if ready():
                    return time.monotonic() - t0
            time.sleep(0.2)
        raise ClusterError(
            f"{name} not ready after {self.ready_timeout:.0f}s:\n"
            f"{_tail(self.work / 'logs' / f'{name}.log')}"
        )

    def up(self) -> str:
        """Start the plane and wait until every process answers; the kubeconfig path.
        Whatever this call started is stopped again when it fails.

        Raises:
            ClusterError: see the class; VersionError: DRA asked of a version < 1.32.
        """
        self._check()
        for d in ("pids", "logs", "etcd-data", "kube-cache"):
            (self.work / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.work / "etcd-data", 0o700)
        try:
            self.pki = make_pki(self.work / "pki")
            write_kubeconfig(Path(self.kubeconfig), self.server, self.pki)
            self._up(self.pki)
        except BaseException:
            self.down()
            raise
        self._write_env()
        return self.kubeconfig

    def _up(self, pki: Pki) -> None:
        p = self.ports
        timings: dict[str, float] = {}
        self._start("etcd", [str(self.kube_bin / "etcd"), *etcd_args(self.work, p)])
        timings["etcd"] = self._wait(
            "etcd",
            lambda: (
                httpx.get(f"http://127.0.0.1:{p.etcd}/health", timeout=2).json().get("health")
                == "true"
            ),
        )
        self._start(
            "kube-apiserver",
            [
                str(self.kube_bin / "kube-apiserver"),
                *apiserver_args(self.work, pki, p, self.flags, self.verbosity),
            ],
        )
        auth = {"Authorization": f"Bearer {pki.token}"}
        ca = ssl.create_default_context(cafile=str(pki.ca))
        timings["kube-apiserver"] = self._wait(
            "kube-apiserver",
            lambda: (
                httpx.get(f"{self.server}/readyz", headers=auth, verify=ca, timeout=2).text.strip()
                == "ok"
            ),
        )
        if self.scheduler is not False:
            cfg = (
                scheduler_config(self.kubeconfig)
                if self.scheduler is True
                else {**dict(self.scheduler), "clientConnection": {"kubeconfig": self.kubeconfig}}
            )
            path = self.work / "scheduler-config.yaml"
            path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            self._start(
                "kube-scheduler",
                [
                    str(self.kube_bin / "kube-scheduler"),
                    "--config", str(path),
                    "--authentication-kubeconfig", self.kubeconfig,
                    "--authorization-kubeconfig", self.kubeconfig,
                    "--bind-address", "127.0.0.1",
                    "--secure-port", str(p.scheduler),
                    *self.flags.scheduler_args(),
                    "--v", str(self.verbosity),
                ],
            )  # fmt: skip
            timings["kube-scheduler"] = self._wait(
                "kube-scheduler",
                lambda: (
                    httpx.get(
                        f"https://127.0.0.1:{p.scheduler}/healthz", verify=False, timeout=2
                    ).text.strip()
                    == "ok"
                ),
            )
        if self.claims:
            self._start(
                "claim-controller",
                [
                    sys.executable, "-m", "benchmarks.cluster", "claims",
                    "--kubeconfig", self.kubeconfig, "--loop", "0.5", "--work", str(self.work),
                ],
            )  # fmt: skip
        (self.work / "timings.txt").write_text(
            "".join(f"{k}_ready_s={v:.2f}\n" for k, v in timings.items())
        )
        log.info(
            "Kubernetes %s up in %s (gates %s, runtime-config %s)",
            self.release,
            self.work,
            self.flags.gates or "defaults",
            ",".join(self.flags.runtime_config) or "defaults",
        )

    def _write_env(self) -> None:
        lines = [f"export {k}={v}\n" for k, v in self.env().items()]
        (self.work / "env.sh").write_text("".join(lines))

    # ---- down -----------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop every process this plane recorded (scheduler first, etcd last) and reap the
        ones this object started; idempotent. Names stopped. The work folder stays."""
        stopped = stop_recorded(self.work)
        for proc in self._procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self._procs.clear()
        return stopped

    def __enter__(self) -> Self:
        self.up()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()
