"""The cluster view without a browser: what ``/v1/inspect/view`` says about the demo
cluster, how ``/ui`` is served (self-contained, same port and transport as the inspect
API), and that its files ship in the package."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import httpx
import orjson

from scheduler.cli.demo import ServerThread
from scheduler.cli.main import HEALTH_PATHS
from scheduler.server import ui
from tests.ui.helpers import GANG, bind_gang, demo_app, gang_pods, node_names

REPO = Path(__file__).resolve().parents[2]


def _group(root: dict, level: str) -> list[dict]:
    found = [root] if root["level"] == level else []
    for c in root["children"]:
        found += _group(c, level)
    return found


def test_view_model_of_the_demo_cluster() -> None:
    with ServerThread(demo_app()) as srv, httpx.Client(base_url=srv.url, timeout=30) as client:
        v = client.get("/v1/inspect/view").json()
        assert v["levels"] == ["spine", "leaf", "nvlink-domain"]
        (rack,) = _group(v["root"], "nvlink-domain")
        trays = [v["nodes"][i]["name"] for i in rack["nodes"]]
        assert trays == [f"gb200-r000-t{i:02d}" for i in range(18)]
        by_name = {n["name"]: n for n in v["nodes"]}
        xid = by_name["gb200-r000-t05"]
        assert xid["health"] == "unhealthy" and xid["reasons"] == ["GPU fault condition"]
        assert by_name["dgx-h100-04"]["cordoned"] is True
        assert by_name["dgx-h100-03"]["reasons"][0] == "node not ready"
        # A cordoned GPU is marked on a node that stays usable.
        v100 = by_name["dgx1-v100-02"]
        assert v100["health"] == "degraded" and [v100["gpus"][i] for i in v100["bad"]] == [
            ui.GPU_BAD
        ] * len(v100["bad"])
        # Bound pods hold their GPUs in the model.
        pods = {p["key"]: p for p in v["pods"]}
        assert pods["ml-train/llama-ft-0"]["gpus"] == [0, 1, 2, 3]
        assert by_name["dgx-h100-01"]["gpus"][:4] == [ui.GPU_BOUND] * 4

        # The first member's filter plans the whole gang: the other slots show as reserved.
        names = node_names(client)
        first = gang_pods()[0]
        client.post("/scheduler/filter", content=orjson.dumps({"Pod": first, "NodeNames": names}))
        v = client.get("/v1/inspect/view").json()
        reserved = [p for p in v["pods"] if p["state"] == "reserved"]
        assert len(reserved) == 2 and {p["gang"] for p in reserved} == {GANG}
        assert GANG in v["gangs"]
        for p in reserved:
            node = next(n for n in v["nodes"] if n["name"] == p["node"])
            assert [node["gpus"][g] for g in p["gpus"]] == [ui.GPU_RESERVED] * len(p["gpus"])
        held = bind_gang(client, names)
        v = client.get("/v1/inspect/view").json()
        bound = [p for p in v["pods"] if p["gang"] == GANG]
        assert {p["state"] for p in bound} == {"bound"} and {p["node"] for p in bound} == set(held)


def test_ui_is_self_contained_and_not_on_the_health_port() -> None:
    with ServerThread(demo_app()) as srv, httpx.Client(base_url=srv.url, timeout=30) as client:
        page = client.get("/ui")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        for name in ui.FILES:
            r = client.get(f"/ui/{name}")
            assert r.status_code == 200 and r.headers["content-type"] == ui.FILES[name]
            # Nothing fetched from elsewhere: no absolute URLs, no inline script or style.
            assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", r.text, re.I), name
        assert "<script>" not in page.text and "style=" not in page.text
        assert client.get("/ui/../app.py").status_code == 404
        assert client.get("/ui/secret.txt").status_code == 404
    assert not {"/ui", "/v1/inspect/view"} & HEALTH_PATHS


def test_ui_files_ship_in_the_package() -> None:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = cfg["tool"]["setuptools"]["package-data"]["scheduler.server.ui"]
    for name in ui.FILES:
        assert any(Path(name).match(g) for g in globs), name
        assert ui.asset(name)  # read through importlib.resources, as an installed wheel is


def test_fractional_shares_show_as_shared_gpus() -> None:
    """A fractional pod bound on one of the demo's HAMi nodes shows its GPU as a share
    (state ``shared``), with the memory and compute it holds; whole GPUs stay ``bound``."""
    from tests.sharing.builders import share_pod
    from tests.ui.helpers import schedule

    with ServerThread(demo_app()) as srv, httpx.Client(base_url=srv.url, timeout=30) as client:
        names = node_names(client)
        pod = share_pod("llm-a", mem=4000, cores=30)
        node = schedule(client, pod, names)
        assert node.startswith("infer-")
        v = client.get("/v1/inspect/view").json()
        (held,) = [p for p in v["pods"] if p["key"] == "infer/llm-a"]
        assert held["state"] == "shared" and held["node"] == node
        ((gpu, mem, milli),) = held["shares"]
        assert mem == 4000 and milli == 300 and held["gpus"] == [gpu]
        tile = next(n for n in v["nodes"] if n["name"] == node)
        assert tile["gpus"][gpu] == ui.GPU_SHARED
        assert v["gpu_states"][ui.GPU_SHARED] == "shared"
        assert tile["gpus"].count(ui.GPU_SHARED) == 1
