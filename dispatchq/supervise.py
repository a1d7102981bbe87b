"""The one supervise loop of every long-running role: a tier's worker, the scheduler, serve.

A long-running process never exits because Redis went away: it waits, says so once, and
carries on; it returns only when asked to stop (SIGTERM, SIGINT), or when a burst run is
done. What differs between roles is their body, a `Role`: one round of its work, whether
that round saw the stop itself, and its last step. The rest is this loop, written once:

- **signals**: SIGTERM and SIGINT set the stop. They are put back before and after every
  round, because a round may install its own (RQ's worker loop, uvicorn) and leave them;
  the handlers found at the start are restored at the end.
- **Redis away** (down, loading, read-only, refusing a rotated password): one line when it
  starts (`OutageLog`), a wait for a writable primary (`wait_for_redis`, which restarts the
  embedded server when it is gone), one line when it is back, then the round again.
- **Redis out of memory**: one line (`MemoryLog`), a write probe per back-off step, one line
  once it has room again, then the round again.
- **anything else a round raises**: one line, a capped back-off, the round again; a
  `UserError` that is not weather (a configuration mistake) is raised instead: exit 2.
- **the shutdown order**: the round ends first (the role's own warm stop: RQ finishes its
  job), then the role's `close` (its heartbeat dropped; best effort, Redis may be away),
  then the signal handlers are restored, and the loop returns 0 (or a burst's result).

The heartbeats themselves are each role's: RQ's worker beats inside its own loop (and
waits out an outage there, `workers.base`), the scheduler writes its key at every tick.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dispatchq.errors import UserError
from dispatchq.storage.outage import (
    Backoff,
    MemoryLog,
    OutageLog,
    is_out_of_memory,
    is_outage,
    wait_for_redis,
)

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime

__all__ = ["FIRST_RETRY", "SIGNALS", "Done", "Ended", "Role", "failure_line", "stop_on_signals", "supervise"]

#: The first wait after Redis is found away (then it doubles, up to 30 s).
FIRST_RETRY = Backoff().next()
#: What asks a long-running process to stop.
SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class Done:
    """What a round returns when the role has finished (a burst run): the loop returns `result`."""

    result: int = 0


class Ended(Exception):
    """A round ended though nobody asked it to stop and Redis answers: started again, said once."""


@dataclass
class Role:
    """A long-running role's body, as the loop drives it.

    `round` runs once and returns the seconds to wait before the next round, or `Done`;
    it raises on weather or a fault. `stopped` says the round itself took the stop signal
    (RQ's handlers are installed while its loop runs). `close` is the role's last step.
    """

    name: str
    round: Callable[[], float | Done]
    stopped: Callable[[], bool] = field(default=lambda: False)
    close: Callable[[], None] = field(default=lambda: None)


def failure_line(error: BaseException) -> str:
    """An error as one line: its class and the first line of its text."""
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}"[:300] if text else type(error).__name__


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[Callable[[], None]]:
    """SIGTERM and SIGINT set `stop` while inside; the handlers found are restored after.

    Yields a function that puts this module's handlers back, for after anything that
    installed its own.
    """
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    def install() -> None:
        for sig in SIGNALS:
            signal.signal(sig, on_signal)

    install()
    try:
        yield install
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def supervise(
    runtime: Runtime,
    role: Role,
    *,
    log: logging.Logger,
    sleep: Callable[[float], None] = time.sleep,
    stop: threading.Event | None = None,
) -> int:
    """Run `role` until asked to stop (0) or until a round is `Done` (its result).

    Redis going away is waited out, never a reason to return; see the module docstring for
    what each kind of trouble costs and the order of the shutdown.
    """
    stop = stop or threading.Event()
    with stop_on_signals(stop) as listen:
        try:
            return _Loop(runtime, role, log, sleep, stop).run(listen)
        finally:
            with contextlib.suppress(Exception):  # a stop during an outage has nothing to clean up
                role.close()


def _one_round(role: Role) -> tuple[BaseException | None, float | Done]:
    """The round's outcome, or what it raised that the loop rides out."""
    try:
        return None, role.round()
    except UserError as error:
        if not is_outage(error):
            raise  # a configuration mistake: one line, exit 2
        return error, 0.0
    except Exception as error:
        return error, 0.0


@dataclass
class _Loop:
    """What the loop keeps between rounds: the outage's and the memory's lines, the back-off."""

    runtime: Runtime
    role: Role
    log: logging.Logger
    sleep: Callable[[float], None]
    stop: threading.Event
    outage: OutageLog = field(init=False)
    backoff: Backoff = field(default_factory=Backoff, init=False)

    def __post_init__(self) -> None:
        self.outage = OutageLog.for_settings(self.runtime.settings, self.log)

    def run(self, listen: Callable[[], None]) -> int:
        """Rounds until a stop or `Done`; `listen` puts the loop's signal handlers back."""
        while not self.stop.is_set():
            listen()
            try:
                failure, outcome = _one_round(self.role)
            finally:
                listen()  # the round's own handlers go; ours again
            if self.stop.is_set() or self.role.stopped():
                break
            if failure is not None:
                self.recover(failure)
                continue
            self.healthy()
            if isinstance(outcome, Done):
                return outcome.result
            self.pause(outcome)
        return 0

    def healthy(self) -> None:
        """A round went through: whatever was said to be wrong is over."""
        self.outage.up()
        self.backoff.reset()

    def recover(self, failure: BaseException) -> None:
        """Wait out what the round met, saying so once, before the next round."""
        if is_outage(failure):
            # Wait for a writable primary (restarting the embedded server if it is gone).
            self.outage.down(failure, FIRST_RETRY)
            wait_for_redis(
                self.runtime.settings,
                log=self.log,
                stopping=self.stop.is_set,
                sleep=self.sleep,
                outage=self.outage,
            )
            return
        self.outage.up()
        if is_out_of_memory(failure):
            self._wait_for_room(failure)
            return
        delay = self.backoff.next()
        if isinstance(failure, Ended):
            self.log.warning("%s's loop ended unexpectedly; starting it again", self.role.name)
        else:
            self.log.error(
                "%s's loop failed (%s); starting it again in %.0f s",
                self.role.name,
                failure_line(failure),
                delay,
            )
        self.pause(delay)

    def _wait_for_room(self, failure: BaseException) -> None:
        """Redis answers but refuses writes (maxmemory, noeviction): one line, then a write
        probe per back-off step instead of running the round into it again."""
        memory = MemoryLog(self.log)
        while not self.stop.is_set():
            delay = self.backoff.next()
            memory.down(failure, delay, self.runtime.redis)
            self.pause(delay)
            if self._accepts_writes():
                break
        memory.up()
        self.backoff.reset()

    def _accepts_writes(self) -> bool:
        try:
            return self.runtime.storage.records.accepts_writes()
        except Exception:  # Redis went away meanwhile: the outage path takes over next round
            return True

    def pause(self, delay: float) -> None:
        """Sleep `delay`, waking every 0.2 s to honour a stop at once."""
        deadline = time.monotonic() + delay
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.sleep(min(0.2, left))
