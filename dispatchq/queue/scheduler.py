"""`dispatchq scheduler`: rq-scheduler's loop plus the small control queue, in one process.

Timed work is rq-scheduler's: the retrigger at the instant a usage limit lifts, and
typed-tier retries re-enqueued after a provider's advised delay (so no worker sits
holding a job while it waits). The retrigger goes to the `control` queue, which this
process executes itself at a one-second interval, so it never waits behind a paused
session queue or a code backlog, and the Procfile needs no extra process.

The same loop keeps the house in order: records whose RQ job vanished are
re-enqueued (nothing is ever stranded as "queued"), expired records leave the indexes.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rq import SimpleWorker
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq_scheduler import Scheduler
from rq_scheduler.utils import get_next_scheduled_time, to_unix

from dispatchq.core.entrypoints import TYPED_JOB
from dispatchq.core.tiers import batch_tiers
from dispatchq.queue.entrypoints import DispatchqJob, DispatchqQueue, refusal_of, refuse
from dispatchq.queue.liveness import job_liveness
from dispatchq.queue.serializer import JSONSerializer
from dispatchq.queue.upgrade import ensure_upgraded
from dispatchq.storage import rqstate
from dispatchq.storage.locks import LeasedLock
from dispatchq.storage.outage import is_out_of_memory, is_outage
from dispatchq.supervise import Done, Role, supervise
from dispatchq.window.marker import get as marker_get
from dispatchq.window.messages import GENERAL_SCOPE

if TYPE_CHECKING:
    from dispatchq.queue.dispatch import Seen
    from dispatchq.runtime import Runtime, Scheduling

__all__ = [
    "HEARTBEAT_TTL",
    "MOVE_ATTEMPTS",
    "RECONCILE_CHUNK",
    "TICK",
    "DispatchqScheduler",
    "due_retries",
    "log",
    "reconcile",
    "release_due_retries",
    "run_scheduler",
    "schedule_typed_retry",
    "scheduler_alive",
]

log = logging.getLogger("dispatchq.queue.scheduler")

TICK = 1.0
HEARTBEAT_TTL = 10
#: Records checked per pipelined read of their RQ jobs during reconciliation.
RECONCILE_CHUNK = 1000
#: Tries at one job's fenced move when the schedule changed under it (a job scheduled
#: meanwhile); a job still due after them is moved at the next tick.
MOVE_ATTEMPTS = 5


class DispatchqScheduler(Scheduler):
    """rq-scheduler over dispatchq's job and queue classes, vetting each job it moves, each
    due job moved once however many schedulers run.

    rq-scheduler has no serializer option: it fetches with its `job_class` and pushes with its
    `queue_class`, so both are dispatchq's (strict JSON; nothing it reads is unpickled). Its
    mover reads each job's function name before pushing it (a log line), and would import
    whatever class a job's `meta` names for its queue; here a due job is vetted first
    (`refusal_of`) and a refused one fails with its one line and leaves the schedule without
    being pushed, while the loop goes on. Listings (`get_jobs`) skip refused jobs.

    rq-scheduler's lock is `SET NX EX` with no owner, and its move is a push then a ZREM: a
    scheduler cut off by a partition outlives its lock, another takes it and moves the due
    jobs, and when the first comes back it pushes the jobs it had listed again and deletes
    the other's lock. Here the lock (the same key, so an older release's scheduler still
    keeps out) is owned by a token unique to this scheduler and dropped only by it, and each
    job's move is one MULTI under WATCH of the lock and the schedule: it runs only if the job
    is still scheduled and, when this scheduler took the lock, the lock still holds its
    token. A stale list, a lapsed lock or a reply lost in a partition cannot move a job twice.
    """

    job_class = DispatchqJob
    queue_class = DispatchqQueue

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        self._lock_acquired = False

    def get_jobs(
        self, until: Any = None, with_times: bool = False, offset: Any = None, length: Any = None
    ) -> Any:
        for item in super().get_jobs(until=until, with_times=with_times, offset=offset, length=length):
            job = item[0] if with_times else item
            if refusal_of(job) is None:
                yield item

    def _lock(self) -> LeasedLock:
        return LeasedLock(self.connection, self.scheduler_lock_key, self.holder)

    def acquire_lock(self) -> bool:
        """Take the movers' lock under this scheduler's own token (rq-scheduler's lease)."""
        self._lock_acquired = self._lock().take(int(self._interval) + 10)
        return self._lock_acquired

    def remove_lock(self) -> None:
        """Drop the lock only if it is still ours: one that lapsed may be another's now."""
        if self._lock_acquired:
            self._lock_acquired = False
            self._lock().drop()

    def enqueue_jobs(self) -> list[Job]:
        ensure_upgraded(self.connection)  # the previous release's pickled jobs first (once per store)
        moved: list[Job] = []
        for job in Scheduler.get_jobs(self, until=_utc_now()):
            refused = refusal_of(job)
            if refused is None:
                if self.enqueue_job(job):
                    moved.append(job)
            elif rqstate.unschedule(self.connection, self.scheduled_jobs_key, job.id):
                refuse(job, refused)  # whoever took it off the schedule fails it, once
        return moved

    def enqueue_job(self, job: Job) -> bool:
        """Move one due job to its queue, unless another scheduler did (or our lock lapsed).

        True when this call moved it. The WATCH makes the check and the move one step: if
        the schedule or the lock changed between them the MULTI is refused and the check is
        made again, so two schedulers holding the same stale list move each job once.
        """
        queue = self.get_queue_for_job(job)
        queue.get_redis_server_version()  # a read RQ's enqueue makes, kept out of the MULTI
        outcome = rqstate.fenced_move(
            self.connection,
            self.scheduled_jobs_key,
            job.id,
            lambda pipe: self._move(job, queue, pipe),
            lock=(self.scheduler_lock_key, self.holder) if self._lock_acquired else None,
            attempts=MOVE_ATTEMPTS,
        )
        if outcome == "lapsed":
            log.warning("scheduler lock lapsed; leaving job %s to its holder", job.id)
        return outcome == "moved"  # `gone`: moved (or cancelled) by someone else

    def _move(self, job: Job, queue: DispatchqQueue, pipe: Any) -> None:
        """rq-scheduler's move (push, unschedule, reschedule a repeating job), in `pipe`."""
        interval = job.meta.get("interval")
        repeat = job.meta.get("repeat")
        cron_string = job.meta.get("cron_string")
        if repeat:
            job.meta["repeat"] = int(repeat) - 1
        queue.enqueue_job(job, pipeline=pipe, at_front=bool(job.enqueue_at_front))
        rqstate.unschedule(pipe, self.scheduled_jobs_key, job.id)
        if (interval or cron_string) and not (repeat is not None and job.meta["repeat"] == 0):
            at = (
                to_unix(datetime.now(UTC).replace(tzinfo=None)) + int(interval)
                if interval
                else to_unix(
                    get_next_scheduled_time(
                        cron_string, use_local_timezone=job.meta.get("use_local_timezone")
                    )
                )
            )
            rqstate.reschedule(pipe, self.scheduled_jobs_key, job.id, at)

    def get_queue_for_job(self, job: Job) -> DispatchqQueue:
        # Never the class a job's `meta` names (rq-scheduler would import it).
        return DispatchqQueue(job.origin, connection=self.connection)


def _utc_now() -> datetime:
    # What rq-scheduler's `get_jobs_to_queue` passes: naive UTC, turned into a whole second.
    return datetime.now(UTC).replace(tzinfo=None)


def schedule_typed_retry(runtime: Runtime, ids: list[str], delay: float) -> Job:
    """Run `ids` through the typed tier again after `delay` seconds, holding no worker.

    rq-scheduler keeps whole seconds and truncates, which could run a retry up to a second
    before the provider said to: the instant is rounded up instead.
    """
    when = math.ceil(time.time() + max(delay, 0.0))
    return runtime.scheduler.enqueue_at(
        datetime.fromtimestamp(when, UTC),
        TYPED_JOB,
        ids,
        queue_name=runtime.storage.jobs.queue_name("typed"),
        timeout=runtime.settings.typed_job_timeout,
        job_result_ttl=0,
        job_description=f"dispatchq typed retry x{len(ids)}",
    )


def due_retries(runtime: Runtime, horizon: float) -> tuple[float | None, int]:
    """(earliest scheduled typed retry due within `horizon` seconds or None, count due later)."""
    scheduler = runtime.scheduler
    typed = runtime.storage.jobs.queue_name("typed")
    now = time.time()
    earliest = None
    later = 0
    for job, when in scheduler.get_jobs(with_times=True):
        if job.origin != typed:
            continue
        at = when.replace(tzinfo=UTC).timestamp() if when.tzinfo is None else when.timestamp()
        if at - now <= horizon:
            earliest = at if earliest is None else min(earliest, at)
        else:
            later += 1
    return earliest, later


def release_due_retries(runtime: Runtime) -> int:
    """Move every due scheduled job to its queue now (what the scheduler loop does each tick)."""
    scheduler = runtime.scheduler
    return sum(1 for job in scheduler.get_jobs_to_queue() if scheduler.enqueue_job(job))


def reconcile(runtime: Runtime, *, min_age: float = 60.0) -> int:
    """Put back judgements whose RQ job will never run: the backstop of "nothing is lost".

    - `queued` code/typed judgements whose job no longer exists or has ended (an operator
      deleted RQ keys by hand; the MULTI in `dispatch` makes this rare otherwise);
    - `running` code/typed judgements whose job sits in no queue and no registry and
      whose worker is gone (a bookkeeping write refused under `maxmemory` can leave such
      a job saying `queued` forever). They go back uncharged: the trail says
      "recovered: its job was lost".

    Run by the scheduler and by every worker's maintenance, so a formation without a
    scheduler still heals. Returns how many were put back.
    """
    store = runtime.storage.records
    now = time.time()
    # Candidates filtered in Redis, one per distinct job, and one status read per job, not
    # whole records and a job fetched per record: a backlog of 10,000 queued judgements in
    # 200 jobs is checked in a fraction of a second (bench/faults.py measures it).
    before = now - min_age
    firsts = store.stale("queued", batch_tiers(), before)
    jobs = _job_states(runtime, sorted({job_id for _, job_id in firsts if job_id}))
    waiting = _waiting_jobs(runtime, {o for status, o in jobs.values() if status == "queued" and o})
    lost_jobs: set[str] = set()
    for _, job_id in firsts:
        status, origin = jobs.get(job_id, (None, None)) if job_id else (None, None)
        # Says queued but was in no queue a moment ago: ask again, precisely (it may have been
        # taken meanwhile); if it still sits nowhere, a write was cut off by a Redis kill.
        if (
            status == JobStatus.QUEUED
            and job_id not in waiting
            and _queued_nowhere_id(runtime, job_id, origin or "")
        ):
            status = None
        if status in (JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED, JobStatus.DEFERRED):
            continue
        if job_id and _scheduled(runtime, job_id):
            continue
        lost_jobs.add(job_id)
    stranded: dict[str, Seen] = {
        jid: ("queued", job_id or None)
        for jid, job_id in store.stale("queued", batch_tiers(), before, jobs=lost_jobs)
    }
    # Put back only what is still as seen: a record answered (its job then deleted) between
    # the read and now is not stranded, and must not be re-queued.
    healed = (
        runtime.dispatcher.requeue(stranded, "its job was lost; re-enqueued", seen=stranded)
        if stranded
        else 0
    )
    return healed + _recover_lost_running(runtime, min_age=min_age, now=now)


def _recover_lost_running(runtime: Runtime, *, min_age: float, now: float) -> int:
    store = runtime.storage.records
    # Session judgements are the session tier's to settle: their RQ job is made at admission
    # and its worker's death is counted there.
    running = [
        r
        for r in store.get_many(store.ids("running"))
        if r is not None and r.status == "running" and r.tier in batch_tiers()
    ]
    if not running:
        return 0
    workers = published_workers(runtime)
    lost: dict[str, Seen] = {}
    for record in running:
        job_id = getattr(record, "job", None)
        alive = job_liveness(runtime.redis, job_id, workers=workers)
        if alive.state == "orphaned":
            _say_orphaned(runtime, record.id, alive.heartbeat)
            continue
        if record.updated_at and now - record.updated_at < min_age:
            continue
        if job_id and _scheduled(runtime, job_id):
            continue
        if alive.state == "lost":
            lost[record.id] = ("running", job_id)
    return runtime.dispatcher.requeue(lost, "recovered: its job was lost", seen=lost) if lost else 0


def published_workers(runtime: Runtime) -> set[str]:
    """Workers alive by their own recent heartbeat (a killed one drops out within
    heartbeat interval + grace, not when RQ's 7-minute registration expires)."""
    ttl = runtime.settings.heartbeat_interval + runtime.settings.heartbeat_grace
    return {str(w.get("name")) for w in runtime.storage.records.live_workers(ttl=ttl)}


def _say_orphaned(runtime: Runtime, jid: str, heartbeat: float | None) -> None:
    """A running judgement whose worker died keeps its status and says so, with when RQ
    will run its job again (once the job's heartbeat lapses and a worker's maintenance
    finds it abandoned)."""
    settings = runtime.settings
    base = heartbeat if heartbeat is not None else time.time()
    when = base + settings.heartbeat_interval + settings.heartbeat_grace + settings.recovery_interval
    at = datetime.fromtimestamp(when, UTC).strftime("%H:%M:%S UTC")
    runtime.storage.records.set_fields(jid, reason=f"orphaned: its worker died, retried at about {at}")


def _job_states(runtime: Runtime, job_ids: list[str]) -> dict[str, tuple[str | None, str | None]]:
    """(status, origin queue) of each RQ job by id, from its hash; (None, None) if it is gone."""
    out: dict[str, tuple[str | None, str | None]] = {}
    for start in range(0, len(job_ids), RECONCILE_CHUNK):
        chunk = job_ids[start : start + RECONCILE_CHUNK]
        fields = runtime.storage.jobs.job_fields([Job.key_for(j) for j in chunk], ["status", "origin"])
        for job_id, (status, origin) in zip(chunk, fields, strict=True):
            out[job_id] = (status, origin)
    return out


def _waiting_jobs(runtime: Runtime, origins: set[str]) -> set[str]:
    """Ids of the jobs in these queues and their intermediate lists, as of now.

    A snapshot, read queues first and intermediate lists second (the way a job moves), used
    only to clear a job ("it is waiting"); a job missing from it is asked about again.
    """
    queues = [DispatchqQueue(origin, connection=runtime.redis) for origin in sorted(origins)]
    found: set[str] = set()
    for attr in ("key", "intermediate_queue_key"):
        found |= runtime.storage.jobs.list_members([getattr(queue, attr) for queue in queues])
    return found


def _queued_nowhere_id(runtime: Runtime, job_id: str, origin: str) -> bool:
    try:
        job = DispatchqJob.fetch(job_id, connection=runtime.redis)
    except NoSuchJobError:
        return True
    if origin and not job.origin:
        job.origin = origin
    return _queued_nowhere(runtime, job)


def _queued_nowhere(runtime: Runtime, job: Job) -> bool:
    """A job whose hash says `queued` but that is in neither its queue nor the list a worker
    moves it to while taking it (RQ's intermediate queue): nobody will ever run it.

    Read in that order and the status read again last, so a job being taken right now
    (queue -> intermediate -> started) is never judged lost.
    """
    queue = DispatchqQueue(job.origin, connection=runtime.redis)
    if runtime.storage.jobs.in_list(queue.key, job.id):
        return False
    if runtime.storage.jobs.in_list(queue.intermediate_queue_key, job.id):
        return False
    try:
        return DispatchqJob.fetch(job.id, connection=runtime.redis).get_status() == JobStatus.QUEUED
    except NoSuchJobError:
        return True  # gone meanwhile: nobody will run it either


def _scheduled(runtime: Runtime, job_id: str) -> bool:
    return job_id in runtime.scheduler


def scheduler_alive(runtime: Runtime) -> bool:
    return runtime.storage.scheduler.alive()


def run_scheduler(
    runtime: Runtime,
    *,
    burst: bool = False,
    tick: float = TICK,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """The `dispatchq scheduler` process: every tick, move due jobs and run control jobs.

    The body of `dispatchq.supervise`'s loop: a tick that finds Redis away (down, restarting,
    loading, read-only) or out of memory (writes refused under `maxmemory`) is waited out
    there with capped back-off and one log line per change; the loop ends only when asked
    to stop, and the scheduler's heartbeat goes with it.
    """
    body = _SchedulerBody(runtime, tick=tick, burst=burst)
    log.info("dispatchq scheduler started (tick %.1fs)", tick)
    supervise(runtime, Role("the scheduler", body.round, close=body.close), log=log, sleep=sleep)


@dataclass
class _SchedulerBody:
    """One tick: the heartbeat, the due jobs moved, the control queue run, and now and then
    the history sampled and the house kept (reconciliation, pruning)."""

    runtime: Runtime
    tick: float
    burst: bool
    scheduler: Scheduling = field(init=False)
    control: DispatchqQueue = field(init=False)
    last_maintenance: float = 0.0
    sampled_minute: int = -1

    def __post_init__(self) -> None:
        self.scheduler = self.runtime.scheduler
        control = self.runtime.storage.jobs.control_queue()
        self.control = DispatchqQueue(control, connection=self.runtime.redis)

    def round(self) -> float | Done:
        runtime = self.runtime
        started = time.monotonic()
        _tick(runtime, self.scheduler, self.control)
        self.sampled_minute = _sample_history(runtime, self.sampled_minute)
        if time.monotonic() - self.last_maintenance >= runtime.settings.recovery_interval:
            self.last_maintenance = time.monotonic()
            try:
                reconcile(runtime)
                runtime.storage.records.prune()
            except Exception as error:
                if is_outage(error) or is_out_of_memory(error):
                    raise
                log.exception("maintenance failed; will try again")
        if self.burst:
            return Done()
        return max(0.0, self.tick - (time.monotonic() - started))

    def close(self) -> None:
        self.runtime.storage.scheduler.stopped()


def _sample_history(runtime: Runtime, sampled_minute: int) -> int:
    """Once a minute, the counters into the 24-hour history (`storage.history`): the scheduler
    samples because it is always running, and a minute another scheduler sampled is kept as is."""
    now = time.time()
    minute = int(now // 60)
    if minute == sampled_minute:
        return sampled_minute
    closed = marker_get(runtime.storage.window, GENERAL_SCOPE) is not None
    runtime.storage.history.sample(now, window_closed=closed)
    return minute


class _ControlWorker(SimpleWorker):
    """The scheduler's in-process burst run of the control queue: one tick's part of the
    scheduler, so it neither listens for RQ's commands nor takes the process's signals.

    RQ's worker subscribes to its command channel in a thread that polls every 60 s, and
    redis-py 8.2's `PubSubWorkerThread.stop` joins that thread without a bound: when the
    unsubscribe reply is read before the stop flag is cleared, the teardown waits out the
    whole poll, and the scheduler neither beat nor moved a due job for up to a minute.

    RQ's worker also puts its own SIGTERM/SIGINT handlers in for the run. A stop that came
    then was RQ's (the run ended early) and never reached the supervise loop's, which went on
    ticking until killed. With the loop's handlers left in place the stop is the loop's: the
    control job in hand finishes and the scheduler exits after the tick.
    """

    def subscribe(self) -> None:
        self.pubsub_thread = None

    def _install_signal_handlers(self) -> None:
        pass


def _tick(runtime: Runtime, scheduler: Scheduling, control: DispatchqQueue) -> None:
    runtime.storage.scheduler.beat(HEARTBEAT_TTL)
    if scheduler.acquire_lock():
        try:
            scheduler.enqueue_jobs()
        finally:
            scheduler.remove_lock()
    if control.count:
        worker = _ControlWorker(
            [control],
            connection=runtime.redis,
            job_class=DispatchqJob,
            queue_class=DispatchqQueue,
            serializer=JSONSerializer,
        )
        worker.work(burst=True, logging_level="WARNING", with_scheduler=False)
