"""Set-up shared by the benchmarks that need a real API server (``bind_client``,
``watch_cpu``): the client and its nodes, the benchmark's namespace, the Binding."""

from __future__ import annotations

import argparse
from typing import Any

import orjson

from scheduler.core.model import PLACEMENT_ANNOTATION
from scheduler.core.objects import placement_value
from scheduler.kube.binder import binding_body
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


def binding(ns: str, name: str, node: str, gpus: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """The Binding topoplace POSTs for pod ``ns/name`` on ``node`` (``KubeBinder``'s
    ``binding_body``): the target node and the placement annotation of ``gpus``."""
    pod = {"metadata": {"name": name, "namespace": ns}}
    return binding_body(pod, node, {PLACEMENT_ANNOTATION: placement_value(node, gpus)})
