"""What a model turn costs, from the tokens it used.

Prices come from a maintained table, genai-prices (its data ships with the package: no network),
which knows tiers such as long-context pricing. A model it does not know is priced from our own
table below (USD per million tokens; cache writes are the 5-minute cache, 1.25x input, cache reads
0.1x input), and one neither knows at the dearest rate we list, so a budget is never overrun
because a new model id slipped past the tables; such a cost is marked `fallback`, and wherever a
run's cost is shown it says it is an estimate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

import genai_prices

from agents.providers.base import Usage


@dataclass(frozen=True)
class Price:
    input: Decimal
    output: Decimal
    cache_write: Decimal
    cache_read: Decimal


def _price(input_: str, output: str, cache_write: str, cache_read: str) -> Price:
    return Price(Decimal(input_), Decimal(output), Decimal(cache_write), Decimal(cache_read))


PRICES: dict[str, Price] = {
    "claude-opus-4-6": _price("5", "25", "6.25", "0.50"),
    "claude-opus-4-5": _price("5", "25", "6.25", "0.50"),
    "claude-opus-4-1": _price("15", "75", "18.75", "1.50"),
    "claude-opus-4-0": _price("15", "75", "18.75", "1.50"),
    "claude-opus-4": _price("15", "75", "18.75", "1.50"),
    "claude-sonnet-4-6": _price("3", "15", "3.75", "0.30"),
    "claude-sonnet-4-5": _price("3", "15", "3.75", "0.30"),
    "claude-sonnet-4-0": _price("3", "15", "3.75", "0.30"),
    "claude-sonnet-4": _price("3", "15", "3.75", "0.30"),
    "claude-3-7-sonnet": _price("3", "15", "3.75", "0.30"),
    "claude-haiku-4-5": _price("1", "5", "1.25", "0.10"),
    "claude-3-5-haiku": _price("0.80", "4", "1", "0.08"),
}

DEFAULT_MODEL = "claude-sonnet-4-5"

FREE = _price("0", "0", "0", "0")

# Unknown models are priced as the dearest one we list, so a budget is never overrun because a
# new model id slipped past the table.
_MOST_EXPENSIVE = max(PRICES.values(), key=lambda p: (p.output, p.input))

# What may follow a listed id: a snapshot date (claude-sonnet-4-5-20250929) or "-latest".
# Anything else is a different model: claude-sonnet-4-7 must not be priced as claude-sonnet-4.
_SUFFIX = re.compile(r"-(\d{8}|latest)")

_PER_MILLION = Decimal(1_000_000)
_MICRO_DOLLAR = Decimal("0.000001")


def _is_offline(model: str) -> bool:
    return model == "scripted" or model.startswith(("scripted-", "scripted:"))


def price_for(model: str) -> tuple[Price, bool]:
    """The price of `model` and whether it is known (False: a conservative stand-in)."""
    if _is_offline(model):
        return FREE, True
    if model in PRICES:
        return PRICES[model], True
    for name, price in PRICES.items():
        if model.startswith(name) and _SUFFIX.fullmatch(model[len(name) :]):
            return price, True
    return _MOST_EXPENSIVE, False


@dataclass(frozen=True)
class Cost:
    usd: Decimal
    source: str  # offline | genai-prices | table | fallback (the dearest rate: an estimate)


def cost(model: str, usage: Usage) -> Cost:
    """What `usage` of `model` costs, and where the price came from."""
    if _is_offline(model):
        return Cost(Decimal(0), "offline")
    try:
        priced = genai_prices.calc_price(
            genai_prices.Usage(
                # genai-prices counts cached tokens inside the input; Anthropic reports them apart.
                input_tokens=usage.input_tokens
                + usage.cache_read_input_tokens
                + usage.cache_creation_input_tokens,
                output_tokens=usage.output_tokens,
                cache_read_tokens=usage.cache_read_input_tokens,
                cache_write_tokens=usage.cache_creation_input_tokens,
            ),
            model_ref=model,
            provider_id="anthropic",
        )
    except (LookupError, ValueError):
        price, known = price_for(model)
        return Cost(_table_cost(price, usage), "table" if known else "fallback")
    return Cost(Decimal(priced.total_price).quantize(_MICRO_DOLLAR, ROUND_HALF_UP), "genai-prices")


def _table_cost(price: Price, usage: Usage) -> Decimal:
    total = (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_creation_input_tokens * price.cache_write
        + usage.cache_read_input_tokens * price.cache_read
    )
    return (total / _PER_MILLION).quantize(_MICRO_DOLLAR, rounding=ROUND_HALF_UP)


def cost_usd(model: str, usage: Usage) -> Decimal:
    return cost(model, usage).usd
