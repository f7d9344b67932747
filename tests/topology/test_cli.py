"""The ``topo`` CLI (scheduler/cli/topo.py): in-process via add_parser and as a subprocess."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from scheduler.cli import topo
from tests.topology._support import REPO, topology_file


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli.topo", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_select_json_subprocess() -> None:
    proc = run(
        "select", "--topology", "dgx1-v100", "--available", "0,2,4,5", "--size", "2", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"gpus": [4, 5], "score": 150.0, "bottleneck_gbps": 25.0}


def test_refusal_exit_code_subprocess() -> None:
    proc = run("topo", "select", "--topology", "rtx-4gpu-nvlink-pairs", "--size", "5", "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout) == {"gpus": [], "error": "not enough GPUs available"}


def _main_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topoplace")
    topo.add_parser(parser.add_subparsers(dest="command"))
    return parser


def _dispatch(argv: list[str]) -> int:
    args = _main_parser().parse_args(argv)
    return args.func(args)


CASES = [
    ("required GPU", ["--topology", "dgx1-v100", "--size", "2", "--required", "4"], 0, [4, 7]),
    (
        "topoplace policy",
        ["--topology", "dgx1-v100", "--size", "5", "--policy", "topoplace"],
        0,
        [0, 2, 3, 4, 7],
    ),
    (
        "default available = all",
        ["--topology", "pcie-8gpu-2socket", "--size", "4"],
        0,
        [0, 1, 2, 3],
    ),
    (
        "required busy",
        ["--topology", "dgx1-v100", "--available", "1,2", "--size", "1", "--required", "0"],
        1,
        [],
    ),
]


@pytest.mark.parametrize(("desc", "argv", "code", "gpus"), CASES, ids=[c[0] for c in CASES])
def test_select_via_main_cli(desc, argv, code, gpus, capsys) -> None:
    assert _dispatch(["topo", "select", *argv, "--json"]) == code
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == gpus
    assert ("error" in out) == (code == 1)


def test_select_human_output(capsys) -> None:
    assert _dispatch(["topo", "select", "--topology", "dgx1-v100", "--size", "2"]) == 0
    assert "gpus 0,3" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["select", "--topology", "no-such-shape", "--size", "1"],
        ["select", "--topology", "dgx1-v100", "--available", "0,9", "--size", "1"],
        ["select", "--topology", "dgx1-v100", "--available", "a", "--size", "1"],
        ["show", "no-such-shape"],
    ],
    ids=["unknown shape", "index out of range", "not an index", "show unknown"],
)
def test_usage_errors_exit_2(argv: list[str], capsys) -> None:
    assert topo.main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_show_catalog(capsys) -> None:
    assert topo.main(["show", "dgx1-v100"]) == 0
    out = capsys.readouterr().out
    assert "generation: V100" in out and "GPU7" in out and "NV2" in out
    assert "7.875" in out  # SYS bandwidth
    assert "230" in out  # allocator weight NV2+PHB


def test_show_file_and_json(tmp_path, capsys) -> None:
    path = topology_file("hgx_h100_nv18_nccl1453.txt")
    assert topo.main(["show", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_gpus"] == 8 and data["links"][0][1] == "NV18"
    yaml_file = tmp_path / "box.yaml"
    yaml_file.write_text("gpus: 2\ngpu: A100\nnvlinks:\n  - [0, 1, 12]\n")
    assert topo.main(["select", "--topology", str(yaml_file), "--size", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bottleneck_gbps"] == 300.0
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    assert topo.main(["show", str(bad)]) == 2
