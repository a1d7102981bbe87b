"""One fixer attempt, run inside its session-tier job: lock, state, checks, spawn, grading.

Everything that must be true at the moment of the spawn runs inside the job, in the
session tier's hooks (`dispatchq.findings.run.kinds.FixerHooks` calls `FixerJob`): the
repository lock (sequential per repository across workers), the job's own state (a
dispatch with an unknown outcome is verified before anything else), tamper evidence,
the pin comparison with the attribution rule, the before-observation, the dispatch copy
and the `Dispatch:` marker, written after the window check and rewritten back when the
spawn is refused. Right after the session, still inside the job: the persisted plan
inside the execution boundary plus approved checks, the after-observation, the dispatch
log, the four grading cases and retirement.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatchq.core.judgement import TrailEntry, canonical_json, sha256_hex
from dispatchq.errors import CheckError, TamperError, UserError
from dispatchq.findings.evidence.boundary import Approvals, PlanResult, run_plan
from dispatchq.findings.evidence.grading import Grade, Observation, grade, rebase
from dispatchq.findings.evidence.pins import (
    UNPINNABLE,
    PinSpec,
    repo_id,
    specs_for,
)
from dispatchq.findings.evidence.record import (
    DecisionRecord,
    RecordStore,
    dispatch_copy,
    report_lock_dir,
    stalled_resolutions,
    tamper_json,
)
from dispatchq.findings.grammar.lines import PLAN, STATUS
from dispatchq.findings.grammar.plans import parse_plan
from dispatchq.findings.grammar.report import Finding
from dispatchq.findings.texts.prompts import fixer_prompt, new_nonce
from dispatchq.storage.findings import FindingsStore
from dispatchq.tiers.hooks import GO, Requeue, Settled, SpawnVerdict

if TYPE_CHECKING:
    from dispatchq.core.judgement import Record
    from dispatchq.runtime import Runtime
    from dispatchq.window.limits import SessionOutcome

__all__ = [
    "LOCK_LEASE",
    "POLL",
    "AttemptState",
    "FixerJob",
    "RepoLock",
    "attempt_key",
    "decision_key",
    "grading_entries",
    "iso_now",
    "observed_paths",
    "unpinnable_of",
]


LOCK_LEASE = 30  # seconds; a holder that dies frees the repository within this long
POLL = 0.25
# --- the repository lock --------------------------------------------------------------------
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
        self.holder = f"j:{jid}"
        self.jid = jid
        self.lock = runtime.storage.findings.repo_lock(repo, self.holder)

    def acquire(self, *, wait: float) -> bool:
        deadline = time.monotonic() + wait
        while True:
            if self.lock.take(LOCK_LEASE):
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
        lock = self.lock
        limit = time.monotonic() + self.runtime.settings.session_timeout + 3600
        store = self.runtime.storage.records

        def keep() -> None:
            while not stop.wait(LOCK_LEASE / 3) and time.monotonic() < limit:
                record = store.get(self.jid)
                # A job that died and was put back in line no longer holds the repository.
                if record is None or record.status in ("queued", "waiting", "failed", "cancelled"):
                    break
                if not lock.renew(LOCK_LEASE):
                    break
            with _KEEPERS_LOCK:
                if _KEEPERS.get(self.holder) is stop:
                    del _KEEPERS[self.holder]

        threading.Thread(target=keep, name=f"repo-lock-{self.jid}", daemon=True).start()

    def hold(self) -> bool:
        """The lock for a grading, which may run in another process than the one that took it.

        An answer replayed from a host's spool is graded by that host's session worker, not by
        the job that took the lock (it is gone, and its lease with it). Kept when this process
        keeps it; taken again when nobody took the repository meanwhile (the holder's own name,
        so re-entrant); False when another fixer holds it now: grading then would race that
        fixer's edits.
        """
        with _KEEPERS_LOCK:
            if self.holder in _KEEPERS:
                return True
        return self.acquire(wait=0)

    def release(self) -> None:
        with _KEEPERS_LOCK:
            stop = _KEEPERS.pop(self.holder, None)
        if stop is not None:
            stop.set()
        self.lock.drop()


# --- one fixer attempt ----------------------------------------------------------------------
def iso_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass
class AttemptState:
    """One attempt's own state in Redis: where a (re)started job reads where it stands."""

    runtime: Runtime
    key: str

    def load(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self.runtime.storage.findings.attempt_fields(self.key).items()}

    def save(self, **fields: Any) -> None:
        encoded = {k: json.dumps(v) for k, v in fields.items()}
        self.runtime.storage.findings.save_attempt_fields(self.key, encoded)


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
    return FindingsStore.attempt_key(repo, f"{ref}@{decision}", attempt)


class FixerJob:
    """A fixer judgement's steps. Every start reads the job's own state first.

    `state` of the judgement: report, root, finding, attempt, block, decision (which decision the
    attempt belongs to), status_at_start.
    """

    def __init__(self, runtime: Runtime, judgement: Record) -> None:
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
        self.record = DecisionRecord(
            self.report,
            self.root,
            RecordStore(runtime.storage.findings, self.root),
            lock_dir=report_lock_dir(runtime.settings.data_dir),
        )
        self.repo = repo_id(self.root)
        self.ref = self.record.ref(self.fid)
        self.state = AttemptState(
            runtime, attempt_key(self.repo, self.ref, str(state.get("decision", "")), self.attempt)
        )
        self.lock = RepoLock(runtime, self.repo, judgement.id)
        self.today = dt.date.today()
        self.tamper_seen: list[dict[str, object]] = []

    @classmethod
    def load(cls, runtime: Runtime, judgement: Record) -> FixerJob:
        return cls(runtime, judgement)

    # --- the job's log -----------------------------------------------------------------------
    def log(self, text: str) -> Path:
        folder = self.runtime.settings.data_dir.expanduser() / "findings" / self.repo
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in self.fid)
        path = folder / f"{safe}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # the data dir's files are 0600
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(f"[{iso_now()}] {self.ref} attempt {self.attempt}\n{text.rstrip()}\n\n")
        return path

    # --- finishing ---------------------------------------------------------------------------
    def finish(self, outcome: dict[str, Any], *, transition: bool) -> str:
        """Record the attempt's outcome; when the job ends without a spawn, answer it too."""
        if self.tamper_seen:
            outcome.setdefault("tamper", self.tamper_seen)
        outcome.setdefault("finding", self.fid)
        outcome.setdefault("attempt", self.attempt)
        self.state.save(outcome=outcome, phase="done")
        store = self.runtime.storage.records
        if transition:
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
        # Tamper evidence first: nothing a changed line says (a plan, a pin) is used before it.
        tamper = self.record.tamper(finding)
        if tamper and not all(t.status_gone for t in tamper):
            self.record.supersede(self.fid)
            why = "; ".join(t.message for t in tamper)
            self.log(f"set aside before anything ran: {why}")
            outcome = {"outcome": "set-aside", "why": why, "tampered": True, "tamper": tamper_json(tamper)}
            return self.finish(outcome, transition=True)
        if tamper:
            # A deleted Status line: the grade it carried is verified again, never replayed.
            self.record.accept(self.fid)
            self.tamper_seen = tamper_json(tamper)
            self.log("a Status line dispatchq wrote is gone: verifying the tree again")
            finding = self.record.read().finding(self.fid)
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
        store = self.record.store
        assert store is not None
        if before is not None:
            # Other fixers may have run since the kill: what they logged is theirs, not this attempt's.
            since = own.get("log_at")
            position = int(since) if isinstance(since, int) else store.pin_position(self.ref)
            others = [
                e for e in store.log_since(position) if (e.finding, e.attempt) != (self.ref, self.attempt)
            ]
            before = rebase(before, others)
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
        assert self.record.store is not None
        log_at = self.record.store.log_length()  # under the repository lock: no dispatch in between
        before = self.record.observe(paths)
        copy = dispatch_copy(finding, status_at_run_start=self.status_at_start)
        self.state.save(
            phase="dispatching",
            before=before.to_json(),
            log_at=log_at,
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
        if not self.lock.hold():
            # A replayed answer whose repository another fixer holds now: its edits are not
            # this session's, so no grade; the next run verifies before anything else.
            self.state.save(phase="unknown")
            self.log("answered while another fixer holds the repository: outcome unknown, verified first")
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
        """Verification: the persisted plan, inside the boundary plus approved checks; raw output logged."""
        value = finding.value(PLAN)
        if value is None:
            self.log("verification: no plan")
            return None
        try:
            checks = parse_plan(value)
        except CheckError as error:
            self.log(f"verification: plan unreadable ({error})")
            return None
        approvals = Approvals(self.runtime.storage.findings, self.repo, self.ref)
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
        store.log_dispatch(self.ref, self.attempt, before, after, at=iso_now())
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
