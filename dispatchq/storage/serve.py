"""The HTTP server's Redis: webhook deliveries accepted, judgement ids by prefix, a health ping.

`dispatchq.serve` may not import redis (only storage/ and queue/ do); what it needs from
Redis is here, as named methods, and a Redis error it raises is recognised with
`dispatchq.storage.outage.is_outage`.

Webhook deliveries are accepted by one Lua call (`ACCEPT`) that checks each delivery id
and the sha256 of its body (a captured delivery replayed under a new id is a redelivery),
records the new ones (their triage event in the record) and saves and queues one triage
job for them all (built in memory by `dispatchq.storage.prepared`), so there is no moment
when a delivery is recorded without a job or queued twice, and nothing to release when
Redis fails half way: either the whole call happened or none of it did. The server
gathers the deliveries that arrive while one call is in flight (`dispatchq.serve.webhooks`),
so a busy server pays one round trip and one RQ job per batch, not per delivery.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from dispatchq.core.text import as_text
from dispatchq.storage import keys
from dispatchq.storage.directory import ids_with_prefix
from dispatchq.storage.logins import revoke_logins

if TYPE_CHECKING:
    import redis
    import redis.asyncio

    from dispatchq.storage.prepared import PreparedJob

__all__ = [
    "ACCEPT",
    "BODY_KEYS",
    "DELIVERY_ID",
    "JUDGEMENT_PREFIX",
    "AsyncDeliveries",
    "Delivery",
    "ServeStorage",
]

#: What an X-GitHub-Delivery may look like (a GUID; anything tame and short is accepted).
DELIVERY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
#: Where a delivery body's sha256 is kept (string, the record's TTL): its first delivery's record key.
BODY_KEYS = f"{keys.PREFIX}:webhook:body:"
#: What `GET /judgements/{prefix}` accepts: 8+ characters, nothing a glob would read.
JUDGEMENT_PREFIX = re.compile(r"^[A-Za-z0-9_-]{8,128}$")


# KEYS: rq:queues, the batch job's hash, its queue, then each delivery's record.
# ARGV[1] = the records' TTL; ARGV[2] = the job id; ARGV[3] = the job's HSET arguments and
# ARGV[4] = the records (JSON), each a MessagePack array (one argument, not dozens:
# redis-py's packing of each argument cost more than the rest of the call); ARGV[5] = each
# delivery's body sha256 ('' for none), a MessagePack array too; ARGV[6] = BODY_KEYS.
# Returns one string per delivery: '' when it was new, else the record its first delivery
# left: the first under its id, or else the first with the same body (a captured delivery
# replayed under a new X-GitHub-Delivery id). A body's key holds its first delivery's
# record key and lives as long as that record; after it, a replay is a first delivery
# again. The job is saved and queued only if some delivery was new: a batch of
# redeliveries queues nothing. Two copies in one call are a delivery and its redelivery.
ACCEPT = """
local ttl = ARGV[1]
local records = cmsgpack.unpack(ARGV[4])
local bodies = cmsgpack.unpack(ARGV[5])
local out, new = {}, 0
for k = 4, #KEYS do
  local earlier = redis.call('GET', KEYS[k])
  local body = bodies[k - 3]
  if not earlier and body ~= '' then
    local first = redis.call('GET', ARGV[6] .. body)
    if first then earlier = redis.call('GET', first) end
  end
  if earlier then
    out[#out + 1] = earlier
  else
    redis.call('SET', KEYS[k], records[k - 3], 'EX', ttl)
    if body ~= '' then redis.call('SET', ARGV[6] .. body, KEYS[k], 'EX', ttl) end
    out[#out + 1] = ''
    new = new + 1
  end
end
if new > 0 then
  redis.call('HSET', KEYS[2], unpack(cmsgpack.unpack(ARGV[3])))
  redis.call('RPUSH', KEYS[3], ARGV[2])
  redis.call('SADD', KEYS[1], KEYS[3])
end
return out
"""


def _msgpack_strings(items: Sequence[str | bytes]) -> bytes:
    """A MessagePack array of byte strings (str 32 each: Redis 6.2's `cmsgpack` reads no bin type).

    Eight lines rather than a dependency: only this one shape is ever packed.
    """
    out = [b"\xdd", len(items).to_bytes(4, "big")]
    for item in items:
        data = item.encode() if isinstance(item, str) else item
        out += (b"\xdb", len(data).to_bytes(4, "big"), data)
    return b"".join(out)


@dataclass(frozen=True)
class Delivery:
    """One webhook delivery to accept: its id and what to remember of it (its event included)."""

    id: str
    record: dict[str, Any]
    #: The hex sha256 of the body as it arrived ('' when unknown: then only the id de-duplicates).
    body_sha256: str = ""


class AsyncDeliveries:
    """`ACCEPT` on the server's event loop (redis.asyncio), so waiting on Redis blocks nothing.

    A thread per request would hold the GIL in turns with the event loop; on two cores
    that hand-off cost more than the work itself.
    """

    def __init__(self, client: redis.asyncio.Redis, *, ttl: int) -> None:
        self._client = client
        self._accept = client.register_script(ACCEPT)
        self._ttl = ttl

    async def aclose(self) -> None:
        """Close the client's connections, on the loop that made them, before that loop ends
        (an application served in-process by a test client, whose loop goes with it)."""
        await self._client.aclose()

    async def accept(self, deliveries: Sequence[Delivery], job: PreparedJob) -> list[dict[str, Any] | None]:
        """Record each new delivery as `job`'s and queue `job` (once, if any was new).

        None for a new delivery; else the record its first delivery left (a redelivery,
        which `job` will skip: its record names another job).
        """
        if not deliveries:
            return []
        keys_ = [job.queues_key, job.key, job.queue_key]
        keys_ += [keys.webhook_delivery(delivery.id) for delivery in deliveries]
        records = [orjson.dumps({**delivery.record, "job": job.id}) for delivery in deliveries]
        argv: list[bytes | str | int] = [
            self._ttl,
            job.id,
            _msgpack_strings(job.fields),
            _msgpack_strings(records),
            _msgpack_strings([delivery.body_sha256 for delivery in deliveries]),
            BODY_KEYS,
        ]
        replies = await self._accept(keys=keys_, args=argv)
        out: list[dict[str, Any] | None] = []
        for reply in replies:
            text = as_text(reply)
            out.append(json.loads(text) if text else None)
        return out


class ServeStorage:
    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def ping(self) -> bool:
        """True when Redis answers; an outage raises (the caller turns it into a 503)."""
        return bool(self._redis.ping())

    # -- webhook deliveries ------------------------------------------------------------------
    def delivery(self, delivery_id: str) -> dict[str, Any] | None:
        raw = self._redis.get(keys.webhook_delivery(delivery_id))
        if raw is None:
            return None
        found: dict[str, Any] = json.loads(as_text(raw))
        return found

    # -- the page's logins -------------------------------------------------------------------
    def revoke_logins(self, now: float) -> int:
        """End every page login on every server of this store (`storage.logins`); how many were live."""
        return revoke_logins(self._redis, now)

    # -- judgements --------------------------------------------------------------------------
    def ids_with_prefix(self, prefix: str, *, limit: int = 2) -> list[str]:
        """Up to `limit` judgement ids starting with `prefix` (an exact id first), from one hash."""
        if not JUDGEMENT_PREFIX.match(prefix):
            return []
        if self._redis.exists(keys.record(prefix)):
            return [prefix]
        return ids_with_prefix(self._redis, prefix, limit=limit)
