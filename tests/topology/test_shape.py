"""GPU shapes: catalog, topo -m / link-list parsing, node resolution (topology.shape)."""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
import time

import pytest

from tests.topology._support import REPO, TOPOLOGIES, topology_file
from topology.shape import (
    ANNOTATION_KEY,
    CATALOG,
    GpuShape,
    assumed_shape,
    build_shape,
    catalog_shape,
    check_topology_annotation,
    infer_generation,
    parse_link_list,
    parse_topo_matrix,
    parse_topology_spec,
    resolve_node_shape,
)

# --------------------------------------------------------------------------------------------
# Real matrices: (description, file, GPUs, generation, catalog twin, [(i, j, label, NVLinks,
# PCIe letter)], NUMA groups)
# --------------------------------------------------------------------------------------------

REAL = [
    (
        "DGX-1 V100 hybrid cube-mesh, NIC columns, PCIe of NVLinked pairs from PIX NICs",
        "dgx1_v100_hybrid_cube_mesh.txt",
        8,
        "V100",
        "dgx1-v100",
        [
            (0, 1, "NV1", 1, "PIX"),  # both PIX to mlx5_0
            (0, 2, "NV1", 1, "PHB"),  # GPU2 PIX mlx5_1; GPU0-mlx5_1 is PHB
            (0, 3, "NV2", 2, "PHB"),
            (0, 4, "NV2", 2, "SYS"),  # cross socket
            (0, 5, "SYS", 0, "SYS"),
            (2, 3, "NV2", 2, "PIX"),
            (6, 7, "NV2", 2, "PIX"),
        ],
        (0, 0, 0, 0, 1, 1, 1, 1),  # from CPU Affinity groups (no NUMA column)
    ),
    (
        "DGX-2 class PARTIAL: rows GPU0-4 prove all-to-all NV6, unseen pairs inferred",
        "dgx2_v100_nvswitch_PARTIAL.txt",
        16,
        "V100",
        "dgx2-v100",
        [
            (0, 15, "NV6", 6, "SYS"),  # seen in row 0
            (7, 12, "NV6", 6, "SYS"),  # never seen: inferred from the NVSwitch proof
            (14, 15, "NV6", 6, "SYS"),
            (0, 1, "NV6", 6, "PIX"),
            (1, 2, "NV6", 6, "PXB"),
            (3, 4, "NV6", 6, "NODE"),
        ],
        (),
    ),
    (
        "DGX A100 NV12 NVSwitch, 12 NICs, NUMA column",
        "dgx_a100_nv12_nvswitch.txt",
        8,
        "A100",
        "dgx-a100",
        [(0, 1, "NV12", 12, "SYS"), (3, 6, "NV12", 12, "SYS")],
        (3, 3, 1, 1, 7, 7, 5, 5),
    ),
    (
        "GB200 NVL72 tray, space separated, GPU NUMA ID column",
        "gb200_nvl72_compute_tray.txt",
        4,
        "GB200",
        "gb200-nvl72-tray",
        [(0, 3, "NV18", 18, "SYS"), (1, 2, "NV18", 18, "SYS")],
        (0, 0, 1, 1),
    ),
    (
        "H100 NV18, NIC rows truncated, empty cell before GPU NUMA ID",
        "hgx_h100_nv18_nccl1453.txt",
        8,
        "H100",
        "dgx-h100",
        [(0, 1, "NV18", 18, "NODE"), (0, 4, "NV18", 18, "SYS"), (5, 7, "NV18", 18, "NODE")],
        (0, 0, 0, 0, 1, 1, 1, 1),
    ),
    (
        "H200 NV18 with NIC legend (H100 also named in comments: first product wins)",
        "hgx_h200_nv18_full.txt",
        8,
        "H200",
        "hgx-h200",
        [(0, 7, "NV18", 18, "SYS")],
        (0, 0, 0, 0, 1, 1, 1, 1),
    ),
    (
        "PCIe-only PIX/PXB/SYS tree, legend omitted, GPU model unknown",
        "pcie_8gpu_pix_pxb_sys.txt",
        8,
        "unknown",
        "pcie-8gpu-2socket",
        [
            (0, 1, "PIX", 0, "PIX"),
            (0, 2, "PXB", 0, "PXB"),
            (3, 4, "SYS", 0, "SYS"),
            (6, 7, "PIX", 0, "PIX"),
        ],
        (0, 0, 0, 0, 1, 1, 1, 1),
    ),
    (
        "8x RTX 4090 all SYS, NUMA only in affinity columns",
        "pcie_8x_rtx4090_all_sys.txt",
        8,
        "RTX4090",
        "rtx4090-8gpu-pcie",
        [(0, 1, "SYS", 0, "SYS"), (3, 4, "SYS", 0, "SYS")],
        (0, 0, 0, 0, 1, 1, 1, 1),
    ),
]


@pytest.mark.parametrize(
    ("desc", "filename", "n", "gen", "twin", "pairs", "numa"), REAL, ids=[r[0] for r in REAL]
)
def test_parse_real_matrix(
    desc: str, filename: str, n: int, gen: str, twin: str, pairs: list, numa: tuple
) -> None:
    shape = parse_topo_matrix(topology_file(filename).read_text())
    assert shape.num_gpus == n  # NIC rows/columns are not GPUs
    assert shape.generation == gen
    assert shape.numa == numa
    assert not shape.assumed
    assert shape.name.startswith("topo-m:")
    for i, j, label, k, pcie in pairs:
        assert shape.links[i][j] == shape.links[j][i] == label, (i, j)
        assert shape.nvlinks[i][j] == k, (i, j)
        assert shape.pcie[i][j] == pcie, (i, j)


@pytest.mark.parametrize(
    ("desc", "filename", "n", "gen", "twin", "pairs", "numa"), REAL, ids=[r[0] for r in REAL]
)
def test_parsed_matrix_equals_its_catalog_transcription(
    desc: str, filename: str, n: int, gen: str, twin: str, pairs: list, numa: tuple
) -> None:
    """The catalog is a transcription of the real file: same links, PCIe, bandwidth, NUMA."""
    parsed = parse_topo_matrix(topology_file(filename).read_text())
    entry = catalog_shape(twin)
    assert parsed.links == entry.links
    assert parsed.nvlinks == entry.nvlinks
    assert parsed.pcie == entry.pcie
    assert parsed.bandwidth == entry.bandwidth
    assert parsed.generation == entry.generation
    assert parsed.numa == entry.numa


def test_every_shared_matrix_is_covered() -> None:
    if not TOPOLOGIES.is_dir():
        pytest.skip(f"shared topology data not present: {TOPOLOGIES}")
    files = {p.name for p in TOPOLOGIES.glob("*.txt")}
    assert files == {r[1] for r in REAL}


def test_partial_dgx2_documents_inference() -> None:
    shape = parse_topo_matrix(topology_file("dgx2_v100_nvswitch_PARTIAL.txt").read_text())
    assert "inferred NV6" in shape.source
    assert "55 unseen" in shape.source  # 11 hidden rows: C(11, 2) pairs never printed


def test_name_ignores_comments_but_not_content() -> None:
    text = topology_file("dgx1_v100_hybrid_cube_mesh.txt").read_text()
    bare = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    with_comments = parse_topo_matrix(text)
    without = parse_topo_matrix(bare, generation="V100")
    assert with_comments == without and hash(with_comments) == hash(without)
    assert parse_topo_matrix(bare).generation == "unknown"
    assert parse_topo_matrix(bare).name != with_comments.name  # generation is content


def test_generation_argument_accepts_product_text() -> None:
    text = topology_file("pcie_8gpu_pix_pxb_sys.txt").read_text()
    assert parse_topo_matrix(text, generation="Tesla-V100-PCIE-16GB").generation == "V100"
    assert parse_topo_matrix(text, name="my-box").name == "my-box"


# --------------------------------------------------------------------------------------------
# Synthetic topo -m edge cases
# --------------------------------------------------------------------------------------------

OLD_DRIVER = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity
GPU0\t X \tPIX\tSOC\tSOC\t0-7
GPU1\tPIX\t X \tSOC\tSOC\t0-7
GPU2\tSOC\tSOC\t X \tPHB\t8-15
GPU3\tSOC\tSOC\tPHB\t X \t8-15

Legend:
  X   = Self
  SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)
"""


def test_soc_is_sys() -> None:
    shape = parse_topo_matrix(OLD_DRIVER)
    assert shape.links[0][2] == shape.pcie[0][2] == "SYS"
    assert shape.links[2][3] == "PHB"
    assert shape.numa == (0, 0, 1, 1)


NV_BRIDGES_PARTIAL = """\
        GPU0    GPU1    GPU2    GPU3    CPU Affinity
GPU0     X      NV2     NV2     NV2     0-7
# [truncated]
"""

MIXED_PARTIAL = """\
        GPU0    GPU1    GPU2    GPU3
GPU0     X      NV1     NV1     NV2
GPU1    NV1      X      NV2     NV1
"""


@pytest.mark.parametrize(
    ("desc", "text", "unseen"),
    [
        ("uniform NV2 but 2x3=6 links <= 18: could be bridges", NV_BRIDGES_PARTIAL, (1, 2)),
        ("mixed NV1/NV2 visible rows", MIXED_PARTIAL, (2, 3)),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 80 and "\n" not in v else "",
)
def test_unseen_pairs_are_not_given_nvlink_without_proof(
    desc: str, text: str, unseen: tuple[int, int]
) -> None:
    shape = parse_topo_matrix(text)
    i, j = unseen
    assert shape.nvlinks[i][j] == 0
    assert shape.links[i][j] == "SYS"
    assert "assumed SYS" in shape.source


@pytest.mark.parametrize(
    ("desc", "k", "expected"),
    [
        ("NV6 x 2 peers = 12 links: not proven switched, unseen pair SYS", 6, "SYS"),
        ("NV18 x 2 peers = 36 links > 18: switched, unseen pair NV18", 18, "NV18"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) > 5 else "",
)
def test_row_cut_mid_cell(desc: str, k: int, expected: str) -> None:
    text = f"\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV{k}\tNV{k}\nGPU1\tNV{k}\t X \tN"
    shape = parse_topo_matrix(text)
    assert shape.links[0][1] == shape.links[0][2] == f"NV{k}"
    assert shape.links[1][2] == expected  # the cut "N" is not read as data


def test_single_gpu() -> None:
    shape = parse_topo_matrix("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-11\t0\n")
    assert shape.num_gpus == 1 and shape.full_mask() == 1 and shape.numa == (0,)


@pytest.mark.parametrize(
    ("desc", "text", "match"),
    [
        ("no header", "hello\nworld\n", "no nvidia-smi topo -m header"),
        ("garbage cell", "\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tFOO\t X \n", "unknown topology"),
        ("GPU columns out of order", "\tGPU0\tGPU2\nGPU0\t X \tPIX\n", "GPU columns"),
        ("duplicate row", "\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU0\t X \tPIX\n", "twice"),
        ("asymmetric", "\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tSYS\t X \n", "one way"),
        ("bad diagonal", "\tGPU0\tGPU1\nGPU0\tPIX\tPIX\n", "diagonal"),
        (
            "17 GPUs",
            "\t" + "\t".join(f"GPU{i}" for i in range(17)) + "\nGPU0\t X\n",
            "exceeds",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 40 and "\n" not in v else "",
)
def test_malformed_topo_matrix(desc: str, text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_topo_matrix(text)


# --------------------------------------------------------------------------------------------
# Link lists and auto-detection
# --------------------------------------------------------------------------------------------

V100_LINKLIST = {
    "gpus": 8,
    "gpu": "V100",
    "nvlinks": [[0, 1, 1], [0, 2, 1], [0, 3, 2], [0, 4, 2], [1, 2, 2], [1, 3, 1], [1, 5, 2]]
    + [[2, 3, 2], [2, 6, 1], [3, 7, 1], [4, 5, 1], [4, 6, 1], [4, 7, 2], [5, 6, 2], [5, 7, 1]]
    + [[6, 7, 2]],
    "pcie": [[0, 1, "PIX"], [2, 3, "PIX"], [4, 5, "PIX"], [6, 7, "PIX"]]
    + [[i, j, "PHB"] for g in ((0, 1, 2, 3), (4, 5, 6, 7)) for i in g for j in g if i < j]
    + [],
    "numa": [0, 0, 0, 0, 1, 1, 1, 1],
}


def _v100_linklist() -> dict:
    obj = copy.deepcopy(V100_LINKLIST)
    # PIX pairs were listed twice (once PIX, once PHB): keep the PIX ones only.
    pix = {(0, 1), (2, 3), (4, 5), (6, 7)}
    obj["pcie"] = [e for e in obj["pcie"] if e[2] == "PIX" or (e[0], e[1]) not in pix]
    return obj


def test_link_list_reproduces_catalog_and_is_not_mutated() -> None:
    obj = _v100_linklist()
    before = copy.deepcopy(obj)
    shape = parse_link_list(obj)
    assert obj == before
    twin = catalog_shape("dgx1-v100")
    assert (shape.links, shape.pcie, shape.bandwidth) == (twin.links, twin.pcie, twin.bandwidth)
    assert shape.name.startswith("linklist:") and shape.source == "link list"


@pytest.mark.parametrize(
    ("desc", "obj", "match"),
    [
        ("gpus missing", {"nvlinks": []}, "'gpus'"),
        ("gpus zero", {"gpus": 0}, "'gpus'"),
        ("gpus 17", {"gpus": 17}, "'gpus'"),
        ("gpus bool", {"gpus": True}, "'gpus'"),
        ("index out of range", {"gpus": 2, "nvlinks": [[0, 2, 1]]}, "out of range"),
        ("self link", {"gpus": 2, "nvlinks": [[1, 1, 1]]}, "itself"),
        ("zero links", {"gpus": 2, "nvlinks": [[0, 1, 0]]}, ">= 1"),
        ("conflict", {"gpus": 2, "nvlinks": [[0, 1, 1], [1, 0, 2]]}, "conflicting"),
        ("bad pcie", {"gpus": 2, "pcie": [[0, 1, "NV2"]]}, "PCIe"),
        ("short entry", {"gpus": 2, "pcie": [[0, 1]]}, r"\[i, j, value\]"),
        ("numa length", {"gpus": 2, "numa": [0]}, "'numa'"),
        ("not a mapping", [1, 2], "mapping"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_link_list_errors(desc: str, obj: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_link_list(obj)  # type: ignore[arg-type]


def test_link_list_same_pair_listed_twice_consistently_is_fine() -> None:
    shape = parse_link_list({"gpus": 2, "nvlinks": [[0, 1, 2], [1, 0, 2]], "gpu": "A100"})
    assert shape.nvlinks[0][1] == 2 and shape.bandwidth[0][1] == 50.0


def test_spec_autodetect() -> None:
    obj = {"gpus": 2, "gpu": "H100", "nvlinks": [[0, 1, 18]]}
    from_json = parse_topology_spec(json.dumps(obj))
    from_yaml = parse_topology_spec("gpus: 2\ngpu: H100\nnvlinks:\n  - [0, 1, 18]\n")
    assert from_json == from_yaml == parse_link_list(obj)
    assert parse_topology_spec("  dgx1-p100\n") is CATALOG["dgx1-p100"]
    text = topology_file("gb200_nvl72_compute_tray.txt").read_text()
    assert parse_topology_spec(text).links == CATALOG["gb200-nvl72-tray"].links


@pytest.mark.parametrize("text", ["dgx-9000", "{not json", "gpus: [", "- 1\n- 2\n", ""], ids=repr)
def test_spec_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_topology_spec(text)


# --------------------------------------------------------------------------------------------
# Catalog and value semantics
# --------------------------------------------------------------------------------------------

REQUIRED_CATALOG = [
    "dgx1-p100",
    "dgx1-v100",
    "dgx2-v100",
    "dgx-a100",
    "dgx-h100",
    "hgx-h200",
    "hgx-b200",
    "gb200-nvl72-tray",
    "pcie-8gpu-2socket",
    "rtx-4gpu-nvlink-pairs",
]


def test_catalog_has_required_shapes() -> None:
    assert set(REQUIRED_CATALOG) <= set(CATALOG)


# Per shape: (GPUs, generation, NVLinks per GPU summed over peers for GPU0, bandwidth 0-1).
CATALOG_FACTS = {
    "dgx1-p100": (8, "P100", 4, 20.0),  # 4 NVLink 1.0 links per P100
    "dgx1-v100": (8, "V100", 6, 25.0),  # 6 NVLink 2.0 links per V100
    "dgx2-v100": (16, "V100", 6 * 15, 150.0),  # switched: NV6 to each of 15 peers
    "dgx-a100": (8, "A100", 12 * 7, 300.0),
    "dgx-h100": (8, "H100", 18 * 7, 450.0),
    "hgx-h200": (8, "H200", 18 * 7, 450.0),
    "hgx-b200": (8, "B200", 18 * 7, 900.0),
    "gb200-nvl72-tray": (4, "GB200", 18 * 3, 900.0),
    "pcie-8gpu-2socket": (8, "unknown", 0, 15.75),
    "rtx-4gpu-nvlink-pairs": (4, "RTX8000", 2, 12.6),  # 0-1 NODE on Gen3
    "rtx4090-8gpu-pcie": (8, "RTX4090", 0, 15.75),
}


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_catalog_shape_is_consistent(name: str) -> None:
    shape = catalog_shape(name)
    n, gen, links0, bw01 = CATALOG_FACTS[name]
    assert (shape.name, shape.num_gpus, shape.generation) == (name, n, gen)
    assert sum(shape.nvlinks[0]) == links0
    assert shape.bandwidth[0][1] == pytest.approx(bw01)
    assert shape.full_mask() == (1 << n) - 1
    assert shape.source and not shape.assumed
    for i in range(n):
        assert shape.links[i][i] == "X" and shape.bandwidth[i][i] == 0.0
        for j in range(n):
            assert shape.links[i][j] == shape.links[j][i]
            assert shape.bandwidth[i][j] == shape.bandwidth[j][i]
            if i != j:
                assert shape.bandwidth[i][j] > 0


def test_catalog_unknown_name_lists_names() -> None:
    with pytest.raises(KeyError, match="dgx1-v100"):
        catalog_shape("dgx-9000")


def test_shape_validation_rejects_inconsistent_matrices() -> None:
    good = catalog_shape("rtx-4gpu-nvlink-pairs")
    links = [list(r) for r in good.links]
    links[0][3] = links[3][0] = "NV1"  # disagrees with nvlinks (NV2)
    with pytest.raises(ValueError, match="disagrees"):
        GpuShape(
            good.name,
            4,
            good.generation,
            tuple(map(tuple, links)),
            good.nvlinks,
            good.pcie,
            good.bandwidth,
            False,
            "",
        )
    with pytest.raises(ValueError):
        build_shape("x", 17, "V100")


def test_assumed_shape() -> None:
    shape = assumed_shape(8)
    assert shape.assumed and shape.name == "assumed-sys-8"
    assert {shape.links[i][j] for i in range(8) for j in range(8) if i != j} == {"SYS"}
    assert sum(map(sum, shape.nvlinks)) == 0
    assert assumed_shape(8) is shape  # memoized
    assert assumed_shape(8, "H100").bandwidth[0][1] == 31.5  # Gen5 x16 x 0.5
    assert assumed_shape(32).num_gpus == 32  # time-sliced capacity may exceed 16


@pytest.mark.parametrize(
    ("text", "gen"),
    [
        ("NVIDIA-H100-80GB-HBM3", "H100"),
        ("NVIDIA-GB200", "GB200"),
        ("NVIDIA-B200", "B200"),
        ("Tesla-V100-SXM2-16GB", "V100"),
        ("Quadro-RTX-8000", "RTX8000"),
        ("NVIDIA-GeForce-RTX-4090", "RTX4090"),
        ("8x H200 ... same fabric as H100", "H200"),
        ("NVIDIA-L40S", "unknown"),
    ],
    ids=lambda v: str(v),
)
def test_infer_generation(text: str, gen: str) -> None:
    assert infer_generation(text) == gen


# --------------------------------------------------------------------------------------------
# resolve_node_shape
# --------------------------------------------------------------------------------------------

P = "nvidia.com/gpu.product"
C = "nvidia.com/gpu.count"
M = "nvidia.com/gpu.machine"
LINKLIST_2 = json.dumps({"gpus": 2, "nvlinks": [[0, 1, 4]], "gpu": "V100"})

RESOLVE = [
    ("annotation catalog name", {}, {ANNOTATION_KEY: "dgx1-v100"}, 8, "dgx1-v100", "annotation"),
    ("annotation link list", {}, {ANNOTATION_KEY: LINKLIST_2}, 2, "linklist:", "annotation"),
    (
        "annotation wins over GFD",
        {P: "NVIDIA-H100-80GB-HBM3"},
        {ANNOTATION_KEY: "hgx-h200"},
        8,
        "hgx-h200",
        "annotation",
    ),
    (
        "malformed annotation falls back to GFD",
        {P: "Tesla-V100-SXM2-32GB", C: "8"},
        {ANNOTATION_KEY: "{broken"},
        8,
        "dgx1-v100",
        "gfd",
    ),
    (
        "malformed annotation, no GFD",
        {},
        {ANNOTATION_KEY: "GPU0 GPU1\nzzz"},
        4,
        "assumed-",
        "assumed",
    ),
    (
        "annotation GPU count disagrees with node",
        {},
        {ANNOTATION_KEY: "dgx1-v100"},
        4,
        "assumed-sys-4",
        "assumed",
    ),
    ("GFD H100 SXM", {P: "NVIDIA-H100-80GB-HBM3"}, {}, 8, "dgx-h100", "gfd"),
    ("GFD A100 SXM4", {P: "NVIDIA-A100-SXM4-80GB", C: "8"}, {}, 8, "dgx-a100", "gfd"),
    ("GFD V100 SXM3 x16", {P: "Tesla-V100-SXM3-32GB"}, {}, 16, "dgx2-v100", "gfd"),
    ("GFD P100 SXM2", {P: "Tesla-P100-SXM2-16GB"}, {}, 8, "dgx1-p100", "gfd"),
    ("GFD H200", {P: "NVIDIA-H200"}, {}, 8, "hgx-h200", "gfd"),
    ("GFD B200", {P: "NVIDIA-B200"}, {}, 8, "hgx-b200", "gfd"),
    ("GFD GB200 tray", {P: "NVIDIA-GB200"}, {}, 4, "gb200-nvl72-tray", "gfd"),
    ("GFD machine DGX-2 only", {M: "NVIDIA DGX-2"}, {}, 16, "dgx2-v100", "gfd"),
    ("PCIe A100: no NVLink invented", {P: "NVIDIA-A100-PCIE-40GB"}, {}, 8, "assumed-", "assumed"),
    ("H100 PCIe: no NVLink invented", {P: "NVIDIA-H100-PCIe"}, {}, 8, "assumed-", "assumed"),
    ("RTX 8000: bridges optional", {P: "Quadro-RTX-8000"}, {}, 4, "assumed-", "assumed"),
    ("GPU count mismatch", {P: "NVIDIA-H100-80GB-HBM3"}, {}, 4, "assumed-sys-4", "assumed"),
    ("gpu.count label disagrees", {P: "NVIDIA-B200", C: "4"}, {}, 8, "assumed-", "assumed"),
    ("unknown product", {P: "NVIDIA-L40S"}, {}, 4, "assumed-sys-4", "assumed"),
    ("nothing at all", {}, {}, 2, "assumed-sys-2", "assumed"),
]


@pytest.mark.parametrize(
    ("desc", "labels", "annotations", "count", "name", "how"), RESOLVE, ids=[r[0] for r in RESOLVE]
)
def test_resolve_node_shape(
    desc: str, labels: dict, annotations: dict, count: int, name: str, how: str
) -> None:
    labels_before, annotations_before = dict(labels), dict(annotations)
    shape, got_how = resolve_node_shape(labels, annotations, count)
    assert got_how == how
    assert shape.name.startswith(name)
    assert shape.num_gpus == count
    assert shape.assumed == (how == "assumed")
    assert (labels, annotations) == (labels_before, annotations_before)


def test_assumed_keeps_product_generation() -> None:
    shape, how = resolve_node_shape({P: "NVIDIA-GeForce-RTX-4090"}, {}, 8)
    assert how == "assumed" and shape.generation == "RTX4090"
    assert shape.bandwidth[0][1] == 15.75


@pytest.mark.parametrize(
    "value",
    ["", "   ", "{", "null", "[]", "gpus: -1", "GPU0\n", "\x00\xff", "dgx" * 10000, "{}"],
    ids=lambda v: repr(v)[:20],
)
def test_resolve_never_raises_on_bad_annotation(value: str) -> None:
    shape, how = resolve_node_shape({}, {ANNOTATION_KEY: value}, 8)
    assert how == "assumed" and shape is assumed_shape(8)
    if value.strip():
        assert check_topology_annotation(value) != ""


def test_resolve_ignores_non_string_values() -> None:
    labels = {P: ["not", "a", "string"], C: None}
    shape, how = resolve_node_shape(labels, {ANNOTATION_KEY: {"gpus": 2}}, 8)  # type: ignore[dict-item]
    assert (shape, how) == (assumed_shape(8), "assumed")


def test_check_topology_annotation_accepts_good_values() -> None:
    assert check_topology_annotation("dgx-a100") == ""
    assert check_topology_annotation(LINKLIST_2) == ""


def test_resolve_is_memoized_and_fast() -> None:
    """10 000 nodes of one kind share one shape object; a hit costs about a microsecond."""
    shapes = {
        id(resolve_node_shape({P: "NVIDIA-H100-80GB-HBM3", "x": str(i)}, {}, 8)[0])
        for i in range(10_000)
    }
    assert len(shapes) == 1
    labels = {P: "NVIDIA-H100-80GB-HBM3", C: "8", "kubernetes.io/hostname": "n1"}
    annotations = {"other": "x"}
    resolve_node_shape(labels, annotations, 8)
    rounds = 20_000
    start = time.perf_counter()
    for _ in range(rounds):
        resolve_node_shape(labels, annotations, 8)
    per_call = (time.perf_counter() - start) / rounds
    assert per_call < 20e-6, f"{per_call * 1e6:.2f} us per hit"  # ~1 us; loose for CI noise


def test_shape_survives_pickling_into_another_interpreter() -> None:
    """The cached hash is recomputed on unpickling (string hashes differ per process)."""
    payload = pickle.dumps(catalog_shape("dgx1-v100"))
    code = (
        "import pickle, sys\n"
        "from topology.shape import CATALOG\n"
        "w = pickle.loads(sys.stdin.buffer.read())\n"
        "v = CATALOG['dgx1-v100']\n"
        "print(w == v, hash(w) == hash(v), len({v, w}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=payload,
        capture_output=True,
        cwd=REPO,
        env={"PYTHONHASHSEED": "4242", "PATH": ""},
        check=True,
    )
    assert proc.stdout.decode().split() == ["True", "True", "1"]
