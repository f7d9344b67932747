"""Decision explanations: the score taken apart adds up to what prioritize returned, for
every demo pod, online (the extender's records, ``topoplace explain --url``) and offline
(``topoplace explain --cluster``); the records are bounded; the placement record carries
the one-line why."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import yaml

from scheduler.cli.clusterfile import demo_cluster_path, load_cluster
from scheduler.cli.demo import ServerThread, scripted_pods, scripted_steps
from scheduler.cli.main import build_file_extender, load_params, main
from scheduler.core.explain import PARTS, explain, summarize
from scheduler.core.model import PLACEMENT_ANNOTATION
from scheduler.core.objects import placement_of, request_from_pod
from scheduler.core.schedule import (
    filter_codes,
    filter_nodes,
    narrow_with_rank,
    score_positions,
)
from scheduler.core.snapshot import build_snapshot
from scheduler.server.app import create_app
from scheduler.server.decisions import DecisionLog
from tests.ui.helpers import schedule

EXTRA = ("rounding", "choice")


def whole_gpu_pods() -> list[tuple[str, dict]]:
    """The demo's whole-GPU pods (fractional pods take the sharing policy's branch: see
    :func:`test_parts_sum_to_prioritize_score_for_every_demo_share_pod`)."""
    from scheduler.core.fractional import is_share_pod

    return [(t, p) for t, p in scripted_pods() if not is_share_pod(p)]


def _sum(points: dict[str, float]) -> float:
    return sum(points[k] for k in (*PARTS, *EXTRA))


def _cli(argv: list[str]) -> tuple[int, Any]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(argv)
    return rc, json.loads(buf.getvalue())


def test_parts_sum_to_prioritize_score_for_every_demo_pod_online() -> None:
    params = load_params(None)
    ext, what = build_file_extender(None, params)
    checked = 0
    with (
        ServerThread(create_app(ext, description=what)) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as client,
    ):
        names = list(ext.cache.snapshot().names)
        for _, pod in whole_gpu_pods():
            m = pod["metadata"]
            key = f"{m['namespace']}/{m['name']}"
            body = orjson.dumps({"Pod": pod, "NodeNames": names})
            # Plan first for gang members (their first filter plans the gang).
            if "topoplace.io/gang" in m.get("annotations", {}):
                client.post("/scheduler/filter", content=body)
            returned = {
                h["Host"]: h["Score"]
                for h in client.post("/scheduler/prioritize", content=body).json()
            }
            rc, found = _cli(["explain", key, "--url", srv.url, "--json"])
            rec = next(d for d in found["decisions"] if d["verb"] == "prioritize")
            if "chosen" in rec:
                if rec["chosen"] is None:  # pending: prioritize gave every node 0
                    assert rec["outcome"] == "pending" and set(returned.values()) == {0}
                    assert rec["closest"]["lacks"]
                    continue
                c = rec["chosen"]
                assert returned[c["node"]] == c["score"] == max(returned.values())
                assert _sum(c["points"]) == pytest.approx(c["score"], abs=1e-9)
                assert sum(c["points"][k] for k in PARTS) == pytest.approx(10 * c["rank"], abs=1e-3)
                for r in rec["runners_up"]:
                    assert _sum(r["points"]) == pytest.approx(returned[r["node"]], abs=1e-9)
                    assert r["points"]["choice"] == 0
            else:  # a gang member: its planned node gets the plan's score, others 0
                node = rec["planned_node"]
                assert returned[node] == rec["score"] == 10
                assert sum(rec["points"].values()) == returned[node]
                assert {s for n, s in returned.items() if n != node} == {0}
            assert rc == 0
            checked += 1
            schedule(client, pod, names)
    assert checked == len(whole_gpu_pods()) - 1  # all but the pending pod


def _cluster_with(pods: list[dict[str, Any]], path: Path) -> str:
    nodes, bound, _ = load_cluster(str(demo_cluster_path()))
    items = [{"kind": "Node", "apiVersion": "v1", **n} for n in nodes]
    items += [{"kind": "Pod", "apiVersion": "v1", **p} for p in [*bound, *pods]]
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    return str(path)


def test_parts_sum_to_prioritize_score_for_every_demo_pod_offline(tmp_path: Path) -> None:
    """``explain --cluster`` on the demo cluster with each demo pod pending: the chosen
    node and runners-up score what prioritize returns over HTTP for the nodes filter
    passes (what kube-scheduler sends it), part by part."""
    params = load_params(None)
    for _, pod in whole_gpu_pods():
        m = pod["metadata"]
        key = f"{m['namespace']}/{m['name']}"
        path = _cluster_with([pod], tmp_path / f"{m['name']}.yaml")
        rc, found = _cli(["explain", key, "--cluster", path, "--json"])
        (rec,) = found["decisions"]
        if "topoplace.io/gang" in m.get("annotations", {}):
            assert rec["verb"] == "plan" and rec["planned_node"].startswith("gb200-")
            continue
        nodes, pods, extra = load_cluster(path)
        snap = build_snapshot(nodes, [p for p in pods if p is not pods[-1]], params, extra)
        feasible = list(
            filter_nodes(snap, request_from_pod(pod, params.fabric), None, params).feasible
        )
        if not feasible:
            assert rc == 0 and rec["outcome"] == "pending" and rec["chosen"] is None
            assert rec["closest"]["node"] and rec["unresolvable"]
            continue
        ext, _ = build_file_extender(path, params)
        with ServerThread(create_app(ext)) as srv:
            returned = {
                h["Host"]: h["Score"]
                for h in httpx.post(
                    srv.url + "/scheduler/prioritize",
                    content=orjson.dumps({"Pod": pod, "NodeNames": feasible}),
                    timeout=30,
                ).json()
            }
        c = rec["chosen"]
        assert c["score"] == returned[c["node"]] == 10
        assert _sum(c["points"]) == pytest.approx(returned[c["node"]], abs=1e-9)
        for r in rec["runners_up"]:
            assert _sum(r["points"]) == pytest.approx(returned[r["node"]], abs=1e-9)
        assert rec["feasible"] == len(feasible)


def test_explain_matches_score_positions_on_every_node() -> None:
    """Every candidate's parts (not only the ones shown) rebuild score_positions."""
    params = load_params(None)
    nodes, pods, extra = load_cluster(str(demo_cluster_path()))
    snap = build_snapshot(nodes, pods, params, extra)
    pos = np.arange(len(snap.nodes), dtype=np.int64)
    for _, pod in whole_gpu_pods():
        req = request_from_pod(pod, params.fabric)
        want = score_positions(snap, req, pos, params)
        exp = explain(snap, req, pos, params, "prioritize", runners_up=len(pos))
        shown = ([exp["chosen"]] if exp["chosen"] else []) + exp["runners_up"]
        for row in shown:
            assert _sum(row["points"]) == pytest.approx(want[snap.index[row["node"]]], abs=1e-9)
        assert len(shown) == int((want > 0).sum()) or exp["chosen"] is None
        # Deterministic, and the same snapshot gives the same answer twice.
        assert explain(snap, req, pos, params, "prioritize", runners_up=len(pos)) == exp


def test_bind_summary_is_the_explanations_summary() -> None:
    """The light path bind uses gives the same line as the full explanation, for the
    engine's choice and for another node, on every demo pod."""
    params = load_params(None)
    nodes, pods, extra = load_cluster(str(demo_cluster_path()))
    snap = build_snapshot(nodes, pods, params, extra)
    pos = np.arange(len(snap.nodes), dtype=np.int64)
    compared = 0
    for _, pod in whole_gpu_pods():
        req = request_from_pod(pod, params.fabric)
        for verb in ("filter", "prioritize"):
            exp = explain(snap, req, pos, params, verb)
            if exp["chosen"] is None:
                assert summarize(snap, req, pos, params, verb) == ""
                continue
            assert summarize(snap, req, pos, params, verb) == exp["summary"]
            # With the filter's own (codes, rank), as bind gets them from the record.
            codes = filter_codes(snap, req, pos, params)
            _, _, rank = narrow_with_rank(snap, req, pos, codes, params)
            basis = (codes, rank)
            if verb == "filter":
                assert summarize(snap, req, pos, params, verb, basis=basis) == exp["summary"]
            for other in exp["runners_up"]:
                full = explain(snap, req, pos, params, verb, chosen=other["node"])
                line = summarize(snap, req, pos, params, verb, chosen=other["node"])
                assert line == full["summary"] and "not the engine's choice" in line
                if verb == "filter":
                    reused = summarize(
                        snap, req, pos, params, verb, chosen=other["node"], basis=basis
                    )
                    assert reused == line
                compared += 1
    assert compared > 20


def test_tie_and_runner_up_reasons() -> None:
    params = load_params(None)
    nodes, pods, extra = load_cluster(str(demo_cluster_path()))
    snap = build_snapshot(nodes, pods, params, extra)
    pos = np.arange(len(snap.nodes), dtype=np.int64)
    four = dict(scripted_pods())["4 GPUs"]
    exp = explain(snap, request_from_pod(four, params.fabric), pos, params)
    # Every free, healthy GB200 tray gives 4 NVLinked GPUs as an exact fit: a tie, by name.
    assert exp["chosen"]["node"] == "gb200-r000-t01"
    assert exp["ties"]["count"] == 16 and exp["ties"]["broken_by"] == "lowest node name"
    assert "lost the tie-break by name" in exp["runners_up"][0]["why_lost"]
    assert exp["unresolvable"]["GPU fault condition"] == 1
    assert exp["examples"]["GPU fault condition"] == ["gb200-r000-t05"]
    one = dict(scripted_pods())["one GPU"]
    exp = explain(snap, request_from_pod(one, params.fabric), pos, params)
    assert exp["chosen"]["node"] == "dgx-h100-01" and exp["ties"]["count"] == 1
    assert exp["runners_up"][0]["why_lost"].startswith("lost on packing")
    assert exp["chosen"]["occupancy"]["used_before"] == [0, 1, 2, 3, 4, 5]


def test_bound_pod_annotation_carries_the_why() -> None:
    params = load_params(None)
    ext, _ = build_file_extender(None, params)
    names = list(ext.cache.snapshot().names)
    (pod,) = scripted_steps()[0].pods
    node = ext.filter({"Pod": pod, "NodeNames": names})["NodeNames"][0]
    m = pod["metadata"]
    assert ext.bind(
        {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
    ) == {"Error": ""}
    held = ext.cache.snapshot().pods[f"{m['namespace']}/{m['name']}"]
    raw = held.raw["metadata"]["annotations"][PLACEMENT_ANNOTATION]
    rec = json.loads(raw)
    assert rec["why"].startswith(f"{node} score 10 = topology")
    assert list(rec) == sorted(rec)  # still compact JSON with sorted keys
    parsed = placement_of(held.raw)  # readers ignore the extra key
    assert parsed is not None and parsed["node"] == node and list(parsed["gpus"]) == list(held.gpus)


def test_ring_is_bounded_in_records_and_bytes() -> None:
    params = load_params(None)
    nodes, pods, extra = load_cluster(str(demo_cluster_path()))
    snaps = [build_snapshot(nodes, pods, params, extra) for _ in range(3)]
    req = request_from_pod(scripted_pods()[0][1], params.fabric)
    pos = np.arange(len(snaps[0].nodes), dtype=np.int64)
    log = DecisionLog(lambda: params, max_records=4)
    for i in range(10):
        log.record("filter", snaps[i % 3], req, pos)
    st = log.stats()
    assert st["records"] == 4 and st["recorded"] == 10
    assert [r.seq for r in log.records(req.key)] == [10, 9, 8, 7]
    one = DecisionLog(lambda: params)
    one.record("filter", snaps[0], req, pos)
    per_snapshot = one.stats()["bytes"]
    one.record("filter", snaps[0], req, pos)  # the same snapshot is counted once
    assert one.stats()["bytes"] < 2 * per_snapshot
    tight = DecisionLog(lambda: params, max_records=5, max_bytes=2 * per_snapshot + 100)
    for s in snaps:
        tight.record("filter", s, req, pos)
    assert tight.stats()["records"] == 2 and tight.stats()["bytes"] <= 2 * per_snapshot + 100
    for _ in range(5):  # evicting every record frees every snapshot's bytes
        tight.record_info("bind", "a/b", "", {"node": "x"})
    assert tight.stats()["bytes"] == sum(r.size for r in tight.records(None, 100))


def test_inspect_decisions_api_errors_and_unknown_pod() -> None:
    ext, _ = build_file_extender(None, load_params(None))
    with ServerThread(create_app(ext)) as srv:
        bad = httpx.get(srv.url + "/v1/inspect/decisions", params={"pod": "nonamespace"})
        assert bad.status_code == 400 and "NAMESPACE/NAME" in bad.json()["error"]
        bad = httpx.get(srv.url + "/v1/inspect/decisions", params={"limit": 0})
        assert bad.status_code == 400
        none = httpx.get(srv.url + "/v1/inspect/decisions", params={"pod": "a/b"}).json()
        assert none["decisions"] == [] and none["ring"]["records"] == 0
        buf = io.StringIO()
        with redirect_stdout(buf):
            rc = main(["explain", "a/b", "--url", srv.url])
        assert rc == 1 and "no decision held" in buf.getvalue()


def share_pods() -> list[tuple[str, dict]]:
    from scheduler.core.fractional import is_share_pod

    return [(t, p) for t, p in scripted_pods() if is_share_pod(p)]


def test_parts_sum_to_prioritize_score_for_every_demo_share_pod(tmp_path: Path) -> None:
    """The demo's fractional pods, online (the record prioritize leaves) and offline
    (``explain --cluster``): the sharing policy's choice scores what prioritize returned,
    its parts sum to that score, and the runners-up are the next nodes by policy score."""
    params = load_params(None)
    ext, what = build_file_extender(None, params)
    assert share_pods()
    with (
        ServerThread(create_app(ext, description=what)) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as client,
    ):
        names = list(ext.cache.snapshot().names)
        for _, pod in share_pods():
            m = pod["metadata"]
            key = f"{m['namespace']}/{m['name']}"
            body = orjson.dumps({"Pod": pod, "NodeNames": names})
            returned = {
                h["Host"]: h["Score"]
                for h in client.post("/scheduler/prioritize", content=body).json()
            }
            rc, found = _cli(["explain", key, "--url", srv.url, "--json"])
            assert rc == 0
            rec = next(d for d in found["decisions"] if d["verb"] == "prioritize")
            assert rec["kind"] == "share" and rec["policy"] == params.sharing.policy
            c = rec["chosen"]
            assert returned[c["node"]] == c["score"] == max(returned.values())
            assert sum(c["points"].values()) == c["score"] == c["policy_score"] // 10
            for r in rec["runners_up"]:
                assert sum(r["points"].values()) == returned[r["node"]]
                assert (r["policy_score"], c["node"]) <= (c["policy_score"], r["node"]) or (
                    r["policy_score"] < c["policy_score"]
                )
            assert c["node"] in rec["summary"] and "sharing policy" in rec["summary"]
            # Offline, from a cluster file of the extender's state now, the pod pending.
            state = client.get("/v1/inspect/snapshot").json()
            state["items"].append({"kind": "Pod", "apiVersion": "v1", **pod})
            path = str(tmp_path / f"{m['name']}.yaml")
            Path(path).write_text(yaml.safe_dump(state))
            rc, off = _cli(["explain", key, "--cluster", path, "--json"])
            (orec,) = off["decisions"]
            assert rc == 0 and orec["kind"] == "share"
            assert orec["chosen"] == c and orec["runners_up"] == rec["runners_up"]
            schedule(client, pod, names)
