"""Shared GPUs (DRA consumable capacity) and MIG partitions through the real kube-scheduler
with the shipped DRA configuration (>= 1.34; written against 1.36.2).

Each test publishes its own DRA nodes with the test cluster's publisher
(:func:`benchmarks.cluster.dra.publish`, ``shared`` and ``mig``): per node ``gpu-0``
partitionable (MIG-like devices over its shared counters), ``gpu-1..gpu-4`` shared
(``allowMultipleAllocations``, ``memory`` 80Gi in 1Gi steps, ``compute`` 10/25/50/100),
the rest plain. Ungated claim pods are allocated by kube-scheduler (topoplace predicts its
first fit and picks the node); gated ones (``topoplace.io/allocate``) by topoplace
(topoplace-share's node and device; MIG: a free partition of a GPU already cut). After all
bind, no shared device holds more than its capacity, read from the API.

Consumable capacity is served from 1.34 (``DRAConsumableCapacity``, beta and on from 1.36):
a 1.33.0 API server stores a v1beta2 slice without ``allowMultipleAllocations`` and
``requestPolicy`` (dropped silently; the harness writes v1beta1 there, which has neither), so
the tests skip there with that reason.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.core import dra
from scheduler.core.params import SchedParams
from scheduler.runtime.dra import RECENT_S, DraRouter
from tests.kube.conftest import Topoplace, make_gpu_node
from tests.kube.test_dra import (  # noqa: F401  (fixtures)
    Claims,
    claims,
    dra_scheduler,
    dra_version,
    kube_api,
    topoplace_view,
    wait_seen,
)
from tests.kube.test_live import wait_for

pytestmark = pytest.mark.kube

SHARED = "shared-gpu.nvidia.com"
MIG = "mig.nvidia.com"
GI = 1 << 30


class CapacityNodes:
    """This test's DRA nodes with shared and partitionable GPUs."""

    def __init__(self, core: Any, kubeconfig: str, run_id: str, tag: str) -> None:
        self.core, self.kubeconfig, self.run_id, self.tag = core, kubeconfig, run_id, tag
        self.nodes: list[str] = []
        self.version = ""

    def add(self, count: int, *, shared: int = 4, mig: int = 1) -> list[str]:
        from benchmarks.cluster.dra import PublishError, publish
        from benchmarks.cluster.flags import parse_version
        from benchmarks.live.kubeapi import Api

        names = [f"tp-cap-{self.run_id}-{self.tag}-{len(self.nodes) + i}" for i in range(count)]
        for n in names:
            make_gpu_node(
                self.core,
                n,
                self.run_id,
                gpus=0,
                labels={"nvidia.com/gpu.count": "8", "topoplace-cap": self.tag},
            )
        self.nodes += names
        api = Api(self.kubeconfig)
        try:
            self.version = publish(api, parse_version(api.version()), names, shared=shared, mig=mig)
        except PublishError as exc:
            pytest.skip(f"shared / partitionable DRA devices not served here: {exc}")
        finally:
            api.close()
        return names

    def delete(self) -> None:
        from benchmarks.cluster.dra import delete_slices
        from benchmarks.live.kubeapi import Api

        if self.version:
            api = Api(self.kubeconfig)
            with contextlib.suppress(Exception):
                delete_slices(api, self.version, self.nodes)
            api.close()
        for n in self.nodes:
            with contextlib.suppress(Exception):
                self.core.delete_node(n)


@pytest.fixture
def cap_nodes(
    core: Any, kubeconfig: str, run_id: str, kube_version: tuple[int, int], request: Any
) -> Iterator[CapacityNodes]:
    if kube_version < (1, 34):
        pytest.skip(
            f"Kubernetes {kube_version[0]}.{kube_version[1]}: consumable capacity "
            "(allowMultipleAllocations, capacity.requests, consumedCapacity) is served from "
            "1.34 (DRAConsumableCapacity); a 1.33.0 API server stores a v1beta2 slice "
            "without allowMultipleAllocations and requestPolicy (dropped silently), so no "
            "device can be shared there"
        )
    c = CapacityNodes(core, kubeconfig, run_id, request.node.name[-20:].replace("_", "-"))
    yield c
    c.delete()


def _create(
    cl: Claims, name: str, cls: str, caps: dict[str, str] | None = None, profile: str = ""
) -> None:
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": 1}
    if caps:
        exactly["capacity"] = {"requests": caps}
    if profile:
        expr = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
        exactly["selectors"] = [{"cel": {"expression": expr}}]
    body = {
        "apiVersion": f"resource.k8s.io/{cl.version}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": cl.ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    cl.claims.append(name)
    cl.api.request_json("POST", cl.path(), body)


def _wait_ready(tp: Topoplace, nodes: list[str]) -> None:
    def ok() -> bool:
        view = topoplace_view(tp)
        inv = view.dra_inventory()
        return all(sum(1 for d in inv.by_node.get(n, ()) if d.shared) == 4 for n in nodes) and all(
            view.snapshot().node(n) is not None for n in nodes
        )

    wait_for(ok, 30, f"topoplace to see the shared GPUs of {nodes}")


def _seen_bound(tp: Topoplace, key: str) -> None:
    """Wait until topoplace's view holds pod ``key`` bound (its filter picks then expire)."""
    wait_for(lambda: key in topoplace_view(tp).snapshot().pods, 30, f"topoplace sees {key} bound")


def _quiet(last_write: float) -> None:
    """Let the window after topoplace's last allocation write pass: for :data:`RECENT_S`
    kube-scheduler may not see it, so topoplace predicts first fits without it and refuses
    a node where one would take its devices; :func:`_predict` reads the settled view."""
    time.sleep(max(0.0, last_write + RECENT_S + 0.5 - time.monotonic()))


def _pod(name: str, namespace: str, claim: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
    }


def _predict(tp: Topoplace, nodes: list[str], pod: dict[str, Any]) -> tuple[str, str]:
    """(node, device) topoplace predicts for an ungated pod: the node it scores best and
    the first fit there."""
    router = DraRouter(topoplace_view(tp))
    scores = dict(router.prioritize(pod, nodes))
    best = max(nodes, key=lambda n: (scores[n], n == min(nodes)))
    plan = next(p for p in router.plans(pod, nodes) if p.node == best)
    assert not plan.verdict and plan.prediction.feasible, plan
    ((d,),) = plan.prediction.devices
    return best, d.name


def _choice(tp: Topoplace, nodes: list[str], pod: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(node, devices) topoplace's gated allocator chooses now (``dra.pick_for_pod`` on its
    live view: topoplace-share for a share, the tightest free partition for MIG)."""
    view = topoplace_view(tp)
    snap = view.snapshot()
    params = SchedParams()
    pick = dra.pick_for_pod(
        pod,
        [snap.node(n) for n in nodes],
        view.dra_inventory(),
        snap.extra,
        params.selection_policy,
        (),
        snap.pods.values(),
        params.sharing,
    )
    assert not isinstance(pick, str), pick
    ((_, _, devs),) = pick.claims
    return pick.node, tuple(d.name for d in devs)


def _no_overcommit(cl: Claims, nodes: list[str]) -> dict[str, int]:
    """Sum of consumedCapacity per shared device <= its capacity, read from the API; returns
    memory GiB consumed per device (node/device)."""
    listed = cl.api.request_json("GET", cl.path())["items"]
    slices = cl.api.request_json("GET", f"/apis/resource.k8s.io/{cl.version}/resourceslices")[
        "items"
    ]
    inv = dra.inventory(slices)
    assert dra.overcommits(listed, inv) == []
    used = dra.consumed_by_device(listed)
    out = {}
    for did, amounts in sorted(used.items()):
        d = inv.by_id[did]
        if d.node not in nodes:
            continue
        for name, v in amounts.items():
            assert v <= d.capacities[name].value, (did, name, v)
        out[f"{d.node[-1]}/{d.name}"] = amounts.get("memory", 0) // GI
    return out


def _result(cl: Claims, name: str) -> dict[str, Any]:
    (res,) = cl.get(name)["status"]["allocation"]["devices"]["results"]
    return res


def test_capacity_claims_gated_and_ungated_land_as_decided_and_never_overcommit(
    topoplace: Topoplace,
    dra_scheduler: Any,  # noqa: F811
    cap_nodes: CapacityNodes,
    claims: Claims,  # noqa: F811
    run_id: str,
    namespace: str,
) -> None:
    """Shares of 30, 50, 20 (compute 40), 10, 60, 45, 25 and 35 GiB, gated and ungated
    in turn, on two nodes: an ungated one lands on the node and shared GPU topoplace
    predicts (kube-scheduler's first fit on the node topoplace scores best), a gated one
    on topoplace-share's node and GPU, written with consumedCapacity and a shareID; every
    pod binds, and no shared GPU holds more than 80Gi or 100 compute."""
    nodes = cap_nodes.add(2)
    _wait_ready(topoplace, nodes)
    sel = {"topoplace-cap": cap_nodes.tag}
    asks = [
        ("30Gi", "", False),
        ("50Gi", "", True),
        ("20Gi", "40", False),
        ("10Gi", "", True),
        ("60Gi", "", False),
        ("45Gi", "", True),
        ("25Gi", "", False),
        ("35Gi", "", True),
    ]
    seen = []
    last_write = 0.0
    for i, (mem, compute, gated) in enumerate(asks):
        name = f"cap-{i}"
        caps = {"memory": mem, **({"compute": compute} if compute else {})}
        _create(claims, name, SHARED, caps)
        wait_seen(topoplace, f"{namespace}/{name}", allocated=False)
        pod = _pod(f"pod-{name}", namespace, name)
        if not gated:
            _quiet(last_write)
        want = _choice(topoplace, nodes, pod) if gated else _predict(topoplace, nodes, pod)
        claims.pod(f"pod-{name}", name, run_id, gated=gated, selector=sel)
        node, devices = claims.wait_allocated(name, timeout=60)
        if gated:
            last_write = time.monotonic()
        res = _result(claims, name)
        got = (node, tuple(devices)) if gated else (node, devices[0])
        assert got == want, (name, gated, got, want)
        assert res["shareID"] and res["consumedCapacity"]["memory"] == mem
        if compute:
            assert res["consumedCapacity"]["compute"] == "50"  # 40 rounds up to 50
        assert (dra.allocated_by_topoplace(claims.get(name))) is gated
        wait_for(lambda n=f"pod-{name}", at=node: claims.node_of(n) == at, 60, f"pod-{name} bound")
        wait_seen(topoplace, f"{namespace}/{name}", allocated=True)
        _seen_bound(topoplace, f"{namespace}/pod-{name}")
        seen.append((name, "gated" if gated else "ungated", node[-1], res["device"]))
    used = _no_overcommit(claims, nodes)
    print(f"\nshares: {seen}\nmemory GiB per shared GPU: {used}")


def test_mig_partitions_gated_and_ungated_never_overlap(
    topoplace: Topoplace,
    dra_scheduler: Any,  # noqa: F811
    cap_nodes: CapacityNodes,
    claims: Claims,  # noqa: F811
    run_id: str,
    namespace: str,
) -> None:
    """MIG claims 1g, 3g, 2g gated, then a 1g ungated, on two nodes with one
    partitionable GPU each: the gated ones go where topoplace chooses (a GPU already cut
    first), the ungated one where topoplace predicts kube-scheduler's first fit; the
    partitions held on a GPU never share a memory slice."""
    nodes = cap_nodes.add(2)
    _wait_ready(topoplace, nodes)
    sel = {"topoplace-cap": cap_nodes.tag}
    placed = []
    last_write = 0.0
    for i, (profile, gated) in enumerate(
        [("1g.10gb", True), ("3g.40gb", True), ("2g.20gb", True), ("1g.10gb", False)]
    ):
        name = f"mig-{i}"
        _create(claims, name, MIG, profile=profile)
        wait_seen(topoplace, f"{namespace}/{name}", allocated=False)
        pod = _pod(f"pod-{name}", namespace, name)
        if gated:
            node, devs = _choice(topoplace, nodes, pod)
            want: tuple[str, Any] = (node, list(devs))
        else:
            _quiet(last_write)
            node, dev = _predict(topoplace, nodes, pod)
            want = (node, [dev])
        claims.pod(f"pod-{name}", name, run_id, gated=gated, selector=sel)
        got = claims.wait_allocated(name, timeout=60)
        if gated:
            last_write = time.monotonic()
        assert got == want, (name, got, want)
        wait_for(
            lambda n=f"pod-{name}", at=got[0]: claims.node_of(n) == at, 60, f"pod-{name} bound"
        )
        wait_seen(topoplace, f"{namespace}/{name}", allocated=True)
        _seen_bound(topoplace, f"{namespace}/pod-{name}")
        placed.append((got[0], got[1][0]))
    # no two partitions over one memory slice of a GPU
    view = topoplace_view(topoplace)
    inv = view.dra_inventory()
    slices_used: dict[tuple[str, str], set[str]] = {}
    for node, dev in placed:
        d = inv.by_id[("gpu.nvidia.com", node, dev)]
        for cs, amounts in d.consumes:
            mine = {c for c in amounts if c.startswith("memory-slice-")}
            held = slices_used.setdefault((node, cs), set())
            assert not held & mine, (node, dev, held & mine)
            held |= mine
    # the gated ones filled one GPU before cutting the other
    assert len({n for n, _ in placed[:3]}) == 1, placed
    print(f"\nMIG partitions: {placed}")


def test_race_a_gated_and_an_ungated_share_of_the_last_gpu_never_overcommit(
    topoplace: Topoplace,
    dra_scheduler: Any,  # noqa: F811
    cap_nodes: CapacityNodes,
    claims: Claims,  # noqa: F811
    run_id: str,
    namespace: str,
) -> None:
    """The race on shared GPUs, forced. Per round a fresh node with :data:`RACE_GPUS`
    shared GPUs of 80Gi, and twice as many 50Gi shares created at the same moment aimed
    at them, half ungated (kube-scheduler allocates them), half gated (topoplace does):
    one fits per GPU, so every GPU is some share's last. topoplace
    runs with ``TOPOPLACE_DRA_SETTLE_S=0`` and ``TOPOPLACE_DRA_RECENT_S=0`` (its filter does
    not hold kube-scheduler off its fresh writes), so the conflicts fall to the check after
    writing and the bind check. After everything settles one share per GPU is allocated
    and its pod bound, the others are not, and no shared device is over capacity, read
    from the API."""
    won: list[list[str]] = []
    with topoplace.restarted({"TOPOPLACE_DRA_SETTLE_S": "0", "TOPOPLACE_DRA_RECENT_S": "0"}):
        for rnd in range(RACE_ROUNDS):
            won.append(_share_race_round(topoplace, cap_nodes, claims, run_id, namespace, rnd))
        log = (topoplace.logdir / f"topoplace-{topoplace.starts}.log").read_text(errors="replace")
    fails = log.count("(kube-scheduler's) shares devices")
    print(
        f"\n{RACE_ROUNDS} rounds, shares allocated: {won}; binds failed {fails}, "
        f"topoplace waited for a bind {log.count('waiting for their bind')}, "
        f"yielded {log.count('topoplace yields')}"
    )


def _share_race_round(
    tp: Topoplace, cap_nodes: CapacityNodes, cl: Claims, run_id: str, namespace: str, rnd: int
) -> str:
    """One round of the race on a fresh node; returns which sides' shares were allocated
    (sorted)."""
    import threading

    (node,) = cap_nodes.add(1, shared=RACE_GPUS, mig=0)

    def one_shared() -> bool:
        view = topoplace_view(tp)
        inv = view.dra_inventory()
        shared = sum(1 for d in inv.by_node.get(node, ()) if d.shared)
        return shared == RACE_GPUS and view.snapshot().node(node) is not None

    wait_for(one_shared, 30, f"topoplace to see the shared GPUs of {node}")
    names = {f"race-{rnd}-{i}": i % 2 == 0 for i in range(2 * RACE_GPUS)}
    for name in names:
        _create(cl, name, SHARED, {"memory": "50Gi"})
        wait_seen(tp, f"{namespace}/{name}", allocated=False)
    host = {"kubernetes.io/hostname": node}

    def make(name: str, gated: bool) -> None:
        cl.pod(f"pod-{name}", name, run_id, gated=gated, selector=host)

    threads = [threading.Thread(target=make, args=kv) for kv in names.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def allocated() -> list[str]:
        return [n for n in names if dra.is_allocated(cl.get(n))]

    def all_bound() -> bool:
        won = allocated()
        return len(won) >= RACE_GPUS and all(cl.node_of(f"pod-{n}") == node for n in won)

    wait_for(all_bound, 90, f"{RACE_GPUS} of {sorted(names)} bound")
    time.sleep(RACE_SETTLE_S)  # the losers' retries, checks and give-backs
    used = _no_overcommit(cl, [node])
    assert sorted(used.values()) == [50] * RACE_GPUS, used  # one 50Gi share per GPU
    won = allocated()
    assert len(won) == RACE_GPUS and all(cl.node_of(f"pod-{n}") == node for n in won), won
    for lost in set(names) - set(won):
        assert not cl.node_of(f"pod-{lost}"), lost
    return sorted("gated" if names[n] else "ungated" for n in won)


RACE_ROUNDS = 3
"""Rounds of the forced race on shared GPUs (each a fresh node)."""
RACE_GPUS = 3
"""Shared GPUs per round's node (twice as many shares race for them)."""
RACE_SETTLE_S = 4.0
"""Seconds the race is left to settle after the first bind before it is read."""
