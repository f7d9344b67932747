"""Gang members asking ``nvidia.com/gpu`` that a DeviceClass backs with DRA, on objects
recorded from a real v1.36.2 plane (tests/fixtures/kube/dra-1.36): the gang is planned over
DRA nodes (free = devices no allocated claim holds, healthy, untainted) and device-plugin
nodes alike, all or nothing; a member on a DRA node is planned with the first fit
kube-scheduler's allocator will give its special claim, and at bind holds no GPU itself (the
claim does). DRA nodes are copies of the recorded ``er-node-0`` and its slice."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

from scheduler.core import dra
from scheduler.core.gang import DRA_CHOICE_ANNOTATION, recover_plans
from scheduler.core.params import SchedParams
from scheduler.kube import allocator as al
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.server.extender import Extender
from tests.dra import recorded
from tests.dra.test_extended_resource import PodClaimApi
from tests.helpers import with_reasons

PARAMS = SchedParams()
GANG = "default/g"


def _dra_node(name: str, topology: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """A copy of the recorded DRA node er-node-0 (no ``nvidia.com/gpu`` advertised) and of
    its slice (devices gpu-0..gpu-7)."""
    base = next(
        n for n in recorded.items_136("nodes.json", "Node") if n["metadata"]["name"] == "er-node-0"
    )
    sl0 = next(
        s
        for s in recorded.items_136("resourceslices.v1.json", "ResourceSlice")
        if s["spec"]["nodeName"] == "er-node-0"
    )
    node = copy.deepcopy(base)
    node["metadata"]["name"] = name
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    if topology:
        node["metadata"].setdefault("annotations", {})["topoplace.io/gpu-topology"] = topology
    sl = copy.deepcopy(sl0)
    sl["metadata"]["name"] = f"{name}-gpu.nvidia.com"
    sl["spec"]["nodeName"] = name
    sl["spec"]["pool"]["name"] = name
    return node, sl


def _plugin_node(name: str) -> dict[str, Any]:
    """The same node serving ``nvidia.com/gpu: 8`` through the device plugin (no slice)."""
    node, _ = _dra_node(name)
    node["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    node["status"]["capacity"]["nvidia.com/gpu"] = "8"
    return node


def _ext(
    dra_nodes: list[str],
    plugin_nodes: list[str] = (),  # type: ignore[assignment]
    topology: str = "",
    recorded_nodes: bool = False,
) -> Extender:
    """An extender with a gang runtime over copies of er-node-0 (``dra_nodes``), device
    plugin nodes, and with ``recorded_nodes`` the recorded nodes and claims as they are."""
    extra = recorded.extra_136()
    nodes: list[dict[str, Any]] = []
    slices: list[dict[str, Any]] = []
    if recorded_nodes:
        nodes += recorded.items_136("nodes.json", "Node")
        slices += extra[dra.SLICES_KEY]
    else:
        extra[dra.CLAIMS_KEY] = {}
    for name in dra_nodes:
        n, s = _dra_node(name, topology)
        nodes.append(n)
        slices.append(s)
    nodes += [_plugin_node(n) for n in plugin_nodes]
    extra[dra.SLICES_KEY] = slices
    cache = ClusterCache.from_objects(nodes, [], with_reasons(PARAMS), extra=extra)
    return Extender(cache, gangs=GangRuntime())


def _member(i: int, gpus: int, size: int) -> dict[str, Any]:
    """Member ``g-<i>`` of gang ``g`` (``size`` members), asking ``nvidia.com/gpu: gpus``
    (the recorded pod's metadata, unpinned)."""
    pod = recorded.load_136("pod.extended-resources.json")
    pod["spec"].pop("nodeName", None)
    pod["spec"].pop("nodeSelector", None)
    pod["status"] = {}
    pod["metadata"]["name"] = f"g-{i}"
    pod["metadata"]["uid"] = f"uid-g-{i}"
    pod["metadata"]["annotations"] = {
        "topoplace.io/gang": "g",
        "topoplace.io/gang-size": str(size),
    }
    pod["spec"]["initContainers"] = []
    pod["spec"]["containers"] = [
        {"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    ]
    return pod


def _off_loop(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a thread without an event loop (gang planning refuses to run on one)."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def _filter(ext: Extender, pod: dict[str, Any], names: list[str]) -> list[str]:
    got = _off_loop(lambda: ext.filter({"Pod": pod, "NodeNames": names}))
    return list(got["NodeNames"] or [])


def _slots(ext: Extender) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """member (slot id while no member has claimed it) -> (node, GPUs, state) of the gang's
    plan."""
    plan = ext.gangs.describe_plans(ext)[GANG]  # type: ignore[union-attr]
    return {
        s["member"] or s["slot"]: (s["node"], tuple(s["gpus"]), s["state"]) for s in plan["slots"]
    }


def _prebind(
    ext: Extender,
    pod: dict[str, Any],
    node: str,
    gpus: list[int],
    api: PodClaimApi | None = None,
) -> None:
    """What kube-scheduler's PreBind leaves for ``pod``: its special claim (the recorded
    claim's shape), allocated ``gpus`` of ``node`` and reserved for it, and the pod's
    ``status.extendedResourceClaimStatus`` naming it."""
    made = copy.deepcopy(recorded.load_136("claim.extended-resources.json"))
    name = pod["metadata"]["name"]
    made["kind"] = "ResourceClaim"
    made["metadata"]["name"] = f"{name}-extended-resources-abcde"
    made["metadata"]["ownerReferences"][0].update(name=name, uid=pod["metadata"]["uid"])
    made["spec"]["devices"]["requests"] = [
        {"name": "container-0-request-0",
         "exactly": {"allocationMode": "ExactCount", "count": len(gpus),
                     "deviceClassName": "gpu.nvidia.com"}}
    ]  # fmt: skip
    alloc = made["status"]["allocation"]
    alloc["devices"]["results"] = [
        {"request": "container-0-request-0", "driver": "gpu.nvidia.com", "pool": node,
         "device": f"gpu-{g}"}
        for g in gpus
    ]  # fmt: skip
    alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] = [node]
    made["status"]["reservedFor"] = [
        {"name": name, "resource": "pods", "uid": pod["metadata"]["uid"]}
    ]
    ext.cache.apply_claim(dra.object_key(made), copy.deepcopy(made))
    pod["status"] = {"extendedResourceClaimStatus": {"resourceClaimName": made["metadata"]["name"]}}
    if api is not None:  # the API server holds them too
        api.claims[dra.object_key(made)] = made
        api.pods[f"default/{name}"] = copy.deepcopy(pod)


def _bind(ext: Extender, pod: dict[str, Any], node: str) -> str:
    m = pod["metadata"]
    out = ext.bind(
        {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
    )
    return str(out["Error"])


def test_a_gang_on_dra_nodes_is_planned_with_the_first_fit_its_members_will_get() -> None:
    """Two 2-GPU members on a DGX-1 (V100) DRA node: the solver alone gives the pairs two
    NVLinks join (gpu-0, gpu-3 and gpu-1, gpu-2); kube-scheduler's allocator gives gpu-0,
    gpu-1 then gpu-2, gpu-3, and that is the plan."""
    ext = _ext(["dgx-a"], topology="dgx1-v100")
    pods = [_member(i, 2, 2) for i in range(2)]
    assert _filter(ext, pods[0], ["dgx-a"]) == ["dgx-a"]
    assert _filter(ext, pods[1], ["dgx-a"]) == ["dgx-a"]
    assert _slots(ext) == {
        "default/g-0": ("dgx-a", (0, 1), "reserved"),
        "default/g-1": ("dgx-a", (2, 3), "reserved"),
    }
    assert ext.cache.snapshot().node("dgx-a").used_mask == 0b1111  # type: ignore[union-attr]


def test_members_bind_whole_in_either_order_and_hold_their_claims_gpus_once() -> None:
    """kube-scheduler binds the second member first: its claim takes the first fit (the
    first slot's GPUs). The bind holds, the pod holds no GPU (its claim does), the other
    slot is seated on what is left, and the gang completes on its planned node."""
    ext = _ext(["er-a", "er-b"])
    pods = [_member(i, 4, 2) for i in range(2)]
    names = ["er-a", "er-b"]
    assert _filter(ext, pods[0], names) == ["er-a"]
    assert _filter(ext, pods[1], names) == ["er-a"]
    assert _slots(ext) == {
        "default/g-0": ("er-a", (0, 1, 2, 3), "reserved"),
        "default/g-1": ("er-a", (4, 5, 6, 7), "reserved"),
    }
    _prebind(ext, pods[1], "er-a", [0, 1, 2, 3])
    assert _bind(ext, pods[1], "er-a") == ""
    assert _slots(ext) == {
        "default/g-0": ("er-a", (4, 5, 6, 7), "reserved"),
        "default/g-1": ("er-a", (0, 1, 2, 3), "bound"),
    }
    snap = ext.cache.snapshot()
    assert snap.pods["default/g-1"].gpus == ()
    assert snap.pods["gang-reservation:default/g#4gpu-0"].gpus == (4, 5, 6, 7)
    _prebind(ext, pods[0], "er-a", [4, 5, 6, 7])
    assert _bind(ext, pods[0], "er-a") == ""
    snap = ext.cache.snapshot()
    assert snap.node("er-a").used_mask == 0xFF  # type: ignore[union-attr]
    assert snap.node("er-b").used_mask == 0  # type: ignore[union-attr]
    assert {k: p.gpus for k, p in snap.pods.items()} == {
        "default/g-0": (),
        "default/g-1": (),
        "resourceclaim:default/g-0-extended-resources-abcde": (4, 5, 6, 7),
        "resourceclaim:default/g-1-extended-resources-abcde": (0, 1, 2, 3),
    }
    assert ext.gangs.describe_plans(ext)[GANG]["state"] == "complete"  # type: ignore[union-attr]
    # after a restart the bound members are matched to their slots by node
    rp = recover_plans(snap)[GANG]
    assert rp.outside == () and not rp.open_slots


def test_free_dra_gpus_are_those_no_claim_holds_healthy_and_untainted() -> None:
    """The recorded nodes: gpu-node-0 is full (claims hold gpu-0..7), gpu-node-1 has only
    its tainted gpu-5 left, er-node-0 has gpu-3..7 (the special claim of er-three holds
    gpu-0..2). Two 2-GPU members go to er-node-0, on its first fits; two 4-GPU members do
    not fit (one would), and nothing is reserved."""
    names = ["er-node-0", "gpu-node-0", "gpu-node-1"]
    ext = _ext([], recorded_nodes=True)
    assert _filter(ext, _member(0, 2, 2), names) == ["er-node-0"]
    assert sorted(_slots(ext).values()) == [
        ("er-node-0", (3, 4), "reserved"),
        ("er-node-0", (5, 6), "reserved"),
    ]
    big = _ext([], recorded_nodes=True)
    assert _filter(big, _member(0, 4, 2), names) == []
    assert GANG not in big.cache.plans
    assert big.cache.snapshot().node("er-node-0").used_mask == 0b111  # type: ignore[union-attr]


def test_a_gang_spans_device_plugin_and_dra_nodes_all_or_nothing() -> None:
    """Three 4-GPU members, one DRA node and one device-plugin node of 8 GPUs: planned
    whole across both; the members on the device-plugin node hold their GPUs themselves, the
    one on the DRA node through its claim. Five members do not fit: nothing is held."""
    names = ["er-a", "dp-a"]
    ext = _ext(["er-a"], ["dp-a"])
    pods = [_member(i, 4, 3) for i in range(3)]
    for p in pods:
        assert len(_filter(ext, p, names)) == 1
    slots = _slots(ext)
    assert sorted(n for n, _, _ in slots.values()) == ["dp-a", "dp-a", "er-a"]
    dra_member = next(m for m, (n, _, _) in slots.items() if n == "er-a")
    assert slots[dra_member][1] == (0, 1, 2, 3)  # the first fit
    for p in pods:
        key = f"default/{p['metadata']['name']}"
        node, gpus, _ = _slots(ext)[key]
        if node == "er-a":
            _prebind(ext, p, node, list(gpus))
        assert _bind(ext, p, node) == ""
    snap = ext.cache.snapshot()
    held = {k: (p.node, p.gpus) for k, p in snap.pods.items() if k.startswith("default/g-")}
    assert held[dra_member] == ("er-a", ())
    assert sorted(v for k, v in held.items() if k != dra_member) == [
        ("dp-a", (0, 1, 2, 3)),
        ("dp-a", (4, 5, 6, 7)),
    ]
    assert snap.node("er-a").used_mask == 0b1111  # type: ignore[union-attr]
    five = _ext(["er-a"], ["dp-a"])
    assert _filter(five, _member(0, 4, 5), names) == []
    assert five.cache.snapshot().node("dp-a").used_mask == 0  # type: ignore[union-attr]


def test_members_that_opted_in_get_the_plans_nvlink_sets_in_their_claims() -> None:
    """The gate removed with the choice annotation (the members opted in): on a DGX-1 DRA
    node the plan keeps the solver's NVLink-best pairs, gpu-0, gpu-3 and gpu-1, gpu-2 (two
    NVLinks each), and at bind each member's special claim, made by kube-scheduler's first
    fit, is given its slot's pair (``GateAllocator.reallocate``). The first claim's first
    fit (gpu-0, gpu-1) displaces the other slot for a moment; it gets its pair back."""
    ext = _ext(["dgx-a"], topology="dgx1-v100")
    api = PodClaimApi(ext.cache, {}, {})
    alloc = al.GateAllocator(
        ext.cache, api, lambda: [], settle_s=0.0, clock=lambda: 1_796_601_600.0, router=ext.dra
    )
    ext.dra.reallocate = alloc.reallocate
    pods = [_member(i, 2, 2) for i in range(2)]
    for p in pods:
        p["metadata"]["annotations"][DRA_CHOICE_ANNOTATION] = "true"
        assert _filter(ext, p, ["dgx-a"]) == ["dgx-a"]
    assert _slots(ext) == {
        "default/g-0": ("dgx-a", (0, 3), "reserved"),
        "default/g-1": ("dgx-a", (1, 2), "reserved"),
    }
    pick = ext.dra.extended_pick("default/g-0")
    assert pick is not None and pick.gpus == (0, 3)
    _prebind(ext, pods[0], "dgx-a", [0, 1], api)  # kube-scheduler's first fit
    assert _bind(ext, pods[0], "dgx-a") == ""
    claim0 = api.claims["default/g-0-extended-resources-abcde"]
    assert [d for _, _, d in dra.allocated_ids(claim0)] == ["gpu-0", "gpu-3"]
    assert _slots(ext)["default/g-1"] == ("dgx-a", (1, 2), "reserved")
    _prebind(ext, pods[1], "dgx-a", [1, 2], api)  # first fit beside gpu-0, gpu-3
    assert _bind(ext, pods[1], "dgx-a") == ""
    claim1 = api.claims["default/g-1-extended-resources-abcde"]
    assert [d for _, _, d in dra.allocated_ids(claim1)] == ["gpu-1", "gpu-2"]
    snap = ext.cache.snapshot()
    assert snap.pods["resourceclaim:default/g-0-extended-resources-abcde"].gpus == (0, 3)
    assert snap.pods["resourceclaim:default/g-1-extended-resources-abcde"].gpus == (1, 2)
    assert snap.node("dgx-a").used_mask == 0b1111  # type: ignore[union-attr]
    assert ext.gangs.describe_plans(ext)[GANG]["state"] == "complete"  # type: ignore[union-attr]


def test_the_allocator_releases_gated_members_with_the_choice_annotation() -> None:
    """Members gated with ``topoplace.io/allocate`` have no claim to allocate (kube-scheduler
    makes their special claims in PreBind): the allocator removes their gates together,
    writing the choice annotation the gang runtime reads (the previous test's opt-in)."""
    ext = _ext(["dgx-a"], topology="dgx1-v100")
    pods = [_member(i, 2, 2) for i in range(2)]
    for p in pods:
        p["spec"]["schedulingGates"] = [{"name": dra.ALLOCATE_GATE}]
    api = PodClaimApi(ext.cache, {}, {})
    alloc = al.GateAllocator(ext.cache, api, lambda: pods, settle_s=0.0, router=ext.dra)
    outs = alloc.step()
    assert {o.state for o in outs} == {al.RELEASED}
    assert sorted(api.ungated) == ["default/g-0", "default/g-1"]
    assert api.notes == {
        "default/g-0": {DRA_CHOICE_ANNOTATION: "true"},
        "default/g-1": {DRA_CHOICE_ANNOTATION: "true"},
    }
    # a gang of pods asking for no GPU is released without it
    plain = [_member(i, 2, 2) for i in range(2)]
    for p in plain:
        p["metadata"]["annotations"]["topoplace.io/gang"] = "cpu"
        p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
        p["spec"]["schedulingGates"] = [{"name": dra.ALLOCATE_GATE}]
    api2 = PodClaimApi(ext.cache, {}, {})
    alloc2 = al.GateAllocator(ext.cache, api2, lambda: plain, settle_s=0.0, router=ext.dra)
    assert {o.state for o in alloc2.step()} == {al.RELEASED}
    assert api2.notes == {}
