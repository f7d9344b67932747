"""The cluster view in a real browser: headless Chromium (Debian's ``chromium``, driven by
Playwright's Python API through its executable path) on the demo cluster.

Skipped, with the reason, where Playwright or Chromium is missing (``.ci/run`` installs
both). The screenshot goes to ``$TOPOPLACE_ARTIFACTS`` (default: ``artifacts/`` at the repository root, git-ignored).
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from benchmarks.micro.ui_render import browser_missing, chromium, wait_drawn
from scheduler.cli.demo import ServerThread
from tests.ui.helpers import GANG, bind_gang, demo_app, node_names

pytestmark = pytest.mark.skipif(bool(browser_missing()), reason=browser_missing() or "ok")

XID_TRAY = "gb200-r000-t05"


def test_demo_cluster_view_in_chromium(tmp_path: Path) -> None:
    artifacts = Path(
        os.environ.get("TOPOPLACE_ARTIFACTS") or Path(__file__).resolve().parents[2] / "artifacts"
    )
    artifacts.mkdir(parents=True, exist_ok=True)
    with (
        ServerThread(demo_app()) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as client,
        chromium() as browser,
    ):
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(srv.url + "/ui")
        first = wait_drawn(page)
        assert first["nodes"] == 28  # the demo cluster (two of them HAMi inference nodes)

        # The NVL72 rack is one NVLink domain group holding its 18 trays.
        rack = page.locator('section.group[data-level="nvlink-domain"]')
        assert rack.count() == 1
        trays = rack.locator(".node")
        assert trays.count() == 18
        names = trays.evaluate_all("els => els.map(e => e.dataset.node)")
        assert names == [f"gb200-r000-t{i:02d}" for i in range(18)]
        assert "18 nodes" in rack.locator(":scope > .gh").inner_text()
        assert rack.locator(".node .gpu").count() == 72

        # The tray with the XID fault is marked unhealthy, and only that tray of the rack.
        xid = page.locator(f'.node[data-node="{XID_TRAY}"]')
        assert xid.get_attribute("data-health") == "unhealthy"
        assert "unhealthy" in (xid.get_attribute("class") or "")
        assert "GPU fault condition" in xid.locator(".badge").inner_text()
        unhealthy = rack.locator('.node[data-health="unhealthy"]')
        assert unhealthy.evaluate_all("els => els.map(e => e.dataset.node)") == [XID_TRAY]

        # Bind a gang through the verbs; the page refreshes itself and shows it.
        held = bind_gang(client, node_names(client))
        gen = client.get("/v1/inspect/view").json()["generation"]
        assert gen > first["generation"]
        wait_drawn(page, generation=gen, timeout_ms=30_000)  # the 5 s auto-refresh
        cells = page.locator(f'.gpu[data-gang="{GANG}"]')
        assert cells.count() == sum(len(g) for g in held.values()) == 8
        assert page.locator(".gpu.hl").count() == 0  # nothing highlighted yet

        # Hovering one of its GPUs outlines the whole gang; clicking selects it.
        cells.first.hover()
        assert page.locator(".gpu.hover").count() == 8
        cells.first.click()
        assert page.locator("#f-gang").input_value() == GANG
        assert page.locator(".gpu.hl").count() == 8
        lit = page.locator(".node.hl-node").evaluate_all("els => els.map(e => e.dataset.node)")
        assert sorted(lit) == sorted(held)
        # The side panel explains the clicked member's placement from its decision record.
        page.wait_for_function(
            "() => !document.querySelector('#panel pre').textContent.startsWith('asking')"
        )
        assert f"gang {GANG}" in page.locator("#panel").inner_text()

        shot = artifacts / "ui-demo-cluster.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        assert not errors, errors
