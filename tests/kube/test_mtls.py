"""Live: the mTLS variant (the component ``config/deploy/mtls``) end to end.

``config/deploy`` ships the extender on plain HTTP on the pod's loopback; the mTLS component
turns that hop into HTTPS with client certificates. This module runs it against the real
control plane, so it stays proven: its own ``topoplace serve --tls-cert/--tls-key/
--tls-client-ca`` with the run's certificates (``topoplace certs``) on
``TOPOPLACE_KUBE_MTLS_PORT`` (default ``TOPOPLACE_KUBE_PORT`` + 3), and kube-schedulers with
``config/deploy/mtls/scheduler-config-mtls.yaml`` rendered for loopback (ports
``TOPOPLACE_KUBE_SCHED_PORT`` + 2 and + 3):

* profile ``topoplace-mtls`` (the component's configuration, client certificate included):
  a GPU pod is filtered and bound by topoplace over mTLS;
* profile ``topoplace-mtls-nocert`` (the same, without ``certFile``/``keyFile``): the pod's
  scheduling fails at the extender's filter and it stays pending; a direct call without a
  client certificate is refused in the TLS handshake.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.kube.conftest import (
    SHIPPED_SCHED_PORT,
    Topoplace,
    derived_port,
    queueing_hints_args,
    shipped_scheduler_wanted,
)
from tests.kube.test_live import (
    clean,  # noqa: F401  (autouse: pods deleted after each test)
    gpu_pod,
    placement,
    wait_for,
)

MTLS_PORT = derived_port("TOPOPLACE_KUBE_MTLS_PORT", 3)
PROFILE = "topoplace-mtls"
NOCERT_PROFILE = "topoplace-mtls-nocert"
SCHED_PORTS = (SHIPPED_SCHED_PORT + 2, SHIPPED_SCHED_PORT + 3)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not shipped_scheduler_wanted():
        pytest.skip("needs KUBE_BIN with kube-scheduler (the mTLS configuration is run)")
    from benchmarks.live.kubesched import make_certs

    return make_certs(tmp_path_factory.mktemp("mtls-pki"))


@pytest.fixture(scope="module")
def mtls_topoplace(
    kubeconfig: str, pki: Path, gpu_nodes: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Topoplace]:
    tp = Topoplace(
        kubeconfig,
        MTLS_PORT,
        tmp_path_factory.mktemp("topoplace-mtls"),
        pki,
        scheduler_names=(PROFILE, NOCERT_PROFILE),
    )
    try:
        tp.start()
        tp.wait_ready()
        yield tp
    finally:
        tp.kill()


def _config(kubeconfig: str, profile: str, pki: Path) -> dict[str, Any]:
    from benchmarks.live.kubesched import (
        MTLS_CONFIG,
        extender_transport,
        load_shipped,
        render_config,
    )

    shipped = load_shipped(MTLS_CONFIG)
    assert extender_transport(shipped) == "mtls"
    return render_config(
        shipped, kubeconfig, f"https://127.0.0.1:{MTLS_PORT}/scheduler", profile, pki
    )


@pytest.fixture(scope="module")
def mtls_schedulers(
    kubeconfig: str,
    pki: Path,
    mtls_topoplace: Topoplace,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """Two kube-schedulers with the component's configuration: as shipped, and without the
    client certificate (``certFile``/``keyFile`` removed from ``tlsConfig``)."""
    from benchmarks.live.kubesched import KubeScheduler

    nocert = _config(kubeconfig, NOCERT_PROFILE, pki)
    tls = nocert["extenders"][0]["tlsConfig"]
    del tls["certFile"], tls["keyFile"]
    assert tls == {"caFile": str(pki / "ca.crt")}
    gates = queueing_hints_args(os.environ["KUBE_BIN"])
    started = {
        name: KubeScheduler(
            kubeconfig,
            "",
            tmp_path_factory.mktemp(name),
            port=port,
            kube_bin=os.environ["KUBE_BIN"],
            extra_args=gates,
            config=config,
        )
        for name, port, config in (
            (PROFILE, SCHED_PORTS[0], _config(kubeconfig, PROFILE, pki)),
            (NOCERT_PROFILE, SCHED_PORTS[1], nocert),
        )
    }
    try:
        for ks in started.values():
            ks.start()
        yield started
    finally:
        for ks in started.values():
            ks.stop()


def test_gpu_pod_is_filtered_and_bound_over_mtls(
    core: Any,
    namespace: str,
    run_id: str,
    gpu_nodes: list[str],
    mtls_topoplace: Topoplace,
    mtls_schedulers: dict[str, Any],
) -> None:
    ext = mtls_schedulers[PROFILE].config["extenders"][0]
    assert ext["urlPrefix"] == f"https://127.0.0.1:{MTLS_PORT}/scheduler"
    assert set(ext["tlsConfig"]) == {"caFile", "certFile", "keyFile"}
    core.create_namespaced_pod(namespace, gpu_pod("mtls-1", 2, PROFILE, run_id))
    pod = wait_for(
        lambda: (p := core.read_namespaced_pod("mtls-1", namespace)).spec.node_name and p,
        60,
        "mtls-1 bound",
    )
    assert pod.spec.node_name in gpu_nodes
    # topoplace's own bind: the placement record comes in the same Binding, and its ledger
    # (read over mTLS) holds the pod's GPUs there
    record = placement(pod)
    assert record["node"] == pod.spec.node_name and len(record["gpus"]) == 2
    held = {p["pod"]: p for p in mtls_topoplace.get("/v1/inspect/placements")["placements"]}
    h = held[f"{namespace}/mtls-1"]
    assert (h["node"], h["gpus"], h["state"]) == (record["node"], sorted(record["gpus"]), "bound")
    # kube-scheduler called filter and bind on this topoplace (status 200 both)
    metrics = httpx.get(
        mtls_topoplace.url + "/metrics", timeout=10, **mtls_topoplace._client_kw()
    ).text
    for verb in ("filter", "bind"):
        assert any(
            line.startswith("topoplace_requests_total{")
            and f'verb="{verb}"' in line
            and 'code="200"' in line
            and float(line.rsplit(" ", 1)[1]) >= 1
            for line in metrics.splitlines()
        ), verb


def test_missing_client_certificate_is_refused(
    core: Any,
    namespace: str,
    run_id: str,
    gpu_nodes: list[str],
    pki: Path,
    mtls_topoplace: Topoplace,
    mtls_schedulers: dict[str, Any],
) -> None:
    # Directly: the CA is trusted, no client certificate is presented.
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    with pytest.raises(httpx.TransportError):
        httpx.post(
            mtls_topoplace.url + "/scheduler/filter", json={}, timeout=10, verify=ctx
        ).raise_for_status()
    with pytest.raises(httpx.TransportError):  # and plain HTTP does not reach the verbs
        httpx.post(f"http://127.0.0.1:{MTLS_PORT}/scheduler/filter", json={}, timeout=10)

    # Through kube-scheduler: its filter call fails, the attempt fails, nothing is bound.
    core.create_namespaced_pod(namespace, gpu_pod("nocert-1", 1, NOCERT_PROFILE, run_id))

    def failed() -> list[str]:
        events = core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=nocert-1"
        ).items
        return [e.message for e in events if e.reason == "FailedScheduling"]

    messages = wait_for(failed, 60, "FailedScheduling of nocert-1")
    assert any(f"https://127.0.0.1:{MTLS_PORT}/scheduler/filter" in m for m in messages), messages
    assert not core.read_namespaced_pod("nocert-1", namespace).spec.node_name
    # The same pod with the certificate is scheduled (the refusal was the certificate's).
    core.create_namespaced_pod(namespace, gpu_pod("withcert-1", 1, PROFILE, run_id))
    wait_for(
        lambda: core.read_namespaced_pod("withcert-1", namespace).spec.node_name,
        60,
        "withcert-1 bound",
    )
    assert not core.read_namespaced_pod("nocert-1", namespace).spec.node_name
