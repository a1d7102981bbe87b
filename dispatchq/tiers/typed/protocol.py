"""What the typed tier asks of a provider, and the provider with no key: no SDK here.

The typed worker, triage's ask and the tests talk to a `Provider`; only `provider.py`
knows that the real one is TypeSafe's SDK. The knobs (`ProviderOptions`) are plain
numbers from the settings, so building them loads nothing either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from dispatchq.tiers.typed.batching import Ask, JSONState, NoKey, Outcome, WireQuestion

__all__ = ["KeylessProvider", "Provider", "ProviderOptions"]


class Provider(Protocol):
    """What the typed worker calls; a keyless provider and the real one look the same."""

    @property
    def keyless(self) -> bool: ...

    @property
    def requested_model(self) -> str | None: ...

    @property
    def calls(self) -> int: ...

    def ask(self, state: JSONState, questions: Mapping[str, WireQuestion]) -> Outcome: ...

    def ask_many(self, asks: Sequence[Ask]) -> dict[str, Outcome]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ProviderOptions:
    """Knobs from the settings object; defaults keep the SDK's own retry short and bounded.

    `retry_budget` caps one call's total time including the SDK's retries; a retry-after
    longer than what is left ends the call at once as `Transient` with that delay, so a worker
    is never held waiting on a rate limit. `request_timeout=None` keeps the SDK default, and
    `compression=None` keeps the SDK's choice (zstd when importable).
    """

    max_retries: int = 2
    retry_budget: float = 15.0
    request_timeout: float | None = None
    backoff_initial: float = 0.5
    backoff_max: float = 2.0
    max_questions_per_request: int = 64
    concurrency: int = 1
    compression: Literal["zstd", False] | None = None

    def __post_init__(self) -> None:
        if self.max_questions_per_request < 1:
            raise ValueError("max_questions_per_request must be at least 1")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")


class KeylessProvider:
    """No key: answers nothing, makes no request, so every judgement moves on unchanged."""

    keyless = True
    requested_model: str | None = None
    calls = 0

    def ask(self, state: JSONState, questions: Mapping[str, WireQuestion]) -> Outcome:
        return NoKey()

    def ask_many(self, asks: Sequence[Ask]) -> dict[str, Outcome]:
        return {ask.judgement_id: NoKey() for ask in asks}

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> KeylessProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "KeylessProvider()"
