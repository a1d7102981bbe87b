"""Waiting for the gate's judgements: run sessions in this process until they finished.

The `findings` commands enqueue session-tier judgements and run the session tier
in-process, in burst, until theirs are done, so a gate works with or without workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dispatchq.findings.fixer import POLL
from dispatchq.queue.retrigger import window_for
from dispatchq.queue.session_worker import burst
from dispatchq.queue.worker import clean_started
from dispatchq.storage.findings import FindingsStore
from dispatchq.window.marker import waiting_reason

if TYPE_CHECKING:
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
    idle_limit = settings.session_timeout + settings.heartbeat_interval + settings.heartbeat_grace + 120
    last = time.monotonic()
    told = False
    while True:
        records = runtime.store.get_many(list(ids))
        pending = [r for r in records if r is not None and not r.finished]
        if not pending:
            return None
        if burst(runtime):
            last = time.monotonic()
            continue
        closed = window_for(runtime).closed_for(None)
        if closed and all(r.status != "running" for r in pending):
            return waiting_reason(max(closed, key=lambda m: m.lifts_at))
        blocked = FindingsStore(runtime.redis).session_blocked(settings.host)
        if blocked:
            return f"sessions cannot start on this host: {blocked}"
        if time.monotonic() - last > idle_limit:
            return "nothing finished them in time (is another worker holding them?)"
        if any(r.status == "running" for r in pending):
            clean_started(runtime.redis, runtime.dispatcher.queues_for("session"))
        if not told and on_wait is not None:
            told = True
            on_wait("waiting for sessions to finish (a session slot is busy, or one is still running)")
        time.sleep(POLL)
