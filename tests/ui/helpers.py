"""Shared by the cluster view tests: the demo cluster served over HTTP, and a gang bound
through the extender's own verbs (filter then bind, as kube-scheduler does)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from benchmarks.clusters import make_pod

GANG = "ml-train/llama"
GB200 = {"nvidia.com/gpu.product": "NVIDIA-GB200"}


def demo_app() -> Any:
    """The extender app over the embedded demo cluster (a fresh cache each call)."""
    from scheduler.cli.main import build_file_extender, load_params
    from scheduler.server.app import create_app

    ext, what = build_file_extender(None, load_params(None))
    return create_app(ext, description=what)


def node_names(client: httpx.Client) -> list[str]:
    return [n["name"] for n in client.get("/v1/inspect/nodes").json()["nodes"]]


def schedule(client: httpx.Client, pod: dict[str, Any], names: list[str]) -> str:
    """filter + bind one pod as kube-scheduler would; returns the node ("" if none)."""
    f = client.post("/scheduler/filter", content=orjson.dumps({"Pod": pod, "NodeNames": names}))
    feasible = f.json()["NodeNames"] or []
    if not feasible:
        return ""
    m = pod["metadata"]
    b = client.post(
        "/scheduler/bind",
        content=orjson.dumps(
            {
                "PodName": m["name"],
                "PodNamespace": m["namespace"],
                "PodUID": m["uid"],
                "Node": feasible[0],
            }
        ),
    ).json()
    assert b["Error"] == "", b
    return str(feasible[0])


def gang_pods(size: int = 2, gpus: int = 4) -> list[dict[str, Any]]:
    """A gang of ``size`` members of ``gpus`` GPUs each on the GB200 rack."""
    ns, name = GANG.split("/")
    return [
        make_pod(
            f"{name}-{i}",
            gpus,
            namespace=ns,
            gang=name,
            gang_size=size,
            node_selector=GB200,
        )
        for i in range(size)
    ]


def bind_gang(client: httpx.Client, names: list[str]) -> dict[str, list[int]]:
    """Bind the gang; returns node -> GPU indices it holds there."""
    nodes = [schedule(client, p, names) for p in gang_pods()]
    assert all(nodes), nodes
    held: dict[str, list[int]] = {}
    for p in client.get("/v1/inspect/placements").json()["placements"]:
        if p["gang"] == GANG:
            held.setdefault(p["node"], []).extend(p["gpus"])
    return held
