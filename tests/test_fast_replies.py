"""The vectorized filter/prioritize path against per-node oracles and the general path.

``filter_codes`` and ``score_positions`` decide thousands of nodes with array operations,
and ``replies.NameTable`` serializes the answer from node positions. Each is checked here
against an independent per-node computation written from the node objects (not from the
arrays), on the demo cluster (unhealthy, cordoned, NotReady and degraded nodes) and on a
synthetic mixed fleet, with random requests and random candidate lists (shuffled, partial,
with unknown names).
"""

from __future__ import annotations

import copy
import itertools
import math
import random

import numpy as np
import orjson
import pytest

from benchmarks.clusters import demo_cluster, make_pod, synthetic_cluster
from scheduler.core.linkclass import class_rank, feasible_sizes
from scheduler.core.model import Health, PodInfo
from scheduler.core.objects import request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.schedule import (
    CODE_CORDONED,
    CODE_LINK_NEVER,
    CODE_LINK_NOW,
    CODE_NO_GPUS,
    CODE_NODE_SELECTOR,
    CODE_NOT_ENOUGH_FREE,
    CODE_TOO_FEW_HEALTHY,
    CODE_UNHEALTHY,
    CODE_UNKNOWN,
    FEASIBLE,
    MAX_SCORE,
    filter_codes,
    filter_nodes,
    name_positions,
    score_positions,
)
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.runtime.cache import ClusterCache
from scheduler.server import name_index, wire
from scheduler.server.extender import Extender
from scheduler.server.replies import NameTable
from topology.select import best_bottlenecks

LINKS = ("", "", "nvlink", "pxb", "sys")


def _cache(cluster: dict) -> ClusterCache:
    nodes = [o for o in cluster["items"] if o["kind"] == "Node"]
    pods = [o for o in cluster["items"] if o["kind"] == "Pod"]
    return ClusterCache.from_objects(nodes, pods, SchedParams())


@pytest.fixture(scope="module", params=["demo", "synthetic"])
def cache(request: pytest.FixtureRequest) -> ClusterCache:
    if request.param == "demo":
        return _cache(demo_cluster())
    return _cache(synthetic_cluster(300, seed=5))


def _links_ok(shape, mask: int, k: int, link: str) -> bool:
    return bool((feasible_sizes(shape, mask)[class_rank(link)] >> k) & 1)


def oracle_code(snap: ClusterSnapshot, name: str, req) -> int:
    """The filter verdict of one node, in precedence order, from the node object."""
    node = snap.node(name)
    k = req.gpus
    if node is None:
        return CODE_UNKNOWN
    if node.health.state >= Health.UNHEALTHY:
        return CODE_UNHEALTHY
    if node.health.unschedulable:
        return CODE_CORDONED
    if node.gpu_capacity == 0:
        return CODE_NO_GPUS
    if node.usable_mask.bit_count() < k:
        return CODE_TOO_FEW_HEALTHY
    big = k > snap.arrays.max_gpus
    if req.min_link and not big and not _links_ok(node.shape, node.usable_mask, k, req.min_link):
        return CODE_LINK_NEVER
    if node.free_mask.bit_count() < k:
        return CODE_NOT_ENOUGH_FREE
    if req.min_link and not big and not _links_ok(node.shape, node.free_mask, k, req.min_link):
        return CODE_LINK_NOW
    if any(node.labels.get(key) != v for key, v in req.node_selector.items()):
        return CODE_NODE_SELECTOR
    return FEASIBLE


def oracle_scores(snap: ClusterSnapshot, names: list[str], req, params: SchedParams) -> list[int]:
    """Scores per node from the node objects: the documented formula, one node at a time.

    Topology is relative to the best set any schedulable node of the snapshot could give
    (not only the candidates); the engine's choice (highest value, ties by lowest name)
    alone scores 10, the others floor(10 * value) capped at 9."""
    k = req.gpus
    width = snap.arrays.max_gpus

    def usable(node) -> bool:
        return (
            node is not None
            and node.health.state < Health.UNHEALTHY
            and not node.health.unschedulable
            and node.free_mask.bit_count() >= k
        )

    def bottleneck(node) -> float:
        table = best_bottlenecks(node.shape, node.free_mask, params.selection_policy)
        return table[k] if k < len(table) else 0.0

    top = 0.0
    if 2 <= k <= width:
        top = max((bottleneck(n) for n in snap.nodes if usable(n) and n.gpu_capacity), default=0.0)
    w = params.weights
    total = w.topology + w.health + w.packing
    raw: dict[int, float] = {}
    for i, name in enumerate(names):
        node = snap.node(name)
        if not usable(node) or (
            req.min_link
            and k <= width
            and not _links_ok(node.shape, node.free_mask, k, req.min_link)
        ):
            continue
        topo = bottleneck(node) / top if (2 <= k <= width and top > 0) else 1.0
        health = 1.0 - node.health.risk
        packing = k / node.free_mask.bit_count()
        raw[i] = (w.topology * topo + w.health * health + w.packing * packing) / total
    out = [0] * len(names)
    for i, r in raw.items():
        out[i] = min(MAX_SCORE - 1, max(0, math.floor(r * MAX_SCORE + 1e-9)))
    if raw:
        best = max(raw.values())
        out[min((i for i, r in raw.items() if r == best), key=lambda i: names[i])] = MAX_SCORE
    return out


def _requests(rng: random.Random, labels: list[dict]) -> list:
    reqs = []
    for i in range(40):
        ann = {}
        link = rng.choice(LINKS)
        if link:
            ann["topoplace.io/min-link"] = link
        selector = None
        if i % 7 == 0 and labels:
            key, value = rng.choice(sorted(rng.choice(labels).items()))
            selector = {key: value}
        pod = make_pod(
            f"p{i}", rng.choice([1, 1, 2, 3, 4, 6, 8, 9]), annotations=ann, node_selector=selector
        )
        reqs.append((pod, request_from_pod(pod, SchedParams().fabric)))
    return reqs


def _candidates(rng: random.Random, names: list[str], unknown: bool) -> list[str]:
    picked = rng.sample(names, rng.randint(1, len(names)))
    if unknown:
        picked.insert(rng.randrange(len(picked) + 1), f"ghost-{rng.randint(0, 9)}")
    return picked


def test_filter_codes_and_scores_match_per_node_oracles(cache: ClusterCache) -> None:
    rng = random.Random(11)
    snap = cache.snapshot()
    names = list(snap.names)
    labels = [n.labels for n in snap.nodes if n.labels]
    seen_codes: set[int] = set()
    for _pod, req in _requests(rng, labels):
        for trial in range(3):
            cand = _candidates(rng, names, unknown=trial == 2)
            pos = name_positions(snap, cand)
            codes = filter_codes(snap, req, pos, cache.params).tolist()
            assert codes == [oracle_code(snap, n, req) for n in cand]
            seen_codes.update(codes)
            scores = score_positions(snap, req, pos, cache.params).tolist()
            assert scores == oracle_scores(snap, cand, req, cache.params)
    # The random requests exercised the verdicts this cluster can produce.
    assert {FEASIBLE, CODE_UNKNOWN, CODE_NOT_ENOUGH_FREE} <= seen_codes
    if any(n.health.state >= Health.UNHEALTHY for n in snap.nodes):
        assert {CODE_UNHEALTHY, CODE_CORDONED, CODE_TOO_FEW_HEALTHY} <= seen_codes


def test_fast_replies_equal_the_general_path(cache: ClusterCache) -> None:
    """filter_json / prioritize_json (positions -> bytes) mean exactly what filter /
    prioritize (dict per node, orjson) say, for every request and candidate list."""
    ext = Extender(cache)
    rng = random.Random(23)
    snap = cache.snapshot()
    names = list(snap.names)
    labels = [n.labels for n in snap.nodes if n.labels]
    for pod, _req in _requests(rng, labels):
        pod = {k: v for k, v in pod.items() if k not in ("kind", "apiVersion")}
        for trial in range(2):
            args = {"Pod": pod, "Nodes": None, "NodeNames": _candidates(rng, names, trial == 1)}
            assert orjson.loads(ext.filter_json(args)) == ext.filter(args)
            assert orjson.loads(ext.prioritize_json(args)) == ext.prioritize(args)


@pytest.mark.parametrize(
    "names",
    [
        ["a"],
        ["node-1", "node-22", "node-333"],
        ['we"ird\\name', "tab\there", "ünïcode-ноду", "emoji-🚀", "x" * 40],
    ],
)
def test_name_table_serializes_like_orjson(names: list[str]) -> None:
    table = NameTable(names)
    rng = np.random.default_rng(3)
    for _ in range(10):
        pos = rng.integers(0, len(names), rng.integers(0, 2 * len(names) + 1))
        picked = [names[i] for i in pos]
        assert orjson.loads(table.array(pos)) == picked
        scores = rng.integers(0, MAX_SCORE + 1, len(pos))
        assert orjson.loads(table.host_priorities(pos, scores)) == [
            {"Host": n, "Score": int(s)} for n, s in zip(picked, scores, strict=True)
        ]
        members = table.entries(pos, orjson.dumps("why: 5%"))
        if len(pos):
            assert orjson.loads(b"{" + members[1:] + b"}") == dict.fromkeys(picked, "why: 5%")


def test_name_table_refuses_wasteful_padding() -> None:
    """One very long name among short ones would pad every record: refused, and the
    extender falls back to per-node serialization with the same answer."""
    names = [f"n{i}" for i in range(2000)] + ["x" * 250]
    with pytest.raises(ValueError):
        NameTable(names)
    NameTable([f"node-{i:05d}" for i in range(2000)] + ["node-99999-a"])  # near-uniform: fine


def _body(pod_name: str, names: list[str]) -> bytes:
    pod = make_pod(pod_name, 4)
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


def test_names_memo_recognises_a_list_by_its_bytes() -> None:
    memo = wire.NamesMemo()
    names = [f"node-{i}" for i in range(50)]
    first = _body("a", names)
    _, got, _ = wire.extender_args(orjson.loads(first), first, memo)
    assert got == names
    # Another pod, same candidates: the list remembered from the first body comes back.
    second = _body("b", list(names))
    _, again, _ = wire.extender_args(orjson.loads(second), second, memo)
    assert again is got
    # One name different (same length): not recognised.
    for changed in ([*names[:-1], "node-x"], [*names[:10], "node-1x", *names[11:]]):
        other = _body("c", changed)
        _, fresh, _ = wire.extender_args(orjson.loads(other), other, memo)
        assert fresh == changed and fresh is not got


@pytest.mark.parametrize(
    "body",
    [
        # duplicate top-level keys: the last one wins, as orjson decides
        b'{"Pod":{},"NodeNames":["x"],"NodeNames":["a","b"]}',
        b'{"NodeNames":["x"],"Pod":{},"NodeNames":["a","b"]}',
        b'{"Pod":{},"nodenames":["x"],"NodeNames":["a","b"]}',
        b'{"Pod":{},"NodeNames":["a","b"],"nodenames":["x"]}',
        # a key named NodeNames inside the pod, spaces around the colon, trailing space
        b'{"Pod":{"NodeNames":["a","b"]},"NodeNames":["z"]}',
        b'{"Pod":{"NodeNames":["q"]},"NodeNames" : ["a","b"]}',
        b'{"Pod":{},"NodeNames":["a","b"]} ',
        b'{"NodeNames":["a","b"],"Pod":{"NodeNames":["a","b"]}}',
        b'{"Pod":{},"Nodes":null,"NodeNames":["a","b"]}',
        b'{"NodeNames":["zzz"],"Pod":{"x":{"NodeNames":["q"]}}}',
    ],
)
def test_names_memo_never_changes_what_the_body_says(body: bytes) -> None:
    """Whatever was remembered before, the names returned are the body's own."""
    memo = wire.NamesMemo()
    primers = [
        b'{"Pod":{},"NodeNames":["a","b"]}',
        b'{"Pod":{},"NodeNames":["z"]}',
        b'{"Pod":{"k":1},"NodeNames" : ["a","b"]}',
        b'{"Pod":{},"NodeNames":["a","b"]} ',
        # top-level names first, a nested NodeNames last: the tail says nothing about them
        b'{"NodeNames":["a"],"Pod":{"x":{"NodeNames":["q"]}}}',
    ]
    for primer in primers:
        wire.extender_args(orjson.loads(primer), primer, memo)
    obj = orjson.loads(body)
    assert wire.extender_args(obj, body, memo)[1] == wire.extender_args(obj)[1]
    assert wire.extender_args(obj, body, memo)[1] == wire.extender_args(obj)[1]  # remembered


def test_names_memo_still_rejects_non_strings() -> None:
    memo = wire.NamesMemo()
    good = b'{"Pod":{},"NodeNames":["a",1]}'
    for _ in range(2):
        with pytest.raises(wire.WireError):
            wire.extender_args(orjson.loads(good), good, memo)


# ---- NodeNames read from the request bytes ----------------------------------------------


def _variants(rng: random.Random, names: list[str]) -> list[list[str]]:
    """Candidate lists kube-scheduler may send: the whole cluster shuffled (its parallel
    filter's order), a shuffled subset, duplicates, unknown names, a single name."""
    whole = list(names)
    rng.shuffle(whole)
    dup = rng.sample(names, min(len(names), 20))
    dup += rng.sample(dup, len(dup) // 2)
    rng.shuffle(dup)
    ghost = rng.sample(names, min(len(names), 30))
    for g in ("ghost-1", "g", "ghost-name-longer-than-any-known-node-name-here", names[0] + "x"):
        ghost.insert(rng.randrange(len(ghost) + 1), g)
    return [whole, rng.sample(names, len(names) // 3 or 1), dup, ghost, [names[-1]]]


def test_byte_path_replies_equal_the_general_path(cache: ClusterCache) -> None:
    """Bodies read from their bytes (``wire.RawBody``, as the HTTP edge hands them over)
    answer exactly what parsed bodies do through the per-node path: shuffled, partial,
    duplicated and unknown names, each list sent twice (the second time it is recognised
    by its bytes)."""
    ext = Extender(cache)
    ref = Extender(cache)
    rng = random.Random(31)
    snap = cache.snapshot()
    labels = [n.labels for n in snap.nodes if n.labels]
    for pod, _req in _requests(rng, labels)[:12]:
        pod = {k: v for k, v in pod.items() if k not in ("kind", "apiVersion")}
        for cand in _variants(rng, list(snap.names)):
            body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": cand})
            for _ in range(2):
                want = ref.filter(orjson.loads(body))
                assert orjson.loads(ext.filter_json(wire.RawBody(body), body)) == want
                want = ref.prioritize(orjson.loads(body))
                assert orjson.loads(ext.prioritize_json(wire.RawBody(body), body)) == want


@pytest.mark.parametrize(
    "names",
    [
        ["a", "bb", "n-7", "node-001", "node-0001", "node-00001", "x" * 16, "y" * 17],
        ["ünïcode-ноду", "emoji-🚀", "plain-1", "plain-2", "a:b", "[x]", "{y}"],
        ['we"ird', "back\\slash", "com,ma", "tab\there", "fine-1", "fine-2"],
        ["x" * 60, "s", "t"],  # 64-byte words: bodies shorter than one record
        ["x" * 70, "short"],  # too long for the byte index: names are hashed instead
    ],
)
def test_candidate_names_find_the_positions_a_dict_lookup_finds(names: list[str]) -> None:
    """Positions from the bytes equal ``index.get(name, -1)`` for every list, whatever
    the names' lengths or characters; lists the bytes cannot be read from (escapes,
    commas) or an index they cannot hold (very long names) take the dict lookup."""
    index = {n: i for i, n in enumerate(names)}
    rng = random.Random(7)
    memo = wire.NamesMemo()
    for trial in range(30):
        cand = [rng.choice(names) for _ in range(rng.randint(1, 3 * len(names)))]
        if trial % 3 == 0:
            cand.insert(rng.randrange(len(cand) + 1), f"ghost-{trial}")
        body = orjson.dumps({"Pod": {}, "NodeNames": cand})
        for obj in (orjson.loads(body), wire.RawBody(body)):
            _, got, _ = wire.extender_args(obj, body, memo)
            assert got == cand
            found = getattr(got, "positions_in", lambda _: None)(index)
            if found is not None:
                pos, known = found
                assert pos.tolist() == [index.get(n, -1) for n in cand]
                assert known == all(n in index for n in cand)


# Bodies whose NodeNames the bytes could misread: duplicate keys (orjson keeps the last),
# other casings, a NodeNames key inside the pod, spacing, escapes, wrong types, bad JSON.
TRICKY_BODIES = [
    b'{"Pod":{},"NodeNames":["a","b"]}',
    b'{"Pod":{},"NodeNames":["a","b"]} \n',
    b'{"Pod":{} , "NodeNames":["a","b"]}',
    b'{"Pod":{},"NodeNames" : ["a","b"]}',
    b'{"Pod":{},"NodeNames":[ "a","b"]}',
    b'{"Pod":{},"NodeNames":["a", "b"]}',
    b'{"NodeNames":["a","b"]}',
    b'{"NodeNames":["a"],"Pod":{}}',
    b'{"Pod":{},"NodeNames":["x"],"NodeNames":["a","b"]}',
    b'{"Pod":{},"NodeNames":["q"],"nodenames":["x"],"NodeNames":["a","b"]}',
    b'{"Pod":{},"nodenames":["x"],"NodeNames":["a","b"]}',
    b'{"Pod":{},"NodeNames":["a","b"],"nodenames":["x"]}',
    b'{"Pod":{"NodeNames":["a","b"]},"NodeNames":["z"]}',
    b'{"Pod":{"x":{"NodeNames":["a","b"]}}}',
    b'{"Pod":{"NodeNames":["q"]},"NodeNames" : ["a","b"]}',
    b'{"NodeNames":["zzz"],"Pod":{"x":{"NodeNames":["a","b"]}}}',
    b'{"Pod":{},"NodeNames":["a"],"X":["b"]}',
    b'{"Pod":{},"Nodes":null,"NodeNames":["a","b"]}',
    b'{"Pod":{},"Nodes":{"items":[{"metadata":{"name":"n1"}}]},"NodeNames":["a","b"]}',
    b'{"Pod":{},"NodeNames":["a\\"b","c"]}',
    b'{"Pod":{},"NodeNames":["a\\u0062","b"]}',
    b'{"Pod":{},"NodeNames":["a,b","c"]}',
    b'{"Pod":{},"NodeNames":[","]}',
    b'{"Pod":{},"NodeNames":["",""]}',
    b'{"Pod":{},"NodeNames":[]}',
    b'{"Pod":{},"NodeNames":null}',
    b'{"Pod":{},"NodeNames":["a",1]}',
    b'{"Pod":{},"NodeNames":"ab"}',
    b'{"Pod":{},"NodeNames":["\xc3\xbc","b"]}',
    # not JSON: the byte path must refuse them exactly as the parser does
    b'{"Pod":{},"NodeNames":["a","b"]',
    b'{"Pod":{,"NodeNames":["a","b"]}',
    b'{"Pod":{}"NodeNames":["a","b"]}',
    b'{"Pod":{},"NodeNames":["a\x01","b"]}',
    b'{"Pod":{},"NodeNames":["\xff","b"]}',
    b'{"Pod":{},"NodeNames":[""","]}',
    b'["Pod",{},"NodeNames",["a","b"]]',
    b"",
]


def _args_or_error(obj, body: bytes | None = None, memo=None):
    try:
        return wire.extender_args(obj, body, memo)
    except wire.WireError as exc:
        return str(exc)


def _parsed_or_error(body: bytes):
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return f"malformed JSON: {exc}"  # what the HTTP edge answers
    return _args_or_error(obj)


@pytest.mark.parametrize("body", TRICKY_BODIES)
def test_reading_names_from_bytes_never_changes_what_the_body_says(body: bytes) -> None:
    """Whatever was remembered or indexed before, a body read from its bytes (or parsed,
    then recognised by its bytes) gives the arguments, or the error, that parsing the
    whole body gives."""
    memo = wire.NamesMemo()
    primers = [
        b'{"Pod":{},"NodeNames":["a","b"]}',
        b'{"Pod":{},"NodeNames":["z"]}',
        b'{"Pod":{"k":1},"NodeNames" : ["a","b"]}',
        b'{"Pod":{},"NodeNames":["a","b"]} ',
        b'{"NodeNames":["a"],"Pod":{"x":{"NodeNames":["q"]}}}',
    ]
    for primer in primers:
        _, names, _ = wire.extender_args(wire.RawBody(primer), primer, memo)
        getattr(names, "positions_in", lambda _: None)({"a": 0, "b": 1, "z": 2, "c": 3})
    want = _parsed_or_error(body)
    for _ in range(2):  # the second time, the list may be recalled
        assert _args_or_error(wire.RawBody(body), body, memo) == want
        if not isinstance(want, str) or not want.startswith("malformed"):
            assert _args_or_error(orjson.loads(body), body, memo) == want


def test_scan_accepts_only_what_json_parses_the_same() -> None:
    """Every array the byte scan accepts is JSON whose strings are exactly the bytes it
    found between the quotes (all short arrays over a JSON-ish alphabet, then random
    longer ones)."""
    alphabet = [b'"', b",", b"a", b"b", b"[", b"]", b" ", b":", b"{", b"}"]
    rng = random.Random(5)
    inners = [b"".join(c) for n in range(6) for c in itertools.product(alphabet, repeat=n)]
    inners += [b"".join(rng.choices(alphabet, k=rng.randint(6, 20))) for _ in range(20000)]
    accepted = 0
    for inner in inners:
        array = b'["' + inner + b'"]'
        raw = bytes(8) + array + b"}"
        found = name_index.scan(raw, 8, 8 + len(array))
        if found is None:
            continue
        accepted += 1
        starts, ends = found
        got = [raw[s:e].decode() for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
        assert orjson.loads(array) == got, array
    assert accepted > 1000


def test_candidate_names_are_read_only_and_copy_as_lists() -> None:
    body = b'{"Pod":{},"NodeNames":["a","b","c"]}'
    _, names, _ = wire.extender_args(wire.RawBody(body), body, wire.NamesMemo())
    assert isinstance(names, wire.CandidateNames) and names == ["a", "b", "c"]
    for change in (
        lambda: names.append("d"),
        lambda: names.__setitem__(0, "x"),
        lambda: names.sort(),
        lambda: names.__delitem__(0),
    ):
        with pytest.raises(TypeError):
            change()
    assert type(copy.copy(names)) is list and list(names) == ["a", "b", "c"]


def test_name_index_finds_every_name_in_either_slot() -> None:
    """Thousands of names fill the cuckoo table's second slots too; every name is still
    found, and names one byte or one length away from a known name are not."""
    names = [f"gb200-r{r:03d}-t{t:02d}" for r in range(300) for t in range(18)]
    index = {n: i for i, n in enumerate(names)}
    table = name_index.NameIndex(index)
    near = ["gb200-r000-t0", "gb200-r000-t000", "gb200-r000-t0x", "hb200-r000-t00", "g"]
    cand = names[::-1] + near
    raw = orjson.dumps({"NodeNames": cand})
    starts, ends = name_index.scan(raw, len(b'{"NodeNames":'), len(raw) - 1)
    pos, known = table.resolve(raw, starts, ends)
    assert not known
    assert pos.tolist() == [index.get(n, -1) for n in cand]
    words = name_index._words(raw, starts, ends - starts, table.width)
    first, _ = table._slots(table._hash(words, ends - starts))
    in_first = table.slots.take(first[: len(names)])["pos"] == pos[: len(names)]
    assert in_first.any() and not in_first.all()
    # The common case trusts each slot's stored hash to say which of the two slots to
    # read, then checks the name there. With every stored hash wrong (as for a 64-bit
    # hash shared by two names), each name in its first slot fails that check and is
    # found by the exact lookup of both slots; no position changes.
    whole = orjson.dumps({"NodeNames": names})
    s2, e2 = name_index.scan(whole, len(b'{"NodeNames":'), len(whole) - 1)
    for wrong in (np.zeros_like(table.slot_hash), ~table.slot_hash):
        table.slot_hash = wrong
        again, known = table.resolve(raw, starts, ends)
        assert again.tolist() == pos.tolist() and not known
        again, known = table.resolve(whole, s2, e2)
        assert again.tolist() == list(range(len(names))) and known


def test_raw_body_reads_as_the_parsed_body() -> None:
    """Any reader other than ``extender_args`` sees a ``RawBody`` as the parsed body."""
    body = wire.RawBody(b'{"Pod":{"a":1},"NodeNames":["x"]}')
    assert dict(body) == {"Pod": {"a": 1}, "NodeNames": ["x"]}
    assert body["Pod"] == {"a": 1} and len(body) == 2 and next(reversed(body)) == "NodeNames"
    with pytest.raises(wire.WireError, match="malformed JSON"):
        len(wire.RawBody(b"{not json"))
    with pytest.raises(wire.WireError, match="JSON object"):
        wire.RawBody(b"[1]")["Pod"]


def test_deferred_names_answer_like_the_list(cache: ClusterCache) -> None:
    """With ``defer_names``, a body whose names the memo's index all knows gives them as
    ``DeferredNames``: positions equal the dict lookup's, ``names_list`` is the body's
    list, a recalled list stays deferred only for a deferring caller, and the core's
    per-name paths read it exactly like the list."""
    snap = cache.snapshot()
    names = list(snap.names)
    memo = wire.NamesMemo()
    first = orjson.dumps({"Pod": {}, "NodeNames": names})
    _, got, _ = wire.extender_args(wire.RawBody(first), first, memo, defer_names=True)
    assert isinstance(got, list)  # the memo has no index yet
    name_positions(snap, got)  # now it has
    rng = random.Random(3)
    labels = [n.labels for n in snap.nodes if n.labels]
    reqs = [req for _pod, req in _requests(rng, labels)]
    for k, cand in enumerate(_variants(rng, names)):
        body = orjson.dumps({"Pod": {}, "NodeNames": cand})
        _, got, _ = wire.extender_args(wire.RawBody(body), body, memo, defer_names=True)
        assert isinstance(got, wire.DeferredNames) == all(n in snap.index for n in cand)
        assert name_positions(snap, got).tolist() == [snap.index.get(n, -1) for n in cand]
        assert len(got) == len(cand) and list(got) == cand and wire.names_list(got) == cand
        req = reqs[k]
        assert filter_nodes(snap, req, got, cache.params) == filter_nodes(
            snap, req, cand, cache.params
        )
        _, again, _ = wire.extender_args(wire.RawBody(body), body, memo, defer_names=True)
        assert again is got
        _, listed, _ = wire.extender_args(wire.RawBody(body), body, memo)
        assert isinstance(listed, list) and listed == cand


def test_verdicts_read_from_every_node_equal_those_computed_by_position(
    cache: ClusterCache,
) -> None:
    """A request naming at least half the nodes reads codes and ranks computed once for
    every node of the arrays version; they are bit for bit those computed at the
    positions alone (shuffled, duplicated and unknown names), and a new arrays version
    (a pod placed) is never answered from the old one."""
    from scheduler.core import schedule
    from scheduler.core.model import PodInfo
    from scheduler.core.schedule import _codes_at, _rank_at, rank_positions
    from scheduler.core.snapshot import with_pod

    rng = random.Random(41)
    snap = cache.snapshot()
    names = list(snap.names)
    params = cache.params
    for step in range(3):
        for _pod, req in _requests(rng, [])[:12]:
            whole = rng.sample(names, len(names)) + rng.sample(names, 3) + ["ghost-9"]
            pos = name_positions(snap, whole)
            p = np.where(pos < 0, 0, pos)
            schedule._CODES_MEMO.clear()
            schedule._RANK_MEMO.clear()
            for _ in range(2):  # computed for every node, then read from the memo
                codes = filter_codes(snap, req, pos, params)
                rank = rank_positions(snap, req, pos, params)
                if req.gpus > 0:
                    want = _codes_at(snap.arrays, req.gpus, req.min_link, p)
                    want[pos < 0] = CODE_UNKNOWN
                    assert codes.tobytes() == want.tobytes()
                    want_rank = _rank_at(snap.arrays, req.gpus, req.min_link, params.weights, p)
                    want_rank[pos < 0] = -1.0
                    assert rank.tobytes() == want_rank.tobytes()
                assert codes.flags.writeable and rank.flags.writeable  # callers own them
            if req.gpus > 0:
                assert any(e[0][0] is snap.arrays for e in schedule._RANK_MEMO)
        node = next(
            n
            for n in snap.nodes
            if n.free_mask and not n.health.unschedulable and n.health.state < Health.UNHEALTHY
        )
        req = request_from_pod(make_pod("all", node.free_mask.bit_count()), SchedParams().fabric)
        pos = name_positions(snap, names)
        assert filter_codes(snap, req, pos, params)[snap.index[node.name]] == FEASIBLE
        gpu = (node.free_mask & -node.free_mask).bit_length() - 1
        snap = with_pod(snap, PodInfo(f"t/x{step}", "", node.name, (gpu,), assumed=True))
        codes = filter_codes(snap, req, pos, params)  # the node is now one GPU short
        assert codes[snap.index[node.name]] == CODE_NOT_ENOUGH_FREE
        assert codes.tolist() == [oracle_code(snap, n, req) for n in names]


def test_a_pod_read_again_is_the_same_request_and_no_other(cache: ClusterCache) -> None:
    """The request of a pod whose bytes equal the last one's is reused; another pod,
    another pod with the same names, or a body parsed elsewhere never gets it."""
    ext = Extender(cache)
    ref = Extender(cache)
    names = list(cache.snapshot().names)
    pods = []
    for i, gpus in enumerate((4, 1, 4)):
        pod = make_pod("same-name", gpus, annotations={"n": str(i)} if i == 2 else None)
        pods.append({k: v for k, v in pod.items() if k not in ("kind", "apiVersion")})
    seen = set()
    for pod in (pods[0], pods[0], pods[1], pods[0], pods[2], pods[1]):
        body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
        for verb in ("prioritize", "filter"):
            want = getattr(ref, verb)(orjson.loads(body))
            got = getattr(ext, f"{verb}_json")(wire.RawBody(body), body)
            assert orjson.loads(got) == want
            seen.add(got)
        # a parsed body (no bytes) between two byte-read ones: read on its own
        other = {"Pod": pods[1], "Nodes": None, "NodeNames": names}
        assert orjson.loads(ext.prioritize_json(other)) == ref.prioritize(other)
    assert len(seen) >= 4  # the pods' answers differ: a reused request would show


def test_a_valid_request_reads_cpu_and_memory_as_the_lenient_reader() -> None:
    """filter nominates a pod with the CPU and memory of its request (read strictly);
    for every pod the strict reader accepts they equal what the lenient reader of bound
    pods reads: containers summed, init containers as a floor, limits for unset requests."""
    from scheduler.core.objects import pod_resource
    from scheduler.core.quantity import cpu_milli, quantity_int
    from tests.helpers import fixture

    base = fixture("filter_args_nodenames.json")["Pod"]
    variants = [base]
    for cpu, mem, init, limit_only in itertools.product(
        ("500m", "48", "1.5", None), ("512Gi", "1e3", "100M", None), (None, "64"), (False, True)
    ):
        pod = copy.deepcopy(base)
        c = pod["spec"]["containers"][0]
        res = {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v is not None}
        c["resources"] = {"limits": dict(res)} if limit_only else {"requests": dict(res)}
        pod["spec"]["containers"].append({"name": "side", "resources": {"requests": {"cpu": "1"}}})
        if init:
            pod["spec"]["initContainers"] = [
                {"name": "init", "resources": {"requests": {"cpu": init, "memory": "1Ti"}}}
            ]
        variants.append(pod)
    for pod in variants:
        req = request_from_pod(pod, SchedParams().fabric)
        assert req.cpu_milli == pod_resource(pod, "cpu", cpu_milli)
        assert req.memory_bytes == pod_resource(pod, "memory", quantity_int)


def test_per_node_values_brought_up_to_date_equal_a_fresh_computation(
    cache: ClusterCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Codes and ranks memoized for one arrays version are brought up to date for the
    arrays a few placements later by recomputing the changed rows only (or in full when
    the topology scale moved); bit for bit they equal a computation from scratch."""
    from scheduler.core import schedule
    from scheduler.core.schedule import _codes_at, _rank_at, rank_positions
    from scheduler.core.snapshot import with_pod, without_pod

    derived = []
    ancestor = schedule._ancestor
    monkeypatch.setattr(
        schedule, "_ancestor", lambda *a: derived.append(ancestor(*a)) or derived[-1]
    )
    rng = random.Random(7)
    snap = cache.snapshot()
    names = list(snap.names)
    params = cache.params
    shapes = [
        request_from_pod(make_pod(f"s{k}{link}", k, annotations=ann), SchedParams().fabric)
        for k, link, ann in ((1, "", None), (4, "", None), (2, "nvlink", None))
        for ann in [{"topoplace.io/min-link": link} if link else None]
    ]
    placed: list[str] = []
    for step in range(30):
        pos = name_positions(snap, rng.sample(names, len(names)))
        for req in shapes:
            codes = filter_codes(snap, req, pos, params)
            want = _codes_at(snap.arrays, req.gpus, req.min_link, pos)
            assert codes.tobytes() == want.tobytes()
            rank = rank_positions(snap, req, pos, params)
            want = _rank_at(snap.arrays, req.gpus, req.min_link, params.weights, pos)
            assert rank.tobytes() == want.tobytes()
        if placed and rng.random() < 0.3:
            snap = without_pod(snap, placed.pop(rng.randrange(len(placed))))
            continue
        free = [n for n in snap.nodes if n.free_mask and n.health.state < Health.UNHEALTHY]
        node = rng.choice(free)
        gpus = tuple(g for g in range(node.gpu_capacity) if (node.free_mask >> g) & 1)
        key = f"t/step{step}"
        snap = with_pod(snap, PodInfo(key, "", node.name, gpus[: rng.randint(1, len(gpus))]))
        placed.append(key)
    assert sum(d is not None for d in derived) >= 20  # mostly brought up to date


def test_ranks_are_recomputed_in_full_when_the_topology_scale_moves() -> None:
    """Filling the only node with the best 2-GPU links lowers the best bottleneck every
    other node is measured against: every rank changes, and the ranks brought forward
    from before equal a computation from scratch."""
    from benchmarks.clusters import make_node
    from scheduler.core.schedule import _rank_at, rank_positions
    from scheduler.core.snapshot import build_snapshot, with_pod

    nodes = [make_node("h100-a", 8, "h100", machine="DGX-H100")] + [
        make_node(f"v100-{i}", 8, "v100", machine="DGX-1") for i in range(40)
    ]
    params = SchedParams()
    snap = build_snapshot(nodes, [], params)
    req = request_from_pod(make_pod("two", 2), params.fabric)
    pos = np.arange(len(snap.nodes))
    before = rank_positions(snap, req, pos, params)  # memoized for these arrays
    full = with_pod(snap, PodInfo("t/fill", "", "h100-a", tuple(range(8))))
    after = rank_positions(full, req, pos, params)
    want = _rank_at(full.arrays, 2, "", params.weights, pos)
    assert after.tobytes() == want.tobytes()
    v100 = [full.index[f"v100-{i}"] for i in range(40)]
    assert (after[v100] != before[v100]).all()  # a new scale: not brought forward


def test_the_engine_choice_equals_a_straightforward_search(cache: ClusterCache) -> None:
    """filter's choice (narrow_with_rank, which may answer with the best node of the
    whole snapshot) and prioritize's 10 are the feasible candidate with the highest rank,
    ties by lowest name, first occurrence: shuffled lists, subsets, duplicates, unknown
    names and nodeSelectors that exclude the best node."""
    from scheduler.core.schedule import _rank_at, narrow_with_rank

    rng = random.Random(5)
    snap = cache.snapshot()
    names = list(snap.names)
    params = cache.params
    labels = [n.labels for n in snap.nodes if n.labels]
    for _pod, req in _requests(rng, labels):
        if req.gpus <= 0:
            continue
        for cand in _variants(rng, names) + [names + names[: len(names) // 2]]:
            pos = name_positions(snap, cand)
            codes = filter_codes(snap, req, pos, params)
            _, i, _ = narrow_with_rank(snap, req, pos, codes, params)
            rank = _rank_at(snap.arrays, req.gpus, req.min_link, params.weights, pos.clip(0))
            feasible = [j for j in range(len(cand)) if codes[j] == FEASIBLE]
            want = min(feasible, key=lambda j: (-rank[j], cand[j], j)) if feasible else -1
            assert i == want
            scores = score_positions(snap, req, pos, params)
            ok = [j for j in range(len(cand)) if pos[j] >= 0 and rank[j] >= 0]
            if ok:
                top = min(ok, key=lambda j: (-rank[j], cand[j], j))
                assert scores[top] == MAX_SCORE and (scores == MAX_SCORE).sum() == 1


def _clear_memos() -> None:
    """Forget every memo of the decision path (the straightforward reference)."""
    from scheduler.core import schedule, snapshot

    for memo in (
        schedule._CODES_MEMO,
        schedule._RANK_MEMO,
        schedule._POSITIONS_MEMO,
        snapshot._ROWS_MEMO,
        snapshot._ADDED,
        snapshot._PLACED,
        snapshot._LINEAGE,
    ):
        memo.clear()


def test_replies_are_byte_for_byte_those_of_a_reference_without_memos() -> None:
    """A large cluster, kube-scheduler's real-shaped pod (the shared fixture, nodeSelector
    and all) and synthetic pods, filtered and prioritized again and again with the names
    in the same order, shuffled, partial, duplicated and with unknown names, binds in
    between: every reply's bytes equal those of the same sequence answered from parsed
    bodies with every memo forgotten before each call."""
    from tests.helpers import fixture

    fx = fixture("filter_args_nodenames.json")["Pod"]
    cluster = synthetic_cluster(2000, seed=2)

    def run(fast: bool) -> list[bytes]:
        ext = Extender(_cache(cluster))
        names = list(ext.cache.snapshot().names)
        rng = random.Random(17)
        pods = [fx] + [
            {k: v for k, v in make_pod(f"w{i}", k).items() if k not in ("kind", "apiVersion")}
            for i, k in enumerate((4, 1, 8))
        ]
        out = []
        for r in range(8):
            pod = pods[r % len(pods)]
            for cand in [names, names, *_variants(rng, names), names[::-1] + names[:9]]:
                body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": cand})
                for verb in ("filter", "prioritize", "filter"):
                    call = getattr(ext, f"{verb}_json")
                    if fast:
                        out.append(call(wire.RawBody(body), body))
                    else:
                        _clear_memos()
                        out.append(call(orjson.loads(body)))
            chosen = orjson.loads(out[-3])["NodeNames"]
            if chosen and r % 2:
                m = pod["metadata"]
                args = {"PodName": m["name"], "PodNamespace": m.get("namespace", "default")}
                out.append(orjson.dumps(ext.bind({**args, "PodUID": "", "Node": chosen[0]})))
        return out

    fast = run(True)
    _clear_memos()
    reference = run(False)
    assert len(fast) == len(reference) > 150
    assert [i for i, (a, b) in enumerate(zip(fast, reference, strict=True)) if a != b] == []
    assert len(set(fast)) > 50  # the sequence exercised many different answers
