"""One process's parts: settings, Redis, the store and the config.

A plain container, built once at the edge of a process by `dispatchq.process.wiring`
(which knows every part and the built-in kinds) and handed to the code that needs it. It
is a leaf: it imports no queue, tier or worker, so any room may take a `Runtime` without
reaching the rest. What a room above builds from it once per process (the dispatcher,
`dispatchq.queue.dispatch.dispatcher_for`; the typed tier's provider) is kept in `parts`
under that room's own name, so a test injects a part by putting it there first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from dispatchq.config import Config, load_config
from dispatchq.core.kinds import Kind
from dispatchq.settings import Settings
from dispatchq.storage.connection import RedisClient
from dispatchq.storage.store import Store

__all__ = ["Runtime"]


@dataclass
class Runtime:
    settings: Settings
    redis: RedisClient
    config_override: Config | None = field(default=None, repr=False)
    #: Kinds defined in code (the decision gate's), found by name in every config.
    builtin: Mapping[str, Kind] = field(default_factory=dict, repr=False)
    #: Parts the rooms above make on first use, by name (one dispatcher, one provider).
    parts: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def store(self) -> Store:
        return Store(self.redis, result_ttl=self.settings.result_ttl)

    @cached_property
    def config(self) -> Config:
        if self.config_override is not None:
            return self.config_override
        return load_config(self.settings.config, builtin=self.builtin)
