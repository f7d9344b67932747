"""``ui-render``: cluster view render time in a real browser.

Serves the extender on a synthetic cluster (``synthetic_cluster``: NVL72 racks, DGX H100,
DGX-1 V100; 40 % of nodes half used) over loopback HTTP, loads ``GET /ui`` in headless
Chromium (Debian's ``chromium`` driven by Playwright's Python API through its executable
path; ``playwright install`` is never needed) and reads the page's own measurement:
milliseconds from navigation start until the view is drawn, laid out and a frame has
been painted (``window.topoplaceView.sinceNavigationMs``: HTML, script, the
``/v1/inspect/view`` fetch and the drawing). Each run is a fresh page (a new browser
context, no cache). Figures: median and p99, for the default view
(aggregated above 300 nodes) and for one group zoomed into.

``topoplace bench ui-render [--nodes 2000] [--runs 20]``. ``--screenshot FILE`` also saves
a screenshot of the last run's default view; ``--demo-screenshot FILE`` only saves the view of the demo cluster after the demo's steps
(the screenshots in ``docs/``).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.registry import Figures

CHROMIUM = os.environ.get("TOPOPLACE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def browser_missing() -> str:
    """Why the browser tests and this benchmark cannot run here ("" when they can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; see .ci/run)"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (apt-get install -y chromium; see .ci/run)"
    return ""


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless system Chromium driven by Playwright (context manager: the browser)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=list(CHROMIUM_FLAGS)
        )
        try:
            yield browser
        finally:
            browser.close()


def wait_drawn(page: Any, generation: int | None = None, timeout_ms: float = 60_000) -> Any:
    """Wait until the page has drawn the view (of ``generation`` when given); returns the
    page's measurement (``window.topoplaceView``)."""
    if generation is None:
        page.wait_for_function("() => window.topoplaceView !== undefined", timeout=timeout_ms)
    else:
        page.wait_for_function(
            f"() => window.topoplaceView && window.topoplaceView.generation === {generation}",
            timeout=timeout_ms,
        )
    return page.evaluate("() => window.topoplaceView")


def serve_synthetic(nodes: int) -> Any:
    """An extender app over ``synthetic_cluster(nodes)`` (and a description)."""
    from benchmarks.clusters import synthetic_cluster
    from scheduler.cli.main import load_params
    from scheduler.runtime.cache import ClusterCache
    from scheduler.runtime.gangs import GangRuntime
    from scheduler.server.app import create_app
    from scheduler.server.extender import Extender

    params = load_params(None)
    obj = synthetic_cluster(nodes)
    ns = [i for i in obj["items"] if i["kind"] == "Node"]
    ps = [i for i in obj["items"] if i["kind"] == "Pod"]
    ext = Extender(ClusterCache.from_objects(ns, ps, params), gangs=GangRuntime())
    return create_app(ext, description=f"synthetic cluster of {nodes} nodes")


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def measure(url: str, runs: int, zoom: str = "", screenshot: str = "") -> list[dict[str, Any]]:
    """``runs`` fresh page loads of ``url`` (``#g=zoom`` when given); the page's figures."""
    out = []
    with chromium() as browser:
        for i in range(runs):
            ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
            page = ctx.new_page()
            page.goto(url + (f"#g={zoom}" if zoom else ""))
            fig = wait_drawn(page)
            out.append(fig)
            if screenshot and i == runs - 1:
                page.screenshot(path=screenshot, full_page=False)
            ctx.close()
    return out


def demo_screenshot(path: str, gang: str = "ml-train/llama-pt") -> None:
    """Screenshot of the view of the demo cluster after the demo's steps, ``gang``
    selected and one member's decision in the side panel (docs/ui-demo-cluster.png)."""
    import httpx

    from scheduler.cli import demo
    from scheduler.cli.main import build_file_extender, load_params
    from scheduler.server.app import create_app

    ext, what = build_file_extender(None, load_params(None))
    with demo.ServerThread(create_app(ext, description=what)) as srv, chromium() as browser:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            names = list(ext.cache.snapshot().names)
            for _, pod in demo.scripted_pods():
                demo._schedule(client, names, pod)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(srv.url + "/ui")
        wait_drawn(page)
        page.locator(f'.gpu[data-gang="{gang}"]').first.click()
        page.wait_for_function(
            "() => !document.querySelector('#panel pre').textContent.startsWith('asking')"
        )
        page.screenshot(path=path, full_page=True)


def add_arguments(ap: Any) -> None:
    """``--nodes``, screenshots (the runner adds ``--runs``: page loads per case, default 20)."""
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--screenshot", default="", help="save the default view here (PNG)")
    ap.add_argument(
        "--demo-screenshot", default="", help="only save the demo cluster's view here (PNG)"
    )


def run(args: argparse.Namespace) -> Figures | int:
    """Render times of the default view and of one group zoomed into; 2 without a browser,
    0 after ``--demo-screenshot`` alone."""
    why = browser_missing()
    if why:
        print(f"ui-render: cannot run: {why}", file=sys.stderr)
        return 2
    if args.demo_screenshot:
        demo_screenshot(args.demo_screenshot)
        return 0
    import httpx

    from scheduler.cli.demo import ServerThread

    runs = args.runs or 20
    app = serve_synthetic(args.nodes)
    with ServerThread(app) as srv:
        model = httpx.get(srv.url + "/v1/inspect/view", timeout=60).json()
        first = model["root"]["children"][0]["id"] if model["root"]["children"] else ""
        time.sleep(0.2)
        cases = {
            "default view": measure(srv.url + "/ui", runs, screenshot=args.screenshot),
            f"zoomed into {first}": measure(srv.url + "/ui", runs, zoom=first),
        }
        body = len(httpx.get(srv.url + "/v1/inspect/view", timeout=60).content)
    from importlib.metadata import version

    rows = []
    for name, figs in cases.items():
        ms = [f["sinceNavigationMs"] for f in figs]
        rows.append((name, statistics.median(ms), _pct(ms, 0.99), max(ms), figs[-1]["elements"]))
    return Figures(
        "Cluster view render time in headless Chromium (ms from navigation to painted)",
        ("case", "median ms", "p99 ms", "max ms", "DOM elements"),
        rows,
        {
            "nodes": f"{args.nodes} (synthetic_cluster)",
            "runs per case": runs,
            "browser": f"Chromium {CHROMIUM} headless via Playwright {version('playwright')}, "
            "fresh context each",
            "view model KiB": round(body / 1024),
            "python": platform.python_version(),
        },  # fmt: skip
    )
