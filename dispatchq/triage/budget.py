"""Triage's provider-request budgets: one model, enforced in Redis across processes.

`triage.budget: {requests: N, window: SECONDS}` limits a config's requests over a rolling
window; `DISPATCHQ_TRIAGE_HOURLY_BUDGET` caps all of triage over a rolling hour. The CLI
and typed workers use the same `budget_for`, so `dispatchq triage` and enqueued events
spend one budget. A request is reserved before asking (in one WATCH transaction over
every limit, `TriageStorage.reserve_budget`) and settled after: given back when nothing
was asked (keyless, a stored decision), so only real requests count.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from dispatchq.storage.triage import TriageStorage
from dispatchq.triage.rules import TriageConfig

__all__ = ["HOUR", "Budget", "BudgetLimit", "RollingBudget", "RunBudget", "budget_for"]


class Budget(Protocol):
    """Provider requests a caller may still spend: one reserved before asking, settled after.

    `reserve()` is None when one request may be made (and counts it), else the sentence
    row 3 shows: how much was spent of what, and when it refills. `settle(requests)` gives
    the reservation back when nothing was asked, or counts the extra ones.
    """

    def reserve(self) -> str | None: ...

    def settle(self, requests: int) -> None: ...


@dataclass
class RunBudget:
    """An in-process budget of `limit` requests (None is unlimited): for tests and one-off callers."""

    limit: int | None
    spent: int = 0

    @classmethod
    def from_config(cls, config: TriageConfig) -> RunBudget:
        return cls(config.budget_requests)

    def available(self) -> bool:
        return self.limit is None or self.spent < self.limit

    def reserve(self) -> str | None:
        if not self.available():
            return f"the run's budget is spent: {self.spent} of {self.limit} requests"
        self.spent += 1
        return None

    def settle(self, requests: int) -> None:
        self.spent += max(0, requests) - 1


@dataclass(frozen=True)
class BudgetLimit:
    """One rolling limit: at most `requests` provider requests in any `window` seconds."""

    name: str  # its Redis key's name
    label: str  # how row 3 names it
    requests: int
    window: float


#: The overall cap's window: DISPATCHQ_TRIAGE_HOURLY_BUDGET is per rolling hour.
HOUR = 3600.0


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


class RollingBudget:
    """Every limit enforced in Redis across processes, over a rolling window (not a clock hour)."""

    def __init__(
        self, storage: TriageStorage, limits: Iterable[BudgetLimit], *, clock: Callable[[], float] = time.time
    ) -> None:
        self._storage = storage
        self.limits = tuple(limits)
        self._clock = clock
        self._member: str | None = None

    def reserve(self) -> str | None:
        now = self._clock()
        member = f"{now!r}:{uuid.uuid4().hex}"
        refused = self._storage.reserve_budget(
            [(lim.name, lim.requests, lim.window) for lim in self.limits], now, member
        )
        if refused is None:
            self._member = member
            return None
        index, spent, oldest = refused
        limit = self.limits[index]
        when = (
            "it never refills (the limit is 0)"
            if oldest is None
            else "it refills at " + time.strftime("%H:%M:%S UTC", time.gmtime(oldest + limit.window))
        )
        return (
            f"{limit.label} budget spent: {spent} of {limit.requests} requests "
            f"in the last {_span(limit.window)}; {when}"
        )

    def settle(self, requests: int) -> None:
        if self._member is None:
            return
        member, self._member = self._member, None
        if requests == 1:
            return
        ttl = int(max((lim.window for lim in self.limits), default=HOUR)) + 1
        self._storage.settle_budget([lim.name for lim in self.limits], member, requests, self._clock(), ttl)


def budget_for(storage: TriageStorage, config: TriageConfig, hourly_cap: int) -> RollingBudget:
    """The one budget model: `triage.budget` (per config) and the overall rolling-hour cap."""
    limits = []
    if config.budget_requests is not None:
        limits.append(BudgetLimit("config", "triage.budget", config.budget_requests, config.budget_window))
    limits.append(BudgetLimit("hourly", "DISPATCHQ_TRIAGE_HOURLY_BUDGET", hourly_cap, HOUR))
    return RollingBudget(storage, limits)
