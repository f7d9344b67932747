"""``topoplace plan`` on cluster files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from benchmarks.clusters import as_list
from scheduler.cli.main import main
from scheduler.cli.plan import parse_gang
from scheduler.core.params import SchedParams
from tests.builders import cluster, dgx_su, nvl72_rack


@pytest.fixture
def cluster_file(tmp_path: Path) -> Path:
    nodes, pods = cluster(
        nvl72_rack("rack-a", used={0: [0, 1, 2, 3]}) + dgx_su("su-a", nodes=4, spine="spine-1")
    )
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(as_list(nodes + pods)))
    return path


def test_plan_prints_nodes_gpus_domains_and_solver_record(cluster_file: Path, capsys) -> None:
    rc = main(
        [
            "plan",
            "--cluster",
            str(cluster_file),
            "--gang",
            "train:16x4:required=nvlink-domain",
            "--gang",
            "ft:2x8:preferred=leaf",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "gang default/train: 16 pods x 4 GPUs (required nvlink-domain): placed" in out
    assert "default/train#worker-0" in out and "rack-a-t01" in out and "0,1,2,3" in out
    assert "nvlink-domain 1 (lower bound 1)" in out
    assert "collective bandwidth estimate: 900 GB/s" in out
    assert "status optimal" in out and "seed 7" in out
    assert "gang default/ft: 2 pods x 8 GPUs (preferred leaf): placed" in out


def test_plan_json_and_refusal_exit_code(cluster_file: Path, capsys) -> None:
    rc = main(
        [
            "plan",
            "--cluster",
            str(cluster_file),
            "--gang",
            "big:18x4:required=nvlink-domain",
            "--policy",
            "kueue-bestfit",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    (g,) = out
    assert g["gang"] == "default/big" and not g["ok"] and g["assignments"] == []
    assert g["reason"] == (
        "needs 18 pods x 4 free healthy GPUs inside one nvlink-domain; "
        "the largest such domain has room for 17"
    )
    assert g["details"]["policy"] == "kueue-bestfit"


def test_plan_joint_gangs_see_each_other(cluster_file: Path, capsys) -> None:
    rc = main(
        [
            "plan",
            "--cluster",
            str(cluster_file),
            "--gang",
            "a:3x8",
            "--gang",
            "b:2x8",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 1  # 4 DGX nodes: the second gang no longer fits
    assert out[0]["ok"] and not out[1]["ok"]
    assert "room for 1" in out[1]["reason"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("train", "expected NAME:PODSxGPUS"),
        ("train:16", "size must be PODSxGPUS"),
        ("train:16x4:colour=blue", "unknown option"),
        ("train:16x4:required=rack", "unknown topology level 'rack'"),
    ],
)
def test_bad_gang_specs(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_gang(spec, SchedParams())


def test_kai_and_kueue_level_keys_map_onto_levels() -> None:
    g = parse_gang("x:2x8:required=network.topology.nvidia.com/leaf", SchedParams())
    assert g.topology.required == "leaf"
    g = parse_gang("x:2x8:preferred=kubernetes.io/hostname", SchedParams())
    assert g.topology.preferred == "node"


def test_cli_errors_and_policy_list(cluster_file: Path, capsys) -> None:
    assert (
        main(["plan", "--cluster", str(cluster_file), "--gang", "x:1x8", "--policy", "nope"]) == 2
    )
    assert "registered:" in capsys.readouterr().err
    assert main(["plan", "--gang", "x:1x8"]) == 2
    assert main(["plan", "--list-policies"]) == 0
    names = capsys.readouterr().out.split()
    assert "topoplace" in names and "kueue-balanced" in names
