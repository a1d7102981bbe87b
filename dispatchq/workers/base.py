"""The RQ worker class dispatchq runs for every tier, and how one is built.

A `SimpleWorker` without a fork per job (jobs carry batches; forking per batch buys
nothing but latency), with a heartbeat thread, so a worker killed mid-job is noticed
after `heartbeat_interval + heartbeat_grace` seconds instead of after the job's whole
timeout. Redis going away is waited out in the heartbeat; the worker publishes what it
runs with for `status`, and heals lost judgements in its maintenance.

Its own module so that the session worker (a subclass, `workers.session`) and the
roles that choose between them (`workers.run`) both import it without a circle.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import threading
from typing import TYPE_CHECKING, Any

from rq import Queue, SimpleWorker
from rq.exceptions import StopRequested
from rq.executions import Execution, ExecutionRegistry
from rq.job import Job
from rq.registry import StartedJobRegistry

from dispatchq.core.status import WorkerFacts
from dispatchq.core.tiers import row
from dispatchq.errors import UserError
from dispatchq.launcher.releases import claude_code_fact
from dispatchq.launcher.scrub import decide_scrub
from dispatchq.queue.entrypoints import DispatchqJob, DispatchqQueue
from dispatchq.queue.scheduler import reconcile
from dispatchq.queue.serializer import JSONSerializer
from dispatchq.queue.stopping import note_stop_requested
from dispatchq.queue.upgrade import ensure_upgraded
from dispatchq.settings import parent_environment
from dispatchq.storage import rqstate
from dispatchq.storage.outage import OutageLog, is_outage, wait_for_redis
from dispatchq.supervise import FIRST_RETRY, failure_line
from dispatchq.tiers.confine import sandbox_refusal
from dispatchq.workers.identity import check_host_unique, machine_id

if TYPE_CHECKING:
    import redis

    from dispatchq.runtime import Runtime

__all__ = [
    "DispatchqWorker",
    "build_worker",
    "forget_dead_executions",
    "log",
]

log = logging.getLogger("dispatchq.workers.run")


#: Seconds between the command-channel thread's looks at its stop flag (what a teardown waits).
COMMAND_POLL = 0.5


class DispatchqWorker(SimpleWorker):
    """A non-forking RQ worker that keeps its job's heartbeat alive from a thread.

    Its jobs are `DispatchqJob`s: their function and callbacks come from dispatchq's table
    of entry points, never from importing the names read from Redis.
    """

    job_class = DispatchqJob
    queue_class = DispatchqQueue  # its dequeue fails a job that is not one of ours, unrun
    heartbeat_grace = 60
    #: True once the process was asked to stop (SIGTERM/SIGINT): the only clean exit.
    stopping = False
    #: Set by `make_worker`: the process's parts, and the tier this worker serves.
    runtime: Runtime | None = None
    tier = ""
    #: Long-running workers heal lost judgements in their maintenance; a burst run in
    #: `dispatchq run` does not (it would rescan every queued record at each start).
    heal = True
    #: The supervise loop's stop (set by its own handler): a SIGTERM that came before RQ put
    #: its handlers in (while the worker was built, or the spool replayed) must still stop it.
    outer_stop: threading.Event | None = None
    _outage: OutageLog | None = None
    #: The running job's heartbeat thread and its stop, while a job runs.
    _beating: tuple[threading.Event, threading.Thread] | None = None

    def subscribe(self) -> None:
        # RQ's command channel (`rq`'s stop/kill commands). RQ polls it every 60 s, and
        # redis-py 8.2's `PubSubWorkerThread.stop` joins the thread, so RQ's teardown waited up
        # to a whole poll: every stop of every worker took a minute. A poll every half second
        # costs no Redis command (a socket wait), and bounds a stop by it.
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub, self.pubsub_thread = rqstate.command_channel(
            self.connection,
            self.pubsub_channel_name,
            self.handle_payload,
            poll=COMMAND_POLL,
            on_error=self._pubsub_exception_handler,
        )

    def _install_signal_handlers(self) -> None:
        super()._install_signal_handlers()
        # After RQ's handlers are in, so a signal is either seen here or handled by RQ's.
        if self.outer_stop is not None and self.outer_stop.is_set():
            self.stopping = True
            note_stop_requested()
            self._stop_requested = True  # RQ's loop checks it before its first dequeue

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        # RQ's dequeue loop beats first thing on every round. When Redis is away, the beat is
        # where this worker waits it out (restarting the embedded server, one log line when
        # the state changes) instead of RQ logging an error every two seconds forever.
        while True:
            try:
                super().heartbeat(timeout, pipeline)
                if self.runtime is not None:
                    # Also while a job runs (RQ's job monitor beats with a pipeline): a busy
                    # worker is alive, and `status` must not count it dead.
                    self.runtime.storage.records.publish_worker(
                        self.name, self.facts().model_dump(exclude_unset=True), ttl=self.worker_ttl + 60
                    )
                return
            except Exception as error:
                if pipeline is not None or self.runtime is None or not is_outage(error):
                    raise
                self._ride_out(error)

    def _ride_out(self, error: BaseException) -> None:
        assert self.runtime is not None
        if self._outage is None:
            # One per worker, so the back-off is kept across rounds: a primary that takes the
            # probe write and then refuses the next write again does not restart it.
            self._outage = OutageLog.for_settings(self.runtime.settings, log)
        self._outage.down(error, FIRST_RETRY)
        try:
            settings = self.runtime.settings
            wait_for_redis(settings, log=log, stopping=lambda: self.stopping, outage=self._outage)
        except UserError as refusal:
            # A configuration error met while waiting (the Redis user may not write our keys):
            # one line and exit 2, as at start. Raised from inside RQ's loop, anything but
            # SystemExit would be logged with a traceback and the loop started again.
            log.error("%s", refusal)
            raise SystemExit(2) from None
        if self.stopping:
            raise StopRequested()

    def facts(self) -> WorkerFacts:
        """What this worker runs with, as `status --json`'s `worker_details[]` shows it.

        Published by the worker itself: an operator's shell (another environment, perhaps
        holding a key the workers lack) must not be what `status` reports.
        """
        assert self.runtime is not None
        settings = self.runtime.settings
        environ = parent_environment()
        argv = shlex.split(settings.session_command)
        # Only a session worker spawns sessions, so only it has a scrub to report: a code or
        # typed worker never runs bwrap. bwrap's check is cached per PATH, so a heartbeat
        # does not start a process each time.
        spawns = row(self.tier).worker == "session"
        confined = settings.session_sandbox == "on"
        problem = sandbox_refusal(settings, environ) if spawns else None
        scrub = (
            decide_scrub(settings.session_subprocess_scrub, environ, confined=confined and problem is None)
            if spawns
            else None
        )
        return WorkerFacts(
            tier=self.tier,
            host=settings.host,
            machine_id=machine_id(),
            pid=os.getpid(),
            keyless=settings.typesafe_api_key is None,
            session_command_found=bool(argv) and shutil.which(argv[0], path=environ.get("PATH")) is not None,
            subprocess_scrub=None if scrub is None else "on" if scrub.enabled else "off",
            subprocess_scrub_warning=None if scrub is None else scrub.warning,
            # "on", "off" (unconfined: status says so) or "unavailable" (the host is blocked).
            sandbox=None if not spawns else "unavailable" if problem else settings.session_sandbox,
            sandbox_problem=problem,
            claude_code=claude_code_fact(settings.session_command, environ) if spawns else None,
        )

    def register_death(self) -> None:
        if self.runtime is not None:
            with contextlib.suppress(Exception):  # during an outage there is nothing to unpublish
                self.runtime.storage.records.forget_worker(self.name)
        super().register_death()

    def clean_registries(self) -> None:
        # RQ takes each queue's cleaning lock for 899 s and releases it when done: a worker
        # SIGKILLed while cleaning leaves it, and for 15 minutes no worker finds the jobs that
        # died with theirs. Cut any such lock down to two rounds first; a live holder needs
        # milliseconds of it.
        longest = max(2 * int(self.maintenance_interval), 2)
        for queue in self.queues:
            rqstate.cut_ttl(self.connection, queue.registry_cleaning_key, longest)
        super().clean_registries()

    def run_maintenance_tasks(self) -> None:
        super().run_maintenance_tasks()
        if self.runtime is None or not self.heal:
            return
        try:
            if not self.runtime.storage.records.take_reconcile_turn(
                self.name, self.maintenance_interval * 0.9
            ):
                return  # another worker (or the scheduler) reconciles this round
            healed = reconcile(self.runtime, min_age=self.job_monitoring_interval + self.heartbeat_grace)
        except Exception as error:
            if is_outage(error):
                raise  # RQ's loop ends; `run_worker` waits for Redis and starts it again
            log.warning("reconciliation failed (%s); will try again", failure_line(error))
            return
        if healed:
            log.info("reconciliation put %d judgement(s) back whose job was lost", healed)

    def request_stop(self, signum: Any, frame: Any) -> None:
        self.stopping = True
        # Process-wide, for the session tier: a session ended by a shutdown signal is free
        # only when the worker was asked to stop too (`queue.stopping`).
        note_stop_requested()
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
        # The job's heartbeat thread stops first: a beat landing after the cleanup (a partition's
        # late one) would tear the hash again, between the cleanup and RQ's delete.
        self._stop_beating()
        forget_dead_executions(self.connection, job.id, keep=execution.id)
        super().handle_job_success(job, queue, started_job_registry, execution)

    def _stop_beating(self) -> None:
        beating, self._beating = self._beating, None
        if beating is not None:
            stop, thread = beating
            stop.set()
            thread.join(timeout=5)

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
        self._beating = (stop, thread)
        thread.start()
        try:
            self.perform_job(job, queue, execution)
        finally:
            self._stop_beating()
        self.set_state("idle")


def forget_dead_executions(client: redis.Redis, job_id: str, *, keep: str = "") -> int:
    """Drop the entries of `job_id`'s execution registry whose execution hash is gone or torn.

    Gone is what a worker killed mid-job leaves behind (its hash expires with its
    heartbeat; the registry entry only 60 s later). Torn is what a partition leaves: another
    host's maintenance deleted this execution as abandoned, then this worker's late heartbeat
    re-created its hash with a field or two and no `created_at`. RQ's `Job.delete` fetches
    every entry and raises on the first missing or torn hash, which would file a job that
    returned as failed (and, for a session, read as its worker dying). Returns how many
    entries were dropped.
    """
    registry = ExecutionRegistry(job_id=job_id, connection=client)
    dropped = 0
    for execution_id in registry.get_execution_ids():
        key = Execution(id=execution_id, job_id=job_id, connection=client).key
        dropped += rqstate.forget_execution(
            client, registry.key, key, execution_id, keep=execution_id == keep
        )
    return dropped


def build_worker(
    cls: type[DispatchqWorker], runtime: Runtime, tier: str, *, name: str | None = None, heal: bool = True
) -> DispatchqWorker:
    """A worker of `cls` for `tier`'s queues, with the process's recovery settings."""
    settings = runtime.settings
    live = runtime.storage.records.live_workers(ttl=settings.heartbeat_interval + settings.heartbeat_grace)
    check_host_unique(live, settings.host, machine_id())  # before it takes any host-bound job
    ensure_upgraded(runtime.redis)  # the previous release's pickled jobs, as JSON, before any dequeue
    # Its own queues of `DispatchqJob`s: RQ cleans registries (and runs an abandoned job's
    # failure callback) with the queue's job class, not the worker's.
    queues = [
        DispatchqQueue(queue.name, connection=runtime.redis) for queue in runtime.dispatcher.queues_for(tier)
    ]
    worker = cls(
        queues,
        name=name,
        connection=runtime.redis,
        queue_class=DispatchqQueue,
        serializer=JSONSerializer,
        maintenance_interval=settings.recovery_interval,
        job_monitoring_interval=settings.heartbeat_interval,
        default_result_ttl=0,
    )
    worker.heartbeat_grace = settings.heartbeat_grace
    worker.runtime = runtime
    worker.tier = tier
    worker.heal = heal
    return worker
