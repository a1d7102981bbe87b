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

import logging
import threading
from typing import TYPE_CHECKING, Any

from rq import Queue, SimpleWorker
from rq.job import Job

from dispatchq.core.judgement import TrailEntry

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime

log = logging.getLogger("dispatchq.queue.worker")


class DispatchqWorker(SimpleWorker):
    """A non-forking RQ worker that keeps its job's heartbeat alive from a thread."""

    heartbeat_grace = 60

    @property
    def dequeue_timeout(self) -> int:
        # RQ runs maintenance (which retries jobs abandoned by a dead worker) only between
        # dequeues, and an idle worker blocks in BLPOP for `worker_ttl - 15` (405 s): wake up
        # at the recovery interval instead, or an abandoned job waits minutes for an idle worker.
        return max(1, min(super().dequeue_timeout, int(self.maintenance_interval)))

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        return int(self.job_monitoring_interval + self.heartbeat_grace)

    def execute_job(self, job: Job, queue: Queue) -> None:
        execution = self.prepare_execution(job)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.job_monitoring_interval):
                try:
                    self.maintain_heartbeats(job, execution)
                except Exception:  # a missed beat only delays recovery; never kill the job for it
                    log.warning("heartbeat for job %s failed", job.id, exc_info=True)

        thread = threading.Thread(target=beat, name=f"heartbeat-{job.id}", daemon=True)
        thread.start()
        try:
            self.perform_job(job, queue, execution)
        finally:
            stop.set()
            thread.join(timeout=5)
        self.set_state("idle")


def make_worker(runtime: Runtime, tier: str, *, name: str | None = None) -> DispatchqWorker:
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
    if tier == "session":
        worker.runtime = runtime  # type: ignore[attr-defined]
    return worker


def run_worker(runtime: Runtime, tier: str, *, burst: bool = False, quiet: bool = False) -> int:
    """Run one tier's worker in this process until stopped (or, in burst, until idle).

    A burst typed worker does not strand the provider retries it scheduled: it waits for
    those due within DISPATCHQ_RETRY_HORIZON, runs them, and returns how many are left
    scheduled beyond it (0 otherwise).
    """
    import time as _time

    from dispatchq.launcher.environment import mark_non_dumpable
    from dispatchq.queue.scheduler import due_retries, release_due_retries
    from dispatchq.runtime import set_runtime

    mark_non_dumpable()
    set_runtime(runtime)
    level = "WARNING" if quiet else "INFO"
    while True:
        make_worker(runtime, tier).work(burst=burst, logging_level=level, with_scheduler=False)
        if not burst or tier != "typed":
            return 0
        due, later = due_retries(runtime, runtime.settings.retry_horizon)
        if due is None:
            return later
        _time.sleep(max(0.0, due - _time.time()))
        release_due_retries(runtime)


def job_failed(runtime: Runtime, job: Job, exc_type: Any, exc_value: Any) -> None:
    """RQ's failure callback, once RQ has no retries left for a job.

    Failures are per judgement: when a job carrying several judgements dies for good
    (one poison judgement can crash its worker every time), each unfinished judgement
    is re-enqueued in a job of its own, so only the one that really fails, fails.
    """
    if job.retries_left and job.retries_left > 0:
        return  # RQ will run the job again; the judgements are still safe
    func = job.func_name.rsplit(".", 1)[-1]
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
    if len(left) > 1:
        runtime.dispatcher.requeue([r.id for r in left], f"{why}; retried alone")
        return
    for record in left:
        store.transition(
            record.id,
            "failed",
            expect=["running", "queued"],
            trail=TrailEntry(tier=record.tier or func, outcome="failed", why=why),
            fields={"reason": why},
        )


def _depth(queues: list[Queue]) -> int:
    return sum(q.count for q in queues)


def drain(runtime: Runtime, *, horizon: float | None = None, sessions: bool = True) -> dict[str, Any]:
    """Run every tier's worker in burst, in this process, until nothing more can be answered now.

    Delayed typed-tier retries due within `horizon` seconds are waited for instead of
    being stranded; later ones are reported. Returns what is left and why.
    """
    import time as _time

    from dispatchq.runtime import set_runtime

    set_runtime(runtime)
    horizon = runtime.settings.retry_horizon if horizon is None else horizon
    dispatcher = runtime.dispatcher
    left_delayed = 0
    while True:
        progressed = False
        for tier in ("code", "typed"):
            queues = dispatcher.queues_for(tier)
            if _depth(queues):
                make_worker(runtime, tier).work(burst=True, logging_level="WARNING", with_scheduler=False)
                progressed = True
        if sessions:
            from dispatchq.queue.session_worker import burst as session_burst

            progressed |= session_burst(runtime)
        if progressed:
            continue
        from dispatchq.queue.scheduler import due_retries

        due, later = due_retries(runtime, horizon)
        left_delayed = later
        if due is None:
            break
        wait = max(0.0, due - _time.time())
        _time.sleep(min(wait, horizon))
        from dispatchq.queue.scheduler import release_due_retries

        release_due_retries(runtime)
    return {"delayed_retries_left": left_delayed}
