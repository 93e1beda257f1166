"""Dollars as people read them, the same everywhere: `usd(Decimal("0.01605"))` is "$0.0161" in
every panel, list and command (Python's own `:.4f` rounds half to even, "$0.0160", where Django's
floatformat rounds half up; a cost once read differently in two panels of one page)."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any


def usd(amount: Any, places: int = 4) -> str:
    """ "$" and the amount to `places` decimals, halves rounded up; "" for no amount."""
    if amount is None or amount == "":
        return ""
    try:
        value = Decimal(str(amount))
    except (InvalidOperation, ValueError):
        return ""
    return f"${value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)}"
