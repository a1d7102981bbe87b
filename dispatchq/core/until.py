"""How far ahead a window may be closed by hand, and the duration text both the CLI and the page take.

One rule for both doors: `2h30m`, `+90m` or `3d` from now, never past LONGEST_CLOSE. A bound
is needed anyway (a `timedelta` overflows past 999,999,999 days and Python reads no integer of
more than 4,300 digits), and a year covers every real reservation: a longer one is a typo.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

__all__ = ["LONGEST_CLOSE", "TooFar", "duration", "within_reach"]

#: The furthest a window may be closed by hand.
LONGEST_CLOSE = timedelta(days=366)
_DURATION = re.compile(r"^\+?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class TooFar(ValueError):
    """A close further ahead than LONGEST_CLOSE."""

    def __init__(self, text: str) -> None:
        super().__init__(f"{text[:60]!r} is further than {LONGEST_CLOSE.days} days ahead")


def duration(text: str) -> timedelta | None:
    """`text` as a duration (`2h30m`), None when it is not one; TooFar past LONGEST_CLOSE."""
    match = _DURATION.match(text.strip())
    if not match or not any(match.groups()):
        return None
    parts = [group or "0" for group in match.groups()]
    if any(len(part) > 9 for part in parts):
        raise TooFar(text)
    d, h, m, s = (int(part) for part in parts)
    seconds = ((d * 24 + h) * 60 + m) * 60 + s  # whole seconds: no timedelta until it is in range
    if seconds > LONGEST_CLOSE.total_seconds():
        raise TooFar(text)
    return timedelta(seconds=seconds)


def within_reach(text: str, when: datetime, now: datetime) -> datetime:
    """`when`, or TooFar when it is further ahead of `now` than LONGEST_CLOSE."""
    if when - now > LONGEST_CLOSE:
        raise TooFar(text)
    return when
