"""Redis going away for a while is weather, not a bug: name it, wait it out, say so once.

A long-running dispatchq process (a worker of any tier, the scheduler) must never exit
because Redis blinked: a restart of the embedded server, an append-only file still
loading (`LOADING`), a replica promoted after a failover (`READONLY`), a timeout. Each of
those is an *outage*: the process waits with capped exponential back-off, logs one line
when the state changes ("Redis unreachable at …, retrying in 4 s", then "Redis back after
12 s"), and carries on. The embedded server is restarted by whoever finds it gone, under
the same lock that serialises its start (`EmbeddedRedis.ensure_running`).

Memory pressure is not an outage: a `noeviction` server refusing a write is a clear,
one-line refusal (`out_of_memory_message`), and nothing was written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from dispatchq.errors import RedisUnreachable, UserError
from dispatchq.settings import Settings
from dispatchq.storage.connection import connect
from dispatchq.storage.keys import WRITE_PROBE

__all__ = [
    "OUTAGE_ERRORS",
    "Backoff",
    "MemoryLog",
    "OutageLog",
    "is_out_of_memory",
    "is_outage",
    "memory_refusal",
    "out_of_memory_message",
    "outage_reason",
    "require_room",
    "wait_for_redis",
]

#: Errors that say "Redis is away for now" (BusyLoadingError, the LOADING reply, is a
#: ConnectionError; ReadOnlyError is a replica that was the primary a moment ago).
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.ReadOnlyError,
    RedisUnreachable,
    ConnectionError,  # the builtin: a socket reset below redis-py
)


def is_outage(error: BaseException) -> bool:
    """True when `error` (or what caused it) says Redis is away, not that a request was wrong."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OUTAGE_ERRORS):
            return True
        current = current.__cause__ or current.__context__
    return False


def is_out_of_memory(error: BaseException) -> bool:
    """True when `error` (or what caused it) is a write refused under `maxmemory`.

    Not an outage (Redis answers), but for a long-running process just as much weather:
    an operator raises the limit or frees memory, and the process carries on.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if out_of_memory_message(current) is not None:
            return True
        current = current.__cause__ or current.__context__
    return False


def out_of_memory_message(error: BaseException, client: redis.Redis | None = None) -> str | None:
    """The one line for a write refused under `maxmemory`, or None if `error` is not that.

    The limit and policy are read back from the server when it still answers reads, so the
    operator sees which knob to turn.
    """
    # Plain commands answer "OOM command not allowed…"; a Lua script refused at its first
    # write wraps it ("Error running script … -OOM command not allowed …"), and so does a
    # MULTI refused while queueing (EXECABORT).
    oom = isinstance(error, redis.OutOfMemoryError) or (
        isinstance(error, redis.ResponseError)
        and (str(error).startswith("OOM") or "OOM command not allowed" in str(error))
    )
    if not oom:
        return None
    return memory_refusal(client)


def memory_refusal(client: redis.Redis | None = None) -> str:
    """The one line a command prints when Redis refuses writes under `maxmemory`."""
    limit, policy = "?", "noeviction"
    if client is not None:
        try:
            info = client.info("memory")
            limit = str(info.get("maxmemory_human") or info.get("maxmemory") or "?")
            policy = str(info.get("maxmemory_policy") or policy)
        except redis.RedisError:
            pass
    return f"Redis is out of memory (maxmemory {limit}, policy {policy}): nothing was written"


def require_room(client: redis.Redis) -> None:
    """Before a command's first write: refuse in one line (a UserError: exit 2) if Redis is
    refusing writes now, so a command of several writes is refused whole, not half-done.

    A marker removed (DEL is allowed under `maxmemory`) and its audit entry refused would be
    a half-written `window open`; asking first, with a small probe write, avoids that.
    """
    try:
        client.set(WRITE_PROBE, "1", ex=10)
    except redis.ResponseError as error:
        if out_of_memory_message(error) is None:
            raise
        raise UserError(memory_refusal(client)) from None


@dataclass
class Backoff:
    """Capped exponential back-off: 0.5 s, 1 s, 2 s, … up to `cap`; `reset` after success."""

    first: float = 0.5
    cap: float = 30.0
    _next: float = field(default=0.0, init=False)

    def next(self) -> float:
        self._next = self.first if self._next == 0 else min(self.cap, self._next * 2)
        return self._next

    def reset(self) -> None:
        self._next = 0.0


@dataclass
class OutageLog:
    """Says "unreachable" once when an outage starts and "back" once when it ends."""

    where: str
    log: logging.Logger
    since: float | None = None
    _last_delay: float | None = field(default=None, init=False)

    def down(self, error: BaseException, delay: float) -> None:
        if self.since is None:
            self.since = time.monotonic()
            self.log.warning(
                "Redis unreachable at %s (%s), retrying in %s s",
                self.where,
                outage_reason(error),
                _secs(delay),
            )
        elif delay != self._last_delay and delay >= 8:
            # The back-off grew: one more line, so a long outage is visibly still going on.
            self.log.warning("Redis still unreachable at %s, retrying in %s s", self.where, _secs(delay))
        self._last_delay = delay

    def up(self) -> None:
        if self.since is not None:
            self.log.warning("Redis back after %s s", _secs(time.monotonic() - self.since))
        self.since = None
        self._last_delay = None


@dataclass
class MemoryLog:
    """Says "out of memory" once when writes start being refused and "has room" once after."""

    log: logging.Logger
    since: float | None = None

    def down(self, error: BaseException, delay: float, client: redis.Redis | None = None) -> None:
        if self.since is None:
            self.since = time.monotonic()
            message = out_of_memory_message(error, client) or "Redis is out of memory"
            self.log.warning("%s; retrying in %s s", message, _secs(delay))

    def up(self) -> None:
        if self.since is not None:
            self.log.warning("Redis has room again after %s s", _secs(time.monotonic() - self.since))
        self.since = None


def wait_for_redis(
    settings: Settings,
    *,
    log: logging.Logger,
    stopping: Callable[[], bool],
    sleep: Callable[[float], None] = time.sleep,
    outage: OutageLog | None = None,
) -> redis.Redis | None:
    """A client once Redis answers (restarting the embedded server if it is gone).

    Returns None only when `stopping()` turns true while waiting: the caller was asked to
    stop. A configuration error (a bad `DISPATCHQ_REDIS_URL`) is not waited on: it raises.
    """
    backoff = Backoff()
    outage = outage or OutageLog(settings.describe_redis(), log)
    while not stopping():
        try:
            client = connect(settings)
            client.ping()
        except Exception as error:
            if not is_outage(error):
                raise
            delay = backoff.next()
            outage.down(error, delay)
            _sleep_until(delay, stopping, sleep)
            continue
        outage.up()
        return client
    return None


def _sleep_until(delay: float, stopping: Callable[[], bool], sleep: Callable[[float], None]) -> None:
    """Sleep `delay`, waking every 0.2 s to honour a stop request at once."""
    deadline = time.monotonic() + delay
    while not stopping():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        sleep(min(0.2, left))


def outage_reason(error: BaseException) -> str:
    """The first line of an outage's error, without the URL redis-py may put in it."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    # redis-py puts the URL (and so a password) in some messages: keep only the reason.
    return text.split(" connecting to ")[0][:200]


def _secs(value: float) -> str:
    return f"{value:.0f}" if value >= 1 else f"{value:.1f}"
