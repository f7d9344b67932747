"""Numbers read from Kubernetes objects, parsed with bounded cost.

Every number topoplace reads from an object (resource quantities such as ``"500m"``,
``"512Gi"``, ``"1e3"``; counts in annotations and labels such as
``topoplace.io/gang-size``) goes through :func:`parse_quantity_int`, whose contract is:

* **Bounded cost.** Text longer than :data:`MAX_QUANTITY_CHARS` is refused before anything
  else, the grammar is one anchored regular expression without nested repetition (linear
  time), and exponents are compared against :data:`MAX_EXPONENT` before any power is
  computed. No ``Decimal`` or ``float`` conversion of the text ever happens, so
  ``"1e1000000"`` costs as much as ``"1e3"`` (a few microseconds), not a minute.
* **Exact.** The value is an integer computed from the digits (``coefficient * 10**e *
  2**b``), rounded up (towards +infinity, as before) unless a whole number is required.
* **Range-checked.** A value outside ``[low, high]`` is refused. ``NaN``, ``Infinity``,
  booleans, floats that are not finite and Python ints outside the range are refused
  without conversion.
* **Refusals are exceptions of one type**, :class:`QuantityError`, carrying a constant
  reason (no values echoed), which callers turn into an ``ObjectError`` for the object
  (``scheduler.core.objects``) or into a default (:func:`quantity_int`, :func:`cpu_milli`:
  the lenient readers for objects that are already admitted, such as bound pods).

Grammar (Kubernetes ``resource.Quantity``, ASCII digits only)::

    quantity  ::= sign? (digits ("." digits?)? | "." digits) suffix?
    suffix    ::= ("e" | "E") sign? digits       # decimal exponent
                | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
                | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E"

A trailing ``E`` alone is exa (``"1E"`` = 10**18); ``"1E3"`` is an exponent.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

MAX_QUANTITY_CHARS = 64
"""Longest quantity text read (Kubernetes' own canonical forms are far shorter)."""

QUANTITY_MAX = 2**53
"""Largest value (in base units, after scaling) the lenient readers accept: 8 PiB of
memory, 9e12 cores in millicores. Sums of many such values stay inside int64."""

MAX_EXPONENT = 40
"""Largest decimal exponent of a value's magnitude considered; beyond it the value is out
of every range topoplace uses (``QUANTITY_MAX`` < 1e16) and refused unseen."""

REASON_NOT_A_QUANTITY = "not a number"
REASON_OUT_OF_RANGE = "out of range"
REASON_NOT_WHOLE = "not a whole number"
REASON_TOO_LONG = "too long"

_QUANTITY = re.compile(
    r"([+-]?)([0-9]*)(?:\.([0-9]*))?"
    r"(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?",
    re.ASCII,
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


class QuantityError(ValueError):
    """A number in an object is malformed or out of range.

    Attributes:
        reason: one of the constant ``REASON_*`` strings of this module.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _exact(
    sign: int, coefficient: int, exp10: int, exp2: int, whole: bool, low: int, high: int
) -> int:
    """``sign * coefficient * 10**exp10 * 2**exp2`` rounded up, range-checked. Bounded:
    the caller guarantees ``coefficient < 10**MAX_QUANTITY_CHARS`` and ``0 <= exp2 <= 60``;
    ``exp10`` is checked here before any power is taken."""
    if coefficient == 0:
        value = 0
    else:
        # Magnitude in decimal digits, before the binary factor (< 10**19).
        digits = len(str(coefficient)) + exp10
        if digits > MAX_EXPONENT:
            raise QuantityError(REASON_OUT_OF_RANGE)
        if exp10 >= 0:
            value = sign * coefficient * 10**exp10 * 2**exp2
        elif digits < -MAX_EXPONENT:
            # |value| < 10**-MAX_EXPONENT * 2**60 < 1: not whole; rounds up to 1 or 0.
            if whole:
                raise QuantityError(REASON_NOT_WHOLE)
            value = 1 if sign > 0 else 0
        else:
            num = coefficient * 2**exp2
            den = 10**-exp10
            if whole and num % den:
                raise QuantityError(REASON_NOT_WHOLE)
            value = _ceil_div(num, den) if sign > 0 else -(num // den)
    if not low <= value <= high:
        raise QuantityError(REASON_OUT_OF_RANGE)
    return value


def parse_quantity_int(
    value: object,
    *,
    scale10: int = 0,
    low: int = 0,
    high: int = QUANTITY_MAX,
    whole: bool = False,
) -> int:
    """A quantity (or a JSON number) as an integer in base units times ``10**scale10``.

    Args:
        value: text (a Kubernetes quantity) or a JSON number (int or finite float).
        scale10: decimal scale applied before rounding (3 = millis, as for CPU).
        low / high: inclusive range of the result.
        whole: refuse values that are not whole numbers (counts) instead of rounding up.

    Returns:
        The value, rounded up (towards +infinity) unless ``whole``.

    Raises:
        QuantityError: malformed text, ``NaN``/``Infinity``, a boolean, a value outside
            ``[low, high]``, or (with ``whole``) a fractional value. Cost is bounded by
            :data:`MAX_QUANTITY_CHARS` whatever the input.
    """
    if isinstance(value, bool):
        raise QuantityError(REASON_NOT_A_QUANTITY)
    if isinstance(value, int):
        if value.bit_length() > 4 * MAX_QUANTITY_CHARS:  # ~77 digits: out of every range
            raise QuantityError(REASON_OUT_OF_RANGE)
        return _exact(1 if value >= 0 else -1, abs(value), scale10, 0, whole, low, high)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(REASON_NOT_A_QUANTITY)
        value = repr(value)  # "1e+300", "0.5": short, and parsed exactly below
    if not isinstance(value, str):
        raise QuantityError(REASON_NOT_A_QUANTITY)
    if type(value) is not str or type(scale10) is not int or type(whole) is not bool:
        return _parse_text(value, scale10, low, high, whole)
    key = (value, scale10, low, high, whole)
    hit = _PARSED.get(key)
    if hit is None:
        hit = _parse_text(value, scale10, low, high, whole)
        if len(_PARSED) >= _PARSED_SIZE:
            _PARSED.clear()
        _PARSED[key] = hit
    return hit


_PARSED: dict[tuple[str, int, int, int, bool], int] = {}
"""Values of :func:`parse_quantity_int` for text, by (text, scale10, low, high, whole): a
pure function of its key (only successes are kept; an error is raised afresh each time).
Every pod's requests ("1", "64Gi", "8") are read at each filter; the same few texts recur."""

_PARSED_SIZE = 1024


def _parse_text(value: str, scale10: int, low: int, high: int, whole: bool) -> int:
    """:func:`parse_quantity_int` of text."""
    if len(value) > MAX_QUANTITY_CHARS:
        raise QuantityError(REASON_TOO_LONG)
    s = value.strip()
    m = _QUANTITY.fullmatch(s)
    if m is None:
        raise QuantityError(REASON_NOT_A_QUANTITY)
    sign_text, int_part, frac_part, exponent, suffix = m.groups()
    frac_part = frac_part or ""
    if not int_part and not frac_part:
        raise QuantityError(REASON_NOT_A_QUANTITY)
    exp10 = scale10 - len(frac_part)
    exp2 = 0
    if exponent is not None:
        # A long exponent is clamped, never converted: +-10**6 is far outside MAX_EXPONENT,
        # so _exact refuses (or rounds) it without taking any power.
        digits = exponent.lstrip("+-").lstrip("0") or "0"
        e = int(digits) if len(digits) <= 6 else 10**6
        exp10 += -e if exponent.startswith("-") else e
    elif suffix:
        if suffix in _BINARY:
            exp2 = _BINARY[suffix]
        else:
            exp10 += _DECIMAL[suffix]
    coefficient = int(int_part + frac_part)
    sign = -1 if sign_text == "-" else 1
    return _exact(sign, coefficient, exp10, exp2, whole, low, high)


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes quantity as a Decimal in base units (bounded: see the module docstring).

    Only values whose magnitude is below ``10**MAX_EXPONENT`` and whose fraction has at most
    9 digits (nano) are represented; the result is exact within those bounds.

    Raises:
        ValueError: (:class:`QuantityError`) the value is not a quantity or out of range.
    """
    nanos = parse_quantity_int(value, scale10=9, low=-(10**49), high=10**49)
    return Decimal(nanos).scaleb(-9)


def quantity_int(value: object, default: int = 0) -> int:
    """A quantity rounded up to an integer in base units; ``default`` when absent, invalid
    or outside ``0..QUANTITY_MAX`` (the lenient reader, for objects already admitted)."""
    if value is None:
        return default
    try:
        return parse_quantity_int(value)
    except QuantityError:
        return default


def cpu_milli(value: object, default: int = 0) -> int:
    """CPU quantity in millicores, rounded up; ``default`` when absent, invalid or outside
    ``0..QUANTITY_MAX`` millicores (lenient, as :func:`quantity_int`)."""
    if value is None:
        return default
    try:
        return parse_quantity_int(value, scale10=3)
    except QuantityError:
        return default
