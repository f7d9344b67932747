"""The right-sizer live (opt-in, ``kube``): a real Prometheus, the real kube-apiserver
calling topoplace's admission webhook, one Recreate under a PodDisruptionBudget, and pod
creation not blocked once the webhook is down.

* **Prometheus** (Debian's ``prometheus`` and ``promtool``): a day of HAMi series recorded in
  production (two pods of Alibaba's GenAI serving trace, ``tests/rightsize/data/``) is
  backfilled with ``promtool tsdb create-blocks-from openmetrics`` under HAMi's real metric
  names and labels, ending two minutes ago; Prometheus then scrapes, every second, an
  exporter this test serves with the live pods' series (HAMi's names, each pod's own limit).
* **The workload**: a ReplicaSet object and its pods created directly (no controller manager
  runs on this plane: the test creates the replacement a ReplicaSet controller would, and
  plays the disruption controller by writing the PodDisruptionBudget's status), bound to a
  test node and marked Running and Ready, each asking HAMi for 75 GiB.
* **topoplace** (``serve --kubeconfig --webhook-port``, policy ``rightsize: mode: recreate``):
  the recommendation appears in ``/v1/inspect/rightsize``, ``/metrics``, ``topoplace
  explain --json`` and on the ReplicaSet (``topoplace.io/rightsize``); a
  MutatingWebhookConfiguration with the run's CA (``url: https://127.0.0.1:PORT/...``,
  ``failurePolicy: Ignore``, ``timeoutSeconds: 2``, a namespace opt-in label) makes the API
  server send it every new pod of the namespace; the replacement pod gets the recommended
  ``nvidia.com/gpumem`` and ``nvidia.com/gpucores``.
* **Recreate**: while the budget allows no disruption, evictions are refused (429) and
  counted ``blocked``; once it allows one, exactly one pod is evicted, and the other waits.
* **Webhook down**: topoplace stopped, a new pod is created at once, unchanged.
* **DRA capacity claims** (a test of its own, run first; resource.k8s.io/v1 only, skipped on
  older planes): a DeviceClass and a ResourceSlice whose device allows multiple allocations
  with a ``memory`` requestPolicy (1Gi steps), a ResourceClaimTemplate asking 75Gi and a pod
  of the workload naming it; the claim the resourceclaim controller would create (built by
  the cluster's stand-in, ``benchmarks/cluster/claims.py``) is created through the real
  kube-apiserver, which calls the webhook: the claim gets the workload's size rounded up to
  the 1Gi step, and the annotation saying why.

Ports (``TOPOPLACE_KUBE_PORT`` + 20..23 unless set): ``TOPOPLACE_KUBE_RIGHTSIZE_PORT``
(topoplace), ``_WEBHOOK_PORT``, ``_PROMETHEUS_PORT``, ``_EXPORTER_PORT``.
"""

from __future__ import annotations

import base64
import csv
import json
import math
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.kube.conftest import REPO, Topoplace, derived_port

RS_PORT = derived_port("TOPOPLACE_KUBE_RIGHTSIZE_PORT", 20)
WEBHOOK_PORT = derived_port("TOPOPLACE_KUBE_RIGHTSIZE_WEBHOOK_PORT", 21)
PROM_PORT = derived_port("TOPOPLACE_KUBE_RIGHTSIZE_PROMETHEUS_PORT", 22)
EXPORTER_PORT = derived_port("TOPOPLACE_KUBE_RIGHTSIZE_EXPORTER_PORT", 23)
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
DATA = REPO / "tests" / "rightsize" / "data" / "genai-two-pods.csv"
GiB, MiB = 1 << 30, 1 << 20
WORKLOAD = "hami-infer"
RS_NAME = f"{WORKLOAD}-7d9f8b6c5d"
ASKED_MIB = 76800  # what the pod template asks: 75 GiB
HISTORY_END_AGO_S = 120.0
OPT_IN = "topoplace.io/rightsize"
SCHEDULER = "rightsize-live"  # nobody schedules these pods: the test binds them


def wait_for(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def recorded() -> dict[str, list[tuple[float, float, float]]]:
    """The recorded series: container -> [(timestamp, memory bytes, duty ratio)]."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    with DATA.open() as f:
        for row in csv.DictReader(f):
            duty = float(row["gpu_duty_cycle_percent"] or 0) / 100
            out.setdefault(row["container_ip"], []).append(
                (float(row["timestamp_anon"]), float(row["gpu_memory_used_bytes"]), duty)
            )
    return out


def hami_labels(ns: str, pod: str) -> str:
    return f'podnamespace="{ns}",podname="{pod}",ctrname="server",deviceuuid="GPU-{pod[-5:]}"'


def backfill(ns: str, tmp: Path, now: float) -> tuple[Path, float]:
    """Blocks of the recorded day under HAMi's names, its last sample ``HISTORY_END_AGO_S``
    before ``now``, for two earlier pods of the workload; returns (data dir, peak bytes)."""
    series = recorded()
    end = max(t for s in series.values() for t, _, _ in s)
    shift = now - HISTORY_END_AGO_S - end
    pods = {
        ip: f"{RS_NAME}-{suffix}"
        for ip, suffix in zip(sorted(series), ("h7k2p", "m9x4q"), strict=True)
    }
    lines = []
    peak = 0.0
    for family, unit_of in (
        ("hami_vgpu_memory_used_bytes", lambda m, d: m),
        ("hami_vgpu_memory_limit_bytes", lambda m, d: float(ASKED_MIB * MiB)),
        ("hami_container_device_utilization_ratio", lambda m, d: d),
    ):
        lines.append(f"# TYPE {family} gauge")
        for ip, rows in sorted(series.items()):
            for t, mem, duty in rows:
                lines.append(
                    f"{family}{{{hami_labels(ns, pods[ip])}}} {unit_of(mem, duty)!r} {t + shift:.3f}"
                )
                peak = max(peak, mem)
    lines.append("# EOF")
    src = tmp / "history.om"
    src.write_text("\n".join(lines) + "\n")
    data = tmp / "tsdb"
    out = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(src), str(data)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return data, peak


class Exporter:
    """Serves the live pods' HAMi series (the recording's last values, the pod's own limit)."""

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.pods: dict[str, int] = {}  # pod -> its nvidia.com/gpumem (MiB)
        tail = recorded()
        self.tail = [rows[-30:] for _, rows in sorted(tail.items())]
        self.scrapes = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", EXPORTER_PORT), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def render(self) -> str:
        self.scrapes += 1
        used, limit, util = [], [], []
        for i, (pod, mib) in enumerate(sorted(self.pods.items())):
            _, mem, duty = self.tail[i % 2][self.scrapes % 30]
            lab = hami_labels(self.ns, pod)
            used.append(f"hami_vgpu_memory_used_bytes{{{lab}}} {mem!r}")
            limit.append(f"hami_vgpu_memory_limit_bytes{{{lab}}} {float(mib * MiB)!r}")
            util.append(f"hami_container_device_utilization_ratio{{{lab}}} {duty!r}")
        return (
            "\n".join(
                ["# TYPE hami_vgpu_memory_used_bytes gauge", *used]
                + ["# TYPE hami_vgpu_memory_limit_bytes gauge", *limit]
                + ["# TYPE hami_container_device_utilization_ratio gauge", *util]
            )
            + "\n"
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def prometheus_tools() -> None:
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip("no prometheus / promtool binary (apt-get install -y prometheus)")


@pytest.fixture(scope="module")
def stack(
    prometheus_tools: None,
    kubeconfig: str,
    core: Any,
    namespace: str,
    gpu_nodes: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """Prometheus with the backfilled day, the exporter, the workload's first two pods and
    topoplace with the right-sizer in Recreate mode and its webhook listener."""
    from kubernetes import client

    tmp = tmp_path_factory.mktemp("rightsize")
    now = time.time()
    data, peak = backfill(namespace, tmp, now)
    exporter = Exporter(namespace)
    (tmp / "prometheus.yml").write_text(
        f"""global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: hami-device-plugin
    static_configs:
      - targets: ['127.0.0.1:{EXPORTER_PORT}']
"""
    )
    plog = (tmp / "prometheus.log").open("w")
    prom = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{PROM_PORT}",
        ],
        stdout=plog,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    purl = f"http://127.0.0.1:{PROM_PORT}"
    tp: Topoplace | None = None
    apps = client.AppsV1Api(core.api_client)
    policy = client.PolicyV1Api(core.api_client)
    try:

        def ready() -> bool:
            assert prom.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
            try:
                return httpx.get(f"{purl}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 60, "prometheus ready")
        rs = apps.create_namespaced_replica_set(
            namespace,
            {
                "metadata": {"name": RS_NAME, "labels": {"app": WORKLOAD}},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": WORKLOAD}},
                    "template": pod_template(gpu_nodes[0]),
                },
            },
        )
        policy.create_namespaced_pod_disruption_budget(
            namespace,
            {
                "metadata": {"name": WORKLOAD},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": WORKLOAD}}},
            },
        )
        budget(policy, namespace, allowed=0)
        first = [f"{RS_NAME}-x2x4k", f"{RS_NAME}-q8wzn"]
        for name in first:
            make_pod(core, namespace, name, rs.metadata.uid, gpu_nodes[0], exporter)
        certs = tmp / "certs"
        subprocess.run(
            [sys.executable, "-m", "scheduler.cli.main", "certs", "--out", str(certs)],
            check=True,
            capture_output=True,
            cwd=REPO,
        )
        (tmp / "policy.yaml").write_text(
            f"""rightsize:
  prometheus_url: {purl}
  mode: recreate
  interval_seconds: 1
  lookback_seconds: 86400
  step_seconds: 60
  namespaces: [{namespace}]
  min_replicas: 2
  min_age_seconds: 0
  min_change: 0.1
  min_eviction_interval_seconds: 1
  policies:
    default: {{max_memory: 80Gi, gpu_memory: 80Gi}}
"""
        )
        tp = Topoplace(
            kubeconfig,
            RS_PORT,
            tmp,
            extra_args=(
                "--config",
                str(tmp / "policy.yaml"),
                "--webhook-port",
                str(WEBHOOK_PORT),
                "--webhook-cert",
                str(certs / "server.crt"),
                "--webhook-key",
                str(certs / "server.key"),
            ),
        )
        tp.start()
        tp.wait_ready()
        yield {
            "tp": tp,
            "exporter": exporter,
            "peak": peak,
            "rs_uid": rs.metadata.uid,
            "first": first,
            "ca": (certs / "ca.crt").read_bytes(),
            "policy": policy,
            "apps": apps,
            "node": gpu_nodes[0],
        }
    finally:
        if tp is not None:
            tp.kill(signal.SIGTERM)
        prom.send_signal(signal.SIGTERM)
        try:
            prom.wait(20)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait(5)
        plog.close()
        exporter.close()
        client.AdmissionregistrationV1Api(
            core.api_client
        ).delete_collection_mutating_webhook_configuration(
            label_selector=f"topoplace-it-ns={namespace}"
        )


def pod_template(node: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": WORKLOAD}},
        "spec": {
            "schedulerName": SCHEDULER,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "server",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": "1",
                            "nvidia.com/gpumem": str(ASKED_MIB),
                            "nvidia.com/gpucores": "100",
                        }
                    },
                }
            ],
        },
    }


def make_pod(core: Any, ns: str, name: str, rs_uid: str, node: str, exporter: Exporter) -> Any:
    """Create a pod of the ReplicaSet as its controller would, bind it, and report it
    Running and Ready as its kubelet would; returns the pod as created."""
    tpl = pod_template(node)
    body = {
        "metadata": {
            "name": name,
            "labels": tpl["metadata"]["labels"],
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": RS_NAME,
                    "uid": rs_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": tpl["spec"],
    }
    created = core.create_namespaced_pod(ns, body)
    core.create_namespaced_binding(
        ns,
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
        _preload_content=False,
    )
    core.patch_namespaced_pod_status(
        name,
        ns,
        {
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        },
    )
    limits = created.spec.containers[0].resources.limits
    exporter.pods[name] = int(limits.get("nvidia.com/gpumem", ASKED_MIB))
    return created


def budget(policy: Any, ns: str, allowed: int) -> None:
    """Write the PodDisruptionBudget's status as the disruption controller would."""
    pdb = policy.read_namespaced_pod_disruption_budget(WORKLOAD, ns)
    policy.patch_namespaced_pod_disruption_budget_status(
        WORKLOAD,
        ns,
        {
            "status": {
                "observedGeneration": pdb.metadata.generation,
                "disruptionsAllowed": allowed,
                "currentHealthy": 1 + allowed,
                "desiredHealthy": 1,
                "expectedPods": 2,
            }
        },
    )


def inspect(tp: Topoplace) -> dict[str, Any]:
    return tp.get("/v1/inspect/rightsize")


CLAIM_DRIVER = "gpu.rightsize.topoplace.io"
CLAIM_TEMPLATE = "gpu-share"


def test_template_claim_gets_the_size(
    stack: dict[str, Any], core: Any, namespace: str, kubeconfig: str
) -> None:
    """DRA consumable capacity (resource.k8s.io/v1, 1.34+): the real kube-apiserver calls the
    webhook for a ResourceClaim created from a pod's template, and the claim's
    ``capacity.requests.memory`` becomes the workload's size rounded to the device's
    requestPolicy. Runs before the Recreate test and removes what it made (its pod is never
    bound, so it is gone at once)."""
    from kubernetes import client

    from benchmarks.cluster.claims import template_claims
    from benchmarks.live.kubeapi import Api

    api = Api(kubeconfig)
    served = {
        v["version"]
        for g in (api.get("/apis") or {}).get("groups") or []
        if g.get("name") == "resource.k8s.io"
        for v in g.get("versions") or []
    }
    if "v1" not in served:
        pytest.skip(f"resource.k8s.io/v1 not served ({sorted(served)}): no consumable capacity")
    tp: Topoplace = stack["tp"]
    view = wait_for(lambda: (v := inspect(tp)) and v["workloads"] and v, 60, "a recommendation", 1)
    (rec,) = view["workloads"]
    assert rec["mode"] == "memory-share", rec["reason"]
    limit = rec["gpu_memory_limit_bytes"]
    want = f"{math.ceil(limit / GiB)}Gi"  # the device's requestPolicy: 1Gi steps
    cls_name, slice_name = f"rightsize-{namespace}", f"rightsize-{namespace}-gpus"
    adm = client.AdmissionregistrationV1Api(core.api_client)
    pod_name = f"{RS_NAME}-c1a1m"
    try:
        api.call(
            "POST",
            "/apis/resource.k8s.io/v1/deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": cls_name},
                "spec": {
                    "selectors": [{"cel": {"expression": f'device.driver == "{CLAIM_DRIVER}"'}}]
                },
            },
        )
        api.call(
            "POST",
            "/apis/resource.k8s.io/v1/resourceslices",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": slice_name},
                "spec": {
                    "driver": CLAIM_DRIVER,
                    "nodeName": f"rightsize-{namespace}-nowhere",
                    "pool": {"name": slice_name, "generation": 1, "resourceSliceCount": 1},
                    "devices": [
                        {
                            "name": "gpu-0",
                            "allowMultipleAllocations": True,
                            "capacity": {
                                "memory": {
                                    "value": "80Gi",
                                    "requestPolicy": {
                                        "default": "8Gi",
                                        "validRange": {"min": "1Gi", "step": "1Gi", "max": "80Gi"},
                                    },
                                }
                            },
                        }
                    ],
                },
            },
        )
        template = api.call(
            "POST",
            f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": CLAIM_TEMPLATE},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {
                                        "deviceClassName": cls_name,
                                        "capacity": {"requests": {"memory": "75Gi"}},
                                    },
                                }
                            ]
                        }
                    }
                },
            },
        )
        caps = template["spec"]["spec"]["devices"]["requests"][0]["exactly"].get("capacity")
        if not caps:
            pytest.skip("this API server drops capacity requests (DRAConsumableCapacity off)")
        adm.create_mutating_webhook_configuration(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {
                    "name": f"topoplace-rightsize-claims-{namespace}",
                    "labels": {"topoplace-it-ns": namespace},
                },
                "webhooks": [
                    {
                        "name": "claims.rightsize.topoplace.io",
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "failurePolicy": "Ignore",
                        "timeoutSeconds": 2,
                        "reinvocationPolicy": "Never",
                        "matchPolicy": "Equivalent",
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{WEBHOOK_PORT}/mutate/rightsize",
                            "caBundle": base64.b64encode(stack["ca"]).decode(),
                        },
                        "namespaceSelector": {"matchLabels": {OPT_IN: "enabled"}},
                        "rules": [
                            {
                                "apiGroups": ["resource.k8s.io"],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE"],
                                "resources": ["resourceclaims"],
                                "scope": "Namespaced",
                            }
                        ],
                    }
                ],
            }
        )
        core.patch_namespace(namespace, {"metadata": {"labels": {OPT_IN: "enabled"}}})
        # the pod of the workload naming the template (never bound: nobody schedules it)
        pod = api.call(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod_name,
                    "labels": {"app-claims": WORKLOAD},
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "ReplicaSet",
                            "name": RS_NAME,
                            "uid": stack["rs_uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": {
                    "schedulerName": SCHEDULER,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "server",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                    "resourceClaims": [
                        {"name": "gpu", "resourceClaimTemplateName": CLAIM_TEMPLATE}
                    ],
                },
            },
        )
        # the claim the resourceclaim controller creates for it (the cluster's stand-in
        # builds the controller's body; the create goes through the real API server)
        (new,), _ = template_claims([pod], [], {(namespace, CLAIM_TEMPLATE): template}, "v1")
        claims_path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"

        def dry_run_rounded() -> bool:  # the requestPolicy is read every 10 s
            got = api.call("POST", claims_path, new.body, params={"dryRun": "All"})
            return (
                got["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"]
                == want
            )

        wait_for(dry_run_rounded, 40, f"the webhook writing {want} into a dry-run claim", 1)
        claim = api.call("POST", claims_path, new.body)
        exactly = claim["spec"]["devices"]["requests"][0]["exactly"]
        assert exactly["capacity"]["requests"]["memory"] == want
        assert exactly["deviceClassName"] == cls_name
        meta = claim["metadata"]
        assert meta["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
        applied = json.loads(meta["annotations"][OPT_IN])
        assert applied["workload"] == f"{namespace}/{WORKLOAD}"
        assert applied["pod"] == f"{namespace}/{pod_name}"
        assert applied["backend"] == "dra-capacity" and applied["gpu_memory_limit_bytes"] == limit
        assert "requestPolicy (min 1Gi step 1Gi max 80Gi)" in applied["reason"]
        print(
            f"\nrightsize claim live: template asked 75Gi, claim {meta['name']} got {want} "
            f"({limit / GiB:.2f} GiB recommended, rounded to the 1Gi step)"
        )
    finally:
        api.call(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods/{pod_name}",
            params={"gracePeriodSeconds": "0"},
            ok=(404,),
        )
        api.call(
            "DELETE", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims", ok=(404,)
        )
        api.call(
            "DELETE",
            f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates/{CLAIM_TEMPLATE}",
            ok=(404,),
        )
        api.call("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{slice_name}", ok=(404,))
        api.call("DELETE", f"/apis/resource.k8s.io/v1/deviceclasses/{cls_name}", ok=(404,))
        adm.delete_collection_mutating_webhook_configuration(
            field_selector=f"metadata.name=topoplace-rightsize-claims-{namespace}"
        )
        api.close()


def test_rightsizer_live(stack: dict[str, Any], core: Any, namespace: str) -> None:
    from kubernetes import client

    tp: Topoplace = stack["tp"]
    wl = f"{namespace}/{WORKLOAD}"
    # 1. the recommendation, from a day of recorded HAMi series read from Prometheus
    view = wait_for(lambda: (v := inspect(tp)) and v["workloads"] and v, 60, "a recommendation", 1)
    (rec,) = view["workloads"]
    assert rec["workload"] == wl
    peak = stack["peak"]
    limit = rec["gpu_memory_limit_bytes"]
    # peak x 1.15 x (1 + 1/c)^0.2016 with c ~ 0.95 days of history: 1.33x the peak
    assert 1.25 * peak <= limit <= 1.40 * peak, (limit / GiB, peak / GiB, rec["reason"])
    assert "days of history" in rec["reason"]
    assert rec["mode"] == "memory-share", rec["reason"]
    assert limit < ASKED_MIB * MiB
    metrics = httpx.get(tp.url + "/metrics", timeout=5).text
    line = (
        f'topoplace_rightsize_memory_bytes{{container="server",namespace="{namespace}",'
        f'workload="{WORKLOAD}"}}'
    )
    assert any(
        ln.startswith(line) and math.isclose(float(ln.split()[-1]), limit)
        for ln in metrics.splitlines()
    ), metrics[-3000:]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler.cli.main",
            "explain",
            f"{namespace}/{stack['first'][0]}",
            "--url",
            tp.url,
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    explained = json.loads(out.stdout)
    assert explained["rightsize"]["gpu_memory_limit_bytes"] == limit
    assert explained["rightsize"]["reason"] == rec["reason"]
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler.cli.main",
            "rightsize",
            "show",
            f"{namespace}/{stack['first'][0]}",
            "--url",
            tp.url,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"-> {wl}: {limit / GiB:.1f} GiB GPU memory" in shown.stdout
    assert rec["reason"] in shown.stdout
    apps = stack["apps"]
    note = wait_for(
        lambda: (
            apps.read_namespaced_replica_set(RS_NAME, namespace).metadata.annotations or {}
        ).get(OPT_IN),
        30,
        "the recommendation on the ReplicaSet",
    )
    assert json.loads(note)["gpu_memory_limit_bytes"] == limit

    # 2. Recreate under a budget that allows no disruption: refused, counted, nothing goes
    wait_for(lambda: inspect(tp)["evictions"].get("blocked", 0) >= 2, 30, "blocked evictions")
    names = {p.metadata.name for p in core.list_namespaced_pod(namespace).items}
    assert set(stack["first"]) <= names

    # 3. the webhook, registered with the run's CA, opt-in by namespace label
    adm = client.AdmissionregistrationV1Api(core.api_client)
    adm.create_mutating_webhook_configuration(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {
                "name": f"topoplace-rightsize-{namespace}",
                "labels": {"topoplace-it-ns": namespace},
            },
            "webhooks": [
                {
                    "name": "rightsize.topoplace.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Ignore",
                    "timeoutSeconds": 2,
                    "reinvocationPolicy": "Never",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{WEBHOOK_PORT}/mutate/rightsize",
                        "caBundle": base64.b64encode(stack["ca"]).decode(),
                    },
                    "namespaceSelector": {"matchLabels": {OPT_IN: "enabled"}},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                            "scope": "Namespaced",
                        }
                    ],
                }
            ],
        }
    )
    core.patch_namespace(namespace, {"metadata": {"labels": {OPT_IN: "enabled"}}})
    want_mib = str(math.ceil(limit / MiB))

    def dry_run_sized() -> bool:
        tpl = pod_template(stack["node"])
        body = {
            "metadata": {
                "name": f"{RS_NAME}-probe",
                "labels": tpl["metadata"]["labels"],
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": RS_NAME,
                        "uid": stack["rs_uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": tpl["spec"],
        }
        got = core.create_namespaced_pod(namespace, body, dry_run="All")
        return got.spec.containers[0].resources.limits.get("nvidia.com/gpumem") == want_mib

    wait_for(dry_run_sized, 30, "the API server calling the webhook (dry run)")

    # 4. one Recreate: the budget allows one disruption; exactly one pod goes
    budget(stack["policy"], namespace, allowed=1)
    gone = wait_for(
        lambda: (
            set(stack["first"])
            - {p.metadata.name for p in core.list_namespaced_pod(namespace).items}
        ),
        30,
        "one pod evicted",
    )
    assert len(gone) == 1
    time.sleep(3)  # the other pod is tried again and refused: the API used the one disruption
    names = {p.metadata.name for p in core.list_namespaced_pod(namespace).items}
    assert len(set(stack["first"]) & names) == 1
    view = inspect(tp)
    assert view["evictions"]["evicted"] == 1
    # the replacement the ReplicaSet controller would create: right-sized by the webhook
    new = make_pod(
        core, namespace, f"{RS_NAME}-r3pl4", stack["rs_uid"], stack["node"], stack["exporter"]
    )
    limits = new.spec.containers[0].resources.limits
    assert limits["nvidia.com/gpumem"] == want_mib
    assert limits["nvidia.com/gpucores"] == str(max(1, round(rec["gpu_compute_ratio"] * 100)))
    applied = json.loads(new.metadata.annotations[OPT_IN])
    assert applied["workload"] == wl and applied["backend"] == "hami"
    # two live pods again; the remaining 75 GiB pod is next, but the budget is spent
    blocked = inspect(tp)["evictions"].get("blocked", 0)
    wait_for(
        lambda: inspect(tp)["evictions"].get("blocked", 0) > blocked, 30, "the next try refused"
    )
    assert inspect(tp)["evictions"]["evicted"] == 1

    # 5. the webhook down: pod creation is not blocked, the pod is created unchanged
    tp.kill(signal.SIGTERM)
    t0 = time.monotonic()
    tpl = pod_template(stack["node"])
    plain = core.create_namespaced_pod(
        namespace,
        {
            "metadata": {
                "name": f"{RS_NAME}-d0wn1",
                "labels": tpl["metadata"]["labels"],
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": RS_NAME,
                        "uid": stack["rs_uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": tpl["spec"],
        },
    )
    took = time.monotonic() - t0
    assert plain.spec.containers[0].resources.limits["nvidia.com/gpumem"] == str(ASKED_MIB)
    assert OPT_IN not in (plain.metadata.annotations or {})
    assert took < 5, took
    print(
        f"\nrightsize live: peak {peak / GiB:.1f} GiB -> {limit / GiB:.1f} GiB ({rec['reason']}); "
        f"asked {ASKED_MIB} MiB, webhook wrote {want_mib} MiB; evicted {sorted(gone)}; "
        f"create with the webhook down took {took * 1000:.0f} ms"
    )
