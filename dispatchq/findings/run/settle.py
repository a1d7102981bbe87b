"""Waiting for the gate's judgements: run sessions in this process until they finished.

The `findings` commands enqueue session-tier judgements and run the session tier
in-process, in burst, until theirs are done, so a gate works with or without workers.
While they wait on someone else the person is told who: which judgement holds each busy
session slot, on which worker, and when it is recovered if that worker is gone. A holder
whose worker ran on this host and is known dead (a killed `findings` command) is recovered
at once, the RQ way, rather than when its heartbeat lapses.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dispatchq.findings.run.fixer import POLL
from dispatchq.findings.texts.screens import display
from dispatchq.queue.liveness import SessionHolder, abandon_now, session_holders
from dispatchq.window.marker import waiting_reason
from dispatchq.workers.run import Until, clean_started, drain

if TYPE_CHECKING:
    from dispatchq.core.judgement import Record
    from dispatchq.runtime import Runtime

__all__ = [
    "describe_holders",
    "settle",
]


def _name(record: Record | None, jid: str) -> str:
    """`the fixer of reviews/report.md#DOC-1 (judgement 3f2a…)`: what a person can act on."""
    if record is None:
        return f"judgement {jid}"
    return f"the {record.kind.removeprefix('findings-')} of {display(record.target)} (judgement {jid})"


def _at(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%H:%M:%S UTC")


def describe_holders(
    holders: Sequence[SessionHolder], names: dict[str, Record | None], *, mine: int, busy: int, limit: int
) -> str:
    """What the wait is on, in one message: each started session, who runs it, and when it is
    recovered should its worker be gone."""
    head = f"waiting for {mine} session(s) to finish"
    if busy >= limit:
        head += f"; all {limit} session slot(s) are busy"
    if not holders:
        return head
    parts = []
    for h in holders:
        where = f"worker {h.worker or '?'} on host {h.host or '?'}" + (f", pid {h.pid}" if h.pid else "")
        parts.append(
            f"{_name(names.get(h.jid), h.jid)} runs in {where}; if that worker is gone it is recovered "
            f"at about {_at(h.expires)}, when its heartbeat lapses"
        )
    return head + ": " + "; ".join(parts)


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
    window = runtime.window
    findings = runtime.storage.findings
    records = runtime.storage.records

    def pending() -> list[Record]:
        return [r for r in records.get_many(list(ids)) if r is not None and not r.finished]

    def stuck() -> str | None:
        left = pending()
        closed = window.closed_everywhere(None)
        if closed and all(r.status != "running" for r in left):
            return waiting_reason(max(closed, key=lambda m: m.lifts_at))
        blocked = findings.session_blocked(settings.host)
        return f"sessions cannot start on this host: {blocked}" if blocked else None

    queues = runtime.dispatcher.queues_for("session")
    # A busy worker beats every interval; two missed beats and a gone pid: it is dead.
    stale_after = 2.0 * settings.heartbeat_interval + 1.0

    def idle() -> None:
        # A dead holder's job first (ours or another's: either keeps a slot or our answer).
        for holder in session_holders(runtime.redis, queues, host=settings.host, stale_after=stale_after):
            if holder.dead:
                if on_wait is not None:
                    on_wait(
                        f"{_name(records.get(holder.jid), holder.jid)} was running in a process "
                        f"on this host that is gone (pid {holder.pid}): recovered now, back in line"
                    )
                abandon_now(runtime.redis, holder)
        if any(r.status == "running" for r in pending()):
            clean_started(runtime.redis, queues)

    def waiting(_generic: str) -> None:
        if on_wait is None:
            return
        holders = [
            h
            for h in session_holders(runtime.redis, queues, host=settings.host, stale_after=stale_after)
            if not h.dead
        ]
        names = {h.jid: runtime.storage.records.get(h.jid) for h in holders}
        busy = len({h.slot for h in holders if h.slot})
        on_wait(
            describe_holders(
                holders, names, mine=len(pending()), busy=busy, limit=settings.session_concurrency
            )
        )

    idle_limit = settings.session_timeout + settings.heartbeat_interval + settings.heartbeat_grace + 120
    report = drain(
        runtime,
        tiers=("session",),
        until=Until(
            done=lambda: not pending(),
            stuck=stuck,
            idle=idle,
            on_wait=waiting,
            idle_limit=idle_limit,
            poll=POLL,
        ),
    )
    waiting = report["waiting"]
    return None if waiting is None else str(waiting)
