"""Packaging: the wheel ships the data `serve` and `demo` need; the Dockerfile is sane.

There is no Docker engine here, so the image itself is not built in tests; the wheel its
build stage installs is, and the Dockerfile's contract (non-root, entrypoint, health
check on /healthz, copied paths exist) is checked.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_wheel_contains_code_and_config(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    wheel = next(tmp_path.glob("topoplace-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "config/policy.yaml",
        "config/clusters/demo.yaml",
        "scheduler/cli/main.py",
        "scheduler/server/app.py",
        "topology/shape.py",
        "benchmarks/clusters.py",
    ):
        assert required in names, f"{required} missing from {wheel.name}"
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "topoplace = scheduler.cli.main:main" in zipfile.ZipFile(wheel).read(entry).decode()
    assert not any(n.startswith("tests/") for n in names)
    # The licence: its SPDX expression in the metadata, its text beside it.
    z = zipfile.ZipFile(wheel)
    meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta
    text = z.read(next(n for n in names if n.endswith("/LICENSE"))).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_dockerfile_contract() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and not user[-1].startswith(("root", "0")), "the image must not run as root"
    assert "HEALTHCHECK" in text and "/healthz" in text
    assert re.search(r'^ENTRYPOINT \["topoplace"\]', text, re.M)
    assert re.search(r'^CMD \["serve"', text, re.M)
    for src in re.findall(r"^COPY (?!--from)(\S+)", text, re.M):
        assert (REPO / src).exists(), f"Dockerfile copies {src}, which does not exist"
