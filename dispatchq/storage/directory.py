"""Every judgement id, in small hashes: prefix lookups, `list`, the newest, and pruning.

A store holding a million waiting judgements pays for each index entry a million times. One
sorted set of every id costs about 130 bytes an id in Redis (a skiplist node, a dict entry and
the member), and a second one for prefix lookups as much again. Instead the ids are spread
over hashes by their first four characters (65,536 for hex ids) (`keys.directory`): a hash of a few dozen
short fields stays in Redis's compact encoding, about 35 bytes an id with its enqueue time.

- A prefix of at least four characters names its hash: `ids_with_prefix` reads that one.
- `all_ids` reads every hash (pipelined), for `list` with a filter older than the newest.
- The newest ids are a capped list (`keys.RECENT`), so `status` and `list` read no hash at all.
- `prune` reads only the finished judgements whose record has expired (`keys.EXPIRING`, written
  where the record is given its expiry), not every id.

Written where records are made, in the `ENQUEUE` script (`storage.scripts`), in the same call
as the record: an id is never findable by `result` and not by prefix. Stores made before the
directory kept the sorted sets `dispatchq:ids` and `dispatchq:ids:lex`; `migrate` moves them
here once (run at a worker's, the scheduler's or `serve`'s start), and until it has, lookups
read them too, so an upgrade never answers 404 for an id that exists.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

from dispatchq.core.judgement import STATUSES
from dispatchq.core.text import as_text
from dispatchq.storage import keys
from dispatchq.storage.scripts import RECENT_CAP

if TYPE_CHECKING:
    import redis

__all__ = ["all_ids", "ids_with_prefix", "migrate", "newest", "prune", "prune_all", "unlist"]

_CHUNK = 1000
#: The legacy indexes `migrate` empties (the prefix index kept its own mark).
_LEGACY_LEX = f"{keys.ALL_IDS}:lex"
_LEGACY = (keys.ALL_IDS, _LEGACY_LEX, f"{_LEGACY_LEX}:built")


def _buckets(client: redis.Redis, prefix: str = "") -> list[str]:
    """The directory hashes an id starting with `prefix` may be in: from 4 characters on, the one
    it names; else those that exist, found by SCAN (what a store holds, not all 65,536 names)."""
    head = prefix[:4]
    if len(head) == 4:
        return [f"{keys.DIRECTORY_PREFIX}{head}"]
    pattern = keys.DIRECTORY_PREFIX + "".join(f"\\{c}" if c in "*?[]\\^" else c for c in head) + "*"
    return sorted({as_text(k) for k in client.scan_iter(match=pattern, count=10_000)})


def _read(client: redis.Redis, buckets: list[str]) -> dict[str, float]:
    """id -> enqueue time (epoch seconds) of every id in `buckets`, a pipeline per thousand."""
    out: dict[str, float] = {}
    for start in range(0, len(buckets), _CHUNK):
        chunk = buckets[start : start + _CHUNK]
        pipe = client.pipeline(transaction=False)
        for bucket in chunk:
            pipe.hgetall(bucket)
        for bucket, fields in zip(chunk, pipe.execute(), strict=True):
            head = bucket[len(keys.DIRECTORY_PREFIX) :]
            for rest, ms in fields.items():
                out[head + as_text(rest)] = int(ms) / 1000
    return out


def _legacy(client: redis.Redis) -> dict[str, float]:
    """The ids a store made before the directory still lists in its time index (until migrated)."""
    scored = cast("list[tuple[bytes, float]]", client.zrange(keys.ALL_IDS, 0, -1, withscores=True))
    return {as_text(m): float(s) for m, s in scored}


def all_ids(client: redis.Redis) -> list[str]:
    """Every listed id, oldest first."""
    found = {**_legacy(client), **_read(client, _buckets(client))}
    return sorted(found, key=lambda jid: (found[jid], jid))


def newest(client: redis.Redis, limit: int) -> list[str]:
    """Up to `limit` of the newest ids, newest first; past the capped list, from every hash."""
    ids = [as_text(m) for m in client.lrange(keys.RECENT, 0, max(0, limit - 1))]
    if len(ids) >= limit or (len(ids) < RECENT_CAP and not client.exists(keys.ALL_IDS)):
        return ids
    return list(reversed(all_ids(client)))[:limit]


def ids_with_prefix(client: redis.Redis, prefix: str, *, limit: int) -> list[str]:
    """Up to `limit` ids starting with `prefix` (which holds only id characters)."""
    if len(prefix) >= 4:
        bucket = _buckets(client, prefix)[0]
        rest = prefix[4:]
        found = sorted(prefix[:4] + as_text(f) for f in client.hkeys(bucket) if as_text(f).startswith(rest))
    else:
        found = sorted(jid for jid in _read(client, _buckets(client, prefix)) if jid.startswith(prefix))
    if len(found) < limit and client.exists(_LEGACY_LEX):  # a store not yet migrated
        low = f"[{prefix}".encode()
        found += [as_text(m) for m in client.zrangebylex(_LEGACY_LEX, low, low + b"\xff", start=0, num=limit)]
        found = sorted(set(found))
    return found[:limit]


def prune(client: redis.Redis, now: float | None = None) -> int:
    """Unlist the judgements whose record has expired; how many were.

    Reads the expiring set up to now, a thousand at a time: a pass costs the records that
    expired since the last one, however many wait.
    """
    now = time.time() if now is None else now
    dropped = 0
    offset = 0
    while True:
        members = cast("list[bytes]", client.zrangebyscore(keys.EXPIRING, 0, now, start=offset, num=_CHUNK))
        due = [as_text(m) for m in members]
        if not due:
            return dropped
        pipe = client.pipeline(transaction=False)
        for jid in due:
            pipe.exists(keys.record(jid))
        gone = [jid for jid, alive in zip(due, pipe.execute(), strict=True) if not alive]
        offset += len(due) - len(gone)  # still there (its expiry moved on): skipped, not unlisted
        if gone:
            unlist(client, gone)
            dropped += len(gone)


def prune_all(client: redis.Redis) -> int:
    """Unlist every listed id whose record is gone (expired or deleted by hand); how many were.
    Reads every id: an operator's `dispatchq prune`, not the maintenance pass."""
    ids = all_ids(client)
    dropped = 0
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        pipe = client.pipeline(transaction=False)
        for jid in chunk:
            pipe.exists(keys.record(jid))
        gone = [jid for jid, alive in zip(chunk, pipe.execute(), strict=True) if not alive]
        if gone:
            unlist(client, gone)
            dropped += len(gone)
    return dropped


def unlist(client: redis.Redis, ids: list[str]) -> None:
    """Take ids out of the directory, the status sets and the indexes that may hold them."""
    pipe = client.pipeline(transaction=False)
    for jid in ids:
        pipe.hdel(*keys.directory(jid))
    for status in STATUSES:
        pipe.srem(keys.status_index(status), *ids)
    pipe.zrem(keys.EXPIRING, *ids)
    pipe.zrem(keys.QUEUED_BY_UPDATE, *ids)  # the index by last update (storage.stale)
    pipe.execute()  # the capped list of the newest ages out by itself; its readers skip the gone


def migrate(client: redis.Redis) -> int | None:
    """Move a store's legacy id indexes into the directory, once; None when there were none.

    An id whose record is gone is dropped, not moved; a finished one is put in the expiring set
    at its record's expiry. Safe from several processes at once (HSET and ZADD of what is
    there change nothing) and while judgements are enqueued (the new ones are listed by
    `ENQUEUE` itself).
    """
    if not client.exists(keys.ALL_IDS):
        if client.exists(_LEGACY_LEX):
            client.delete(*_LEGACY)
        return None
    moved = 0
    start = 0
    now = time.time()
    while True:
        end = start + _CHUNK - 1
        chunk = cast("list[tuple[bytes, float]]", client.zrange(keys.ALL_IDS, start, end, withscores=True))
        if not chunk:
            break
        start += _CHUNK
        pipe = client.pipeline(transaction=False)
        for member, _ in chunk:
            pipe.ttl(keys.record(as_text(member)))
        ttls = pipe.execute()
        pipe = client.pipeline(transaction=False)
        for (member, score), ttl in zip(chunk, ttls, strict=True):
            jid = as_text(member)
            if ttl == -2:
                continue
            pipe.hset(*keys.directory(jid), str(int(score * 1000)))
            if ttl >= 0:
                pipe.zadd(keys.EXPIRING, {jid: now + ttl})
            moved += 1
        pipe.execute()
    # Behind whatever `ENQUEUE` listed since the upgrade, the newest first, as it keeps them.
    recent = cast("list[bytes]", client.zrevrange(keys.ALL_IDS, 0, RECENT_CAP - 1))
    pipe = client.pipeline(transaction=True)
    if recent:
        pipe.rpush(keys.RECENT, *recent)
        pipe.ltrim(keys.RECENT, 0, RECENT_CAP - 1)
    pipe.delete(*_LEGACY)
    pipe.execute()
    return moved
