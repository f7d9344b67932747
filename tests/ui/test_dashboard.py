"""The Grafana dashboard queries only series topoplace exports, and /metrics carries no
``_created`` series."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.clusters import make_pod
from scheduler.cli.demo import ServerThread, scripted_pods
from tests.helpers import fixture
from tests.ui.helpers import node_names, schedule

DASHBOARD = Path(__file__).resolve().parents[2] / "config" / "grafana" / "topoplace.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def _queried() -> set[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert exprs
    return {m for e in exprs for m in re.findall(r"\btopoplace_[a-z_]+\b", e)}


def _app_with_kube_series() -> object:
    """The demo app, with the series kube mode adds to the same registry
    (``scheduler/kube/runner.py``: watches, binds, remediation), as a live extender has."""
    from scheduler.cli.main import build_file_extender, load_params
    from scheduler.kube.metrics import KubeMetrics
    from scheduler.server.app import create_app

    ext, what = build_file_extender(None, load_params(None))
    KubeMetrics(ext.metrics.registry)
    return create_app(ext, description=what)


def test_every_dashboard_series_is_exported_and_no_created_series() -> None:
    app = _app_with_kube_series()
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as client:
        names = node_names(client)
        for _, pod in scripted_pods():  # single pods, a gang and a pod that fits nowhere
            schedule(client, pod, names)
        bad = make_pod("bad-request", 1)
        bad["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "lots"
        f = client.post("/scheduler/filter", content=orjson.dumps({"Pod": bad, "NodeNames": names}))
        assert f.json()["Error"].startswith("invalid pod")
        # kube-scheduler's preemption for a pod of the shared fixtures: its candidate node
        # is not in the demo cluster, so nothing is preempted (answer "none")
        pre = client.post("/scheduler/preempt", content=orjson.dumps(fixture("preempt_args.json")))
        assert pre.json() == {"NodeNameToMetaVictims": {}}
        text = client.get("/metrics").text
    exported: dict[str, str] = {}
    with_samples: set[str] = set()
    for fam in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(fam.type, ("",)):
            exported[fam.name + suffix] = fam.type
        with_samples.update(s.name for s in fam.samples)
    queried = _queried()
    missing = sorted(queried - set(exported))
    assert not missing, f"the dashboard queries series /metrics does not export: {missing}"
    # After the demo's traffic nearly every queried series has samples; evictions and
    # re-placements happen only after hardware faults, which the demo does not inject,
    # victims only when a preemption names some, and topoplace starts preemptions only for
    # fractional pods refused for GPU memory in kube mode.
    assert sorted(queried - with_samples) == [
        "topoplace_preemption_victims_total",
        "topoplace_remediation_evictions_total",
        "topoplace_replacement_seconds_bucket",
        "topoplace_replacements_total",
        "topoplace_started_preemptions_total",
    ]
    assert "_created" not in text
    # The series the issue asks for are there, with the labels the panels group by.
    assert re.search(
        r'topoplace_free_gpus_by_domain\{domain="bdb0c376[^"]*",product="NVIDIA-GB200"\}', text
    )
    assert 'topoplace_nodes_by_health{state="unhealthy"} 2.0' in text
    assert re.search(r"topoplace_gang_plan_seconds_count 1\.0", text)
    assert re.search(r"topoplace_gang_wait_seconds_count 1\.0", text)


def test_dashboard_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert any(v["type"] == "datasource" for v in dash["templating"]["list"])
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
