"""Set-up shared by the benchmarks that need a real API server (``bind_client``,
``watch_cpu``): the client and its nodes, and the benchmark's namespace."""

from __future__ import annotations

import argparse

import orjson

from scheduler.kube.client import NODES, ApiError, KubeApi


def connect(
    ap: argparse.ArgumentParser, kubeconfig: str | None, namespace: str
) -> tuple[KubeApi, list[str]]:
    """A client of the cluster ``kubeconfig`` names and its node names, with
    ``namespace`` created if it is not there; ``ap.error`` (exit) without a kubeconfig or
    without nodes."""
    if not kubeconfig:
        ap.error("needs --kubeconfig or KUBECONFIG (a real API server)")
    api = KubeApi.from_config(kubeconfig)
    nodes = [n["metadata"]["name"] for n in api.list(NODES).get("items", [])]
    if not nodes:
        ap.error("the cluster has no nodes (run ../shared/controlplane/fake_nodes.py)")
    try:
        api._post_json("/api/v1/namespaces", orjson.dumps({"metadata": {"name": namespace}}))
    except ApiError as exc:
        if exc.status != 409:
            raise
    return api, nodes
