"""The decision gate: findings through analysis, a person's sweep, fixing sessions, grading.

The stages of `shared/seeds/decision-gate.txt`, with dispatchq as the orchestrator:

0. **Location pre-check** (code): a usable Location passes; a person supplies the others at
   the terminal, in batches of at most 4, validated by the same rule (one re-ask), written
   into the report at once in the extended form.
1. **Analysis** (session tier, read-only `findings-analyst`): one analyst per finding, in
   announced batches of at most 8. The block travels framed with a fresh nonce; a return
   that breaks the contract degrades, visibly, to a restatement of the Remediation by the
   read-only `findings-restater`, which a person confirms.
2. **The sweep** (a person at a terminal, and nobody else): `[A] [B] [skip] [reject]` plus
   `other…`, the reject evidence gate, approvals of out-of-boundary checks in the same turn,
   and each decision written as made, with its plan (after the plan-rejection test) and its
   pin. With no interactive terminal the stage aborts before anything is spent.
3. **Dispatch** (session tier, `findings-fixer`, which may edit): one judgement per attempt,
   bound to the host and checkout holding the report. Everything that must be true at the
   moment of the spawn runs *inside the job*, in the session tier's hooks: the repository
   lock (sequential per repository across workers), the job's own state (a dispatch with an
   unknown outcome is verified before anything else), tamper evidence, the pin comparison
   with the attribution rule, the before-observation, the dispatch copy, and the `Dispatch:`
   marker, written after the window check and rewritten back when the spawn is refused.
3.5/4. **Verification and grading** (code, right after the session, still inside the job):
   the persisted plan inside the execution boundary plus approved checks, the after-
   observation, the dispatch log, the four cases, retirement.

How sessions run: every session is a session-tier judgement. The `findings` commands
enqueue them and run the session tier in-process, in burst, until their judgements are
done (as `dispatchq run` does), so a gate works with or without the Procfile's workers: a
running `dispatchq worker session` may take the same judgements, and the command simply
waits for them. A closed usage window stops the waiting; the judgements stay in line and
a later run (or a worker, after the lift) picks them up.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from dispatchq import keys
from dispatchq.config import Kind, SessionSpec
from dispatchq.core.judgement import canonical_json, sha256_hex
from dispatchq.errors import Aborted, CheckError, ContractError, GitUnavailable, TamperError, UserError
from dispatchq.findings.boundary import (
    Approvals,
    Check,
    PlanResult,
    parse_plan,
    plan_rejection,
    run_check,
    run_plan,
)
from dispatchq.findings.contract import (
    ANALYST,
    ANALYST_BATCH,
    FIXER,
    LOCATION_BATCH,
    RESTATER,
    Alternative,
    Proposal,
    Summary,
    analyst_prompt,
    announce_analysis,
    batches,
    display,
    finding_state,
    fixer_prompt,
    foreign_tokens,
    indent,
    new_nonce,
    options_line,
    parse_analysis,
    parse_choice,
    parse_restatement,
    render_details,
    render_evidence,
    render_header,
    render_proposal,
    render_retired,
    render_source,
    restater_prompt,
    reviewer_text,
    supported,
    sweep_options,
    who_tag,
)
from dispatchq.findings.record import (
    UNPINNABLE,
    Grade,
    Observation,
    PinSpec,
    Record,
    RecordStore,
    block_hash,
    check_location,
    dispatch_copy,
    grade,
    hash_paths,
    repo_id,
    specs_for,
    stalled_resolutions,
)
from dispatchq.findings.report import PLAN, STATUS, Decision, Finding
from dispatchq.tiers.hooks import GO, Requeue, SessionHooks, Settled, SpawnVerdict

if TYPE_CHECKING:
    from dispatchq.core.judgement import Record as Judgement
    from dispatchq.runtime import Runtime
    from dispatchq.window.limits import SessionOutcome

LOCK_LEASE = 30  # seconds; a holder that dies frees the repository within this long
POLL = 0.25


# --- the built-in kinds ---------------------------------------------------------------------
_READ_ONLY_TOOLS = (
    "Read,Grep,Glob,Bash(git log:*),Bash(git show:*),Bash(git diff:*),Bash(git blame:*),Bash(git status:*)"
)
ANALYST_ARGS = ("--allowedTools", _READ_ONLY_TOOLS, "--disallowedTools", "Edit,Write,NotebookEdit")
FIXER_ARGS = ("--permission-mode", "acceptEdits", "--allowedTools", "Read,Grep,Glob,Edit,Write")
_FALLBACK_PROMPT = "dispatchq builds this prompt in code.\n{{ state }}"


class QuestionHooks(SessionHooks):
    """Hooks of the analyst and restater: only their prompt is dispatchq's own.

    Built at spawn time so the nonce is fresh for every invocation and never stored.
    """

    def render_prompt(self, runtime: Runtime, record: Judgement) -> str:
        state = record.state if isinstance(record.state, dict) else {}
        nonce = new_nonce()
        if record.kind == ANALYST:
            return analyst_prompt(state, nonce)
        return restater_prompt(state, nonce)


class FixerHooks(SessionHooks):
    """The fixer job's own steps around the spawn (see `FixerJob`)."""

    def before_spawn(self, runtime: Runtime, record: Judgement) -> SpawnVerdict:
        return FixerJob.load(runtime, record).before_spawn()

    def render_prompt(self, runtime: Runtime, record: Judgement) -> str:
        return FixerJob.load(runtime, record).prompt()

    def after_session(
        self, runtime: Runtime, record: Judgement, outcome: SessionOutcome, result: Any
    ) -> None:
        FixerJob.load(runtime, record).after_session(outcome, result)

    def not_spawned(self, runtime: Runtime, record: Judgement, reason: str) -> None:
        FixerJob.load(runtime, record).not_spawned(reason)


def _kind(name: str, prompt: str, args: Sequence[str], fmt: str, hooks: SessionHooks) -> Kind:
    digest = sha256_hex(canonical_json({"builtin": name, "args": list(args), "format": fmt}))
    return Kind(name=name, session=SessionSpec(prompt, tuple(args), fmt, None, hooks), digest=digest)


def builtin_kinds() -> dict[str, Kind]:
    """The three kinds the gate runs. Defined in code, not YAML: their prompts state the
    contract and their hooks carry the gate's guarantees, so a config cannot redefine them
    (a YAML kind of the same name is a config error)."""
    questions = QuestionHooks()
    return {
        ANALYST: _kind(ANALYST, _FALLBACK_PROMPT, ANALYST_ARGS, "json", questions),
        RESTATER: _kind(RESTATER, _FALLBACK_PROMPT, ANALYST_ARGS, "json", questions),
        FIXER: _kind(FIXER, _FALLBACK_PROMPT, FIXER_ARGS, "text", FixerHooks()),
    }


# --- the repository lock --------------------------------------------------------------------
_TAKE = """
local cur = redis.call('GET', KEYS[1])
if (not cur) or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_DROP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_KEEPERS: dict[str, threading.Event] = {}
_KEEPERS_LOCK = threading.Lock()


class RepoLock:
    """Fixer dispatch is sequential per repository, across every worker on every machine.

    Held by one judgement (re-entrant for it, so RQ re-running a job whose worker died takes
    it back at once) from the pin comparison to the last grading write. A short lease kept
    alive by a thread while the holder lives: a holder that dies frees the repository within
    LOCK_LEASE seconds, never the session timeout.
    """

    def __init__(self, runtime: Runtime, repo: str, jid: str) -> None:
        self.runtime = runtime
        self.key = keys.findings_lock(repo)
        self.holder = f"j:{jid}"
        self.jid = jid

    def acquire(self, *, wait: float) -> bool:
        take = self.runtime.redis.register_script(_TAKE)
        deadline = time.monotonic() + wait
        while True:
            if take(keys=[self.key], args=[self.holder, LOCK_LEASE]):
                self._keep()
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL)

    def _keep(self) -> None:
        with _KEEPERS_LOCK:
            if self.holder in _KEEPERS:
                return
            stop = threading.Event()
            _KEEPERS[self.holder] = stop
        renew = self.runtime.redis.register_script(_RENEW)
        limit = time.monotonic() + self.runtime.settings.session_timeout + 3600
        store = self.runtime.store

        def keep() -> None:
            while not stop.wait(LOCK_LEASE / 3) and time.monotonic() < limit:
                record = store.get(self.jid)
                # A job that died and was put back in line no longer holds the repository.
                if record is None or record.status in ("queued", "waiting", "failed", "cancelled"):
                    break
                if not renew(keys=[self.key], args=[self.holder, LOCK_LEASE]):
                    break
            with _KEEPERS_LOCK:
                if _KEEPERS.get(self.holder) is stop:
                    del _KEEPERS[self.holder]

        threading.Thread(target=keep, name=f"repo-lock-{self.jid}", daemon=True).start()

    def release(self) -> None:
        with _KEEPERS_LOCK:
            stop = _KEEPERS.pop(self.holder, None)
        if stop is not None:
            stop.set()
        self.runtime.redis.register_script(_DROP)(keys=[self.key], args=[self.holder])


# --- one fixer attempt ----------------------------------------------------------------------
def _iso_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _text(raw: Any) -> str:
    return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)


@dataclass
class AttemptState:
    """One attempt's own state in Redis: where a (re)started job reads where it stands."""

    runtime: Runtime
    key: str

    def load(self) -> dict[str, Any]:
        raw = self.runtime.redis.hgetall(self.key)
        return {_text(k): json.loads(_text(v)) for k, v in raw.items()}

    def save(self, **fields: Any) -> None:
        self.runtime.redis.hset(self.key, mapping={k: json.dumps(v) for k, v in fields.items()})
        self.runtime.redis.expire(self.key, 90 * 86_400)


def observed_paths(finding: Finding, report_findings: Iterable[Finding], root: Path) -> list[str]:
    """Every live pin's paths in the report (so the dispatch log explains other findings'
    pins too), plus this finding's re-derived expected set when it is unpinned."""
    paths: list[str] = []
    for other in report_findings:
        pin = other.pin()
        if pin is not None:
            paths.extend(e.path for e in pin.entries if e.value != UNPINNABLE)
    if finding.pin() is None and finding.decision() is not None:
        paths.extend(s.path for s in specs_for(finding, root) if s.rejected is None)
    return list(dict.fromkeys(paths))


def grading_entries(finding: Finding, root: Path) -> list[Any]:
    pin = finding.pin()
    if pin is not None:
        return list(pin.entries)
    return list(specs_for(finding, root))


def unpinnable_of(finding: Finding, root: Path) -> list[tuple[str, str]]:
    entries = grading_entries(finding, root)
    out = []
    for e in entries:
        if isinstance(e, PinSpec) and e.rejected is not None:
            out.append((e.path, e.rejected))
        elif getattr(e, "value", None) == UNPINNABLE:
            out.append((e.path, "refused by the allow-list"))
    return out


def decision_key(finding: Finding) -> str:
    """Which decision an attempt belongs to. A fresh decision (after a retirement or a
    supersession) numbers its attempts from 1 again, so its state must never be confused
    with an earlier decision's attempt of the same number."""
    decision = finding.decision()
    if decision is None:
        raise UserError(f"{finding.id}: no live decision")
    identity = [
        len(finding.all("Decision-retired")),
        decision.label,
        decision.resolution,
        decision.who,
        decision.date.isoformat(),
    ]
    return sha256_hex(canonical_json(identity))[:16]


def attempt_key(repo: str, ref: str, decision: str, attempt: int) -> str:
    return keys.findings_attempt(repo, f"{ref}@{decision}", attempt)


class FixerJob:
    """A fixer judgement's steps. Every start reads the job's own state first.

    `state` of the judgement: report, root, finding, attempt, block, decision (which decision the
    attempt belongs to), status_at_start.
    """

    def __init__(self, runtime: Runtime, judgement: Judgement) -> None:
        self.runtime = runtime
        self.judgement = judgement
        state = judgement.state if isinstance(judgement.state, dict) else {}
        try:
            self.report = Path(str(state["report"]))
            self.root = Path(str(state["root"]))
            self.fid = str(state["finding"])
            self.attempt = int(state["attempt"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{judgement.id}: not a decision-gate fixer judgement") from None
        self.status_at_start = state.get("status_at_start")
        self.record = Record(self.report, self.root, RecordStore(runtime.redis, self.root))
        self.repo = repo_id(self.root)
        self.ref = self.record.ref(self.fid)
        self.state = AttemptState(
            runtime, attempt_key(self.repo, self.ref, str(state.get("decision", "")), self.attempt)
        )
        self.lock = RepoLock(runtime, self.repo, judgement.id)
        self.today = dt.date.today()

    @classmethod
    def load(cls, runtime: Runtime, judgement: Judgement) -> FixerJob:
        return cls(runtime, judgement)

    # --- the job's log -----------------------------------------------------------------------
    def log(self, text: str) -> Path:
        folder = self.runtime.settings.data_dir.expanduser() / "findings" / self.repo
        folder.mkdir(parents=True, exist_ok=True)
        safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in self.fid)
        path = folder / f"{safe}.log"
        with path.open("a", encoding="utf-8") as handle:
            handle.write(f"[{_iso_now()}] {self.ref} attempt {self.attempt}\n{text.rstrip()}\n\n")
        return path

    # --- finishing ---------------------------------------------------------------------------
    def finish(self, outcome: dict[str, Any], *, transition: bool) -> str:
        """Record the attempt's outcome; when the job ends without a spawn, answer it too."""
        outcome.setdefault("finding", self.fid)
        outcome.setdefault("attempt", self.attempt)
        self.state.save(outcome=outcome, phase="done")
        store = self.runtime.store
        if transition:
            from dispatchq.core.judgement import TrailEntry

            store.transition(
                self.judgement.id,
                "answered",
                expect=["running"],
                trail=TrailEntry(tier="session", outcome="answered", why=f"no spawn: {outcome['outcome']}"),
                fields={"tier": "session", "value": outcome, "reason": f"gate: {outcome['outcome']}"},
                delete=["resume_session"],
            )
        else:
            record = store.get(self.judgement.id)
            if record is not None and record.status in ("answered", "failed"):
                store.set_fields(self.judgement.id, value=outcome)
        return str(outcome["outcome"])

    # --- before the spawn --------------------------------------------------------------------
    def before_spawn(self) -> SpawnVerdict:
        wait = self.runtime.settings.session_timeout + 600
        if not self.lock.acquire(wait=wait):
            return Requeue("another fixer holds this repository", "repository busy")
        try:
            verdict = self._start()
        except Exception as error:
            self.lock.release()
            self.finish({"outcome": "error", "why": f"{type(error).__name__}: {error}"}, transition=True)
            return Settled("error")
        if verdict is not None:
            self.lock.release()
            return Settled(verdict)
        return GO

    def _start(self) -> str | None:
        try:
            finding = self.record.read().finding(self.fid)
        except UserError as error:
            return self.finish({"outcome": "gone", "why": str(error)}, transition=True)
        if finding.terminal:
            return self.finish({"outcome": "final", "why": finding.value(STATUS)}, transition=True)
        decision = finding.decision()
        if decision is None:
            return self.finish({"outcome": "no-live-decision"}, transition=True)
        recorded = len(decision.attempts)
        if recorded >= self.attempt:
            # Attempt N already has its entry: a repeat of a graded job grades nothing twice.
            return self.finish({"outcome": "already-graded"}, transition=True)
        if recorded + 1 < self.attempt:
            return self.finish(
                {"outcome": "stale", "why": f"the decision records {recorded}"}, transition=True
            )
        own = self.state.load()
        marker = finding.dispatch_marker()
        if marker is not None and marker.attempt == self.attempt:
            resume = getattr(self.judgement, "resume_session", None)
            if own.get("phase") == "resumable" and own.get("resume") and own.get("resume") == resume:
                self.state.save(phase="resuming")
                self.log(f"resuming session {resume} (cut off mid-run by the usage limit)")
                return None
            # Dispatched, outcome unknown: never dispatched again blind.
            return self._verify_first(finding, own)
        return self._prepare(finding)

    def _verify_first(self, finding: Finding, own: dict[str, Any]) -> str:
        self.log("dispatch marker with no outcome: verifying before anything else")
        before = Observation.from_json(own["before"]) if isinstance(own.get("before"), dict) else None
        paths = list(own.get("paths") or [])
        after = self.record.observe(paths, carry=before) if before is not None else None
        if before is not None and after is not None:
            self._log_dispatch(before, after)
        plan = self._verify(finding)
        if plan is not None and plan.passed:
            result = self._grade(finding, before, after, plan, errored=False)
            return self._write_grade(finding, result, extra={"verified_first": True}, transition=True)
        retired = self.record.record_interrupted(self.fid, self.attempt)
        outcome = {"outcome": "interrupted", "retired": retired, "verified_first": True}
        return self.finish(outcome, transition=True)

    def _prepare(self, finding: Finding) -> str | None:
        changes = self.record.changes(finding)
        if changes:
            self.record.supersede(self.fid)
            return self.finish({"outcome": "set-aside", "why": "; ".join(changes)}, transition=True)
        comparison = self.record.check_pin(self.fid)
        unpinned = comparison is None
        if comparison is not None and comparison.verdict == "attributable":
            self.record.repin(self.fid)
            self.log(f"pin re-taken: {', '.join(comparison.changed)} changed by logged dispatches")
        elif comparison is not None and comparison.verdict == "unattributable":
            self.record.supersede(self.fid)
            why = "changed since the decision: " + ", ".join(comparison.unexplained)
            return self.finish({"outcome": "set-aside", "why": why}, transition=True)
        report = self.record.read()
        finding = report.finding(self.fid)
        decision = finding.decision()
        assert decision is not None
        paths = observed_paths(finding, report.findings, self.root)
        before = self.record.observe(paths)
        copy = dispatch_copy(finding, status_at_run_start=self.status_at_start)
        self.state.save(
            phase="dispatching",
            before=before.to_json(),
            paths=paths,
            copy=copy,
            resolution=decision.resolution,
            unpinned=unpinned,
        )
        self.log("before-observation:\n" + json.dumps(before.to_json(), indent=1))
        previous = self.record.mark_dispatch(self.fid, self.attempt, self.today)
        self.state.save(phase="dispatched", previous=previous)
        return None

    def prompt(self) -> str:
        own = self.state.load()
        return fixer_prompt(str(own.get("copy", "")), str(own.get("resolution", "")), new_nonce())

    # --- after the session -------------------------------------------------------------------
    def after_session(self, outcome: SessionOutcome, result: Any) -> None:
        own = self.state.load()
        if own.get("phase") not in ("dispatched", "resuming"):
            self.lock.release()
            return
        try:
            self._after(own, outcome, result)
        except TamperError as error:
            self.record.supersede(self.fid)
            self.finish({"outcome": "set-aside", "why": str(error), "tampered": True}, transition=False)
        except Exception as error:
            self.log(f"grading failed: {type(error).__name__}: {error}")
            self.state.save(phase="unknown")
            raise
        finally:
            self.lock.release()

    def _after(self, own: dict[str, Any], outcome: SessionOutcome, result: Any) -> None:
        resuming = own.get("phase") == "resuming"
        if outcome.kind == "limit" and outcome.refused_at_spawn:
            # One turn, zero cost, nothing ran: not an attempt. It waits for the window.
            if resuming:
                self.state.save(phase="resumable")
            else:
                self.record.restore_dispatch(self.fid, own.get("previous"))
                self.state.save(phase="refused")
            self.log("refused at spawn by a closed window: not an attempt")
            return
        if outcome.kind == "limit":
            sid = outcome.session_id
            if sid:
                self.state.save(phase="resumable", resume=sid)
                self.log(f"cut off mid-run; session {sid} will be resumed when the window opens")
            else:
                self.state.save(phase="unknown")
                self.log("cut off mid-run with no session id: outcome unknown, verified first next time")
            return
        before = Observation.from_json(own["before"])
        paths = list(own.get("paths") or [])
        after = self.record.observe(paths, carry=before)
        if outcome.kind == "transient" and before.values == after.values:
            self.record.restore_dispatch(self.fid, own.get("previous"))
            self.state.save(phase="refused")
            self.log("throttled before doing anything: not an attempt")
            return
        self._log_dispatch(before, after)
        finding = self.record.read().finding(self.fid)
        plan = self._verify(finding)
        errored = outcome.kind != "answer" or bool(getattr(result, "timed_out", False))
        graded = self._grade(finding, before, after, plan, errored=errored)
        extra = {"fixer_said": (outcome.text or "")[:2000], "session": outcome.kind}
        self._write_grade(finding, graded, extra=extra, transition=False, unpinned=bool(own.get("unpinned")))

    def not_spawned(self, reason: str) -> None:
        own = self.state.load()
        try:
            if own.get("phase") == "dispatched":
                self.record.restore_dispatch(self.fid, own.get("previous"))
                self.state.save(phase="refused")
            elif own.get("phase") == "resuming":
                self.state.save(phase="resumable")
            self.log(f"not spawned ({reason}): not an attempt")
        finally:
            self.lock.release()

    # --- verification and grading ------------------------------------------------------------
    def _verify(self, finding: Finding) -> PlanResult | None:
        """Stage 3.5: the persisted plan, inside the boundary plus approved checks; raw output logged."""
        value = finding.value(PLAN)
        if value is None:
            self.log("verification: no plan")
            return None
        try:
            checks = parse_plan(value)
        except CheckError as error:
            self.log(f"verification: plan unreadable ({error})")
            return None
        approvals = Approvals(self.runtime.redis, self.repo, self.ref)
        plan = run_plan(checks, self.root, approved=approvals.predicate(checks))
        self.log("verification:\n" + "".join(r.log for r in plan.results))
        return plan

    def _grade(
        self, finding: Finding, before: Any, after: Any, plan: PlanResult | None, *, errored: bool
    ) -> Any:
        """The record's grading for this attempt (one call, whether verified first or after a session)."""
        return grade(
            entries=grading_entries(finding, self.root),
            before=before,
            after=after,
            plan=plan,
            errored=errored,
            attempt=self.attempt,
            today=self.today,
        )

    def _log_dispatch(self, before: Observation, after: Observation) -> None:
        store = self.record.store
        assert store is not None
        store.log_dispatch(self.ref, self.attempt, before, after, at=_iso_now())
        self.log("after-observation:\n" + json.dumps(after.to_json(), indent=1))

    def _write_grade(
        self,
        finding: Finding,
        result: Grade,
        *,
        extra: dict[str, Any],
        transition: bool,
        unpinned: bool | None = None,
    ) -> str:
        retired = self.record.apply_grade(self.fid, result)
        after = self.record.read().finding(self.fid)
        stalled = stalled_resolutions(after)
        outcome = {
            "outcome": "graded",
            "grade": result.to_json(),
            "retired": retired,
            "stalled": stalled,
            "unpinned": finding.pin() is None if unpinned is None else unpinned,
            "unpinnable": [list(x) for x in unpinnable_of(finding, self.root)],
            "log": str(self.log(f"graded: {json.dumps(result.to_json())}")),
            **extra,
        }
        return self.finish(outcome, transition=transition)


# --- the terminal ---------------------------------------------------------------------------
class Terminal:
    """Where a person answers. Answers are read only from an interactive terminal."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout

    @staticmethod
    def interactive(stdin: TextIO | None = None) -> bool:
        stream = stdin or sys.stdin
        try:
            return stream.isatty()
        except (AttributeError, ValueError):
            return False

    def say(self, *lines: str) -> None:
        for line in lines:
            self.stdout.write(line + "\n")
        self.stdout.flush()

    def ask(self, prompt: str) -> str:
        self.stdout.write(prompt)
        self.stdout.flush()
        try:
            line = self.stdin.readline()
        except KeyboardInterrupt:
            raise Aborted("interrupted") from None
        if line == "":
            raise Aborted("the terminal closed")
        return line.rstrip("\r\n")

    def yes(self, prompt: str) -> bool:
        while True:
            answer = self.ask(prompt).strip().lower()
            if answer in ("y", "yes"):
                return True
            if answer in ("n", "no"):
                return False
            self.say("answer y or n")


# --- waiting for judgements -----------------------------------------------------------------
def settle(
    runtime: Runtime, ids: Sequence[str], *, on_wait: Callable[[str], None] | None = None
) -> str | None:
    """Run sessions in this process until every judgement in `ids` has finished.

    Returns None when all finished, else why the rest wait (a closed window, a missing
    session command, or nobody finishing them). A judgement left running by a process that
    died is recovered the RQ way (its abandoned job is failed, and the session tier puts it
    back in line), so a re-run never waits on a dead process forever.
    """
    from rq.registry import StartedJobRegistry

    from dispatchq.queue.retrigger import window_for
    from dispatchq.queue.session_worker import burst
    from dispatchq.runtime import set_runtime
    from dispatchq.window import marker

    set_runtime(runtime)
    settings = runtime.settings
    idle_limit = settings.session_timeout + settings.heartbeat_interval + settings.heartbeat_grace + 120
    last = time.monotonic()
    told = False
    while True:
        records = runtime.store.get_many(list(ids))
        pending = [r for r in records if r is not None and not r.finished]
        if not pending:
            return None
        if burst(runtime):
            last = time.monotonic()
            continue
        closed = window_for(runtime).closed_for(None)
        if closed and all(r.status != "running" for r in pending):
            return marker.waiting_reason(max(closed, key=lambda m: m.lifts_at))
        blocked = runtime.redis.hget(keys.SESSION_BLOCKED, settings.host)
        if blocked:
            return f"sessions cannot start on this host: {_text(blocked)}"
        if time.monotonic() - last > idle_limit:
            return "nothing finished them in time (is another worker holding them?)"
        if any(r.status == "running" for r in pending):
            for queue in runtime.dispatcher.queues_for("session"):
                StartedJobRegistry(queue.name, connection=runtime.redis).cleanup()
        if not told and on_wait is not None:
            told = True
            on_wait("waiting for sessions to finish (a session slot is busy, or one is still running)")
        time.sleep(POLL)


def _user() -> str:
    """Who answers at this terminal (recorded on the Decision line as its provenance)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "user"


# --- the orchestrator -----------------------------------------------------------------------
@dataclass
class Analysis:
    """Stage 1's result for one finding: a proposal, or a visible reason there is none."""

    proposal: Proposal | None
    note: str | None = None


@dataclass
class Gate:
    """One findings report in one checkout, run by dispatchq as the orchestrator."""

    runtime: Runtime
    report: Path
    root: Path
    terminal: Terminal | None = None
    out: Callable[[str], None] = print
    summary: Summary = field(default_factory=Summary)

    def __post_init__(self) -> None:
        self.report = Path(os.path.realpath(self.report))
        self.root = Path(os.path.realpath(self.root))
        self.record = Record(self.report, self.root, RecordStore(self.runtime.redis, self.root))
        self.repo = repo_id(self.root)
        self.today = dt.date.today()
        self.who = who_tag(_user())
        parsed = self.record.read()
        if parsed.problems:
            where = "; ".join(f"line {p.line}: {p.message}" for p in parsed.problems)
            raise UserError(f"{self.report}: the report does not parse: {where}")
        self.status_at_start = {f.id: f.value(STATUS) for f in parsed.findings}
        from dispatchq.client import Client

        self.client = Client(runtime=self.runtime)

    # --- selection ---------------------------------------------------------------------------
    def undecided(self, only: Iterable[str] | None = None) -> list[Finding]:
        """needs-decision findings without a live decision or a terminal status."""
        wanted = set(only) if only is not None else None
        return [
            f
            for f in self.record.read().findings
            if f.needs_decision
            and not f.terminal
            and f.value("Decision") is None
            and (wanted is None or f.id in wanted)
        ]

    def decided(self, only: Iterable[str] | None = None) -> list[Finding]:
        wanted = set(only) if only is not None else None
        return [
            f
            for f in self.record.read().findings
            if f.value("Decision") is not None and not f.terminal and (wanted is None or f.id in wanted)
        ]

    # --- the whole gate ----------------------------------------------------------------------
    def run(self) -> Summary:
        if not self.decide():
            return self.summary
        aside = self.dispatch()
        if aside and self.terminal is not None:
            self.out(f"second pass: {len(aside)} finding(s) set aside are analysed and swept again")
            if self.decide(only=aside, second_pass=True):
                again = self.dispatch(only=aside)
                for fid in again:
                    self.summary.notes.append(f"{fid} set aside again: left for the next run")
        self.finish()
        return self.summary

    def finish(self) -> None:
        for finding in self.record.read().findings:
            both = stalled_resolutions(finding)
            if both:
                self.summary.add_unique("stalled", (finding.id, both))

    # --- stages 0-2 --------------------------------------------------------------------------
    def decide(self, only: Iterable[str] | None = None, *, second_pass: bool = False) -> bool:
        """Stages 0-2 over the findings that still lack a decision. False when aborted."""
        todo = self.undecided(only)
        if not todo:
            return True
        if self.terminal is None:
            self.summary.aborted = (
                "no interactive terminal: answers come only from a person at a terminal; "
                "nothing more was written"
            )
            self.summary.undecided = len(todo)
            return False
        replayed = len(self.decided())
        extra = (
            f"; {replayed} decided earlier are replayed, not asked again"
            if replayed and not second_pass
            else ""
        )
        self.out(f"{len(todo)} finding(s) need a decision{extra}")
        try:
            stalled = [f for f in todo if stalled_resolutions(f)]
            rest = [f for f in todo if not stalled_resolutions(f)]
            located = self.stage0(rest)
            analyses = self.stage1([f for f in rest if f.id in located], located)
            self.stage2([f for f in todo if f.id in analyses or f in stalled], analyses)
        except Aborted as why:
            self.summary.aborted = f"{why}: the sweep stopped; nothing more was written"
            self.summary.undecided = len(self.undecided(only))
            return False
        return True

    def stage0(self, findings: Sequence[Finding]) -> dict[str, str]:
        """Location pre-check: usable locations pass; a person supplies the others."""
        assert self.terminal is not None
        located: dict[str, str] = {}
        missing = []
        for finding in findings:
            check = check_location(self.root, finding.value("Location"))
            if check.usable and check.target:
                located[finding.id] = check.target
            else:
                missing.append((finding, check.why or "no location"))
        groups = batches(missing, LOCATION_BATCH)
        for number, group in enumerate(groups, 1):
            self.out(
                f"{len(missing)} finding(s) have no usable location; batch {number} of {len(groups)} "
                f"(at most {LOCATION_BATCH} questions):"
            )
            for finding, why in group:
                target = self.ask_location(finding, why)
                if target is None:
                    self.summary.failed.append(
                        (finding.id, "no usable location (declined); offered again next run")
                    )
                    continue
                try:
                    self.record.write_location(finding.id, target)
                except TamperError as error:
                    self.summary.tampered.append((finding.id, str(error)))
                    continue
                located[finding.id] = target
        return located

    def ask_location(self, finding: Finding, why: str) -> str | None:
        assert self.terminal is not None
        self.terminal.say(
            f"{finding.id} [{display(finding.severity)}] {display(finding.title)}: location-less ({why})"
        )
        for attempt in (1, 2):
            answer = self.terminal.ask(f"{finding.id} location path:line (empty to decline)> ").strip()
            if not answer:
                return None
            check = check_location(self.root, answer)
            if check.usable and check.target:
                return check.target
            if attempt == 1:
                self.terminal.say(
                    f"not usable ({check.why}): give path:line of an existing file inside the repository"
                )
        return None

    def stage1(self, findings: Sequence[Finding], located: dict[str, str]) -> dict[str, Analysis]:
        """One analyst per finding, in announced batches of at most 8."""
        analyses: dict[str, Analysis] = {}
        asked: list[tuple[Finding, dict[str, Any]]] = []
        for finding in findings:
            text = reviewer_text(finding)
            forged = foreign_tokens(text)
            if forged:
                note = (
                    "no proposal: the reviewer-authored text carries a delimiter of another invocation "
                    f"({display(forged[0])}); nothing was derived from it"
                )
                analyses[finding.id] = Analysis(None, note)
                continue
            asked.append((finding, finding_state(finding, located[finding.id])))
        if not asked:
            return analyses
        self.out(announce_analysis(len(asked)))
        groups = batches(asked, ANALYST_BATCH)
        degraded: list[tuple[Finding, dict[str, Any], str]] = []
        for number, group in enumerate(groups, 1):
            self.out(f"batch {number} of {len(groups)}: " + ", ".join(f.id for f, _ in group))
            ids = self.enqueue([self.question(ANALYST, f, state) for f, state in group])
            why = settle(self.runtime, ids, on_wait=self.out)
            for (finding, state), jid in zip(group, ids, strict=True):
                judgement = self.runtime.store.get(jid)
                if judgement is None or not judgement.finished:
                    reason = why or "not finished"
                    self.summary.waiting.append((finding.id, f"analysis waits: {reason}"))
                    continue
                if judgement.status != "answered":
                    degraded.append(
                        (finding, state, f"the analyst failed ({judgement.reason or 'no reason'})")
                    )
                    continue
                try:
                    proposal = parse_analysis(judgement.value)
                    target = check_location(self.root, proposal.target)
                    if not target.usable:
                        raise ContractError(f"target {proposal.target} is not usable ({target.why})")
                except ContractError as error:
                    degraded.append((finding, state, f"the analyst's return is unusable: {error}"))
                    continue
                analyses[finding.id] = Analysis(proposal)
        for finding, state, why in degraded:
            analyses[finding.id] = self.degrade(finding, state, why)
        return analyses

    def degrade(self, finding: Finding, state: dict[str, Any], why: str) -> Analysis:
        """The degraded path: the Remediation restated (never verbatim), confirmed at the sweep."""
        note = f"code analysis unavailable: {why}"
        remediation = str(state.get("remediation") or "")
        if not remediation.strip():
            return Analysis(None, note + "; the block names no Remediation to restate")
        self.out(f"{finding.id}: {note}; restating its Remediation")
        result = self.restate(finding, state, mode="remediation")
        if isinstance(result, str):
            return Analysis(None, f"{note}; the Remediation could not be restated ({result})")
        proposal = Proposal(
            target=str(state.get("location")),
            alternatives=result,
            a_alone=len(result) == 1,
            a_alone_reason="the Remediation names one fix" if len(result) == 1 else "",
            degraded=True,
        )
        return Analysis(proposal, note)

    # --- sessions as judgements --------------------------------------------------------------
    def question(self, kind: str, finding: Finding, state: dict[str, Any], salt: str = "") -> dict[str, Any]:
        """A read-only question about a finding, as a judgement. Its key names the finding,
        the block as it stands, its location, its history and the target file's content:
        asking again about an unchanged finding reuses the answer (no session spent), and any
        change asks afresh."""
        ref = self.record.ref(finding.id)
        location = str(state.get("location"))
        path = location.rsplit(":", 1)[0]
        try:
            blob = hash_paths(self.root, [path]).get(path, "?")
        except GitUnavailable:
            blob = "?"
        identity = [kind, self.repo, ref, block_hash(finding), location, state.get("retired"), blob, salt]
        digest = sha256_hex(canonical_json(identity))
        return {
            "kind": kind,
            "target": ref,
            "item": f"{kind.removeprefix('findings-')} of block {block_hash(finding)[:16]}",
            "context": {"checkout": str(self.root)},
            "state": state,
            "key": f"gate:{digest}",
        }

    def enqueue(self, judgements: Sequence[dict[str, Any]], *, force: bool = False) -> list[str]:
        results = self.client.enqueue_many(list(judgements), force=force)
        ids = []
        for r in results:
            if not r.ok or r.id is None:
                raise UserError(f"cannot enqueue a gate judgement: {r.error}")
            ids.append(r.id)
        return ids

    def restate(
        self, finding: Finding, state: dict[str, Any], *, mode: str, answer: str = ""
    ) -> tuple[Alternative, ...] | str:
        """Ask the restater; the alternatives it returns, or why there are none."""
        asked = {**state, "mode": mode, "answer": answer}
        if foreign_tokens(answer):
            return "the answer carries a delimiter of another invocation"
        (jid,) = self.enqueue([self.question(RESTATER, finding, asked, salt=f"{mode}\0{answer}")])
        why = settle(self.runtime, [jid], on_wait=self.out)
        judgement = self.runtime.store.get(jid)
        if judgement is None or not judgement.finished:
            return f"the restater waits: {why}"
        if judgement.status != "answered":
            return f"the restater failed ({judgement.reason or 'no reason'})"
        try:
            return parse_restatement(
                judgement.value, mode=mode, remediation=str(state.get("remediation", ""))
            )
        except ContractError as error:
            return str(error)

    # --- stage 2: the sweep ------------------------------------------------------------------
    def stage2(self, findings: Sequence[Finding], analyses: dict[str, Analysis]) -> None:
        total = len(findings)
        for position, finding in enumerate(findings, 1):
            finding = self.record.read().finding(finding.id)
            try:
                self.sweep_one(finding, analyses.get(finding.id), position, total)
            except TamperError as error:
                self.summary.tampered.append((finding.id, str(error)))

    def sweep_one(self, finding: Finding, analysis: Analysis | None, position: int, total: int) -> None:
        assert self.terminal is not None
        t = self.terminal
        stalled = stalled_resolutions(finding)
        proposal = analysis.proposal if analysis else None
        t.say(*render_header(finding, position, total))
        t.say(*render_source(finding))
        if stalled:
            t.say("stalled — no progress: two decisions were tried and retired:")
            t.say(*(f"  - {display(r)}" for r in stalled))
            options = ["skip", "reject"]
            verified = False
            prefill = None
        else:
            if analysis is not None and analysis.note:
                t.say(display(analysis.note))
            if proposal is None:
                t.say("The finding as written (no proposal):")
                t.say(*indent(reviewer_text(finding)))
            else:
                t.say(*render_proposal(proposal))
            t.say(*render_retired(finding))
            offered, verified, prefill, rows = self.evidence_gate(proposal)
            if proposal is not None and proposal.candidate is not None:
                t.say(f"Rejection candidate: {display(proposal.candidate.reason)}")
                if rows:
                    t.say("Evidence re-run by dispatchq (read-only):", *render_evidence(rows))
                if not offered:
                    t.say("reject is withheld: the recorded evidence no longer holds")
                elif not verified:
                    t.say("no re-runnable evidence: a rejection would be marked unverified")
            labels = [a.label for a in proposal.alternatives] if proposal else []
            options = sweep_options(labels, reject=offered)
        while True:
            choice = parse_choice(t.ask(f"{finding.id} decision {options_line(options)}> "), options)
            if choice is None:
                t.say(f"choose one of {options_line(options)}" + ("" if stalled else ", or d for details"))
                continue
            if choice == "details":
                if proposal is not None:
                    t.say(*render_details(proposal))
                else:
                    t.say("no analysis to show")
                continue
            if choice == "skip":
                self.summary.skipped.append(finding.id)
                return
            if choice == "reject":
                if self.reject(finding, prefill=prefill, verified=verified):
                    return
                continue
            if choice == "other":
                if self.other(finding, proposal):
                    return
                continue
            assert proposal is not None
            alt = proposal.alternative(choice)
            assert alt is not None
            if proposal.degraded:
                t.say(f"restated from the Remediation: {display(alt.resolution)}")
                if not t.yes(f"{finding.id} use this restatement? [y/n]> "):
                    continue
            if self.decide_alternative(finding, alt, proposal.target):
                return

    def evidence_gate(self, proposal: Proposal | None) -> tuple[bool, bool, str | None, list[Any]]:
        """(reject offered, rejection verified, prefilled reason, rows to render).

        A candidate's cited in-boundary checks are re-run: supported → reject offered and
        prefilled; diverging → withheld; a citation the boundary refuses → the no-candidate
        path (reject offered, unverified). The re-run persists nothing.
        """
        if proposal is None or proposal.candidate is None or not proposal.candidate.citations:
            return True, False, None, []
        rows: list[Any] = []
        refused = False
        every = True
        for citation in proposal.candidate.citations:
            if citation.check is None:
                rows.append((citation, None, None))
                refused = True
                continue
            result = run_check(citation.check, self.root)
            if not result.ran:
                rows.append((citation, None, None))
                refused = True
                continue
            ok = supported(citation.recorded, result.output, ran=result.ran, error=result.error)
            fresh = result.output + (f"[error: {result.error}]\n" if result.error else "")
            rows.append((citation, fresh, ok))
            every = every and ok
        if refused:
            return True, False, None, rows
        if every:
            return True, True, proposal.candidate.reason, rows
        return False, False, None, rows

    def reject(self, finding: Finding, *, prefill: str | None, verified: bool) -> bool:
        assert self.terminal is not None
        t = self.terminal
        reason = ""
        for attempt in (1, 2):
            if prefill:
                answer = t.ask(f'{finding.id} reject reason [Enter keeps "{display(prefill)}"]> ').strip()
                reason = answer or prefill
            else:
                reason = t.ask(f"{finding.id} reject reason (one line, required)> ").strip()
            if reason:
                break
            if attempt == 1:
                t.say("a rejection is terminal and needs a stated reason; once more")
        if not reason:
            t.say("no reason given: back to the options")
            return False
        self.record.reject(finding.id, " ".join(reason.split()), self.today)
        self.summary.rejected.append(finding.id)
        if not verified:
            self.summary.unverified.append((finding.id, "rejected with no supported evidence"))
        return True

    def other(self, finding: Finding, proposal: Proposal | None) -> bool:
        """`other…`: the person's words, restated self-containedly and confirmed; one re-ask."""
        assert self.terminal is not None
        t = self.terminal
        t.say(
            "dispatchq has your answer restated as a self-contained resolution and derives its "
            "checks now; approval for any check outside the read-only boundary is asked here, "
            "never later."
        )
        location = check_location(self.root, finding.value("Location"))
        target = proposal.target if proposal and proposal.target else (location.target or "")
        state = finding_state(finding, target)
        for attempt in (1, 2):
            answer = t.ask(f"{finding.id} your resolution> ").strip()
            if not answer:
                return False
            t.say("restating…")
            result = self.restate(finding, state, mode="other", answer=answer)
            if not isinstance(result, str):
                alt = result[0]
                t.say(f"restated: {display(alt.resolution)}")
                if alt.plan:
                    t.say("derived checks:", *(f"    {display(c.text)}" for c in alt.plan))
                if t.yes(f"{finding.id} use this restatement? [y/n]> "):
                    return self.decide_alternative(finding, alt, target or None)
                why = "not confirmed"
            else:
                why = result
            if attempt == 1:
                t.say(
                    f"could not use it ({display(why)}). Name every file and line the resolution "
                    "touches, and refer back neither to the Remediation nor to the other alternative."
                )
        t.say("back to the options; nothing was written")
        return False

    def decide_alternative(self, finding: Finding, alt: Alternative, target: str | None) -> bool:
        """Write the decision as made: plan (after the plan-rejection test), approvals, pin."""
        assert self.terminal is not None
        t = self.terminal
        plan: list[Check] | None = list(alt.plan) or None
        if plan:
            test = plan_rejection(plan, self.root, absent_text_only=alt.absent_text_only)
            if test.rejected:
                t.say(
                    f"the verification plan is treated as no plan ({test.why}): it cannot tell a fix "
                    "from no fix, so the fix will be graded `dispatched, unverified` unless it fails"
                )
                plan = None
        approved: list[Check] = []
        outside = [c for c in plan or [] if not c.inside_boundary]
        if outside:
            t.say(
                f"{len(outside)} check(s) of this plan run outside the read-only boundary. After the fix "
                "dispatchq would run exactly:"
            )
            t.say(*(f"    {json.dumps(list(c.args))}" for c in outside))
            t.say(
                "Declining costs: each counts as a check that cannot run; with nothing else run the "
                "attempt is graded `dispatched, unverified`, it still counts toward the two-attempt "
                "retirement, and two such runs retire the decision."
            )
            if t.yes(f"{finding.id} approve running them after the fix? [y/n]> "):
                approved = outside
        location = check_location(self.root, finding.value("Location"))
        new_target = check_location(self.root, target) if target else None
        if new_target is not None and new_target.usable and new_target.target != location.target:
            self.record.write_location(finding.id, new_target.target or "")
            location = new_target
        label = alt.label if alt.label in ("A", "B") else "other"
        decision = Decision(label, alt.resolution, self.who, self.today)  # type: ignore[arg-type]
        pinned = self.record.write_decision(
            finding.id,
            decision,
            plan=plan,
            roles=dict(alt.roles),
            target=location.path if location.usable else None,
        )
        if approved and plan:
            approvals = Approvals(self.runtime.redis, self.repo, self.record.ref(finding.id))
            for check in approved:
                approvals.approve(plan, check.args, who=self.who, at=_iso_now())
        self.summary.decided.append(finding.id)
        if pinned.pin is None:
            self.summary.unpinned.append((finding.id, pinned.why_unpinned or "no pin"))
        for path, why in pinned.unpinnable:
            self.summary.unpinnable.append((finding.id, path, why))
        t.say(f"{finding.id}: decided {label} — written to the report")
        return True

    # --- stages 3-4 --------------------------------------------------------------------------
    def dispatch(self, only: Iterable[str] | None = None) -> list[str]:
        """Dispatch every decided finding, one fixer judgement per attempt; returns the ids
        set aside (a pin mismatch nobody can explain) for a second sweep."""
        wanted = list(only) if only is not None else None
        aside: list[str] = []
        pending = [f.id for f in self.decided(wanted)]
        retry: set[str] = set()  # a job that ended with no outcome is run again, once, afresh
        for _wave in range(4):
            findings = {f.id: f for f in self.decided(pending)}
            todo = [findings[fid] for fid in pending if fid in findings]
            if not todo:
                break
            self.out(f"dispatching {len(todo)} decided finding(s), one at a time per repository")
            jobs = [self.fixer_judgement(f) for f in todo]
            ids = [
                self.enqueue([job], force=f.id in retry)[0] for (job, _), f in zip(jobs, todo, strict=True)
            ]
            why = settle(self.runtime, ids, on_wait=self.out)
            pending = []
            for (_, attempt), finding, jid in zip(jobs, todo, ids, strict=True):
                judgement = self.runtime.store.get(jid)
                key = attempt_key(self.repo, self.record.ref(finding.id), decision_key(finding), attempt)
                state = AttemptState(self.runtime, key).load()
                result = state.get("outcome") if state.get("phase") == "done" else None
                finished = judgement is not None and judgement.finished
                broken = not isinstance(result, dict) or result.get("outcome") == "error"
                if broken and finished and finding.id not in retry:
                    retry.add(finding.id)
                    pending.append(finding.id)
                    continue
                if not isinstance(result, dict):
                    if finished:
                        status = judgement.status if judgement else "gone"
                        self.summary.failed.append(
                            (
                                finding.id,
                                f"attempt {attempt}: the fixer job ended without an outcome ({status})",
                            )
                        )
                    else:
                        reason = (judgement.reason if judgement else None) or why or "not started"
                        self.summary.waiting.append((finding.id, f"dispatch waits: {reason}"))
                    continue
                again = self.account(finding.id, attempt, result)
                if again == "set-aside":
                    aside.append(finding.id)
                elif again == "again":
                    pending.append(finding.id)
        self.finish()
        return aside

    def fixer_judgement(self, finding: Finding) -> tuple[dict[str, Any], int]:
        decision = finding.decision()
        assert decision is not None
        attempt = len(decision.attempts) + 1
        block = block_hash(finding)
        ref = self.record.ref(finding.id)
        which = decision_key(finding)
        identity = [FIXER, self.repo, ref, which, attempt, block]
        state = {
            "report": str(self.report),
            "root": str(self.root),
            "finding": finding.id,
            "attempt": attempt,
            "block": block,
            "decision": which,
            "status_at_start": self.status_at_start.get(finding.id),
        }
        judgement = {
            "kind": FIXER,
            "target": ref,
            "item": f"attempt {attempt} block {block}",
            "context": {"checkout": str(self.root)},
            "state": state,
            "key": "gate:" + sha256_hex(canonical_json(identity)),
        }
        return judgement, attempt

    def account(self, fid: str, attempt: int, outcome: dict[str, Any]) -> str | None:
        """Fold one attempt's outcome into the summary; "again" when it needs a new attempt."""
        kind = outcome.get("outcome")
        s = self.summary
        if kind == "set-aside":
            s.set_aside.append((fid, str(outcome.get("why", ""))))
            if outcome.get("tampered"):
                s.tampered.append((fid, str(outcome.get("why", ""))))
            return "set-aside"
        if kind == "interrupted":
            s.interrupted.append((fid, attempt))
            if outcome.get("retired"):
                s.retired.append(fid)
                return None
            return "again"
        if kind == "error":
            s.failed.append((fid, f"attempt {attempt}: the fixer job failed: {outcome.get('why')}"))
            return None
        if kind != "graded":
            s.notes.append(f"{fid}: attempt {attempt}: {kind}")
            return None
        g = outcome.get("grade") or {}
        case = g.get("case")
        if case == "fixed":
            s.fixed.append(fid)
        elif case == "partially-fixed":
            s.partially_fixed.append(fid)
        elif case == "failed":
            s.failed.append((fid, f"attempt {attempt}: failed"))
        else:
            s.unavailable.append(
                (fid, f"attempt {attempt}: dispatched, unverified ({g.get('verification')})")
            )
        if g.get("unobservable"):
            s.unobservable.append(fid)
        if g.get("advisory") and case == "fixed":
            s.advisory.append(fid)
        if g.get("out_of_scope"):
            s.out_of_scope.append((fid, list(g["out_of_scope"])))
        if g.get("coverage_warning"):
            s.coverage.append((fid, [str(g.get("verification"))]))
        if outcome.get("unpinned"):
            s.add_unique("unpinned", (fid, "no Decision-pin line: graded by the re-derived expected set"))
        for path, why in outcome.get("unpinnable") or []:
            s.add_unique("unpinnable", (fid, path, why))
        if outcome.get("retired"):
            s.retired.append(fid)
        return None
