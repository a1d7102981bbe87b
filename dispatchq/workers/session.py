"""The session tier's RQ side: a worker whose dequeue is the window's admission.

RQ's own dequeue would pop the next job from a list; a session must first pass the
window (`dispatchq.tiers.session.admit`: markers, a shared slot, the probe election,
the claim from dispatchq's own line). So `SessionWorker` replaces
`dequeue_job_and_maintain_ttl` with that loop, sleeping on the wake channel (or until a
lift instant) between tries, and only then makes the RQ job (`jobs.tiers.session`) that
runs the admitted judgement. Everything after that — execution, timeouts, heartbeats,
abandoned jobs — is RQ's, through `DispatchqWorker`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from rq import Callback, Queue
from rq.exceptions import StopRequested
from rq.job import Job

from dispatchq.backends import DEFAULT_BACKEND, backend_for, command_for
from dispatchq.core.entrypoints import FAILURE_CALLBACK, SESSION_JOB
from dispatchq.errors import SettingsError
from dispatchq.launcher.environment import read_secret
from dispatchq.launcher.scrub import decide_scrub
from dispatchq.queue.entrypoints import DispatchqQueue, entry_module
from dispatchq.queue.stopping import stop_requested
from dispatchq.settings import parent_environment
from dispatchq.storage.outage import is_outage
from dispatchq.tiers.confine import CREDENTIAL_HINT, pool_credential_problem, sandbox_refusal, sweep
from dispatchq.tiers.lease import replay_spool, sweep_lapsed
from dispatchq.tiers.preflight import unrunnable_backends, warn_if_command_missing
from dispatchq.tiers.session import (
    BLOCKED_RECHECK,
    STOPPED_BY_SHUTDOWN,
    Admission,
    admit,
    hold_paused,
    host_fingerprint,
    lines_for,
    model_of,
    recheck_blocked,
    requeue_front,
    take_back,
    worker_died,
)
from dispatchq.workers.base import DispatchqWorker, build_worker

if TYPE_CHECKING:
    from collections.abc import Mapping

    from dispatchq.runtime import Runtime
    from dispatchq.tiers.hooks import SessionHooks
    from dispatchq.window.face import Window

__all__ = ["SESSION_JOB", "SessionWorker", "burst", "check_session_host", "session_job_lost", "stopped_cold"]

log = logging.getLogger("dispatchq.session")
_WARNED: set[str] = set()


def _say_once(level: int, message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.log(level, "%s", message)


def check_session_host(runtime: Runtime, *, require_credential: bool = True) -> None:
    """Before the first admission: can sessions start here, confined, with their credential?

    - no credential (neither the variable nor `<VAR>_FILE`): `SettingsError` with the
      `claude setup-token` hint (the CLI exits 2): a stored login is not read by a session.
      Unless `require_credential` is false (`dispatchq run`, which answers what the other
      tiers can): then the spawn's own check blocks the host with that reason and the
      session judgements wait on it, uncharged;
    - the sandbox cannot start (`DISPATCHQ_SESSION_SANDBOX=on`): the host is blocked with the
      reason and the hint, so judgements wait uncharged and status, the page and metrics
      show it; the periodic host probe tries again, still spawning nothing until it works;
    - the sandbox is off: one warning line, and `status` says so;
    - the subprocess scrub: `on` without a usable bubblewrap (inside the sandbox, when there
      is one) raises `SettingsError`; `auto` without it logs one warning line per process.
    """
    settings = runtime.settings
    environ = parent_environment()
    var = settings.session_credential_var
    pool = runtime.pool()
    unreadable = [p for p in (pool_credential_problem(c) for c in pool if c.file is not None) if p]
    if unreadable:
        raise SettingsError("\n".join(unreadable))
    from_environment = any(c.file is None for c in pool)
    if require_credential and from_environment and read_secret(var, environ) is None:
        raise SettingsError(f"{var} is not set: {CREDENTIAL_HINT.format(var=var)}")
    warn_if_command_missing(settings, environ)  # a WARNING now, not when a judgement comes
    problem = sandbox_refusal(settings, environ)
    if problem is not None:
        _say_once(logging.ERROR, f"sessions cannot start on this host: {problem}")
        window = runtime.window
        window.store.block(
            settings.host,
            problem,
            fingerprint=host_fingerprint(settings, environ),
            probe_after=settings.host_probe_interval,
        )
    elif settings.session_sandbox == "off":
        _say_once(logging.WARNING, "sessions on this host run UNCONFINED (DISPATCHQ_SESSION_SANDBOX=off)")
    sweep(settings, runtime.window.records.statuses)  # folders of judgements that ended elsewhere
    confined = settings.session_sandbox == "on" and problem is None
    decision = decide_scrub(settings.session_subprocess_scrub, environ, confined=confined)
    if decision.warning:
        _say_once(logging.WARNING, decision.warning)
    # Each installed CLI the pool runs outside its tested range: a WARNING, once.
    for name in sorted({DEFAULT_BACKEND} | {c.backend for c in pool}):
        backend_for(name).check_release(command_for(name, settings), environ)


def replay_hooks() -> Mapping[str, SessionHooks]:
    """The built-in kinds' hooks exactly as the session job gets them (`jobs.tiers.session`,
    from the process wiring this room sits below): a replayed answer runs the same ones."""
    hooks: Mapping[str, SessionHooks] = entry_module().session_hooks()
    return hooks


class SessionWorker(DispatchqWorker):
    """An RQ worker whose dequeue is dispatchq's admission loop (see the module docstring)."""

    runtime: Runtime
    #: A worker refuses to start without the session credential; `dispatchq run` does not.
    require_credential = True

    _last_sweep = 0.0

    def work(self, *args: Any, **kwargs: Any) -> bool:
        check_session_host(self.runtime, require_credential=self.require_credential)
        self._leases(force=True)  # what this host spooled before it stopped, first
        return bool(super().work(*args, **kwargs))

    def _leases(self, *, force: bool = False) -> None:
        """Replay this host's spool and take over judgements whose lease lapsed.

        Every few seconds (a third of the lease at most) rather than every round: the spool
        is a folder listing, the sweep reads the running table. Redis away: next time. The
        replay runs the hooks the session job runs (`replay_hooks`), so a replayed answer is
        graded as a live one.
        """
        settings = self.runtime.settings
        now = time.monotonic()
        if not force and now - self._last_sweep < min(5.0, settings.session_lease / 3):
            return
        self._last_sweep = now
        window = self.runtime.window
        try:
            replay_spool(window, runtime=self.runtime, hooks=replay_hooks())
            sweep_lapsed(window)
        except Exception as error:  # never out of the worker loop: the next round tries again
            if not is_outage(error):
                log.exception("the spool replay or the lease sweep failed")

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        burst = timeout is None
        runtime = self.runtime
        settings = runtime.settings
        window = runtime.window

        def model(kind_name: str) -> str | None:
            return model_of(runtime.config.kinds, kind_name)

        queue = DispatchqQueue(runtime.storage.jobs.queue_name("session"), connection=self.connection)
        pubsub = None
        last_recheck = 0.0
        unrunnable: dict[str, str] = {}
        try:
            while True:
                self.heartbeat()
                if self.should_run_maintenance_tasks:
                    self.run_maintenance_tasks()
                if self._stop_requested:
                    return None
                self._leases()
                if not last_recheck or (not burst and time.monotonic() - last_recheck > BLOCKED_RECHECK):
                    last_recheck = time.monotonic()
                    environ = parent_environment()
                    if not burst:
                        recheck_blocked(window, settings, environ)
                    # A CLI installed (or removed) since is seen within a recheck.
                    backends = (c.backend for c in runtime.pool())
                    unrunnable = unrunnable_backends(backends, settings, environ)
                decision = admit(window, settings.host, self.name, model, unrunnable)
                if isinstance(decision, Admission):
                    return self._job_for(decision, queue), queue
                if burst:
                    return None
                if pubsub is None:
                    pubsub = window.store.subscribe_wake()
                    continue  # re-check once subscribed, so no wake-up falls between
                wait = 5.0
                if decision.until is not None:
                    # Wake at the lift instant itself: a dead scheduler costs no delay.
                    wait = max(0.0, min(wait, decision.until - time.time()))
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline and not self._stop_requested:
                    message = pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
                    if message is not None:
                        break
        finally:
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    pubsub.close()

    def _job_for(self, admission: Admission, queue: Queue) -> Job:
        runtime = self.runtime
        runtime.storage.records.set_fields(admission.jid, job=f"session:{admission.slot}")
        # The claim admission just wrote: the job's every write is fenced by it.
        claim = runtime.storage.records.claim_of(admission.jid)
        job = queue.create_job(
            SESSION_JOB,
            args=(admission.jid, admission.slot),
            kwargs={"probes": admission.probes, **({"claim": claim} if claim else {})},
            timeout=runtime.dispatcher.job_timeout("session"),
            result_ttl=0,
            failure_ttl=runtime.settings.result_ttl,
            on_failure=Callback(FAILURE_CALLBACK),
            description=f"dispatchq session {admission.jid}",
        )
        job.origin = queue.name
        job.save()
        return job


def burst(runtime: Runtime) -> bool:
    """Run sessions in this process until none can start now; True if any finished.

    Without a session credential the judgements wait on this host's block, with the reason
    and the hint, instead of the whole run being refused: the code and typed tiers' answers
    stand, and `dispatchq run` exits 3 (a person must act).
    """
    settings = runtime.settings
    window = runtime.window
    if not window.store.any_waiting(lines_for(settings.host)):
        return False
    recheck_blocked(window, settings, parent_environment())

    def model(kind_name: str) -> str | None:
        return model_of(runtime.config.kinds, kind_name)

    before = runtime.storage.records.answered_counts()["session"] + runtime.storage.records.count("failed")
    worker = build_worker(SessionWorker, runtime, "session")
    assert isinstance(worker, SessionWorker)
    worker.require_credential = False
    worker.work(burst=True, logging_level="WARNING", with_scheduler=False)
    hold_paused(
        window, settings.host, model
    )  # beyond the admission lookahead too: `run` names why each one waits
    after = runtime.storage.records.answered_counts()["session"] + runtime.storage.records.count("failed")
    return after != before


def session_job_lost(runtime: Runtime, job: Job, exc: Any) -> None:
    """RQ gave up on a session job: the judgement goes back to the front.

    Its worker's heartbeat lapsed (found abandoned): the lease decides (`worker_died`:
    nothing while the lease lives, "lost contact" uncharged after; a death only when its
    process is seen gone on this host). Or the worker
    was stopped cold: a second SIGTERM/SIGINT while a session runs makes RQ raise
    `SystemExit` inside the job, the launcher takes the session down, and the job fails.
    That is a shutdown, not the session's doing: "stopped by a shutdown", uncharged.
    """
    if not job.args:
        return
    slot = str(job.args[1]) if len(job.args) > 1 else None
    probes = list((job.kwargs or {}).get("probes", []))
    claim = (job.kwargs or {}).get("claim")
    claim = str(claim) if claim else None
    window = runtime.window
    jid = str(job.args[0])
    if isinstance(exc, (SystemExit, KeyboardInterrupt, StopRequested)) and stop_requested():
        stopped_cold(window, jid, slot, probes, claim)
        return
    worker_died(window, jid, slot, probes, claim)


def stopped_cold(
    window: Window, jid: str, slot: str | None, probes: list[str], claim: str | None = None
) -> None:
    """A session cut off by its worker's cold shutdown: back to the front, nothing charged.

    Only while it is still this worker's claim (one taken over meanwhile is not put back twice).
    """
    current = window.records.get(jid)
    if current is None or (claim and getattr(current, "claim", None) != claim):
        return
    record = take_back(window, jid, slot, probes)
    if record is None:
        return
    resume = getattr(record, "session_id", None)
    fields = {"resume_session": resume} if resume else {}
    requeue_front(window, record, STOPPED_BY_SHUTDOWN, reason=STOPPED_BY_SHUTDOWN, claim=claim, **fields)
