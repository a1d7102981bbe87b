"""dispatchq: a job queue that answers each judgement at the cheapest tier that can.

The public facade. Producers use `Client`; `JudgementIn` is what goes in and `Record`
(with its `TrailEntry`s) what comes out; `load_settings` builds the settings a client
or a process runs with; `DispatchqError` and `UserError` are what to catch. Everything
else is reached through its room (`dispatchq.tiers`, `dispatchq.window`, ...).
"""

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
