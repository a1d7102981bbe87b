"""A 24-hour history of the counters, sampled once a minute into one Redis stream.

The page's charts (answered per tier, sessions spawned and refused, closed-window bands)
need the past, and the counters only hold "since the store was created". The scheduler is
always running (it is in every Procfile; `serve` may not be), so it samples: one stream
entry per minute whose id *is* the minute (`<minute * 60000>-0`). That makes the sample
idempotent across hosts for free: a second scheduler sampling the same minute is refused
by XADD ("equal or smaller than the target stream top item") and changes nothing. Entries
older than 24 hours are trimmed in the same XADD (`MINID`), so the history never grows.

Readers turn the cumulative samples into per-minute deltas; a minute without a sample (no
scheduler ran) is a gap, never an interpolated zero.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from redis.typing import EncodableT, FieldT

from dispatchq.core.text import as_text
from dispatchq.core.tiers import TIERS
from dispatchq.storage import keys

__all__ = [
    "HISTORY_SECONDS",
    "Point",
    "read_history",
    "record_sample",
    "series",
]

HISTORY = f"{keys.PREFIX}:history"
#: How far back the history goes (and the stream is trimmed to).
HISTORY_SECONDS = 24 * 3600

_COUNTERS = {
    **{f"answered:{tier}": keys.answered_counter(tier) for tier in TIERS},
    "spawned": keys.STATS_SESSIONS_SPAWNED,
    "refused": keys.STATS_SESSIONS_REFUSED,
}


def record_sample(client: redis.Redis, now: float, *, window_closed: bool) -> bool:
    """Sample the counters for the minute `now` falls in; False if that minute has one already."""
    minute = int(now // 60)
    values = client.mget(list(_COUNTERS.values()))
    fields: dict[FieldT, EncodableT] = {name: int(v or 0) for name, v in zip(_COUNTERS, values, strict=True)}
    fields["closed"] = int(window_closed)
    oldest = (minute * 60 - HISTORY_SECONDS) * 1000
    try:
        client.xadd(HISTORY, fields, id=f"{minute * 60000}-0", minid=oldest, approximate=False)
    except redis.ResponseError as error:
        if "equal or smaller" in str(error):
            return False  # another scheduler sampled this minute already
        raise
    return True


@dataclass(frozen=True)
class Point:
    """One sampled minute: its start (epoch seconds) and the counters' values then."""

    at: float
    values: dict[str, int] = field(default_factory=dict)


def read_history(client: redis.Redis, now: float) -> list[Point]:
    """The samples of the last 24 hours, oldest first."""
    since = int((now - HISTORY_SECONDS) * 1000)
    entries = cast(
        "list[tuple[bytes, dict[bytes, bytes]]]", client.xrange(HISTORY, min=f"{since}-0", max="+")
    )
    points = []
    for entry_id, raw in entries or []:
        millis = int(as_text(entry_id).split("-", 1)[0])
        points.append(Point(at=millis / 1000, values={as_text(k): int(v) for k, v in (raw or {}).items()}))
    return points


def series(points: list[Point]) -> list[dict[str, Any]]:
    """Per-minute deltas between consecutive samples; a missing minute is a gap (`None`).

    A counter that went down (a store flushed and started again) counts from zero rather
    than drawing a negative bar.
    """
    out: list[dict[str, Any]] = []
    for before, after in itertools.pairwise(points):
        if after.at - before.at > 60:
            out.append({"at": before.at + 60, "gap": True})
        row: dict[str, Any] = {"at": after.at, "gap": False, "closed": bool(after.values.get("closed"))}
        for name in _COUNTERS:
            now, then = after.values.get(name, 0), before.values.get(name, 0)
            row[name] = now - then if now >= then else now
        out.append(row)
    return out
