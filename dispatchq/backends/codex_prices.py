"""What a metered Codex run cost: its tokens times the model's price (pure).

Codex prints no price (Claude Code prints `total_cost_usd`); `turn.completed` reports the
thread's `input_tokens`, `cached_input_tokens` (a part of the input, billed at the cached
rate) and `output_tokens`. A metered credential's spend cap needs a figure, so dispatchq
prices the tokens with a table of USD per million tokens per model. The operator's
`DISPATCHQ_CODEX_PRICES` (JSON, `{"model": [input, cached_input, output]}`) adds models and
overrides these; a model with no price leaves the cost unknown (the estimate reserved at
admission stays charged, so a spend cap still binds).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from dispatchq.backends.codex_stream import TokenUsage

__all__ = ["PRICES", "ModelPrice", "cost_usd", "parse_prices", "price_table"]


@dataclass(frozen=True)
class ModelPrice:
    """USD per million tokens: fresh input, cached input, output."""

    input: float
    cached_input: float
    output: float


#: OpenAI's published API prices (USD per 1M tokens) for the models Codex runs by default.
#: Prices change: an operator keeps them true with `DISPATCHQ_CODEX_PRICES`.
PRICES: Mapping[str, ModelPrice] = {
    "gpt-5": ModelPrice(1.25, 0.125, 10.0),
    "gpt-5-codex": ModelPrice(1.25, 0.125, 10.0),
    "gpt-5.1": ModelPrice(1.25, 0.125, 10.0),
    "gpt-5.1-codex": ModelPrice(1.25, 0.125, 10.0),
    "gpt-5.1-codex-mini": ModelPrice(0.25, 0.025, 2.0),
}


def parse_prices(text: str) -> dict[str, ModelPrice]:
    """The operator's table: a JSON object of model name to `[input, cached_input, output]`.

    Raises ValueError naming the first entry that is not three finite numbers at or above 0.
    """
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError(
            "DISPATCHQ_CODEX_PRICES is not JSON (an object of model: [input, cached, output])"
        ) from None
    if not isinstance(raw, dict):
        raise ValueError("DISPATCHQ_CODEX_PRICES must be a JSON object of model: [input, cached, output]")
    table: dict[str, ModelPrice] = {}
    for model, entry in raw.items():
        ok = (
            isinstance(entry, list)
            and len(entry) == 3
            and all(
                isinstance(n, int | float) and not isinstance(n, bool) and math.isfinite(n) and n >= 0
                for n in entry
            )
        )
        if not ok or not model.strip():
            raise ValueError(
                f"DISPATCHQ_CODEX_PRICES[{model!r}]: give three USD prices per million tokens "
                "[input, cached_input, output], each a number at or above 0"
            )
        table[model.strip().lower()] = ModelPrice(*(float(n) for n in entry))
    return table


def price_table(override: str | None) -> dict[str, ModelPrice]:
    """`PRICES` with the operator's entries over them (an empty or unset override changes nothing)."""
    table = dict(PRICES)
    if override and override.strip():
        table.update(parse_prices(override))
    return table


def cost_usd(usage: TokenUsage, model: str | None, prices: Mapping[str, ModelPrice]) -> float | None:
    """USD for `usage` on `model`; None when the model is unknown or has no price."""
    if model is None:
        return None
    price = prices.get(model.strip().lower())
    if price is None:
        return None
    cached = min(usage.cached_input_tokens, usage.input_tokens)
    fresh = usage.input_tokens - cached
    per_million = fresh * price.input + cached * price.cached_input + usage.output_tokens * price.output
    return per_million / 1_000_000
