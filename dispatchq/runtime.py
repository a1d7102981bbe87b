"""One process's parts: settings, Redis, the store and the config.

A plain container, built once at the edge of a process by `dispatchq.process.wiring`
(which knows every part and the built-in kinds) and handed to the code that needs it. It
is a leaf: it imports no queue, tier or worker, so any room may take a `Runtime` without
reaching the rest. What a room above builds from it once per process (the dispatcher,
`dispatchq.queue.dispatch.dispatcher_for`; the typed tier's provider) is kept in `parts`
under that room's own name, so a test injects a part by putting it there first.

The built-in kinds may be given as a callable, called once when the config is first read:
they live in the findings gate, and a command that never reads the config (`status`, run
in operators' loops) should not import it to start. For the same reason the config module
(its YAML parser) is imported when the config is first read, not with this one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from dispatchq.settings import Settings
from dispatchq.storage.connection import RedisClient
from dispatchq.storage.store import Store

if TYPE_CHECKING:
    from dispatchq.config import Config
    from dispatchq.core.kinds import Kind

__all__ = ["Runtime"]


@dataclass
class Runtime:
    settings: Settings
    redis: RedisClient
    config_override: Config | None = field(default=None, repr=False)
    #: Kinds defined in code (the decision gate's), found by name in every config; or a
    #: callable returning them, called when the config is first read.
    builtin: Mapping[str, Kind] | Callable[[], Mapping[str, Kind]] = field(default_factory=dict, repr=False)
    #: Parts the rooms above make on first use, by name (one dispatcher, one provider).
    parts: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def store(self) -> Store:
        return Store(self.redis, result_ttl=self.settings.result_ttl)

    @cached_property
    def config(self) -> Config:
        if self.config_override is not None:
            return self.config_override
        from dispatchq.config import load_config  # noqa: PLC0415 (lazy: the YAML parser, on first read)

        builtin = self.builtin() if callable(self.builtin) else self.builtin
        return load_config(self.settings.config, builtin=builtin)
