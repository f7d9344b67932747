"""`topoplace demo` end to end: the console script, real HTTP, the embedded demo cluster."""

from __future__ import annotations

import json
import re
import subprocess
import sys

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ \S+: ", re.MULTILINE)
"""A line of the CLI's log format (``%(asctime)s %(levelname)s %(name)s: %(message)s``)."""


def _demo(*flags: str) -> subprocess.CompletedProcess[str]:
    """``topoplace demo`` run as the console script would (exit status 0 required)."""
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli.main", "demo", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_demo_json_decisions() -> None:
    out = _demo("--json")
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
    # No GPU handed out twice (fractional pods hold shares, not whole GPUs).
    held = [(r["node"], g) for r in rows.values() if not r.get("shares") for g in r["gpus"]]
    assert len(held) == len(set(held))
    # Fractional pods go to the HAMi-registered inference nodes, on one GPU each.
    shared = [r for r in rows.values() if r.get("shares")]
    assert len(shared) == 4
    assert all(r["node"].startswith("infer-") and len(r["shares"]) == 1 for r in shared)
    assert not {(r["node"], g) for r in shared for g in r["gpus"]} & set(held)
    assert rows["ml-serve/asr-0"]["shares"][0][1] == 46068 // 2  # 50 % of an L40S


def test_demo_table_prints() -> None:
    out = _demo()
    assert "placed on" in out.stdout and "16 GPUs in one pod: pending" in out.stdout
    assert "every step behaved" in out.stdout


def test_demo_prints_the_story_and_no_log_line() -> None:
    """On a terminal stdout and stderr interleave: with both on one pipe, the demo's output
    is its story alone (the extender's bind audit lines and INFO logs are held back)."""
    out = subprocess.run(
        [sys.executable, "-m", "scheduler.cli.main", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "every step behaved" in out
    assert not LOG_LINE.findall(out), LOG_LINE.findall(out)[:3]
    assert "topoplace.bind" not in out and '"event":"bind"' not in out


def test_demo_verbose_logs_to_stderr_only() -> None:
    """``--verbose`` shows what the extender does, on stderr: one bind audit line per pod
    bound; stdout keeps the story alone."""
    out = _demo("--verbose")
    assert "every step behaved" in out.stdout and not LOG_LINE.findall(out.stdout)
    binds = [line for line in out.stderr.splitlines() if "INFO topoplace.bind: " in line]
    bound = sum(1 for line in out.stdout.splitlines() if line.strip().startswith("placed on"))
    assert bound > 0 and len(binds) >= bound


def test_demo_captions_come_from_the_decisions() -> None:
    out = _demo("--json")
    doc = json.loads(out.stdout)
    assert doc["ok"] is True and doc["failures"] == []
    rows = {r["pod"]: r for r in doc["decisions"]}
    for r in rows.values():
        assert r["ok"] and r["caption"]
        exp = r["explanation"]
        if exp is not None and exp.get("kind") == "share":
            # A fractional pod: the sharing policy's record names the node it went to.
            assert exp["chosen"]["node"] == r["node"] and exp["policy"] in r["caption"]
        elif exp is not None and exp["chosen"] is not None:
            # The caption names the node the pod really went to, and the record's numbers.
            assert r["node"] == exp["chosen"]["node"] and r["node"] in r["caption"]
            used = exp["chosen"]["occupancy"]["used_before"]
            assert r["occupancy"]["used_before"] == used
            assert r["occupancy"]["used_after"] == sorted(set(used) | set(r["gpus"]))
    embed = rows["ml-serve/embed-1"]
    assert embed["caption"].startswith("takes an idle node")  # not "the fullest node"
    moe = rows["ml-serve/moe-infer-0"]
    assert "gb200-r000-t05 (GPU fault condition)" in moe["caption"]
    gang = [r for r in doc["decisions"] if r["pod"].startswith("ml-train/llama-pt-")]
    assert len(gang) == 3 and "1 nvlink-domain" in gang[0]["caption"]
    assert rows["ml-train/too-big-0"]["expected"] == "pending"
    # A fractional step names the GPU it shares and the sharing policy the demo runs with.
    chat = rows["ml-serve/chat-7b-0"]
    assert chat["caption"].startswith(f"shares GPU {chat['gpus'][0]} of {chat['node']}")
    assert chat["caption"].endswith("(chosen by the sharing policy topoplace-share)")


def test_demo_exits_1_when_a_step_fails(tmp_path) -> None:
    """On a cluster without the GPUs the script needs, steps fail and the demo says so."""
    import yaml

    from scheduler.cli.clusterfile import demo_cluster_path, load_cluster

    nodes, _, _ = load_cluster(str(demo_cluster_path()))
    small = [
        {"kind": "Node", "apiVersion": "v1", **n}
        for n in nodes
        if n["metadata"]["name"].startswith("pcie-")
    ]
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": small}))
    out = subprocess.run(
        [sys.executable, "-m", "scheduler.cli.main", "demo", "--cluster", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout[-2000:]
    assert "FAILED: expected placed" in out.stdout
    assert "step(s) FAILED" in out.stdout


def test_demo_ui_serves_the_cluster_view() -> None:
    import signal

    import httpx

    from scheduler.cli.demo import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli.main", "--log-level", "WARNING", "demo", "--ui"]
        + ["--no-browser", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("cluster view:"):
                break
        assert line.split()[2] == f"http://127.0.0.1:{port}/ui"
        page = httpx.get(f"http://127.0.0.1:{port}/ui", timeout=10)
        assert page.status_code == 200 and "cluster view" in page.text
        view = httpx.get(f"http://127.0.0.1:{port}/v1/inspect/view", timeout=10).json()
        keys = {p["key"] for p in view["pods"]}
        assert {"research/notebook-1", "ml-train/llama-pt-2"} <= keys
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
