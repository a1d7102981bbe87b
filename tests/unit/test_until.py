"""How far ahead a window may be closed by hand: one bound for the CLI and the page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatchq.cli.ops import parse_until
from dispatchq.core.until import LONGEST_CLOSE, TooFar, duration, within_reach
from dispatchq.errors import UserError

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"), [("2h30m", 9000), ("+90m", 5400), ("3d", 259200), ("366d", 366 * 86400)]
)
def test_a_duration_within_the_year_is_read(text: str, seconds: int) -> None:
    assert duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["367d", "99999999d", "1000000000d", "9" * 5000 + "h", "8800h1s"])
def test_a_duration_past_the_longest_close_is_too_far_never_an_overflow(text: str) -> None:
    with pytest.raises(TooFar, match="further than 366 days"):
        duration(text)


@pytest.mark.parametrize("text", ["18:00", "2026-12-06T10:00+01:00", "", "h", "soon"])
def test_what_is_not_a_duration_is_none(text: str) -> None:
    assert duration(text) is None


def test_an_instant_past_the_longest_close_is_too_far() -> None:
    with pytest.raises(TooFar):
        within_reach("2028-01-01", NOW + LONGEST_CLOSE + timedelta(seconds=1), NOW)
    assert within_reach("soon", NOW + LONGEST_CLOSE, NOW) == NOW + LONGEST_CLOSE


@pytest.mark.parametrize("text", ["99999999d", "9999-12-31T23:59:59-05:00", "2030-01-01T00:00+00:00"])
def test_the_clis_until_refuses_what_is_too_far_in_one_line(text: str) -> None:
    with pytest.raises(UserError, match=r"^--until: "):
        parse_until(text, "UTC", NOW)
