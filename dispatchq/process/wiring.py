"""The one place that wires every part of dispatchq into a running process.

Everything else receives what it needs; only this module knows all the parts: it
builds a `Runtime` (settings, Redis, the config with the decision gate's built-in
kinds, and the queue's parts, `QUEUE_PARTS`, from which the runtime makes its one
dispatcher and scheduler; its storage gateway and window it makes itself), makes it the
process's current runtime for RQ's by-name job functions
(`jobs.tiers.*`), and starts the long-running roles. Importing the gate here, and
nowhere below, is what keeps `config` and the tiers free of an import circle.

Every command builds its runtime here, and `dispatchq status` runs in operators' loops: so
the heavy parts (the findings gate's built-in kinds, RQ's worker and scheduler loops) are
imported inside the functions that use them, and the built-in kinds are handed to the
`Runtime` as a callable it resolves when the config is first read. A command that never
reads the config (`status`) never imports the gate.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dispatchq.core.tiers import TIERS, automatic_tiers
from dispatchq.launcher.environment import mark_non_dumpable
from dispatchq.process import logs
from dispatchq.queue.parts import QUEUE_PARTS
from dispatchq.runtime import Runtime
from dispatchq.settings import Settings, load_settings
from dispatchq.storage.connection import connect
from dispatchq.storage.outage import wait_for_redis
from dispatchq.supervise import stop_on_signals

if TYPE_CHECKING:
    from dispatchq.config import Config
    from dispatchq.core.kinds import Kind
    from dispatchq.tiers.hooks import SessionHooks

__all__ = [
    "build_runtime",
    "build_runtime_waiting",
    "builtin_kinds",
    "drain",
    "get_runtime",
    "run_scheduler",
    "run_worker",
    "session_hooks",
    "set_runtime",
]


def builtin_kinds() -> dict[str, Kind]:
    """The kinds defined in code (the findings gate's), imported only when a config is read."""
    from dispatchq.findings.run.kinds import builtin_kinds as gate_kinds  # noqa: PLC0415 (lazy: the gate)

    return gate_kinds()


def build_runtime(settings: Settings | None = None, *, config: Config | None = None) -> Runtime:
    """A runtime from these settings (default: the environment's), with the built-in kinds."""
    settings = settings or load_settings()
    return Runtime(
        settings=settings,
        redis=connect(settings),
        config_override=config,
        builtin=builtin_kinds,
        queue_parts=QUEUE_PARTS,
    )


_lock = threading.Lock()
_HOOKS: dict[str, SessionHooks] = {}


def session_hooks() -> Mapping[str, SessionHooks]:
    """The built-in kinds' steps around a spawn, by kind name: what the session tier runs
    for a kind defined in code (`jobs.tiers.session` hands them to it). Made once."""
    with _lock:
        if not _HOOKS:
            from dispatchq.findings.run.kinds import builtin_hooks  # noqa: PLC0415 (lazy: the gate)

            _HOOKS.update(builtin_hooks())
        return _HOOKS


_current: Runtime | None = None


def set_runtime(runtime: Runtime | None) -> None:
    """Make `runtime` the one RQ's job functions use in this process (as dramatiq's broker)."""
    global _current
    with _lock:
        _current = runtime


def get_runtime() -> Runtime:
    """The process's runtime; a job run by a plain `rq worker` builds one from the environment."""
    global _current
    with _lock:
        if _current is None:
            _current = build_runtime()
        return _current


def build_runtime_waiting(settings: Settings, *, role: str) -> Runtime | None:
    """A runtime for a long-running role, waiting for Redis instead of failing without it.

    A worker started before its Redis (a unit ordering, a server still loading) waits,
    says so once, and starts when Redis answers. The config is validated first, so a bad
    file is still a one-line error and exit 2. None: the process was asked to stop while
    it waited.

    Marked non-dumpable first: a long-running role holds the Redis password and, for
    workers, the keys, and may wait here for minutes; a session must not read them from
    its `/proc/<pid>/environ` or memory meanwhile.
    """
    mark_non_dumpable()
    logs.configure(role, settings.log_format, rq_info=settings.log_rq)
    log = logging.getLogger(f"dispatchq.{role}")
    from dispatchq.config import load_config  # noqa: PLC0415 (lazy: the YAML parser)

    load_config(settings.config, builtin=builtin_kinds(), required=False)
    stop = threading.Event()
    with stop_on_signals(stop):
        # `starting`: a wrong password now is a one-line exit 2; once running, it is waited on.
        client = wait_for_redis(settings, log=log, stopping=stop.is_set, starting=True)
    if client is None:
        return None
    from dispatchq.config import config_source  # noqa: PLC0415 (lazy: the YAML parser)

    log.info("%s", config_source(settings.config))  # after Redis: a refusal at start stays one line
    return Runtime(settings=settings, redis=client, builtin=builtin_kinds, queue_parts=QUEUE_PARTS)


def run_worker(runtime: Runtime, tier: str, *, burst: bool = False, quiet: bool = False) -> int:
    """`dispatchq worker TIER`: this process becomes one tier's worker."""
    from dispatchq.workers import run as worker  # noqa: PLC0415 (lazy: RQ's worker, every tier)

    logs.configure(
        tier,
        runtime.settings.log_format,
        level=logging.WARNING if quiet else logging.INFO,
        rq_info=runtime.settings.log_rq,
    )
    mark_non_dumpable()
    set_runtime(runtime)
    return worker.run_worker(runtime, tier, burst=burst, quiet=quiet)


def run_scheduler(runtime: Runtime, *, burst: bool = False) -> None:
    """`dispatchq scheduler`: rq-scheduler's loop plus the control queue."""
    from dispatchq.queue import scheduler  # noqa: PLC0415 (lazy: rq-scheduler)

    logs.configure("scheduler", runtime.settings.log_format, rq_info=runtime.settings.log_rq)
    mark_non_dumpable()
    set_runtime(runtime)
    scheduler.run_scheduler(runtime, burst=burst)


def drain(runtime: Runtime, *, horizon: float | None = None, sessions: bool = True) -> dict[str, object]:
    """Run every tier in this process until nothing more can be answered now (`dispatchq run`).

    This process runs sessions and holds every key, as a worker does: non-dumpable too."""
    from dispatchq.workers import run as worker  # noqa: PLC0415 (lazy: RQ's worker, every tier)

    mark_non_dumpable()
    set_runtime(runtime)
    tiers = TIERS if sessions else automatic_tiers()
    return worker.drain(runtime, horizon=horizon, tiers=tiers)
