"""Bind's one-line why (``summarize``) and the placement record that carries it, pinned.

``summarize`` is the light path bind takes (vector operations over the candidates, scalar
arithmetic for the two rows the line shows); :func:`explain` is the full explanation the
inspect API and ``topoplace explain`` give. The line must be byte for byte
``explain(...)["summary"]``: exact lines are pinned for representative cases (they were
produced by the code before the light path was reworked), and the two paths are compared
over a synthetic fleet with degraded, cordoned and faulty nodes, every verb, with and
without the filter's own ranks, for the engine's choice and for other nodes.
"""

from __future__ import annotations

import random

import numpy as np
import orjson
import pytest

from benchmarks.clusters import synthetic_cluster
from scheduler.cli.demo import scripted_steps
from scheduler.cli.main import build_file_extender, load_params
from scheduler.core import explain as explain_mod
from scheduler.core.explain import explain, summarize
from scheduler.core.model import PLACEMENT_ANNOTATION
from scheduler.core.objects import PlanRecord, placement_value, request_from_pod
from scheduler.core.schedule import filter_codes, narrow_with_rank, topology_scale
from scheduler.core.snapshot import build_snapshot
from tests.builders import dgx_su, make_pod, nvl72_rack, snapshot_of

PINNED = [
    # (GPUs, node bound to (None: the engine's choice), the line)
    (
        1,
        None,
        "su0-n00 score 10 = topology 4.00 + health 2.00 + packing 2.00 + choice 2; runner-up "
        "r0-t01 (7): lost on packing: 0.67 points less (0.33 vs 0.50)",
    ),
    (
        1,
        "r0-t02",
        "r0-t02 score 7 = topology 4.00 + health 2.00 + packing 1.00; 2 tied, its scheduler "
        "(not the engine's choice) wins; runner-up su0-n00 (10): ranked above r0-t02 (1.00 "
        "points more packing); r0-t02 was bound instead; not the engine's choice",
    ),
    (
        2,
        "su0-n00",
        "su0-n00 score 8 = topology 2.00 + health 2.00 + packing 4.00; 3 tied, its scheduler "
        "(not the engine's choice) wins; runner-up r0-t01 (10): ranked above su0-n00 (2.00 "
        "points more topology); su0-n00 was bound instead; not the engine's choice",
    ),
    (
        4,
        None,
        "r0-t02 score 10 = topology 4.00 + health 2.00 + packing 4.00 - rounding 1.00 + choice "
        "1; 2 tied, lowest node name wins; runner-up r0-t03 (9): tied at rank 1.0000; lost the "
        "tie-break by name to r0-t02",
    ),
    (
        4,
        "r0-t03",
        "r0-t03 score 9 = topology 4.00 + health 2.00 + packing 4.00 - rounding 1.00; 2 tied, "
        "its scheduler (not the engine's choice) wins; runner-up r0-t02 (10): tied at rank "
        "1.0000 and first by name; r0-t03 was bound instead; not the engine's choice",
    ),
    (
        4,
        "r0-t00",
        "r0-t00 score 9 = topology 4.00 + health 1.40 + packing 4.00 - rounding 0.40; "
        "runner-up r0-t02 (10): ranked above r0-t00 (0.60 points more health); r0-t00 was "
        "bound instead; not the engine's choice",
    ),
    (
        8,
        None,
        "su0-n02 score 10 = topology 4.00 + health 2.00 + packing 4.00 - rounding 1.00 + choice "
        "1; runner-up su0-n01 (9): lost on health: 0.60 points less (0.70 vs 1.00)",
    ),
]


def small_fleet() -> tuple[object, object]:
    """Four GB200 trays (t00 degraded, t01 with a GPU held) and three DGX H100 (n00 with six
    GPUs held, n01 degraded), with the shipped policy."""
    params = load_params(None)
    nodes = nvl72_rack("r0", trays=4, degraded=[0], used={1: [0]}) + dgx_su(
        "su0", nodes=3, used={0: [0, 1, 2, 3, 4, 5]}, degraded=[1]
    )
    return snapshot_of(nodes, params=params), params


@pytest.mark.parametrize(("gpus", "chosen", "line"), PINNED)
def test_why_lines_pinned(gpus: int, chosen: str | None, line: str) -> None:
    snap, params = small_fleet()
    pos = np.arange(len(snap.nodes), dtype=np.int64)
    req = request_from_pod(make_pod(f"p{gpus}", gpus, namespace="t"), params.fabric)
    assert summarize(snap, req, pos, params, "filter", chosen=chosen) == line
    assert summarize(snap, req, pos, params, "prioritize", chosen=chosen) == line
    codes = filter_codes(snap, req, pos, params)
    _, _, rank = narrow_with_rank(snap, req, pos, codes, params)
    assert summarize(snap, req, pos, params, "filter", chosen, basis=(codes, rank)) == line
    assert explain(snap, req, pos, params, "filter", chosen)["summary"] == line


def test_bound_pod_annotation_pinned() -> None:
    """The whole placement record bind writes for the demo's first pod, byte for byte."""
    params = load_params(None)
    ext, _ = build_file_extender(None, params)
    (pod,) = scripted_steps()[0].pods
    node = ext.filter({"Pod": pod, "NodeNames": list(ext.cache.snapshot().names)})["NodeNames"][0]
    m = pod["metadata"]
    args = {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"]}
    assert ext.bind({**args, "Node": node}) == {"Error": ""}
    held = ext.cache.snapshot().pods[f"{m['namespace']}/{m['name']}"]
    assert held.raw["metadata"]["annotations"][PLACEMENT_ANNOTATION] == (
        '{"gpus":[6],"node":"dgx-h100-01","v":1,"why":"dgx-h100-01 score 10 = topology 4.00 '
        "+ health 2.00 + packing 2.00 + choice 2; runner-up gb200-r000-t01 (7): lost on "
        'packing: 1.00 points less (0.25 vs 0.50)"}'
    )


@pytest.mark.parametrize(
    "plan",
    [
        None,
        PlanRecord.of("plan-1"),
        PlanRecord.of(
            "plan-2",
            [("worker", "r0-t01", (0, 1, 2, 3)), ("worker", "r0-t02", (0, 1, 2, 3))],
            "pack",
            1764547200.1234567,
            300.0004,
        ),
    ],
)
def test_placement_value_writes_why_as_the_record_plus_the_key(plan: PlanRecord | None) -> None:
    """With ``why`` the record is the record without it plus the ``why`` key, in the same
    compact sorted JSON (what a loads / add / dumps round trip gave); without, unchanged."""
    why = "r0-t02 score 10 = topology 4.00 + health 2.00 + packing 4.00 - rounding 1.00 + choice 1"
    gang = "g1" if plan is not None else ""
    bare = placement_value("r0-t02", (3, 1), gang, plan)
    assert placement_value("r0-t02", (3, 1), gang, plan, "") == bare
    want = orjson.dumps({**orjson.loads(bare), "why": why}, option=orjson.OPT_SORT_KEYS)
    assert placement_value("r0-t02", (3, 1), gang, plan, why) == want.decode()
    if plan is None:
        assert bare == '{"gpus":[3,1],"node":"r0-t02","v":1}'
        assert placement_value("r0-t02", (3, 1), why="x") == (
            '{"gpus":[3,1],"node":"r0-t02","v":1,"why":"x"}'
        )


def synthetic_fleet() -> tuple[object, object]:
    """``synthetic_cluster(120)`` (GB200 trays, DGX H100, DGX-1 V100, 40 % half used) with
    degraded, doubly degraded, faulty and cordoned nodes."""
    params = load_params(None)
    items = synthetic_cluster(120)["items"]
    nodes = [o for o in items if o["kind"] == "Node"]
    for i, node in enumerate(nodes):
        conds = node["status"]["conditions"]
        if i % 7 == 3:
            conds.append({"type": "GpuThermalWatch", "status": "True", "reason": "hot"})
        if i % 11 == 5:
            conds.append({"type": "GpuPowerWatch", "status": "True", "reason": "power"})
        if i % 23 == 7:
            conds.append({"type": "GpuXidFatal", "status": "True", "reason": "xid"})
        if i % 19 == 11:
            node.setdefault("spec", {})["unschedulable"] = True
    pods = [o for o in items if o["kind"] == "Pod"]
    return build_snapshot(nodes, pods, params), params


def sweep(snap: object, params: object, sizes: tuple[int, ...]) -> list[tuple[str, str]]:
    """(summarize, explain's summary) for every request size, both verbs, with and without
    the filter's ranks, bound to the engine's choice, its runners-up, a low-ranked node,
    a node that cannot take the pod and an unknown node; over positions in a shuffled order
    with a repeated node."""
    rng = random.Random(7)
    out = []
    n = len(snap.nodes)  # type: ignore[attr-defined]
    order = list(range(n))
    rng.shuffle(order)
    for base in (np.arange(n, dtype=np.int64), np.array(order + order[:5] + [-1])):
        for k in sizes:
            for link in ("", "nvlink"):
                pod = make_pod(f"k{k}", k, namespace="t", annotations={})
                if link:
                    pod["metadata"]["annotations"]["topoplace.io/min-link"] = link
                req = request_from_pod(pod, params.fabric)  # type: ignore[attr-defined]
                codes = filter_codes(snap, req, base, params)
                _, _, rank = narrow_with_rank(snap, req, base, codes, params)
                for verb in ("filter", "prioritize"):
                    exp = explain(snap, req, base, params, verb, runners_up=len(base))
                    targets: list[str | None] = [None]
                    ranked = [r["node"] for r in exp["runners_up"]]
                    targets += ranked[:3] + ranked[-2:]
                    bad = np.flatnonzero(codes != 0)
                    if len(bad):
                        targets.append(snap.nodes[int(base[bad[0]])].name)  # type: ignore[attr-defined]
                    targets.append("no-such-node")
                    for t in targets:
                        want = explain(snap, req, base, params, verb, chosen=t)["summary"]
                        if want.startswith("pending"):
                            want = ""  # summarize: "" for a pod that would not be placed
                        got = summarize(snap, req, base, params, verb, chosen=t)
                        out.append((got, want))
                        if verb == "filter":
                            again = summarize(snap, req, base, params, verb, t, (codes, rank))
                            out.append((again, want))
    return out


def test_summarize_is_explains_summary_over_a_synthetic_fleet() -> None:
    snap, params = synthetic_fleet()
    pairs = sweep(snap, params, (1, 2, 3, 4, 8))
    assert len(pairs) > 300 and sum(bool(w) for _, w in pairs) > 250
    assert sum("not the engine's choice" in w for _, w in pairs) > 50
    assert sum("tied" in w for _, w in pairs) > 50
    bad = [(g, w) for g, w in pairs if g != w]
    assert not bad, bad[:3]


def test_topology_scale_memo_is_keyed_by_arrays_and_set_size() -> None:
    """The topology scale summarize memoizes differs between set sizes on one snapshot and
    between snapshots for one size; each line still equals explain's (a memo keyed on the
    arrays alone, or on the size alone, would give a stale scale and a different line:
    see the next test)."""
    snap, params = small_fleet()
    a = snap.arrays
    assert topology_scale(a, 2) != topology_scale(a, 8)
    # The same fleet with every GB200 tray busy: the best 2-GPU set is an H100's now.
    params2 = load_params(None)
    nodes = nvl72_rack("r0", trays=4, used={t: [0, 1, 2] for t in range(4)}) + dgx_su(
        "su0", nodes=3, used={0: [0, 1, 2, 3, 4, 5]}, degraded=[1]
    )
    busy = snapshot_of(nodes, params=params2)
    assert topology_scale(a, 2) != topology_scale(busy.arrays, 2)
    pos = np.arange(len(snap.nodes), dtype=np.int64)
    for s in (snap, busy, snap, busy):
        for k in (2, 8, 2, 4):
            req = request_from_pod(make_pod(f"k{k}", k, namespace="t"), params.fabric)
            want = explain(s, req, pos, params, "filter")["summary"]
            assert summarize(s, req, pos, params, "filter") == want


def test_a_broken_scale_memo_key_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deliberately broken memo (keyed by the arrays alone, the set size forgotten) makes
    the comparison of the previous tests fail: they can catch a stale scale."""
    memo: dict[int, object] = {}

    def broken_scale(a: object, k: int) -> object:
        if k < 2 or k > a.max_gpus:  # type: ignore[attr-defined]
            return None
        return memo.setdefault(id(a), topology_scale(a, k))

    monkeypatch.setattr(explain_mod, "_scale", broken_scale)
    snap, params = small_fleet()
    pos = np.arange(len(snap.nodes), dtype=np.int64)
    lines = []
    for k in (2, 8):
        req = request_from_pod(make_pod(f"k{k}", k, namespace="t"), params.fabric)
        want = explain(snap, req, pos, params, "filter")["summary"]
        lines.append(summarize(snap, req, pos, params, "filter") == want)
    assert lines == [True, False]
