"""Judgements not yet started, per tier, by enqueue time: the oldest one's age in O(log n).

`dispatchq_oldest_waiting_age_seconds` asks, per tier, how long the oldest judgement queued
or waiting there has been in the store. Reading the records to find it costs a scan of the
backlog per scrape; instead each tier keeps a sorted set (`keys.unstarted_index`) of its
unstarted judgements, id -> `created`, and the answer is its first member.

Kept separate from the record's encoding: the scripts that change a record
(`storage.scripts`) all end in the live counts' `settle` (`storage.counts`), which calls
`index_moved` here with the record's (status, tier) before and after the change; `ENQUEUE`
calls `index_many` with every record it makes. So a record leaves its tier's index in the same
script that starts, finishes or re-tiers it, and enters it in the one that makes or re-queues
it. The index depends only on a record's `status`, `tier` and `created` fields.

A store written before the index: `backfill` (run with the other upgrades at a worker's, the
scheduler's or `serve`'s start, `queue.upgrade`) adds every queued and waiting record in
chunks of 1,000, one script each, without holding Redis for the whole backlog, then marks
the store (`keys.UNSTARTED_INDEXED`). A store with nothing queued or waiting is marked by
its first change (nothing to add). Until the mark, `oldest_waiting` falls back to the
bounded scan (`storage.histograms.oldest_waiting`, at most `OLDEST_SCAN_LIMIT` records).

The read checks each head against its record and drops the ones that no longer belong (a
record changed by a process of an older release, which keeps no index); at most
`STALE_PER_READ` per tier per read, so a read stays bounded whatever it finds.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

from dispatchq.core.text import as_text
from dispatchq.core.tiers import TIERS
from dispatchq.storage import histograms, keys
from dispatchq.storage.luashared import ZADD_ALL_LUA

if TYPE_CHECKING:
    import redis

__all__ = ["STALE_PER_READ", "UNSTARTED_LUA", "backfill", "indexed", "oldest_waiting"]

P = keys.PREFIX

#: Index entries a read may drop per tier (heads whose record is started, finished or gone).
STALE_PER_READ = 100
_CHUNK = 1000

# Prepended to every script that changes a record (through `storage.counts.COUNTS_LUA`).
# `index_many(by_tier, created)`: records just made, queued (tier -> ids). `index_moved(rkey, before,
# after)`: `before` and `after` are the record's facts (status first, tier second) around a
# change. A record that stays unstarted at the same tier is added again (a no-op when it is
# there), so a record an older release left out joins at its next change. Needs
# `luashared.ZADD_ALL_LUA` before it.
UNSTARTED_LUA = (
    """
local UNSTARTED, INDEXED = '$UNSTARTED', '$INDEXED'
local NOT_STARTED = {queued = true, waiting = true}
-- A store with nothing queued or waiting has nothing to backfill: its index starts complete here.
local function ensure_indexed()
  if redis.call('EXISTS', INDEXED) == 1 then return end
  if redis.call('SCARD', '$P:by-status:queued') > 0 then return end
  if redis.call('SCARD', '$P:by-status:waiting') > 0 then return end
  redis.call('SET', INDEXED, 'fresh')
end
ensure_indexed()
local function index_new(tier, created, id)
  if tier and tier ~= '' and tonumber(created) then redis.call('ZADD', UNSTARTED .. tier, created, id) end
end
-- Many records just made at one instant (ENQUEUE): one ZADD per tier per 500, not one per record.
local function index_many(by_tier, created)
  if not tonumber(created) then return end
  for tier, ids in pairs(by_tier) do
    if tier ~= '' then zadd_all(UNSTARTED .. tier, created, ids) end
  end
end
local function unstarted_tier(f)
  if f[1] and NOT_STARTED[f[1]] and f[2] and f[2] ~= '' then return f[2] end
  return nil
end
local function index_moved(rkey, before, after)
  local was, now = unstarted_tier(before), unstarted_tier(after)
  local id = string.sub(rkey, string.len('$P:j:') + 1)
  if was and was ~= now then redis.call('ZREM', UNSTARTED .. was, id) end
  if now then index_new(now, redis.call('HGET', rkey, 'created'), id) end
end
""".replace("$UNSTARTED", keys.UNSTARTED_INDEX_PREFIX)
    .replace("$INDEXED", keys.UNSTARTED_INDEXED)
    .replace("$P", P)
)

# KEYS: the mark, then each tier's index. ARGV: how many stale heads a tier may drop, then the
# tiers in KEYS' order. Returns {0} before the mark; else {1, then per tier the oldest score
# ('' when none)}. A head whose record is not unstarted at that tier is dropped; past the
# bound, the next head is answered unchecked (an age too old rather than one too young).
_OLDEST = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local bound = tonumber(ARGV[1])
local out = {1}
for i = 2, #KEYS do
  local key, tier = KEYS[i], ARGV[i]
  local found, dropped = '', 0
  while true do
    local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if #head == 0 then break end
    local v = redis.call('HMGET', '$P:j:' .. head[1], 'status', 'tier')
    if ((v[1] == 'queued' or v[1] == 'waiting') and v[2] == tier) or dropped >= bound then
      found = head[2]
      break
    end
    redis.call('ZREM', key, head[1])
    dropped = dropped + 1
  end
  out[i] = found
end
return out
""".replace("$P", P)

# ARGV: ids. Adds each that is queued or waiting now to its tier's index; returns how many were new.
_BACKFILL = (
    ZADD_ALL_LUA
    + UNSTARTED_LUA
    + """
local n = 0
for _, id in ipairs(ARGV) do
  local v = redis.call('HMGET', '$P:j:' .. id, 'status', 'tier', 'created')
  local tier = unstarted_tier(v)
  if tier and tonumber(v[3]) then n = n + redis.call('ZADD', UNSTARTED .. tier, v[3], id) end
end
return n
""".replace("$P", P)
)


def oldest_waiting(client: redis.Redis, now: float | None = None) -> dict[str, float]:
    """Per tier, the age in seconds of the oldest judgement queued or waiting there (0: none).

    One script over the tiers' indexes; before the store is marked indexed, the bounded scan.
    """
    now = time.time() if now is None else now
    script = client.register_script(_OLDEST)
    raw: list[Any] = script(
        keys=[keys.UNSTARTED_INDEXED, *(keys.unstarted_index(t) for t in TIERS)],
        args=[str(STALE_PER_READ), *TIERS],
    )
    if not int(raw[0]):
        return histograms.oldest_waiting(client, now)
    ages: dict[str, float] = {}
    for tier, score in zip(TIERS, raw[1:], strict=True):
        text = as_text(score) or ""
        ages[tier] = max(0.0, now - float(text)) if text else 0.0
    return ages


def backfill(client: redis.Redis) -> int | None:
    """Index every judgement queued or waiting, then mark the store; None when it was marked.

    Safe beside running workers and other processes doing the same: each chunk checks its
    records' status in the script that adds them, a record that changes meanwhile is moved
    by the script that changes it, and ZADD of a member already there changes nothing.
    """
    if client.exists(keys.UNSTARTED_INDEXED):
        return None
    script = client.register_script(_BACKFILL)
    added = 0
    for status in ("queued", "waiting"):
        cursor = 0
        while True:
            cursor, members = client.sscan(keys.status_index(status), cursor, count=_CHUNK)
            if members:
                added += int(script(args=[as_text(m) for m in members]))
            if int(cursor) == 0:
                break
    client.set(keys.UNSTARTED_INDEXED, str(added))
    return added


def indexed(client: redis.Redis, tier: str) -> dict[str, float]:
    """A tier's index as it stands, id -> enqueue time (what checks compare with the records)."""
    pairs = cast(
        "list[tuple[bytes, float]]", client.zrange(keys.unstarted_index(tier), 0, -1, withscores=True)
    )
    return {as_text(member): float(score) for member, score in pairs}
