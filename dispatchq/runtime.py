"""One process's wiring: settings, config, Redis, store, built once at the edge.

RQ imports job functions by name and calls them with plain arguments, so a job needs
a way to reach the process's objects. The worker sets the runtime before it starts;
a job run by a plain `rq worker` builds one from the environment on first use (as
dramatiq does with its global broker).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import redis

from dispatchq.config import Config, load_config
from dispatchq.settings import Settings, load_settings
from dispatchq.storage.connection import connect
from dispatchq.storage.store import Store

if TYPE_CHECKING:
    from dispatchq.queue.dispatch import Dispatcher


@dataclass
class Runtime:
    settings: Settings
    redis: redis.Redis
    config_override: Config | None = field(default=None, repr=False)

    @cached_property
    def store(self) -> Store:
        return Store(self.redis, result_ttl=self.settings.result_ttl)

    @cached_property
    def config(self) -> Config:
        if self.config_override is not None:
            return self.config_override
        return load_config(self.settings.config)

    @cached_property
    def dispatcher(self) -> Dispatcher:
        from dispatchq.queue.dispatch import Dispatcher

        return Dispatcher(self)

    @classmethod
    def build(cls, settings: Settings | None = None, *, config: Config | None = None) -> Runtime:
        settings = settings or load_settings()
        return cls(settings=settings, redis=connect(settings), config_override=config)


_lock = threading.Lock()
_current: Runtime | None = None


def set_runtime(runtime: Runtime | None) -> None:
    global _current
    with _lock:
        _current = runtime


def get_runtime() -> Runtime:
    global _current
    with _lock:
        if _current is None:
            _current = Runtime.build()
        return _current
