"""The prediction of kube-scheduler's DRA allocator against what v1.33.0 really allocated."""

from __future__ import annotations

import pytest

from scheduler.core import dra
from tests.dra import recorded


def _names(p: dra.Prediction) -> list[list[str]]:
    return [[d.name for d in c] for c in p.devices]


def _spec(key: str, version: str = "v1beta2") -> dra.ClaimSpec:
    return dra.claim_spec(recorded.claims(version)[key])


def _ids(*claims: str) -> frozenset[dra.DeviceId]:
    all_claims = recorded.claims()
    return dra.held_device_ids(all_claims[c] for c in claims)


@pytest.mark.parametrize("version", recorded.VERSIONS)
def test_prediction_equals_the_real_allocations_in_their_order(version: str) -> None:
    inv = dra.inventory(recorded.slices(version))
    classes = recorded.classes(version)
    # The scheduler allocated two-gpus first on an empty gpu-node-0 ...
    p = dra.first_fit(inv, "gpu-node-0", [_spec("default/two-gpus", version)], classes, ())
    assert (p.known, p.feasible, _names(p)) == (True, True, [["gpu-0", "gpu-1"]])
    # ... then same-root (pcieRoot constraint) next to it ...
    p = dra.first_fit(
        inv, "gpu-node-0", [_spec("default/same-root", version)], classes, _ids("default/two-gpus")
    )
    assert _names(p) == [["gpu-2", "gpu-3"]]
    # ... seven on gpu-node-1, skipping the tainted gpu-5 ...
    p = dra.first_fit(inv, "gpu-node-1", [_spec("default/pinned-seven", version)], classes, ())
    assert _names(p) == [["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-6", "gpu-7"]]
    assert p.gpus == (0, 1, 2, 3, 4, 6, 7)
    # ... and watched-two (recorded from the watch) with both gpu-node-0 claims held.
    watched = recorded.watch_events()[-1]["object"]
    p = dra.first_fit(
        inv,
        "gpu-node-0",
        [dra.claim_spec(watched)],
        classes,
        _ids("default/two-gpus", "default/same-root"),
    )
    real = [r["device"] for r in watched["status"]["allocation"]["devices"]["results"]]
    assert _names(p) == [real] == [["gpu-4", "gpu-5"]]


def test_no_room_and_taints_make_the_claim_infeasible() -> None:
    inv = dra.inventory(recorded.slices())
    held = _ids("default/pinned-seven")
    p = dra.first_fit(inv, "gpu-node-1", [_spec("default/pending-four")], recorded.classes(), held)
    assert (p.known, p.feasible) == (True, False)
    # Without the claim, 7 fit but not 8: gpu-5 is tainted NoSchedule.
    eight = dra.ClaimSpec("x/eight", (dra.Request("gpus", "gpu.nvidia.com", 8),))
    p = dra.first_fit(inv, "gpu-node-1", [eight], recorded.classes(), ())
    assert not p.feasible
    tolerant = dra.ClaimSpec(
        "x/eight",
        (
            dra.Request(
                "gpus",
                "gpu.nvidia.com",
                8,
                tolerations=(("gpu.nvidia.com/xid", "Exists", "", "NoSchedule"),),
            ),
        ),
    )
    assert dra.first_fit(inv, "gpu-node-1", [tolerant], recorded.classes(), ()).feasible


def test_match_attribute_backtracks() -> None:
    inv = dra.inventory(recorded.slices())
    held = {("gpu.nvidia.com", "gpu-node-0", "gpu-1")}
    # gpu-0 alone on its root (gpu-1 held): the allocator backtracks to gpu-2, gpu-3.
    p = dra.first_fit(inv, "gpu-node-0", [_spec("default/same-root")], recorded.classes(), held)
    assert _names(p) == [["gpu-2", "gpu-3"]]
    three = dra.ClaimSpec(
        "x/three",
        (dra.Request("gpus", "gpu.nvidia.com", 3),),
        (("resource.kubernetes.io/pcieRoot", ()),),
    )
    p = dra.first_fit(inv, "gpu-node-0", [three], recorded.classes(), ())
    assert (p.known, p.feasible) == (True, False)  # two GPUs per root, as observed live


def test_several_claims_of_one_pod_are_allocated_in_order() -> None:
    inv = dra.inventory(recorded.slices())
    a = dra.ClaimSpec("x/a", (dra.Request("r", "gpu.nvidia.com", 3),))
    b = dra.ClaimSpec("x/b", (dra.Request("r", "gpu.nvidia.com", 2),))
    p = dra.first_fit(inv, "gpu-node-0", [a, b], recorded.classes(), ())
    assert _names(p) == [["gpu-0", "gpu-1", "gpu-2"], ["gpu-3", "gpu-4"]]
    assert p.gpus == (0, 1, 2, 3, 4)


def test_all_mode_takes_every_matching_device_or_nothing() -> None:
    inv = dra.inventory(recorded.slices())
    every = dra.ClaimSpec("x/all", (dra.Request("r", "gpu.nvidia.com", all_devices=True),))
    p = dra.first_fit(inv, "gpu-node-0", [every], recorded.classes(), ())
    assert p.gpus == tuple(range(8))
    p = dra.first_fit(inv, "gpu-node-0", [every], recorded.classes(), _ids("default/two-gpus"))
    assert (p.known, p.feasible) == (True, False)


def test_selectors_outside_the_subset_give_an_unknown_prediction() -> None:
    inv = dra.inventory(recorded.slices())
    odd = dra.ClaimSpec(
        "x/odd",
        (
            dra.Request(
                "r",
                "gpu.nvidia.com",
                1,
                selectors=(
                    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
                ),
            ),
        ),
    )
    assert not dra.first_fit(inv, "gpu-node-0", [odd], recorded.classes(), ()).known
    unknown_class = dra.ClaimSpec("x/c", (dra.Request("r", "no-such-class", 1),))
    assert not dra.first_fit(inv, "gpu-node-0", [unknown_class], recorded.classes(), ()).known


@pytest.mark.parametrize(
    ("expr", "device", "want"),
    [
        ("device.driver == 'gpu.nvidia.com'", "gpu-0", True),
        ('device.driver == "other"', "gpu-0", False),
        ("device.attributes['gpu.nvidia.com'].index == 3", "gpu-3", True),
        ("device.attributes['gpu.nvidia.com'].index == 3", "gpu-4", False),
        ("device.attributes['gpu.nvidia.com'].index != 3", "gpu-4", True),
        (
            "device.attributes['gpu.nvidia.com'].type == 'gpu' && device.driver == 'gpu.nvidia.com'",
            "gpu-1",
            True,
        ),
        (
            "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'",
            "gpu-1",
            True,
        ),
        ("device.attributes['gpu.nvidia.com'].index == '3'", "gpu-3", False),  # typed
        ("device.attributes['gpu.nvidia.com'].missing == 1", "gpu-3", False),
    ],
)
def test_cel_subset(expr: str, device: str, want: bool) -> None:
    inv = dra.inventory(recorded.slices())
    d = next(x for x in inv.by_node["gpu-node-0"] if x.name == device)
    pred = dra.cel_predicate(expr)
    assert pred is not None
    assert pred(d) is want


@pytest.mark.parametrize(
    "expr",
    ["device.driver == 'a' || device.driver == 'b'", "!(device.driver == 'a')", "true", ""],
)
def test_cel_outside_the_subset_is_refused(expr: str) -> None:
    assert dra.cel_predicate(expr) is None


def test_shared_counters_keep_partitions_apart() -> None:
    """MIG-like devices in the shape ``fake_dra.py --mig`` writes (v1beta2): the full GPU
    and its partitions draw from one counter set."""
    counters = {"memory": {"value": "80Gi"}, **{f"s{i}": {"value": "1"} for i in range(2)}}

    def dev(name: str, typ: str, slots: list[int], mem: str) -> dict:
        use = {"memory": {"value": mem}, **{f"s{i}": {"value": "1"} for i in slots}}
        return {
            "name": name,
            "attributes": {"type": {"string": typ}, "index": {"int": 0}, "parentIndex": {"int": 0}},
            "consumesCounters": [{"counterSet": "gpu-0-cs", "counters": use}],
        }

    sl = {
        "kind": "ResourceSlice",
        "metadata": {"name": "n-gpu-0"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n",
            "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
            "sharedCounters": [{"name": "gpu-0-cs", "counters": counters}],
            "devices": [
                dev("gpu-0", "gpu", [0, 1], "80Gi"),
                dev("gpu-0-mig-a", "mig", [0], "40Gi"),
                dev("gpu-0-mig-b", "mig", [1], "40Gi"),
            ],
        },
    }
    inv = dra.inventory([sl])
    assert [d.gpu for d in inv.by_node["n"]] == [0, 0, 0]
    classes = {
        "mig": {
            "spec": {
                "selectors": [
                    {"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'mig'"}}
                ]
            }
        },
        "gpu": {
            "spec": {
                "selectors": [
                    {"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}
                ]
            }
        },
    }
    mig = dra.ClaimSpec("x/m", (dra.Request("r", "mig", 1),))
    full = dra.ClaimSpec("x/f", (dra.Request("r", "gpu", 1),))
    a = ("gpu.nvidia.com", "n", "gpu-0-mig-a")
    p = dra.first_fit(inv, "n", [mig], classes, {a})
    assert _names(p) == [["gpu-0-mig-b"]]
    assert not dra.first_fit(inv, "n", [full], classes, {a}).feasible
    assert dra.first_fit(inv, "n", [full], classes, ()).feasible
    claim = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0-mig-a"}]
                }
            }
        }
    }
    assert dra.claim_holding(claim, inv) == ("n", (0,))  # a partition holds its parent GPU


def _search_only(
    inv: dra.Inventory, node: str, specs: list[dra.ClaimSpec], held: frozenset, budget: int
) -> dra.Prediction:
    """The allocator's search alone (no shortcut), on the slots first_fit builds."""
    comp = dra.compile_claims(specs, recorded.classes())
    slots: list = []
    for e in comp.entries:
        if e.request is None or e.preds is None:
            return dra.UNKNOWN
        cands = dra.request_candidates(inv.by_node.get(node, ()), e)
        if e.request.all_devices:
            if not cands:
                return dra.INFEASIBLE
            slots.extend((e.claim, e.request, (d,)) for d in cands)
        else:
            slots.extend((e.claim, e.request, cands) for _ in range(e.request.count))
    return dra._search(inv, comp.claims, slots, held, budget)


def test_the_one_request_shortcut_answers_as_the_search_does() -> None:
    """Every count on both recorded nodes (gpu-5 of gpu-node-1 tainted), with every held
    subset of four devices drawn deterministically, one claim or the claim after an
    empty one: same devices, GPUs and verdict as the search, where the search decides
    within its budget."""
    import random

    inv = dra.inventory(recorded.slices())
    classes = recorded.classes()
    rng = random.Random(7)
    empty = dra.ClaimSpec("x/empty", ())
    checked = feasible = 0
    for node in ("gpu-node-0", "gpu-node-1"):
        ids = [d.id for d in inv.by_node[node]]
        for _ in range(40):
            held = frozenset(rng.sample(ids, rng.randint(0, 5)))
            for count in range(1, 9):
                spec = dra.ClaimSpec("x/c", (dra.Request("gpus", "gpu.nvidia.com", count),))
                for specs in ([spec], [empty, spec]):
                    want = _search_only(inv, node, specs, held, 10**7)
                    got = dra.first_fit(inv, node, specs, classes, held)
                    assert (got.known, got.feasible, got.devices, got.gpus) == (
                        want.known,
                        want.feasible,
                        want.devices,
                        want.gpus,
                    ), (node, sorted(held), count, len(specs))
                    checked += 1
                    feasible += got.feasible
    assert checked == 1280 and 0 < feasible < checked


def test_too_few_free_devices_is_infeasible_without_trying_every_order() -> None:
    """8 GPUs on a node with one held: the search tries every order of the 7 free ones
    (tens of thousands of steps); the answer is infeasible, also on a budget the search
    would exhaust."""
    inv = dra.inventory(recorded.slices())
    held = frozenset({inv.by_node["gpu-node-0"][0].id})
    eight = dra.ClaimSpec("x/eight", (dra.Request("gpus", "gpu.nvidia.com", 8),))
    assert _search_only(inv, "gpu-node-0", [eight], held, 1000) == dra.UNKNOWN
    p = dra.first_fit(inv, "gpu-node-0", [eight], recorded.classes(), held, max_steps=1000)
    assert (p.known, p.feasible) == (True, False)
