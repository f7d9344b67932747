"""The test cluster's helpers against the real API server: the node heartbeat, and the
session nodes it keeps fresh."""

from __future__ import annotations

import contextlib
import datetime
import time
from typing import Any

from tests.kube.conftest import make_gpu_node
from tests.kube.test_health_live import _ready, xid_condition


def _conditions(core: Any, name: str) -> dict[str, Any]:
    return {c.type: c for c in core.read_node_status(name).status.conditions or []}


def _age(t: datetime.datetime) -> float:
    return (datetime.datetime.now(datetime.UTC) - t).total_seconds()


def test_heartbeat_moves_only_the_heartbeat(core: Any, kubeconfig: str, run_id: str) -> None:
    """A stalled node's heartbeat becomes fresh; its Ready transition time, a Ready False a
    test set and the other conditions stay as they were; a node that is gone is skipped."""
    from benchmarks.cluster.nodes import Heartbeat
    from benchmarks.live.kubeapi import Api

    stalled, down = f"tp-it-{run_id}-hb-0", f"tp-it-{run_id}-hb-1"
    api = Api(kubeconfig)
    try:
        for n in (stalled, down):
            make_gpu_node(core, n, f"{run_id}-hb")
        core.patch_node_status(
            stalled, {"status": {"conditions": [_ready(heartbeat_ago_s=1500), xid_condition()]}}
        )
        not_ready = {**_ready(), "status": "False", "reason": "KubeletNotReady"}
        core.patch_node_status(down, {"status": {"conditions": [not_ready]}})
        before = _conditions(core, stalled)
        assert _age(before["Ready"].last_heartbeat_time) > 1400
        hb = Heartbeat(api, [stalled, down, f"tp-it-{run_id}-hb-gone"], interval=3600)
        hb.beat()
        assert hb.beats == 1
        after = _conditions(core, stalled)
        assert _age(after["Ready"].last_heartbeat_time) < 30
        assert after["Ready"].status == "True"
        assert after["Ready"].last_transition_time == before["Ready"].last_transition_time
        assert after["GpuXidError"].status == "True"
        assert after["GpuXidError"].last_heartbeat_time == before["GpuXidError"].last_heartbeat_time
        assert _conditions(core, down)["Ready"].status == "False"
    finally:
        api.close()
        for n in (stalled, down):
            with contextlib.suppress(Exception):
                core.delete_node(n)


def test_session_nodes_heartbeat_while_the_session_runs(core: Any, gpu_nodes: list[str]) -> None:
    """The session's nodes are refreshed by its heartbeat: a beat backdated by hand (less
    than topoplace's 360 s, so the node is not graded down meanwhile) is replaced within
    the heartbeat interval (``TOPOPLACE_KUBE_HEARTBEAT_S``, 60 s)."""
    n = gpu_nodes[0]
    core.patch_node_status(n, {"status": {"conditions": [_ready(heartbeat_ago_s=300)]}})
    assert _age(_conditions(core, n)["Ready"].last_heartbeat_time) > 250
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if _age(_conditions(core, n)["Ready"].last_heartbeat_time) < 120:
            break
        time.sleep(2)
    assert _age(_conditions(core, n)["Ready"].last_heartbeat_time) < 120
