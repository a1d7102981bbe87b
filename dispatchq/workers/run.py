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
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rq import Queue
from rq.exceptions import AbandonedJobError
from rq.job import Job
from rq.registry import StartedJobRegistry

from dispatchq.core.entrypoints import TIER_OF_JOB
from dispatchq.core.judgement import TrailEntry
from dispatchq.core.tiers import TIERS, row
from dispatchq.errors import UserError
from dispatchq.queue.entrypoints import DispatchqJob
from dispatchq.queue.scheduler import due_retries, release_due_retries
from dispatchq.queue.serializer import JSONSerializer
from dispatchq.storage.outage import (
    Backoff,
    MemoryLog,
    OutageLog,
    is_out_of_memory,
    is_outage,
    wait_for_redis,
)
from dispatchq.workers.base import FIRST_RETRY, DispatchqWorker, build_worker, line
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

    Redis going away is waited out, never a reason to exit: RQ's own loop quits on an
    error it cannot handle (a dropped connection, `LOADING` while the append-only file
    loads), so this loop checks Redis, backs off while it is away, and starts RQ's loop
    again. Returns 0 on a requested stop; a configuration error raises (exit 2).

    A burst typed worker does not strand the provider retries it scheduled: it waits for
    those due within DISPATCHQ_RETRY_HORIZON, runs them, and returns how many are left
    scheduled beyond it (0 otherwise).
    """
    level = "WARNING" if quiet else "INFO"
    stop = threading.Event()
    outage = OutageLog(runtime.settings.describe_redis(), log)
    backoff = Backoff()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    while not stop.is_set():
        # RQ's `work()` installs its own handlers while it runs; between runs, these.
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        worker: DispatchqWorker | None = None
        failure: BaseException | None = None
        try:
            worker = make_worker(runtime, tier)
            worker.work(burst=burst, logging_level=level, with_scheduler=False)
        except UserError as error:
            if not is_outage(error):
                raise
            failure = error
        except Exception as error:  # raised out of RQ's loop itself (its bootstrap or teardown)
            failure = error
        if stop.is_set() or (worker is not None and worker.stopping):
            return 0
        problem = failure if failure is not None else _redis_problem(runtime)
        if problem is not None and (failure is None or is_outage(problem)):
            # Wait for Redis (restarting the embedded server if it is gone), then start again.
            outage.down(problem, FIRST_RETRY)
            wait_for_redis(runtime.settings, log=log, stopping=stop.is_set, sleep=sleep, outage=outage)
            continue
        outage.up()
        if failure is not None and is_out_of_memory(failure):
            # Redis answers but refuses writes (maxmemory, noeviction): one line, then wait
            # until it accepts a write again instead of restarting RQ's loop into it.
            memory = MemoryLog(log)
            while not stop.is_set():
                delay = backoff.next()
                memory.down(failure, delay, runtime.redis)
                _interruptible_sleep(delay, stop, sleep)
                if _accepts_writes(runtime):
                    break
            memory.up()
            backoff.reset()
            continue
        if failure is not None:
            delay = backoff.next()
            log.error(
                "the %s worker's loop failed (%s); starting it again in %.0f s", tier, line(failure), delay
            )
            _interruptible_sleep(delay, stop, sleep)
            continue
        backoff.reset()
        if not burst:
            # RQ's loop ended though nobody asked it to stop and Redis answers: it quit on an
            # error it logged. Start it again rather than leave the tier without a worker.
            log.warning("the %s worker's loop ended unexpectedly; starting it again", tier)
            _interruptible_sleep(backoff.next(), stop, sleep)
            continue
        if not row(tier).delayed_retries:
            return 0
        due, later = due_retries(runtime, runtime.settings.retry_horizon)
        if due is None:
            return later
        sleep(max(0.0, due - time.time()))
        release_due_retries(runtime)
    return 0


def _redis_problem(runtime: Runtime) -> BaseException | None:
    """Why Redis does not answer right now, or None when it does."""
    try:
        runtime.storage.server.ping()
    except Exception as error:
        return error
    return None


def _accepts_writes(runtime: Runtime) -> bool:
    try:
        return runtime.storage.records.accepts_writes()
    except Exception:  # Redis went away meanwhile: the outage path takes over on the next round
        return True


def _interruptible_sleep(delay: float, stop: threading.Event, sleep: Callable[[float], None]) -> None:
    deadline = time.monotonic() + delay
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        sleep(min(0.2, left))


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
