"""One process's parts: settings, Redis, the storage gateway, the config, the window, the
dispatcher and the scheduler, each built once.

A container built at the edge of a process by `dispatchq.process.wiring` (which knows every
part and the built-in kinds) and handed to the code that needs it. It is a leaf: it imports
no queue, tier or worker, so any room may take a `Runtime` without reaching the rest. The
parts that live above it (the dispatcher and the scheduler in `dispatchq.queue`) are made by
the `QueueParts` whoever builds the runtime hands in (`dispatchq.queue.parts.QUEUE_PARTS`);
the runtime names them only by the `Dispatching` and `Scheduling` protocols below. Every
part is made on first use, so `dispatchq status` pays only for what it reads. What a room
makes for itself once per process (the typed tier's provider) is kept in `parts` under
that room's own name, so a test injects a part by putting it there first.

The built-in kinds may be given as a callable, called once when the config is first read:
they live in the findings gate, and a command that never reads the config (`status`, run
in operators' loops) should not import it to start. For the same reason the config module
(its YAML parser) is imported when the config is first read, not with this one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from dispatchq.errors import UserError
from dispatchq.pools.credentials import Pool
from dispatchq.settings import Settings
from dispatchq.storage.connection import RedisClient
from dispatchq.storage.gateway import Storage

if TYPE_CHECKING:
    from dispatchq.config import Config
    from dispatchq.core.kinds import Kind
    from dispatchq.window.face import Window

__all__ = ["Dispatching", "QueueParts", "Runtime", "Scheduling"]


class Dispatching(Protocol):
    """The dispatcher (`dispatchq.queue.dispatch.Dispatcher`) as the runtime names it."""

    def queue(self, tier: str, host: str | None = None) -> Any: ...
    def queues_for(self, tier: str) -> list[Any]: ...
    def job_timeout(self, tier: str) -> int: ...
    def prepare(self, judgement: Any, *, force: bool = ..., fingerprints: Any = ...) -> Any: ...
    def submit(self, prepared: Any) -> list[tuple[str, bool]]: ...
    def build_chunk(self, chunk: Any) -> Any: ...
    def run_chunk(self, built: Any) -> list[tuple[str, bool]]: ...
    def commit(self, moves: Any) -> None: ...
    def requeue(self, ids: Iterable[str], why: str, *, seen: Any = ...) -> int: ...
    def retry(self, jid: str) -> None: ...
    def cancel(self, jid: str) -> bool: ...


class Scheduling(Protocol):
    """The scheduler (`dispatchq.queue.scheduler.DispatchqScheduler`) as the runtime names it."""

    def get_jobs(
        self, until: Any = ..., with_times: bool = ..., offset: Any = ..., length: Any = ...
    ) -> Any: ...
    def get_jobs_to_queue(self, with_times: bool = ...) -> Any: ...
    def enqueue_at(self, scheduled_time: Any, func: Any, *args: Any, **kwargs: Any) -> Any: ...
    def enqueue_job(self, job: Any) -> Any: ...
    def enqueue_jobs(self) -> Any: ...
    def acquire_lock(self) -> bool: ...
    def remove_lock(self) -> None: ...
    def cancel(self, job: Any) -> None: ...
    def count(self, up_to: Any = ...) -> int: ...
    def __contains__(self, item: Any) -> bool: ...


@dataclass(frozen=True)
class QueueParts:
    """How the parts living in `dispatchq.queue` are made for a runtime (made once each)."""

    dispatcher: Callable[[Runtime], Dispatching]
    scheduler: Callable[[Runtime], Scheduling]
    #: Schedule the one retrigger of a scope at its marker's lift (the window's `reschedule`).
    reschedule: Callable[[Runtime, str], str | None]


@dataclass
class Runtime:
    settings: Settings
    redis: RedisClient
    config_override: Config | None = field(default=None, repr=False)
    #: Kinds defined in code (the decision gate's), found by name in every config; or a
    #: callable returning them, called when the config is first read.
    builtin: Mapping[str, Kind] | Callable[[], Mapping[str, Kind]] = field(default_factory=dict, repr=False)
    #: How the dispatcher and the scheduler are made (None: this runtime has no queue parts,
    #: and asking for one says so).
    queue_parts: QueueParts | None = field(default=None, repr=False, compare=False)
    #: Parts the rooms above make for themselves on first use, by name (the typed provider).
    parts: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    @cached_property
    def storage(self) -> Storage:
        """Every Redis operation, one attribute per area (`dispatchq.storage.gateway`)."""
        return Storage(self.redis, result_ttl=self.settings.result_ttl)

    @cached_property
    def config(self) -> Config:
        if self.config_override is not None:
            return self.config_override
        from dispatchq.config import load_config  # noqa: PLC0415 (lazy: the YAML parser, on first read)

        builtin = self.builtin() if callable(self.builtin) else self.builtin
        return load_config(self.settings.config, builtin=builtin)

    @cached_property
    def window(self) -> Window:
        """The usage window as this process sees it: its storage, settings, kinds and scheduler."""
        from dispatchq.window.face import Window  # noqa: PLC0415 (lazy: `status` may never need it)

        return Window(
            self.storage.window,
            self.storage.records,
            self.settings,
            kinds=lambda: self.config.kinds,
            reschedule=lambda scope: self._queue_parts("the window's retrigger").reschedule(self, scope),
            pool=self.pool,
        )

    def pool(self) -> Pool:
        """The credentials sessions may use: the file's `credentials:`, else the environment's one.

        A process with no readable config (an operator's shell) sees the environment's one,
        named `default`, as every store written before pools does.
        """
        settings = self.settings
        try:
            if "config" in self.__dict__ or self.config_override is not None:
                configured = self.config.credentials
            else:  # the kinds are not needed: read the section alone (`status` stays light)
                from dispatchq.config import load_pool  # noqa: PLC0415 (lazy: the YAML parser)

                configured = load_pool(settings.config)
        except UserError:
            configured = None
        return configured or Pool.of_one(settings.session_credential_var, settings.session_concurrency)

    @cached_property
    def dispatcher(self) -> Dispatching:
        """The process's one dispatcher (its queues are cached)."""
        return self._once("dispatcher", lambda: self._queue_parts("a dispatcher").dispatcher(self))

    @cached_property
    def scheduler(self) -> Scheduling:
        """The process's one rq-scheduler, over dispatchq's job and queue classes."""
        return self._once("scheduler", lambda: self._queue_parts("a scheduler").scheduler(self))

    def _once(self, name: str, make: Callable[[], Any]) -> Any:
        """One part per runtime even when two threads ask for it first at the same moment."""
        with self._lock:
            if name not in self.__dict__:
                self.__dict__[name] = make()
            return self.__dict__[name]

    def _queue_parts(self, what: str) -> QueueParts:
        if self.queue_parts is None:
            raise RuntimeError(
                f"this runtime was built without its queue parts, so it cannot make {what}: build it with "
                "dispatchq.process.wiring.build_runtime or pass queue_parts=dispatchq.queue.parts.QUEUE_PARTS"
            )
        return self.queue_parts
