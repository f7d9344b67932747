"""Link labels, bandwidth model and allocator weights (topology.links)."""

from __future__ import annotations

import csv
import re

import pytest

from tests.topology._support import topology_file
from topology.links import (
    NVLINK_GBPS_PER_LINK,
    PCIE_GBPS_X16,
    PCIE_LABELS,
    allocator_pair_weight,
    normalize_label,
    nvlink_count,
    pair_bandwidth,
    pcie_gbps,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (" X ", "X"),
        ("SOC", "SYS"),
        ("soc", "SYS"),
        ("SYS", "SYS"),
        ("NODE", "NODE"),
        ("PHB", "PHB"),
        ("PXB", "PXB"),
        ("PIX", "PIX"),
        ("NV1", "NV1"),
        ("NV02", "NV2"),
        ("nv18", "NV18"),
    ],
    ids=lambda v: repr(v),
)
def test_normalize_label(raw: str, expected: str) -> None:
    assert normalize_label(raw) == expected


@pytest.mark.parametrize("raw", ["N/A", "NV0", "NV", "0-19,40-59", "", "CPU"], ids=repr)
def test_normalize_label_rejects_non_links(raw: str) -> None:
    with pytest.raises(ValueError, match="unknown topology label"):
        normalize_label(raw)


def test_nvlink_count() -> None:
    assert [nvlink_count(x) for x in ("NV12", "NV1", "PIX", "X", "SYS")] == [12, 1, 0, 0, 0]


@pytest.mark.parametrize(
    ("generation", "nvlinks", "pcie", "gbps"),
    [
        ("V100", 1, "PIX", 25.0),  # DGX-1 NV1: one NVLink 2.0 link
        ("V100", 2, "SYS", 50.0),  # DGX-1 NV2
        ("V100", 6, "SYS", 150.0),  # DGX-2 NV6 through NVSwitch = the GPU's full NVLink
        ("P100", 1, "PHB", 20.0),  # NVLink 1.0
        ("RTX8000", 2, "SYS", 50.0),  # 2-link NVLink bridge
        ("A100", 12, "SYS", 300.0),  # 600 GB/s bidirectional per GPU
        ("H100", 18, "NODE", 450.0),  # 900 GB/s bidirectional per GPU
        ("H200", 18, "SYS", 450.0),
        ("B200", 18, "SYS", 900.0),  # NVLink 5.0: 1.8 TB/s bidirectional
        ("GB200", 18, "SYS", 900.0),
        ("unknown", 2, "SYS", 40.0),  # unknown generation: NVLink 1.0 rate, never overstated
        ("V100", 0, "PIX", 15.75),  # PCIe Gen3 x16 through one switch
        ("V100", 0, "PHB", 12.6),  # host bridge: 0.8 x
        ("V100", 0, "SYS", 7.875),  # cross socket: 0.5 x
        ("A100", 0, "PXB", 31.5),  # Gen4
        ("H100", 0, "NODE", 50.4),  # Gen5 x 0.8
        ("RTX4090", 0, "SYS", 15.75),  # Gen4 x 0.5
        ("unknown", 0, "SYS", 7.875),  # unknown: Gen3
    ],
    ids=lambda v: str(v),
)
def test_pair_bandwidth(generation: str, nvlinks: int, pcie: str, gbps: float) -> None:
    assert pair_bandwidth(generation, nvlinks, pcie) == pytest.approx(gbps)


@pytest.mark.parametrize("generation", ["V100", "A100", "H100", "unknown"])
def test_pcie_levels_are_ordered(generation: str) -> None:
    """The model's contract: PIX = PXB > PHB = NODE > SYS (closer is never slower)."""
    pix, pxb, phb, node, sys_ = (pcie_gbps(generation, x) for x in PCIE_LABELS)
    assert pix == pxb > phb == node > sys_ > 0


def test_pcie_gbps_rejects_nvlink() -> None:
    with pytest.raises(ValueError):
        pcie_gbps("V100", "NV2")


@pytest.mark.parametrize(
    ("nvlinks", "pcie", "weight"),
    [
        (0, "SYS", 10),
        (0, "SOC", 10),
        (0, "NODE", 20),
        (0, "PHB", 30),
        (0, "PXB", 40),
        (0, "PIX", 50),
        (1, "PIX", 150),  # DGX-1 V100 GPU0-GPU1
        (2, "PHB", 230),  # DGX-1 V100 GPU0-GPU3
        (2, "SYS", 210),  # DGX-1 V100 GPU0-GPU4
        (18, "NODE", 1820),  # H100 same socket
    ],
    ids=lambda v: str(v),
)
def test_allocator_pair_weight(nvlinks: int, pcie: str, weight: int) -> None:
    """go-gpuallocator calculateGPUPairScore: PCIe level weight + 100 per NVLink."""
    assert allocator_pair_weight(nvlinks, pcie) == weight


def test_rates_match_link_bandwidths_csv() -> None:
    """The embedded numbers are the ones of ../shared/data/topologies/link_bandwidths.csv."""
    path = topology_file("link_bandwidths.csv")
    rows = list(csv.DictReader(path.open()))
    per_link = {}
    for row in rows:
        gen = row["generation_or_product"]
        rate = float(row["gb_per_s_per_link_per_direction"])
        if row["link_type"].startswith("NVLink"):
            for product in re.findall(r"\b(GB200|B200|H200|H100|A800|A100|V100)\b", gen):
                per_link[product] = rate
        elif row["link_type"] == "PCIe":
            version = int(gen.split()[1].split(".")[0])
            assert PCIE_GBPS_X16[version] == rate, gen
    assert {"V100", "A100", "H100", "H200", "B200", "GB200"} <= set(per_link)
    for product, rate in per_link.items():
        assert NVLINK_GBPS_PER_LINK[product] == rate, product
