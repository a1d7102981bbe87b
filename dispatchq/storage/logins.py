"""The page's logins and the wrong-credential counts of `dispatchq serve`, kept in Redis.

Both live in Redis, not in one server's memory, because several `serve` processes may stand
behind one load balancer over the same store: a logout (or `dispatchq serve revoke-logins`)
must end a login on every one of them, and a peer guessing round-robin across them must meet
one count, not one per process.

- A login is a random id in one sorted set (`keys.SERVE_LOGINS`), scored by when it ends. Both
  of the login's cookies carry the id under their MAC; a request with a cookie is let in only
  while the id is in the set. Logging out removes the id; revoking all removes the set.
- A wrong credential adds one to a per-peer, per-kind counter (`keys.serve_failures`) in one
  Lua call (`FAILED`): the first failure starts the window; past the allowance every further
  one starts it again, and the counter's remaining life is how long the peer waits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatchq.storage import keys

if TYPE_CHECKING:
    import redis
    import redis.asyncio

__all__ = ["FAILED", "AsyncLogins", "revoke_logins"]

# KEYS[1] = the peer's counter; ARGV[1] = the failures allowed in a window, ARGV[2] = the window
# (ms). Returns 0 while the failure is within the allowance, else the milliseconds to wait.
FAILED = """
local n = redis.call('INCR', KEYS[1])
local allowed = tonumber(ARGV[1])
if n == 1 or n > allowed then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if n <= allowed then return 0 end
return redis.call('PTTL', KEYS[1])
"""


class AsyncLogins:
    """The logins and the failure counts, on the server's event loop (redis.asyncio)."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._redis = client
        self._failed = client.register_script(FAILED)

    async def aclose(self) -> None:
        """Close the client's connections (on the loop that made them)."""
        await self._redis.aclose()

    async def failed(self, kind: str, peer: str, *, allowed: int, window: float) -> float:
        """Count one wrong credential of `kind` from `peer`: 0 within the allowance, else the
        seconds the peer waits (the window again from this failure)."""
        counter = keys.serve_failures(kind, peer)
        waited = await self._failed(keys=[counter], args=[allowed, int(window * 1000)])
        return max(0, int(waited)) / 1000

    async def start(self, login: str, ends: float, now: float) -> None:
        """Record a new login (its random id) that lasts until `ends`; drop the ended ones."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zadd(keys.SERVE_LOGINS, {login: ends})
            pipe.zremrangebyscore(keys.SERVE_LOGINS, "-inf", now)
            pipe.expireat(keys.SERVE_LOGINS, int(ends) + 1)  # every later login pushes it on
            await pipe.execute()

    async def live(self, login: str, now: float) -> bool:
        """Whether the login is still on record and has not ended."""
        ends = await self._redis.zscore(keys.SERVE_LOGINS, login)
        return ends is not None and float(ends) > now

    async def end(self, login: str) -> bool:
        """End one login (a logout); False when it was not on record."""
        return bool(await self._redis.zrem(keys.SERVE_LOGINS, login))


def revoke_logins(client: redis.Redis, now: float) -> int:
    """End every page login on every server of this store; how many were live."""
    with client.pipeline(transaction=True) as pipe:
        pipe.zcount(keys.SERVE_LOGINS, f"({now}", "+inf")
        pipe.delete(keys.SERVE_LOGINS)
        live, _ = pipe.execute()
    return int(live)
