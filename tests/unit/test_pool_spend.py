"""The cap arithmetic of a metered credential: periods in the operator's zone, room under a cap,
and what one session is expected to cost."""

from __future__ import annotations

import math
from datetime import datetime

import pytest

from dispatchq.pools.credentials import SpendCap
from dispatchq.pools.spend import (
    DEFAULT_ESTIMATE,
    cap_lifts_at,
    cap_refusal,
    estimate_for,
    mean_cost,
    period_end,
    spend_periods,
)


def _at(text: str) -> float:
    """An ISO instant with its offset, as epoch seconds."""
    return datetime.fromisoformat(text).timestamp()


@pytest.mark.parametrize(
    ("instant", "zone", "periods"),
    [
        ("2026-12-05T12:00:00+00:00", "UTC", ("2026-12-05", "2026-12")),
        # 23:30 UTC is already tomorrow in Berlin and still today in New York.
        ("2026-12-05T23:30:00+00:00", "Europe/Berlin", ("2026-12-06", "2026-12")),
        ("2026-12-05T23:30:00+00:00", "America/New_York", ("2026-12-05", "2026-12")),
        ("2026-12-06T03:30:00+00:00", "America/New_York", ("2026-12-05", "2026-12")),
        ("2026-12-06T05:30:00+00:00", "America/New_York", ("2026-12-06", "2026-12")),
        # A zone's midnight that is also its month's end.
        ("2026-11-30T23:30:00+00:00", "Europe/Berlin", ("2026-12-01", "2026-12")),
        ("2026-11-30T23:30:00+00:00", "UTC", ("2026-11-30", "2026-11")),
        ("2026-12-31T15:30:00+00:00", "Asia/Tokyo", ("2027-01-01", "2027-01")),
        # One instant either side of Berlin's midnight.
        ("2026-12-05T22:59:59+00:00", "Europe/Berlin", ("2026-12-05", "2026-12")),
        ("2026-12-05T23:00:00+00:00", "Europe/Berlin", ("2026-12-06", "2026-12")),
    ],
)
def test_spend_periods_are_the_zone_s_calendar(instant: str, zone: str, periods: tuple[str, str]) -> None:
    assert spend_periods(_at(instant), zone) == periods


@pytest.mark.parametrize(
    ("cap", "day", "month", "estimate", "refusal"),
    [
        # Room means spent + estimate <= cap: exactly filling the cap is let in.
        (SpendCap(day=20.0), 19.0, 19.0, 1.0, None),
        (SpendCap(day=20.0), 19.01, 19.01, 1.0, "today's $20.00 cap reached"),
        (SpendCap(day=20.0), 0.0, 0.0, 20.0, None),
        (SpendCap(day=20.0), 0.0, 0.0, 20.01, "one session's estimate $20.01 exceeds the $20.00 daily cap"),
        # Sums of cents are not exact in floats; the boundary still holds.
        (SpendCap(day=0.3), 0.1 + 0.1, 0.2, 0.1, None),
        (SpendCap(day=0.3), 0.1 + 0.2, 0.3, 0.01, "today's $0.30 cap reached"),
        # The month cap, on its own and beside a day cap with room.
        (SpendCap(month=300.0), 5.0, 299.0, 1.0, None),
        (SpendCap(month=300.0), 5.0, 299.5, 1.0, "this month's $300.00 cap reached"),
        (SpendCap(day=20.0, month=300.0), 5.0, 299.5, 1.0, "this month's $300.00 cap reached"),
        (SpendCap(day=20.0, month=300.0), 19.5, 100.0, 1.0, "today's $20.00 cap reached"),
        # Both full: the month is named, it keeps the credential shut longer.
        (SpendCap(day=20.0, month=300.0), 20.0, 300.0, 1.0, "this month's $300.00 cap reached"),
        # A cap edited lower than the spend already taken refuses at once.
        (SpendCap(day=10.0, month=300.0), 12.0, 12.0, 0.5, "today's $10.00 cap reached"),
        (SpendCap(day=50.0, month=100.0), 0.0, 140.0, 0.5, "this month's $100.00 cap reached"),
        # A reached cap has no room even for an estimate of nothing.
        (SpendCap(day=20.0), 20.0, 20.0, 0.0, "today's $20.00 cap reached"),
        (SpendCap(day=20.0), 19.0, 19.0, 0.0, None),
        (SpendCap(day=1000.0), 999.5, 999.5, 1.0, "today's $1,000.00 cap reached"),
        # No cap: metered spend is never admitted without one.
        (None, 0.0, 0.0, 1.0, "no spend cap"),
        (SpendCap(), 0.0, 0.0, 1.0, "no spend cap"),
    ],
)
def test_cap_refusal(
    cap: SpendCap | None, day: float, month: float, estimate: float, refusal: str | None
) -> None:
    assert cap_refusal(cap, day, month, estimate) == refusal


def test_the_cap_is_passed_by_at_most_one_session_s_overrun() -> None:
    """Admitting while there is room and charging what each session really cost never ends
    more than one session's overrun past the cap."""
    cap = SpendCap(day=20.0)
    estimate, actual = 1.5, 2.5
    spent = 0.0
    admitted = 0
    while cap_refusal(cap, spent, spent, estimate) is None:
        spent += actual
        admitted += 1
    assert admitted > 1
    assert spent - actual + estimate <= 20.0 + 1e-9
    assert spent <= 20.0 + (actual - estimate) + 1e-9


@pytest.mark.parametrize(
    ("cap", "day", "month", "estimate", "zone", "instant", "lifts"),
    [
        (SpendCap(day=20.0), 5.0, 5.0, 1.0, "UTC", "2026-12-05T12:00:00+00:00", None),
        (
            SpendCap(day=20.0),
            20.0,
            20.0,
            1.0,
            "UTC",
            "2026-12-05T12:00:00+00:00",
            "2026-12-06T00:00:00+00:00",
        ),
        (
            SpendCap(day=20.0),
            20.0,
            20.0,
            1.0,
            "Europe/Berlin",
            "2026-12-05T23:30:00+00:00",
            "2026-12-07T00:00:00+01:00",
        ),
        (
            SpendCap(day=20.0, month=300.0),
            1.0,
            300.0,
            1.0,
            "UTC",
            "2026-12-05T12:00:00+00:00",
            "2027-01-01T00:00:00+00:00",
        ),
        # An estimate no day can hold never lifts by itself.
        (SpendCap(day=20.0), 0.0, 0.0, 25.0, "UTC", "2026-12-05T12:00:00+00:00", None),
        (None, 0.0, 0.0, 1.0, "UTC", "2026-12-05T12:00:00+00:00", None),
    ],
)
def test_cap_lifts_at_the_next_period(
    cap: SpendCap | None,
    day: float,
    month: float,
    estimate: float,
    zone: str,
    instant: str,
    lifts: str | None,
) -> None:
    got = cap_lifts_at(cap, day, month, estimate, now=_at(instant), timezone=zone)
    assert got == (_at(lifts) if lifts is not None else None)


@pytest.mark.parametrize(
    ("instant", "zone", "period", "end"),
    [
        ("2026-12-05T12:00:00+00:00", "UTC", "day", "2026-12-06T00:00:00+00:00"),
        ("2026-12-31T12:00:00+00:00", "UTC", "day", "2027-01-01T00:00:00+00:00"),
        ("2026-12-31T12:00:00+00:00", "UTC", "month", "2027-01-01T00:00:00+00:00"),
        ("2026-02-10T12:00:00+00:00", "UTC", "month", "2026-03-01T00:00:00+00:00"),
        # The day summer time begins in Berlin is 23 hours long.
        ("2026-03-29T10:00:00+00:00", "Europe/Berlin", "day", "2026-03-30T00:00:00+02:00"),
    ],
)
def test_period_end_in_the_zone(instant: str, zone: str, period: str, end: str) -> None:
    assert period_end(_at(instant), zone, "day" if period == "day" else "month") == _at(end)


@pytest.mark.parametrize(
    ("recent", "fallback", "mean"),
    [
        ((), 1.0, 1.0),
        ((), 3.5, 3.5),
        ((2.0,), 1.0, 2.0),
        ((1.0, 2.0, 6.0), 9.0, 3.0),
        # A negative or non-number cost is no measurement.
        ((2.0, -1.0, math.nan, 4.0), 9.0, 3.0),
        ((math.inf,), 1.5, 1.5),
        ((0.0, 0.5), 9.0, 0.25),
    ],
)
def test_mean_cost(recent: tuple[float, ...], fallback: float, mean: float) -> None:
    assert mean_cost(recent, fallback) == pytest.approx(mean)


@pytest.mark.parametrize(
    ("kind_estimate", "recent", "estimate"),
    [
        (0.75, (5.0, 7.0), 0.75),
        (None, (5.0, 7.0), 6.0),
        (None, (), DEFAULT_ESTIMATE),
        (-1.0, (2.0,), 2.0),
        (math.nan, (), DEFAULT_ESTIMATE),
        (0.0, (2.0,), 0.0),
    ],
)
def test_estimate_for(kind_estimate: float | None, recent: tuple[float, ...], estimate: float) -> None:
    assert estimate_for(kind_estimate, recent) == pytest.approx(estimate)
