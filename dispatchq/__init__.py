"""dispatchq: a job queue that answers each judgement at the cheapest tier that can.

The public facade. Producers use `Client`; `JudgementIn` is what goes in and `Record`
(with its `TrailEntry`s) what comes out; `load_settings` builds the settings a client
or a process runs with; `DispatchqError` and `UserError` are what to catch. Everything
else is reached through its room (`dispatchq.tiers`, `dispatchq.window`, ...).

The names resolve on first use (PEP 562): importing any dispatchq module imports this
package first, and `dispatchq.errors` in a CLI command must not pay for the client, the
config loader and RQ.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dispatchq.client import Client, Enqueued
    from dispatchq.core.judgement import Judgement, JudgementIn, Record, TrailEntry
    from dispatchq.errors import DispatchqError, UserError
    from dispatchq.settings import Settings, load_settings

__all__ = [
    "Client",
    "DispatchqError",
    "Enqueued",
    "Judgement",
    "JudgementIn",
    "Record",
    "Settings",
    "TrailEntry",
    "UserError",
    "load_settings",
]

#: Where each public name lives.
_HOMES = {
    "Client": "dispatchq.client",
    "Enqueued": "dispatchq.client",
    "Judgement": "dispatchq.core.judgement",
    "JudgementIn": "dispatchq.core.judgement",
    "Record": "dispatchq.core.judgement",
    "TrailEntry": "dispatchq.core.judgement",
    "DispatchqError": "dispatchq.errors",
    "UserError": "dispatchq.errors",
    "Settings": "dispatchq.settings",
    "load_settings": "dispatchq.settings",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'dispatchq' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
