"""Kubernetes resource quantities ("500m", "512Gi", "1e3") as integers."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def parse_quantity(value: object) -> Decimal:
    """Parse a Kubernetes quantity into a Decimal in base units.

    Raises:
        ValueError: the value is not a quantity.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"not a quantity: {value!r}")
    s = value.strip()
    try:
        for suffix, mult in _BINARY.items():
            if s.endswith(suffix):
                return Decimal(s[: -len(suffix)]) * mult
        if s[-1] in "numkMGTPE":  # a trailing "E" is exa; exponents use "e" ("1e3")
            return Decimal(s[:-1]) * _DECIMAL[s[-1]]
        return Decimal(s)
    except (InvalidOperation, KeyError) as exc:
        raise ValueError(f"not a quantity: {value!r}") from exc


def quantity_int(value: object, default: int = 0) -> int:
    """A quantity rounded up to an integer in base units; ``default`` when absent/invalid."""
    if value is None:
        return default
    try:
        q = parse_quantity(value)
    except ValueError:
        return default
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def cpu_milli(value: object, default: int = 0) -> int:
    """CPU quantity in millicores, rounded up."""
    if value is None:
        return default
    try:
        q = parse_quantity(value) * 1000
    except ValueError:
        return default
    return int(q.to_integral_value(rounding="ROUND_CEILING"))
