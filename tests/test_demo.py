"""`topoplace demo` end to end: the console script, real HTTP, the embedded demo cluster."""

from __future__ import annotations

import json
import subprocess
import sys


def test_demo_json_decisions() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scheduler.cli.main", "demo", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = {r["pod"]: r for r in json.loads(out.stdout)["decisions"]}
    # Single-GPU pods pack onto the partly used DGX H100 instead of opening a fresh node.
    assert (
        rows["research/notebook-1"]["node"] == rows["research/notebook-2"]["node"] == "dgx-h100-01"
    )
    # The 8-GPU NVLink-only pod gets the only node with 8 free healthy NVLinked GPUs.
    assert rows["ml-train/gpt-pretrain-0"]["node"] == "dgx-h100-02"
    assert rows["ml-train/gpt-pretrain-0"]["gpus"] == list(range(8))
    # GB200 pods never land on the tray with an XID fault.
    assert rows["ml-serve/moe-infer-0"]["node"].startswith("gb200-")
    assert rows["ml-serve/moe-infer-0"]["node"] != "gb200-r000-t05"
    assert rows["ml-serve/moe-infer-0"]["unresolvable"]["gb200-r000-t05"] == "GPU fault condition"
    big = rows["ml-train/too-big-0"]
    assert big["node"] == "" and big["feasible"] == 0
    assert set(big["unresolvable"].values()) >= {
        "node has fewer healthy GPUs than requested",
        "node not ready",
    }
    # No GPU handed out twice.
    held = [(r["node"], g) for r in rows.values() for g in r["gpus"]]
    assert len(held) == len(set(held))


def test_demo_table_prints() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scheduler.cli.main", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "placed on" in out.stdout and "16 GPUs in one pod: pending" in out.stdout
    assert "every step behaved" in out.stdout
