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

Only then is an RQ job made for it and handed to RQ to execute, so execution, timeouts,
heartbeats and abandoned-job handling stay RQ's. A worker killed mid-session takes its
session with it (parent-death signal) and the judgement goes back to the front of the
line; a session refused at spawn goes back to the front too, and costs no retry.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rq import Callback, Queue
from rq.job import Job

from dispatchq import keys
from dispatchq.core.judgement import TrailEntry
from dispatchq.launcher.environment import read_secret, session_environment
from dispatchq.launcher.spawn import build_argv, launch, render_prompt
from dispatchq.queue.worker import DispatchqWorker
from dispatchq.tiers.hooks import NO_HOOKS, Requeue, Settled
from dispatchq.window import marker
from dispatchq.window.limits import GENERAL_SCOPE, SessionOutcome, read_outcome, window_state

if TYPE_CHECKING:
    from dispatchq.config import Kind
    from dispatchq.core.judgement import Record
    from dispatchq.runtime import Runtime

log = logging.getLogger("dispatchq.session")

LOOKAHEAD = 64  # line entries examined per admission (kinds paused by a model scope are skipped)
SLOT_LEASE = 30.0
MAX_TRANSIENT = 5
MAX_ERRORS = 2
BLOCKED_RECHECK = 30.0


@dataclass
class Admission:
    jid: str
    slot: str
    probes: list[str] = field(default_factory=list)


@dataclass
class Wait:
    why: str
    until: float | None = None  # wake at this instant (a lift), else on a wake message or a poll


def lines_for(runtime: Runtime) -> list[str]:
    return [keys.session_line(runtime.settings.host), keys.session_line()]


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _candidates(runtime: Runtime) -> list[tuple[float, str, str]]:
    """The heads of this host's lines, merged: (score, member, line), best first."""
    out = []
    for line in lines_for(runtime):
        for member, score in runtime.redis.zrange(line, 0, LOOKAHEAD - 1, withscores=True):
            out.append((float(score), _s(member), line))
    out.sort()
    return out


def _model_of(runtime: Runtime, kind_name: str) -> str | None:
    kind = runtime.config.kinds.get(kind_name)
    return kind.session.model if kind and kind.session else None


def admit(runtime: Runtime, holder: str) -> Admission | Wait:
    """Decide whether one more session may start here and now, and which one."""
    redis = runtime.redis
    blocked = redis.hget(keys.SESSION_BLOCKED, runtime.settings.host)
    if blocked:
        return Wait(_s(blocked))
    candidates = _candidates(runtime)
    if not candidates:
        return Wait("no session judgements waiting")
    markers = marker.all_markers(runtime)
    slot = f"{holder}:{uuid.uuid4().hex[:8]}"
    if not marker.acquire_slot(runtime, slot, SLOT_LEASE):
        return Wait(f"all {runtime.settings.session_concurrency} session slot(s) busy")
    now = time.time()
    earliest: float | None = None
    why = "waiting for the probe session to show the window open"
    kinds: dict[str, str] = {}
    statuses: dict[str, str] = {}
    ids = [member.split(":", 1)[1] for _, member, _ in candidates]
    not_before: dict[str, float] = {}
    pipe = redis.pipeline(transaction=False)
    for jid in ids:
        pipe.hmget(keys.record(jid), "in", "status", "not_before")
    for jid, (raw, status, later) in zip(ids, pipe.execute(), strict=True):
        kinds[jid] = json.loads(raw)["kind"] if raw else ""
        statuses[jid] = _s(status) if status else ""
        not_before[jid] = float(later) if later else 0.0
    for (_, member, line), jid in zip(candidates, ids, strict=True):
        if not_before[jid] > now:  # backing off after a transient throttle
            earliest = not_before[jid] if earliest is None else min(earliest, not_before[jid])
            why = "backing off after a transient throttle"
            continue
        model = _model_of(runtime, kinds[jid])
        closed = marker.blocking(markers, model, now)
        if closed:
            lift = max(m.lifts_at for m in closed)
            earliest = lift if earliest is None else min(earliest, lift)
            why = closed[0].message or f"usage window closed ({closed[0].kind})"
            if statuses[jid] == "queued":
                _hold(runtime, jid, closed)
            continue
        probes = []
        lost = False
        for m in marker.probing(markers, model, now):
            if marker.try_probe(runtime, m.scope, slot):
                probes.append(m.scope)
            else:
                lost = True
                break
        if lost:
            for scope in probes:
                marker.end_probe(runtime, scope, slot)
            continue
        if runtime.store.claim_from_line(line, member, jid):
            return Admission(jid, slot, probes)
        for scope in probes:
            marker.end_probe(runtime, scope, slot)
    marker.release_slot(runtime, slot)
    return Wait(why, earliest)


def _hold(runtime: Runtime, jid: str, closed: list[marker.Marker]) -> None:
    """Show why a judgement that joined the line while the window was closed is held back."""
    reason = marker.waiting_reason(max(closed, key=lambda m: m.lifts_at))
    runtime.store.transition(jid, "waiting", expect=["queued"], fields={"reason": reason})


def _hold_paused(runtime: Runtime) -> None:
    """Every queued session judgement a closed marker holds back shows `waiting`, with why."""
    markers = [m for m in marker.all_markers(runtime) if m.closed()]
    if not markers:
        return
    for record in _held(runtime):
        if record.status == "queued":
            closed = marker.blocking(markers, _model_of(runtime, record.kind))
            if closed:
                _hold(runtime, record.id, closed)


class SessionWorker(DispatchqWorker):
    """An RQ worker whose dequeue is dispatchq's admission loop (see the module docstring)."""

    runtime: Runtime

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        burst = timeout is None
        runtime = self.runtime
        queue = Queue(keys.queue_name("session"), connection=self.connection)
        pubsub = None
        last_recheck = 0.0
        try:
            while True:
                self.heartbeat()
                if self.should_run_maintenance_tasks:
                    self.run_maintenance_tasks()
                if self._stop_requested:
                    return None
                if not burst and time.monotonic() - last_recheck > BLOCKED_RECHECK:
                    last_recheck = time.monotonic()
                    recheck_blocked(runtime)
                decision = admit(runtime, self.name)
                if isinstance(decision, Admission):
                    return self._job_for(decision, queue), queue
                if burst:
                    return None
                if pubsub is None:
                    pubsub = self.connection.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(keys.WAKE_CHANNEL)
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
        runtime.store.set_fields(admission.jid, job=f"session:{admission.slot}")
        job = queue.create_job(
            "jobs.tiers.session",
            args=(admission.jid, admission.slot),
            kwargs={"probes": admission.probes},
            timeout=runtime.dispatcher.job_timeout("session"),
            result_ttl=0,
            failure_ttl=runtime.settings.result_ttl,
            on_failure=Callback("jobs.tiers.on_job_failure"),
            description=f"dispatchq session {admission.jid}",
        )
        job.origin = queue.name
        job.save()
        return job


def recheck_blocked(runtime: Runtime) -> None:
    """A missing session executable may have been installed since: look again."""
    host = runtime.settings.host
    if not runtime.redis.hget(keys.SESSION_BLOCKED, host):
        return
    argv = build_argv(runtime.settings.session_command)
    if shutil.which(argv[0], path=os.environ.get("PATH")):
        runtime.redis.hdel(keys.SESSION_BLOCKED, host)
        for record in _held(runtime):
            if record.status == "waiting" and not (record.reason or "").startswith("usage window"):
                runtime.store.transition(record.id, "queued", expect=["waiting"], delete=["reason"])


def _held(runtime: Runtime) -> list[Record]:
    ids: list[str] = []
    for line in lines_for(runtime):
        ids += runtime.store.line_ids(line)
    return [r for r in runtime.store.get_many(ids) if r is not None]


def burst(runtime: Runtime) -> bool:
    """Run sessions in this process until none can start now; True if any finished."""
    if not any(runtime.redis.zcard(line) for line in lines_for(runtime)):
        return False
    recheck_blocked(runtime)
    from dispatchq.queue.worker import make_worker

    before = runtime.store.answered_counts()["session"] + runtime.store.count("failed")
    worker = make_worker(runtime, "session")
    worker.work(burst=True, logging_level="WARNING", with_scheduler=False)
    _hold_paused(runtime)  # beyond the admission lookahead too: `run` names why each one waits
    after = runtime.store.answered_counts()["session"] + runtime.store.count("failed")
    return after != before


# --- running one admitted session -----------------------------------------------------
def _requeue_front(
    runtime: Runtime,
    record: Record,
    why: str,
    *,
    status: str = "queued",
    trail_why: str | None = None,
    **fields: Any,
) -> None:
    """Back to the front of its line, in order, with nothing charged."""
    store = runtime.store
    pipe = runtime.redis.pipeline(transaction=True)
    pipe.multi()
    values = {"reason": why} if status == "waiting" else {}
    values.update(fields)
    store.transition(
        record.id,
        status,
        expect=["running"],
        trail=TrailEntry(tier="session", outcome="requeued", why=trail_why or why),
        fields=values,
        pipe=pipe,
    )
    store.add_to_line(record.id, keys.session_line(record.host), record.priority, front=True, pipe=pipe)
    pipe.publish(keys.WAKE_CHANNEL, "work")
    pipe.execute()


def _parse_answer(kind: Kind, text: str) -> tuple[bool, Any]:
    assert kind.session is not None
    if kind.session.format != "json":
        return True, text
    body = text.strip()
    fenced = re.match(r"^```(?:json)?\s*\n(.*)\n```$", body, re.DOTALL)
    if fenced:
        body = fenced.group(1)
    try:
        return True, json.loads(body)
    except json.JSONDecodeError as error:
        return False, f"session answer is not JSON ({error.msg} at line {error.lineno})"


def _session_dir(runtime: Runtime, jid: str) -> Path:
    """A stable, empty working directory per judgement, so `--resume` finds its session."""
    path = runtime.settings.data_dir.expanduser() / "sessions" / jid
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_claimed(runtime: Runtime, jid: str, slot: str, probes: list[str] | None = None) -> str:
    """The RQ job: spawn one admitted session and account for what it did."""
    probes = list(probes or [])
    store = runtime.store
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(SLOT_LEASE / 3):
            marker.acquire_slot(runtime, slot, SLOT_LEASE)
            for scope in probes:
                runtime.redis.expire(keys.probe(scope), runtime.settings.probe_grace * 2 + 30)

    renewer = threading.Thread(target=renew, name=f"slot-{slot}", daemon=True)
    renewer.start()
    try:
        record = store.get(jid)
        if record is None or record.status != "running":
            return "not running any more"
        return _run(runtime, record, probes)
    finally:
        stop.set()
        renewer.join(timeout=5)
        marker.release_slot(runtime, slot)
        for scope in probes:
            marker.end_probe(runtime, scope, slot)
        runtime.redis.hdel(keys.SESSION_RUNNING, jid)


def _run(runtime: Runtime, record: Record, probes: list[str]) -> str:
    settings = runtime.settings
    store = runtime.store
    kind = runtime.config.kinds.get(record.kind)
    if kind is None or kind.session is None:
        store.transition(
            record.id,
            "failed",
            expect=["running"],
            fields={"tier": "session", "reason": "kind has no session"},
        )
        return "failed"
    model = kind.session.model
    closed = marker.blocking(marker.all_markers(runtime), model)
    if closed:
        # The window closed between admission and now: not one spawn while it is closed.
        _requeue_front(runtime, record, closed[0].message or "usage window closed", status="waiting")
        return "paused"
    hooks = kind.session.hooks or NO_HOOKS
    verdict = hooks.before_spawn(runtime, record)
    if isinstance(verdict, Requeue):
        _requeue_front(runtime, record, verdict.why)
        return verdict.result
    if isinstance(verdict, Settled):
        return verdict.result
    resume = getattr(record, "resume_session", None) or None
    argv = build_argv(settings.session_command, extra_args=kind.session.args, resume=resume)
    credential = read_secret(settings.session_credential_var, os.environ)
    env = session_environment(
        os.environ,
        deny=settings.session_deny_env,
        credential_var=settings.session_credential_var,
        credential_value=credential,
    )
    checkout = record.context.get("checkout") if isinstance(record.context, dict) else None
    cwd = Path(checkout) if checkout else _session_dir(runtime, record.id)
    # A built-in kind may build its own prompt (the decision gate frames untrusted fields its
    # own way and keeps its own lines outside the frame); every other kind is rendered here.
    prompt = hooks.render_prompt(runtime, record)
    if prompt is None:
        prompt = render_prompt(
            kind.session.prompt,
            {"target": record.target, "item": record.item, "state": record.state, "context": record.context},
        )
    opened = threading.Event()

    def open_window(why: str) -> None:
        if probes and not opened.is_set():
            opened.set()
            for scope in probes:
                marker.window_open(runtime, scope, why=why)

    limited = threading.Event()

    def on_event(event: dict[str, Any]) -> None:
        sid = event.get("session_id")
        if isinstance(sid, str) and sid and event.get("type") == "system":
            store.set_fields(record.id, session_id=sid)
            runtime.redis.hset(
                keys.SESSION_RUNNING,
                record.id,
                json.dumps(
                    {"host": settings.host, "session_id": sid, "started": time.time(), "probe": probes}
                ),
            )
        state = window_state(event)
        if state == "closed":
            limited.set()
        elif state == "open" and not limited.is_set():
            open_window("the probe session's stream shows the window open")

    grace = None
    if probes:
        grace = threading.Timer(
            settings.probe_grace,
            lambda: (
                None
                if limited.is_set()
                else open_window(f"probe ran {settings.probe_grace}s without a limit")
            ),
        )
        grace.daemon = True
        grace.start()
    runtime.redis.hset(
        keys.SESSION_RUNNING,
        record.id,
        json.dumps({"host": settings.host, "session_id": resume, "started": time.time(), "probe": probes}),
    )
    try:
        result = launch(argv, prompt, cwd=cwd, env=env, timeout=settings.session_timeout, on_event=on_event)
    finally:
        if grace is not None:
            grace.cancel()
    if result.missing_executable:
        reason = f"{result.missing_executable}"
        runtime.redis.hset(keys.SESSION_BLOCKED, settings.host, reason)
        _requeue_front(runtime, record, reason, status="waiting")
        for other in _held(runtime):
            if other.status == "queued":
                store.transition(other.id, "waiting", expect=["queued"], fields={"reason": reason})
        hooks.not_spawned(runtime, record, reason)  # undo what before_spawn prepared
        return "missing executable"
    runtime.redis.incr(keys.STATS_SESSIONS_SPAWNED)
    outcome = read_outcome(
        result.stdout,
        now=datetime.now(UTC),
        default_tz=settings.timezone,
        unknown_reset=settings.unknown_reset_probe,
        returncode=result.returncode,
        stderr=result.stderr,
    )
    accounted = _account(runtime, record, kind, outcome, result.timed_out, open_window)
    hooks.after_session(runtime, record, outcome, result)
    return accounted


def _account(
    runtime: Runtime,
    record: Record,
    kind: Kind,
    outcome: SessionOutcome,
    timed_out: bool,
    open_window: Any,
) -> str:
    store = runtime.store
    sid = outcome.session_id
    meta = {"session_id": sid, "turns": outcome.num_turns, "cost_usd": outcome.total_cost_usd}
    if outcome.kind == "limit":
        assert outcome.limit is not None
        signals = outcome.limits or (outcome.limit,)
        raised = [marker.raise_marker(runtime, signal, session=sid) for signal in signals]
        reason = marker.waiting_reason(max(raised, key=lambda m: m.lifts_at))
        if outcome.refused_at_spawn:
            runtime.redis.incr(keys.STATS_SESSIONS_REFUSED)
            _requeue_front(runtime, record, reason, status="waiting", trail_why="refused at spawn (no cost)")
            return "refused at spawn"
        # Cut off mid-run: resume the same session later, from the same cwd.
        fields = {"resume_session": sid} if sid else {}
        why = "cut off mid-run by the usage limit; will resume"
        _requeue_front(runtime, record, reason, status="waiting", trail_why=why, **fields)
        return "cut off"
    if timed_out:
        return _retry_or_fail(
            runtime, record, f"session timed out after {runtime.settings.session_timeout}s", meta
        )
    if outcome.kind == "transient":
        attempts = store.incr_attempts(record.id)
        if attempts >= MAX_TRANSIENT:
            return _fail(runtime, record, f"throttled {attempts} times: {outcome.text[:300]}", meta)
        # Back off without holding a worker or a slot: admission skips it until then.
        not_before = time.time() + min(5.0 * 2 ** (attempts - 1), 120.0)
        when = time.strftime("%H:%M:%S", time.gmtime(not_before))
        why = f"transient throttle, retrying after {when} UTC: {outcome.text[:200]}"
        _requeue_front(runtime, record, why, status="waiting", not_before=repr(not_before))
        return "throttled"
    if outcome.kind == "error":
        return _retry_or_fail(runtime, record, f"session failed: {outcome.text[:500]}", meta)
    open_window("the probe session completed normally")
    ok, value = _parse_answer(kind, outcome.text)
    if not ok:
        return _retry_or_fail(runtime, record, str(value), meta)
    pipe = runtime.redis.pipeline(transaction=True)
    pipe.multi()
    store.transition(
        record.id,
        "answered",
        expect=["running"],
        trail=TrailEntry(tier="session", outcome="answered", why=f"session {sid or '?'}", **meta),
        fields={
            "tier": "session",
            "value": value,
            "reason": f"answered by session {sid or '?'}",
            "raw": meta,
        },
        delete=["resume_session"],
        pipe=pipe,
    )
    pipe.execute()
    _cleanup_dir(runtime, record)
    return "answered"


def _retry_or_fail(runtime: Runtime, record: Record, why: str, meta: dict[str, Any]) -> str:
    """A session that only answers a question is simply asked again, a bounded number of times."""
    attempts = runtime.store.incr_attempts(record.id)
    if attempts >= MAX_ERRORS:
        return _fail(runtime, record, why, meta)
    _requeue_front(runtime, record, f"{why}; asking again")
    return "retrying"


def _fail(runtime: Runtime, record: Record, why: str, meta: dict[str, Any]) -> str:
    runtime.store.transition(
        record.id,
        "failed",
        expect=["running"],
        trail=TrailEntry(tier="session", outcome="failed", why=why, **meta),
        fields={"tier": "session", "reason": why},
    )
    _cleanup_dir(runtime, record)
    return "failed"


def _cleanup_dir(runtime: Runtime, record: Record) -> None:
    if not record.context.get("checkout"):
        shutil.rmtree(runtime.settings.data_dir.expanduser() / "sessions" / record.id, ignore_errors=True)


def session_job_lost(runtime: Runtime, job: Job, exc: Any) -> None:
    """RQ gave up on a session job (its worker died): ask the question again, from the front."""
    if not job.args:
        return
    record = runtime.store.get(str(job.args[0]))
    if record is None or record.status != "running":
        return
    runtime.redis.hdel(keys.SESSION_RUNNING, record.id)
    if len(job.args) > 1:
        marker.release_slot(runtime, str(job.args[1]))
    for scope in (job.kwargs or {}).get("probes", []):
        marker.end_probe(runtime, scope, str(job.args[1]))
    why = "its session worker died"
    resume = getattr(record, "session_id", None)
    fields = {"resume_session": resume} if resume else {}
    _requeue_front(runtime, record, why, **fields)


__all__ = ["GENERAL_SCOPE", "SessionWorker", "admit", "burst", "run_claimed", "session_job_lost"]
