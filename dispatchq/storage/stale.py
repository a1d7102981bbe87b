"""Queued batch judgements by last update: a reconciliation pass reads the old ones, not the backlog.

Reconciliation (`queue.scheduler.reconcile`) asks, every recovery interval, which judgements
queued at a batch tier (code, typed) were not updated for a while, and whether their RQ job
still exists. Scanning the whole `queued` status set for that reads every queued record,
session judgements waiting in their lines included, whatever their age. Instead one sorted
set (`keys.QUEUED_BY_UPDATE`) holds the judgements queued at a tier that is not admitted
through a line, id -> the record's `updated`, and a pass reads the range up to its instant:
its cost is the old records, and a backlog of fresh ones, or of session judgements, costs
nothing. Session judgements never enter it (no per-record entry for a waiting backlog).

Kept like the unstarted index (`storage.unstarted`): the scripts that change a record
(`storage.scripts`) end in the live counts' `settle` (`storage.counts`), which calls
`stale_moved` here with the record's facts before and after the change; `ENQUEUE` calls
`stale_many` with the records it makes. A record that is queued at such a tier after a
change is (re-)added at its `updated`; one that was and is no longer leaves. A score below a
record's real `updated` only costs a read (the read checks the record); a score above it
would hide the record, which is why the score is read back from the record after the change.

The read (`find`) checks each entry against its record: one no longer queued at such a tier
(a record moved by a process of an older release, or expired) is dropped, one whose record
was updated later than its score is moved to that time. It pages by rank, resuming after
the last member it kept (its rank read again, so members removed meanwhile before it do not
make it skip any), a chunk per script call, so Redis is never held for a whole backlog. When
that member itself left meanwhile, the next chunk starts at the rank the chunk ended at: a
record may then be passed over by this pass, and is read by a later one while it stays old.

A store written before the index: `backfill` (run with the other upgrades at a worker's, the
scheduler's or `serve`'s start, `queue.upgrade`) adds every queued record at such a tier in
chunks, then marks the store (`keys.QUEUED_BY_UPDATE_INDEXED`); a store with nothing queued
is marked by its first change. Until the mark, `Store.stale` scans the status set (`scan`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from dispatchq.core.text import as_text
from dispatchq.core.tiers import TABLE
from dispatchq.storage import keys
from dispatchq.storage.luashared import JOB_FILTER_LUA, ZADD_ALL_LUA

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

__all__ = [
    "CHUNK",
    "QUEUED_INDEX_LUA",
    "StalePass",
    "backfill",
    "find",
    "indexed",
    "line_tiers",
    "scan",
    "usable",
]

P = keys.PREFIX

#: Index entries one read script looks at (and records it may read).
CHUNK = 1000


def line_tiers() -> tuple[str, ...]:
    """The tiers admitted through a session line: their queued judgements are never indexed."""
    return tuple(r.name for r in TABLE if r.admission == "line")


def _lua_set(names: Iterable[str]) -> str:
    return "{" + ", ".join(f"[{name!r}] = true" for name in names) + "}"


# Prepended to every script that changes a record (through `storage.counts.COUNTS_LUA`).
# `stale_many(by_tier, now)`: records just made, queued at `now` (tier -> ids).
# `stale_moved(rkey, before, after)`: the record's facts (status first, tier second) around a change.
# The tiers left out are those of a line (a throw-away batch tier is kept: in, never wrongly out).
# Needs `luashared.ZADD_ALL_LUA` before it.
QUEUED_INDEX_LUA = (
    """
local QUEUED_INDEX, QUEUED_INDEXED = '$INDEX', '$MARK'
local LINE_TIERS = $LINES
local function batch_queued(f)
  return f[1] == 'queued' and f[2] ~= nil and f[2] ~= false and f[2] ~= '' and not LINE_TIERS[f[2]]
end
-- A store with nothing queued has nothing to backfill: its index starts complete here.
local function ensure_queued_indexed()
  if redis.call('EXISTS', QUEUED_INDEXED) == 1 then return end
  if redis.call('SCARD', '$P:by-status:queued') > 0 then return end
  redis.call('SET', QUEUED_INDEXED, 'fresh')
end
ensure_queued_indexed()
local function stale_many(by_tier, now)
  if not tonumber(now) then return end
  for tier, ids in pairs(by_tier) do
    if batch_queued({'queued', tier}) then zadd_all(QUEUED_INDEX, now, ids) end
  end
end
local function stale_moved(rkey, before, after)
  local id = string.sub(rkey, string.len('$P:j:') + 1)
  if batch_queued(after) then
    local updated = redis.call('HGET', rkey, 'updated')
    if not tonumber(updated) then updated = '0' end
    redis.call('ZADD', QUEUED_INDEX, updated, id)
  elseif batch_queued(before) then
    redis.call('ZREM', QUEUED_INDEX, id)
  end
end
""".replace("$INDEX", keys.QUEUED_BY_UPDATE)
    .replace("$MARK", keys.QUEUED_BY_UPDATE_INDEXED)
    .replace("$LINES", _lua_set(line_tiers()))
    .replace("$P", P)
)

# KEYS: the index. ARGV: the last member kept ('' = from the start), the rank to resume at when
# that member is gone, the status ('queued'), comma-separated tiers, an instant, "*" (one record
# per distinct job) or ",job1,job2," (every record of those jobs), the chunk size.
# Returns: the last member kept ('' = none), the rank after the chunk, 1 when the range is done,
# how many records were read, then flat (id, job) pairs of the records queued at one of the
# tiers and not updated after the instant.
_FIND = (
    ZADD_ALL_LUA
    + JOB_FILTER_LUA
    + QUEUED_INDEX_LUA
    + """
local index = KEYS[1]
local status, before, wanted = ARGV[3], tonumber(ARGV[5]), ARGV[6]
local tiers = ',' .. ARGV[4] .. ','
local chunk = tonumber(ARGV[7])
local start = tonumber(ARGV[2])
if ARGV[1] ~= '' then
  local rank = redis.call('ZRANK', index, ARGV[1])
  if rank then start = rank + 1 end
end
local total = redis.call('ZCOUNT', index, '-inf', ARGV[5])
local items = {}
if start < total then
  items = redis.call('ZRANGE', index, start, math.min(start + chunk, total) - 1, 'WITHSCORES')
end
local found, seen, last, gone, read = {}, {}, '', 0, 0
for i = 1, #items, 2 do
  local id, score = items[i], tonumber(items[i + 1])
  local v = redis.call('HMGET', '$P:j:' .. id, 'status', 'tier', 'updated', 'job')
  read = read + 1
  local updated = tonumber(v[3])
  if not batch_queued(v) then
    redis.call('ZREM', index, id)
    gone = gone + 1
  elseif updated and updated > score then
    redis.call('ZADD', index, v[3], id)  -- updated behind the index's back: its place is later
    gone = gone + 1
  else
    last = id
    if v[1] == status and string.find(tiers, ',' .. v[2] .. ',', 1, true) then
      local job = v[4] or ''
      if kept_job(job, wanted, seen) then
        found[#found + 1] = id
        found[#found + 1] = job
      end
    end
  end
end
local done = 0
if #items < 2 * chunk then done = 1 end
local out = {last, tostring(start + #items / 2 - gone), done, read}
for _, x in ipairs(found) do out[#out + 1] = x end
return out
""".replace("$P", P)
)

# ARGV: ids. Adds each that is queued at a batch tier now, at its `updated`; returns how many were new.
_BACKFILL = (
    ZADD_ALL_LUA
    + QUEUED_INDEX_LUA
    + """
local n = 0
for _, id in ipairs(ARGV) do
  local v = redis.call('HMGET', '$P:j:' .. id, 'status', 'tier', 'updated')
  if batch_queued(v) then
    local updated = v[3]
    if not tonumber(updated) then updated = '0' end
    n = n + redis.call('ZADD', QUEUED_INDEX, updated, id)
  end
end
return n
""".replace("$P", P)
)


@dataclass
class StalePass:
    """What one read of the index found: (id, job or "") pairs, and how many records it read."""

    found: list[tuple[str, str]] = field(default_factory=list)
    read: int = 0


def usable(client: redis.Redis, status: str, tiers: Sequence[str]) -> bool:
    """Can the index answer for `status` at `tiers` (queued, no line tier, the store marked)?"""
    if status != "queued" or set(tiers) & set(line_tiers()):
        return False
    return bool(client.exists(keys.QUEUED_BY_UPDATE_INDEXED))


def find(
    client: redis.Redis,
    status: str,
    tiers: Sequence[str],
    before: float,
    wanted: str,
    *,
    chunk: int = CHUNK,
) -> StalePass:
    """The records in `status` at one of `tiers` not updated after `before`, from the index.

    `wanted` is "*" (one record per distinct job; every record without one) or ",job1,job2,"
    (every record of those jobs), as `Store.stale` passes it. Only the records the index
    places up to `before` are read.
    """
    script = client.register_script(_FIND)
    out = StalePass()
    seen: set[str] = set()
    last, rank = "", "0"
    while True:
        reply: list[Any] = script(
            keys=[keys.QUEUED_BY_UPDATE],
            args=[last, rank, status, ",".join(tiers), repr(before), wanted, str(chunk)],
        )
        last, rank = as_text(reply[0]) or "", as_text(reply[1]) or "0"
        out.read += int(reply[3])
        texts = [as_text(v) or "" for v in reply[4:]]
        for jid, job in zip(texts[0::2], texts[1::2], strict=True):
            if wanted == "*" and job:
                if job in seen:
                    continue
                seen.add(job)
            out.found.append((jid, job))
        if int(reply[2]):
            return out


def scan(script: Script, status: str, tiers: Sequence[str], before: float, wanted: str) -> StalePass:
    """The same answer as `find`, from the whole status set through `script` (`scripts.STALE`,
    registered by the store, a chunk per call): any status, any tier, and a store not yet
    backfilled."""
    out = StalePass()
    seen: set[str] = set()
    cursor = "0"
    while True:
        reply: list[Any] = script(
            keys=[keys.status_index(status)], args=[cursor, status, ",".join(tiers), repr(before), wanted]
        )
        cursor = as_text(reply[0]) or "0"
        texts = [as_text(v) or "" for v in reply[1:]]
        for jid, job in zip(texts[0::2], texts[1::2], strict=True):
            if wanted == "*" and job:
                if job in seen:
                    continue
                seen.add(job)
            out.found.append((jid, job))
        if cursor == "0":
            return out


def backfill(client: redis.Redis) -> int | None:
    """Index every judgement queued at a batch tier, then mark the store; None when it was marked.

    Safe beside running workers and other processes doing the same: each chunk checks its
    records in the script that adds them, a record that changes meanwhile is moved by the
    script that changes it, and ZADD of a member already there at its score changes nothing.
    """
    if client.exists(keys.QUEUED_BY_UPDATE_INDEXED):
        return None
    script = client.register_script(_BACKFILL)
    added = 0
    cursor = 0
    while True:
        cursor, members = client.sscan(keys.status_index("queued"), cursor, count=CHUNK)
        if members:
            added += int(script(args=[as_text(m) for m in members]))
        if int(cursor) == 0:
            break
    client.set(keys.QUEUED_BY_UPDATE_INDEXED, str(added))
    return added


def indexed(client: redis.Redis) -> dict[str, float]:
    """The index as it stands, id -> score (what checks compare with the records)."""
    pairs = cast("list[tuple[bytes, float]]", client.zrange(keys.QUEUED_BY_UPDATE, 0, -1, withscores=True))
    return {as_text(member) or "": float(score) for member, score in pairs}
