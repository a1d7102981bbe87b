"""The Lua scripts behind `Store`: every change of a judgement's record is one of these.

Kept apart from `store.py` so that the gateway reads as its named operations, and the
scripts — where atomicity actually lives — can be read together. Each keeps the live
counts (`dispatchq.storage.counts`) in the same call as the change it makes.
"""

from __future__ import annotations

from dispatchq.storage import keys
from dispatchq.storage.counts import COUNTS_LUA
from dispatchq.storage.luashared import JOB_FILTER_LUA

__all__ = [
    "CLAIM",
    "CLEAR_RUNNING",
    "ENQUEUE",
    "LATE_TRAIL",
    "LEGACY_CLAIM",
    "LINE_ADD",
    "LINE_CLAIM",
    "RENEW_CLAIM",
    "SET_FIELDS",
    "STALE",
    "TAKE_OVER",
    "TRANSITION",
    "TRANSITION_MANY",
]

P = keys.PREFIX

#: The claim a holder without a token passes (a session job made before claim tokens existed).
#: It matches only a record that has no claim either, and only once: the transition it allows
#: leaves the claim "-legacy-used", so a second write of that holder is refused.
LEGACY_CLAIM = "-legacy"

# The fencing check a holder's write runs before it changes anything: ARGV[n] is the holder's
# claim ('' = not a holder's write, unchecked). Sets `refused` when the record's claim differs.
_FENCE_LUA = """
local function fenced(rkey, claim)
  if claim == '' then return false end
  local held = redis.call('HGET', rkey, 'claim')
  if claim == '$LEGACY' then return held ~= false end
  return held ~= claim
end
""".replace("$LEGACY", LEGACY_CLAIM)

# A record's member in its session line. Written on the record (`lmember`) only when it is not
# this one (a member put at the front by `LINE_ADD`): the default is derived from the record's
# own seq and id, which saves ~60 bytes on each of a million waiting records.
_LINE_MEMBER_LUA = """
local function line_member(seq, id)
  return string.format('%015d:%s', tonumber(seq) or 0, id)
end
"""

# Where the live judgement with a content key is found (`keys.LIVE_KEYS_PREFIX`), and where a
# judgement id is listed (`keys.directory`): small hashes, each in Redis's compact encoding. A
# content key is a sha256 in hex: 24 of its characters find it (a record found is compared
# with the whole key before it counts as a duplicate).
_BUCKETS_LUA = """
local function live_key(ckey)
  return '$LIVE' .. string.sub(ckey, 1, 4), string.sub(ckey, 5, 24)
end
local function dir_entry(id)
  return '$DIR' .. string.sub(id, 1, 4), string.sub(id, 5)
end
""".replace("$LIVE", keys.LIVE_KEYS_PREFIX).replace("$DIR", keys.DIRECTORY_PREFIX)

#: How many of the newest ids `keys.RECENT` keeps (what `list` and `status` show first).
RECENT_CAP = 10_000

# ARGV: now, then one JSON array of entries, each the 12 fields of `NewRecord` in order
# (one argument rather than 10 per entry: packing arguments costs more than cjson).
# Returns only the duplicates, as flat (1-based position, live id) pairs: the common case
# (everything new) then costs no reply at all. Index writes are batched per call.
ENQUEUE = (
    COUNTS_LUA
    + _LINE_MEMBER_LUA
    + _BUCKETS_LUA
    + """
local now = ARGV[1]
local entries = cjson.decode(ARGV[2])
local ms = string.format('%d', math.floor(tonumber(now) * 1000))
local out, new_ids, keys, tiers, unstarted = {}, {}, {}, {}, {}
local seq = redis.call('INCRBY', '$P:seq', #entries) - #entries
for i = 1, #entries do
  local e = entries[i]
  local id, ckey, force, line = e[1], e[2], e[3], e[4]
  local kkey = '$P:key:' .. ckey
  local lkey, lfield = live_key(ckey)
  local existing = keys[kkey] or redis.call('HGET', lkey, lfield) or redis.call('GET', kkey)
  local dup = false
  if existing and force == '0' then
    local st, held = unpack(redis.call('HMGET', '$P:j:' .. existing, 'status', 'ckey'))
    if st and st ~= 'failed' and st ~= 'cancelled' and (not held or held == ckey) then dup = true end
  end
  if dup then
    table.insert(out, i)
    table.insert(out, existing)
  else
    seq = seq + 1
    -- Only what is not a reader's default is written: every field counts at a million waiting.
    local args = {'seq', seq, 'created', now, 'updated', now, 'status', 'queued', 'ckey', ckey,
                  'in', e[5], 'tier', e[6]}
    if e[7] ~= 'local' then table.insert(args, 'effect'); table.insert(args, e[7]) end
    if e[8] ~= '' then table.insert(args, 'host'); table.insert(args, e[8]) end
    if e[9] ~= '' then table.insert(args, 'job'); table.insert(args, e[9]) end
    if line ~= '' then
      table.insert(args, 'line'); table.insert(args, line)
      redis.call('ZADD', line, (e[12] ~= nil and e[12] ~= '') and e[12] or 0, line_member(seq, id))
    end
    if e[11] ~= nil and e[11] ~= '' then
      table.insert(args, 'urgency'); table.insert(args, e[11])
    end
    redis.call('HSET', '$P:j:' .. id, unpack(args))
    if e[10] ~= '' then redis.call('SADD', e[10], id) end
    redis.call('HSET', lkey, lfield, id)
    keys[kkey] = id
    tiers[e[6]] = (tiers[e[6]] or 0) + 1
    table.insert(new_ids, id)
    local dkey, dfield = dir_entry(id)
    redis.call('HSET', dkey, dfield, ms)
    unstarted[e[6]] = unstarted[e[6]] or {}
    table.insert(unstarted[e[6]], id)
  end
end
for i = 1, #new_ids, 500 do
  local last = math.min(i + 499, #new_ids)
  redis.call('SADD', '$P:by-status:queued', unpack(new_ids, i, last))
  redis.call('LPUSH', '$P:recent', unpack(new_ids, i, last))
end
if #new_ids > 0 then redis.call('LTRIM', '$P:recent', 0, $CAP - 1) end
for tier, n in pairs(tiers) do bump(LIVE, 's:' .. tier .. ':queued', n) end
index_many(unstarted, now)  -- each tier's unstarted index (storage.unstarted)
stale_many(unstarted, now)  -- the queued batch judgements by last update (storage.stale)
return out
""".replace("$P", P).replace("$CAP", str(RECENT_CAP))
)

# Claim judgements for a tier: queued/waiting -> running. ARGV: now, tier, ids...
# Returns, per id, the input JSON and fields a worker needs, or false when not claimable.
CLAIM = (
    COUNTS_LUA
    + """
local now = ARGV[1]
local tier = ARGV[2]
local strict = ARGV[3] == '1'
local out = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local rkey = '$P:j:' .. id
  local f = redis.call('HMGET', rkey, 'status', 'tier', 'in', 'ckey', 'attempts', 'effect', 'priority')
  local st = f[1]
  if st and (st == 'queued' or st == 'waiting' or (st == 'running' and not strict)) and f[2] == tier then
    local before = facts(rkey)
    if st ~= 'running' then
      redis.call('SREM', '$P:by-status:' .. st, id)
      redis.call('SADD', '$P:by-status:running', id)
    end
    redis.call('HSET', rkey, 'status', 'running', 'updated', now, 'claimed', now)
    redis.call('HDEL', rkey, 'reason')
    settle(rkey, before)
    table.insert(out, cjson.encode({id = id, input = f[3], ckey = f[4], attempts = f[5] or '0',
                                    effect = f[6] or 'local', was = st, priority = f[7] or ''}))
  else
    table.insert(out, '')
  end
end
return out
""".replace("$P", P)
)

# Append a trail entry and move a record to a new status. KEYS: record.
# ARGV: now, expect ('' = any unfinished), status, trail_json, ttl ('' = none), answered_tier ('' = none),
#       the holder's claim ('' = unchecked; see `_FENCE_LUA`), then field/value pairs to set.
# Fields whose value is the single char "\\0" are deleted. Returns 1 applied, 0 not in an
# expected status, -1 refused (the writer's claim is not the record's).
TRANSITION = (
    COUNTS_LUA
    + _FENCE_LUA
    + _LINE_MEMBER_LUA
    + _BUCKETS_LUA
    + """
local rkey = KEYS[1]
local now, expect, status, trail_json, ttl, answered = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local cur = redis.call('HGET', rkey, 'status')
if not cur then return 0 end
if expect ~= '' then
  local ok = false
  for s in string.gmatch(expect, '[^,]+') do if s == cur then ok = true end end
  if not ok then return 0 end
end
if fenced(rkey, ARGV[7]) then return -1 end
local id = string.sub(rkey, string.len('$P:j:') + 1)
local before = facts(rkey)
local sets = {'status', status, 'updated', now}
if ARGV[7] == '$LEGACY' then table.insert(sets, 'claim'); table.insert(sets, '$LEGACY-used') end
for i = 8, #ARGV, 2 do
  if ARGV[i+1] == '\\0' then redis.call('HDEL', rkey, ARGV[i])
  else table.insert(sets, ARGV[i]); table.insert(sets, ARGV[i+1]) end
end
if trail_json ~= '' then
  -- Append as text: a cjson round trip would turn [] into {} and big or precise numbers
  -- into 14-digit floats in every earlier entry.
  local trail = redis.call('HGET', rkey, 'trail')
  if not trail or trail == '' or trail == '[]' or trail == '{}' then
    trail = '[' .. trail_json .. ']'
  else
    trail = string.sub(trail, 1, -2) .. ',' .. trail_json .. ']'
  end
  table.insert(sets, 'trail'); table.insert(sets, trail)
end
redis.call('HSET', rkey, unpack(sets))
settle(rkey, before)
if cur ~= status then
  redis.call('SREM', '$P:by-status:' .. cur, id)
  redis.call('SADD', '$P:by-status:' .. status, id)
end
-- A finished judgement's content key leaves the live hash for a string that expires with the
-- record (a duplicate enqueued meanwhile still finds it); one that is unfinished again goes back.
local ckey = redis.call('HGET', rkey, 'ckey')
if ttl ~= '' then
  redis.call('EXPIRE', rkey, tonumber(ttl))
  redis.call('ZADD', '$P:expiring', tonumber(now) + tonumber(ttl), id)
  if ckey then
    local kkey = '$P:key:' .. ckey
    local lkey, lfield = live_key(ckey)
    if redis.call('HGET', lkey, lfield) == id then
      redis.call('HDEL', lkey, lfield)
      redis.call('SET', kkey, id, 'EX', tonumber(ttl))
    elseif redis.call('GET', kkey) == id then
      redis.call('EXPIRE', kkey, tonumber(ttl))
    end
  end
elseif redis.call('PERSIST', rkey) == 1 then
  redis.call('ZREM', '$P:expiring', id)
  if ckey then
    local kkey = '$P:key:' .. ckey
    local lkey, lfield = live_key(ckey)
    if redis.call('GET', kkey) == id then
      if redis.call('HSETNX', lkey, lfield, id) == 1 then redis.call('DEL', kkey)
      else redis.call('PERSIST', kkey) end
    end
  end
end
if answered ~= '' then redis.call('INCR', '$P:stats:answered:' .. answered) end
local line, member, lseq = unpack(redis.call('HMGET', rkey, 'line', 'lmember', 'seq'))
if line and (status ~= 'queued' and status ~= 'waiting') then
  redis.call('ZREM', line, member or line_member(lseq, id))
end
return 1
""".replace("$P", P).replace("$LEGACY", LEGACY_CLAIM)
)

# Move many unfinished records to a status at once, with the same fields (a window closing or
# opening over a whole backlog): one call per chunk, not one per record. No trail, expiry or
# claim: only moves between unfinished statuses. ARGV: now, expect (comma-separated), status,
# the number of field/value pairs, the pairs ("\\0" deletes the field), then the ids.
# Returns how many moved.
TRANSITION_MANY = (
    COUNTS_LUA
    + """
local now, expect, status = ARGV[1], ',' .. ARGV[2] .. ',', ARGV[3]
local nf = tonumber(ARGV[4])
local sets, drops = {'status', status, 'updated', now}, {}
for i = 5, 4 + 2 * nf, 2 do
  if ARGV[i + 1] == '\\0' then table.insert(drops, ARGV[i])
  else table.insert(sets, ARGV[i]); table.insert(sets, ARGV[i + 1]) end
end
local moved = 0
for i = 5 + 2 * nf, #ARGV do
  local id = ARGV[i]
  local rkey = '$P:j:' .. id
  local cur = redis.call('HGET', rkey, 'status')
  if cur and string.find(expect, ',' .. cur .. ',', 1, true) then
    local before = facts(rkey)
    if #drops > 0 then redis.call('HDEL', rkey, unpack(drops)) end
    redis.call('HSET', rkey, unpack(sets))
    settle(rkey, before)
    if cur ~= status then
      redis.call('SREM', '$P:by-status:' .. cur, id)
      redis.call('SADD', '$P:by-status:' .. status, id)
    end
    moved = moved + 1
  end
end
return moved
""".replace("$P", P)
)

# Take a judgement out of a session line and mark it running, only if it is still there
# and still waiting (a cancelled one is not claimed), under a fresh claim token with its lease.
# KEYS: line, record, lease. ARGV: member, now, claim token, lease in ms.
# KEYS: a status index. ARGV: SSCAN cursor, the status, comma-separated tiers, an instant, and "*" (one
# record per distinct job) or ",job1,job2," (every record of those jobs; ",," for none).
# Returns the next cursor, then flat (id, job) pairs of the records in that status and
# tier not updated after the instant.
STALE = (
    JOB_FILTER_LUA
    + """
local scan = redis.call('SSCAN', KEYS[1], ARGV[1], 'COUNT', 1000)
local status = ARGV[2]
local tiers = ',' .. ARGV[3] .. ','
local before = tonumber(ARGV[4])
local wanted = ARGV[5]
local out, seen = {scan[1]}, {}
for _, id in ipairs(scan[2]) do
  local v = redis.call('HMGET', '$P:j:' .. id, 'status', 'tier', 'updated', 'job')
  if v[1] == status and v[2] and string.find(tiers, ',' .. v[2] .. ',', 1, true) then
    local updated = v[3] and tonumber(v[3])
    local job = v[4] or ''
    if not updated or updated <= before then
      if kept_job(job, wanted, seen) then
        out[#out + 1] = id
        out[#out + 1] = job
      end
    end
  end
end
return out
""".replace("$P", P)
)

LINE_CLAIM = (
    COUNTS_LUA
    + """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
local st = redis.call('HGET', KEYS[2], 'status')
if not st or (st ~= 'queued' and st ~= 'waiting') then return 0 end
local id = string.sub(KEYS[2], string.len('$P:j:') + 1)
local before = facts(KEYS[2])
redis.call('SREM', '$P:by-status:' .. st, id)
redis.call('SADD', '$P:by-status:running', id)
redis.call('HSET', KEYS[2], 'status', 'running', 'updated', ARGV[2], 'claimed', ARGV[2], 'claim', ARGV[3])
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
redis.call('HDEL', KEYS[2], 'reason')
settle(KEYS[2], before)
return 1
""".replace("$P", P)
)

# A holder renews its claim's lease. KEYS: record, lease. ARGV: claim, lease in ms.
# Only while the record is still running under that claim: a lease that lapsed unnoticed is
# taken again if nobody took the judgement over (`TAKE_OVER` changes the claim). 1 renewed, 0 gone.
RENEW_CLAIM = """
if redis.call('HGET', KEYS[1], 'claim') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', tonumber(ARGV[2]))
return 1
"""

# Another holder takes a running judgement from a holder that lost contact. KEYS: record, lease.
# ARGV: the claim seen ('' = whatever claim it has). 1: taken (the claim is now a tombstone,
# so the old holder's writes are refused), 0: not running under that claim, -1: its lease lives.
TAKE_OVER = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
local held = redis.call('HGET', KEYS[1], 'claim')
if ARGV[1] ~= '' and held ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
redis.call('HSET', KEYS[1], 'claim', '-lost:' .. (held or ''))
return 1
"""

# A late answer (replayed from a spool after its claim was gone) on the trail, once.
# KEYS: record. ARGV: the claim, the trail entry JSON. Skipped when that claim settled the
# record itself (the answer did land, its reply was lost) or the entry is there already.
LATE_TRAIL = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], 'settled_by') == ARGV[1] then return 0 end
if redis.call('HSETNX', KEYS[1], 'late:' .. ARGV[1], '1') == 0 then return 0 end
local trail = redis.call('HGET', KEYS[1], 'trail')
if not trail or trail == '' or trail == '[]' or trail == '{}' then
  trail = '[' .. ARGV[2] .. ']'
else
  trail = string.sub(trail, 1, -2) .. ',' .. ARGV[2] .. ']'
end
redis.call('HSET', KEYS[1], 'trail', trail)
return 1
"""

# Forget a judgement's running-here entry, only the holder's own. KEYS: the running hash.
# ARGV: id, claim ('' = whoever's). A holder back from a partition must not erase the entry
# of the host that took its judgement over.
CLEAR_RUNNING = """
if ARGV[2] ~= '' then
  local raw = redis.call('HGET', KEYS[1], ARGV[1])
  if raw then
    local ok, info = pcall(cjson.decode, raw)
    if ok and type(info) == 'table' and info.claim ~= nil and info.claim ~= ARGV[2] then return 0 end
  end
end
return redis.call('HDEL', KEYS[1], ARGV[1])
"""

# Put a record in a session line (escalation, refusal at spawn, re-queue after a cut).
# KEYS: record, line. ARGV: front ('1' puts it ahead of everything at its score), its class
# ('' = the record's own `urgency` field, none = normal), then (class, score) pairs: the
# score the record takes in each class, computed by the caller (`core.priority.line_score`).
# Members at one score sort bytewise: '-' sorts before every digit, so front members go first
# and keep FIFO among themselves (several sessions refused at once keep their order).
LINE_ADD = (
    _LINE_MEMBER_LUA
    + """
local rkey, line = KEYS[1], KEYS[2]
local class = ARGV[2]
if class == '' then class = redis.call('HGET', rkey, 'urgency') or 'normal' end
local scores = {}
for i = 3, #ARGV, 2 do scores[ARGV[i]] = ARGV[i + 1] end
local score = scores[class] or scores['normal']
local id = string.sub(rkey, string.len('$P:j:') + 1)
local seq = redis.call('HGET', rkey, 'seq') or '0'
local member
if ARGV[1] == '1' then member = string.format('-%014d:%s', tonumber(seq), id)
else member = line_member(seq, id) end
local old_line, old = unpack(redis.call('HMGET', rkey, 'line', 'lmember'))
if old_line then redis.call('ZREM', old_line, old or line_member(seq, id)) end
redis.call('ZADD', line, score, member)
if member == line_member(seq, id) then
  redis.call('HSET', rkey, 'line', line)
  redis.call('HDEL', rkey, 'lmember')
else
  redis.call('HSET', rkey, 'line', line, 'lmember', member)
end
return member
""".replace("$P", P)
)


# Set fields (those the live counts depend on move them). KEYS: record. ARGV: the holder's claim
# ('' = unchecked), then pairs. 1 set, 0 no record, -1 refused (the claim is not the record's).
SET_FIELDS = (
    COUNTS_LUA
    + _FENCE_LUA
    + """
local rkey = KEYS[1]
if redis.call('EXISTS', rkey) == 0 then return 0 end
if fenced(rkey, ARGV[1]) then return -1 end
local before = facts(rkey)
redis.call('HSET', rkey, unpack(ARGV, 2))
settle(rkey, before)
return 1
""".replace("$P", P)
)
