"""The cap arithmetic of a metered credential: which day and month a spend counts in, whether
one more session fits under the cap, and what one session is expected to cost.

The cap holds because admission reserves a session's *estimate* before it starts and lets
it in only while `spent + estimate <= cap`: the cap is passed only by a session that costs
more than its estimate, and then by at most the difference (DESIGN invariant 17). The
storage script that takes the room applies the same rule to the same numbers; this module
is the rule, and the words a refusal reads with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import date, datetime
from typing import Literal
from zoneinfo import ZoneInfo

from dispatchq.pools.credentials import SpendCap

__all__ = [
    "DEFAULT_ESTIMATE",
    "Period",
    "cap_lifts_at",
    "cap_refusal",
    "estimate_for",
    "mean_cost",
    "money",
    "period_end",
    "refusing_period",
    "spend_periods",
]

#: USD one session is expected to cost when the kind states no `cost_estimate` and the
#: credential has settled no session yet. A Claude Code judgement session on the API runs
#: from tens of cents to a few dollars; one dollar keeps the first session's possible
#: overshoot of a cap to about one session's price, and it is replaced by the running mean
#: as soon as one session has settled with its `total_cost_usd`.
DEFAULT_ESTIMATE: float = 1.0

#: How far two USD sums may differ and still be equal: float sums of cents (0.1 + 0.2) are
#: not exact, and a session that exactly fills the cap must be let in.
_EPSILON = 1e-9

Period = Literal["day", "month"]


def _zone(timezone: str) -> ZoneInfo:
    return ZoneInfo(timezone)


def spend_periods(now: float, timezone: str) -> tuple[str, str]:
    """The calendar day and month `now` falls in, in the IANA zone `timezone`.

    `("2026-12-05", "2026-12")`: the names the day's and the month's spend are kept under, so
    a cap is a calendar day where the operator lives, not a rolling 24 hours.
    """
    local = datetime.fromtimestamp(now, _zone(timezone))
    return local.strftime("%Y-%m-%d"), local.strftime("%Y-%m")


def _valid(amount: float) -> float:
    """A USD amount as the arithmetic takes it: a missing, negative or non-finite one is 0."""
    return amount if math.isfinite(amount) and amount > 0 else 0.0


def money(amount: float) -> str:
    """`$20.00`: how a refusal names an amount."""
    return f"${amount:,.2f}"


def refusing_period(
    cap: SpendCap | None, spent_day: float, spent_month: float, estimate: float
) -> Period | None:
    """Which of the cap's periods has no room for one more session of `estimate` (None: both have).

    When both are full the month is named: it is the one that keeps the credential shut longer.
    A cap with neither limit (or no cap at all) refuses as `month`: metered spend without a
    cap is never admitted.
    """
    if cap is None or (cap.day is None and cap.month is None):
        return "month"
    if _full(cap.month, spent_month, estimate):
        return "month"
    if _full(cap.day, spent_day, estimate):
        return "day"
    return None


def _full(limit: float | None, spent: float, estimate: float) -> bool:
    if limit is None:
        return False
    taken = _valid(spent)
    # A cap already reached (or edited below what was taken) has no room, whatever the
    # estimate: a zero estimate must not let sessions in at the cap forever.
    return taken >= limit - _EPSILON or taken + _valid(estimate) > limit + _EPSILON


def cap_refusal(cap: SpendCap | None, spent_day: float, spent_month: float, estimate: float) -> str | None:
    """None when there is room for one more session of `estimate`; else why there is not.

    Room means `spent + estimate <= cap` for each limit the cap sets (a session that exactly
    fills the cap is let in), and the cap not already reached. A cap edited lower than the
    spend already taken refuses at once. A session whose estimate alone exceeds a limit can
    never fit and says so. `cap` None (a metered credential without a cap) refuses: "no
    spend cap".
    """
    period = refusing_period(cap, spent_day, spent_month, estimate)
    if period is None:
        return None
    if cap is None or (cap.day is None and cap.month is None):
        return "no spend cap"
    limit = cap.month if period == "month" else cap.day
    assert limit is not None  # refusing_period names only a period the cap limits
    if _valid(estimate) > limit + _EPSILON:
        per = "monthly" if period == "month" else "daily"
        return f"one session's estimate {money(_valid(estimate))} exceeds the {money(limit)} {per} cap"
    return (
        f"this month's {money(limit)} cap reached"
        if period == "month"
        else f"today's {money(limit)} cap reached"
    )


def _next_day(day: date) -> date:
    return date.fromordinal(day.toordinal() + 1)


def _next_month(day: date) -> date:
    return date(day.year + 1, 1, 1) if day.month == 12 else date(day.year, day.month + 1, 1)


def period_end(now: float, timezone: str, period: Period) -> float:
    """The epoch second the day (or month) holding `now` ends in `timezone`: its spend starts at 0."""
    zone = _zone(timezone)
    today = datetime.fromtimestamp(now, zone).date()
    nxt = _next_day(today) if period == "day" else _next_month(today)
    return datetime(nxt.year, nxt.month, nxt.day, tzinfo=zone).timestamp()


def cap_lifts_at(
    cap: SpendCap | None,
    spent_day: float,
    spent_month: float,
    estimate: float,
    *,
    now: float,
    timezone: str,
) -> float | None:
    """When the cap has room again by itself (the next day or month begins), None when it has room
    now or never will (no cap; an estimate larger than the limit)."""
    period = refusing_period(cap, spent_day, spent_month, estimate)
    if period is None or cap is None:
        return None
    limit = cap.month if period == "month" else cap.day
    if limit is None or _valid(estimate) > limit + _EPSILON:
        return None
    return period_end(now, timezone, period)


def mean_cost(recent: Sequence[float], fallback: float) -> float:
    """The mean cost of the recent sessions (the caller keeps how many), or `fallback` with none.

    A cost that is negative or not a number is no measurement and is left out.
    """
    costs = [c for c in recent if math.isfinite(c) and c >= 0]
    return sum(costs) / len(costs) if costs else fallback


def estimate_for(kind_estimate: float | None, recent: Sequence[float]) -> float:
    """What admission reserves for one session: the kind's `cost_estimate`, else the running
    mean of the credential's recent sessions, else `DEFAULT_ESTIMATE`."""
    if kind_estimate is not None and math.isfinite(kind_estimate) and kind_estimate >= 0:
        return kind_estimate
    return mean_cost(recent, DEFAULT_ESTIMATE)
