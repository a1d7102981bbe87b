"""The HTTP server's Redis: webhook deliveries seen, judgement ids by prefix, a health ping.

`dispatchq.serve` may not import redis (only storage/ and queue/ do); what it needs from
Redis is here, as named methods, and a Redis error it raises is recognised with
`dispatchq.storage.outage.is_outage`.

A delivery is *claimed* before its event is enqueued (SET NX with a short TTL, so two
copies racing in are one decision) and *confirmed* after (the long TTL); a claim whose
enqueue failed is released, so GitHub's redelivery of it is a first delivery again.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from dispatchq import keys
from dispatchq.core.text import as_text

if TYPE_CHECKING:
    import redis

__all__ = ["DELIVERY_ID", "JUDGEMENT_PREFIX", "ServeStorage"]

#: What an X-GitHub-Delivery may look like (a GUID; anything tame and short is accepted).
DELIVERY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
#: What `GET /judgements/{prefix}` accepts: 8+ characters, nothing a glob would read.
JUDGEMENT_PREFIX = re.compile(r"^[A-Za-z0-9_-]{8,128}$")


class ServeStorage:
    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def ping(self) -> bool:
        """True when Redis answers; an outage raises (the caller turns it into a 503)."""
        return bool(self._redis.ping())

    # -- webhook deliveries ------------------------------------------------------------------
    def claim_delivery(self, delivery_id: str, record: dict[str, Any], ttl: int) -> dict[str, Any] | None:
        """Claim a delivery id for `record`; None if claimed now, else the earlier claim's record."""
        key = keys.webhook_delivery(delivery_id)
        data = json.dumps({**record, "state": "pending"}, sort_keys=True, separators=(",", ":"))
        if self._redis.set(key, data, nx=True, ex=ttl):
            return None
        raw = self._redis.get(key)
        if raw is None:  # expired between the two calls: claim it again
            return None if self._redis.set(key, data, nx=True, ex=ttl) else {}
        earlier: dict[str, Any] = json.loads(as_text(raw))
        return earlier

    def confirm_delivery(self, delivery_id: str, record: dict[str, Any], ttl: int) -> None:
        data = json.dumps({**record, "state": "enqueued"}, sort_keys=True, separators=(",", ":"))
        self._redis.set(keys.webhook_delivery(delivery_id), data, ex=ttl)

    def release_delivery(self, delivery_id: str) -> None:
        self._redis.delete(keys.webhook_delivery(delivery_id))

    def delivery(self, delivery_id: str) -> dict[str, Any] | None:
        raw = self._redis.get(keys.webhook_delivery(delivery_id))
        if raw is None:
            return None
        found: dict[str, Any] = json.loads(as_text(raw))
        return found

    # -- judgements --------------------------------------------------------------------------
    def ids_with_prefix(self, prefix: str, *, limit: int = 2) -> list[str]:
        """Up to `limit` judgement ids starting with `prefix` (an exact id first)."""
        if not JUDGEMENT_PREFIX.match(prefix):
            return []
        if self._redis.exists(keys.record(prefix)):
            return [prefix]
        found: list[str] = []
        for member, _score in self._redis.zscan_iter(keys.ALL_IDS, match=f"{prefix}*", count=1000):
            found.append(as_text(member))
            if len(found) >= limit:
                break
        return found
