"""``scheduler.core.podmap.PodMap`` behaves exactly like a dict under set/delete, order
included, across flattening (hypothesis against a dict model)."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.podmap import PodMap

KEYS = st.sampled_from([f"ns/p{i}" for i in range(40)])
OPS = st.lists(st.tuples(st.booleans(), KEYS, st.integers(0, 9)), max_size=400)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(KEYS, st.integers(), max_size=30), OPS)
def test_podmap_matches_a_dict_in_content_and_order(start: dict[str, int], ops: list) -> None:
    model = dict(start)
    m = PodMap(start)
    versions = [(m, dict(model))]
    for is_set, key, value in ops:
        if is_set:
            model[key] = value
            m = m.set(key, value)
        else:
            model.pop(key, None)
            m = m.delete(key)
        versions.append((m, dict(model)))
    for pm, want in versions:  # every older version is unchanged (immutability)
        assert list(pm) == list(want)
        assert list(pm.items()) == list(want.items())
        assert list(pm.values()) == list(want.values())
        assert len(pm) == len(want) and pm == want
        for key in (f"ns/p{i}" for i in range(40)):
            assert (key in pm) == (key in want)
            assert pm.get(key, -1) == want.get(key, -1)
    assert pickle.loads(pickle.dumps(m)) == model


def test_updates_share_the_base_until_they_flatten() -> None:
    base = PodMap({f"k{i}": i for i in range(10_000)})
    m = base.set("k1", -1).delete("k2").set("new", 7)
    assert m._base is base._base and len(m._delta) == 2 and m._gone == {"k2"}
    assert list(m)[:3] == ["k0", "k1", "k3"] and list(m)[-1] == "new" and m["k1"] == -1
    for i in range(200):  # past max(64, sqrt(n)) changes the next update flattens
        m = m.set(f"x{i}", i)
    assert m._base is not base._base and len(m._delta) < 100
    assert len(m) == 10_000 - 1 + 1 + 200 and base["k1"] == 1 and "k2" in base


def test_deleting_an_absent_key_returns_the_same_map() -> None:
    m = PodMap({"a": 1})
    assert m.delete("b") is m
