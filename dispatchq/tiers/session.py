"""The session tier: spend the one shared usage window carefully, and never lose work.

Session judgements wait in dispatchq's own line (a sorted set per host: the typed tier's
`order` priority first, then FIFO) rather than in an RQ list, because admission is
more than "next job": before anything is spawned the session worker

1. checks every usage-window marker that applies to the kind's model: while one is
   closed, *zero* sessions start (RQ's global `rq suspend` would still let each worker
   take one more job);
2. takes one of DISPATCHQ_SESSION_CONCURRENCY slots, shared by every machine;
3. after a lift, elects exactly one probe session across all machines; the rest wait
   until it shows the window open;
4. claims the judgement from the line atomically.

Steps 1–4 are the window's (`dispatchq.window.face.Window.admit`); this module picks the
lines and the kinds' models and, once a judgement is admitted, runs its session and tells
the window what the session reported. The RQ side (the worker whose dequeue is `admit`, and
the job it builds) is `dispatchq.workers.session`, so execution, timeouts, heartbeats and
abandoned-job handling stay RQ's. A worker killed mid-session takes its session with it
(parent-death signal) and the judgement goes back to the front of the line, its death counted
on the record (after DISPATCHQ_JOB_RETRIES deaths it fails); a session ended by a shutdown
signal, or refused at spawn, goes back to the front too, and costs nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from signal import SIGHUP, SIGINT, SIGTERM
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from dispatchq.backends import SessionBackend, backend_for, command_for
from dispatchq.core.judgement import FINISHED
from dispatchq.core.prompts import render_prompt
from dispatchq.core.status import RunningSession
from dispatchq.launcher.environment import read_secret
from dispatchq.launcher.scrub import decide_scrub
from dispatchq.launcher.spawn import LaunchResult, launch
from dispatchq.pools.credentials import DEFAULT_CREDENTIAL
from dispatchq.queue.stopping import stop_requested
from dispatchq.settings import parent_environment
from dispatchq.storage.outage import is_outage
from dispatchq.tiers.after import answer_hooks
from dispatchq.tiers.blocks import (
    block_credential,
    block_host,
    held,
    host_fingerprint,
    lines_for,
    recheck_blocked,
    unblock_host,
)
from dispatchq.tiers.confine import (
    Confinement,
    config_dir,
    confinement,
    forget,
    read_pool_credential,
    spawn_refusal,
    work_dir,
    write_config_files,
)
from dispatchq.tiers.hooks import NO_HOOKS, Requeue, SessionHooks, Settled
from dispatchq.tiers.lease import (
    LOST_CONTACT,
    MAX_ERRORS,
    Holding,
    answer,
    fail,
    holder_pid,
    host_bound,
    kind_model,
    limit_signals,
    outcome_of,
    parse_answer,
    requeue_front,
    retry_or_fail,
    take_over,
)
from dispatchq.tiers.probe_watch import ProbeWatch
from dispatchq.tiers.renewal import carry_back
from dispatchq.tiers.session_logs import session_log_path, write_session_log
from dispatchq.window.face import Admission, Wait
from dispatchq.window.limits import GENERAL_SCOPE, SessionOutcome, is_credential_refused
from dispatchq.window.pooling import slot_credential

if TYPE_CHECKING:
    from dispatchq.core.judgement import Record
    from dispatchq.core.kinds import Kind
    from dispatchq.pools.credentials import Credential
    from dispatchq.runtime import Runtime
    from dispatchq.settings import Settings
    from dispatchq.storage.spool import SpoolKind
    from dispatchq.window.face import Window

__all__ = [
    "BLOCKED_RECHECK",
    "GENERAL_SCOPE",
    "LOOKAHEAD",
    "MAX_ERRORS",
    "MAX_TRANSIENT",
    "SHUTDOWN_GRACE",
    "STOPPED_BY_SHUTDOWN",
    "Admission",
    "Wait",
    "admit",
    "block_host",
    "ended_by_shutdown",
    "held",
    "hold_paused",
    "host_fingerprint",
    "lines_for",
    "model_of",
    "parse_answer",
    "recheck_blocked",
    "requeue_front",
    "run_claimed",
    "session_log_path",
    "take_back",
    "unblock_host",
    "worker_died",
    "write_session_log",
]

log = logging.getLogger("dispatchq.session")

LOOKAHEAD = 64  # line entries examined per admission (kinds paused by a model scope are skipped)
MAX_TRANSIENT = 5
BLOCKED_RECHECK = 30.0

ModelOf = Callable[[str], str | None]

#: The reason of a session judgement requeued because a shutdown ended its session.
STOPPED_BY_SHUTDOWN = "stopped by a shutdown"
#: How long a session ended by a shutdown signal waits for its worker's own stop request
#: (a unit stop may signal the session's group an instant before the worker).
SHUTDOWN_GRACE = 2.0
_SHUTDOWN_SIGNALS = (SIGTERM, SIGINT, SIGHUP)
_SHUTDOWN_CODES = frozenset(int(s) for s in _SHUTDOWN_SIGNALS)  # -N: killed by signal N
_SHUTDOWN_EXITS = frozenset(128 + int(s) for s in _SHUTDOWN_SIGNALS)  # the supervisor's 128+N


def model_of(kinds: Mapping[str, Kind], kind_name: str) -> str | None:
    """The model a kind's session names (None: the account default)."""
    kind = kinds.get(kind_name)
    return kind.session.model if kind and kind.session else None


def admit(
    window: Window,
    host: str,
    holder: str,
    model: ModelOf,
    unrunnable: Mapping[str, str] = MappingProxyType({}),
) -> Admission | Wait:
    """Decide whether one more session may start here and now, and which one.

    A blocked host spawns nothing, except one probe session per
    DISPATCHQ_HOST_PROBE_INTERVAL (claimed across processes): if it gets past the host-wide
    failure, the block is cleared. `unrunnable`: the backends whose command this host lacks
    while another's is here (`tiers.preflight.unrunnable_backends`), routed around.
    """
    blocked = window.store.blocked_reason(host)
    if blocked and not window.store.try_host_probe(host, window.settings.host_probe_interval):
        return Wait(blocked, until=window.store.host_probe_due(host))
    entries = window.store.line_heads(lines_for(host), LOOKAHEAD)
    if not entries:
        return Wait("no session judgements waiting")
    window.records.claim_lease = float(window.settings.session_lease)  # the claim's first lease
    return window.admit(holder, entries, model, unrunnable)


def hold_paused(window: Window, host: str, model: ModelOf) -> None:
    """Every queued session judgement a closed marker holds back shows `waiting`, with why."""
    window.hold_paused(lambda: held(window, host), model)


def take_back(window: Window, jid: str, slot: str | None, probes: list[str]) -> Record | None:
    """A session job that ended without answering: its record, out of running, its slot freed.

    None when the judgement is no longer running (settled, cancelled, or taken back by
    another path already): then there is nothing to requeue or charge.
    """
    record = window.records.get(jid)
    if record is None or record.status != "running":
        return None
    window.store.clear_running(record.id)
    if slot is not None:
        window.release(slot, probes)
    return record


def worker_died(
    window: Window, jid: str, slot: str | None, probes: list[str], claim: str | None = None
) -> None:
    """RQ gave up on a session job (its worker's heartbeat lapsed): the lease decides what next.

    RQ's verdict is a guess from one host's view: a worker cut off from Redis looks dead
    too. So a judgement with a claim is handled by the lease rule (`tiers.lease.take_over`):
    while its lease lives nothing is touched (the sweep takes it once it lapses); after,
    it is asked again uncharged ("lost contact"). A death is counted only when the holder
    ran on this very host and this machine sees its process gone, or for a judgement
    claimed before claim tokens existed: on the record (`deaths`), as the code and typed
    tiers count theirs; after DISPATCHQ_JOB_RETRIES deaths the judgement fails with the
    reason "its worker died N times", so a session that reliably kills its worker cannot
    block the line.
    """
    current = window.records.get(jid)
    if current is None or current.status != "running":
        return
    if take_over(window, current, claim, slot, probes) not in ("legacy", "died"):
        return
    record = take_back(window, jid, slot, probes)
    if record is None:
        return
    deaths = window.records.add_death(record.id)
    if deaths > window.settings.job_retries:
        fail(window, record, f"its worker died {deaths} time{'s' if deaths != 1 else ''}", {})
        return
    resume = getattr(record, "session_id", None)
    fields = {"resume_session": resume} if resume else {}
    requeue_front(window, record, "its session worker died", **fields)


# --- running one admitted session -----------------------------------------------------
def run_claimed(
    runtime: Runtime,
    jid: str,
    slot: str,
    probes: list[str] | None = None,
    *,
    hooks: Mapping[str, SessionHooks] | None = None,
    claim: str | None = None,
) -> str:
    """The RQ job: spawn one admitted session and account for what it did.

    The job's edge: the runtime is unpacked here (the window, the kind, the parent
    environment the session's is scrubbed from) and only the hooks still receive it.
    `hooks` are the built-in kinds' steps around the spawn, by kind name, handed in by
    the process wiring; a kind without an entry runs the no-op `SessionHooks`. `claim` is
    the token admission wrote (None: a job made before tokens existed): from here on the
    run is a `tiers.lease.Holding`, renewing its lease and writing only as that claim.
    """
    probes = list(probes or [])
    shared = runtime.window
    record = shared.records.get(jid)
    if record is None or record.status != "running" or (claim and getattr(record, "claim", None) != claim):
        shared.release(slot, probes)
        shared.settle(slot, None, ran=False)
        shared.store.clear_running(jid, claim)
        return "not running any more"
    holding = Holding(shared, jid, slot, probes, claim, bound=host_bound(record))
    holding.start()
    try:
        window = holding.window
        kind = runtime.config.kinds.get(record.kind)
        if kind is None or kind.session is None:
            window.records.transition(
                record.id,
                "failed",
                expect=["running"],
                fields={"tier": "session", "reason": "kind has no session"},
                claim=holding.token,
            )
            return "failed"
        kind_hooks = (hooks or {}).get(record.kind, NO_HOOKS)
        name = slot_credential(slot)
        credential = window.credential(name)
        if credential is None:  # the pool was edited since admission: ask again, uncharged
            why = f"credential {name} is no longer in the pool"
            window.settle(slot, None, ran=False)
            requeue_front(window, record, why, claim=holding.token)
            return "credential gone"
        return _run(runtime, holding, record, kind, kind_hooks, parent_environment(), credential)
    finally:
        holding.close()


@dataclass(frozen=True)
class _Attempt:
    """One admitted judgement's run: what every step of spawning and accounting for it reads.

    `_run` is a pipeline (refuse before spawn, build the spawn, watch the stream, settle the
    result); each step is its own function over this one value rather than seven arguments.
    `backend` is the CLI the session runs (`dispatchq.backends`): its argv, environment and
    output readers.
    """

    runtime: Runtime
    holding: Holding
    record: Record
    kind: Kind
    hooks: SessionHooks
    environ: Mapping[str, str]
    credential: Credential
    backend: SessionBackend

    @property
    def window(self) -> Window:
        """The window on the holder's bounded client: every write of the run goes through it."""
        return self.holding.window

    @property
    def probes(self) -> list[str]:
        return self.holding.probes

    @property
    def claim(self) -> str:
        """What the run's record writes carry (its claim token, or the legacy pass)."""
        return self.holding.token

    @property
    def settings(self) -> Settings:
        return self.window.settings

    @property
    def slot(self) -> str:
        return self.holding.slot

    @property
    def credential_files(self) -> list[str]:
        """Every pool credential's file: none of them is readable inside the sandbox."""
        return [c.file for c in self.window.pool() if c.file is not None]

    def settle(self, cost: float | None, *, ran: bool = True) -> None:
        """Charge the session (`tiers.session` calls it once per outcome; a second settle moves
        nothing); never out of the run because the store blinked (the estimate then stays)."""
        try:
            self.window.settle(self.slot, cost, ran=ran)
        except Exception as error:
            if not is_outage(error):
                raise

    @property
    def resume(self) -> str | None:
        """The session this judgement resumes (set when one was cut off or stopped mid-run);
        None, a fresh start, when it moved to a credential its backend's transcripts do not follow."""
        resume = getattr(self.record, "resume_session", None) or None
        return None if self.moved and not self.backend.resumes_across_credentials else resume

    @property
    def moved(self) -> str | None:
        """The trail's words when a session cut off under one credential goes on under this one
        (`credential`: what the cut-off run recorded beside its session id); else None."""
        before = getattr(self.record, "credential", None)
        if not getattr(self.record, "resume_session", None) or not before or before == self.credential.name:
            return None
        how = "resumed" if self.backend.resumes_across_credentials else "started fresh"
        return f"{how} on {self.credential.name} after a cut-off on {before}"

    def running(self, session_id: str | None) -> None:
        """Show the judgement as running here (`status`, `dispatchq result`), with its session."""
        entry = RunningSession(
            host=self.settings.host,
            session_id=session_id,
            started=time.time(),
            probe=self.probes,
            pid=holder_pid(),
            claim=self.holding.claim,
            credential=self.credential.name,
        )
        self.window.store.set_running(self.record.id, entry.model_dump())


@dataclass(frozen=True)
class _Spawn:
    """What `launch` is handed: built before anything runs, so a bad setting spawns nothing."""

    argv: list[str]
    prompt: str
    cwd: Path
    env: dict[str, str]
    confined: Confinement
    #: The config folder the CLI keeps its login in, and the login from a credential's file
    #: it was given there (None: a variable's token), for `_carry_back_login`.
    config: Path | None = None
    login: str | None = None


def _run(
    runtime: Runtime,
    holding: Holding,
    record: Record,
    kind: Kind,
    hooks: SessionHooks,
    environ: Mapping[str, str],
    credential: Credential,
) -> str:
    """Spawn one admitted judgement's session and account for what it did; returns the job's result."""
    assert kind.session is not None
    attempt = _Attempt(
        runtime, holding, record, kind, hooks, environ, credential, backend_for(credential.backend)
    )
    window = attempt.window
    refused = _refused_before_spawn(attempt)
    if refused is not None:
        attempt.settle(None, ran=False)
        return refused
    unconfinable = spawn_refusal(attempt.settings, environ, credential)  # credential unreadable, no sandbox
    if unconfinable is not None:
        attempt.settle(None, ran=False)
        block_host(
            window, record, unconfinable, host_fingerprint(attempt.settings, environ), claim=attempt.claim
        )
        attempt.hooks.not_spawned(runtime, record, unconfinable)
        return "sandbox unavailable"
    spawn = _build_spawn(attempt)
    watch = ProbeWatch(attempt)
    watch.start_grace()
    attempt.running(attempt.resume)
    started = time.time()
    try:
        result = launch(
            spawn.argv,
            spawn.prompt,
            cwd=spawn.cwd,
            env=spawn.env,
            timeout=window.settings.session_timeout,
            on_event=watch.on_event,
            sandbox=spawn.confined.plan,
            egress=spawn.confined.egress,
            cancel=holding.cancel,
        )
    finally:
        watch.stop_grace()
    if holding.fenced is not None:
        return _settle_unwritten(attempt, result, started, holding.fenced)
    try:
        return _settle(attempt, result, watch, started, spawn)
    except Exception as error:
        if not is_outage(error):
            raise
        return _settle_unwritten(attempt, result, started, f"Redis unreachable ({type(error).__name__})")


def _refused_before_spawn(attempt: _Attempt) -> str | None:
    """The job's result when nothing may run now, else None.

    The window may have closed between admission and now (not one spawn while it is closed),
    and the kind's `before_spawn` hook may requeue or settle the judgement itself.
    """
    assert attempt.kind.session is not None
    window, record = attempt.window, attempt.record
    closed = window.closed_for(attempt.kind.session.model, attempt.credential.name)
    if closed:
        requeue_front(
            window,
            record,
            closed[0].message or "usage window closed",
            status="waiting",
            wclass="window",
            claim=attempt.claim,
        )
        return "paused"
    verdict = attempt.hooks.before_spawn(attempt.runtime, record)
    if isinstance(verdict, Requeue):
        requeue_front(window, record, verdict.why, claim=attempt.claim)
        return verdict.result
    if isinstance(verdict, Settled):
        return verdict.result
    return None


def _build_spawn(attempt: _Attempt) -> _Spawn:
    """argv (resuming the judgement's session if it has one), scrubbed environment, cwd, prompt."""
    assert attempt.kind.session is not None
    settings, record, environ = attempt.settings, attempt.record, attempt.environ
    backend = attempt.backend
    command = command_for(backend.name, settings)
    argv = backend.argv(command, attempt.kind.session.args, resume=attempt.resume)
    chosen = attempt.credential
    credential: str | None
    if chosen.file is not None:
        variable, credential = chosen.variable, read_pool_credential(chosen)
    else:
        variable = settings.session_credential_var
        credential = read_secret(variable, environ)
    confined = settings.session_sandbox == "on"
    scrub = decide_scrub(settings.session_subprocess_scrub, environ, confined=confined)
    config = config_dir(settings, record.id)
    env = backend.environment(
        environ,
        deny=settings.session_deny_env,
        allow=settings.session_allow_env,
        credential_var=variable,
        credential_value=credential,
        scrub_subprocesses=scrub.enabled,
        config_dir=config,
    )
    write_config_files(config, backend.config_files(env, variable, credential))
    checkout = record.context.get("checkout") if isinstance(record.context, dict) else None
    cwd = Path(checkout) if checkout else work_dir(settings, record.id)
    # A built-in kind may build its own prompt (the decision gate frames untrusted fields its
    # own way and keeps its own lines outside the frame); every other kind is rendered here.
    prompt = attempt.hooks.render_prompt(attempt.runtime, record)
    if prompt is None:
        prompt = render_prompt(
            attempt.kind.session.prompt_for(backend.name),
            {"target": record.target, "item": record.item, "state": record.state, "context": record.context},
        )
    return _Spawn(
        argv=argv,
        prompt=prompt,
        cwd=cwd,
        env=env,
        confined=confinement(
            settings, attempt.kind, environ, env, cwd, config, attempt.credential_files, backend=backend
        ),
        config=config,
        login=credential if chosen.file is not None else None,
    )


def _carry_back_login(attempt: _Attempt, spawn: _Spawn) -> None:
    """A login the session renewed in its config folder, back into its credential's file
    (`tiers.renewal`), whatever the run amounted to: a cut-off run may have renewed it too."""
    chosen = attempt.credential
    if spawn.login is None or spawn.config is None or chosen.file is None:
        return
    renewed = attempt.backend.renewed_login(spawn.config, spawn.login)
    if renewed is not None:
        carry_back(chosen.name, chosen.file, spawn.login, renewed, attempt.settings.data_dir / "locks")


def _settle(
    attempt: _Attempt, result: LaunchResult, watch: ProbeWatch, started: float, spawn: _Spawn | None = None
) -> str:
    """Account for one spawn: what ended it first (nothing ran, a shutdown), then what it said."""
    window, record, settings = attempt.window, attempt.record, attempt.settings
    if result.missing_executable:
        fingerprint = host_fingerprint(settings, attempt.environ)
        block_host(window, record, result.missing_executable, fingerprint, claim=attempt.claim)
        attempt.settle(None, ran=False)
        # Undo what before_spawn prepared.
        attempt.hooks.not_spawned(attempt.runtime, record, result.missing_executable)
        return "missing executable"
    window.store.count_spawned()
    window.store.observe_session(time.time() - started)  # storage/histograms.py
    write_session_log(settings.data_dir, record.id, result)
    if spawn is not None:
        _carry_back_login(attempt, spawn)
    if ended_by_shutdown(result):
        attempt.settle(None)  # what it cost is unknown: its estimate stays charged
        return _settle_shutdown(attempt, result)
    outcome = attempt.backend.read_outcome(
        result.stdout,
        now=datetime.now(UTC),
        default_tz=settings.timezone,
        unknown_reset=settings.unknown_reset_probe,
        returncode=result.returncode,
        stderr=result.stderr,
    )
    if spawn is not None:  # a limit in words, with the CLI's machine-readable windows in its place
        outcome = attempt.backend.refine_limits(
            outcome,
            command=command_for(attempt.backend.name, settings),
            session_env=spawn.env,
            cwd=spawn.cwd,
            now=datetime.now(UTC),
            unknown_reset=settings.unknown_reset_probe,
        )
    # Charged whatever the outcome (cut off, throttled, retried): what the session reported (or
    # its tokens priced, for a CLI that prints no cost), else the estimate reserved at admission stays.
    if outcome.total_cost_usd is None:
        model = attempt.kind.session.model if attempt.kind.session is not None else None
        spent = attempt.backend.cost(outcome, model=model, prices=settings.codex_prices)
        outcome = replace(outcome, total_cost_usd=spent) if spent is not None else outcome
    attempt.settle(outcome.total_cost_usd)
    # Each of its credential's windows' use and the login's end, for status and the page.
    window.report_usage(outcome, attempt.credential.name)
    not_the_judgements = _settle_host(attempt, outcome, result)
    if not_the_judgements is not None:
        return not_the_judgements
    accounted = _account(
        window,
        record,
        attempt.kind,
        outcome,
        result.timed_out,
        watch.open_window,
        started,
        claim=attempt.claim,
        credential=attempt.credential.name,
        moved=attempt.moved,
    )
    now = datetime.now(UTC)
    reserve = attempt.backend.reserve_signals(outcome.events, reserve=settings.window_reserve, now=now)
    for signal, used in reserve:
        window.raise_marker(
            signal,
            session=outcome.session_id,
            source="reserve",
            utilization=used,
            credential=attempt.credential.name,
        )
    if accounted == "answered":  # once per answer: the spool's replay may run them instead
        answer_hooks(attempt.runtime, attempt.hooks, window, record, outcome, result, attempt.claim)
    else:
        attempt.hooks.after_session(attempt.runtime, record, outcome, result)
    if window.records.statuses([record.id])[0] in FINISHED:
        forget(settings, record.id)  # its transcripts and scratch folder end with it
    return accounted


def _settle_shutdown(attempt: _Attempt, result: LaunchResult) -> str:
    """A session ended by a shutdown signal: back to the front, to resume the same session.

    Not the session's doing when this worker was asked to stop too: uncharged (no attempt,
    no death). A shutdown signal the worker never got (a command that kills its own group)
    is counted, so it cannot requeue forever.
    """
    window, record, hooks = attempt.window, attempt.record, attempt.hooks
    fields = {"resume_session": result.session_id} if result.session_id else {}
    if not stop_requested(within=SHUTDOWN_GRACE):
        shutdowns = window.records.add_shutdown(record.id)
        if shutdowns > attempt.settings.job_retries:
            hooks.not_spawned(attempt.runtime, record, STOPPED_BY_SHUTDOWN)
            return fail(window, record, f"{STOPPED_BY_SHUTDOWN} {shutdowns} times", {}, claim=attempt.claim)
    requeue_front(
        window, record, STOPPED_BY_SHUTDOWN, reason=STOPPED_BY_SHUTDOWN, claim=attempt.claim, **fields
    )
    hooks.not_spawned(attempt.runtime, record, STOPPED_BY_SHUTDOWN)  # not an attempt
    return "stopped by a shutdown"


def _settle_host(attempt: _Attempt, outcome: SessionOutcome, result: LaunchResult) -> str | None:
    """A run that says nothing about the judgement: the host failed, or `--resume` found no transcript.

    Either way the judgement is requeued uncharged and the job's result returned; None means
    the outcome is the judgement's own (and a blocked host that got this far is unblocked).
    """
    window, record, settings = attempt.window, attempt.record, attempt.settings
    credential = attempt.credential
    if (
        outcome.kind == "host"
        and not result.timed_out
        and credential.file is not None
        and is_credential_refused(outcome.text, outcome.api_error_status)
    ):
        reason = outcome.text or "the credential was refused"
        block_credential(window, record, credential.name, reason, claim=attempt.claim)
        attempt.hooks.not_spawned(attempt.runtime, record, f"credential {credential.name} refused")
        return "credential blocked"
    if outcome.kind == "host" and not result.timed_out:
        block_host(
            window,
            record,
            outcome.text or "session failed on this host",
            host_fingerprint(settings, attempt.environ),
            claim=attempt.claim,
        )
        attempt.hooks.not_spawned(attempt.runtime, record, outcome.text)
        return "host blocked"
    if window.store.blocked_reason(settings.host):
        unblock_host(window, settings.host)  # the probe got past the host-wide failure
    resume = attempt.resume
    if outcome.resume_missing and resume:
        why = f"no transcript of session {resume} on this host; starting a fresh session"
        requeue_front(window, record, why, resume_session="", claim=attempt.claim)
        attempt.hooks.not_spawned(attempt.runtime, record, why)
        return "fresh session"
    return None


def ended_by_shutdown(result: LaunchResult) -> bool:
    """Did a shutdown signal (SIGTERM, SIGINT, SIGHUP) end the session, not the launcher?

    A unit stop signals the worker, the session's process group, or both (systemd's
    `KillMode=control-group`); the supervisor forwards them and exits 128+N. The launcher's
    own SIGTERM (a timeout, a cancel) is not a shutdown.
    """
    if result.timed_out or result.cancelled or result.returncode is None:
        return False
    return -result.returncode in _SHUTDOWN_CODES or result.returncode in _SHUTDOWN_EXITS


def _account(
    window: Window,
    record: Record,
    kind: Kind,
    outcome: SessionOutcome,
    timed_out: bool,
    open_window: Callable[[str], None],
    started: float | None = None,
    *,
    claim: str | None = None,
    credential: str = DEFAULT_CREDENTIAL,
    moved: str | None = None,
) -> str:
    store = window.records
    sid = outcome.session_id
    meta: dict[str, Any] = {"session_id": sid, "turns": outcome.num_turns, "cost_usd": outcome.total_cost_usd}
    if outcome.kind == "limit":
        assert outcome.limit is not None
        reason = window.report_limit(
            limit_signals(kind_model(kind), outcome), session=sid, asked_at=started, credential=credential
        )
        if outcome.refused_at_spawn:
            window.store.count_refused()
            requeue_front(
                window, record, reason, status="waiting", trail_why="refused at spawn (no cost)", claim=claim
            )
            return "refused at spawn"
        # Cut off mid-run: resume the same session later, from the same cwd.
        fields = {"resume_session": sid} if sid else {}
        why = "; ".join(filter(None, [moved, "cut off mid-run by the usage limit; will resume"]))
        requeue_front(window, record, reason, status="waiting", trail_why=why, claim=claim, **fields)
        return "cut off"
    if timed_out:
        why = f"session timed out after {window.settings.session_timeout}s"
        return retry_or_fail(window, record, why, meta, claim=claim)
    if outcome.kind == "transient":
        attempts = store.incr_attempts(record.id)
        if attempts >= MAX_TRANSIENT:
            return fail(
                window, record, f"throttled {attempts} times: {outcome.text[:300]}", meta, claim=claim
            )
        # Back off without holding a worker or a slot: admission skips it until then.
        not_before = time.time() + min(5.0 * 2 ** (attempts - 1), 120.0)
        when = time.strftime("%H:%M:%S", time.gmtime(not_before))
        why = f"transient throttle, retrying after {when} UTC: {outcome.text[:200]}"
        requeue_front(window, record, why, status="waiting", not_before=repr(not_before), claim=claim)
        return "throttled"
    if outcome.kind == "error":
        return retry_or_fail(window, record, f"session failed: {outcome.text[:500]}", meta, claim=claim)
    open_window("the probe session completed normally")
    ok, value = parse_answer(kind, outcome.text)
    if not ok:
        return retry_or_fail(window, record, str(value), meta, claim=claim)
    answer(window, record, value, meta, claim, note=moved)
    return "answered"


# --- outcomes that could not be written: the spool ------------------------------------------
def _settle_unwritten(attempt: _Attempt, result: LaunchResult, started: float, why: str) -> str:
    """The run cannot be written (Redis away) or may not be (its holder fenced itself).

    Its answer or usage limit is spooled, for the worker to replay once Redis is back;
    anything else is dropped: the judgement, still `running` under this claim, is taken over
    uncharged once its lease lapses. Nothing is charged and no hook is told here: the replay
    that applies a spooled outcome under this claim runs the kind's after-session hooks, once
    (`tiers.after`); one never applied leaves a fixing session's dispatch marker, so its next
    dispatch verifies first.
    """
    settings = attempt.settings
    outcome = outcome_of(
        settings, result.stdout, result.returncode, result.stderr, datetime.now(UTC), backend=attempt.backend
    )
    body: dict[str, Any] = {
        "model": kind_model(attempt.kind),
        "session_id": outcome.session_id,
        "credential": attempt.credential.name,
    }
    body["backend"] = attempt.backend.name  # a replay reads the output with the same CLI's readers
    spooled: SpoolKind | None = None
    if outcome.kind == "limit":
        spooled = "limit"
    elif outcome.kind == "answer":
        ok, value = parse_answer(attempt.kind, outcome.text)
        meta = {
            "session_id": outcome.session_id,
            "turns": outcome.num_turns,
            "cost_usd": outcome.total_cost_usd,
        }
        body.update(value=value, meta=meta)
        spooled = "answer" if ok else None
    if spooled is not None and attempt.holding.spool(spooled, result, started, **body):
        return f"{LOST_CONTACT}: {spooled} spooled"
    log.warning(
        "session %s ended unwritten (%s): %s; asked again once its lease lapses",
        attempt.record.id,
        why,
        outcome.kind,
    )
    return LOST_CONTACT
