"""The memo of parsed quantity texts (``quantity._PARSED``) never changes an answer: the
same value or the same error as a fresh parse, per (text, scale, bounds, wholeness)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import quantity
from scheduler.core.quantity import QuantityError, parse_quantity_int


def _fresh(text: str, **kw: object) -> int | str:
    try:
        return quantity._parse_text(
            text,
            kw.get("scale10", 0),  # type: ignore[arg-type]
            kw.get("low", 0),  # type: ignore[arg-type]
            kw.get("high", quantity.QUANTITY_MAX),  # type: ignore[arg-type]
            kw.get("whole", False),  # type: ignore[arg-type]
        )
    except QuantityError as exc:
        return exc.reason


def _parsed(text: str, **kw: object) -> int | str:
    try:
        return parse_quantity_int(text, **kw)  # type: ignore[arg-type]
    except QuantityError as exc:
        return exc.reason


_texts = st.sampled_from(["1", "8", "9", "0.5", "1Gi", "64Gi", "250m", "1e3", "x", "", "-1"]) | (
    st.text(alphabet="0123456789.eEmkKMGiT+-", max_size=8)
)
_bounds = st.fixed_dictionaries(
    {},
    optional={
        "scale10": st.sampled_from([0, 3, 9]),
        "high": st.sampled_from([8, 1000, quantity.QUANTITY_MAX]),
        "low": st.sampled_from([0, -5]),
        "whole": st.booleans(),
    },
)


@settings(max_examples=400, deadline=None)
@given(calls=st.lists(st.tuples(_texts, _bounds), min_size=1, max_size=12))
def test_memoized_parses_equal_fresh_ones(calls: list[tuple[str, dict]]) -> None:
    for text, kw in calls + calls:  # every call twice: the second may come from the memo
        assert _parsed(text, **kw) == _fresh(text, **kw)


def test_bounds_and_scale_are_part_of_the_key() -> None:
    quantity._PARSED.clear()
    assert parse_quantity_int("9") == 9
    with pytest.raises(QuantityError):  # the same text under tighter bounds still fails
        parse_quantity_int("9", high=8, whole=True)
    assert parse_quantity_int("9", scale10=3) == 9000
    with pytest.raises(QuantityError):
        parse_quantity_int("0.5", whole=True)
    assert parse_quantity_int("0.5") == 1
    with pytest.raises(QuantityError):  # an error is never remembered as a value
        parse_quantity_int("0.5", whole=True)


def test_the_memo_is_bounded() -> None:
    quantity._PARSED.clear()
    for i in range(3 * quantity._PARSED_SIZE):
        assert parse_quantity_int(f"{i}Ki") == 1024 * i
    assert len(quantity._PARSED) <= quantity._PARSED_SIZE
    assert parse_quantity_int("5Ki") == 5120
