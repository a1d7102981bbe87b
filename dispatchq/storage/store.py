"""dispatchq's own records of judgements, in Redis.

Every state change is one Lua script, so a record, its status index and its
idempotency key never disagree, and a change can ride in the same MULTI as the RQ
enqueue that hands the judgement to its next tier: either both happen or neither,
so no judgement is ever recorded as queued with nothing queued to run it.

Batch forms exist for the hot paths (enqueue, claim) because RQ jobs carry many
judgement ids and one round trip per judgement would cost more than RQ itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis
from redis.client import Pipeline

from dispatchq import keys
from dispatchq.core.judgement import FINISHED, STATUSES, TIERS, Record, TrailEntry
from dispatchq.core.text import as_text

__all__ = [
    "Claimed",
    "NewRecord",
    "P",
    "Store",
]

P = keys.PREFIX

# ARGV: now, then one JSON array of entries, each the 10 fields of `NewRecord` in order
# (one argument rather than 10 per entry: packing arguments costs more than cjson).
# Returns only the duplicates, as flat (1-based position, live id) pairs: the common case
# (everything new) then costs no reply at all. Index writes are batched per call.
_ENQUEUE = """
local now = ARGV[1]
local entries = cjson.decode(ARGV[2])
local out, new_ids, scored, keys = {}, {}, {}, {}
local seq = redis.call('INCRBY', '$P:seq', #entries) - #entries
for i = 1, #entries do
  local e = entries[i]
  local id, ckey, force, line = e[1], e[2], e[3], e[4]
  local kkey = '$P:key:' .. ckey
  local existing = keys[kkey] or redis.call('GET', kkey)
  local dup = false
  if existing and force == '0' then
    local st = redis.call('HGET', '$P:j:' .. existing, 'status')
    if st and st ~= 'failed' and st ~= 'cancelled' then dup = true end
  end
  if dup then
    table.insert(out, i)
    table.insert(out, existing)
  else
    seq = seq + 1
    local args = {'seq', seq, 'created', now, 'updated', now, 'status', 'queued', 'ckey', ckey, 'trail', '[]',
                  'in', e[5], 'tier', e[6], 'effect', e[7], 'host', e[8], 'job', e[9]}
    if line ~= '' then
      local member = string.format('%015d:%s', seq, id)
      table.insert(args, 'line'); table.insert(args, line)
      table.insert(args, 'lmember'); table.insert(args, member)
      redis.call('ZADD', line, 0, member)
    end
    redis.call('HSET', '$P:j:' .. id, unpack(args))
    if e[10] ~= '' then redis.call('SADD', e[10], id) end
    redis.call('SET', kkey, id)
    keys[kkey] = id
    table.insert(new_ids, id)
    table.insert(scored, now)
    table.insert(scored, id)
  end
end
for i = 1, #new_ids, 500 do
  local last = math.min(i + 499, #new_ids)
  redis.call('SADD', '$P:by-status:queued', unpack(new_ids, i, last))
  redis.call('ZADD', '$P:ids', unpack(scored, 2 * i - 1, 2 * last))
end
return out
""".replace("$P", P)

# Claim judgements for a tier: queued/waiting -> running. ARGV: now, tier, ids...
# Returns, per id, the input JSON and fields a worker needs, or false when not claimable.
_CLAIM = """
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
    if st ~= 'running' then
      redis.call('SREM', '$P:by-status:' .. st, id)
      redis.call('SADD', '$P:by-status:running', id)
    end
    redis.call('HSET', rkey, 'status', 'running', 'updated', now, 'claimed', now)
    redis.call('HDEL', rkey, 'reason')
    table.insert(out, cjson.encode({id = id, input = f[3], ckey = f[4], attempts = f[5] or '0',
                                    effect = f[6] or 'local', was = st, priority = f[7] or ''}))
  else
    table.insert(out, '')
  end
end
return out
""".replace("$P", P)

# Append a trail entry and move a record to a new status. KEYS: record.
# ARGV: now, expect ('' = any unfinished), status, trail_json, ttl ('' = none), answered_tier ('' = none),
#       then field/value pairs to set. Fields whose value is the single char "\\0" are deleted.
_TRANSITION = """
local rkey = KEYS[1]
local now, expect, status, trail_json, ttl, answered = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local cur = redis.call('HGET', rkey, 'status')
if not cur then return 0 end
if expect ~= '' then
  local ok = false
  for s in string.gmatch(expect, '[^,]+') do if s == cur then ok = true end end
  if not ok then return 0 end
end
local id = string.sub(rkey, string.len('$P:j:') + 1)
local sets = {'status', status, 'updated', now}
for i = 7, #ARGV, 2 do
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
if cur ~= status then
  redis.call('SREM', '$P:by-status:' .. cur, id)
  redis.call('SADD', '$P:by-status:' .. status, id)
end
local ckey = redis.call('HGET', rkey, 'ckey')
if ttl ~= '' then
  redis.call('EXPIRE', rkey, tonumber(ttl))
  if ckey then
    local kkey = '$P:key:' .. ckey
    if redis.call('GET', kkey) == id then redis.call('EXPIRE', kkey, tonumber(ttl)) end
  end
else
  redis.call('PERSIST', rkey)
  if ckey then
    local kkey = '$P:key:' .. ckey
    if redis.call('GET', kkey) == id then redis.call('PERSIST', kkey) end
  end
end
if answered ~= '' then redis.call('INCR', '$P:stats:answered:' .. answered) end
local line, member = unpack(redis.call('HMGET', rkey, 'line', 'lmember'))
if line and member and (status ~= 'queued' and status ~= 'waiting') then
  redis.call('ZREM', line, member)
end
return 1
""".replace("$P", P)

# Take a judgement out of a session line and mark it running, only if it is still there
# and still waiting (a cancelled one is not claimed). KEYS: line, record. ARGV: member, now.
# KEYS: a status index. ARGV: SSCAN cursor, the status, comma-separated tiers, an instant, and "*" (one
# record per distinct job) or ",job1,job2," (every record of those jobs; ",," for none).
# Returns the next cursor, then flat (id, job) pairs of the records in that status and
# tier not updated after the instant.
_STALE = """
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
      local keep
      if wanted == '*' then
        keep = job == '' or not seen[job]
        seen[job] = true
      else
        keep = string.find(wanted, ',' .. job .. ',', 1, true) ~= nil
      end
      if keep then
        out[#out + 1] = id
        out[#out + 1] = job
      end
    end
  end
end
return out
""".replace("$P", P)

_LINE_CLAIM = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
local st = redis.call('HGET', KEYS[2], 'status')
if not st or (st ~= 'queued' and st ~= 'waiting') then return 0 end
local id = string.sub(KEYS[2], string.len('$P:j:') + 1)
redis.call('SREM', '$P:by-status:' .. st, id)
redis.call('SADD', '$P:by-status:running', id)
redis.call('HSET', KEYS[2], 'status', 'running', 'updated', ARGV[2], 'claimed', ARGV[2])
redis.call('HDEL', KEYS[2], 'reason')
return 1
""".replace("$P", P)

# Put a record in a session line (escalation, refusal at spawn, re-queue after a cut).
# KEYS: record, line. ARGV: score, front ('1' puts it ahead of everything at its priority).
# Members at one score sort bytewise: '-' sorts before every digit, so front members go first
# and keep FIFO among themselves (several sessions refused at once keep their order).
_LINE_ADD = """
local rkey, line = KEYS[1], KEYS[2]
local id = string.sub(rkey, string.len('$P:j:') + 1)
local seq = redis.call('HGET', rkey, 'seq') or '0'
local member
if ARGV[2] == '1' then member = string.format('-%014d:%s', tonumber(seq), id)
else member = string.format('%015d:%s', tonumber(seq), id) end
local old_line, old = unpack(redis.call('HMGET', rkey, 'line', 'lmember'))
if old_line and old then redis.call('ZREM', old_line, old) end
redis.call('ZADD', line, tonumber(ARGV[1]), member)
redis.call('HSET', rkey, 'line', line, 'lmember', member)
return member
""".replace("$P", P)


class NewRecord(NamedTuple):
    """A judgement's record as written at enqueue (all strings: they go straight to Lua)."""

    id: str
    content_key: str
    force: str  # "1" re-judges even when a live duplicate exists
    line: str  # the session line to join, or ""
    input: str  # the judgement as JSON
    tier: str
    effect: str
    host: str  # "" when not bound to a host
    job: str  # the RQ job that will run it, or ""
    group: str  # the typed tier's same-state set to join, or ""


@dataclass(frozen=True)
class Claimed:
    """A judgement a worker now holds (status running)."""

    id: str
    input: dict[str, Any]
    content_key: str
    attempts: int
    effect: str
    was: str
    priority: float | None


class Store:
    """Typed access to judgement records. Takes a client; knows nothing of settings."""

    def __init__(self, client: redis.Redis, *, result_ttl: int = 7 * 86_400) -> None:
        self.redis = client
        self.result_ttl = result_ttl
        self._enqueue = client.register_script(_ENQUEUE)
        self._claim = client.register_script(_CLAIM)
        self._transition = client.register_script(_TRANSITION)
        self._line_add = client.register_script(_LINE_ADD)
        self._line_claim = client.register_script(_LINE_CLAIM)
        self._stale = client.register_script(_STALE)

    # --- writes --------------------------------------------------------------------------
    def create_many(
        self, entries: Sequence[NewRecord], *, pipe: Pipeline | None = None
    ) -> list[tuple[str, bool]] | None:
        """Create records, or find the live duplicate of each.

        Returns (id, created) per entry: a duplicate returns the live judgement's id and
        False. With `pipe`, the call is queued on it and the caller reads the result.
        """
        args = [repr(time.time()), json.dumps(entries, separators=(",", ":"), ensure_ascii=False)]
        if pipe is not None:
            self._enqueue(args=args, client=pipe)
            return None
        return self.parse_created(self._enqueue(args=args), entries)

    @staticmethod
    def parse_created(raw: list[Any], entries: Sequence[NewRecord]) -> list[tuple[str, bool]]:
        """(id, created) per entry, from the script's list of duplicates."""
        duplicates = {int(raw[i]) - 1: as_text(raw[i + 1]) for i in range(0, len(raw), 2)}
        return [
            (duplicates[i], False) if i in duplicates else (entry.id, True) for i, entry in enumerate(entries)
        ]

    def claim(self, ids: Sequence[str], tier: str, *, strict: bool = False) -> list[Claimed]:
        """Mark the claimable ones running.

        An RQ job's own ids may already be `running` (a retried job whose worker died)
        and are taken back; with `strict`, only queued or waiting ones are taken (for
        judgements another job might be running right now).
        """
        if not ids:
            return []
        raw = self._claim(args=[repr(time.time()), tier, "1" if strict else "0", *ids])
        out = []
        for item in raw:
            if not item:
                continue
            data = json.loads(item)
            priority = data.get("priority")
            out.append(
                Claimed(
                    id=data["id"],
                    input=json.loads(data["input"]),
                    content_key=data["ckey"],
                    attempts=int(data.get("attempts") or 0),
                    effect=data.get("effect") or "local",
                    was=data["was"],
                    priority=float(priority) if priority not in (None, "") else None,
                )
            )
        return out

    def transition(
        self,
        jid: str,
        status: str,
        *,
        expect: Iterable[str] = (),
        trail: TrailEntry | None = None,
        fields: dict[str, Any] | None = None,
        delete: Iterable[str] = (),
        pipe: Pipeline | None = None,
    ) -> bool | None:
        """Move a record to `status` if it is in one of `expect` (any unfinished if empty)."""
        if not expect:
            expect = [s for s in STATUSES if s not in FINISHED]
        finished = status in FINISHED
        answered_tier = ""
        flat: list[str] = []
        for name, value in (fields or {}).items():
            flat += [name, _encode_field(name, value)]
            if name == "tier" and status == "answered":
                answered_tier = str(value)
        for name in delete:
            flat += [name, "\0"]
        args = [
            repr(time.time()),
            ",".join(expect),
            status,
            trail.model_dump_json() if trail else "",
            str(self.result_ttl) if finished else "",
            answered_tier,
            *flat,
        ]
        if pipe is not None:
            self._transition(keys=[keys.record(jid)], args=args, client=pipe)
            return None
        return bool(self._transition(keys=[keys.record(jid)], args=args))

    def add_to_line(
        self,
        jid: str,
        line: str,
        priority: float | None,
        *,
        front: bool = False,
        pipe: Pipeline | None = None,
    ) -> None:
        """Place a record in a session line: higher priority first, then FIFO (or front)."""
        score = -(priority or 0.0)
        client = pipe if pipe is not None else None
        self._line_add(
            keys=[keys.record(jid), line], args=[repr(score), "1" if front else "0"], client=client
        )

    def claim_from_line(self, line: str, member: str, jid: str) -> bool:
        """Admit one judgement from a session line: out of the line and running, atomically."""
        return bool(self._line_claim(keys=[line, keys.record(jid)], args=[member, repr(time.time())]))

    def set_fields(self, jid: str, **fields: Any) -> None:
        self.redis.hset(keys.record(jid), mapping={k: _encode_field(k, v) for k, v in fields.items()})

    def incr_attempts(self, jid: str) -> int:
        return int(self.redis.hincrby(keys.record(jid), "attempts", 1))

    def add_death(self, jid: str) -> int:
        """Count one more worker death on a judgement's record (atomic); returns the new count.

        Counted here rather than by RQ's `retries_left`, which RQ also spends on failures
        that were not deaths: the record is what decides when to stop retrying.
        """
        return int(self.redis.hincrby(keys.record(jid), "deaths", 1))

    def add_shutdown(self, jid: str) -> int:
        """Count one more session ended by a shutdown signal its worker never got (atomic)."""
        return int(self.redis.hincrby(keys.record(jid), "shutdowns", 1))

    @staticmethod
    def watch_record(pipe: Pipeline, jid: str) -> tuple[str | None, str | None]:
        """WATCH a record on `pipe` (before its MULTI) and read its (status, job) now.

        A caller that decided from an earlier read (reconciliation: "its job is gone") acts
        only if the record is still as it saw it: a change in between fails the MULTI.
        """
        pipe.watch(keys.record(jid))
        status, job = pipe.hmget(keys.record(jid), "status", "job")
        return (as_text(status) if status is not None else None, as_text(job) if job else None)

    def forget_deaths(self, jid: str) -> None:
        """A retry asked for by a person starts the count of worker deaths again."""
        self.redis.hdel(keys.record(jid), "deaths", "shutdowns")

    def take_reconcile_turn(self, holder: str, ttl: float) -> bool:
        """True for the one process (of all workers and the scheduler) that reconciles now.

        Reconciliation reads every queued record; run by each of N processes at every
        maintenance round it would cost N times that for nothing.
        """
        return bool(self.redis.set(keys.RECONCILE_TURN, holder, nx=True, px=max(1, int(ttl * 1000))))

    def accepts_writes(self) -> bool:
        """False while a `noeviction` server refuses writes (maxmemory reached); else True.

        A worker that met the limit waits on this rather than restarting its loop (and
        logging a traceback) every few seconds until an operator makes room.
        """
        try:
            self.redis.set(keys.WRITE_PROBE, "1", ex=10)
        except redis.ResponseError as error:
            if str(error).startswith("OOM") or isinstance(error, redis.OutOfMemoryError):
                return False
            raise
        return True

    # --- reads ------------------------------------------------------------------------------
    def get(self, jid: str) -> Record | None:
        raw = self.redis.hgetall(keys.record(jid))
        return _record(jid, raw) if raw else None

    def get_many(self, ids: Sequence[str]) -> list[Record | None]:
        pipe = self.redis.pipeline(transaction=False)
        for jid in ids:
            pipe.hgetall(keys.record(jid))
        return [(_record(jid, raw) if raw else None) for jid, raw in zip(ids, pipe.execute(), strict=True)]

    def stale(
        self, status: str, tiers: Sequence[str], before: float, *, jobs: Iterable[str] | None = None
    ) -> list[tuple[str, str]]:
        """Reconciliation's candidates: (id, RQ job id or "") of the records in `status` at
        one of `tiers` not updated after `before`.

        With `jobs=None`, one record per distinct job (every record without one): what to
        ask RQ about. With `jobs`, every such record of those jobs ("" for none): what to put
        back. Filtered in Redis, a chunk of the status index per call, so a pass over a
        backlog of 10,000 queued records costs about one reply per job, not 10,000 replies
        (or whole records with their trails) every interval.
        """
        if jobs is not None:
            jobs = list(jobs)
            if not jobs:
                return []
        wanted = "*" if jobs is None else "," + ",".join(jobs) + ","
        seen: set[str] = set()
        out: list[tuple[str, str]] = []
        cursor = "0"
        while True:
            reply = self._stale(
                keys=[keys.status_index(status)], args=[cursor, status, ",".join(tiers), repr(before), wanted]
            )
            cursor = as_text(reply[0])
            texts = _texts(reply[1:])
            for jid, job in zip(texts[0::2], texts[1::2], strict=True):
                if jobs is None and job:
                    if job in seen:
                        continue
                    seen.add(job)
                out.append((jid, job))
            if cursor == "0":
                return out

    def statuses(self, ids: Sequence[str]) -> list[str | None]:
        pipe = self.redis.pipeline(transaction=False)
        for jid in ids:
            pipe.hget(keys.record(jid), "status")
        return [as_text(v) if v is not None else None for v in pipe.execute()]

    def ids(self, status: str | None = None) -> list[str]:
        if status is not None:
            return sorted(_texts(self.redis.smembers(keys.status_index(status))))
        return _texts(self.redis.zrange(keys.ALL_IDS, 0, -1))

    def count(self, status: str) -> int:
        return int(self.redis.scard(keys.status_index(status)))

    def answered_counts(self) -> dict[str, int]:
        values = self.redis.mget([keys.answered_counter(t) for t in TIERS])
        return {t: int(v or 0) for t, v in zip(TIERS, values, strict=True)}

    def line_depth(self, lines: Sequence[str]) -> int:
        """How many judgements wait in these session lines."""
        return sum(int(self.redis.zcard(line)) for line in lines)

    def server_facts(self) -> dict[str, Any]:
        """What `status` shows of the server in effect: version, fsync mode, memory.

        Read from the server itself, not from the settings: a server started by another
        process, or configured by hand, is what the data's durability depends on.
        """
        server = self.redis.info("server")
        memory = self.redis.info("memory")
        fsync = self.redis.config_get("appendfsync").get("appendfsync")
        return {
            "redis_version": server.get("redis_version"),
            "redis_appendfsync": as_text(fsync) if fsync is not None else None,
            "redis_used_memory": int(memory.get("used_memory") or 0),
            "redis_maxmemory": int(memory.get("maxmemory") or 0),
        }

    def publish_worker(self, name: str, info: Mapping[str, Any], ttl: float) -> None:
        """A worker's own account of itself, kept while its heartbeat is (`status` reads it)."""
        now = time.time()
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(
            keys.worker_info(name), json.dumps({**info, "name": name, "heartbeat": now}), ex=int(ttl) + 1
        )
        pipe.zadd(keys.WORKERS, {name: now})
        pipe.execute()

    def forget_worker(self, name: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(keys.worker_info(name))
        pipe.zrem(keys.WORKERS, name)
        pipe.execute()

    def live_workers(self, ttl: float) -> list[dict[str, Any]]:
        """Workers whose heartbeat is younger than `ttl`; older entries are dropped."""
        now = time.time()
        self.redis.zremrangebyscore(keys.WORKERS, "-inf", now - ttl)
        names = _texts(self.redis.zrange(keys.WORKERS, 0, -1))
        if not names:
            return []
        values = self.redis.mget([keys.worker_info(n) for n in names])
        return [json.loads(v) for v in values if v]

    def typed_keyless_host(self) -> str | None:
        """The host whose typed worker last said it runs without a TypeSafe key, if any."""
        return as_text(self.redis.get(keys.TYPED_KEYLESS))

    def line_ids(self, line: str) -> list[str]:
        return [m.split(":", 1)[1] for m in _texts(self.redis.zrange(line, 0, -1))]

    def prune(self) -> int:
        """Drop index entries whose record has expired; return how many were dropped."""
        dropped = 0
        all_ids = self.ids()
        for start in range(0, len(all_ids), 1000):
            chunk = all_ids[start : start + 1000]
            pipe = self.redis.pipeline(transaction=False)
            for jid in chunk:
                pipe.exists(keys.record(jid))
            gone = [jid for jid, alive in zip(chunk, pipe.execute(), strict=True) if not alive]
            if gone:
                pipe = self.redis.pipeline(transaction=False)
                pipe.zrem(keys.ALL_IDS, *gone)
                for status in STATUSES:
                    pipe.srem(keys.status_index(status), *gone)
                pipe.execute()
                dropped += len(gone)
        return dropped


_JSON_FIELDS = {"value", "raw", "priority", "confidence"}
#: Optional fields some tiers keep on a record (shown in `result --json` when set).
_EXTRA_FIELDS = ("session_id", "resume_session")


def _encode_field(name: str, value: Any) -> str:
    if name in _JSON_FIELDS:
        return json.dumps(value, separators=(",", ":"), default=str)
    return "" if value is None else str(value)


def _texts(values: Iterable[Any]) -> list[str]:
    """Members of a Redis set or sorted set, as text (redis-py types them loosely)."""
    return [as_text(v) for v in values]


def _record(jid: str, raw: Mapping[Any, Any]) -> Record:
    f = {as_text(k): as_text(v) for k, v in raw.items()}
    data = json.loads(f.get("in", "{}"))
    trail = [TrailEntry.model_validate(t) for t in json.loads(f.get("trail") or "[]")]

    def j(name: str) -> Any:
        return json.loads(f[name]) if f.get(name) not in (None, "") else None

    extra = {k: f[k] for k in _EXTRA_FIELDS if f.get(k)}
    # Fields beyond the declared ones (job, attempts, session ids) ride as pydantic extras.
    return Record.model_validate(
        {
            "id": jid,
            "kind": data.get("kind", "?"),
            "target": data.get("target", "?"),
            "item": data.get("item"),
            "context": data.get("context") or {},
            "state": data.get("state"),
            "key": data.get("key"),
            "status": f.get("status", "queued"),
            "tier": f.get("tier") or None,
            "value": j("value"),
            "confidence": j("confidence"),
            "reason": f.get("reason") or None,
            "trail": trail,
            "content_key": f.get("ckey"),
            "effect": f.get("effect", "local"),
            "host": f.get("host") or None,
            "priority": j("priority"),
            "raw": j("raw"),
            "created_at": float(f["created"]) if f.get("created") else None,
            "updated_at": float(f["updated"]) if f.get("updated") else None,
            "attempts": int(f.get("attempts") or 0),
            "job": f.get("job") or None,
            **({"deaths": int(f["deaths"])} if f.get("deaths") else {}),
            **({"shutdowns": int(f["shutdowns"])} if f.get("shutdowns") else {}),
            **extra,
        }
    )
