"""One process's parts: settings, Redis, the store, the config and the dispatcher.

A plain container, built once at the edge of a process by `dispatchq.processes` (which
knows every part and the built-in kinds) and handed to the code that needs it. It
imports no tier, so any room may take a `Runtime` without reaching the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from dispatchq.config import Config, load_config
from dispatchq.core.kinds import Kind
from dispatchq.queue.dispatch import Dispatcher
from dispatchq.settings import Settings
from dispatchq.storage.store import Store

if TYPE_CHECKING:
    import redis

    from dispatchq.tiers.typesafe import Provider

__all__ = ["Runtime"]


@dataclass
class Runtime:
    settings: Settings
    redis: redis.Redis
    config_override: Config | None = field(default=None, repr=False)
    #: Kinds defined in code (the decision gate's), found by name in every config.
    builtin: Mapping[str, Kind] = field(default_factory=dict, repr=False)
    #: The typed tier's provider (one HTTP connection pool per process), made on first use.
    typed_provider: Provider | None = field(default=None, repr=False)

    @cached_property
    def store(self) -> Store:
        return Store(self.redis, result_ttl=self.settings.result_ttl)

    @cached_property
    def config(self) -> Config:
        if self.config_override is not None:
            return self.config_override
        return load_config(self.settings.config, builtin=self.builtin)

    @cached_property
    def dispatcher(self) -> Dispatcher:
        return Dispatcher(
            settings=self.settings, redis=self.redis, store=self.store, config=lambda: self.config
        )
