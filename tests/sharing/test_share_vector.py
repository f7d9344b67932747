"""The share verbs' vector path (``Shares.filter_fast`` / ``score_fast``: every offered
node at once from columns, ``scheduler.core.share_table``) gives exactly the answers of the
per-node path (``Shares.filter`` / ``score``: ``fractional.decide`` node by node), pod after
pod on seeded random clusters: the same nodes kept, the same reasons, the same shares held
for the winner, the same scores and the same decision records."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import orjson
import pytest

from benchmarks.clusters import make_node, make_pod
from scheduler.cli.main import load_params
from scheduler.core.fractional import REASON_COMPUTE_P95, REASON_TENANTS, RIGHTSIZE_ANNOTATION
from scheduler.core.share_table import vector_request
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.server.extender import Extender
from scheduler.server.verbs.share import pod_share_request
from tests.sharing.builders import (
    A100_MIB,
    aliyun_pod,
    gpushare_node,
    hami_bound,
    hami_node,
    share_pod,
)


def _note(rng: random.Random, pod: dict[str, Any], on: bool) -> dict[str, Any]:
    """``pod`` with, when ``on`` and at random, the right-sizer's note: a measured compute
    p95 and its policy's tenancy limits (``fractional.tenant_limits``)."""
    if on and rng.random() < 0.6:
        note: dict[str, Any] = {"compute_p95": rng.choice([0.1, 0.2, 0.35, 0.5])}
        if rng.random() < 0.7:
            note["max_tenants_per_gpu"] = rng.choice([1, 2, 3])
        if rng.random() < 0.7:
            note["gpu_compute_limit"] = rng.choice([0.5, 0.8, 1.0])
        pod["metadata"]["annotations"][RIGHTSIZE_ANNOTATION] = orjson.dumps(note).decode()
    return pod


def _cluster(seed: int, limits: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """HAMi nodes of two kinds (some GPUs unhealthy, some cordoned, some split 2), gpushare
    nodes, nodes without a backend, labels for selectors; whole-GPU pods and shares bound
    (with ``limits``, some with the right-sizer's note)."""
    rng = random.Random(seed)
    nodes, pods = [], []
    for i in range(rng.randint(20, 40)):
        kind = rng.random()
        name = f"n{i:03d}"
        labels = {"pool": rng.choice(["a", "b"])}
        if kind < 0.45:
            nodes.append(
                hami_node(
                    name,
                    4,
                    split=rng.choice([10, 10, 2]),
                    unhealthy=rng.sample(range(4), rng.choice([0, 0, 1])),
                    unschedulable=rng.random() < 0.08,
                    labels=labels,
                    cpu=rng.choice(["16", "64"]),
                )
            )
        elif kind < 0.8:
            nodes.append(
                hami_node(
                    name, 8, A100_MIB, product="a100", labels=labels, ready=rng.random() > 0.05
                )
            )
        elif kind < 0.9:
            nodes.append(gpushare_node(name, 2, 16, labels=labels))
        else:
            nodes.append(make_node(name, 4, "t4", labels=labels))
    hami = [
        n["metadata"]["name"]
        for n in nodes
        if "hami.io/node-nvidia-register" in n["metadata"]["annotations"]
    ]
    for k, name in enumerate(rng.sample(hami, len(hami) // 3)):
        pods.append(make_pod(f"whole-{k}", 1, namespace="busy", node=name, gpu_indices=[3]))
    for k, name in enumerate(rng.sample(hami, len(hami) // 3)):
        held = hami_bound(
            f"held-{k}",
            rng.randint(0, 1),
            rng.choice([2000, 6000]),
            node=name,
            cores=rng.choice([10, 30]),
        )
        pods.append(_note(rng, held, limits))
    return nodes, pods


def _pod(rng: random.Random, k: int, limits: bool = False) -> dict[str, Any]:
    return _note(rng, _pod_of(rng, k), limits)


def _pod_of(rng: random.Random, k: int) -> dict[str, Any]:
    r = rng.random()
    if r < 0.12:
        return aliyun_pod(f"g{k}", rng.choice([2, 4, 8]))
    if r < 0.2:
        pod = share_pod(f"s{k}", mem=rng.choice([1000, 4000]), cores=20)
        pod["spec"]["nodeSelector"] = {"pool": "a"}
        return pod
    if r < 0.25:  # two devices: the per-node path answers it (no vector form)
        return share_pod(f"s{k}", mem=2000, cores=10, count=2)
    pct = rng.choice([None, 10, 25, 50])
    mem = None if pct else rng.choice([1000, 3000, 7000, 15000, 30000])
    cores = rng.choice([0, 10, 25, 30, 50, 100])
    return share_pod(f"s{k}", mem=mem, cores=cores, percent=pct, cpu=rng.choice(["1", "2", "8"]))


def _extender(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], policy: str
) -> tuple[Extender, list[Any]]:
    params = load_params(None)
    params = dataclasses.replace(
        params,
        # Holds never expire during the test: both extenders must see the same holds
        # however long the machine takes between their calls.
        extender=dataclasses.replace(
            params.extender, reasons_when_placed=True, nomination_ttl_seconds=1e6
        ),
        sharing=dataclasses.replace(params.sharing, policy=policy),
    )
    cache = ClusterCache.from_objects(nodes, pods, params)
    ext = Extender(cache, gangs=GangRuntime(), profiles=("topoplace",))
    records: list[Any] = []
    ext.decisions.record_info = lambda verb, pod, gang, info: records.append((verb, pod, info))  # type: ignore[method-assign]
    return ext, records


@pytest.mark.parametrize("policy", ["topoplace-share", "fgd"])
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_vector_path_answers_as_the_per_node_path(seed: int, policy: str) -> None:
    """Odd seeds: some pods carry the right-sizer's note (tenancy limits refuse GPUs)."""
    limits = seed % 2 == 1
    nodes, bound = _cluster(seed, limits)
    per_node, rec_a = _extender(nodes, bound, policy)
    vector, rec_b = _extender(nodes, bound, policy)
    rng = random.Random(seed * 1000)
    names = [n["metadata"]["name"] for n in nodes]
    vector_answered = placed = 0
    refused: set[str] = set()
    for k in range(70):
        pod = _pod(rng, k, limits)
        offered = rng.sample(names, rng.randint(len(names) // 2, len(names)))
        body = {"Pod": pod, "Nodes": None, "NodeNames": offered}
        raw = orjson.dumps(body)
        old = per_node.filter(orjson.loads(raw))
        new = orjson.loads(vector.filter_json(orjson.loads(raw), raw))
        assert new["NodeNames"] == old["NodeNames"], (k, pod["metadata"]["name"])
        assert new["FailedNodes"] == (old["FailedNodes"] or {})
        assert new["FailedAndUnresolvableNodes"] == (old["FailedAndUnresolvableNodes"] or {})
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        held_a = per_node.cache.snapshot().pods.get(key)
        held_b = vector.cache.snapshot().pods.get(key)
        assert (held_a and (held_a.node, held_a.shares)) == (
            held_b and (held_b.node, held_b.shares)
        )
        assert rec_b[-1] == rec_a[-1]
        placed += held_a is not None
        refused.update(
            r for r in new["FailedNodes"].values() if r in (REASON_TENANTS, REASON_COMPUTE_P95)
        )
        req = pod_share_request(per_node, pod)
        vector_answered += vector_request(req, policy) is not None
        # prioritize over every offered node (not only the kept one): every score equal
        body2 = {"Pod": pod, "Nodes": None, "NodeNames": offered}
        raw2 = orjson.dumps(body2)
        assert orjson.loads(
            vector.prioritize_json(orjson.loads(raw2), raw2)
        ) == per_node.prioritize(orjson.loads(raw2))
        assert rec_b[-1] == rec_a[-1]
    assert vector_answered >= 50  # the vector path answered most pods
    assert placed >= 30  # and the cluster filled up as they were held
    if limits:  # and the right-sizer's limits refused nodes
        assert refused


def test_vector_path_keeps_columns_between_pods() -> None:
    """Between two pods only the nominated node's row is read again: the columns are not
    rebuilt per pod."""
    nodes, bound = _cluster(9)
    vector, _ = _extender(nodes, bound, "topoplace-share")
    names = [n["metadata"]["name"] for n in nodes]
    for k in range(10):
        pod = share_pod(f"s{k}", mem=2000, cores=10)
        raw = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
        reply = orjson.loads(vector.filter_json(orjson.loads(raw), raw))
        assert len(reply["NodeNames"]) == 1
    assert vector.share_fits.rows.rebuilds == 1
