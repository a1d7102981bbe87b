"""The typed tier's Redis: its answer cache, the per-state waiting sets, keyless and request stats.

The typed tier batches judgements that share a state into one provider request; the
sets it reads to find those siblings (`keys.typed_state`) are filled by the
dispatcher when it hands a judgement to the tier. Every read and write the tier makes
on them, and on its cache and counters, is a named method here so the tier itself
holds no Redis client logic. Values are JSON data in and out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dispatchq.core.text import as_text
from dispatchq.storage import keys

if TYPE_CHECKING:
    import redis
    from redis.client import Pipeline

__all__ = ["TypedStorage"]

#: How long a "this host ran keyless" note lasts without a typed worker renewing it.
KEYLESS_TTL = 3600


class TypedStorage:
    """Every Redis read and write of the typed tier, over one client."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    # -- answer cache ----------------------------------------------------------------------
    def cached_answers(self, content_key: str, model: str) -> Any:
        """The cached answers for a judgement's content under a requested model, or None."""
        raw = self._redis.get(keys.typed_cache(content_key, model))
        return json.loads(as_text(raw)) if raw else None

    def cache_answers(self, content_key: str, model: str, answers: Mapping[str, Any], ttl: int) -> None:
        self._redis.set(keys.typed_cache(content_key, model), json.dumps(dict(answers)), ex=ttl)

    # -- judgements waiting on one state ---------------------------------------------------
    def waiting_on(self, state_digests: Iterable[str], cap: int) -> set[str]:
        """Up to `cap` ids from each state's waiting set (any job's judgements)."""
        digests = list(state_digests)
        pipe = self._redis.pipeline(transaction=False)
        for digest in digests:
            pipe.srandmember(keys.typed_state(digest), cap)
        return {as_text(member) for members in pipe.execute() for member in members}

    @staticmethod
    def state_set(state_digest: str) -> str:
        """The name of one state's waiting set (kept on a record, so its scripts can leave it)."""
        return keys.typed_state(state_digest)

    @staticmethod
    def join_state(state_digest: str, jid: str, *, pipe: Pipeline) -> None:
        """A judgement entering the tier waits on its state, in the hand-off's MULTI."""
        pipe.sadd(keys.typed_state(state_digest), jid)

    def stop_waiting(self, state_digests: Iterable[str], ids: Sequence[str]) -> None:
        """Take `ids` out of those states' waiting sets: they are claimed."""
        if not ids:
            return
        pipe = self._redis.pipeline(transaction=False)
        for digest in state_digests:
            pipe.srem(keys.typed_state(digest), *ids)
        pipe.execute()

    def carrying_jobs(self, ids: Sequence[str]) -> list[str | None]:
        """For each judgement id, the RQ job its record says carries it (None when unset)."""
        pipe = self._redis.pipeline(transaction=False)
        for jid in ids:
            pipe.hget(keys.record(jid), "job")
        return [as_text(owner) if owner else None for owner in pipe.execute()]

    # -- keyless note and request counter --------------------------------------------------
    def note_keyless(self, host: str) -> None:
        """`dispatchq status` reports the tier keyless while a worker on `host` runs without a key."""
        self._redis.set(keys.TYPED_KEYLESS, host, ex=KEYLESS_TTL)

    def clear_keyless(self, host: str) -> None:
        """This host has a key now: drop the note if this host wrote it."""
        if as_text(self._redis.get(keys.TYPED_KEYLESS)) == host:
            self._redis.delete(keys.TYPED_KEYLESS)

    def count_requests(self, requests: int) -> None:
        self._redis.incrby(keys.TYPED_REQUESTS, requests)
