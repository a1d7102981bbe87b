"""A leased lock in Redis: held by a named holder, kept alive by renewing its lease.

Its three Lua scripts make take, renew and drop atomic with the check of who holds it, so
a holder whose lease ran out can never renew or drop a lock someone else took since.
Re-entrant for its holder: taking a lock one already holds just renews the lease.
"""

from __future__ import annotations

import redis

__all__ = [
    "LeasedLock",
]

_TAKE = """
local cur = redis.call('GET', KEYS[1])
if (not cur) or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_DROP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class LeasedLock:
    """One lock key and one holder name; the lease is in seconds."""

    def __init__(self, redis_client: redis.Redis, key: str, holder: str) -> None:
        self.redis = redis_client
        self.key = key
        self.holder = holder

    def take(self, lease: int) -> bool:
        """Take the lock (or renew it when already ours); False when another holds it."""
        return bool(self.redis.register_script(_TAKE)(keys=[self.key], args=[self.holder, lease]))

    def renew(self, lease: int) -> bool:
        """Push our lease out; False when the lock is no longer ours."""
        return bool(self.redis.register_script(_RENEW)(keys=[self.key], args=[self.holder, lease]))

    def drop(self) -> None:
        """Free the lock if it is still ours."""
        self.redis.register_script(_DROP)(keys=[self.key], args=[self.holder])
