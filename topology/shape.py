"""GPU shapes: the interconnect of the GPUs inside one node.

A :class:`GpuShape` is an immutable n x n description of how the GPUs of one node are wired
(NVLink counts, PCIe path letters, modelled bandwidth). Shapes come from

* the built-in :data:`CATALOG` (real machines, each with its source),
* ``nvidia-smi topo -m`` text (:func:`parse_topo_matrix`),
* a link list (:func:`parse_link_list`), JSON or YAML (:func:`parse_topology_spec`),
* the conservative fallback :func:`assumed_shape` (every pair ``SYS``, no NVLink).

:func:`resolve_node_shape` picks one for a Kubernetes node from its annotations/labels.

Contracts:

* Pure: functions take text or mappings (callers read files), never mutate their inputs,
  and touch no file, network, environment or clock.
* Never fabricate NVLink: a pair gets NVLinks only when the input says so, or (topo-m only)
  when the visible rows prove an all-to-all NVSwitch fabric (see :func:`parse_topo_matrix`).
  Anything unknown is ``SYS``.
* Shapes are values: equal content compares equal and hashes equal; the hash is computed
  once at construction so shapes are cheap dictionary keys for the selection tables.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from topology.links import (
    MAX_NVLINKS_PER_GPU,
    PCIE_LABELS,
    is_nvlink_label,
    normalize_label,
    nvlink_count,
    pair_bandwidth,
)

__all__ = [
    "ANNOTATION_KEY",
    "CATALOG",
    "MAX_GPUS",
    "GpuShape",
    "assumed_shape",
    "build_shape",
    "catalog_shape",
    "check_topology_annotation",
    "infer_generation",
    "parse_link_list",
    "parse_topo_matrix",
    "parse_topology_spec",
    "resolve_node_shape",
]

#: Node annotation that carries a node's intra-node topology (a catalog name, a JSON/YAML link
#: list or ``nvidia-smi topo -m`` text).
ANNOTATION_KEY = "topoplace.io/gpu-topology"

#: Longest ``topoplace.io/gpu-topology`` annotation :func:`resolve_node_shape` parses (a
#: 16-GPU ``nvidia-smi topo -m`` text or full link list is a few KiB); longer ones are ignored
#: unparsed, so a node object cannot make shape resolution arbitrarily slow.
MAX_ANNOTATION_CHARS = 64 * 1024

#: Largest GPU count a parsed or built shape may have (the biggest single-OS NVLink nodes,
#: DGX-2/HGX-2, have 16). :func:`assumed_shape` is exempt: device-plugin time-slicing can
#: advertise more "GPUs" than exist and the fallback must still work.
MAX_GPUS = 16

_GFD_PRODUCT = "nvidia.com/gpu.product"
_GFD_COUNT = "nvidia.com/gpu.count"
_GFD_MACHINE = "nvidia.com/gpu.machine"


# --------------------------------------------------------------------------------------------
# The value type
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuShape:
    """Interconnect of the GPUs of one node. Immutable; all matrices are n x n and symmetric.

    Attributes:
        name: Catalog name (``"dgx1-v100"``), ``"linklist:<sha1-8>"``, ``"topo-m:<sha1-8>"``
            (hash of the parsed content, so the same topology gets the same name) or
            ``"assumed-sys-<n>"``.
        num_gpus: n, the number of GPUs (indices 0..n-1, bit i of a mask is GPU i).
        generation: ``"V100"``, ``"A100"``, ``"H100"``, ``"GB200"``, ``"RTX8000"``... or
            ``"unknown"``; selects the link rates in :mod:`topology.links`.
        links: topo-m label per pair: ``"X"`` on the diagonal, ``"NV<k>"`` for NVLinked pairs,
            otherwise the PCIe letter (same as ``pcie``).
        nvlinks: Bonded NVLink count per pair (0 where none, 0 on the diagonal).
        pcie: PCIe path letter (PIX/PXB/PHB/NODE/SYS) for every pair, also NVLinked ones when
            known; ``"SYS"`` where unknown; ``"X"`` on the diagonal.
        bandwidth: GB/s per direction of the best path per pair (NVLink if any, else modelled
            PCIe); 0.0 on the diagonal.
        assumed: True only for :func:`assumed_shape` (no topology known).
        source: Where the shape comes from (citation, ``"annotation"``, ``"GFD labels"``...),
            including notes on anything inferred.
        numa: Optional NUMA group per GPU (``()`` when unknown). GPUs with equal values share a
            NUMA node. Used only as a late tie-break by the ``topoplace`` policy.
    """

    name: str
    num_gpus: int
    generation: str
    links: tuple[tuple[str, ...], ...]
    nvlinks: tuple[tuple[int, ...], ...]
    pcie: tuple[tuple[str, ...], ...]
    bandwidth: tuple[tuple[float, ...], ...]
    assumed: bool
    source: str
    numa: tuple[int, ...] = ()
    # Hash cached at construction (tuples do not cache theirs, and the selection tables are
    # keyed by shape on the hot path). Not part of equality or repr.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = self.num_gpus
        if n < 0:
            raise ValueError("num_gpus must be >= 0")
        for attr in ("links", "nvlinks", "pcie", "bandwidth"):
            matrix = getattr(self, attr)
            if len(matrix) != n or any(len(row) != n for row in matrix):
                raise ValueError(f"{attr} must be a {n}x{n} matrix")
        if self.numa and len(self.numa) != n:
            raise ValueError("numa must be empty or have one entry per GPU")
        for i in range(n):
            if self.links[i][i] != "X" or self.pcie[i][i] != "X" or self.nvlinks[i][i] != 0:
                raise ValueError(f"diagonal of GPU{i} must be X / 0")
            for j in range(i + 1, n):
                label, k, pc = self.links[i][j], self.nvlinks[i][j], self.pcie[i][j]
                if (
                    self.links[j][i] != label
                    or self.nvlinks[j][i] != k
                    or self.pcie[j][i] != pc
                    or self.bandwidth[j][i] != self.bandwidth[i][j]
                ):
                    raise ValueError(f"matrices must be symmetric (GPU{i}-GPU{j})")
                if pc not in PCIE_LABELS:
                    raise ValueError(f"bad PCIe label {pc!r} for GPU{i}-GPU{j}")
                expected = f"NV{k}" if k > 0 else pc
                if label != expected:
                    raise ValueError(f"links[{i}][{j}]={label!r} disagrees with nvlinks/pcie")
        object.__setattr__(
            self,
            "_hash",
            hash((self.name, n, self.generation, self.links, self.pcie, self.assumed)),
        )

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild through the constructor so the cached hash is recomputed in the receiving
        # process (string hashes differ between interpreters).
        return (
            GpuShape,
            (
                self.name,
                self.num_gpus,
                self.generation,
                self.links,
                self.nvlinks,
                self.pcie,
                self.bandwidth,
                self.assumed,
                self.source,
                self.numa,
            ),
        )

    def full_mask(self) -> int:
        """Bitmask with bit i set for every GPU i of the shape (``(1 << n) - 1``)."""
        return (1 << self.num_gpus) - 1


# --------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------

_GENERATION_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (gen, re.compile(pattern))
    for gen, pattern in (
        ("GB200", r"(?<![A-Z0-9])GB200(?![0-9])"),
        ("B200", r"(?<![A-Z0-9])B200(?![0-9])"),
        ("H200", r"(?<![A-Z0-9])H200(?![0-9])"),
        ("H100", r"(?<![A-Z0-9])H100(?![0-9])"),
        ("H800", r"(?<![A-Z0-9])H800(?![0-9])"),
        ("A100", r"(?<![A-Z0-9])A100(?![0-9])"),
        ("A800", r"(?<![A-Z0-9])A800(?![0-9])"),
        ("V100", r"(?<![A-Z0-9])V100(?![0-9])"),
        ("P100", r"(?<![A-Z0-9])P100(?![0-9])"),
        ("RTX8000", r"RTX[\s_-]?8000(?![0-9])"),
        ("RTX4090", r"RTX[\s_-]?4090(?![0-9])"),
    )
)


def infer_generation(text: str) -> str:
    """Guess the GPU generation named in free text (a product string or topo-m comments).

    The match that appears *first* in the text wins, so "8x H200 ... same fabric as H100"
    gives ``"H200"``. ``GB200`` is never mistaken for ``B200``.

    Args:
        text: e.g. ``"NVIDIA-H100-80GB-HBM3"`` (a GFD product label) or comment lines.

    Returns:
        A generation name known to :mod:`topology.links`, or ``"unknown"``.
    """
    upper = text.upper()
    best: tuple[int, str] | None = None
    for gen, pattern in _GENERATION_PATTERNS:
        match = pattern.search(upper)
        if match and (best is None or match.start() < best[0]):
            best = (match.start(), gen)
    return best[1] if best else "unknown"


def _canonical_generation(generation: str | None) -> str:
    """Accept either a canonical generation name or any text naming one."""
    if not generation:
        return "unknown"
    for gen, _ in _GENERATION_PATTERNS:
        if generation == gen:
            return gen
    return infer_generation(generation)


def _content_digest(
    num_gpus: int,
    generation: str,
    nvlinks: Mapping[tuple[int, int], int],
    pcie: Mapping[tuple[int, int], str],
    numa: Sequence[int],
) -> str:
    """First 8 hex digits of a SHA-1 over the canonical content (not the input text)."""
    payload = json.dumps(
        {
            "n": num_gpus,
            "gen": generation,
            "nv": sorted([i, j, k] for (i, j), k in nvlinks.items()),
            "pcie": sorted([i, j, v] for (i, j), v in pcie.items()),
            "numa": list(numa),
        },
        sort_keys=True,
    )
    return hashlib.sha1(payload.encode()).hexdigest()[:8]


def build_shape(
    name: str,
    num_gpus: int,
    generation: str,
    *,
    nvlinks: Iterable[tuple[int, int, int]] = (),
    pcie: Iterable[tuple[int, int, str]] = (),
    default_pcie: str = "SYS",
    source: str = "",
    numa: Sequence[int] = (),
    assumed: bool = False,
) -> GpuShape:
    """Keyword builder: a shape from sparse pair lists (unlisted pairs: no NVLink, ``default_pcie``).

    Args:
        name: Shape name.
        num_gpus: n (0..:data:`MAX_GPUS`, unless ``assumed``).
        generation: GPU generation (see :mod:`topology.links`).
        nvlinks: ``(i, j, k)`` triples, k >= 1 bonded NVLinks between GPU i and GPU j.
        pcie: ``(i, j, letter)`` triples; ``SOC`` is accepted for ``SYS``.
        default_pcie: Letter of pairs not in ``pcie``.
        source: Citation / provenance text.
        numa: NUMA group per GPU or ``()``.
        assumed: Marks the conservative fallback.

    Returns:
        The validated shape (bandwidths computed from :func:`topology.links.pair_bandwidth`).

    Raises:
        ValueError: Indices out of range, i == j, k < 1, unknown letters, or one pair given
            two different values.
    """
    if num_gpus < 0 or (num_gpus > MAX_GPUS and not assumed):
        raise ValueError(f"num_gpus must be in 0..{MAX_GPUS}, got {num_gpus}")
    nv = _pair_dict(num_gpus, nvlinks, "nvlinks", _check_count)
    pc = _pair_dict(num_gpus, pcie, "pcie", _check_pcie)
    default = _check_pcie(default_pcie)
    return _shape_from_dicts(name, num_gpus, generation, nv, pc, default, source, numa, assumed)


def _check_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"NVLink count must be an integer >= 1, got {value!r}")
    return value


def _check_pcie(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"PCIe label must be a string, got {value!r}")
    label = normalize_label(value)
    if label not in PCIE_LABELS:
        raise ValueError(f"not a PCIe path label: {value!r}")
    return label


def _pair_dict(n: int, triples: Iterable[Any], what: str, check: Any) -> dict[tuple[int, int], Any]:
    """Validate ``(i, j, value)`` triples into ``{(min, max): value}``."""
    out: dict[tuple[int, int], Any] = {}
    for triple in triples:
        if not isinstance(triple, Sequence) or isinstance(triple, str) or len(triple) != 3:
            raise ValueError(f"{what} entries must be [i, j, value], got {triple!r}")
        i, j, raw = triple
        for idx in (i, j):
            if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < n:
                raise ValueError(f"{what}: GPU index {idx!r} out of range 0..{n - 1}")
        if i == j:
            raise ValueError(f"{what}: a GPU cannot link to itself ({i})")
        value = check(raw)
        key = (min(i, j), max(i, j))
        if key in out and out[key] != value:
            raise ValueError(f"{what}: conflicting values for GPU{key[0]}-GPU{key[1]}")
        out[key] = value
    return out


def _shape_from_dicts(
    name: str,
    n: int,
    generation: str,
    nv: Mapping[tuple[int, int], int],
    pc: Mapping[tuple[int, int], str],
    default_pcie: str,
    source: str,
    numa: Sequence[int],
    assumed: bool,
) -> GpuShape:
    links: list[list[str]] = [["X"] * n for _ in range(n)]
    nvl: list[list[int]] = [[0] * n for _ in range(n)]
    pcie: list[list[str]] = [["X"] * n for _ in range(n)]
    bw: list[list[float]] = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            k = nv.get((i, j), 0)
            letter = pc.get((i, j), default_pcie)
            label = f"NV{k}" if k else letter
            gbps = pair_bandwidth(generation, k, letter)
            links[i][j] = links[j][i] = label
            nvl[i][j] = nvl[j][i] = k
            pcie[i][j] = pcie[j][i] = letter
            bw[i][j] = bw[j][i] = gbps
    return GpuShape(
        name=name,
        num_gpus=n,
        generation=generation,
        links=tuple(map(tuple, links)),
        nvlinks=tuple(map(tuple, nvl)),
        pcie=tuple(map(tuple, pcie)),
        bandwidth=tuple(map(tuple, bw)),
        assumed=assumed,
        source=source,
        numa=tuple(numa),
    )


def assumed_shape(num_gpus: int, generation: str = "unknown") -> GpuShape:
    """The conservative assumption when nothing is known: every pair ``SYS``, no NVLink.

    Memoized: equal (canonical) arguments return the same object.

    Args:
        num_gpus: GPU count (>= 0; may exceed :data:`MAX_GPUS`).
        generation: Known generation or product text (sets the PCIe rate), else
            ``"unknown"`` (PCIe Gen3).
    """
    return _assumed(num_gpus, _canonical_generation(generation))


@functools.lru_cache(maxsize=256)
def _assumed(num_gpus: int, gen: str) -> GpuShape:
    return build_shape(
        f"assumed-sys-{num_gpus}",
        num_gpus,
        gen,
        source="assumed: no topology known; every GPU pair treated as SYS (cross-socket PCIe)",
        assumed=True,
    )


# --------------------------------------------------------------------------------------------
# Catalog (link structure transcribed into code; the shared folder is never read at runtime)
# --------------------------------------------------------------------------------------------


def _all_pairs(n: int, k: int) -> list[tuple[int, int, int]]:
    return [(i, j, k) for i in range(n) for j in range(i + 1, n)]


def _pcie_tree(
    n: int, pix: Sequence[Sequence[int]], middle: str, groups: Sequence[Sequence[int]]
) -> list[tuple[int, int, str]]:
    """PCIe letters of a two-level tree: PIX inside ``pix`` groups, ``middle`` inside ``groups``
    (sockets / switch roots), SYS elsewhere."""
    out: list[tuple[int, int, str]] = []
    for i in range(n):
        for j in range(i + 1, n):
            if any(i in g and j in g for g in pix):
                out.append((i, j, "PIX"))
            elif any(i in g and j in g for g in groups):
                out.append((i, j, middle))
            else:
                out.append((i, j, "SYS"))
    return out


_GOALLOC = (
    "NVIDIA/go-gpuallocator gpuallocator/common_test.go @ "
    "876e7b7609bb839919e4eb06ce00607db76e907e (Apache-2.0)"
)


def _build_catalog() -> dict[str, GpuShape]:
    shapes: list[GpuShape] = []

    # DGX-1 P100: hybrid cube-mesh of single NVLinks (NVLink 1.0, 4 links per GPU).
    # Fixture NewDGX1PascalNode: NV1 pairs below; PCIe: 0-2, 1-3, 4-6, 5-7 on one switch
    # (SingleSwitch = PIX), other same-socket pairs HostBridge (PHB), cross-socket CrossCPU (SYS).
    p100_nv = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 5), (2, 3), (2, 6), (3, 7)]
    p100_nv += [(4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)]
    shapes.append(
        build_shape(
            "dgx1-p100",
            8,
            "P100",
            nvlinks=[(i, j, 1) for i, j in p100_nv],
            pcie=_pcie_tree(8, [(0, 2), (1, 3), (4, 6), (5, 7)], "PHB", [range(4), range(4, 8)]),
            source=f"DGX-1 Pascal: {_GOALLOC} NewDGX1PascalNode",
            numa=(0, 0, 0, 0, 1, 1, 1, 1),
        )
    )

    # DGX-1 V100: ../shared/data/topologies/dgx1_v100_hybrid_cube_mesh.txt (msccl-tools
    # tests/test_topologies.py, MIT; identical to Microway's article). NV1/NV2 below.
    # PCIe of NVLinked pairs is hidden by topo -m; taken from go-gpuallocator NewDGX1VoltaNode
    # (0-1, 2-3, 4-5, 6-7 SingleSwitch = PIX; same socket HostBridge = PHB; else SYS), which
    # also follows from the NIC columns (GPU0/1 PIX mlx5_0, GPU2/3 PIX mlx5_1 ...).
    v100_nv = [(0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2), (1, 2, 2), (1, 3, 1), (1, 5, 2)]
    v100_nv += [(2, 3, 2), (2, 6, 1), (3, 7, 1), (4, 5, 1), (4, 6, 1), (4, 7, 2), (5, 6, 2)]
    v100_nv += [(5, 7, 1), (6, 7, 2)]
    shapes.append(
        build_shape(
            "dgx1-v100",
            8,
            "V100",
            nvlinks=v100_nv,
            pcie=_pcie_tree(8, [(0, 1), (2, 3), (4, 5), (6, 7)], "PHB", [range(4), range(4, 8)]),
            source=(
                "DGX-1 V100 hybrid cube-mesh: microsoft/msccl-tools tests/test_topologies.py "
                "@ e46d5a79 (MIT), same as Microway nvidia-smi article; PCIe letters from "
                f"{_GOALLOC} NewDGX1VoltaNode"
            ),
            numa=(0, 0, 0, 0, 1, 1, 1, 1),
        )
    )

    # DGX-2 class, 16x V100 on NVSwitch: ../shared/data/topologies/dgx2_v100_nvswitch_PARTIAL.txt
    # (NVIDIA/nccl-tests issue #78). Only rows GPU0-4 are visible, all NV6; GPU0 shows NV6 to
    # 15 peers = 90 bonded links > 18 a GPU can have, which proves an NVSwitch fabric, so all
    # pairs are NV6 (see parse_topo_matrix). PCIe known only where the NIC columns prove it:
    # GPU0/1 PIX mlx5_0, GPU2/3 PIX mlx5_1, GPU4 PIX mlx5_2 => 0-1, 2-3 PIX; {0,1}x{2,3} PXB;
    # {0..3}x4 NODE; every other pair unknown -> SYS.
    dgx2_pcie = [(0, 1, "PIX"), (2, 3, "PIX")]
    dgx2_pcie += [(i, j, "PXB") for i in (0, 1) for j in (2, 3)]
    dgx2_pcie += [(i, 4, "NODE") for i in range(4)]
    shapes.append(
        build_shape(
            "dgx2-v100",
            16,
            "V100",
            nvlinks=_all_pairs(16, 6),
            pcie=dgx2_pcie,
            source=(
                "DGX-2 class 16x V100 NVSwitch: NVIDIA/nccl-tests issue #78 (partial: rows "
                "GPU0-4); NV6 for unseen pairs inferred from the proven all-to-all NVSwitch "
                "pattern; PCIe unknown outside GPU0-4 -> SYS"
            ),
        )
    )

    # DGX A100: ../shared/data/topologies/dgx_a100_nv12_nvswitch.txt (gengwg/cheatsheets gpu.md
    # @ aa724849, Apache-2.0; same pattern in NVIDIA/nccl #1505). NV12 all pairs. The NICs are
    # PXB (not PIX) to the GPUs, so no GPU-GPU PCIe letter can be proven: SYS.
    shapes.append(
        build_shape(
            "dgx-a100",
            8,
            "A100",
            nvlinks=_all_pairs(8, 12),
            source=(
                "DGX A100 NVSwitch: gengwg/cheatsheets gpu.md @ aa724849 (Apache-2.0), "
                "NVIDIA/nccl #1505; GPU-GPU PCIe letters unknown -> SYS"
            ),
            numa=(3, 3, 1, 1, 7, 7, 5, 5),
        )
    )

    # H100 SXM 8-GPU NVSwitch board: ../shared/data/topologies/hgx_h100_nv18_nccl1453.txt
    # (NVIDIA/nccl #1453; DGX vs OEM HGX not stated). NV18 all pairs. Each GPU has a PIX NIC
    # (GPU0-NIC8 ... GPU7-NIC1), so GPU i - GPU j = GPU i's letter to GPU j's NIC: NODE inside
    # a socket (GPU0-3 / GPU4-7), SYS across.
    shapes.append(
        build_shape(
            "dgx-h100",
            8,
            "H100",
            nvlinks=_all_pairs(8, 18),
            pcie=_pcie_tree(8, [], "NODE", [range(4), range(4, 8)]),
            source=(
                "8x H100 80GB HBM3 NVSwitch: NVIDIA/nccl issue #1453 (DGX or HGX not stated); "
                "PCIe NODE/SYS derived from each GPU's PIX NIC"
            ),
            numa=(0, 0, 0, 0, 1, 1, 1, 1),
        )
    )

    # HGX H200: ../shared/data/topologies/hgx_h200_nv18_full.txt (fuhengwu2021/distributedai
    # @ 9d6d4a3d, no licence file). NV18 all pairs; NICs are PXB to GPUs, PCIe letters unknown.
    shapes.append(
        build_shape(
            "hgx-h200",
            8,
            "H200",
            nvlinks=_all_pairs(8, 18),
            source=(
                "8x H200 NVSwitch: fuhengwu2021/distributedai @ 9d6d4a3d; GPU-GPU PCIe "
                "letters unknown -> SYS"
            ),
            numa=(0, 0, 0, 0, 1, 1, 1, 1),
        )
    )

    # HGX B200: no topo -m capture in ../shared; 8 GPUs, NVLink 5.0, 18 links per GPU into two
    # NVSwitch chips = NV18 all pairs (link_bandwidths.csv NVLink 5.0 row; NVIDIA HGX B200 spec).
    shapes.append(
        build_shape(
            "hgx-b200",
            8,
            "B200",
            nvlinks=_all_pairs(8, 18),
            source=(
                "HGX B200: NV18 all-to-all from NVIDIA's HGX B200 spec (18 NVLink 5.0 links "
                "per GPU, NVSwitch); no captured matrix; PCIe letters unknown -> SYS"
            ),
        )
    )

    # GB200 NVL72 compute tray: ../shared/data/topologies/gb200_nvl72_compute_tray.txt
    # (NVIDIA/k8s-test-infra #371). The 4 local GPUs are NV18; the rest of the NVL72 domain is
    # reached through the same fabric and modelled by topology.fabric (nvidia.com/gpu.clique).
    shapes.append(
        build_shape(
            "gb200-nvl72-tray",
            4,
            "GB200",
            nvlinks=_all_pairs(4, 18),
            source=(
                "GB200 NVL72 compute tray: NVIDIA/k8s-test-infra issue #371 (4 local GPUs, "
                "NV18); cross-tray NVLink via nvidia.com/gpu.clique (topology.fabric)"
            ),
            numa=(0, 0, 1, 1),
        )
    )

    # PCIe-only 8 GPUs, 2 sockets: ../shared/data/topologies/pcie_8gpu_pix_pxb_sys.txt
    # (lattice/quda #669). {0,1} {2,3} {4,5} {6,7} PIX; PXB inside {0..3} and {4..7}; SYS across.
    shapes.append(
        build_shape(
            "pcie-8gpu-2socket",
            8,
            "unknown",
            pcie=_pcie_tree(8, [(0, 1), (2, 3), (4, 5), (6, 7)], "PXB", [range(4), range(4, 8)]),
            source="PCIe-only 8-GPU 2-socket server: lattice/quda issue #669 (GPU model not shown)",
            numa=(0, 0, 0, 0, 1, 1, 1, 1),
        )
    )

    # 4x Quadro RTX 8000 with NVLink bridges on pairs 0-3 and 1-2: go-gpuallocator fixture
    # New4xRTX8000Node. PCIe: 0-1 and 2-3 SameCPU (NODE), 0-2 and 1-3 CrossCPU (SYS). The fixture
    # lists no PCIe link for the bridged pairs; since 0,1 share a CPU and 2,3 the other, 0-3 and
    # 1-2 are cross-socket: SYS (adds +10 to both bridged pairs, no expected answer changes).
    shapes.append(
        build_shape(
            "rtx-4gpu-nvlink-pairs",
            4,
            "RTX8000",
            nvlinks=[(0, 3, 2), (1, 2, 2)],
            pcie=[(0, 1, "NODE"), (2, 3, "NODE")],
            source=f"4x RTX 8000, NVLink bridge pairs 0-3 and 1-2: {_GOALLOC} New4xRTX8000Node",
            numa=(0, 0, 1, 1),
        )
    )

    # 8x RTX 4090 PCIe, every pair SYS: ../shared/data/topologies/pcie_8x_rtx4090_all_sys.txt
    # (NVIDIA/go-gpuallocator issue #17). NUMA 0 for GPU0-3, 1 for GPU4-7.
    shapes.append(
        build_shape(
            "rtx4090-8gpu-pcie",
            8,
            "RTX4090",
            source="8x RTX 4090 PCIe, all pairs SYS: NVIDIA/go-gpuallocator issue #17",
            numa=(0, 0, 0, 0, 1, 1, 1, 1),
        )
    )
    return {shape.name: shape for shape in shapes}


#: Built-in shapes by name. Read-only.
CATALOG: Mapping[str, GpuShape] = MappingProxyType(_build_catalog())


def catalog_shape(name: str) -> GpuShape:
    """Return the catalog shape ``name``.

    Raises:
        KeyError: Unknown name; the message lists the known names.
    """
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"unknown GPU shape {name!r}; known: {', '.join(sorted(CATALOG))}") from None


# --------------------------------------------------------------------------------------------
# nvidia-smi topo -m
# --------------------------------------------------------------------------------------------

_GPU_RE = re.compile(r"^GPU(\d+)$")
_STOP_WORDS = frozenset({"CPU", "NUMA", "GPU"})


def _is_label(token: str) -> bool:
    try:
        normalize_label(token)
    except ValueError:
        return False
    return True


def _split_cells(line: str) -> list[str]:
    """Cells of a row for the trailing (affinity) columns: tabs, else runs of 2+ blanks."""
    parts = line.split("\t") if "\t" in line else re.split(r" {2,}", line)
    return [p.strip() for p in parts if p.strip()]


def parse_topo_matrix(
    text: str, generation: str | None = None, name: str | None = None
) -> GpuShape:
    """Parse ``nvidia-smi topo -m`` output.

    Handles ``#`` comment lines anywhere (also truncation markers inside the body), tab or
    blank separation, NIC rows and columns (used only as evidence, see below), CPU Affinity /
    NUMA Affinity / GPU NUMA ID columns (including the empty cell some drivers print), the
    legend and NIC legend, ``SOC`` (= ``SYS``), ``NODE`` and ``NV<k>``.

    Inference rules (all documented in ``source``):

    * **Truncated bodies.** A row with fewer cells than columns, or whose last token is not
      a label (cut mid-word), loses its last cell and counts as incomplete. Missing GPU rows are completed from the other rows' columns
      (topo -m is symmetric). Pairs still unseen get NVLink **only** if the visible rows prove
      an all-to-all NVSwitch fabric: every visible GPU-GPU cell is the same ``NV<k>``, and some
      complete row shows ``NV<k>`` to all n-1 peers with k*(n-1) > 18 (more bonded links than
      any GPU has, so they go to a switch, and every GPU seen on it reaches every other one at
      k links). Otherwise unseen pairs are ``SYS`` with no NVLink.
    * **PCIe letters of NVLinked pairs** (topo -m prints only ``NV<k>`` there): if GPU b is
      ``PIX`` to a NIC, b and that NIC sit under one PCIe switch, so every other device sees
      them through the same path: letter(a, b) = letter(a, NIC). Otherwise ``SYS``.
    * **NUMA**: the NUMA Affinity column when every GPU row has a number, else groups of
      equal CPU Affinity; ``()`` when neither is available.

    Args:
        text: The command output (comments allowed).
        generation: GPU generation or product text; inferred from the text (first product
            name mentioned, e.g. in comments) when omitted, else ``"unknown"``.
        name: Shape name; default ``"topo-m:<sha1-8>"`` of the parsed content.

    Returns:
        The shape.

    Raises:
        ValueError: No GPU header or no GPU row, GPU columns not 0..n-1, more than :data:`MAX_GPUS` GPUs,
            an unknown label in a GPU-GPU or GPU-NIC cell, or contradicting cells.
    """
    lines = text.splitlines()
    body = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]

    header_at = -1
    for idx, line in enumerate(body):
        tokens = line.split()
        if tokens and tokens[0] == "GPU0" and (len(tokens) == 1 or not _is_label(tokens[1])):
            header_at = idx
            break
    if header_at < 0:
        raise ValueError("no nvidia-smi topo -m header (a line of columns starting with GPU0)")
    header = body[header_at]
    devices: list[str] = []
    for token in header.split():
        if token in _STOP_WORDS or "Affinity" in token:
            break
        devices.append(token)
    gpu_cols = [int(m.group(1)) for m in map(_GPU_RE.match, devices) if m]
    n = len(gpu_cols)
    if gpu_cols != list(range(n)):
        raise ValueError(f"GPU columns must be GPU0..GPU{n - 1} in order, got {gpu_cols}")
    if n > MAX_GPUS:
        raise ValueError(f"{n} GPUs exceeds the supported maximum {MAX_GPUS}")
    col_index = {name_: pos for pos, name_ in enumerate(devices)}
    trailing_names = _split_cells(header)[len(devices) :]

    gpu_pair: dict[tuple[int, int], str] = {}  # (i, j) as seen in row i
    gpu_nic: dict[tuple[int, str], str] = {}  # (gpu, nic) -> letter
    trailing: dict[int, dict[str, str]] = {}
    complete_rows: set[int] = set()
    seen_rows: set[str] = set()

    for line in body[header_at + 1 :]:
        tokens = line.split()
        row = tokens[0]
        if row not in col_index:
            continue  # legend, NIC legend, free text
        if row in seen_rows:
            raise ValueError(f"row {row} appears twice")
        seen_rows.add(row)
        cells = tokens[1 : 1 + len(devices)]
        truncated = len(cells) < len(devices)
        if truncated and cells:
            cells = cells[:-1]  # the last token of a cut row may itself be cut
        row_gpu = _GPU_RE.match(row)
        for pos, raw in enumerate(cells):
            col = devices[pos]
            col_gpu = _GPU_RE.match(col)
            if col == row:
                if raw.upper() != "X":
                    raise ValueError(f"diagonal cell of {row} is {raw!r}, expected X")
                continue
            if not row_gpu and not col_gpu:
                continue  # NIC-NIC cell: no GPU evidence
            try:
                label = normalize_label(raw)
            except ValueError:
                if pos == len(tokens) - 2:  # last token of the line: a cell cut mid-word
                    truncated = True
                    break
                raise
            if label == "X":
                raise ValueError(f"X off the diagonal at {row}/{col}")
            if row_gpu and col_gpu:
                gpu_pair[(int(row_gpu.group(1)), int(col_gpu.group(1)))] = label
            else:
                gpu = int((row_gpu or col_gpu).group(1))  # type: ignore[union-attr]
                nic = col if row_gpu else row
                if is_nvlink_label(label):
                    continue  # NVLink to a NIC/switch (rare): not PCIe evidence
                prev = gpu_nic.get((gpu, nic))
                if prev is not None and prev != label:
                    raise ValueError(f"GPU{gpu}-{nic} is {prev} and {label}")
                gpu_nic[(gpu, nic)] = label
        if row_gpu:
            gpu = int(row_gpu.group(1))
            if not truncated and all((gpu, j) in gpu_pair for j in range(n) if j != gpu):
                complete_rows.add(gpu)
            if not truncated:
                rest = _split_cells(line)[1 + len(devices) :]
                trailing[gpu] = dict(zip(trailing_names, rest, strict=False))

    if not any(_GPU_RE.match(r) for r in seen_rows):
        raise ValueError("topo -m text has a header but no GPU rows")

    # Symmetric completion of GPU-GPU cells.
    pair_label: dict[tuple[int, int], str] = {}
    for (i, j), label in gpu_pair.items():
        key = (min(i, j), max(i, j))
        other = pair_label.get(key)
        if other is not None and other != label:
            raise ValueError(f"GPU{key[0]}-GPU{key[1]} is {other} one way and {label} the other")
        pair_label[key] = label

    notes: list[str] = []
    missing = [(i, j) for i in range(n) for j in range(i + 1, n) if (i, j) not in pair_label]
    inferred_k = 0
    if missing:
        labels = set(pair_label.values())
        if len(labels) == 1:
            (only,) = labels
            k = nvlink_count(only)
            if k and complete_rows and k * (n - 1) > MAX_NVLINKS_PER_GPU:
                inferred_k = k
        if inferred_k:
            notes.append(
                f"{len(missing)} unseen GPU pairs inferred NV{inferred_k}: visible rows prove "
                f"an all-to-all NVSwitch fabric ({inferred_k}x{n - 1} links > "
                f"{MAX_NVLINKS_PER_GPU})"
            )
        else:
            notes.append(f"{len(missing)} unseen GPU pairs assumed SYS (no NVLink)")

    nvlinks: dict[tuple[int, int], int] = {}
    pcie: dict[tuple[int, int], str] = {}
    nic_names = sorted({nic for _, nic in gpu_nic})
    derived = 0
    for i in range(n):
        for j in range(i + 1, n):
            cell = pair_label.get((i, j))
            if cell is None:
                if inferred_k:
                    nvlinks[(i, j)] = inferred_k
            elif is_nvlink_label(cell):
                nvlinks[(i, j)] = nvlink_count(cell)
            else:
                pcie[(i, j)] = cell
                continue
            letter = _pcie_via_nic(i, j, gpu_nic, nic_names)
            if letter is not None:
                pcie[(i, j)] = letter
                derived += 1
    if derived:
        notes.append(f"PCIe letter of {derived} NVLinked/unseen pairs derived from PIX NICs")

    numa = _numa_groups(n, trailing)
    gen = _canonical_generation(generation) if generation else infer_generation(text)
    shape_name = name or "topo-m:" + _content_digest(n, gen, nvlinks, pcie, numa)
    source = "nvidia-smi topo -m" + (f" ({'; '.join(notes)})" if notes else "")
    return _shape_from_dicts(shape_name, n, gen, nvlinks, pcie, "SYS", source, numa, False)


_PCIE_RANK = {letter: rank for rank, letter in enumerate(PCIE_LABELS)}


def _pcie_via_nic(
    a: int, b: int, gpu_nic: Mapping[tuple[int, str], str], nics: Sequence[str]
) -> str | None:
    """PCIe letter of GPU pair (a, b) proven by a NIC that one of them is PIX to, else None.

    If b is PIX to NIC m, b and m hang off the same PCIe switch, so a reaches b along the path
    it uses to reach m: letter(a, b) = letter(a, m). Several proofs should agree; if they do
    not, the farthest (most conservative) letter is kept.
    """
    found: list[str] = []
    for x, y in ((a, b), (b, a)):
        for nic in nics:
            if gpu_nic.get((y, nic)) == "PIX":
                letter = gpu_nic.get((x, nic))
                if letter is not None:
                    found.append(letter)
    if not found:
        return None
    return max(found, key=_PCIE_RANK.__getitem__)


def _numa_groups(n: int, trailing: Mapping[int, Mapping[str, str]]) -> tuple[int, ...]:
    if n == 0 or len(trailing) != n:
        return ()
    numa = [trailing[g].get("NUMA Affinity", "") for g in range(n)]
    if all(v.isdigit() for v in numa):
        return tuple(int(v) for v in numa)
    cpus = [trailing[g].get("CPU Affinity", "") for g in range(n)]
    if all(cpus):
        order: dict[str, int] = {}
        return tuple(order.setdefault(c, len(order)) for c in cpus)
    return ()


# --------------------------------------------------------------------------------------------
# Link lists
# --------------------------------------------------------------------------------------------


def parse_link_list(obj: Mapping[str, Any]) -> GpuShape:
    """Build a shape from a link list (the annotation / JSON / YAML format).

    Format::

        {"gpus": 8,                      # required, 1..16
         "gpu": "V100",                  # optional generation or product text
         "nvlinks": [[0, 3, 2], ...],    # optional [i, j, bonded link count >= 1]
         "pcie": [[0, 1, "PIX"], ...],   # optional [i, j, PIX|PXB|PHB|NODE|SYS|SOC]
         "numa": [0, 0, 1, 1, ...],      # optional NUMA group per GPU
         "name": "my-box"}               # optional; default "linklist:<sha1-8>"

    Pairs not listed have no NVLink and PCIe ``SYS``. The input is not modified.

    Raises:
        ValueError: Missing/invalid ``gpus``, bad entries, unknown keys' values of the wrong
            type, conflicting duplicates.
    """
    if not isinstance(obj, Mapping):
        raise ValueError("a link list must be a mapping")
    n = obj.get("gpus")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_GPUS:
        raise ValueError(f"'gpus' must be an integer in 1..{MAX_GPUS}, got {n!r}")
    gen_text = obj.get("gpu", obj.get("generation"))
    if gen_text is not None and not isinstance(gen_text, str):
        raise ValueError("'gpu' must be a string")
    nv_raw = obj.get("nvlinks", ())
    pc_raw = obj.get("pcie", ())
    for key, value in (("nvlinks", nv_raw), ("pcie", pc_raw)):
        if not isinstance(value, Sequence) or isinstance(value, str):
            raise ValueError(f"'{key}' must be a list of [i, j, value]")
    numa_raw = obj.get("numa", ())
    if not isinstance(numa_raw, Sequence) or isinstance(numa_raw, str):
        raise ValueError("'numa' must be a list of integers")
    if numa_raw and (
        len(numa_raw) != n or any(isinstance(v, bool) or not isinstance(v, int) for v in numa_raw)
    ):
        raise ValueError(f"'numa' must list one integer per GPU ({n})")
    name = obj.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError("'name' must be a non-empty string")
    gen = _canonical_generation(gen_text)
    nv = _pair_dict(n, nv_raw, "nvlinks", _check_count)
    pc = _pair_dict(n, pc_raw, "pcie", _check_pcie)
    numa = tuple(numa_raw)
    shape_name = name or "linklist:" + _content_digest(n, gen, nv, pc, numa)
    return _shape_from_dicts(shape_name, n, gen, nv, pc, "SYS", "link list", numa, False)


def parse_topology_spec(text: str) -> GpuShape:
    """Parse any supported description, auto-detected in this order:

    1. a catalog name (``"dgx1-v100"``),
    2. JSON (text starting with ``{``) holding a link list,
    3. ``nvidia-smi topo -m`` text (a header line starting with ``GPU0``),
    4. YAML holding a link list.

    Raises:
        ValueError: Nothing matched or the matched format is malformed.
    """
    stripped = text.strip()
    if stripped in CATALOG:
        return CATALOG[stripped]
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON link list: {exc}") from None
        return parse_link_list(obj)
    if any(
        (tokens := ln.split()) and tokens[0] == "GPU0" and not ln.lstrip().startswith("#")
        for ln in stripped.splitlines()
    ):
        return parse_topo_matrix(stripped)
    try:
        import yaml  # type: ignore[import-untyped,unused-ignore]  # only this branch needs it
    except ImportError:  # pragma: no cover - pyyaml is a declared dependency
        raise ValueError("YAML link lists need pyyaml") from None
    try:
        obj = yaml.safe_load(stripped)
    except yaml.YAMLError as exc:
        raise ValueError(f"not a catalog name, JSON, YAML or topo -m text: {exc}") from None
    if isinstance(obj, Mapping) and "gpus" in obj:
        return parse_link_list(obj)
    known = ", ".join(sorted(CATALOG))
    raise ValueError(f"not a catalog name ({known}), a link list or nvidia-smi topo -m text")


# --------------------------------------------------------------------------------------------
# Node resolution
# --------------------------------------------------------------------------------------------

# GFD product text -> (catalog shape, required GPU count). Only products that identify an
# NVLink/NVSwitch baseboard are mapped; PCIe cards (which may or may not carry bridges) are
# not, so NVLink is never fabricated. SXM/HBM3 distinguish baseboard parts from PCIe/NVL cards.
_GFD_RULES: tuple[tuple[re.Pattern[str], str, int], ...] = tuple(
    (re.compile(pattern), shape, count)
    for pattern, shape, count in (
        (r"(?<![A-Z0-9])GB200", "gb200-nvl72-tray", 4),
        (r"(?<![A-Z0-9])B200(?!.*(PCIE|NVL))", "hgx-b200", 8),
        (r"(?<![A-Z0-9])H200(?!.*(PCIE|NVL))", "hgx-h200", 8),
        (r"(?<![A-Z0-9])H100.*(SXM|HBM3)(?!.*(PCIE|NVL))", "dgx-h100", 8),
        (r"(?<![A-Z0-9])A100.*SXM", "dgx-a100", 8),
        (r"(?<![A-Z0-9])V100.*SXM", "dgx1-v100", 8),
        (r"(?<![A-Z0-9])V100.*SXM", "dgx2-v100", 16),
        (r"(?<![A-Z0-9])P100.*SXM", "dgx1-p100", 8),
    )
)
# gpu.machine (DMI product name) -> catalog shape, used when the product is absent/unmapped.
# DGX-1 is deliberately absent: it shipped with P100 (NV1) and V100 (NV1/NV2) boards, and
# guessing V100 would invent links on a P100 machine.
_MACHINE_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), shape)
    for pattern, shape in (
        (r"DGX[\s_-]?2(?![0-9])", "dgx2-v100"),
        (r"DGX[\s_-]?A100", "dgx-a100"),
        (r"DGX[\s_-]?H100", "dgx-h100"),
        (r"DGX[\s_-]?H200", "hgx-h200"),
        (r"DGX[\s_-]?B200", "hgx-b200"),
    )
)


def check_topology_annotation(value: str) -> str:
    """Validate a ``topoplace.io/gpu-topology`` annotation value.

    Returns:
        ``""`` when :func:`parse_topology_spec` accepts it, else the parse error text (so an
        I/O layer can surface why :func:`resolve_node_shape` ignored it).
    """
    if len(value) > MAX_ANNOTATION_CHARS:
        return f"longer than {MAX_ANNOTATION_CHARS} characters"
    try:
        parse_topology_spec(value)
    except (ValueError, KeyError, TypeError) as exc:
        return str(exc)
    except RecursionError:
        return "nested too deeply"
    return ""


def resolve_node_shape(
    labels: Mapping[str, str], annotations: Mapping[str, str], gpu_count: int
) -> tuple[GpuShape, str]:
    """Pick the GPU shape of a Kubernetes node. Never raises on bad labels or annotations.

    Order:

    1. annotation ``topoplace.io/gpu-topology`` (anything :func:`parse_topology_spec`
       accepts, at most :data:`MAX_ANNOTATION_CHARS` long), if it parses and its GPU count
       equals ``gpu_count`` (``gpu_count <= 0`` means unknown and accepts any count) ->
       ``how="annotation"``;
    2. GFD labels: ``nvidia.com/gpu.product`` (else ``nvidia.com/gpu.machine``) naming an
       NVLink baseboard whose catalog shape has ``gpu_count`` GPUs; if ``nvidia.com/gpu.count``
       is present (ASCII digits, at most 4) it must agree -> ``how="gfd"``;
    3. :func:`assumed_shape` of ``gpu_count`` (generation from the product label when known)
       -> ``how="assumed"``.

    Memoized on the few relevant values: nodes of one kind share one shape object and a hit
    costs about a microsecond.

    Args:
        labels: Node labels (read only).
        annotations: Node annotations (read only).
        gpu_count: GPUs the node advertises (capacity of ``nvidia.com/gpu``).

    Returns:
        ``(shape, how)`` with ``how`` in ``{"annotation", "gfd", "assumed"}``.
    """
    return _resolve(
        _text(annotations.get(ANNOTATION_KEY)),
        _text(labels.get(_GFD_PRODUCT)),
        _text(labels.get(_GFD_COUNT)),
        _text(labels.get(_GFD_MACHINE)),
        gpu_count if isinstance(gpu_count, int) else 0,
    )


def _text(value: object) -> str | None:
    """Label/annotation values are strings; anything else (even unhashable) counts as absent."""
    return value if isinstance(value, str) else None


@functools.lru_cache(maxsize=4096)
def _resolve(
    annotation: str | None,
    product: str | None,
    count_label: str | None,
    machine: str | None,
    gpu_count: int,
) -> tuple[GpuShape, str]:
    if isinstance(annotation, str) and annotation.strip():
        try:
            shape = (
                parse_topology_spec(annotation) if len(annotation) <= MAX_ANNOTATION_CHARS else None
            )
        except (ValueError, KeyError, TypeError, RecursionError):
            # RecursionError: deeply nested JSON/YAML. The contract is "never raises".
            shape = None
        if shape is not None and (gpu_count <= 0 or shape.num_gpus == gpu_count):
            return shape, "annotation"

    generation = infer_generation(product) if isinstance(product, str) else "unknown"
    count = gpu_count
    label = count_label.strip() if isinstance(count_label, str) else ""
    # str.isdigit accepts "²" (which int() refuses) and any length: ASCII and short only.
    if label.isascii() and label.isdigit() and len(label) <= 4:
        labelled = int(label)
        if count <= 0:
            count = labelled
        elif labelled != count:
            count = -1  # inconsistent node: do not trust a catalog mapping
    if count > 0:
        name = _gfd_shape_name(product, machine, count)
        if name is not None:
            return CATALOG[name], "gfd"
    return assumed_shape(max(gpu_count, 0), generation), "assumed"


def _gfd_shape_name(product: str | None, machine: str | None, count: int) -> str | None:
    if isinstance(product, str) and product:
        upper = product.upper()
        for pattern, name, n in _GFD_RULES:
            if n == count and pattern.search(upper):
                return name
    if isinstance(machine, str) and machine:
        upper = machine.upper()
        for pattern, name in _MACHINE_RULES:
            if pattern.search(upper) and CATALOG[name].num_gpus == count:
                return name
    return None
