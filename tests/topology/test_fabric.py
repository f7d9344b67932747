"""Cluster fabric from node labels (topology.fabric)."""

from __future__ import annotations

import copy

import pytest

from topology.fabric import DEFAULT_CROSS_CLUSTER_GBPS, DEFAULT_LEVELS, Fabric, FabricLevel
from topology.shape import CATALOG, assumed_shape

CLIQUE = "nvidia.com/gpu.clique"
ACC = "network.topology.nvidia.com/accelerator"
LEAF = "network.topology.nvidia.com/leaf"
BLOCK = "network.topology.nvidia.com/block"
SPINE = "network.topology.nvidia.com/spine"
CORE = "network.topology.nvidia.com/core"
ZONE = "topology.kubernetes.io/zone"

FABRIC = Fabric()

# A small hand-built cluster: two GB200 racks (one split in two cliques) on leaf L1, a DGX
# pair on leaf L2 (same spine S1), one node under spine S2 (same core), one in another core of
# the zone, one in another zone, one unlabelled.
NODES = {
    "gb-a1": {CLIQUE: "uuid-A.1", LEAF: "L1", SPINE: "S1", CORE: "C1", ZONE: "z1"},
    "gb-a2": {CLIQUE: "uuid-A.2", LEAF: "L1", SPINE: "S1", CORE: "C1", ZONE: "z1"},
    "gb-b1": {CLIQUE: "uuid-B.1", LEAF: "L1", SPINE: "S1", CORE: "C1", ZONE: "z1"},
    "dgx-1": {LEAF: "L2", SPINE: "S1", CORE: "C1", ZONE: "z1"},
    "dgx-2": {BLOCK: "L2", SPINE: "S1", CORE: "C1", ZONE: "z1"},  # older Topograph key
    "far-1": {LEAF: "L3", SPINE: "S2", CORE: "C1", ZONE: "z1"},
    "far-2": {LEAF: "L4", SPINE: "S3", CORE: "C2", ZONE: "z1"},
    "other-zone": {LEAF: "L9", SPINE: "S9", CORE: "C9", ZONE: "z2"},
    "bare": {},
}


def path(name: str) -> tuple:
    return FABRIC.path(NODES[name])


def test_path_extraction() -> None:
    labels = copy.deepcopy(NODES["gb-a2"])
    assert FABRIC.path(labels) == ("uuid-A", None, "L1", "S1", "C1", "z1")
    assert labels == NODES["gb-a2"]  # not mutated
    assert path("dgx-2") == (None, None, "L2", "S1", "C1", "z1")  # /block fallback
    assert path("bare") == (None,) * 6
    assert FABRIC.path({LEAF: "", BLOCK: "B7"})[2] == "B7"  # empty value = absent
    assert FABRIC.path({ACC: "nvl-7"})[1] == "nvl-7"


def test_level_index() -> None:
    assert [FABRIC.level_index(lv.name) for lv in DEFAULT_LEVELS] == list(range(6))
    with pytest.raises(ValueError, match="nvlink-domain, accelerator, leaf"):
        FABRIC.level_index("rack")


DISTANCES = [
    ("same rack, different clique: one NVLink domain", "gb-a1", "gb-a2", 0, 900.0),
    ("different racks on one leaf", "gb-a1", "gb-b1", 2, 50.0),
    ("leaf via /leaf and via /block", "dgx-1", "dgx-2", 2, 50.0),
    ("same spine", "gb-a1", "dgx-1", 3, 25.0),
    ("same core", "dgx-1", "far-1", 4, 12.5),
    ("same zone only", "dgx-1", "far-2", 5, 3.125),
    ("different zones", "dgx-1", "other-zone", 6, DEFAULT_CROSS_CLUSTER_GBPS),
    ("unlabelled node shares nothing (None != None)", "bare", "bare", 6, 1.25),
]


@pytest.mark.parametrize(
    ("desc", "a", "b", "level", "gbps"), DISTANCES, ids=[d[0] for d in DISTANCES]
)
def test_common_level_and_bandwidth(desc: str, a: str, b: str, level: int, gbps: float) -> None:
    assert FABRIC.common_level(path(a), path(b)) == level
    assert FABRIC.common_level(path(b), path(a)) == level
    assert FABRIC.bandwidth_between(path(a), path(b)) == gbps


def _member(name: str, shape=None, gpus=(0, 1, 2, 3)):
    return (path(name), shape or CATALOG["gb200-nvl72-tray"], gpus)


COLLECTIVE = [
    ("single node: intra-node ring", [_member("dgx-1", CATALOG["dgx1-v100"], (0, 3))], 50.0),
    ("single GPU: no ring", [_member("dgx-1", CATALOG["dgx1-v100"], (5,))], 0.0),
    ("empty placement", [], 0.0),
    ("two trays of one NVL72 rack", [_member("gb-a1"), _member("gb-a2")], 900.0),
    (
        "three trays: one rack + another on the leaf",
        [_member("gb-a1"), _member("gb-b1"), _member("gb-a2")],
        50.0,
    ),
    # Interleaved input order; the ring is reordered by path, so it crosses the spine twice.
    (
        "two leaves under one spine, interleaved",
        [_member("gb-a1"), _member("dgx-1"), _member("gb-b1"), _member("dgx-2")],
        25.0,
    ),
    ("across zones", [_member("dgx-1"), _member("other-zone")], 1.25),
    # Only the tray with GPUs remains: its own 4-GPU NV18 ring (18 x 50 GB/s).
    ("members without GPUs are ignored", [_member("gb-a1"), _member("far-2", gpus=())], 900.0),
]


@pytest.mark.parametrize(("desc", "members", "gbps"), COLLECTIVE, ids=[c[0] for c in COLLECTIVE])
def test_collective_bandwidth(desc: str, members: list, gbps: float) -> None:
    before = copy.deepcopy(members)
    assert FABRIC.collective_bandwidth(members) == gbps
    assert members == before


def test_ring_order_groups_domains() -> None:
    names = ["far-2", "gb-a1", "dgx-1", "gb-b1", "far-1", "gb-a2", "dgx-2"]
    order = FABRIC.ring_order([path(n) for n in names])
    visited = [names[i] for i in order]
    # Same leaf L1 contiguous (and the two cliques of rack A adjacent), L2 contiguous.
    l1 = [visited.index(n) for n in ("gb-a1", "gb-a2", "gb-b1")]
    assert max(l1) - min(l1) == 2
    assert abs(visited.index("gb-a1") - visited.index("gb-a2")) == 1
    assert abs(visited.index("dgx-1") - visited.index("dgx-2")) == 1


def test_include_intra_node_exposes_slow_nodes() -> None:
    pcie = assumed_shape(4)
    members = [_member("gb-a1", pcie), _member("gb-a2", pcie)]
    assert FABRIC.collective_bandwidth(members) == 900.0
    assert FABRIC.collective_bandwidth(members, include_intra_node=True) == 7.875


def test_from_config() -> None:
    obj = {
        "levels": [
            {"name": "rack", "labels": "example.com/rack", "bandwidth_gbps": 100},
            {
                "name": "nvl",
                "labels": [CLIQUE],
                "bandwidth_gbps": 900,
                "transform": "clique-prefix",
            },
        ],
        "cross_cluster_gbps": 2,
    }
    before = copy.deepcopy(obj)
    fabric = Fabric.from_config(obj)
    assert obj == before
    assert [lv.name for lv in fabric.levels] == ["rack", "nvl"]
    assert fabric.levels[0] == FabricLevel("rack", ("example.com/rack",), 100.0)
    assert fabric.path({CLIQUE: "u.3", "example.com/rack": "r1"}) == ("r1", "u")
    assert fabric.cross_cluster_gbps == 2.0
    assert Fabric.from_config({}) == Fabric()


@pytest.mark.parametrize(
    ("desc", "obj", "match"),
    [
        ("not a mapping", [], "mapping"),
        ("levels not a list", {"levels": "leaf"}, "list"),
        ("level not a mapping", {"levels": [3]}, "mapping"),
        ("no name", {"levels": [{"labels": ["a"], "bandwidth_gbps": 1}]}, "name"),
        ("no labels", {"levels": [{"name": "a", "labels": [], "bandwidth_gbps": 1}]}, "label_keys"),
        (
            "zero bandwidth",
            {"levels": [{"name": "a", "labels": ["a"], "bandwidth_gbps": 0}]},
            "> 0",
        ),
        (
            "bool bandwidth",
            {"levels": [{"name": "a", "labels": ["a"], "bandwidth_gbps": True}]},
            "number",
        ),
        (
            "bad transform",
            {"levels": [{"name": "a", "labels": ["a"], "bandwidth_gbps": 1, "transform": "x"}]},
            "transform",
        ),
        (
            "duplicate names",
            {"levels": [{"name": "a", "labels": ["a"], "bandwidth_gbps": 1}] * 2},
            "unique",
        ),
        ("bad cross", {"cross_cluster_gbps": -1}, "cross_cluster_gbps"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_from_config_errors(desc: str, obj: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Fabric.from_config(obj)  # type: ignore[arg-type]
