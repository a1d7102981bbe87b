"""Worker processes: RQ workers tuned for dispatchq's batch jobs.

RQ runs execution, lifecycles, failure registries and retries. What dispatchq adds:

- `SimpleWorker` without a fork per job (jobs carry batches; forking per batch buys
  nothing but latency), with a heartbeat thread, so a worker killed mid-job is
  noticed after `heartbeat_interval + heartbeat_grace` seconds instead of after the
  job's whole timeout, and its job is retried by RQ;
- the session worker's admission loop (see `workers.session`), which replaces RQ's
  dequeue so that no session starts while the usage window is closed;
- `job_failed`, RQ's failure callback: once RQ has no retries left, the job's
  unfinished judgements fail visibly, each with the reason.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rq import Queue
from rq.exceptions import AbandonedJobError
from rq.job import Job
from rq.registry import StartedJobRegistry

from dispatchq.core.entrypoints import TIER_OF_JOB
from dispatchq.core.judgement import TrailEntry
from dispatchq.core.tiers import TIERS, row
from dispatchq.queue.entrypoints import DispatchqJob
from dispatchq.queue.scheduler import due_retries, release_due_retries
from dispatchq.queue.serializer import JSONSerializer
from dispatchq.supervise import Done, Ended, Role, supervise
from dispatchq.workers.base import DispatchqWorker, build_worker
from dispatchq.workers.session import SessionWorker, session_job_lost
from dispatchq.workers.session import burst as session_burst

if TYPE_CHECKING:
    import redis

    from dispatchq.runtime import Runtime

__all__ = [
    "TIER_OF_JOB",
    "Until",
    "clean_started",
    "drain",
    "job_failed",
    "log",
    "make_worker",
    "run_worker",
]

log = logging.getLogger("dispatchq.workers.run")


def make_worker(
    runtime: Runtime, tier: str, *, name: str | None = None, heal: bool = True
) -> DispatchqWorker:
    """The worker for `tier`: the session tier's admits before it dequeues."""
    cls = SessionWorker if row(tier).worker == "session" else DispatchqWorker
    return build_worker(cls, runtime, tier, name=name, heal=heal)


def run_worker(
    runtime: Runtime,
    tier: str,
    *,
    burst: bool = False,
    quiet: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run one tier's worker in this process until stopped (or, in burst, until idle).

    The body of `dispatchq.supervise`'s loop, which waits out Redis going away: RQ's own
    loop quits on an error it cannot handle (a dropped connection, `LOADING` while the
    append-only file loads), and the supervise loop starts it again once Redis takes a
    write. Returns 0 on a requested stop; a configuration error raises (exit 2).

    A burst typed worker does not strand the provider retries it scheduled: it waits for
    those due within DISPATCHQ_RETRY_HORIZON, runs them, and returns how many are left
    scheduled beyond it (0 otherwise).
    """
    stop = threading.Event()
    body = _WorkerBody(runtime, tier, burst=burst, level="WARNING" if quiet else "INFO", stop=stop)
    role = Role(f"the {tier} worker", body.round, stopped=body.stopped)
    return supervise(runtime, role, log=log, sleep=sleep, stop=stop)


@dataclass
class _WorkerBody:
    """One round: a worker built and RQ's loop run until it returns."""

    runtime: Runtime
    tier: str
    burst: bool
    level: str
    #: The supervise loop's stop: set by a signal that came while RQ's handlers were not in.
    stop: threading.Event = field(default_factory=threading.Event)
    worker: DispatchqWorker | None = None
    release: bool = False

    def stopped(self) -> bool:
        return self.stop.is_set() or (self.worker is not None and self.worker.stopping)

    def round(self) -> float | Done:
        runtime = self.runtime
        if self.release:
            self.release = False
            release_due_retries(runtime)  # the retries the last round waited for are due
        self.worker = None
        if self.stop.is_set():
            return Done()
        self.worker = make_worker(runtime, self.tier)
        self.worker.outer_stop = self.stop
        self.worker.work(burst=self.burst, logging_level=self.level, with_scheduler=False)
        if self.worker.stopping:
            return Done()
        runtime.storage.server.ping()  # RQ's loop ends on an error it logged: Redis away is waited out
        if not self.burst:
            # Nobody asked it to stop and Redis answers: start it again rather than leave
            # the tier without a worker.
            raise Ended(self.tier)
        if not row(self.tier).delayed_retries:
            return Done()
        due, later = due_retries(runtime, runtime.settings.retry_horizon)
        if due is None:
            return Done(later)
        self.release = True
        return max(0.0, due - time.time())


def job_failed(runtime: Runtime, job: Job, exc_type: Any, exc_value: Any) -> None:
    """RQ's failure callback: a job raised, or its worker died (RQ found it abandoned).

    A worker's death is counted on each unfinished judgement's record (`deaths`), not by
    RQ's `retries_left`: after DISPATCHQ_JOB_RETRIES deaths the judgement fails with the
    reason "its worker died N times". Until then RQ runs the same job again.

    Failures are per judgement: when a job carrying several judgements dies for good
    (one poison judgement can crash its worker every time), each unfinished judgement
    is re-enqueued in a job of its own, so only the one that really fails, fails.
    """
    func = TIER_OF_JOB.get(job.func_name or "")
    take_back = row(func).take_back if func is not None else None
    abandoned = take_back == "retry-batch" and (
        exc_type is AbandonedJobError or isinstance(exc_value, AbandonedJobError)
    )
    if not abandoned and job.retries_left and job.retries_left > 0:
        return  # RQ will run the job again; the judgements are still safe
    if take_back == "line-front":
        session_job_lost(runtime, job, exc_value)
        return
    if take_back != "retry-batch" or func is None or not job.args:
        return
    why = f"worker gave up on the job: {exc_type.__name__ if isinstance(exc_type, type) else exc_type}"
    if exc_value is not None and str(exc_value):
        why += f": {str(exc_value).splitlines()[0][:300]}"
    store = runtime.storage.records
    left = [
        r
        for r in store.get_many(list(job.args[0]))
        if r is not None and not r.finished and getattr(r, "job", None) == job.id
    ]
    if abandoned:
        deaths = {r.id: store.add_death(r.id) for r in left}
        limit = runtime.settings.job_retries
        if not left or max(deaths.values()) <= limit:
            # Run the same job again, whatever RQ has left of its own retries (failures that
            # were not deaths spend those): the records' counts are what bound it.
            job.retries_left = max(job.retries_left or 0, 1)
            return
        worst = max(deaths.values())
        why = f"{why}: its worker died {worst} time{'s' if worst != 1 else ''}"
    if len(left) > 1:
        runtime.dispatcher.requeue([r.id for r in left], f"{why}; retried alone")
        if abandoned:
            # RQ re-runs this job, now empty (its judgements went to jobs of their own), so
            # it ends as a success rather than as an entry in RQ's failed registry.
            job.args = ([],)
            job.retries_left = max(job.retries_left or 0, 1)
        return
    for record in left:
        store.transition(
            record.id,
            "failed",
            expect=["running", "queued"],
            trail=TrailEntry(tier=record.tier or func, outcome="failed", why=why),
            fields={"reason": why},
        )
    if abandoned:
        job.retries_left = 0  # the judgement failed for good; so did its job


def _depth(queues: list[Queue]) -> int:
    return sum(q.count for q in queues)


@dataclass
class Until:
    """How `drain` waits for particular judgements instead of stopping when idle.

    `done()` says they finished; `stuck()` names why the rest cannot finish now (a closed
    window, a blocked host) so the caller stops waiting; `idle()` runs between polls (the
    decision gate recovers a dead worker's jobs there); `on_wait` is told once that the
    loop is waiting on someone else; after `idle_limit` seconds without progress it gives up.
    """

    done: Callable[[], bool]
    stuck: Callable[[], str | None] = lambda: None
    idle: Callable[[], None] = lambda: None
    on_wait: Callable[[str], None] | None = None
    idle_limit: float = math.inf
    poll: float = 0.25


def drain(
    runtime: Runtime,
    *,
    horizon: float | None = None,
    tiers: Sequence[str] = TIERS,
    until: Until | None = None,
) -> dict[str, Any]:
    """Run tiers' workers in burst, in this process: the one loop behind `dispatchq run` and
    the decision gate's wait for its sessions.

    Without `until` it stops when nothing more can be answered now, waiting for delayed
    typed-tier retries due within `horizon` seconds instead of stranding them (later ones
    are reported). With `until` it runs until `until.done()`, or returns why not.
    """
    horizon = runtime.settings.retry_horizon if horizon is None else horizon
    dispatcher = runtime.dispatcher
    left_delayed = 0
    last = time.monotonic()
    told = False
    while True:
        if until is not None and until.done():
            return {"delayed_retries_left": 0, "waiting": None}
        progressed = False
        for tier in (t for t in tiers if row(t).admission == "queue"):
            queues = dispatcher.queues_for(tier)
            if _depth(queues):
                make_worker(runtime, tier, heal=False).work(
                    burst=True, logging_level="WARNING", with_scheduler=False
                )
                progressed = True
        if any(row(t).admission == "line" for t in tiers):
            progressed |= session_burst(runtime)
        if progressed:
            last = time.monotonic()
            continue
        if until is None:
            due, later = due_retries(runtime, horizon)
            left_delayed = later
            if due is None:
                return {"delayed_retries_left": left_delayed, "waiting": None}
            time.sleep(min(max(0.0, due - time.time()), horizon))
            release_due_retries(runtime)
            continue
        why = until.stuck()
        if why is None and time.monotonic() - last > until.idle_limit:
            why = "nothing finished them in time (is another worker holding them?)"
        if why is not None:
            return {"delayed_retries_left": 0, "waiting": why}
        until.idle()
        if not told and until.on_wait is not None:
            told = True
            until.on_wait("waiting for sessions to finish (a session slot is busy, or one is still running)")
        time.sleep(until.poll)


def clean_started(redis_client: redis.Redis, queues: Iterable[Queue]) -> None:
    """Fail the abandoned jobs of `queues` the RQ way (a started job whose worker died).

    RQ notices an abandoned job only when its started registry is cleaned; a caller that
    waits on jobs in-process (the decision gate's settle) calls this so it never waits on
    a dead worker's job forever.
    """
    for queue in queues:
        StartedJobRegistry(
            queue.name, connection=redis_client, job_class=DispatchqJob, serializer=JSONSerializer
        ).cleanup()
