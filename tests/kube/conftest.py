"""Fixtures of the live integration suite (marker ``kube``).

Runs only when ``KUBECONFIG`` is set **and** the suite was asked for (``-m kube`` or
``TOPOPLACE_KUBE_TESTS=1``), and refuses an API server that is not on loopback unless
``TOPOPLACE_KUBE_ALLOW_REMOTE=1``: the tests create Nodes.

Expected: a control plane from ``../shared/controlplane/up.sh`` (etcd, kube-apiserver,
kube-scheduler v1.28.7 with the extender profile). Knobs:

* ``KUBE_BIN``: a folder with kube-scheduler; the suite then runs its own kube-scheduler
  with the configuration topoplace ships (``config/deploy/scheduler-config.yaml``, profile
  ``topoplace``, port ``TOPOPLACE_KUBE_SCHED_PORT``, default 10269) and every test goes
  through it (start up.sh with ``EXTENDER_URL=none``). ``TOPOPLACE_KUBE_SHIPPED=0`` opts out.
  As shipped, kube-scheduler reaches topoplace over plain HTTP on loopback; the mTLS variant
  (the component ``config/deploy/mtls``) is run end to end by ``test_mtls.py``, with its own
  topoplace and kube-schedulers;
* ``SCHEDULER_NAME`` (default ``topology-gpu``): the extender-backed profile of up.sh's
  scheduler, used without ``KUBE_BIN``;
* ``TOPOPLACE_KUBE_PORT`` (default 8888): where topoplace listens; must match the
  control plane's ``EXTENDER_URL``.

Every other port the suite opens is derived from these two unless set, so two suites with
different ``TOPOPLACE_KUBE_PORT`` / ``TOPOPLACE_KUBE_SCHED_PORT`` can run on one host:
kube-schedulers at ``TOPOPLACE_KUBE_SCHED_PORT`` + 1 (DRA), + 2 and + 3 (mTLS), + 11 and + 12
(failover); topoplace processes at ``TOPOPLACE_KUBE_PORT`` + 3
(``TOPOPLACE_KUBE_MTLS_PORT``), + 9983 and + 9984 (``TOPOPLACE_KUBE_HA_PORT_A`` / ``_B``:
18871 / 18872 with the default port).

Example::

    W=/root/cp-x; bash ../shared/controlplane/up.sh $W
    KUBECONFIG=$W/kubeconfig pytest tests/kube -m kube -q
    bash ../shared/controlplane/down.sh $W
"""

from __future__ import annotations

import contextlib
import datetime
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
NODE_LABEL = "topoplace-it"
NOT_READY_TAINTS = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


def _wanted(config: pytest.Config) -> bool:
    expr = config.getoption("-m") or ""
    return (
        "kube" in expr and "not kube" not in expr or os.environ.get("TOPOPLACE_KUBE_TESTS") == "1"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    skip = None
    if not os.environ.get("KUBECONFIG"):
        skip = pytest.mark.skip(reason="live Kubernetes suite: KUBECONFIG is not set")
    elif not _wanted(config):
        skip = pytest.mark.skip(reason="live Kubernetes suite: run with -m kube")
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.kube)
            if skip is not None:
                item.add_marker(skip)


# ---- API ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kubeconfig() -> str:
    return os.environ["KUBECONFIG"].split(os.pathsep)[0]


@pytest.fixture(scope="session")
def core(kubeconfig: str) -> Any:
    from kubernetes import client

    from scheduler.kube.client import load_api_client

    api = load_api_client(kubeconfig)
    host = urlsplit(api.configuration.host).hostname
    if host not in ("127.0.0.1", "localhost", "::1") and not os.environ.get(
        "TOPOPLACE_KUBE_ALLOW_REMOTE"
    ):
        pytest.skip(f"API server {host} is not on loopback (set TOPOPLACE_KUBE_ALLOW_REMOTE=1)")
    return client.CoreV1Api(api)


SHIPPED_SCHED_PORT = int(os.environ.get("TOPOPLACE_KUBE_SCHED_PORT", "10269"))
KUBE_PORT = int(os.environ.get("TOPOPLACE_KUBE_PORT", "8888"))


def derived_port(env: str, offset: int) -> int:
    """``$env`` if set, else ``TOPOPLACE_KUBE_PORT + offset``: the suite's other topoplace
    processes move with the suite's own port, so concurrent suites do not collide."""
    return int(os.environ.get(env) or KUBE_PORT + offset)


def shipped_scheduler_wanted() -> bool:
    """True when ``KUBE_BIN`` holds kube-scheduler (and ``TOPOPLACE_KUBE_SHIPPED`` is not
    0): the suite then runs its own kube-scheduler with the configuration topoplace ships."""
    kube_bin = os.environ.get("KUBE_BIN", "")
    return (
        bool(kube_bin)
        and (Path(kube_bin) / "kube-scheduler").is_file()
        and os.environ.get("TOPOPLACE_KUBE_SHIPPED", "1") != "0"
    )


@pytest.fixture(scope="session")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The run's own CA and key pairs (``topoplace certs``) when the suite runs the shipped
    configuration and that talks TLS to the extender; else None: plain HTTP on loopback, as
    ``config/deploy`` ships (the mTLS variant has its own test module, ``test_mtls.py``)."""
    if not shipped_scheduler_wanted():
        return None
    from benchmarks.live.kubesched import extender_uses_tls, load_shipped, make_certs

    if not extender_uses_tls(load_shipped()):
        return None
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def shipped_scheduler(
    kubeconfig: str, port: int, tls_dir: Path | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """kube-scheduler with ``config/deploy/scheduler-config.yaml`` (rendered for loopback:
    kubeconfig, no leader election, the extender on ``port``), started by this suite.

    QueueingHints are switched off (``TOPOPLACE_KUBE_QUEUEING_HINTS=1`` keeps them), as in
    kube-scheduler <= 1.31: a pod refused only by the extender then stays parked until the
    pod itself is updated, which is the condition topoplace's gang wake-up must handle.
    """
    if not shipped_scheduler_wanted():
        pytest.skip("needs KUBE_BIN with kube-scheduler (the shipped configuration is run)")
    from benchmarks.live.kubesched import KubeScheduler

    extra: tuple[str, ...] = ()
    if os.environ.get("TOPOPLACE_KUBE_QUEUEING_HINTS") != "1":
        extra = ("--feature-gates", "SchedulerQueueingHints=false")
    ks = KubeScheduler(
        kubeconfig,
        f"http://127.0.0.1:{port}/scheduler",
        tmp_path_factory.mktemp("kube-scheduler"),
        port=SHIPPED_SCHED_PORT,
        kube_bin=os.environ["KUBE_BIN"],
        extra_args=extra,
        tls_dir=tls_dir,
    )
    with ks:
        yield ks


@pytest.fixture(scope="session")
def scheduler_name(request: pytest.FixtureRequest) -> str:
    """The profile the suite's pods name: the shipped configuration's (``topoplace``) when
    this suite runs its own kube-scheduler, else ``$SCHEDULER_NAME`` (up.sh's profile)."""
    if shipped_scheduler_wanted():
        return str(request.getfixturevalue("shipped_scheduler").profiles[0])
    return os.environ.get("SCHEDULER_NAME", "topology-gpu")


@pytest.fixture(scope="session")
def port() -> int:
    return KUBE_PORT


@pytest.fixture(scope="session")
def run_id() -> str:
    return secrets.token_hex(3)


def make_gpu_node(
    core: Any, name: str, run_id: str, gpus: int = 8, labels: dict[str, str] | None = None
) -> None:
    """A Node object with GPU capacity and Ready status (no kubelet), untainted, labelled
    ``topoplace-it=<run id>`` (the tests' pods select on it)."""
    from kubernetes.client.exceptions import ApiException

    lab = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.machine": "DGXH100",
        NODE_LABEL: run_id,
        **(labels or {}),
    }
    try:
        core.create_node(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": lab}}
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
        core.patch_node(name, {"metadata": {"labels": lab}, "spec": {"unschedulable": False}})
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    res = {"cpu": "192", "memory": "2048Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    core.patch_node_status(
        name,
        {
            "status": {
                "capacity": res,
                "allocatable": res,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "topoplace integration test node",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            }
        },
    )
    for _ in range(20):
        node = core.read_node(name)
        taints = node.spec.taints or []
        keep = [t for t in taints if t.key not in NOT_READY_TAINTS]
        if len(keep) == len(taints):
            return
        node.spec.taints = keep or None
        try:
            core.replace_node(name, node)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise
            time.sleep(0.1)


@pytest.fixture(scope="session")
def gpu_nodes(core: Any, run_id: str) -> Iterator[list[str]]:
    """Four 8-GPU nodes on two leaves, labelled ``topoplace-it=<run id>``; deleted after."""
    names = [f"tp-it-{run_id}-{i}" for i in range(4)]
    for i, n in enumerate(names):
        make_gpu_node(
            core, n, run_id, labels={"network.topology.nvidia.com/leaf": f"leaf-{i // 2}"}
        )
    yield names
    for n in names:
        with contextlib.suppress(Exception):
            core.delete_node(n)


@pytest.fixture(scope="session")
def namespace(core: Any, run_id: str) -> Iterator[str]:
    ns = f"tp-it-{run_id}"
    core.create_namespace({"metadata": {"name": ns}})
    yield ns
    try:
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        core.delete_namespace(ns)
    except Exception:
        pass


# ---- the topoplace process ------------------------------------------------------------------


class Topoplace:
    """``topoplace serve --kubeconfig`` as a subprocess this suite owns (by pid)."""

    def __init__(
        self,
        kubeconfig: str,
        port: int,
        logdir: Path,
        tls_dir: Path | None = None,
        extra_args: tuple[str, ...] = (),
        scheduler_names: tuple[str, ...] = (),
    ) -> None:
        self.kubeconfig = kubeconfig
        self.port = port
        self.logdir = logdir
        self.tls_dir = tls_dir
        self.extra_args = extra_args
        self.scheduler_names = scheduler_names
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.extra_env: dict[str, str] = {}
        """Environment for the next :meth:`start` on top of the suite's (a test that needs
        another setting restarts the extender with it, then without)."""
        self.url = f"{'https' if tls_dir is not None else 'http'}://127.0.0.1:{port}"

    def _client_kw(self) -> dict[str, Any]:
        """httpx arguments: with mTLS (``tls_dir``), the run's CA and the client key pair
        kube-scheduler also uses."""
        if self.tls_dir is None:
            return {}
        d = self.tls_dir
        ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
        ctx.load_cert_chain(str(d / "client.crt"), str(d / "client.key"))
        return {"verify": ctx}

    def _port_free(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) != 0

    def start(self) -> None:
        deadline = time.monotonic() + 10
        while not self._port_free():
            if time.monotonic() > deadline:
                raise RuntimeError(f"127.0.0.1:{self.port} is busy; another extender is running")
            time.sleep(0.1)
        self.starts += 1
        log = open(self.logdir / f"topoplace-{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "scheduler.cli.main",
                "--log-level",
                "INFO",
                "serve",
                "--kubeconfig",
                self.kubeconfig,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *self._tls_args(),
                *self.extra_args,
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={
                **os.environ,
                # bind acts only for these profiles: the shipped one, its DRA variant's
                # (tests/kube/test_dra.py) and up.sh's
                "TOPOPLACE_SCHEDULER_NAMES": ",".join(
                    self.scheduler_names
                    or sorted(
                        {
                            "topoplace",
                            "topoplace-dra",
                            os.environ.get("SCHEDULER_NAME", "topology-gpu"),
                        }
                    )
                ),
                **self.extra_env,
            },
        )

    def _tls_args(self) -> list[str]:
        if self.tls_dir is None:
            return []
        d = self.tls_dir
        return [
            "--tls-cert",
            str(d / "server.crt"),
            "--tls-key",
            str(d / "server.key"),
            "--tls-client-ca",
            str(d / "ca.crt"),
        ]

    def wait_ready(self, timeout: float = 60) -> float:
        """Seconds until /readyz answered 200."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            assert self.proc is not None and self.proc.poll() is None, self.log_tail()
            try:
                r = httpx.get(self.url + "/readyz", timeout=1, **self._client_kw())
                if r.status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("topoplace not ready:\n" + self.log_tail())

    def get(self, path: str) -> Any:
        r = httpx.get(self.url + path, timeout=5, **self._client_kw())
        r.raise_for_status()
        return r.json()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the process this suite started (by pid) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    @contextlib.contextmanager
    def restarted(
        self, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
    ) -> Iterator[None]:
        """Restarted with ``env`` on top of the suite's environment and ``args`` after its
        arguments for the block, then restarted as it was."""
        old_env, old_args = self.extra_env, self.extra_args
        self.kill(signal.SIGTERM)
        self.extra_env, self.extra_args = dict(env or {}), (*old_args, *args)
        self.start()
        self.wait_ready()
        try:
            yield
        finally:
            self.kill(signal.SIGTERM)
            self.extra_env, self.extra_args = old_env, old_args
            self.start()
            self.wait_ready()

    def log_tail(self, n: int = 60) -> str:
        p = self.logdir / f"topoplace-{self.starts}.log"
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else ""


@pytest.fixture(scope="session")
def topoplace(
    kubeconfig: str,
    port: int,
    gpu_nodes: list[str],
    tls_dir: Path | None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Topoplace]:
    tp = Topoplace(kubeconfig, port, tmp_path_factory.mktemp("topoplace"), tls_dir)
    try:
        tp.start()
        tp.wait_ready()
        yield tp
    finally:
        tp.kill(signal.SIGTERM)
