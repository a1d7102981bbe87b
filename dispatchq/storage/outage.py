"""Redis going away for a while is weather, not a bug: name it, wait it out, say so once.

A long-running dispatchq process (a worker of any tier, the scheduler) must never exit
because Redis blinked: a restart of the embedded server, an append-only file still
loading (`LOADING`), a master demoted after a failover (`READONLY`), a primary short of
replicas under `min-replicas-to-write` (`NOREPLICAS`), a replica whose master is away
(`MASTERDOWN`), a timeout, and, once running, a password rotated on the server before the
process got the new one. Each of those is *weather*: the process waits with capped
exponential back-off, logs one line when the state changes ("Redis unreachable at …,
retrying in 4 s", then "Redis back after 12 s"), leaves the reason in a file under the
data dir for `dispatchq status`, and carries on. The embedded server is restarted by
whoever finds it gone, under the same lock that serialises its start. Under Sentinel the
back-off is bounded by what the sentinels say (`storage.failover`): a new primary named ends
a sleep at once, and a failover under way keeps the steps short.

Waiting means waiting for a *writable primary*: a demoted master answers PING while it
refuses every write, so the wait probes with a write of its own short-lived key. `ROLE`
and `INFO` would say the same, but an ACL user without `@dangerous` may not run them;
NOPERM on the probe itself is a configuration error (the user may not write dispatchq's
keys), never waited on.

Memory pressure is not an outage: a `noeviction` server refusing a write is a clear,
one-line refusal (`out_of_memory_message`), and nothing was written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from dispatchq.errors import RedisUnavailable, RedisUnreachable, UserError
from dispatchq.settings import Settings
from dispatchq.storage.connection import connect, process_alive, short_reason
from dispatchq.storage.failover import PrimaryWatch, primary_watch
from dispatchq.storage.keys import WRITE_PROBE, wait_probe
from dispatchq.storage.private import write_private

__all__ = [
    "OUTAGE_ERRORS",
    "WEATHER_CODES",
    "Backoff",
    "MemoryLog",
    "OutageLog",
    "is_login_refused",
    "is_out_of_memory",
    "is_outage",
    "memory_refusal",
    "out_of_memory_message",
    "outage_reason",
    "probe_write",
    "require_room",
    "wait_for_redis",
    "waiting_here",
    "weather_kind",
]

#: Errors that say "Redis is away for now" (BusyLoadingError, the LOADING reply, and
#: AuthenticationError are ConnectionErrors; ReadOnlyError is a replica that was the
#: primary a moment ago; MasterDownError and TryAgainError are ResponseErrors).
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.ReadOnlyError,
    redis.exceptions.MasterDownError,
    redis.exceptions.TryAgainError,
    RedisUnreachable,
    ConnectionError,  # the builtin: a socket reset below redis-py
)

#: Error replies that mean "this server cannot take that write now, ask again later". redis-py
#: maps some to classes (and strips the code from the text), not NOREPLICAS or UNBLOCKED (a
#: blocked BLPOP/BLMOVE of a master being demoted); inside a Lua script any of them arrives
#: wrapped in "Error running script … -READONLY …", so the text is searched too.
WEATHER_CODES = ("READONLY", "NOREPLICAS", "MASTERDOWN", "LOADING", "TRYAGAIN", "UNBLOCKED")
_WEATHER_TEXT = re.compile(r"(?:^|[\s:-])(" + "|".join(WEATHER_CODES) + r")\b")
_LOGIN_CODES = ("NOAUTH", "WRONGPASS")


def _chain(error: BaseException) -> Iterator[BaseException]:
    """`error` and what caused it, outermost first.

    A deliberate configuration refusal (a `RedisUnavailable` that is not `RedisUnreachable`:
    a bad URL, a refused login at start) ends the chain: whatever it was raised over, waiting
    will not fix it.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        if isinstance(current, RedisUnavailable) and not isinstance(current, RedisUnreachable):
            return
        current = current.__cause__ or current.__context__


def weather_kind(error: BaseException) -> str | None:
    """What kind of weather `error` (or what caused it) is, or None when it is not weather.

    "login": the server refused our password (`is_login_refused`); "writes": it answers but
    takes no writes now (READONLY, NOREPLICAS, MASTERDOWN, LOADING, TRYAGAIN); "unreachable":
    it does not answer. A refused login is checked first: redis-py makes it a ConnectionError.
    """
    if is_login_refused(error):
        return "login"
    for current in _chain(error):
        if isinstance(current, redis.AuthenticationError):
            return "login"
        if _weather_code(current) is not None:
            return "writes"
        if isinstance(current, OUTAGE_ERRORS):
            return "unreachable"
    return None


def _weather_code(error: BaseException) -> str | None:
    if isinstance(error, redis.ReadOnlyError):
        return "READONLY"
    if isinstance(error, redis.BusyLoadingError):
        return "LOADING"
    if isinstance(error, redis.exceptions.MasterDownError):
        return "MASTERDOWN"
    if isinstance(error, redis.exceptions.TryAgainError):
        return "TRYAGAIN"
    if isinstance(error, redis.ResponseError) and not isinstance(error, redis.exceptions.NoPermissionError):
        found = _WEATHER_TEXT.search(str(error))
        return found.group(1) if found else None
    return None


def is_outage(error: BaseException) -> bool:
    """True when `error` (or what caused it) is weather: Redis away, not taking writes now, or
    (for a process already running) refusing a password rotated under it; not a wrong request."""
    return weather_kind(error) is not None


def is_login_refused(error: BaseException) -> bool:
    """True when `error` (or what caused it, even a refusal raised `from None` over it) is the
    server refusing our password: at start a configuration error, once running weather."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, redis.AuthenticationError) or (
            isinstance(current, redis.ResponseError) and str(current).startswith(_LOGIN_CODES)
        ):
            return True
        current = current.__cause__ or current.__context__
    return False


def is_out_of_memory(error: BaseException) -> bool:
    """True when `error` (or what caused it) is a write refused under `maxmemory`.

    Not an outage (Redis answers), but for a long-running process just as much weather:
    an operator raises the limit or frees memory, and the process carries on.
    """
    return any(out_of_memory_message(current) is not None for current in _chain(error))


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

    def upcoming(self) -> float:
        """What `next` would return, without moving on."""
        return self.first if self._next == 0 else min(self.cap, self._next * 2)

    @property
    def current(self) -> float:
        """The step reached (0 before the first)."""
        return self._next


#: How each kind of weather reads in a log line: "Redis <state> at <where> (<reason>)".
_STATES = {"unreachable": "unreachable", "writes": "not writable", "login": "refusing the login"}


@dataclass
class OutageLog:
    """Says "unreachable" once when an outage starts and "back" once when it ends.

    It also owns the outage's back-off, so the back-off is kept across rounds: an outage
    that comes back within one step of ending (a write probe that passed, then READONLY
    again) carries on from the step it had reached instead of starting at the first, and a
    flapping primary costs one round and at most two lines per step, never a hot loop.
    While it lasts, the reason is in `note` (under the data dir) for `dispatchq status`.
    """

    where: str
    log: logging.Logger
    since: float | None = None
    backoff: Backoff = field(default_factory=Backoff)
    note: Path | None = None
    #: True when this outage began within one back-off step of the last one's end.
    recurring: bool = field(default=False, init=False)
    _last_delay: float | None = field(default=None, init=False)
    _kind: str | None = field(default=None, init=False)
    _reason: str = field(default="", init=False)
    _ended: float | None = field(default=None, init=False)

    @classmethod
    def for_settings(cls, settings: Settings, log: logging.Logger) -> OutageLog:
        """The outage log of a long-running process on these settings, its note included."""
        return cls(settings.describe_redis(), log, note=note_path(settings))

    def step(self, error: BaseException, ceiling: float | None = None) -> float:
        """The next delay of this outage's back-off (said as `down` says it): what a waiting
        loop sleeps before its next round, at most `ceiling` when one is given."""
        if self.since is None:
            self._begin()
        delay = self.backoff.next()
        if ceiling is not None:
            delay = min(delay, ceiling)
        self.down(error, delay)
        return delay

    def _begin(self) -> None:
        self.since = time.monotonic()
        # Back within one step of the last end: the same weather, not a new outage.
        self.recurring = self._ended is not None and (
            time.monotonic() - self._ended < max(self.backoff.current, self.backoff.first) + 1
        )
        if not self.recurring:
            self.backoff.reset()

    def down(self, error: BaseException, delay: float) -> None:
        kind = weather_kind(error) or "unreachable"
        if self.since is None:
            self._begin()
            shown = max(delay, self.backoff.upcoming()) if self.recurring else delay
            self._say(kind, error, shown)
        elif self._kind is None or kind != self._kind:
            # Another kind of weather (the server came back with another password): one line.
            self._say(kind, error, delay)
        elif delay != self._last_delay and delay >= 8:
            # The back-off grew: one more line, so a long outage is visibly still going on.
            self.log.warning(
                "Redis still %s at %s, retrying in %s s", _STATES[kind], self.where, _secs(delay)
            )
        self._last_delay = delay

    def _say(self, kind: str, error: BaseException, delay: float) -> None:
        self._kind = kind
        self._reason = outage_reason(error)
        self.log.warning(
            "Redis %s at %s (%s), retrying in %s s", _STATES[kind], self.where, self._reason, _secs(delay)
        )
        self._write_note()

    def keep_note(self, note: Path) -> None:
        """From now on, say in `note` why this process waits (at once, if it already does)."""
        self.note = note
        if self.since is not None:
            self._write_note()

    def up(self) -> None:
        if self.since is not None:
            self.log.warning("Redis back after %s s", _secs(time.monotonic() - self.since))
            self._ended = time.monotonic()
            if self.note is not None:
                with contextlib.suppress(OSError):
                    self.note.unlink()
        self.since = None
        self._last_delay = None
        self._kind = None

    def _write_note(self) -> None:
        kind, reason = self._kind, self._reason
        if self.note is None or kind is None:
            return
        facts = {
            "pid": os.getpid(),
            "role": self.log.name,
            "redis": self.where,
            "kind": kind,
            "state": _STATES[kind],
            "reason": reason,
            "since": time.time(),
        }
        with contextlib.suppress(OSError):  # best effort: the wait itself must never fail on it
            _private_folder(self.note.parent)
            write_private(self.note, json.dumps(facts))


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
    starting: bool = False,
    watch: PrimaryWatch | None = None,
) -> redis.Redis | None:
    """A client once Redis takes a write again (restarting the embedded server if it is gone).

    Each round connects and writes the process's probe key (`probe_write`): a replica
    answers PING, so only a write says the primary is back. The back-off is `outage`'s, kept
    across calls. Returns None only when `stopping()` turns true while waiting: the caller
    was asked to stop. A configuration error (a bad `DISPATCHQ_REDIS_URL`, a user that may
    not write dispatchq's keys) is not waited on: it raises. Nor is a refused login when
    `starting` (a wrong password is a one-line exit 2); once running, it is weather (the
    password was rotated on the server first) and waited on like an outage.

    Under Sentinel the wait follows a failover (`storage.failover`): a sleep ends as soon as
    the sentinels name another primary than the round tried, and while a failover is under
    way or the primary is new in its role the back-off steps are at most a second. `watch`
    is the sentinels' view to use (default: one for `settings`, None for a plain URL).
    """
    outage = outage or OutageLog.for_settings(settings, log)
    if outage.note is None:
        outage.keep_note(note_path(settings))
    backoff = outage.backoff
    watch = watch if watch is not None else primary_watch(settings)
    woken = _moved(watch, log)
    if outage.since is not None and outage.recurring:
        # The last wait ended moments ago and the weather is back: wait a step before asking.
        outage.recurring = False
        _sleep_until(backoff.next(), stopping, sleep, woken)
    while not stopping():
        client: redis.Redis | None = None
        if watch is not None:
            watch.before_round()
        try:
            client = connect(settings)
            probe_write(client, settings)
        except Exception as error:
            if client is not None:
                client.close()
            if not is_outage(error) or (starting and is_login_refused(error)):
                raise
            ceiling = watch.ceiling() if watch is not None else None
            _sleep_until(outage.step(error, ceiling), stopping, sleep, woken)
            continue
        outage.up()
        return client
    return None


def _moved(watch: PrimaryWatch | None, log: logging.Logger) -> Callable[[], bool] | None:
    """What ends a back-off sleep early under Sentinel: the sentinels naming a new primary."""
    if watch is None:
        return None

    def moved() -> bool:
        if not watch.moved():
            return False
        host, port = watch.tried.address if watch.tried is not None else ("?", 0)
        log.info("Sentinel names a new primary at %s:%s: trying it now", host, port)
        return True

    return moved


def probe_write(client: redis.Redis, settings: Settings) -> None:
    """Write this process's probe key (5 s expiry); raise as the write did if Redis refuses it.

    A write refused for memory (`maxmemory`, noeviction) passes: Redis is there and is the
    primary, and running out of memory has its own one-line path in the callers. NOPERM is
    a UserError: the Redis user lacks write access to dispatchq's keys, and no wait fixes that.
    """
    try:
        client.set(wait_probe(settings.host, os.getpid()), "1", px=5000)
    except redis.exceptions.NoPermissionError as error:
        raise UserError(
            f"DISPATCHQ_REDIS_URL: the Redis user at {settings.describe_redis()} may not write "
            f"dispatchq's keys ({outage_reason(error)}); grant it ~* &* +@all -@dangerous "
            "(docs/many-hosts.md)"
        ) from None
    except redis.ResponseError as error:
        if out_of_memory_message(error) is None:
            raise


def note_path(settings: Settings) -> Path:
    """Where this process says, while it waits for Redis, why (read by `dispatchq status`)."""
    return settings.data_dir.expanduser() / "weather" / f"{os.getpid()}.json"


def waiting_here(settings: Settings) -> list[dict[str, Any]]:
    """What this host's dispatchq processes waiting for Redis say about it, oldest first.

    Read from the notes under the data dir, not from Redis: a process that cannot log in
    (its password was rotated) or reach the server cannot write anything there. A note
    whose process has exited is ignored.
    """
    folder = settings.data_dir.expanduser() / "weather"
    found: list[dict[str, Any]] = []
    with contextlib.suppress(OSError):
        for path in folder.glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                facts = json.loads(path.read_text())
                if isinstance(facts, dict) and process_alive(int(facts.get("pid", 0))):
                    found.append(facts)
    return sorted(found, key=lambda f: float(f.get("since") or 0))


def _private_folder(folder: Path) -> None:
    """`folder` and any missing parent, owner-only (the data dir is the embedded store's too)."""
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)


def _sleep_until(
    delay: float,
    stopping: Callable[[], bool],
    sleep: Callable[[float], None],
    woken: Callable[[], bool] | None = None,
) -> None:
    """Sleep `delay`, waking every 0.2 s to honour a stop request at once, and ending early
    when `woken()` says there is something new to try (the primary moved)."""
    deadline = time.monotonic() + delay
    while not stopping():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        sleep(min(0.2, left))
        if woken is not None and woken():
            return


def outage_reason(error: BaseException) -> str:
    """The first line of an outage's error, without the URL redis-py may put in it.

    An error reply whose code redis-py strips (READONLY, LOADING, MASTERDOWN, …) gets it
    back, so the operator reads the server's own word for what is wrong.
    """
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    code = getattr(error, "status_code", None)
    if isinstance(code, str) and code and not text.startswith(code):
        text = f"{code} {text}"
    # redis-py puts the address in some messages: keep the code and its strerror, never it.
    return short_reason(text)[:200]


def _secs(value: float) -> str:
    return f"{value:.0f}" if value >= 1 else f"{value:.1f}"
