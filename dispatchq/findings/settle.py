"""Waiting for the gate's judgements: run sessions in this process until they finished.

The `findings` commands enqueue session-tier judgements and run the session tier
in-process, in burst, until theirs are done, so a gate works with or without workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dispatchq.findings.fixer import POLL
from dispatchq.queue.retrigger import window_for
from dispatchq.queue.worker import Until, clean_started, drain
from dispatchq.storage.findings import FindingsStore
from dispatchq.window.marker import waiting_reason

if TYPE_CHECKING:
    from dispatchq.core.judgement import Record
    from dispatchq.runtime import Runtime

__all__ = [
    "settle",
]


# --- waiting for judgements -----------------------------------------------------------------
def settle(
    runtime: Runtime, ids: Sequence[str], *, on_wait: Callable[[str], None] | None = None
) -> str | None:
    """Run sessions in this process until every judgement in `ids` has finished.

    Returns None when all finished, else why the rest wait (a closed window, a missing
    session command, or nobody finishing them). A judgement left running by a process that
    died is recovered the RQ way (its abandoned job is failed, and the session tier puts it
    back in line), so a re-run never waits on a dead process forever.
    """
    settings = runtime.settings
    window = window_for(runtime)
    findings = FindingsStore(runtime.redis)

    def pending() -> list[Record]:
        return [r for r in runtime.store.get_many(list(ids)) if r is not None and not r.finished]

    def stuck() -> str | None:
        left = pending()
        closed = window.closed_for(None)
        if closed and all(r.status != "running" for r in left):
            return waiting_reason(max(closed, key=lambda m: m.lifts_at))
        blocked = findings.session_blocked(settings.host)
        return f"sessions cannot start on this host: {blocked}" if blocked else None

    def idle() -> None:
        if any(r.status == "running" for r in pending()):
            clean_started(runtime.redis, runtime.dispatcher.queues_for("session"))

    idle_limit = settings.session_timeout + settings.heartbeat_interval + settings.heartbeat_grace + 120
    report = drain(
        runtime,
        tiers=("session",),
        until=Until(
            done=lambda: not pending(),
            stuck=stuck,
            idle=idle,
            on_wait=on_wait,
            idle_limit=idle_limit,
            poll=POLL,
        ),
    )
    waiting = report["waiting"]
    return None if waiting is None else str(waiting)
