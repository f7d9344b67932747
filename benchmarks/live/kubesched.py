"""The scheduler configuration topoplace ships, rendered for a loopback run, and the two
processes of a live run: ``kube-scheduler`` with that configuration and ``topoplace serve``.

:func:`render_shipped_config` reads ``config/deploy/scheduler-config.yaml`` (a ConfigMap
whose ``data["scheduler-config.yaml"]`` is the KubeSchedulerConfiguration; plain HTTP to
``127.0.0.1``, as shipped) or a variant of it (:data:`TRANSPORT_CONFIGS`: ``mtls`` is the
component ``config/deploy/mtls``'s) **at call time** and changes only what a loopback run
must change:

* ``clientConnection.kubeconfig`` (other clientConnection keys, e.g. ``qps``/``burst``,
  are kept as shipped; none are added);
* ``leaderElection.leaderElect: false`` (the other leaderElection keys are kept);
* the topoplace extender's ``urlPrefix``;
* when that extender talks TLS (an ``https`` ``urlPrefix`` or a ``tlsConfig``), the files of
  its ``tlsConfig`` (``caFile``, ``certFile``, ``keyFile``: the run's own, made by
  ``topoplace certs``, see :func:`make_certs`) and the ``https`` scheme;
* optionally the profile's ``schedulerName``.

Everything else (profiles, pluginConfig, plugin weights, percentageOfNodesToScore,
extender weight, nodeCacheCapable, managedResources, timeouts...) is passed through.

:func:`render_default_config` writes the comparison arm's configuration: one plain
profile (kube-scheduler's default plugins, no extender) under its own name, with
``percentageOfNodesToScore`` 100 or unset (adaptive) and the API client limits topoplace's
shipped configuration sets (``clientConnection`` qps 500 / burst 1000).

Processes are started and stopped by pid only (SIGTERM, then SIGKILL), with logs in the
run's work directory. :func:`cpu_seconds` reads a process's user + system CPU time from
``/proc/<pid>/stat``.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = REPO / "config" / "deploy" / "scheduler-config.yaml"
MTLS_CONFIG = REPO / "config" / "deploy" / "mtls" / "scheduler-config-mtls.yaml"
TRANSPORT_CONFIGS = {"plain": SHIPPED_CONFIG, "mtls": MTLS_CONFIG}
"""Scheduler configuration per extender transport: ``plain`` is the base of config/deploy
(http to the sidecar on the pod's loopback), ``mtls`` the component config/deploy/mtls
(https, tlsConfig with client certificates)."""
CONFIG_KEY = "scheduler-config.yaml"
DEFAULT_KUBE_BIN = Path(os.environ.get("KUBE_BIN") or Path.home() / "kube-bin")


class ConfigError(ValueError):
    """The shipped configuration does not have the shape a loopback run needs."""


def load_shipped(path: str | Path | None = None) -> dict[str, Any]:
    """The KubeSchedulerConfiguration inside the shipped ConfigMap (read now, not cached).

    Raises:
        ConfigError: not a ConfigMap with ``data["scheduler-config.yaml"]`` holding a
            KubeSchedulerConfiguration.
    """
    p = Path(path) if path is not None else SHIPPED_CONFIG
    docs = [d for d in yaml.safe_load_all(p.read_text()) if d]
    for doc in docs:
        if doc.get("kind") == "KubeSchedulerConfiguration":
            return doc
        if doc.get("kind") == "ConfigMap" and CONFIG_KEY in (doc.get("data") or {}):
            cfg = yaml.safe_load(doc["data"][CONFIG_KEY])
            if not isinstance(cfg, dict) or cfg.get("kind") != "KubeSchedulerConfiguration":
                raise ConfigError(f"{p}: data[{CONFIG_KEY!r}] is not a KubeSchedulerConfiguration")
            return cfg
    raise ConfigError(f"{p}: no ConfigMap with data[{CONFIG_KEY!r}]")


def profile_names(cfg: Mapping[str, Any]) -> list[str]:
    """schedulerName of every profile (``default-scheduler`` when none are listed)."""
    profiles = cfg.get("profiles") or [{}]
    return [str(p.get("schedulerName") or "default-scheduler") for p in profiles]


def _topoplace_extender(extenders: list[dict[str, Any]]) -> dict[str, Any]:
    """The extender entry topoplace serves: the only one, or the one on loopback with
    ``/scheduler`` (the sidecar)."""
    if len(extenders) == 1:
        return extenders[0]
    local = [
        e
        for e in extenders
        if urlsplit(str(e.get("urlPrefix", ""))).hostname in ("127.0.0.1", "localhost")
    ]
    if len(local) == 1:
        return local[0]
    raise ConfigError(f"cannot tell which of {len(extenders)} extenders is topoplace")


TLS_FILES = {"caFile": "ca.crt", "certFile": "client.crt", "keyFile": "client.key"}
"""kube-scheduler's side of the extender's mTLS: tlsConfig key -> file ``topoplace certs``
writes."""


def extender_uses_tls(cfg: Mapping[str, Any]) -> bool:
    """Whether the topoplace extender of ``cfg`` is reached over TLS."""
    ext = _topoplace_extender(list(cfg.get("extenders") or []))
    return str(ext.get("urlPrefix", "")).startswith("https://") or bool(ext.get("tlsConfig"))


def extender_transport(cfg: Mapping[str, Any]) -> str:
    """``"mtls"`` when the topoplace extender of ``cfg`` presents a client certificate over
    https, ``"tls"`` for https without one, ``"plain"`` for http (the key of
    :data:`TRANSPORT_CONFIGS` that ``cfg`` matches, or ``"tls"``)."""
    if not extender_uses_tls(cfg):
        return "plain"
    ext = _topoplace_extender(list(cfg.get("extenders") or []))
    tls = ext.get("tlsConfig") or {}
    client = (tls.get("certFile") or tls.get("certData")) and (
        tls.get("keyFile") or tls.get("keyData")
    )
    return "mtls" if client else "tls"


def make_certs(out: str | Path, source: str | Path | None = None) -> Path:
    """A CA and the server/client key pairs for kube-scheduler <-> topoplace mTLS, written
    to ``out`` by ``topoplace certs`` of ``source`` (default: this repository)."""
    out = Path(out)
    src = Path(source) if source is not None else REPO
    subprocess.run(
        [sys.executable, "-m", "scheduler.cli.main", "certs", "--out", str(out), "--force"],
        cwd=src,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            x for x in (str(src), os.environ.get("PYTHONPATH")) if x
        )},
        check=True,
        capture_output=True,
    )  # fmt: skip
    return out


def render_config(
    cfg: Mapping[str, Any],
    kubeconfig: str | Path,
    extender_url: str,
    scheduler_name: str | None = None,
    tls_dir: str | Path | None = None,
) -> dict[str, Any]:
    """A copy of ``cfg`` set up for a loopback run (see the module docstring).

    Raises:
        ConfigError: the extender talks TLS and no ``tls_dir`` is given.
    """
    out = copy.deepcopy(dict(cfg))
    conn = dict(out.get("clientConnection") or {})
    conn["kubeconfig"] = str(kubeconfig)
    out["clientConnection"] = conn
    le = dict(out.get("leaderElection") or {})
    le["leaderElect"] = False
    out["leaderElection"] = le
    extenders = out.get("extenders") or []
    if not extenders:
        raise ConfigError("the shipped configuration has no extender")
    ext = _topoplace_extender(extenders)
    if extender_uses_tls(out):
        if tls_dir is None:
            raise ConfigError("the shipped extender talks TLS: a loopback run needs tls_dir")
        extender_url = "https://" + extender_url.split("://", 1)[-1]
        tls = dict(ext.get("tlsConfig") or {})
        for key, name in TLS_FILES.items():
            tls[key] = str(Path(tls_dir) / name)
        ext["tlsConfig"] = tls
    ext["urlPrefix"] = extender_url
    if scheduler_name is not None:
        profiles = out.get("profiles") or []
        if len(profiles) != 1:
            raise ConfigError(f"renaming needs exactly one profile, found {len(profiles)}")
        profiles[0]["schedulerName"] = scheduler_name
    return out


def render_shipped_config(
    kubeconfig: str | Path,
    extender_url: str,
    scheduler_name: str | None = None,
    path: str | Path | None = None,
    tls_dir: str | Path | None = None,
) -> str:
    """The shipped KubeSchedulerConfiguration as YAML text for a loopback run.

    Args:
        kubeconfig: written to ``clientConnection.kubeconfig``.
        extender_url: the topoplace extender's ``urlPrefix``, e.g.
            ``http://127.0.0.1:8890/scheduler``.
        scheduler_name: rename the (single) profile; None keeps the shipped name.
        path: another file of the same shape (default: the shipped one).
        tls_dir: the files of :func:`make_certs`, when the extender talks TLS.
    """
    cfg = render_config(load_shipped(path), kubeconfig, extender_url, scheduler_name, tls_dir)
    return yaml.safe_dump(cfg, sort_keys=False)


def render_default_config(
    kubeconfig: str | Path,
    scheduler_name: str = "default-scheduler",
    *,
    percentage_of_nodes_to_score: int | None = 100,
    qps: float | None = 500,
    burst: int | None = 1000,
) -> dict[str, Any]:
    """A KubeSchedulerConfiguration with one plain profile named ``scheduler_name``
    (kube-scheduler's default plugins and scoring), no extender, leader election off.

    Args:
        percentage_of_nodes_to_score: written as is; None leaves it unset (kube-scheduler's
            adaptive default: 50 % minus nodes/125, at least 5 %, once 100 nodes are feasible).
        qps, burst: ``clientConnection`` limits (None: client-go's default, 50 / 100).
    """
    conn: dict[str, Any] = {"kubeconfig": str(kubeconfig)}
    if qps is not None:
        conn["qps"] = qps
    if burst is not None:
        conn["burst"] = burst
    cfg: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": conn,
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": scheduler_name}],
    }
    if percentage_of_nodes_to_score is not None:
        cfg["percentageOfNodesToScore"] = percentage_of_nodes_to_score
    return cfg


# ---- processes ------------------------------------------------------------------------------


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing accepts connections on ``host:port``."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) != 0


def pin(pid: int, cpus: frozenset[int] | None) -> int:
    """Confine every thread of process ``pid`` to ``cpus`` (``sched_setaffinity``; threads
    it starts later inherit the mask); None leaves it alone. Returns how many threads were
    pinned (threads that exit meanwhile are skipped)."""
    if not cpus:
        return 0
    done = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)
            done += 1
    return done


def _stop(proc: subprocess.Popen[bytes] | None, grace: float = 10.0) -> None:
    """SIGTERM the process we started (by pid), SIGKILL after ``grace`` seconds, reap."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _tail(path: Path, n: int = 40) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``); NaN when
    it cannot be read."""
    if pid is None:
        return math.nan
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return math.nan
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole host from ``/proc/stat`` (busy = all but idle and
    iowait): the share of the machine in use between two readings is d(busy) / d(total)."""
    try:
        parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return (math.nan, math.nan)
    vals = [int(x) for x in parts[:8]]
    total = float(sum(vals))
    return (total - vals[3] - vals[4], total)


def binary_version(binary: str | Path) -> str:
    """``vX.Y.Z`` from ``binary --version`` ("" when it cannot tell)."""
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    parts = out.split()
    return parts[-1] if parts else ""


class KubeScheduler:
    """``kube-scheduler`` with the shipped configuration (or ``config``: a
    KubeSchedulerConfiguration used as given, e.g. :func:`render_default_config`), as a
    context manager.

    Writes the rendered configuration to ``workdir/kube-scheduler-<port>.yaml``, logs to
    ``workdir/kube-scheduler-<port>.log``, waits for ``https://127.0.0.1:<port>/healthz``
    (and ``/readyz``, informers synced, where served; self-signed, not verified) and stops
    the process on exit.
    """

    def __init__(
        self,
        kubeconfig: str | Path,
        extender_url: str,
        workdir: str | Path,
        *,
        port: int = 11259,
        kube_bin: str | Path | None = None,
        scheduler_name: str | None = None,
        config_path: str | Path | None = None,
        verbosity: int = 2,
        ready_timeout: float = 120.0,
        extra_args: tuple[str, ...] = (),
        config: Mapping[str, Any] | None = None,
        tls_dir: str | Path | None = None,
    ) -> None:
        self.extra_args = tuple(extra_args)
        self.tls_dir = tls_dir
        self.explicit_config = copy.deepcopy(dict(config)) if config is not None else None
        self.kubeconfig = str(kubeconfig)
        self.extender_url = extender_url
        self.workdir = Path(workdir)
        self.port = port
        self.binary = Path(kube_bin or DEFAULT_KUBE_BIN) / "kube-scheduler"
        self.scheduler_name = scheduler_name
        self.config_path = config_path
        self.verbosity = verbosity
        self.ready_timeout = ready_timeout
        self.config_file = self.workdir / f"kube-scheduler-{port}.yaml"
        self.log_file = self.workdir / f"kube-scheduler-{port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.config: dict[str, Any] = {}
        self.cpus: frozenset[int] | None = None
        """CPUs to confine the process to (``--pin-cpus``; None: wherever the host runs it);
        Go's ``GOMAXPROCS`` is set to their number."""

    @property
    def profiles(self) -> list[str]:
        """schedulerName of the rendered profiles."""
        return profile_names(self.config)

    def start(self) -> float:
        """Start and wait until healthy; seconds it took."""
        if not self.binary.is_file():
            raise FileNotFoundError(f"{self.binary} not found (set KUBE_BIN)")
        if not port_free(self.port):
            raise RuntimeError(f"127.0.0.1:{self.port} is busy")
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.explicit_config is not None:
            text = yaml.safe_dump(self.explicit_config, sort_keys=False)
        else:
            text = render_shipped_config(
                self.kubeconfig,
                self.extender_url,
                self.scheduler_name,
                self.config_path,
                self.tls_dir,
            )
        self.config = yaml.safe_load(text)
        self.config_file.write_text(text)
        t0 = time.monotonic()
        with open(self.log_file, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    str(self.binary),
                    "--config",
                    str(self.config_file),
                    "--authentication-kubeconfig",
                    self.kubeconfig,
                    "--authorization-kubeconfig",
                    self.kubeconfig,
                    "--bind-address",
                    "127.0.0.1",
                    "--secure-port",
                    str(self.port),
                    "--v",
                    str(self.verbosity),
                    *self.extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "GOMAXPROCS": str(len(self.cpus))} if self.cpus else None,
            )
        pin(self.proc.pid, self.cpus)
        base = f"https://127.0.0.1:{self.port}"
        while time.monotonic() - t0 < self.ready_timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kube-scheduler exited early:\n{_tail(self.log_file)}")
            with contextlib.suppress(httpx.HTTPError):
                # /healthz, then /readyz where served (informers synced; 1.27+)
                if httpx.get(base + "/healthz", verify=False, timeout=2).text.strip() == "ok":
                    r = httpx.get(base + "/readyz", verify=False, timeout=2)
                    if r.status_code == 404 or r.text.strip() == "ok":
                        pin(self.proc.pid, self.cpus)  # threads started before the first pin
                        return time.monotonic() - t0
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"kube-scheduler not healthy:\n{_tail(self.log_file)}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL; idempotent."""
        _stop(self.proc)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Topoplace:
    """``topoplace serve --kubeconfig`` as a subprocess (by pid), as a context manager.

    ``source`` runs the ``scheduler`` package of another checkout (an A/B of two
    versions; default: this repository)."""

    def __init__(
        self,
        kubeconfig: str | Path,
        workdir: str | Path,
        *,
        port: int = 8890,
        policy: str | Path | None = None,
        log_level: str = "INFO",
        ready_timeout: float = 120.0,
        source: str | Path | None = None,
        tls_dir: str | Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kubeconfig = str(kubeconfig)
        self.env = dict(env or {})
        """Extra environment of the process (``TOPOPLACE_*`` settings)."""
        self.workdir = Path(workdir)
        self.port = port
        self.tls_dir = Path(tls_dir) if tls_dir is not None else None
        self.policy = policy
        self.source = Path(source) if source is not None else REPO
        self.log_level = log_level
        self.ready_timeout = ready_timeout
        self.url = f"{'https' if tls_dir is not None else 'http'}://127.0.0.1:{port}"
        self.extender_url = f"{self.url}/scheduler"
        self._client_args: dict[str, Any] = {}
        if self.tls_dir is not None:  # every port of topoplace then asks for a client cert
            ctx = ssl.create_default_context(cafile=str(self.tls_dir / "ca.crt"))
            ctx.load_cert_chain(self.tls_dir / "client.crt", self.tls_dir / "client.key")
            self._client_args = {"verify": ctx}
        self.log_file = self.workdir / f"topoplace-{port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.cpus: frozenset[int] | None = None
        """CPUs to confine the process to (``--pin-cpus``; None: wherever the host runs it)."""

    def start(self) -> float:
        """Start and wait until ``/readyz`` is 200; seconds it took."""
        if not port_free(self.port):
            raise RuntimeError(f"127.0.0.1:{self.port} is busy; another extender is running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "scheduler.cli.main", "--log-level", self.log_level]
        cmd += ["serve", "--kubeconfig", self.kubeconfig, "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port)]
        if self.policy:
            cmd += ["--config", str(self.policy)]
        if self.tls_dir is not None:
            cmd += ["--tls-cert", str(self.tls_dir / "server.crt")]
            cmd += ["--tls-key", str(self.tls_dir / "server.key")]
            cmd += ["--tls-client-ca", str(self.tls_dir / "ca.crt")]
        t0 = time.monotonic()
        with open(self.log_file, "wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.source,
                env={
                    **os.environ,
                    **self.env,
                    "PYTHONPATH": os.pathsep.join(
                        x for x in (str(self.source), os.environ.get("PYTHONPATH")) if x
                    ),
                },
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        pin(self.proc.pid, self.cpus)
        while time.monotonic() - t0 < self.ready_timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"topoplace exited early:\n{_tail(self.log_file)}")
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(self.url + "/readyz", timeout=2, **self._client_args)
                if r.status_code == 200:
                    pin(self.proc.pid, self.cpus)  # threads started before the first pin
                    return time.monotonic() - t0
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"topoplace not ready:\n{_tail(self.log_file)}")

    def get(self, path: str, timeout: float = 30) -> Any:
        """GET a JSON endpoint (``/v1/inspect/nodes``...)."""
        r = httpx.get(self.url + path, timeout=timeout, **self._client_args)
        r.raise_for_status()
        return r.json()

    def metrics(self) -> str:
        """The Prometheus text of ``/metrics``."""
        return httpx.get(self.url + "/metrics", timeout=30, **self._client_args).text

    def stop(self) -> None:
        """SIGTERM (topoplace drains in-flight binds), then SIGKILL; idempotent."""
        _stop(self.proc, grace=40.0)

    @property
    def client_args(self) -> Mapping[str, Any]:
        """httpx keyword arguments for a client of this process (its TLS context, if any)."""
        return self._client_args

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        return _tail(self.log_file, n)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
