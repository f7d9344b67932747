"""Fixtures of the live integration suite (marker ``kube``).

Runs only when asked for (``-m kube`` or ``TOPOPLACE_KUBE_TESTS=1``) and given a cluster:

* ``KUBE_BIN`` (a folder with ``etcd``, ``kube-apiserver``, ``kube-scheduler``) and no
  ``KUBECONFIG``: the session brings up its own loopback control plane with the harness
  (:mod:`benchmarks.cluster`: DRA served, ``DRADeviceTaints`` on where known, and from 1.36
  ``scheduling.k8s.io/v1alpha2`` PodGroups with ``GenericWorkload``) and tears it down at the
  end. Its ports: ``TOPOPLACE_KUBE_API_PORT`` (16443), ``TOPOPLACE_KUBE_ETCD_PORT`` (23790),
  ``TOPOPLACE_KUBE_ETCD_PEER_PORT`` (23800); its folder ``TOPOPLACE_KUBE_WORK`` (default a
  new temporary one, removed after a green run, kept with its logs after a failure);
* ``KUBECONFIG``: that cluster, as it is. An API server that is not on loopback is refused
  unless ``TOPOPLACE_KUBE_ALLOW_REMOTE=1``: the tests create Nodes.

Knobs:

* ``KUBE_BIN``: with kube-scheduler there, the suite runs its own kube-scheduler with the
  configuration topoplace ships (``config/deploy/scheduler-config.yaml``, profile
  ``topoplace``, port ``TOPOPLACE_KUBE_SCHED_PORT``, default 10269) and every test goes
  through it. ``TOPOPLACE_KUBE_SHIPPED=0`` opts out (then a given cluster's scheduler
  profile ``SCHEDULER_NAME``, default ``topology-gpu``, must call the extender). As
  shipped, kube-scheduler reaches topoplace over plain HTTP on loopback; the mTLS variant
  (the component ``config/deploy/mtls``) is run end to end by ``test_mtls.py``, with its
  own topoplace and kube-schedulers;
* ``TOPOPLACE_KUBE_PORT`` (default 8888): where topoplace listens.

Every other port the suite opens is derived from these two unless set, so two suites with
different ``TOPOPLACE_KUBE_PORT`` / ``TOPOPLACE_KUBE_SCHED_PORT`` can run on one host:
kube-schedulers at ``TOPOPLACE_KUBE_SCHED_PORT`` + 1 (DRA), + 2 and + 3 (mTLS), + 11 and + 12
(failover); topoplace processes at ``TOPOPLACE_KUBE_PORT`` + 3
(``TOPOPLACE_KUBE_MTLS_PORT``), + 9983 and + 9984 (``TOPOPLACE_KUBE_HA_PORT_A`` / ``_B``:
18871 / 18872 with the default port).

Example::

    KUBE_BIN=$HOME/kube-bin-1.36 python -m pytest tests/kube -m kube -q
"""

from __future__ import annotations

import contextlib
import datetime
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
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


def _harness_wanted() -> bool:
    """No ``KUBECONFIG`` but ``KUBE_BIN`` holds a control plane's binaries."""
    kube_bin = os.environ.get("KUBE_BIN", "")
    return (
        not os.environ.get("KUBECONFIG")
        and bool(kube_bin)
        and all((Path(kube_bin) / b).is_file() for b in ("etcd", "kube-apiserver"))
    )


def _bring_up(config: pytest.Config) -> None:
    """The session's own control plane (see the module docstring); its environment goes
    into ``os.environ`` (``KUBECONFIG`` first) so the suite and its subprocesses use it."""
    from benchmarks.cluster import Cluster, ClusterError, Ports

    work = os.environ.get("TOPOPLACE_KUBE_WORK") or tempfile.mkdtemp(prefix="topoplace-kube-")
    ports = Ports(
        api=int(os.environ.get("TOPOPLACE_KUBE_API_PORT", "16443")),
        etcd=int(os.environ.get("TOPOPLACE_KUBE_ETCD_PORT", "23790")),
        etcd_peer=int(os.environ.get("TOPOPLACE_KUBE_ETCD_PEER_PORT", "23800")),
    )
    cluster = Cluster(
        os.environ["KUBE_BIN"],
        work,
        ports=ports,
        dra=True,
        feature_gates=("DRADeviceTaints=true",),
        workloads=True,
    )
    try:
        cluster.up()
    except (ClusterError, ValueError) as exc:
        raise pytest.UsageError(f"could not bring up the test cluster in {work}: {exc}") from exc
    config.stash[_CLUSTER] = cluster
    os.environ.update(cluster.env())


_CLUSTER = pytest.StashKey[Any]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    ours = [i for i in items if here in Path(str(i.fspath)).resolve().parents]
    skip = None
    if not _wanted(config):
        skip = pytest.mark.skip(reason="live Kubernetes suite: run with -m kube")
    elif not os.environ.get("KUBECONFIG") and not _harness_wanted():
        skip = pytest.mark.skip(
            reason="live Kubernetes suite: set KUBE_BIN (a folder with etcd, kube-apiserver "
            "and kube-scheduler: the suite brings up its own cluster) or KUBECONFIG"
        )
    elif ours and _harness_wanted():
        _bring_up(config)
    for item in ours:
        item.add_marker(pytest.mark.kube)
        if skip is not None:
            item.add_marker(skip)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the session's own cluster; its folder goes unless a test failed (the logs)."""
    cluster = session.config.stash.get(_CLUSTER, None)
    if cluster is None:
        return
    del session.config.stash[_CLUSTER]
    cluster.down()
    if session.testsfailed or os.environ.get("TOPOPLACE_KUBE_WORK"):
        print(f"\ntest cluster logs: {cluster.work}/logs", file=sys.stderr)
    else:
        shutil.rmtree(cluster.work, ignore_errors=True)


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


def queueing_hints_args(kube_bin: str | Path) -> tuple[str, ...]:
    """kube-scheduler arguments that switch QueueingHints off, as in kube-scheduler <= 1.31
    (a pod refused only by the extender then stays parked until the pod itself is updated,
    the condition topoplace's gang wake-up must handle), where the binary's version lets
    them (<= 1.33; GA and locked from 1.34, where the flag would stop it from starting).
    ``TOPOPLACE_KUBE_QUEUEING_HINTS=1`` keeps them everywhere."""
    from benchmarks.cluster.cluster import binary_version
    from benchmarks.cluster.flags import parse_version, queueing_hints_off

    if os.environ.get("TOPOPLACE_KUBE_QUEUEING_HINTS") == "1":
        return ()
    return queueing_hints_off(parse_version(binary_version(Path(kube_bin) / "kube-scheduler")))


@pytest.fixture(scope="session")
def kube_version(core: Any) -> tuple[int, int]:
    """(major, minor) of the API server the suite runs against."""
    from kubernetes import client

    from benchmarks.cluster.flags import parse_version

    info = client.VersionApi(core.api_client).get_code()
    return parse_version(f"{info.major}.{info.minor}")


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

    QueueingHints are switched off where the version still lets them be
    (:func:`queueing_hints_args`).
    """
    if not shipped_scheduler_wanted():
        pytest.skip("needs KUBE_BIN with kube-scheduler (the shipped configuration is run)")
    from benchmarks.live.kubesched import KubeScheduler

    extra = queueing_hints_args(os.environ["KUBE_BIN"])
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
    this suite runs its own kube-scheduler, else ``$SCHEDULER_NAME`` (a given cluster's)."""
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
def gpu_nodes(core: Any, run_id: str, kubeconfig: str) -> Iterator[list[str]]:
    """Four 8-GPU nodes on two leaves, labelled ``topoplace-it=<run id>``; deleted after.

    They heartbeat like a kubelet (:class:`benchmarks.cluster.nodes.Heartbeat`) for the
    whole session: the suite uses them for longer than topoplace lets a Ready node go
    without a heartbeat before it grades it degraded (``heartbeat_stale_seconds``)."""
    from benchmarks.cluster.nodes import Heartbeat
    from benchmarks.live.kubeapi import Api

    names = [f"tp-it-{run_id}-{i}" for i in range(4)]
    for i, n in enumerate(names):
        make_gpu_node(
            core, n, run_id, labels={"network.topology.nvidia.com/leaf": f"leaf-{i // 2}"}
        )
    api = Api(kubeconfig)
    with Heartbeat(api, names, interval=float(os.environ.get("TOPOPLACE_KUBE_HEARTBEAT_S", "60"))):
        yield names
    api.close()
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
                # (tests/kube/test_dra.py) and a given cluster's ($SCHEDULER_NAME)
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
