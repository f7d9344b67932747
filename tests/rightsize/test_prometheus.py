"""The Prometheus reader against a real Prometheus (Debian's ``prometheus`` binary) scraping
exporters that serve recorded series under HAMi's, DCGM's and vLLM's real metric names."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from scheduler.core.rightsize import (
    KV_USAGE,
    MEMORY,
    OOM_EVENTS,
    REQUESTS_WAITING,
    UTILIZATION,
    GiB,
    replay,
)
from scheduler.kube.prometheus import PrometheusError, PrometheusReader, owner_from_pod_name

PROMETHEUS = shutil.which("prometheus")
SD_POD = "sd-7d9f8b6c5d-x2x4k"
SD_USED = [10 * GiB, 12 * GiB, 16 * GiB]  # recorded, one value per scrape, cycling
SD_LIMIT = 16 * GiB


class Recorded:
    """HAMi (new and pre-2.9 names) and DCGM series; the HAMi pod's memory moves each scrape."""

    def __init__(self) -> None:
        self.scrapes = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        used = SD_USED[self.scrapes % len(SD_USED)]
        self.scrapes += 1
        hami = ["podnamespace", "podname", "ctrname", "deviceuuid"]
        sd = ["ml", SD_POD, "main", "GPU-0"]
        g = GaugeMetricFamily("hami_vgpu_memory_used_bytes", "used", labels=hami)
        g.add_metric(sd, used)
        yield g
        g = GaugeMetricFamily("hami_vgpu_memory_limit_bytes", "limit", labels=hami)
        g.add_metric(sd, SD_LIMIT)
        yield g
        g = GaugeMetricFamily("hami_container_device_utilization_ratio", "util", labels=hami)
        g.add_metric(sd, 0.25)
        yield g
        old = ["podnamespace", "podname", "ctrname", "vdeviceid"]
        g = GaugeMetricFamily("vGPU_device_memory_usage_in_bytes", "used", labels=old)
        g.add_metric(["ml", "old-0", "main", "0"], 5 * GiB)
        yield g
        g = GaugeMetricFamily("Device_utilization_desc_of_container", "util", labels=old)
        g.add_metric(["ml", "old-0", "main", "0"], 40)
        yield g
        dcgm = ["gpu", "UUID", "pod", "namespace", "container"]
        g = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "MiB", labels=dcgm)
        g.add_metric(["1", "GPU-1", "trainer-1", "ml", "main"], 20480)
        g.add_metric(["0", "GPU-0", SD_POD, "ml", "main"], 99_999)  # HAMi's figure wins
        yield g
        g = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "percent", labels=dcgm)
        g.add_metric(["1", "GPU-1", "trainer-1", "ml", "main"], 50)
        yield g
        ksm = ["namespace", "pod", "uid", "owner_kind", "owner_name", "owner_is_controller"]
        g = GaugeMetricFamily("kube_pod_owner", "owner", labels=ksm)
        g.add_metric(["ml", "trainer-1", "u1", "Job", "nightly-train", "true"], 1)
        g.add_metric(["ml", SD_POD, "u2", "ReplicaSet", "sd-7d9f8b6c5d", "true"], 1)
        yield g


class Vllm:
    """A vLLM server's metrics (its pod labels come from the scrape job, as from Kubernetes SD)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("vllm:kv_cache_usage_perc", "kv", labels=["model_name"])
        g.add_metric(["llama"], 0.3)
        yield g
        g = GaugeMetricFamily("vllm:num_requests_waiting", "waiting", labels=["model_name"])
        g.add_metric(["llama"], 2)
        yield g


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(collector: Any) -> tuple[int, Any]:
    """Serve ``collector`` on a loopback port in Prometheus' text format (0.0.4), whatever
    the scraper accepts: it keeps vLLM's ``vllm:`` names as vLLM's own endpoint shows them
    (prometheus_client's OpenMetrics output would write ``vllm_``)."""
    reg = CollectorRegistry()
    reg.register(collector)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(reg)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return int(server.server_address[1]), server


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    if PROMETHEUS is None:
        pytest.skip("no prometheus binary (apt-get install -y prometheus)")
    tmp = tmp_path_factory.mktemp("prom")
    p1, s1 = serve(Recorded())
    p2, s2 = serve(Vllm())
    port = free_port()
    (tmp / "prometheus.yml").write_text(
        f"""global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: gpu
    static_configs:
      - targets: ['127.0.0.1:{p1}']
  - job_name: vllm
    static_configs:
      - targets: ['127.0.0.1:{p2}']
        labels: {{namespace: serve, pod: llm-5f7d8c9b4-x7kqz, container: vllm}}
"""
    )
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(
                    "prometheus did not become ready: "
                    + (tmp / "prometheus.log").read_text()[-2000:]
                )
            time.sleep(0.2)
        # Prometheus applies its targets a few seconds after start: wait for both scraped.
        while True:
            active = httpx.get(f"{url}/api/v1/targets", timeout=1).json()["data"]["activeTargets"]
            if len(active) == 2 and all(t["health"] == "up" for t in active):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"targets not scraped: {active}")
            time.sleep(0.2)
        start = time.time()
        time.sleep(5)  # about five scrapes of each target
        yield url, start
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
        s1.shutdown()
        s2.shutdown()
        s1.server_close()
        s2.server_close()


def test_reader_maps_every_source_to_samples(prometheus: tuple[str, float]) -> None:
    url, start = prometheus
    reader = PrometheusReader(url)
    try:
        samples = reader.read(start, time.time(), step=1.0)
    finally:
        reader.close()
    by: dict[tuple[str, str], list[float]] = {}
    for s in samples:
        by.setdefault((s.workload, s.metric), []).append(s.value)
    sd_mem = by[("ml/sd", MEMORY)]
    assert set(sd_mem) <= set(SD_USED) and len(set(sd_mem)) >= 2  # HAMi's, not DCGM's 99,999 MiB
    assert set(by[("ml/sd", UTILIZATION)]) == {0.25}
    ooms = [s.timestamp for s in samples if s.workload == "ml/sd" and s.metric == OOM_EVENTS]
    full = [
        s.timestamp
        for s in samples
        if s.workload == "ml/sd" and s.metric == MEMORY and s.value >= SD_LIMIT
    ]
    assert ooms and ooms == full, (sd_mem, ooms)  # used reached HAMi's limit exactly there
    assert set(by[("ml/old", MEMORY)]) == {5 * GiB}  # pre-2.9 names
    assert set(by[("ml/old", UTILIZATION)]) == {0.4}
    # the owner from kube-state-metrics (a Job), DCGM's MiB as bytes
    assert set(by[("ml/nightly-train", MEMORY)]) == {20 * GiB}
    assert set(by[("ml/nightly-train", UTILIZATION)]) == {0.5}
    assert set(by[("serve/llm", KV_USAGE)]) == {0.3}
    assert set(by[("serve/llm", REQUESTS_WAITING)]) == {2.0}
    rows, rec = replay(samples)
    assert {r.workload for r in rows} == {
        "ml/sd",
        "ml/old",
        "ml/nightly-train",
    }  # llm: no memory series
    assert any(r.oom for r in rows if r.workload == "ml/sd")


def test_reader_reports_a_prometheus_error(prometheus: tuple[str, float]) -> None:
    url, _ = prometheus
    reader = PrometheusReader(url)
    try:
        with pytest.raises(PrometheusError, match="query_range"):
            reader.query_range("rate(", 0, 10, 1)
    finally:
        reader.close()


@pytest.mark.parametrize(
    ("pod", "owner"),
    [
        ("sd-7d9f8b6c5d-x2x4k", "sd"),
        ("web-api-6c4f9d8b7-zq9mx", "web-api"),
        ("db-0", "db"),
        ("lws-leader-3-1", "lws-leader"),
        ("standalone", "standalone"),
    ],
)
def test_owner_from_pod_name(pod: str, owner: str) -> None:
    assert owner_from_pod_name(pod) == owner


def test_unreachable_prometheus_is_an_error() -> None:
    reader = PrometheusReader(f"http://127.0.0.1:{free_port()}", timeout_s=1)
    try:
        with pytest.raises(PrometheusError):
            reader.read(0, 10, 1)
    finally:
        reader.close()


def test_binary_path_is_debian_s() -> None:
    if PROMETHEUS is None:
        pytest.skip("no prometheus binary")
    assert Path(PROMETHEUS).exists()
