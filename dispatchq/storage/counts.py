"""The live counts' Lua, shared by the store's scripts (`dispatchq.storage.store`).

`status` reads counts instead of records: unfinished judgements per tier and status and
waiting ones per reason class (`keys.STATS_LIVE`), waiting ones per reason text
(`keys.STATS_WAITING_REASONS`), and finished ones ever (`keys.STATS_FINISHED`). Every script
that changes a record prepends `COUNTS_LUA` and moves the counts in the same script as the
change, so they are exact whenever a script is not running; `RECOUNT_LUA` rebuilds them
from the records once, for a store written before they existed.
"""

from __future__ import annotations

from dispatchq.storage import keys
from dispatchq.storage.luashared import ZADD_ALL_LUA
from dispatchq.storage.stale import QUEUED_INDEX_LUA
from dispatchq.storage.unstarted import UNSTARTED_LUA

__all__ = ["COUNTS_LUA", "RECOUNT_LUA"]

P = keys.PREFIX

# Shared by every script that changes a record: the live counts `status` reads instead of
# the records (`keys.STATS_LIVE`, `keys.STATS_WAITING_REASONS`), moved in the same script as
# the change. `facts` before and `settle` after: what the record counted as, and counts as now.
# A waiting record carries its reason's class (`wclass`, written by the caller with the
# reason); no other record does. `settle` moves the record in the unstarted index too
# (`storage.unstarted`, whose Lua comes first), and in the index by last update (`storage.stale`).
COUNTS_LUA = (
    ZADD_ALL_LUA
    + UNSTARTED_LUA
    + QUEUED_INDEX_LUA
    + (
        """
local LIVE, REASONS, FINISHED = '$LIVE', '$REASONS', '$FINISHED'
local UNFINISHED = {queued = true, running = true, waiting = true}
local function bump(h, f, n)
  if n ~= 0 and redis.call('HINCRBY', h, f, n) <= 0 then redis.call('HDEL', h, f) end
end
-- A store with no unfinished record yet needs no rebuild: its counts start here, built.
local function ensure_built()
  if redis.call('EXISTS', LIVE) == 1 then return end
  for _, st in ipairs({'queued', 'running', 'waiting'}) do
    if redis.call('SCARD', '$P:by-status:' .. st) > 0 then return end
  end
  redis.call('HSET', LIVE, 'built', 'fresh')
end
ensure_built()
local function facts(rkey)
  return redis.call('HMGET', rkey, 'status', 'tier', 'wclass', 'reason')
end
local function count(f, n)
  local st = f[1]
  if not st or not UNFINISHED[st] then return end
  bump(LIVE, 's:' .. (f[2] or '') .. ':' .. st, n)
  if st == 'waiting' then
    bump(LIVE, 'c:' .. (f[3] or 'other'), n)
    local r = f[4]
    if not r or r == '' then r = 'unknown' end
    bump(REASONS, r, n)
  end
end
local function settle(rkey, before)
  local st = redis.call('HGET', rkey, 'status')
  if st == 'waiting' then redis.call('HSETNX', rkey, 'wclass', 'other')
  elseif st then redis.call('HDEL', rkey, 'wclass') end
  local after = facts(rkey)
  index_moved(rkey, before, after)
  stale_moved(rkey, before, after)  -- the index by last update (storage.stale)
  if before[1] ~= after[1] or before[2] ~= after[2] or before[3] ~= after[3] or before[4] ~= after[4] then
    count(before, -1)
    count(after, 1)
    if after[1] and not UNFINISHED[after[1]] and after[1] ~= before[1] then
      redis.call('HINCRBY', FINISHED, (after[2] or '') .. ':' .. after[1], 1)
    end
  end
end
""".replace("$P", P)
        .replace("$LIVE", keys.STATS_LIVE)
        .replace("$REASONS", keys.STATS_WAITING_REASONS)
        .replace("$FINISHED", keys.STATS_FINISHED)
    )
)

# Rebuild the live counts from the records (once, when they are missing: a store written
# before they existed). Atomic, so no change is counted twice or lost. ARGV: JSON object
# reason -> class for waiting records that carry no class yet, now, force ('1': a reason
# missing from the object counts as `other`). Returns {1, records counted}, or {0, JSON of
# the reasons missing from the object} (a record changed between the caller's read and this).
RECOUNT_LUA = (
    COUNTS_LUA
    + """
local classes = cjson.decode(ARGV[1])
local force = ARGV[3] == '1'
local live, reasons, missing, seen = {}, {}, {}, {}
local n = 0
for _, st in ipairs({'queued', 'running', 'waiting'}) do
  local ids = redis.call('SMEMBERS', '$P:by-status:' .. st)
  for _, id in ipairs(ids) do
    local rkey = '$P:j:' .. id
    local f = redis.call('HMGET', rkey, 'status', 'tier', 'wclass', 'reason')
    if f[1] == st then
      n = n + 1
      local k = 's:' .. (f[2] or '') .. ':' .. st
      live[k] = (live[k] or 0) + 1
      if st == 'waiting' then
        local c = f[3]
        if not c then
          c = classes[f[4] or ''] or (force and 'other') or nil
          if c then
            redis.call('HSET', rkey, 'wclass', c)
          elseif not seen[f[4] or ''] then
            seen[f[4] or ''] = true
            table.insert(missing, f[4] or '')
          end
        end
        if c then live['c:' .. c] = (live['c:' .. c] or 0) + 1 end
        local r = f[4]
        if not r or r == '' then r = 'unknown' end
        reasons[r] = (reasons[r] or 0) + 1
      end
    end
  end
end
if #missing > 0 then return {0, cjson.encode(missing)} end
redis.call('DEL', LIVE, REASONS)
local flat = {'built', ARGV[2]}
for k, v in pairs(live) do table.insert(flat, k); table.insert(flat, v) end
redis.call('HSET', LIVE, unpack(flat))
flat = {}
for r, v in pairs(reasons) do
  table.insert(flat, r); table.insert(flat, v)
  if #flat >= 1000 then redis.call('HSET', REASONS, unpack(flat)); flat = {} end
end
if #flat > 0 then redis.call('HSET', REASONS, unpack(flat)) end
return {1, n}
""".replace("$P", P)
)
