"""Link labels, link bandwidths and allocator pair weights.

Pure constants and small functions that turn an ``nvidia-smi topo -m`` cell (``NV2``, ``PIX``,
``SYS``...) into a number. Two independent number systems live here:

* **Bandwidth** (GB/s per direction between one GPU pair), used by the ``topoplace`` policy and
  by the fabric model. Figures come from ``../shared/data/topologies/link_bandwidths.csv``; the
  source of each figure is quoted beside it. The PCIe path-level model is ours and documented in
  :data:`PCIE_PATH_FACTOR`.
* **go-gpuallocator pair weights** (dimensionless), used by the ``nvidia-best-effort`` policy so
  that it ranks GPU sets exactly like NVIDIA's k8s-device-plugin.

Contract: everything here is a pure function of its arguments; the tables are read-only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "DEFAULT_NVLINK_GBPS_PER_LINK",
    "MAX_NVLINKS_PER_GPU",
    "NVLINK_GBPS_PER_LINK",
    "NVLINK_WEIGHT",
    "PCIE_GBPS_X16",
    "PCIE_GEN_BY_GENERATION",
    "PCIE_LABELS",
    "PCIE_PATH_FACTOR",
    "PCIE_WEIGHT",
    "allocator_pair_weight",
    "is_nvlink_label",
    "normalize_label",
    "nvlink_count",
    "nvlink_gbps",
    "pair_bandwidth",
    "pcie_gbps",
]

# --------------------------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------------------------

#: PCIe path letters of ``nvidia-smi topo -m``, best (closest) first. Legend as printed by
#: current drivers (see ../shared/data/topologies/README.md): PIX = at most one PCIe bridge,
#: PXB = several bridges without the host bridge, PHB = through a host bridge (CPU),
#: NODE = between host bridges inside one NUMA node, SYS = across the SMP interconnect
#: (QPI/UPI/xGMI). Older drivers printed ``SOC`` for ``SYS`` and had no ``NODE``.
PCIE_LABELS: tuple[str, ...] = ("PIX", "PXB", "PHB", "NODE", "SYS")

_NV_RE = re.compile(r"^NV(\d+)$")

#: The most NVLinks any NVIDIA GPU has (H100/H200/B200: 18). A GPU that reports more bonded
#: links than this *in total* over its peers cannot be directly wired to them: the links go to
#: an NVSwitch fabric. The topo-m parser uses this to prove an all-to-all pattern.
MAX_NVLINKS_PER_GPU = 18


def normalize_label(label: str) -> str:
    """Return the canonical spelling of one topo-m cell.

    ``SOC`` becomes ``SYS``; ``X`` stays ``X``; ``NV<k>`` keeps its count (``NV02`` -> ``NV2``).

    Args:
        label: One cell as printed, surrounding blanks allowed, any case.

    Returns:
        ``"X"``, ``"NV<k>"`` with k >= 1, or one of :data:`PCIE_LABELS`.

    Raises:
        ValueError: The cell is not a GPU-GPU link label (e.g. ``"N/A"`` or a CPU range).
    """
    text = label.strip().upper()
    if text == "X":
        return "X"
    if text == "SOC":
        return "SYS"
    if text in PCIE_LABELS:
        return text
    match = _NV_RE.match(text)
    if match and int(match.group(1)) >= 1:
        return f"NV{int(match.group(1))}"
    raise ValueError(f"unknown topology label {label!r}")


def is_nvlink_label(label: str) -> bool:
    """True for an ``NV<k>`` label (k >= 1), false for ``X`` and PCIe letters."""
    return bool(_NV_RE.match(label))


def nvlink_count(label: str) -> int:
    """Bonded NVLink count of a normalized label: ``NV12`` -> 12, anything else -> 0."""
    match = _NV_RE.match(label)
    return int(match.group(1)) if match else 0


# --------------------------------------------------------------------------------------------
# Bandwidth model (GB/s per direction)
# --------------------------------------------------------------------------------------------

#: NVLink bandwidth of ONE link, per direction, by GPU generation (``GpuShape.generation``).
#: A pair connected by ``NV<k>`` gets k times this. For NVSwitch shapes nvidia-smi prints the
#: GPU's whole link count for every pair (NV6 / NV12 / NV18), so k x rate is exactly the GPU's
#: full NVLink bandwidth, which is what a pair can use through the switch.
_NVLINK_TABLE: dict[str, float] = {
    # NVLink 1.0 (Tesla P100 SXM2): 4 links, 160 GB/s bidirectional per GPU = 20 GB/s per link
    # per direction. NVIDIA Tesla P100 white paper figure; NOT in link_bandwidths.csv.
    "P100": 20.0,
    # NVLink 2.0 (V100 SXM2/SXM3; DGX-1, DGX-2): 25 GB/s per link per direction, 6 links,
    # 300 GB/s per GPU bidirectional. link_bandwidths.csv rows 1-2 (DGX-1 white paper;
    # nvidia-smi nvlink --status shows 25.781 GB/s).
    "V100": 25.0,
    # Quadro RTX 8000 / Turing NVLink bridge: 2 links, 100 GB/s bidirectional total = 25 GB/s
    # per link per direction (NVIDIA Quadro NVLink bridge spec; NOT in link_bandwidths.csv).
    "RTX8000": 25.0,
    # NVLink 3.0 (A100 SXM4): 12 links x 25 GB/s per direction = 600 GB/s bidirectional per
    # GPU. link_bandwidths.csv row "NVLink 3.0 (A100 SXM4...)" (nvidia.com NVLink page).
    "A100": 25.0,
    # A800 export variant: 8 links x 25 GB/s. link_bandwidths.csv row "A800" (secondary source).
    "A800": 25.0,
    # NVLink 4.0 (H100/H200 SXM): 18 links x 25 GB/s per direction = 900 GB/s bidirectional
    # per GPU. link_bandwidths.csv row "NVLink 4.0" (nvidia.com Hopper page).
    "H100": 25.0,
    "H200": 25.0,
    "H800": 25.0,
    # NVLink 5.0 (B200/GB200): 18 links x 50 GB/s per direction (100 GB/s bidirectional per
    # link) = 1.8 TB/s bidirectional per GPU. link_bandwidths.csv row "NVLink 5.0" (vendor text
    # via secondary copies).
    "B200": 50.0,
    "GB200": 50.0,
}
NVLINK_GBPS_PER_LINK: Mapping[str, float] = MappingProxyType(_NVLINK_TABLE)

#: Per-link rate used when the generation is unknown: the lowest rate of any NVLink
#: generation (NVLink 1.0), so that an unidentified NVLink is never overstated.
DEFAULT_NVLINK_GBPS_PER_LINK = 20.0

#: PCIe x16 bandwidth per direction, by PCIe generation. link_bandwidths.csv rows "PCIe 3.0 /
#: 4.0 / 5.0 x16" (PCI-SIG rates: 8/16/32 GT/s with 128b/130b encoding).
PCIE_GBPS_X16: Mapping[int, float] = MappingProxyType({3: 15.75, 4: 31.5, 5: 63.0})

#: PCIe generation of the GPU's host interface, by GPU generation (product data sheets:
#: P100/V100/RTX 8000 are Gen3, A100/A800/RTX 4090 Gen4, H100/H200/B200 Gen5). GB200 GPUs hang
#: off Grace through NVLink-C2C; Gen5 is used for their (rare) PCIe path. Unknown -> Gen3,
#: the slowest generation any NVLink-era data-centre GPU uses: conservative.
_PCIE_GEN: dict[str, int] = {
    "P100": 3,
    "V100": 3,
    "RTX8000": 3,
    "A100": 4,
    "A800": 4,
    "RTX4090": 4,
    "H100": 5,
    "H200": 5,
    "H800": 5,
    "B200": 5,
    "GB200": 5,
}
PCIE_GEN_BY_GENERATION: Mapping[str, int] = MappingProxyType(_PCIE_GEN)
_DEFAULT_PCIE_GEN = 3

#: Fraction of the x16 rate a GPU pair gets for each PCIe path level. This is a MODEL, not a
#: measurement; what it must get right is the order PIX = PXB > PHB = NODE > SYS:
#:
#: * PIX / PXB (1.0): peer-to-peer stays below the host bridge, inside PCIe switches that
#:   forward at link rate, so the x16 link rate is the limit.
#: * PHB / NODE (0.8): P2P traffic is forwarded by the CPU root complex(es); root-complex P2P
#:   forwarding is typically slower than a switch and shared with host traffic. 20 % off is
#:   the assumed cost.
#: * SYS (0.5): traffic crosses the socket interconnect (QPI/UPI/xGMI); many platforms do not
#:   forward P2P across sockets at all and NCCL then bounces through host memory, which costs
#:   at least one extra copy. Half the link rate is the assumed cost.
#:
#: Tests pin the order, not the factors, so the factors can be recalibrated from measurements.
PCIE_PATH_FACTOR: Mapping[str, float] = MappingProxyType(
    {"PIX": 1.0, "PXB": 1.0, "PHB": 0.8, "NODE": 0.8, "SYS": 0.5}
)


def nvlink_gbps(generation: str, links: int) -> float:
    """NVLink bandwidth (GB/s per direction) of ``links`` bonded links of a generation.

    Args:
        generation: ``GpuShape.generation``; unknown names use
            :data:`DEFAULT_NVLINK_GBPS_PER_LINK`.
        links: Bonded link count (``NV<k>``); 0 gives 0.0.

    Returns:
        ``links`` times the per-link rate.
    """
    if links <= 0:
        return 0.0
    return links * NVLINK_GBPS_PER_LINK.get(generation, DEFAULT_NVLINK_GBPS_PER_LINK)


def pcie_gbps(generation: str, label: str) -> float:
    """Modelled PCIe peer bandwidth (GB/s per direction) for one path level.

    Args:
        generation: ``GpuShape.generation`` (selects the PCIe generation).
        label: One of :data:`PCIE_LABELS` (``SOC`` accepted as ``SYS``).

    Returns:
        x16 rate of the GPU's PCIe generation times :data:`PCIE_PATH_FACTOR` of the label.

    Raises:
        ValueError: ``label`` is not a PCIe path letter.
    """
    level = normalize_label(label)
    if level not in PCIE_PATH_FACTOR:
        raise ValueError(f"not a PCIe path label: {label!r}")
    gen = PCIE_GEN_BY_GENERATION.get(generation, _DEFAULT_PCIE_GEN)
    # Rounded so that e.g. 15.75 * 0.8 prints as 12.6, not 12.600000000000001.
    return round(PCIE_GBPS_X16[gen] * PCIE_PATH_FACTOR[level], 6)


def pair_bandwidth(generation: str, nvlinks: int, pcie: str) -> float:
    """Bandwidth of the best path between two GPUs, GB/s per direction.

    NVLink if the pair has any (NVLink and PCIe are not added: NCCL uses the faster path),
    else the modelled PCIe bandwidth of the pair's path level.
    """
    if nvlinks > 0:
        return nvlink_gbps(generation, nvlinks)
    return pcie_gbps(generation, pcie)


# --------------------------------------------------------------------------------------------
# go-gpuallocator pair weights (best-effort policy)
# --------------------------------------------------------------------------------------------

#: PCIe part of NVIDIA/go-gpuallocator's pair score (gpuallocator/besteffort_policy.go @
#: 876e7b7609bb839919e4eb06ce00607db76e907e, ``calculateGPUPairScore``): P2PLinkCrossCPU 10,
#: P2PLinkSameCPU 20, P2PLinkHostBridge 30, P2PLinkMultiSwitch 40, P2PLinkSingleSwitch 50
#: (P2PLinkSameBoard 60 has no topo-m letter). The letters map to NVML common-ancestor levels
#: (internal/links/device.go ``GetP2PLink``): SYSTEM->CrossCPU, NODE->SameCPU,
#: HOSTBRIDGE->HostBridge, MULTIPLE->MultiSwitch, SINGLE->SingleSwitch.
PCIE_WEIGHT: Mapping[str, int] = MappingProxyType(
    {"SYS": 10, "NODE": 20, "PHB": 30, "PXB": 40, "PIX": 50}
)

#: Weight of one bonded NVLink in the same score (SingleNVLINKLink 100 ... EighteenNVLINKLinks
#: 1800, i.e. 100 per link).
NVLINK_WEIGHT = 100


def allocator_pair_weight(nvlinks: int, pcie: str) -> int:
    """go-gpuallocator's score of one GPU pair.

    The device plugin records, for every pair, one PCIe link (NVML always reports a common
    ancestor) plus one NVLink entry when the pair has NVLinks, and the score sums over the
    recorded links. So a pair scores ``PCIE_WEIGHT[pcie] + 100 * nvlinks``; e.g. the DGX-1
    V100 pair 0-3 (NV2, same host bridge) scores 30 + 200 = 230.

    Args:
        nvlinks: Bonded NVLink count of the pair (0 if none).
        pcie: The pair's PCIe path letter.
    """
    return PCIE_WEIGHT[normalize_label(pcie)] + NVLINK_WEIGHT * max(nvlinks, 0)
