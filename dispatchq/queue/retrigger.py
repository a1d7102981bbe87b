"""The window's RQ side: the one scheduled retrigger per scope.

Exactly one retrigger is scheduled with rq-scheduler for the lift instant of each
scope (re-scheduled, never duplicated, when the lift moves later). It runs on the
control queue that `dispatchq scheduler` executes itself. Session workers also time
the lift themselves, so a dead scheduler costs nothing but its status line.

The window (`dispatchq.window.face.Window`, `runtime.window`) does not import the queue: the
runtime hands it `schedule_retrigger` as its `reschedule` callable (`dispatchq.queue.parts`).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from dispatchq.core.entrypoints import RETRIGGER_JOB
from dispatchq.core.status import Retrigger
from dispatchq.window.face import Window

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime

__all__ = ["RETRIGGER_JOB", "retrigger", "schedule_retrigger", "scheduled_retriggers"]


def schedule_retrigger(runtime: Runtime, window: Window, scope: str) -> str | None:
    """Make the scheduled retriggers for `scope` exactly one, at the marker's lift instant.

    Concurrent raisers, whatever their order, must leave one job at the latest time rather
    than one each. Each raiser records a request, then whoever holds the scope's lock
    serves requests until none is left; one that finds the lock held returns at once, and
    the holder, which checks again after releasing, serves its request. Returns the job id
    when this call scheduled it.
    """
    store = window.store
    store.request_retrigger(scope)
    job_id: str | None = None
    while True:
        lock = store.retrigger_lock(scope)
        if not lock.acquire():
            return job_id
        try:
            while store.take_retrigger_request(scope):
                job_id = _schedule_one(runtime, window, scope)
        finally:
            lock.release()
        if not store.retrigger_requested(scope):
            return job_id


def _schedule_one(runtime: Runtime, window: Window, scope: str) -> str | None:
    """Cancel the scope's retriggers and schedule one at the marker's lift, if it is closed."""
    store = window.store
    marker = window.get(scope)
    scheduler = runtime.scheduler
    for job in list(scheduler.get_jobs()):
        if job.func_name == RETRIGGER_JOB and job.args and job.args[0] == scope:
            scheduler.cancel(job)
    if marker is None or not marker.closed():
        store.clear_marker_field(scope, "retrigger")
        return None
    # rq-scheduler keeps whole seconds: round up so it never fires before the lift.
    at = datetime.fromtimestamp(math.ceil(marker.lifts_at), UTC)
    job = scheduler.enqueue_at(
        at,
        RETRIGGER_JOB,
        scope,
        marker.lifts_at,
        queue_name=runtime.storage.jobs.control_queue(),
        timeout=60,
        job_result_ttl=0,
        job_description=f"dispatchq retrigger {scope}",
    )
    store.set_marker_fields(scope, retrigger=job.id)
    return str(job.id)


def retrigger(runtime: Runtime, scope: str, lifts_at: float) -> str:
    """The scheduled job (`jobs.tiers.retrigger`): at the lift instant, one probe goes first."""
    return runtime.window.lift(scope)


def scheduled_retriggers(runtime: Runtime) -> list[Retrigger]:
    """The retriggers rq-scheduler holds, soonest first: the queue's part of `status`'s window."""
    out = []
    for job, when in runtime.scheduler.get_jobs(with_times=True):
        if job.func_name == RETRIGGER_JOB:
            at = when.replace(tzinfo=UTC) if when.tzinfo is None else when
            out.append(Retrigger(scope=job.args[0] if job.args else "?", at=at.isoformat(), job=job.id))
    return out
