"""Claims with ``matchAttribute`` constraints answered by masks over every node
(``DraRouter.vectorized``: ``dra.constrained_masks``, the allocator's search once per
distinct (candidates' attribute values, free candidates)) against the node-by-node search:
exhaustively on the recorded 8-GPU node, then on seeded random clusters of whole and of
shared GPUs (attribute values shuffled, some missing), and past the search's budget."""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import pytest

from benchmarks.cluster.dra import SHARED_CLASS, device_class
from benchmarks.cluster.dra import node_slices as v1_slices
from benchmarks.clusters import claim_pod, dgx_h100_nodes, node_slices, resource_claim
from scheduler.core import dra
from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.dra import DraRouter
from tests.dra import recorded
from tests.dra.randomized import agree, claim_cluster, fits_and_refusals

CLASSES = list(recorded.classes("v1beta1").values())
ROOT = "resource.kubernetes.io/pcieRoot"
PRODUCT = "gpu.nvidia.com/productName"
GI = 1 << 30


def _constrained(name: str, count: int, constraints: list[dict[str, Any]]) -> dict[str, Any]:
    c = resource_claim(name, count)
    c["spec"]["devices"]["constraints"] = constraints
    return c


def _both(cache: ClusterCache) -> tuple[DraRouter, DraRouter]:
    fast, slow = DraRouter(cache), DraRouter(cache)
    slow.vectorized = False
    return fast, slow


@pytest.mark.parametrize("attrs", [(ROOT,), (PRODUCT,), (ROOT, PRODUCT)])
def test_constrained_fit_is_the_search_on_every_free_set_of_the_recorded_node(
    attrs: tuple[str, ...],
) -> None:
    """Every held subset of the recorded node's 8 GPUs and every count: the chosen devices
    (or infeasible) equal ``first_fit``'s on the real devices."""
    (s,) = node_slices(["n0"])
    inv = dra.inventory([s])
    devices = inv.by_node["n0"]
    classes = {c["metadata"]["name"]: c for c in CLASSES}
    table = dra.greedy_table(("n0",), lambda n: devices)
    sig, sigs = dra.constraint_signatures(table, attrs)
    labels = sigs[int(sig[0])]
    assert len(set(labels)) == {(ROOT,): 4, (PRODUCT,): 1, (ROOT, PRODUCT): 4}[attrs]
    feasible = 0
    for count in range(1, 9):
        spec = dra.claim_spec(_constrained("c", count, [{"matchAttribute": a} for a in attrs]))
        for avail in range(256):
            held = [d.id for k, d in enumerate(devices) if not avail >> k & 1]
            want = dra.first_fit(inv, "n0", [spec], classes, held)
            outcome, bits = dra.constrained_fit(labels, avail, count)
            assert want.known and outcome != dra.FIT_UNKNOWN
            assert (outcome == dra.FIT_FEASIBLE) == want.feasible, (count, bin(avail))
            if want.feasible:
                feasible += 1
                assert [devices[k] for k in range(8) if bits >> k & 1] == list(want.devices[0])
    assert feasible > 300


def _cluster(seed: int) -> tuple[ClusterCache, list[str], list[dict[str, Any]]]:
    """40-100 DGX H100 nodes, one recorded 8-GPU slice each with the PCIe roots and
    product names redrawn per device (a few missing; a few nodes without a slice, a few
    devices tainted), random claims of 1-8 GPUs allocated, a cordoned and an unhealthy
    node, and 14 pods whose claims of 1-8 GPUs carry ``matchAttribute`` constraints."""
    rng = random.Random(seed)
    nodes = dgx_h100_nodes(rng.randint(40, 100))
    names = [n["metadata"]["name"] for n in nodes]
    rng.choice(nodes)["spec"] = {"unschedulable": True}
    rng.choice(nodes)["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    with_slices = [n for n in names if rng.random() > 0.05]
    slices = [dict(s, kind="ResourceSlice") for s in node_slices(with_slices)]
    for s in slices:
        for dev in s["spec"]["devices"]:
            attrs = dev["basic"]["attributes"]
            if rng.random() < 0.05:
                attrs.pop(ROOT, None)
            else:
                attrs[ROOT] = {"string": f"pci0000:{rng.randint(1, 3)}0"}
            if rng.random() < 0.5:
                attrs["productName"] = {"string": rng.choice(("H100", "H200"))}
            if rng.random() < 0.02:
                dev["basic"]["taints"] = [{"key": "gpu.nvidia.com/xid", "effect": "NoSchedule"}]
    inv = dra.inventory(slices)
    claims: list[dict[str, Any]] = []
    for i, n in enumerate(rng.sample(with_slices, len(with_slices) // 2)):
        devs = rng.sample(list(inv.by_node[n]), rng.randint(1, 6))
        c = resource_claim(f"held-{i}", len(devs))
        c["status"] = {"allocation": dra.allocation_status(n, dra.claim_spec(c), devs)}
        claims.append(c)
    forms = [
        [{"matchAttribute": ROOT}],
        [{"matchAttribute": PRODUCT}],
        [{"matchAttribute": ROOT}, {"matchAttribute": PRODUCT}],
        [{"matchAttribute": ROOT, "requests": ["gpus"]}],
        [{"matchAttribute": ROOT, "requests": ["another"]}],  # binds no request of this one
        [{"matchAttribute": "gpu.nvidia.com/noSuchAttribute"}],
    ]
    pending = [
        _constrained(f"want-{i}", rng.choice((1, 2, 2, 3, 4, 8)), copy.deepcopy(rng.choice(forms)))
        for i in range(14)
    ]
    classes = [dict(c, kind="DeviceClass") for c in CLASSES]
    return claim_cluster(nodes, [*classes, *slices, *claims], pending, names, rng)


@pytest.mark.parametrize("seed", range(20))
def test_constraint_masks_give_the_node_by_node_answers(seed: int) -> None:
    cache, names, pods = _cluster(seed)
    fast, slow = _both(cache)
    rng = random.Random(seed)
    for pod in pods:
        offered = [n for n in names if rng.random() > 0.1]
        got = fast._fast(pod, offered)
        assert got is not None and got.sig is not None  # the constraint masks answer
        agree(fast, slow, pod, offered)


def test_the_random_clusters_fit_and_refuse() -> None:
    """Constrained pods fit some nodes and are refused on others (so the comparison above
    covers both)."""
    fits, refusals = fits_and_refusals(_cluster)
    assert fits > 100 and refusals > 100, (fits, refusals)


@pytest.mark.parametrize("seed", range(8))
def test_constrained_capacity_claims_on_shared_gpusagree(seed: int) -> None:
    """Capacity claims of one or two shared GPUs under one PCIe root, beside shares
    allocated at random: the capacity masks and the constraint masks together give the
    search's answers."""
    rng = random.Random(seed)
    nodes = dgx_h100_nodes(rng.randint(20, 60))
    names = [n["metadata"]["name"] for n in nodes]
    slices = [
        dict(s, kind="ResourceSlice")
        for n in names
        for s in v1_slices(n, "v1", gpus=8, shared=rng.randint(4, 8))
    ]
    inv = dra.inventory(slices)
    claims = []
    for i in range(rng.randint(40, 160)):
        d = rng.choice([d for d in inv.by_node[rng.choice(names)] if d.shared])
        c = _share(f"held-{i}", 1, f"{rng.randint(10, 40)}Gi")
        c["status"] = {"allocation": dra.allocation_status(d.node, dra.claim_spec(c), [d])}
        claims.append(c)
    claims = [c for c in claims if not _over(claims, c, inv)]
    pending = []
    for i in range(12):
        c = _share(f"want-{i}", rng.choice((1, 2, 2)), rng.choice(("10Gi", "30Gi", "60Gi")))
        c["spec"]["devices"]["constraints"] = [{"matchAttribute": ROOT}]
        pending.append(c)
    pods = [claim_pod(f"pod-{i}", c["metadata"]["name"]) for i, c in enumerate(pending)]
    classes = [dict(device_class("v1", SHARED_CLASS, shared=True), kind="DeviceClass")]
    extra = dra.extra_of([*classes, *slices, *claims, *pending])
    cache = ClusterCache.from_objects(nodes, [], SchedParams(), extra=extra)
    fast, slow = _both(cache)
    order = names[:]
    rng.shuffle(order)
    fits = 0
    for pod in pods:
        got = fast._fast(pod, order)
        assert got is not None and got.sig is not None and got.table.cap is not None
        fits += len(agree(fast, slow, pod, order).feasible)
    assert fits > 0


def _share(name: str, count: int, memory: str) -> dict[str, Any]:
    req = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": SHARED_CLASS,
            "count": count,
            "capacity": {"requests": {"memory": memory}},
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [req]}},
    }


def _over(claims: list[dict[str, Any]], claim: dict[str, Any], inv: dra.Inventory) -> bool:
    """Whether the shares up to ``claim`` take more than 80 GiB of its device."""
    upto = claims[: claims.index(claim) + 1]
    (did,) = dra.consumed_by_device([claim])
    used = dra.consumed_by_device(upto)[did]
    return used.get("memory", 0) > 80 * GI


def test_past_the_search_budget_the_node_is_asked_node_by_node() -> None:
    """Nodes of 12 GPUs (one held) and of 8, and a claim of 12 under one product: the
    search tries every order of the free GPUs and runs out of budget on both (unknown:
    not refused), on both paths; a claim of 8 is answered by masks on both."""
    nodes = dgx_h100_nodes(2)
    big, small = (n["metadata"]["name"] for n in nodes)
    slices = [
        dict(s, kind="ResourceSlice")
        for s in (*v1_slices(big, "v1", gpus=12), *v1_slices(small, "v1", gpus=8))
    ]
    inv = dra.inventory(slices)
    held = resource_claim("held", 1, "v1")
    held["status"] = {
        "allocation": dra.allocation_status(big, dra.claim_spec(held), [inv.by_node[big][5]])
    }
    claims = [_constrained(f"want-{k}", k, [{"matchAttribute": PRODUCT}]) for k in (8, 12)]
    classes = [dict(device_class("v1"), kind="DeviceClass")]
    extra = dra.extra_of([*classes, *slices, held, *claims])
    cache = ClusterCache.from_objects(nodes, [], SchedParams(), extra=extra)
    fast, slow = _both(cache)
    eight, twelve = (claim_pod(f"pod-{k}", f"want-{k}") for k in (8, 12))
    got = fast._fast(twelve, [big, small])
    assert got is not None and {n: p.prediction for n, p in got.searched.items()} == {
        big: dra.UNKNOWN,
        small: dra.UNKNOWN,
    }
    assert agree(fast, slow, twelve, [big, small]).feasible == (big, small)
    got = fast._fast(eight, [big, small])
    assert got is not None and not got.searched  # 11 free of one product: found at once
    assert agree(fast, slow, eight, [big, small]).feasible == (big, small)


@pytest.mark.parametrize("width", [8, 20, 62])
def test_constrained_masks_answer_each_row_as_constrained_fit(width: int) -> None:
    """Rows of random signatures and free masks, keyed densely (width 8), by a sort of
    packed keys (20) or of (signature, mask) pairs (62): each row's answer is
    ``constrained_fit``'s for it."""
    rng = random.Random(width)
    sigs = tuple(
        tuple(rng.choice((-1, 0, 0, 1, 1, 2)) for _ in range(rng.randint(1, 8))) for _ in range(12)
    )
    sig = np.asarray([rng.randrange(len(sigs)) for _ in range(400)], np.int64)
    free = np.asarray([rng.randrange(1 << len(sigs[s])) for s in sig], np.int64)
    seen: set[int] = set()
    for count in (1, 2, 3, 5):
        sel, status = dra.constrained_masks(free, sig, sigs, count, width)
        want = [dra.constrained_fit(sigs[s], int(f), count) for s, f in zip(sig, free, strict=True)]
        assert status.tolist() == [w[0] for w in want]
        assert sel.tolist() == [w[1] for w in want]
        seen.update(status.tolist())
    assert seen == {dra.FIT_FEASIBLE, dra.FIT_INFEASIBLE}
