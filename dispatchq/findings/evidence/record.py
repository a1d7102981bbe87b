"""The decision record: the writes on a finding, its state, and how they are kept honest.

A person's decision is only worth replaying if it still applies, and a fixer's work is
only worth grading from what the tree shows. The rules for those live beside this module
(`pins`: where a finding points and what a decision was made against; `grading`: what a
dispatch did and how it is graded); this module is where they meet one report:

- the loop's writes on a finding (Location, Decision with its plan and pin, the Dispatch
  marker, a grade, an interruption, a supersession, a rejection), and when a decision
  retires, stalls or is superseded;
- what a fixer is shown (the dispatch copy) and whether anyone else touched the lines
  dispatchq wrote (tamper evidence: dispatchq's own copy in Redis, through
  `dispatchq.storage.findings`);
- `DecisionRecord`, one report in one checkout, every write under the report's lock;
- the read-only inspection the CLI prints.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from dispatchq.errors import CheckError, GitUnavailable, TamperError, UserError
from dispatchq.findings.evidence.boundary import contain, exists_in
from dispatchq.findings.evidence.grading import Grade, Observation, observe
from dispatchq.findings.evidence.pins import (
    UNPINNABLE,
    DispatchLogEntry,
    LocationCheck,
    PinComparison,
    PinResult,
    PinSpec,
    block_hash,
    check_location,
    compare_pin,
    compute_pin,
    finding_ref,
    hash_paths,
    pin_specs,
    repo_id,
)
from dispatchq.findings.grammar.lines import (
    DECISION,
    DISPATCH,
    LOCATION,
    LOOP_FIELDS,
    PIN,
    PLAN,
    RETIRED,
    STATUS,
    VERIFICATION,
    Decision,
    DispatchMarker,
    Pin,
    Status,
    format_location,
)
from dispatchq.findings.grammar.plans import Check, format_plan, parse_plan
from dispatchq.findings.grammar.report import (
    Finding,
    FindingEditor,
    Hooks,
    Line,
    Report,
    Violation,
    field_of,
    finding_violations,
    is_loop_line,
    read_report,
    update_finding,
)
from dispatchq.storage.findings import FindingsStore

if TYPE_CHECKING:
    pass

__all__ = [
    "STATES",
    "DecisionRecord",
    "FindingInspection",
    "RecordStore",
    "Tamper",
    "apply_grade",
    "attempt_retirements",
    "dispatch_copy",
    "finding_state",
    "inspect_finding",
    "mark_dispatch",
    "record_interrupted",
    "reject",
    "report_lock_dir",
    "restore_dispatch",
    "stalled_resolutions",
    "supersede",
    "tamper_json",
    "write_decision",
    "write_location",
]

T = TypeVar("T")


STATES = (
    "undecided",
    "decided",
    "dispatched-outcome-unknown",
    "retired",
    "stalled",
    "rejected",
    "fixed",
    "partially-fixed",
)


# --- rules 3, 4, 11: writes on a finding ---------------------------------------------------
def write_location(editor: FindingEditor, target: str) -> None:
    """Write a validated `path:line` in the extended form, keeping the reviewer's original."""
    editor.set(LOCATION, format_location(target, editor.get(LOCATION)))


def write_decision(
    editor: FindingEditor,
    decision: Decision,
    *,
    plan: Sequence[Check] | None,
    pin: Pin | None,
) -> None:
    """Write a fresh decision with its plan and pin, over any previous ones in place.

    A stale Dispatch marker or Verification line belonged to the decision being replaced
    and is removed, so it can never be read as this decision's.
    """
    if decision.attempts:
        raise UserError("a fresh decision starts with no attempt entries")
    editor.set(DECISION, decision.format())
    if plan:
        editor.set(PLAN, format_plan(plan))
    else:
        editor.remove(PLAN)
    if pin is not None:
        editor.set(PIN, pin.format())
    else:
        editor.remove(PIN)
    editor.remove(DISPATCH)
    editor.remove(VERIFICATION)


def mark_dispatch(editor: FindingEditor, attempt: int, today: dt.date) -> str | None:
    """Write `**Dispatch:** attempt N dispatched <date>`; returns the value it replaced,
    so a spawn refused by a closed window can be rewritten back."""
    if editor.get(DECISION) is None:
        raise UserError(f"{editor.finding.id}: no live decision to dispatch")
    previous = editor.get(DISPATCH)
    editor.set(DISPATCH, DispatchMarker(attempt, today).format())
    return previous


def restore_dispatch(editor: FindingEditor, previous: str | None) -> None:
    if previous is None:
        editor.remove(DISPATCH)
    else:
        editor.set(DISPATCH, previous)


def apply_grade(editor: FindingEditor, result: Grade) -> bool:
    """Write a grade; returns True when it retired the decision.

    Cases 1-2 write Status and Verification. Cases 3-4 append the attempt entry and write
    Verification in the same write; a second entry retires the decision in place. An
    entry that already exists for this attempt is not written again (a resumed grading
    is not counted twice).
    """
    editor.set(VERIFICATION, result.verification.format())
    if result.status is not None:
        editor.set(STATUS, result.status.format())
        return False
    value = editor.get(DECISION)
    if value is None:
        raise UserError(f"{editor.finding.id}: no live decision to record attempt {result.attempt} on")
    decision = Decision.parse(value)
    if len(decision.attempts) < result.attempt:
        if len(decision.attempts) + 1 != result.attempt:
            raise UserError(
                f"{editor.finding.id}: attempt {result.attempt} graded but the decision records "
                f"{len(decision.attempts)}"
            )
        assert result.outcome is not None
        decision = decision.with_attempt(result.outcome)
        editor.set(DECISION, decision.format())
    if len(decision.attempts) >= 2:
        editor.retire_decision()
        return True
    return False


def record_interrupted(editor: FindingEditor, attempt: int) -> bool:
    """`attempt N: interrupted, unverified` for a dispatch whose outcome was unknown and whose
    verification failed on resume; returns True when that retired the decision."""
    value = editor.get(DECISION)
    if value is None:
        raise UserError(f"{editor.finding.id}: no live decision")
    decision = Decision.parse(value)
    if len(decision.attempts) + 1 == attempt:
        decision = decision.with_attempt("interrupted, unverified")
        editor.set(DECISION, decision.format())
    if len(decision.attempts) >= 2:
        editor.retire_decision()
        return True
    return False


def supersede(editor: FindingEditor) -> str | None:
    """Retire the live decision in place at the moment its finding is set aside (a pin
    mismatch nobody can explain). It keeps its history and does not count toward stalled."""
    return editor.retire_decision()


def reject(editor: FindingEditor, reason: str, today: dt.date) -> None:
    """`🚫 Rejected (date) — reason`; a live decision is retired first, never left live."""
    status = Status.rejected(today, reason)
    editor.retire_decision()
    editor.set(STATUS, status.format())


# --- states ----------------------------------------------------------------------------------
def attempt_retirements(finding: Finding) -> list[Decision]:
    """Retired decisions that used up their two attempts (supersessions are not counted)."""
    return [d for d in finding.retired() if len(d.attempts) >= 2]


def stalled_resolutions(finding: Finding) -> list[str] | None:
    """Both retired resolutions when a finding is stalled (two attempt retirements)."""
    if finding.value(DECISION) is not None or finding.terminal:
        return None
    retired = attempt_retirements(finding)
    return [d.resolution for d in retired] if len(retired) >= 2 else None


def finding_state(finding: Finding) -> str:
    """One of STATES, read from the report alone."""
    terminal = finding.terminal
    if terminal:
        return terminal
    if finding.value(DECISION) is not None:
        decision = finding.decision()
        marker = finding.dispatch_marker()
        if decision is not None and marker is not None and marker.attempt == len(decision.attempts) + 1:
            return "dispatched-outcome-unknown"
        return "decided"
    if stalled_resolutions(finding):
        return "stalled"
    if finding.all(RETIRED):
        return "retired"
    return "undecided"


# --- rule 13: the dispatch copy ------------------------------------------------------------
def dispatch_copy(finding: Finding, *, status_at_run_start: str | None) -> str:
    """The block a fixer is sent.

    Location travels (in its rewritten form). Plan, pin, dispatch marker, verification
    and retired decisions are stripped: a fixer told to iterate until verification
    passes must not see the checks it will be graded by. The decision is reduced to a
    trailing `User decision: <resolution>`. A Status this run wrote is stripped; one the
    block already had when the run began travels unchanged.
    """
    decision = finding.decision()
    if decision is None:
        raise UserError(f"{finding.id}: no live decision to dispatch")
    eol = next((line.ending for line in finding.lines if line.ending), "\n")
    kept: list[Line] = []
    for line in finding.lines:
        if is_loop_line(line.text):
            parsed = field_of(line.text)
            name, value = parsed if parsed else (None, None)
            travels = name == LOCATION or (
                name == STATUS and status_at_run_start is not None and value == status_at_run_start
            )
            if not travels:
                continue
        kept.append(line)
    while kept and not kept[-1].text.strip():
        kept.pop()
    body = "".join(line.raw for line in kept)
    if kept and not kept[-1].ending:
        body += eol
    return f"{body}{eol}User decision: {decision.resolution}{eol}"


# --- rule 14: tamper evidence, the dispatch log (Redis) -------------------------------------
@dataclass(frozen=True)
class Tamper:
    """One line of tamper evidence: at report line `line`, dispatchq wrote `expected` (None:
    it wrote nothing there) and the report now holds `found` (None: the line is gone)."""

    line: int
    expected: str | None
    found: str | None

    @property
    def message(self) -> str:
        if self.found is None:
            return f"`{self.expected}` written by dispatchq is gone"
        if self.expected is None:
            return f"`{self.found}` was not written by dispatchq"
        return f"`{self.expected}` written by dispatchq is gone; `{self.found}` was not written by dispatchq"

    @property
    def status_gone(self) -> bool:
        """Only a Status line dispatchq wrote is missing (the grade must be verified again)."""
        return self.found is None and (self.expected or "").startswith(f"**{STATUS}:**")

    def to_json(self) -> dict[str, object]:
        return {"line": self.line, "expected": self.expected, "found": self.found}


def report_lock_dir(data_dir: Path) -> Path:
    """Where reports' lock files live: dispatchq's data dir, never the repository."""
    return Path(data_dir).expanduser() / "findings" / "locks"


def tamper_json(tamper: Iterable[Tamper]) -> list[dict[str, object]]:
    return [t.to_json() for t in tamper]


@dataclass
class RecordStore:
    """dispatchq's own copy of what it wrote, and the dispatch log, for one checkout.

    The report may sit in the tree a fixer edits, so the report alone cannot prove who
    wrote a line. After every write dispatchq keeps the finding's loop-written lines as it
    left them; before every use it compares. A line anyone else changed is reported, and
    the finding is set aside. The Redis operations are the findings area's
    (`runtime.storage.findings`).
    """

    store: FindingsStore
    root: Path
    repo: str = field(init=False)

    def __post_init__(self) -> None:
        self.repo = repo_id(self.root)

    def written(self, ref: str) -> list[tuple[str, str]] | None:
        raw = self.store.written_lines(self.repo, ref)
        if raw is None:
            return None
        return [(str(n), str(v)) for n, v in json.loads(raw)]

    def remember(self, ref: str, finding: Finding) -> None:
        """Keep the finding's loop-written lines as just written (called under the report lock)."""
        lines = finding.loop_lines()
        previous = self.written(ref) or []
        old_pin = next((v for n, v in previous if n == PIN), None)
        new_pin = next((v for n, v in lines if n == PIN), None)
        pin_log = self.store.dispatch_log_length(self.repo) if new_pin != old_pin else None
        self.store.save_lines(self.repo, ref, json.dumps(lines), pin_log=pin_log)

    def tamper(self, ref: str, finding: Finding) -> list[Tamper]:
        """Every difference between the report's loop-written lines and dispatchq's copy, as
        (report line, what dispatchq wrote, what the report holds now)."""
        current = [f for f in finding.fields if f.name in LOOP_FIELDS]
        theirs = [f"**{f.name}:** {f.value}" for f in current]
        stored = self.written(ref)
        if stored is None:
            # Nothing written yet: only a Location or Status can predate dispatchq.
            return [
                Tamper(f.number, None, text)
                for f, text in zip(current, theirs, strict=True)
                if f.name not in (STATUS, LOCATION)
            ]
        if stored == [(f.name, f.value) for f in current]:
            return []
        mine = [f"**{n}:** {v}" for n, v in stored]
        end = current[-1].number + 1 if current else finding.number + 1

        def number(index: int) -> int:
            return current[index].number if index < len(current) else end

        out: list[Tamper] = []
        for op, a1, a2, b1, b2 in difflib.SequenceMatcher(a=mine, b=theirs, autojunk=False).get_opcodes():
            if op == "equal":
                continue
            gone, added = mine[a1:a2], theirs[b1:b2]
            for k in range(max(len(gone), len(added))):
                out.append(
                    Tamper(
                        number(b1 + min(k, len(added))),
                        gone[k] if k < len(gone) else None,
                        added[k] if k < len(added) else None,
                    )
                )
        return out

    def changes(self, ref: str, finding: Finding) -> list[str]:
        """Every difference between the report's loop-written lines and dispatchq's copy."""
        return [t.message for t in self.tamper(ref, finding)]

    def log_length(self) -> int:
        """How many dispatches are logged for this checkout."""
        return self.store.dispatch_log_length(self.repo)

    def pin_position(self, ref: str) -> int:
        """How long the dispatch log was when the current pin was written."""
        return self.store.pin_log_position(self.repo, ref)

    def log_dispatch(
        self, ref: str, attempt: int, before: Observation, after: Observation, *, at: str
    ) -> int:
        """Append one dispatch to the log; returns its 1-based position."""
        entry = {
            "finding": ref,
            "attempt": attempt,
            "at": at,
            "before": dict(before.values),
            "after": dict(after.values),
        }
        return self.store.append_dispatch(self.repo, json.dumps(entry))

    def log_since(self, position: int) -> list[DispatchLogEntry]:
        """Dispatches logged after the first `position` entries, oldest first."""
        out = []
        for offset, item in enumerate(self.store.dispatches_since(self.repo, position)):
            data = json.loads(item)
            out.append(
                DispatchLogEntry(
                    position + offset + 1,
                    data["finding"],
                    int(data["attempt"]),
                    data["at"],
                    data["before"],
                    data["after"],
                )
            )
        return out


# --- the record of one report ------------------------------------------------------------------
@dataclass
class DecisionRecord:
    """One report in one checkout, with dispatchq's store when there is one.

    Every write goes through `update`: under the report's lock it re-reads the report,
    refuses (TamperError) if a line dispatchq wrote was changed by anyone else, applies
    the change, and keeps the store's copy in step before the lock is released.
    """

    report: Path
    root: Path
    store: RecordStore | None = None
    lock_dir: Path | None = None  # where the report's lock lives (the data dir), not beside it

    def ref(self, finding_id: str) -> str:
        return finding_ref(self.report, self.root, finding_id)

    def read(self) -> Report:
        return read_report(self.report)

    def changes(self, finding: Finding) -> list[str]:
        return self.store.changes(self.ref(finding.id), finding) if self.store else []

    def tamper(self, finding: Finding) -> list[Tamper]:
        return self.store.tamper(self.ref(finding.id), finding) if self.store else []

    def accept(self, finding_id: str) -> None:
        """Take the report's loop-written lines as they now stand into dispatchq's copy: after
        tamper evidence was reported, so the same edit is not reported on every later write."""
        store = self.store
        if store is None:
            return
        ref = self.ref(finding_id)

        def keep(finding: Finding) -> None:
            store.remember(ref, finding)  # under the report's lock, as every write is

        update_finding(
            self.report, finding_id, lambda _e: None, hooks=Hooks(keep, None), lock_dir=self.lock_dir
        )

    def update(
        self,
        finding_id: str,
        change: Callable[[FindingEditor], T],
        *,
        accept_changes: bool = False,
    ) -> T:
        """Apply `change` to one finding; `accept_changes` is for the set-aside path only."""
        ref = self.ref(finding_id)

        def before(finding: Finding) -> None:
            if accept_changes or self.store is None:
                return
            changes = self.store.changes(ref, finding)
            if changes:
                raise TamperError(finding_id, changes)

        def after(finding: Finding) -> None:
            if self.store is not None:
                self.store.remember(ref, finding)

        return update_finding(
            self.report, finding_id, change, hooks=Hooks(before, after), lock_dir=self.lock_dir
        )

    # Convenience writes; each is one locked update.
    def write_location(self, finding_id: str, target: str) -> None:
        self.update(finding_id, lambda e: write_location(e, target))

    def write_decision(
        self,
        finding_id: str,
        decision: Decision,
        *,
        plan: Sequence[Check] | None,
        roles: Mapping[str, str] | None = None,
        target: str | None = None,
    ) -> PinResult:
        """Write a decision, its plan and its pin; the pin is cut from the block as it is
        on disk under the same lock, so it captures exactly what the decision was made on."""

        def change(editor: FindingEditor) -> PinResult:
            finding = editor.snapshot()
            where = target
            if where is None:
                location = check_location(self.root, finding.value(LOCATION))
                where = location.path if location.usable else None
            specs = pin_specs(where, decision.resolution, roles=roles)
            result = compute_pin(finding, specs, self.root)
            write_decision(editor, decision, plan=plan, pin=result.pin)
            return result

        return self.update(finding_id, change)

    def repin(self, finding_id: str) -> PinResult:
        """Re-pin the same paths and roles against the tree now (an attributable mismatch)."""

        def change(editor: FindingEditor) -> PinResult:
            finding = editor.snapshot()
            pin = finding.pin()
            if pin is None:
                raise UserError(f"{finding_id} has no pin to renew")
            specs = [
                PinSpec(e.path, e.role, "unpinnable when pinned" if e.value == UNPINNABLE else None)
                for e in pin.entries
            ]
            result = compute_pin(finding, specs, self.root)
            if result.pin is not None:
                editor.set(PIN, result.pin.format())
            return result

        return self.update(finding_id, change)

    def mark_dispatch(self, finding_id: str, attempt: int, today: dt.date) -> str | None:
        return self.update(finding_id, lambda e: mark_dispatch(e, attempt, today))

    def restore_dispatch(self, finding_id: str, previous: str | None) -> None:
        self.update(finding_id, lambda e: restore_dispatch(e, previous))

    def apply_grade(self, finding_id: str, result: Grade) -> bool:
        return self.update(finding_id, lambda e: apply_grade(e, result))

    def record_interrupted(self, finding_id: str, attempt: int) -> bool:
        return self.update(finding_id, lambda e: record_interrupted(e, attempt))

    def supersede(self, finding_id: str) -> str | None:
        return self.update(finding_id, supersede, accept_changes=True)

    def withdraw_deleted(self, finding: Finding) -> str | None:
        """A person deleted the live `**Decision:**` line by hand to decide again: retire that
        decision (its value from dispatchq's copy, so nothing of the report's text is taken as
        dispatchq's), drop its plan, pin and verification, and return its value.

        Only when every difference from dispatchq's copy is a deleted line, one of them the
        Decision, none a Status or Dispatch line, and no dispatch is in flight (a Dispatch
        marker: its outcome must be verified first). Anything else stays tamper evidence.
        """
        tamper = self.tamper(finding)
        if not tamper or any(t.found is not None for t in tamper) or finding.value(DISPATCH) is not None:
            return None
        names = [field_of(t.expected or "") for t in tamper]
        if any(n is None or n[0] in (STATUS, DISPATCH) for n in names):
            return None
        deleted = [n[1] for n in names if n is not None and n[0] == DECISION]
        if len(deleted) != 1:
            return None

        def retire(editor: FindingEditor) -> None:
            editor.set(RETIRED, deleted[0])
            for name in (PLAN, PIN, VERIFICATION):
                editor.remove(name)

        self.update(finding.id, retire, accept_changes=True)
        return deleted[0]

    def reject(self, finding_id: str, reason: str, today: dt.date) -> None:
        self.update(finding_id, lambda e: reject(e, reason, today))

    def check_pin(self, finding_id: str) -> PinComparison | None:
        """Compare the live pin with the tree now (None when the finding is unpinned)."""
        finding = self.read().finding(finding_id)
        pin = finding.pin()
        if pin is None:
            return None
        paths = [e.path for e in pin.entries if e.value != UNPINNABLE]
        try:
            current = hash_paths(self.root, paths)
        except GitUnavailable as error:
            current = {p: f"!{error}" for p in paths}
        log = self.store.log_since(self.store.pin_position(self.ref(finding_id))) if self.store else []
        return compare_pin(pin, block_hash(finding), current, log)

    def observe(self, paths: Iterable[str], *, carry: Observation | None = None) -> Observation:
        """Observe the tree with this report as the loop's own (see `observe`)."""
        store = self.store

        def evidence(_path: Path, report: Report) -> list[str]:
            if store is None:
                return []
            return [f"{f.id}: {c}" for f in report.findings for c in store.changes(self.ref(f.id), f)]

        return observe(self.root, paths, reports=[self.report], carry=carry, evidence=evidence)


# --- inspection (the read-only CLI) ----------------------------------------------------------
@dataclass(frozen=True)
class FindingInspection:
    finding: Finding
    location: LocationCheck
    state: str
    violations: tuple[Violation, ...]
    tamper: tuple[Tamper, ...] = ()

    def to_json(self) -> dict[str, object]:
        f = self.finding
        return {
            "id": f.id,
            "severity": f.severity,
            "title": f.title,
            "line": f.number,
            "needs_decision": f.needs_decision,
            "fields": [{"name": x.name, "value": x.value, "line": x.number} for x in f.fields],
            "location": self.location.to_json(),
            "state": self.state,
            "violations": [v.to_json() for v in self.violations],
            "tamper": tamper_json(self.tamper),
        }


def _plan_paths(finding: Finding, root: Path | str) -> list[Violation]:
    """A plan check whose path leaves the tree would be refused at verification: say so now."""
    line = finding.field(PLAN)
    if line is None:
        return []
    try:
        checks = parse_plan(line.value)
    except CheckError:
        return []  # already a grammar violation
    out = []
    for check in checks:
        try:
            operands = check.path_operands(exists_in(root))
        except CheckError as error:
            out.append(Violation(line.number, f"check `{check.text}`: {error}"))
            continue
        for path in operands:
            verdict = contain(root, path)
            if not verdict.ok:
                out.append(
                    Violation(line.number, f"check `{check.text}`: path {path} refused ({verdict.why})")
                )
    return out


def inspect_finding(
    finding: Finding,
    root: Path | str,
    *,
    changes: Callable[[Finding], list[str]] | None = None,
    tamper: Callable[[Finding], list[Tamper]] | None = None,
) -> FindingInspection:
    """Everything `findings check` says about one finding; `changes` or `tamper` (dispatchq's
    store compared with the report) add tamper evidence. A `Fix: auto` finding with no
    decision is in state "auto": nobody is asked about it."""
    violations = list(finding_violations(finding))
    violations.extend(_plan_paths(finding, root))
    if changes is not None:
        violations.extend(Violation(finding.number, msg) for msg in changes(finding))
    evidence = tuple(tamper(finding)) if tamper is not None else ()
    state = finding_state(finding)
    if state == "undecided" and not finding.needs_decision:
        state = "auto"
    return FindingInspection(
        finding,
        check_location(root, finding.value(LOCATION)),
        state,
        tuple(violations),
        evidence,
    )
