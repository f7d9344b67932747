"""Live HA: two replicas (kube-scheduler + topoplace each, as two pods of the shipped
Deployment), leader election on a real Lease, a failover in the middle of a gang.

Each replica is a kube-scheduler with the shipped configuration (leader election kept, on a
Lease of this run, with a short lease so the test is quick) and a ``topoplace serve
--leader-lease`` beside it. The two kube-schedulers run in their own UTS namespaces
(``unshare -u``) with the hostnames ``<run>-a`` / ``<run>-b``, as two pods would: their
Lease identity is ``<hostname>_<uuid>`` and each topoplace follows it with
``--leader-identity <hostname>``. The profile is this run's own, so the suite's other
kube-scheduler never schedules these pods.

The scenario: a 4 x 8-GPU gang on exactly 4 free nodes; member 0 binds through replica A,
members 1-3 are held back by a scheduling gate (mid-gang: one bound, three reserved in A's
memory). Replica B, standing by, refuses a filter. Replica A (both processes) is killed
with SIGKILL, so its Lease is not released; a rival 8-GPU pod arrives. B's kube-scheduler
takes the Lease after the lease duration, B's topoplace replays the plan from member 0's
placement record and reserves the three open slots before acting. Then the gates are
lifted. The gang completes on its planned slots under one plan id (no split), member 0 is
unchanged, the rival gets nothing, and no GPU is held twice.

Needs ``KUBE_BIN`` (kube-scheduler) and ``unshare -u`` (root).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.kube.conftest import (
    SHIPPED_SCHED_PORT,
    Topoplace,
    derived_port,
    make_gpu_node,
    queueing_hints_args,
)
from tests.kube.test_live import (
    assert_no_double_booking,
    assert_rivals_wait,
    bound,
    clean,  # noqa: F401  (autouse: pods deleted after each test)
    gang_annotations,
    gpu_pod,
    needs_gangs,
    placement,
    ungate,
    wait_for,
)

LEASE_NS = "topoplace-system"
LEASE = {"leaseDuration": "6s", "renewDeadline": "4s", "retryPeriod": "1s"}
PORTS = (  # 18871 / 18872 with the default TOPOPLACE_KUBE_PORT (conftest.py)
    derived_port("TOPOPLACE_KUBE_HA_PORT_A", 9983),
    derived_port("TOPOPLACE_KUBE_HA_PORT_B", 9984),
)
SCHED_PORTS = (SHIPPED_SCHED_PORT + 11, SHIPPED_SCHED_PORT + 12)


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-u", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


class Replica:
    """One pod of the Deployment: kube-scheduler (own hostname, leader election) and
    topoplace following its Lease."""

    def __init__(
        self,
        hostname: str,
        kubeconfig: str,
        profile: str,
        lease: str,
        port: int,
        sched_port: int,
        workdir: Path,
        tls_dir: Path | None,
    ) -> None:
        from benchmarks.live.kubesched import load_shipped, render_config

        self.hostname = hostname
        self.workdir = workdir
        self.sched_port = sched_port
        cfg = render_config(
            load_shipped(), kubeconfig, f"http://127.0.0.1:{port}/scheduler", profile, tls_dir
        )
        cfg["leaderElection"] = {
            "leaderElect": True,
            "resourceLock": "leases",
            "resourceName": lease,
            "resourceNamespace": LEASE_NS,
            **LEASE,
        }
        self.config = workdir / "kube-scheduler.yaml"
        self.config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.kubeconfig = kubeconfig
        self.sched: subprocess.Popen[bytes] | None = None
        self.topoplace = Topoplace(
            kubeconfig,
            port,
            workdir,
            tls_dir,
            extra_args=(
                "--leader-lease",
                f"{LEASE_NS}/{lease}",
                "--leader-identity",
                hostname,
            ),
            scheduler_names=(profile,),
        )

    def start(self) -> None:
        self.topoplace.start()
        self.topoplace.wait_ready()
        cmd = (
            f"hostname {self.hostname} && exec {os.environ['KUBE_BIN']}/kube-scheduler "
            f"--config {self.config} --authentication-kubeconfig {self.kubeconfig} "
            f"--authorization-kubeconfig {self.kubeconfig} --bind-address 127.0.0.1 "
            f"--secure-port {self.sched_port} --v 2 "
            + " ".join(queueing_hints_args(os.environ["KUBE_BIN"]))
        )
        with open(self.workdir / "kube-scheduler.log", "wb") as log:
            self.sched = subprocess.Popen(
                ["unshare", "-u", "sh", "-c", cmd],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def leading(self) -> bool:
        """topoplace says it acts (metric topoplace_leader 1)."""
        try:
            r = httpx.get(self.topoplace.url + "/metrics", timeout=2, **self.topoplace._client_kw())
        except httpx.HTTPError:
            return False
        return any(line == "topoplace_leader 1.0" for line in r.text.splitlines())

    def kill(self) -> None:
        """SIGKILL both processes (by pid): the Lease is not released."""
        if self.sched is not None and self.sched.poll() is None:
            self.sched.send_signal(signal.SIGKILL)
            self.sched.wait(10)
        self.topoplace.kill(signal.SIGKILL)

    def stop(self) -> None:
        if self.sched is not None and self.sched.poll() is None:
            self.sched.send_signal(signal.SIGTERM)
            try:
                self.sched.wait(15)
            except subprocess.TimeoutExpired:
                self.sched.kill()
                self.sched.wait(5)
        self.topoplace.kill(signal.SIGTERM)


@pytest.fixture
def replicas(
    core: Any,
    kubeconfig: str,
    run_id: str,
    tls_dir: Path | None,
    tmp_path: Path,
) -> Iterator[tuple[Replica, Replica, str, list[str]]]:
    kube_bin = Path(os.environ.get("KUBE_BIN") or "/nonexistent")
    if not (kube_bin / "kube-scheduler").is_file():
        pytest.skip("needs KUBE_BIN with kube-scheduler")
    if not _unshare_works():
        pytest.skip("needs `unshare -u` (root) to give each kube-scheduler its own hostname")
    from kubernetes.client.exceptions import ApiException

    with contextlib.suppress(ApiException):
        core.create_namespace({"metadata": {"name": LEASE_NS}})
    label = f"{run_id}-ha"
    nodes = [f"tp-ha-{run_id}-{i}" for i in range(4)]
    for n in nodes:
        make_gpu_node(core, n, label)
    profile = f"topoplace-ha-{run_id}"
    lease = f"topoplace-ha-{run_id}"
    reps = []
    for side, port, sport in zip("ab", PORTS, SCHED_PORTS, strict=True):
        d = tmp_path / side
        d.mkdir()
        reps.append(
            Replica(f"{run_id}-{side}", kubeconfig, profile, lease, port, sport, d, tls_dir)
        )
    try:
        yield reps[0], reps[1], profile, nodes
    finally:
        for r in reps:
            r.stop()
        for n in nodes:
            with contextlib.suppress(Exception):
                core.delete_node(n)


def _filter_error(rep: Replica, body: dict[str, Any]) -> str:
    kw = rep.topoplace._client_kw()
    r = httpx.post(rep.topoplace.url + "/scheduler/filter", json=body, timeout=10, **kw)
    r.raise_for_status()
    return str(r.json()["Error"])


@needs_gangs
def test_failover_mid_gang_loses_nothing(
    core: Any,
    namespace: str,
    run_id: str,
    replicas: tuple[Replica, Replica, str, list[str]],
) -> None:
    a, b, profile, nodes = replicas
    label = f"{run_id}-ha"
    a.start()
    wait_for(a.leading, 60, "replica A leading")
    b.start()  # ready (warm cache) when start returns, standing by
    ann = gang_annotations("ha", 4)
    members = ["ha-0", "ha-1", "ha-2", "ha-3"]
    core.create_namespaced_pod(namespace, gpu_pod("ha-0", 8, profile, label, annotations=ann))
    for m in members[1:]:
        core.create_namespaced_pod(
            namespace, gpu_pod(m, 8, profile, label, annotations=ann, gated=True)
        )
    first = wait_for(lambda: bound(core, namespace, ["ha-0"]).get("ha-0"), 60, "ha-0 bound")
    rec0 = placement(first)
    promised = {(node, tuple(gpus)) for _, node, gpus in rec0["slots"]}
    assert len(promised) == 4 and {n for n, _ in promised} == set(nodes)
    plan_a = a.topoplace.get("/v1/inspect/placements")["gangs"][f"{namespace}/ha"]
    assert sum(s["state"] == "reserved" for s in plan_a["slots"]) == 3, plan_a
    # The standby holds nothing and refuses to act.
    assert not b.leading()
    assert b.topoplace.get("/v1/inspect/placements")["gangs"] == {}
    probe = gpu_pod("probe", 8, profile, label)
    probe["metadata"].update(namespace=namespace, uid="00000000-0000-0000-0000-000000000001")
    assert "not the leader" in _filter_error(b, {"Pod": probe, "NodeNames": nodes})
    # Replica A dies without releasing the Lease; a rival arrives meanwhile.
    a.kill()
    core.create_namespaced_pod(namespace, gpu_pod("rival", 8, profile, label))
    wait_for(b.leading, 60, "replica B leading after the lease expired")
    plan_b = b.topoplace.get("/v1/inspect/placements")["gangs"][f"{namespace}/ha"]
    assert plan_b["plan"] == rec0["plan"] and plan_b["details"]["recovery"] == "replayed"
    assert sum(s["state"] == "reserved" for s in plan_b["slots"]) == 3, plan_b
    assert_rivals_wait(core, namespace, ["rival"], 8)
    for m in members[1:]:
        ungate(core, namespace, m)
    got = wait_for(
        lambda: (x := bound(core, namespace, members)) and len(x) == 4 and x, 90, "gang bound"
    )
    assert placement(got["ha-0"]) == rec0, "the bound member's placement changed"
    recs = {m: placement(p) for m, p in got.items()}
    assert {r["plan"] for r in recs.values()} == {rec0["plan"]}, "the gang was split"
    assert {(r["node"], tuple(r["gpus"])) for r in recs.values()} == promised
    assert not core.read_namespaced_pod("rival", namespace).spec.node_name
    assert_no_double_booking(list(got.values()))
    # B's log says it took over once and replayed the plan before acting.
    log = (b.workdir / f"topoplace-{b.topoplace.starts}.log").read_text()
    assert "takeover 1 done: 1 gang plan(s) replayed" in log, log[-3000:]
