"""Worker processes: RQ workers tuned for dispatchq's batch jobs.

RQ runs execution, lifecycles, failure registries and retries. What dispatchq adds:

- `SimpleWorker` without a fork per job (jobs carry batches; forking per batch buys
  nothing but latency), with a heartbeat thread, so a worker killed mid-job is
  noticed after `heartbeat_interval + heartbeat_grace` seconds instead of after the
  job's whole timeout, and its job is retried by RQ;
- the session worker's admission loop (see `queue.session_worker`), which replaces RQ's
  dequeue so that no session starts while the usage window is closed;
- `job_failed`, RQ's failure callback: once RQ has no retries left, the job's
  unfinished judgements fail visibly, each with the reason.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from rq import Queue, SimpleWorker
from rq.exceptions import AbandonedJobError, StopRequested
from rq.executions import Execution, ExecutionRegistry
from rq.job import Job
from rq.registry import StartedJobRegistry

from dispatchq.core.judgement import TrailEntry
from dispatchq.errors import UserError
from dispatchq.queue.scheduler import due_retries, reconcile, release_due_retries
from dispatchq.settings import parent_environment
from dispatchq.storage.outage import (
    Backoff,
    MemoryLog,
    OutageLog,
    is_out_of_memory,
    is_outage,
    wait_for_redis,
)

if TYPE_CHECKING:
    import redis

    from dispatchq.runtime import Runtime

__all__ = [
    "DispatchqWorker",
    "drain",
    "forget_dead_executions",
    "job_failed",
    "log",
    "make_worker",
    "run_worker",
]

log = logging.getLogger("dispatchq.queue.worker")
#: The first wait after Redis is found away (then it doubles, up to 30 s).
FIRST_RETRY = Backoff().next()


class DispatchqWorker(SimpleWorker):
    """A non-forking RQ worker that keeps its job's heartbeat alive from a thread."""

    heartbeat_grace = 60
    #: True once the process was asked to stop (SIGTERM/SIGINT): the only clean exit.
    stopping = False
    #: Set by `make_worker`: the process's parts, and the tier this worker serves.
    runtime: Runtime | None = None
    tier = ""
    #: Long-running workers heal lost judgements in their maintenance; a burst run in
    #: `dispatchq run` does not (it would rescan every queued record at each start).
    heal = True
    _outage: OutageLog | None = None

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        # RQ's dequeue loop beats first thing on every round. When Redis is away, the beat is
        # where this worker waits it out (restarting the embedded server, one log line when
        # the state changes) instead of RQ logging an error every two seconds forever.
        while True:
            try:
                super().heartbeat(timeout, pipeline)
                if self.runtime is not None and pipeline is None:
                    self.runtime.store.publish_worker(self.name, self.facts(), ttl=self.worker_ttl + 60)
                return
            except Exception as error:
                if pipeline is not None or self.runtime is None or not is_outage(error):
                    raise
                self._ride_out(error)

    def _ride_out(self, error: BaseException) -> None:
        assert self.runtime is not None
        if self._outage is None:
            self._outage = OutageLog(self.runtime.settings.describe_redis(), log)
        self._outage.down(error, FIRST_RETRY)
        wait_for_redis(self.runtime.settings, log=log, stopping=lambda: self.stopping, outage=self._outage)
        if self.stopping:
            raise StopRequested()

    def facts(self) -> dict[str, Any]:
        """What this worker runs with, as `status --json`'s `worker_details[]` shows it.

        Published by the worker itself: an operator's shell (another environment, perhaps
        holding a key the workers lack) must not be what `status` reports.
        """
        assert self.runtime is not None
        settings = self.runtime.settings
        argv = shlex.split(settings.session_command)
        return {
            "tier": self.tier,
            "host": settings.host,
            "pid": os.getpid(),
            "keyless": settings.typesafe_api_key is None,
            "session_command_found": bool(argv)
            and shutil.which(argv[0], path=parent_environment().get("PATH")) is not None,
            "subprocess_scrub": "on",
        }

    def register_death(self) -> None:
        if self.runtime is not None:
            with contextlib.suppress(Exception):  # during an outage there is nothing to unpublish
                self.runtime.store.forget_worker(self.name)
        super().register_death()

    def run_maintenance_tasks(self) -> None:
        super().run_maintenance_tasks()
        if self.runtime is None or not self.heal:
            return
        try:
            if not self.runtime.store.take_reconcile_turn(self.name, self.maintenance_interval * 0.9):
                return  # another worker (or the scheduler) reconciles this round
            healed = reconcile(self.runtime, min_age=self.job_monitoring_interval + self.heartbeat_grace)
        except Exception as error:
            if is_outage(error):
                raise  # RQ's loop ends; `run_worker` waits for Redis and starts it again
            log.warning("reconciliation failed (%s); will try again", _line(error))
            return
        if healed:
            log.info("reconciliation put %d judgement(s) back whose job was lost", healed)

    def request_stop(self, signum: Any, frame: Any) -> None:
        self.stopping = True
        super().request_stop(signum, frame)

    @property
    def dequeue_timeout(self) -> int:
        # RQ runs maintenance (which retries jobs abandoned by a dead worker) only between
        # dequeues, and an idle worker blocks in BLPOP for `worker_ttl - 15` (405 s): wake up
        # at the recovery interval instead, or an abandoned job waits minutes for an idle worker.
        return max(1, min(super().dequeue_timeout, int(self.maintenance_interval)))

    def handle_job_success(
        self, job: Job, queue: Queue, started_job_registry: StartedJobRegistry, execution: Execution
    ) -> None:
        # RQ 3.0 leaves a dead worker's execution in the job's execution registry for 60 s
        # after its hash expired; with `result_ttl=0` the success path deletes the job, trips
        # over that entry (`ValueError: Execution … not found in Redis`) and files the job,
        # whose judgements were all answered, as failed. Forget such entries first.
        forget_dead_executions(self.connection, job.id, keep=execution.id)
        super().handle_job_success(job, queue, started_job_registry, execution)

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        return int(self.job_monitoring_interval + self.heartbeat_grace)

    def execute_job(self, job: Job, queue: Queue) -> None:
        execution = self.prepare_execution(job)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.job_monitoring_interval):
                try:
                    self.maintain_heartbeats(job, execution)
                except Exception as error:  # a missed beat only delays recovery; never kill the job
                    if is_outage(error):
                        log.warning("heartbeat for job %s missed: Redis is unreachable", job.id)
                    else:
                        log.warning("heartbeat for job %s failed", job.id, exc_info=True)

        thread = threading.Thread(target=beat, name=f"heartbeat-{job.id}", daemon=True)
        thread.start()
        try:
            self.perform_job(job, queue, execution)
        finally:
            stop.set()
            thread.join(timeout=5)
        self.set_state("idle")


def forget_dead_executions(client: redis.Redis, job_id: str, *, keep: str = "") -> int:
    """Drop the entries of `job_id`'s execution registry whose execution hash is gone.

    Such an entry is what a worker killed mid-job leaves behind (its hash expires with its
    heartbeat; the registry entry only 60 s later). RQ's `Job.delete` fetches every entry
    and raises on the first missing hash. Returns how many entries were dropped.
    """
    registry = ExecutionRegistry(job_id=job_id, connection=client)
    dropped = 0
    for execution_id in registry.get_execution_ids():
        if execution_id == keep:
            continue
        if not client.exists(Execution(id=execution_id, job_id=job_id, connection=client).key):
            dropped += int(client.zrem(registry.key, execution_id))
    return dropped


def make_worker(
    runtime: Runtime, tier: str, *, name: str | None = None, heal: bool = True
) -> DispatchqWorker:
    settings = runtime.settings
    queues = runtime.dispatcher.queues_for(tier)
    cls: type[DispatchqWorker] = DispatchqWorker
    if tier == "session":
        from dispatchq.queue.session_worker import SessionWorker

        cls = SessionWorker
    worker = cls(
        queues,
        name=name,
        connection=runtime.redis,
        maintenance_interval=settings.recovery_interval,
        job_monitoring_interval=settings.heartbeat_interval,
        default_result_ttl=0,
    )
    worker.heartbeat_grace = settings.heartbeat_grace
    worker.runtime = runtime
    worker.tier = tier
    worker.heal = heal
    return worker


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
                "the %s worker's loop failed (%s); starting it again in %.0f s", tier, _line(failure), delay
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
        if tier != "typed":
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
        runtime.redis.ping()
    except Exception as error:
        return error
    return None


def _accepts_writes(runtime: Runtime) -> bool:
    try:
        return runtime.store.accepts_writes()
    except Exception:  # Redis went away meanwhile: the outage path takes over on the next round
        return True


def _interruptible_sleep(delay: float, stop: threading.Event, sleep: Callable[[float], None]) -> None:
    deadline = time.monotonic() + delay
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        sleep(min(0.2, left))


def _line(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}"[:300] if text else type(error).__name__


def job_failed(runtime: Runtime, job: Job, exc_type: Any, exc_value: Any) -> None:
    """RQ's failure callback: a job raised, or its worker died (RQ found it abandoned).

    A worker's death is counted on each unfinished judgement's record (`deaths`), not by
    RQ's `retries_left`: after DISPATCHQ_JOB_RETRIES deaths the judgement fails with the
    reason "its worker died N times". Until then RQ runs the same job again.

    Failures are per judgement: when a job carrying several judgements dies for good
    (one poison judgement can crash its worker every time), each unfinished judgement
    is re-enqueued in a job of its own, so only the one that really fails, fails.
    """
    func = (job.func_name or "").rsplit(".", 1)[-1]
    abandoned = func in ("code", "typed") and (
        exc_type is AbandonedJobError or isinstance(exc_value, AbandonedJobError)
    )
    if not abandoned and job.retries_left and job.retries_left > 0:
        return  # RQ will run the job again; the judgements are still safe
    if func == "session":
        from dispatchq.queue.session_worker import session_job_lost

        session_job_lost(runtime, job, exc_value)
        return
    if func not in ("code", "typed") or not job.args:
        return
    why = f"worker gave up on the job: {exc_type.__name__ if isinstance(exc_type, type) else exc_type}"
    if exc_value is not None and str(exc_value):
        why += f": {str(exc_value).splitlines()[0][:300]}"
    store = runtime.store
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


def drain(runtime: Runtime, *, horizon: float | None = None, sessions: bool = True) -> dict[str, Any]:
    """Run every tier's worker in burst, in this process, until nothing more can be answered now.

    Delayed typed-tier retries due within `horizon` seconds are waited for instead of
    being stranded; later ones are reported. Returns what is left and why.
    """
    horizon = runtime.settings.retry_horizon if horizon is None else horizon
    dispatcher = runtime.dispatcher
    left_delayed = 0
    while True:
        progressed = False
        for tier in ("code", "typed"):
            queues = dispatcher.queues_for(tier)
            if _depth(queues):
                make_worker(runtime, tier, heal=False).work(
                    burst=True, logging_level="WARNING", with_scheduler=False
                )
                progressed = True
        if sessions:
            from dispatchq.queue.session_worker import burst as session_burst

            progressed |= session_burst(runtime)
        if progressed:
            continue
        due, later = due_retries(runtime, horizon)
        left_delayed = later
        if due is None:
            break
        wait = max(0.0, due - time.time())
        time.sleep(min(wait, horizon))
        release_due_retries(runtime)
    return {"delayed_retries_left": left_delayed}


def clean_started(redis_client: redis.Redis, queues: Iterable[Queue]) -> None:
    """Fail the abandoned jobs of `queues` the RQ way (a started job whose worker died).

    RQ notices an abandoned job only when its started registry is cleaned; a caller that
    waits on jobs in-process (the decision gate's settle) calls this so it never waits on
    a dead worker's job forever.
    """
    for queue in queues:
        StartedJobRegistry(queue.name, connection=redis_client).cleanup()
