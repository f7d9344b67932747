"""``topoplace demo``: a scripted kube-scheduler conversation over real HTTP.

Starts the extender in-process (uvicorn on a free loopback port) on the embedded demo
cluster, then plays kube-scheduler: for each pending pod it POSTs ``filter`` with every
node name (``nodeCacheCapable: true``), ``prioritize`` when at least two nodes are
feasible, picks the best score (ties by name; kube-scheduler would pick at random) and
POSTs ``bind``. It prints one row per pod: where it went, on which GPUs, and why the
other nodes were rejected.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from typing import Any

import httpx
import orjson

from benchmarks.clusters import make_pod


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    """uvicorn serving an ASGI app on 127.0.0.1 in a background thread (context manager)."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        import uvicorn

        self.port = port or free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("extender did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def scripted_pods() -> list[tuple[str, dict[str, Any]]]:
    """The pods the demo schedules, with what each shows."""
    return [
        ("single GPU", make_pod("notebook-1", 1, namespace="research")),
        ("single GPU again", make_pod("notebook-2", 1, namespace="research")),
        ("4 GPUs, best NVLink set", make_pod("llama-ft-1", 4, namespace="ml-train")),
        ("2 GPUs, fastest pair on the fullest node", make_pod("embed-1", 2, namespace="ml-serve")),
        (
            "8 GPUs over NVLink only",
            make_pod(
                "gpt-pretrain-0",
                8,
                namespace="ml-train",
                annotations={"topoplace.io/min-link": "nvlink"},
            ),
        ),
        (
            "4 GB200 GPUs (away from the XID tray)",
            make_pod(
                "moe-infer-0",
                4,
                namespace="ml-serve",
                annotations={"topoplace.io/min-link": "nvlink"},
                node_selector={"nvidia.com/gpu.product": "NVIDIA-GB200"},
            ),
        ),
        ("16 GPUs in one pod (fits nowhere)", make_pod("too-big-0", 16, namespace="ml-train")),
    ]


def _schedule(client: httpx.Client, names: list[str], pod: dict[str, Any]) -> dict[str, Any]:
    args = {"Pod": pod, "Nodes": None, "NodeNames": names}
    f = client.post("/scheduler/filter", content=orjson.dumps(args)).json()
    feasible = f["NodeNames"] or []
    row: dict[str, Any] = {
        "feasible": len(feasible),
        "failed": dict(f["FailedNodes"] or {}),
        "unresolvable": dict(f["FailedAndUnresolvableNodes"] or {}),
        "error": f["Error"],
        "node": "",
        "gpus": [],
        "score": None,
    }
    if f["Error"] or not feasible:
        return row
    if len(feasible) >= 2:
        scores = client.post(
            "/scheduler/prioritize", content=orjson.dumps({**args, "NodeNames": feasible})
        ).json()
        best = min(scores, key=lambda s: (-s["Score"], s["Host"]))
        row["node"], row["score"] = best["Host"], best["Score"]
    else:
        row["node"] = feasible[0]
    m = pod["metadata"]
    b = client.post(
        "/scheduler/bind",
        content=orjson.dumps(
            {
                "PodName": m["name"],
                "PodNamespace": m["namespace"],
                "PodUID": m["uid"],
                "Node": row["node"],
            }
        ),
    ).json()
    row["error"] = b["Error"]
    placements = client.get("/v1/inspect/placements").json()["placements"]
    key = f"{m['namespace']}/{m['name']}"
    row["gpus"] = next((p["gpus"] for p in placements if p["pod"] == key), [])
    return row


def _reasons(row: dict[str, Any]) -> str:
    c = Counter(row["failed"].values())
    c.update(row["unresolvable"].values())
    return "; ".join(f"{n}x {r}" for r, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def run_demo(cluster: str | None = None, as_json: bool = False) -> int:
    """Run the demo; returns 0 when every scripted step behaved, 1 otherwise."""
    from scheduler.cli.main import build_file_extender, load_params
    from scheduler.server.app import create_app

    logging.getLogger("httpx").setLevel(logging.WARNING)
    params = load_params(None)
    extender, what = build_file_extender(cluster, params)
    app = create_app(extender, description=what)
    rows = []
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        names = [
            n["metadata"]["name"]
            for n in client.get("/v1/inspect/snapshot").json()["items"]
            if n["kind"] == "Node"
        ]
        for what_it_shows, pod in scripted_pods():
            row = _schedule(client, names, pod)
            row["pod"] = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            row["what"] = what_it_shows
            row["request"] = int(
                pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
            )
            rows.append(row)
        nodes_info = client.get("/v1/inspect/nodes").json()
    if as_json:
        print(
            orjson.dumps({"cluster": what, "decisions": rows}, option=orjson.OPT_INDENT_2).decode()
        )
        return 0
    print(
        f"topoplace demo on the {what}: {len(names)} nodes, "
        f"{nodes_info['assumed_topology_nodes']} with unknown interconnect (treated as all-SYS)\n"
    )
    header = f"{'pod':<24} {'gpus':>4}  {'placed on':<16} {'GPU ids':<12} {'score':>5}  {'feasible':>8}  what it shows"
    print(header)
    print("-" * len(header))
    for r in rows:
        gpus = ",".join(map(str, r["gpus"])) if r["gpus"] else "-"
        print(
            f"{r['pod']:<24} {r['request']:>4}  {r['node'] or 'UNSCHEDULABLE':<16} {gpus:<12} "
            f"{'' if r['score'] is None else r['score']:>5}  {r['feasible']:>8}  {r['what']}"
        )
    print("\nwhy nodes were rejected:")
    for r in rows:
        print(f"  {r['pod']:<24} {_reasons(r) or '-'}")
    return 0
