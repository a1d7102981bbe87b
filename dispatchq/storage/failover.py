"""Following a Sentinel failover while waiting: a back-off bounded by what the sentinels say.

A process waiting out an outage sleeps a back-off that grows to 30 s. Sentinel moves a
primary in about a second, so a process asleep in its 8 s step would answer up to 8 s after
the new primary could. While it waits, the process therefore asks the sentinels about the
primary (`SENTINEL MASTER`: one read of one sentinel, every `POLL_S`) and ends the sleep as
soon as they name another one than its last round tried.

A primary just promoted often refuses writes a while longer (`NOREPLICAS` under
`min-replicas-to-write` until a replica has resynced from it), and a process may only find
out about the failover after the move (a worker blocked in a read on the old primary). So
while a failover is under way, or the sentinels saw the primary take the role less than
`SETTLE_S` ago, each step of the back-off is at most `SETTLED_STEP`: the wait tries the new
primary each second until it takes writes, instead of sleeping out a step grown meanwhile.

Polling rather than a `+switch-master` subscription: a subscription misses an event sent
while it reconnects (the sentinel it listened to may be the one that went away), and a
process that began waiting after the move would never hear it; a poll of whichever
sentinel answers sees what a new connection would be told.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dispatchq.settings import Settings
from dispatchq.storage.sentinel import SentinelTarget, is_sentinel_url, parse_sentinel_url, tls_options

__all__ = [
    "POLL_S",
    "SETTLED_STEP",
    "SETTLE_S",
    "Address",
    "Named",
    "PrimaryWatch",
    "named_primary",
    "primary_watch",
    "read_master_reply",
]

#: How often a waiting process asks the sentinels where the primary is.
POLL_S = 0.5
#: How long after a move the back-off stays short: a promoted primary's replicas resync in it.
SETTLE_S = 30.0
#: The longest back-off step while a moved primary settles.
SETTLED_STEP = 1.0
#: How long one sentinel may take to answer the watch (a dead one must not hold the wait up).
ASK_TIMEOUT = 0.5

Address = tuple[str, int]


@dataclass(frozen=True)
class Named:
    """What the sentinels say about the service's primary."""

    address: Address
    #: Seconds since the sentinels saw this primary take the role (`role-reported-time`).
    age: float
    #: A failover of the service is under way (`failover_in_progress` in its flags).
    failing_over: bool = False


@dataclass
class PrimaryWatch:
    """Which primary the sentinels name, seen from a process waiting for a writable one.

    `ask` returns what the first sentinel that answers says, or None when none answers;
    `clock` is monotonic seconds. Both are parameters so the rules can be checked without a
    server.
    """

    ask: Callable[[], Named | None]
    clock: Callable[[], float] = time.monotonic
    every: float = POLL_S
    settle: float = SETTLE_S
    #: What the sentinels said as the last round began, and when (`clock`).
    tried: Named | None = field(default=None, init=False)
    seen_at: float = field(default=0.0, init=False)
    _asked_at: float | None = field(default=None, init=False)

    def before_round(self) -> None:
        """A round begins: remember the primary the sentinels name now, the one it will try.

        Asked before the round rather than after its failure, so a move during the round
        (a connection refused by the old primary as the new one is announced) is a move.
        """
        self._remember(self.ask())

    def _remember(self, named: Named | None) -> None:
        self.tried = named
        self.seen_at = self._asked_at = self.clock()

    def moved(self) -> bool:
        """True when the sentinels name another primary than the last round tried.

        Asks at most once every `every` seconds (False between asks), and a sentinel that
        does not answer is no news. What they say becomes the one to compare with.
        """
        now = self.clock()
        if self._asked_at is not None and now - self._asked_at < self.every:
            return False
        self._asked_at = now
        named = self.ask()
        if named is None:
            return False
        before = self.tried
        self._remember(named)
        return before is None or named.address != before.address

    def ceiling(self) -> float | None:
        """The longest step the back-off may take now: `SETTLED_STEP` while a failover is
        under way or the primary took the role less than `settle` seconds ago, else None.

        A primary just promoted takes writes once a replica has resynced from it, seconds
        later: the wait then tries it each second rather than sleeping out a grown step.
        """
        named = self.tried
        if named is None:
            return None
        if named.failing_over or named.age + (self.clock() - self.seen_at) < self.settle:
            return SETTLED_STEP
        return None


def named_primary(
    target: SentinelTarget, sentinel_password: str | None, tls: dict[str, Any] | None = None
) -> Named | None:
    """What the first sentinel that answers says of the service's primary, or None.

    During a failover the sentinels still name the old primary until the new one is
    announced (`+switch-master`), so a change of address is the move itself.
    """
    kwargs: dict[str, Any] = {"socket_timeout": ASK_TIMEOUT, "socket_connect_timeout": ASK_TIMEOUT}
    if sentinel_password is not None:
        kwargs["password"] = sentinel_password
    if tls is not None:
        kwargs.update(ssl=True, **tls)
    for host, port in target.sentinels:
        probe = redis.Redis(host, port, retry=Retry(NoBackoff(), 0), **kwargs)
        try:
            reply = probe.execute_command("SENTINEL", "MASTER", target.service)
        except (redis.RedisError, OSError):
            continue
        finally:
            probe.close()
        named = read_master_reply(reply)
        if named is not None:
            return named
    return None


def read_master_reply(reply: object) -> Named | None:
    """A `SENTINEL MASTER` reply as `Named`; None if it is not one.

    redis-py hands it over as a mapping of names to values (bytes), RESP2 on the wire is a
    flat list of names and values: both are read.
    """
    if isinstance(reply, dict):
        pairs = list(reply.items())
    elif isinstance(reply, list | tuple) and len(reply) % 2 == 0:
        pairs = list(zip(reply[::2], reply[1::2], strict=True))
    else:
        return None
    fields = {_text(k): _text(v) for k, v in pairs}
    try:
        address = (fields["ip"], int(fields["port"]))
        age = int(fields.get("role-reported-time", "0")) / 1000
    except (KeyError, ValueError):
        return None
    return Named(address, age, "failover_in_progress" in fields.get("flags", "").split(","))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def primary_watch(settings: Settings) -> PrimaryWatch | None:
    """The watch for a `redis(s)+sentinel://` URL; None for any other (no sentinel to ask)."""
    if settings.redis_url is None:
        return None
    url = settings.redis_url.get_secret_value()
    if not is_sentinel_url(url):
        return None
    target = parse_sentinel_url(url)
    tls = tls_options(settings) if target.tls else None
    secret = settings.redis_sentinel_password
    password = secret.get_secret_value() if secret is not None else None
    return PrimaryWatch(lambda: named_primary(target, password, tls))
