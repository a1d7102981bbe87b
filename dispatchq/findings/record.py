"""The decision record: what a finding's loop-written lines mean, and how they are kept honest.

A person's decision is only worth replaying if it still applies, and a fixer's work is
only worth grading from what the tree shows. This module holds those rules on top of
`dispatchq.findings.report` (the file format) and `dispatchq.findings.boundary` (the plan and its boundary):

- where a finding points (the Location read rule and containment);
- what a decision was made against (the pin: a block hash and one git blob hash per
  pinned file) and how tokens from a document become command operands (sanitisation:
  an allow-list, rejected never escaped, argv lists with `--`, no shell anywhere);
- what a dispatch did (two observations of the tree) and how it is graded (four cases,
  in order), when a decision retires, stalls or is superseded;
- whether a pin mismatch was caused by dispatchq itself (the dispatch log);
- what a fixer is shown (the dispatch copy) and whether anyone else touched the lines
  dispatchq wrote (tamper evidence: dispatchq's own copy in Redis).

Pure functions take parsed findings and plain mappings; the few that touch git, files or
Redis say so in their names or take the client as an argument.
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import json
import os
import posixpath
import re
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from dispatchq import git
from dispatchq.errors import CheckError, GitUnavailable, TamperError, UnsafeToken, UserError
from dispatchq.findings.boundary import PlanResult, contain, exists_in
from dispatchq.findings.plans import Check, format_plan, parse_plan, syntactic_path_problem
from dispatchq.findings.report import (
    DECISION,
    DISPATCH,
    LOCATION,
    PIN,
    PLAN,
    RETIRED,
    STATUS,
    VERIFICATION,
    Decision,
    DispatchMarker,
    Finding,
    FindingEditor,
    Hooks,
    Line,
    Pin,
    PinEntry,
    Report,
    Status,
    VerificationLine,
    Violation,
    field_of,
    finding_violations,
    format_location,
    is_loop_line,
    is_loop_own,
    location_token,
    parse_path_line,
    read_report,
    update_finding,
)
from dispatchq.storage.findings import FindingsStore

if TYPE_CHECKING:
    import redis

T = TypeVar("T")

ABSENT = "absent"
UNPINNABLE = "unpinnable"
Role = Literal["edit", "ref"]

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


# --- the repository --------------------------------------------------------------------
def git_toplevel(start: Path | str) -> Path:
    """The repository root holding `start`, resolved physically."""
    try:
        done = git.run(start, ["rev-parse", "--show-toplevel"])
    except FileNotFoundError:
        raise UserError("git is not installed") from None
    except NotADirectoryError:
        raise UserError(f"{start}: not a directory") from None
    if done.returncode != 0:
        raise UserError(f"{start}: not inside a git repository")
    return Path(os.path.realpath(done.stdout.decode("utf-8", "surrogateescape").strip()))


def repo_id(root: Path | str) -> str:
    """The store's name for one checkout: its host and physical path, hashed.

    The host is part of it because many machines may share one Redis and two of them
    can hold different clones at the same path.
    """
    text = f"{socket.gethostname()}\0{os.path.realpath(root)}"
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def finding_ref(report: Path | str, root: Path | str, finding_id: str) -> str:
    """The store's name for one finding: the same id may appear in two reports."""
    real = os.path.realpath(report)
    root_real = os.path.realpath(root)
    rel = os.path.relpath(real, root_real) if real.startswith(root_real + os.sep) else real
    return f"{rel}#{finding_id}"


# --- rules 1-2: the Location --------------------------------------------------------------
@dataclass(frozen=True)
class LocationCheck:
    """Whether a finding's Location can be used, and if not, why.

    `why` is one of `no location`, `unparseable`, `absolute`, `..`, `symlink escape`,
    `outside the root`, `git internals`, `missing` or `not a file`. A path that fails
    containment is location-less, never a "missing file".
    """

    usable: bool
    token: str | None
    path: str | None
    line: int | None
    end: int | None
    why: str | None

    @property
    def target(self) -> str | None:
        """`path:line` as written into the extended form and handed to a fixer."""
        return f"{self.path}:{self.line}" if self.usable else None

    def to_json(self) -> dict[str, object]:
        return {"usable": self.usable, "path": self.path, "line": self.line, "why": self.why}


def check_location(root: Path | str, value: str | None) -> LocationCheck:
    """Apply the read rule, then containment, then existence, in that order."""
    if value is None:
        return LocationCheck(False, None, None, None, None, "no location")
    token = location_token(value)
    parsed = parse_path_line(token)
    if parsed is None:
        return LocationCheck(False, token, None, None, None, "unparseable")
    path, first, last = parsed
    verdict = contain(root, path)
    if not verdict.ok or verdict.resolved is None:
        return LocationCheck(False, token, path, first, last, verdict.why)
    if not os.path.exists(verdict.resolved):
        return LocationCheck(False, token, verdict.path, first, last, "missing")
    if not os.path.isfile(verdict.resolved):
        return LocationCheck(False, token, verdict.path, first, last, "not a file")
    return LocationCheck(True, token, verdict.path, first, last, None)


# --- rule 9: sanitisation; rule 8: the pinned set ------------------------------------------
_ALLOWED = re.compile(r"^[A-Za-z0-9._/+@,-]+$")
_LINE_SUFFIX = re.compile(r":\d+(?:-\d+)?$")
_LEAD = "([{<\"'`*_"
_TRAIL = ".,;:!?)]}>\"'`*_"
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,9}$")
_NOT_PATHS = {"e.g", "i.e", "etc", "vs", "cf", "and/or", "either/or", "a/b", "yes/no", "on/off", "n/a"}
_DEICTIC = re.compile(r"\b(?:here|there|this (?:file|line|location|spot|place|mention|reference))\b", re.I)


def sanitize(token: str) -> str:
    """The path a document-derived token names, if it passes the allow-list.

    The `:<line>` suffix is stripped first; then every character must be one of
    `A–Z a–z 0–9 . _ / - + @ ,` and the path must not start with `-`. A token that fails
    is rejected by name, never repaired: escaping moves the problem into the quoting.
    """
    path = _LINE_SUFFIX.sub("", token)
    if not path:
        raise UnsafeToken(f"{token!r}: empty path")
    if path.startswith("-"):
        raise UnsafeToken(f"{token!r}: a leading '-' could be read as an option")
    bad = sorted({ch for ch in path if not _ALLOWED.match(ch)})
    if bad:
        raise UnsafeToken(f"{token!r}: {''.join(bad)!r} outside the allow-list")
    return path


def _strip_punctuation(raw: str) -> str:
    token = raw.lstrip(_LEAD)
    while token and token[-1] in _TRAIL:
        close = token[-1]
        opener = {")": "(", "]": "[", "}": "{", ">": "<"}.get(close)
        if opener and token.count(opener) >= token.count(close):
            break  # `$(id)` keeps its own parenthesis: the token is judged whole
        token = token[:-1]
    return token


def path_tokens(text: str) -> list[str]:
    """Path tokens in prose, recognised by their shape alone (never by the filesystem).

    A whitespace-delimited token holding a `/` or ending in a file extension, with an
    optional `:<line>` or `:<line>-<line>`, surrounding punctuation and backticks
    stripped. The filesystem is not consulted because `absent` must be pinnable.
    """
    out = []
    for raw in text.split():
        token = _strip_punctuation(raw)
        if not token or "://" in token:
            continue
        base = _LINE_SUFFIX.sub("", token)
        if base.lower() in _NOT_PATHS or base.lower().rstrip(".") in _NOT_PATHS:
            continue
        if "/" in base or _EXTENSION.search(base):
            out.append(token)
    return out


@dataclass(frozen=True)
class PinSpec:
    """A path to pin, before anything is hashed. `rejected` says why it is unpinnable."""

    path: str
    role: Role
    rejected: str | None = None


def pin_specs(
    target: str | None,
    resolution: str,
    *,
    roles: Mapping[str, str] | None = None,
) -> list[PinSpec]:
    """The pinned set: the Target, then every path token of the resolution text, in order.

    Roles come from the analyst (`roles`, by path). Without one: the Target is `:edit`,
    a token carrying a `:<line>` is `:edit` (a place the resolution changes), a bare path
    is `:ref`. A deictic reference ("remove the mention here") makes the Target `:edit`.
    """
    roles = dict(roles or {})
    wanted: list[tuple[str, bool]] = []
    if target:
        wanted.append((target, True))
    wanted.extend((token, False) for token in path_tokens(resolution))
    deictic = bool(_DEICTIC.search(resolution))
    specs: dict[str, PinSpec] = {}
    for token, is_target in wanted:
        rejected = None
        try:
            path = sanitize(token)
            problem = syntactic_path_problem(path)
            if problem:
                rejected = problem
            else:
                path = posixpath.normpath(path)
        except UnsafeToken as error:
            path, rejected = _LINE_SUFFIX.sub("", token) or token, str(error)
        given = roles.get(path)
        if given in ("edit", "ref"):
            role: Role = given  # type: ignore[assignment]
        elif is_target or _LINE_SUFFIX.search(token):
            role = "edit"
        else:
            role = "ref"
        if is_target and deictic:
            role = "edit"
        previous = specs.get(path)
        if previous is not None:
            if role == "edit" and previous.role == "ref" and given is None:
                specs[path] = PinSpec(path, "edit", previous.rejected)
            continue
        specs[path] = PinSpec(path, role, rejected)
    return list(specs.values())


# --- hashing -------------------------------------------------------------------------------
def canonical_block(finding: Finding) -> str:
    """The block text the pin hashes: loop-written lines dropped by their prefix, trailing
    whitespace stripped from every line, exactly one trailing newline."""
    kept = [line.text.rstrip() for line in finding.lines if not is_loop_line(line.text)]
    return "\n".join(kept).rstrip("\n") + "\n"


def block_hash(finding: Finding) -> str:
    return hashlib.sha256(canonical_block(finding).encode("utf-8")).hexdigest()


def report_content_hash(report: Report) -> str:
    """A report's content minus every loop-written line: it changes only when someone other
    than dispatchq edits what dispatchq does not own."""
    kept = "".join(line.raw for line in report.lines if not is_loop_line(line.text))
    return hashlib.sha256(kept.encode("utf-8")).hexdigest()


def hash_paths(root: Path | str, paths: Iterable[str], *, timeout: float = 60.0) -> dict[str, str]:
    """Working-tree git blob hash per path (`git hash-object --no-filters -- <paths>`).

    Values are a blob hash, `absent`, or `!<why>` when no observation could be taken (a
    symlink out of the tree, a directory). `--no-filters` hashes the bytes on disk and
    never runs a clean filter the repository configures. Ignored, assume-unchanged and
    skip-worktree files are hashed like any other: only the working tree is read.
    Raises GitUnavailable when git cannot be run at all.
    """
    root = Path(root)
    out: dict[str, str] = {}
    queue: list[str] = []
    for path in dict.fromkeys(paths):
        verdict = contain(root, path)
        if not verdict.ok or verdict.resolved is None:
            out[path] = f"!{verdict.why}"
        elif not os.path.lexists(verdict.resolved):
            out[path] = ABSENT
        elif not os.path.isfile(verdict.resolved):
            out[path] = "!not a regular file"
        else:
            queue.append(path)
    for start in range(0, len(queue), 200):
        chunk = queue[start : start + 200]
        hashes = git.hash_objects(root, chunk, timeout=timeout)
        if hashes is not None:
            out.update(zip(chunk, hashes, strict=True))
            continue
        for path in chunk:  # one of them changed under us: find out which, one at a time
            single = git.hash_objects(root, [path], timeout=timeout)
            if single is not None:
                out[path] = single[0]
            elif not os.path.lexists(root / path):
                out[path] = ABSENT
            else:
                out[path] = "!git hash-object failed"
    return out


# --- rule 8: pins --------------------------------------------------------------------------
@dataclass(frozen=True)
class PinResult:
    """A computed pin, or why none could be written (the finding is then `unpinned`)."""

    pin: Pin | None
    unpinnable: tuple[tuple[str, str], ...] = ()
    why_unpinned: str | None = None

    @property
    def line(self) -> str | None:
        return f"**{PIN}:** {self.pin.format()}" if self.pin else None

    def to_json(self) -> dict[str, object]:
        return {
            "pin": self.pin.format() if self.pin else None,
            "block": self.pin.block if self.pin else None,
            "entries": [
                {"path": e.path, "value": e.value, "role": e.role}
                for e in (self.pin.entries if self.pin else ())
            ],
            "unpinnable": [{"path": p, "why": w} for p, w in self.unpinnable],
            "unpinned": self.why_unpinned,
        }


def compute_pin(finding: Finding, specs: Sequence[PinSpec], root: Path | str) -> PinResult:
    """The pin for a finding as it stands (cut from the file on disk by the caller)."""
    try:
        values = hash_paths(root, [s.path for s in specs if s.rejected is None])
    except GitUnavailable as error:
        return PinResult(None, why_unpinned=str(error))
    entries = []
    unpinnable = []
    for spec in specs:
        value = values.get(spec.path, f"!{spec.rejected}")
        if spec.rejected is not None or value.startswith("!"):
            unpinnable.append((spec.path, spec.rejected or value[1:]))
            value = UNPINNABLE
        entries.append(PinEntry(spec.path, value, spec.role))
    return PinResult(Pin(block_hash(finding), tuple(entries)), tuple(unpinnable))


def pin_from_disk(report: Path, finding_id: str, specs: Sequence[PinSpec], root: Path | str) -> PinResult:
    """Compute a pin from the report as it is on disk now (never from a remembered copy)."""
    return compute_pin(read_report(report).finding(finding_id), specs, root)


def specs_for(finding: Finding, root: Path | str, roles: Mapping[str, str] | None = None) -> list[PinSpec]:
    """The pinned set for a finding's live decision; roles default to those its pin records."""
    decision = finding.decision()
    if decision is None:
        raise UserError(f"{finding.id} has no live decision")
    existing = finding.pin()
    merged = {e.path: e.role for e in existing.entries} if existing else {}
    merged.update(roles or {})
    location = check_location(root, finding.value(LOCATION))
    return pin_specs(location.path if location.usable else None, decision.resolution, roles=merged)


# --- rule 10: observations ---------------------------------------------------------------
@dataclass(frozen=True)
class Observation:
    """One observation of the tree around a dispatch.

    `values` maps paths to a blob hash, `absent`, `report:<sha256>` for a report file
    (its content minus loop-written lines), or `!<why>` where no observation could be
    taken. `listed` is what `git status --porcelain` listed (None when it failed).
    """

    values: Mapping[str, str]
    listed: frozenset[str] | None
    status_error: str | None = None

    @property
    def failed(self) -> dict[str, str]:
        return {p: v[1:] for p, v in self.values.items() if v.startswith("!")}

    def to_json(self) -> dict[str, object]:
        return {
            "values": dict(self.values),
            "listed": sorted(self.listed) if self.listed is not None else None,
            "status_error": self.status_error,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Observation:
        listed = data.get("listed")
        values = data.get("values") or {}
        error = data.get("status_error")
        if not isinstance(values, Mapping):
            raise ValueError("observation values must be a mapping")
        return cls(
            {str(k): str(v) for k, v in values.items()},
            frozenset(str(p) for p in listed) if isinstance(listed, list) else None,
            error if isinstance(error, str) else None,
        )


def porcelain(root: Path | str) -> list[str]:
    """Paths `git status --porcelain` lists (untracked files one by one, renames split)."""
    done = git.run(root, ["status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames"])
    if done.returncode != 0:
        raise GitUnavailable(done.stderr.decode("utf-8", "replace").strip() or "git status failed")
    out = []
    for entry in done.stdout.decode("utf-8", "surrogateescape").split("\0"):
        if len(entry) > 3:
            out.append(entry[3:].rstrip("/"))
    return out


def observe(
    root: Path | str,
    paths: Iterable[str],
    *,
    reports: Iterable[Path] = (),
    carry: Observation | None = None,
    evidence: Callable[[Path, Report], Iterable[str]] | None = None,
) -> Observation:
    """Take one observation: the pinned `paths` (pass every live pin's paths, so the
    dispatch log can explain other findings' pins too), everything porcelain lists, and
    everything `carry` (the before-observation) saw, so a path that went clean is seen.

    A report in the tree is observed by its content minus loop-written lines, plus
    `evidence` (the tamper findings against dispatchq's copy): dispatchq's own writes
    during a dispatch change neither, while anyone else's write to the report, a
    forged loop line included, changes one of them.
    """
    root = Path(root)
    root_real = os.path.realpath(root)
    report_paths = [Path(os.path.realpath(r)) for r in reports]
    report_rel = {
        os.path.relpath(r, root_real).replace(os.sep, "/"): r
        for r in report_paths
        if str(r).startswith(root_real + os.sep)
    }
    listed: list[str] | None
    status_error = None
    try:
        listed = porcelain(root)
    except FileNotFoundError:
        listed, status_error = None, "git is not installed"
    except GitUnavailable as error:
        listed, status_error = None, str(error)
    wanted = list(dict.fromkeys([*paths, *(listed or []), *(carry.values if carry else [])]))

    def loop_own(rel: str) -> bool:
        full = Path(root_real, rel)
        return any(is_loop_own(full, r) for r in report_paths)

    wanted = [p for p in wanted if not loop_own(p)]
    values: dict[str, str] = {}
    to_hash = []
    for path in wanted:
        if path in report_rel:
            try:
                parsed = read_report(report_rel[path])
            except UserError as error:
                values[path] = f"!{error}"
                continue
            digest = report_content_hash(parsed)
            extra = sorted(evidence(report_rel[path], parsed)) if evidence else []
            if extra:
                digest = hashlib.sha256("\0".join([digest, *extra]).encode("utf-8")).hexdigest()
            values[path] = "report:" + digest
        else:
            to_hash.append(path)
    try:
        values.update(hash_paths(root, to_hash))
    except GitUnavailable as error:
        values.update({p: f"!{error}" for p in to_hash})
    ordered = {p: values[p] for p in wanted}
    return Observation(ordered, frozenset(listed) if listed is not None else None, status_error)


def changed_paths(before: Observation, after: Observation) -> list[str]:
    """Paths that appeared, disappeared or changed content between two observations.

    A path only the after-observation knows was not listed before (so it was clean or
    absent) and is listed now: that is a change too.
    """
    out = []
    for path in dict.fromkeys([*before.values, *after.values]):
        if path in before.values and path in after.values:
            if before.values[path] != after.values[path]:
                out.append(path)
        elif path in after.values and after.listed is not None and path in after.listed:
            out.append(path)
    return out


# --- rule 10: grading -------------------------------------------------------------------------
Case = Literal["fixed", "partially-fixed", "failed", "unverified"]


@dataclass(frozen=True)
class Grade:
    """How one dispatch is graded, and everything the run summary must disclose."""

    case: Case
    attempt: int
    status: Status | None
    outcome: str | None
    verification: VerificationLine
    changed: tuple[str, ...] = ()
    out_of_scope: tuple[str, ...] = ()
    unobservable: bool = False
    coverage_warning: bool = False
    advisory: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "case": self.case,
            "attempt": self.attempt,
            "status": self.status.format() if self.status else None,
            "outcome": self.outcome,
            "verification": self.verification.format(),
            "changed": list(self.changed),
            "out_of_scope": list(self.out_of_scope),
            "unobservable": self.unobservable,
            "coverage_warning": self.coverage_warning,
            "advisory": self.advisory,
        }


def verification_line(plan: PlanResult | None, *, why_none: str = "no check ran") -> VerificationLine:
    """`hard` when every check ran and none is soft; `advisory` when a soft check ran or
    any check did not run; `unavailable` when nothing ran."""
    if plan is None or not plan.results:
        return VerificationLine("unavailable", why_none)
    not_run = tuple(r.check.text for r in plan.not_run)
    ran = plan.ran
    if not ran:
        return VerificationLine("unavailable", "0 run", not_run)
    passed = sum(1 for r in ran if r.passed)
    level = "advisory" if not_run or plan.soft else "hard"
    return VerificationLine(level, f"{len(ran)} run, {passed} passed", not_run)


def expected_set(entries: Iterable[PinEntry | PinSpec]) -> list[str]:
    """The `:edit` entries that were observed: never `:ref`, never `unpinnable`."""
    out = []
    for entry in entries:
        if entry.role != "edit":
            continue
        if isinstance(entry, PinEntry) and entry.value == UNPINNABLE:
            continue
        if isinstance(entry, PinSpec) and entry.rejected is not None:
            continue
        out.append(entry.path)
    return out


def grade(
    *,
    entries: Sequence[PinEntry | PinSpec],
    before: Observation | None,
    after: Observation | None,
    plan: PlanResult | None,
    errored: bool,
    attempt: int,
    today: dt.date,
) -> Grade:
    """Grade one dispatch from the tree and the plan's raw output, never from narration.

    In order: (1) the plan's raw output passes → ✅ Fixed; (2) an observable change in the
    expected set and a plan that ran and does not pass → ⚠️ Partially Fixed; (3) the
    dispatch errored, or nothing in the expected set changed → `attempt N: failed`;
    (4) otherwise (no check ran, or the tree could not be observed) →
    `attempt N: dispatched, unverified`. Cases 3 and 4 write no Status: a terminal status
    would freeze the finding out of every later run.
    """
    expected = expected_set(entries)
    unobservable = before is None or after is None or not expected
    if before is not None and after is not None:
        unobservable = unobservable or any(
            before.values.get(p, "!").startswith("!") or after.values.get(p, "!").startswith("!")
            for p in expected
        )
    changed = changed_paths(before, after) if before is not None and after is not None else []
    in_scope = tuple(p for p in changed if p in expected)
    out_of_scope = tuple(p for p in changed if p not in expected)
    verification = verification_line(plan, why_none="no plan" if plan is None else "no check ran")
    ran = bool(plan and plan.ran)
    coverage = bool(plan and plan.ran and plan.not_run)
    advisory = verification.level == "advisory"
    if plan is not None and plan.passed:
        case: Case = "fixed"
        status: Status | None = Status.fixed(today)
        outcome = None
    elif not unobservable and in_scope and ran:
        case, status, outcome = "partially-fixed", Status.partially_fixed(today), None
    elif errored or (not unobservable and not in_scope):
        case, status, outcome = "failed", None, "failed"
    else:
        case, status, outcome = "unverified", None, "dispatched, unverified"
    return Grade(
        case=case,
        attempt=attempt,
        status=status,
        outcome=outcome,
        verification=verification,
        changed=in_scope,
        out_of_scope=out_of_scope,
        unobservable=unobservable,
        coverage_warning=coverage,
        advisory=advisory,
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


# --- rule 12: attribution ----------------------------------------------------------------------
@dataclass(frozen=True)
class DispatchLogEntry:
    """One fixer dispatch: the before and after values of every path it observed."""

    position: int
    finding: str
    attempt: int
    at: str
    before: Mapping[str, str]
    after: Mapping[str, str]


@dataclass(frozen=True)
class PinComparison:
    """`match`, `attributable` (re-pin silently) or `unattributable` (set aside)."""

    verdict: Literal["match", "attributable", "unattributable"]
    changed: tuple[str, ...] = ()
    unexplained: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"verdict": self.verdict, "changed": list(self.changed), "unexplained": list(self.unexplained)}


def compare_pin(
    pin: Pin,
    current_block: str,
    current: Mapping[str, str],
    log: Sequence[DispatchLogEntry],
) -> PinComparison:
    """Compare a pin with the tree now, explaining changes by logged dispatches.

    `log` holds the dispatches made after the pin was written, oldest first. A changed
    path is explained when its value runs from the pinned one to the current one through
    those dispatches' before→after pairs with no gap in between (a change between two
    dispatches was made by someone else). A changed block is never explained: no fixer
    is dispatched to edit a finding's text.
    """
    changed: list[str] = []
    unexplained: list[str] = []
    if current_block != pin.block:
        changed.append("block")
        unexplained.append("block")
    for entry in pin.entries:
        if entry.value == UNPINNABLE:
            continue
        now = current.get(entry.path)
        if now == entry.value:
            continue
        changed.append(entry.path)
        if now is None or now.startswith("!") or not _explained(entry.path, entry.value, now, log):
            unexplained.append(entry.path)
    if not changed:
        return PinComparison("match")
    verdict: Literal["attributable", "unattributable"] = "unattributable" if unexplained else "attributable"
    return PinComparison(verdict, tuple(changed), tuple(unexplained))


def _explained(path: str, pinned: str, now: str, log: Sequence[DispatchLogEntry]) -> bool:
    value = pinned
    for entry in log:
        if path not in entry.before or path not in entry.after:
            if path in entry.after and path not in entry.before:
                return False  # seen only after: where it started is unknown
            continue
        if entry.before[path] != value:
            return False
        value = entry.after[path]
    return value == now


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
@dataclass
class RecordStore:
    """dispatchq's own copy of what it wrote, and the dispatch log, for one checkout.

    The report may sit in the tree a fixer edits, so the report alone cannot prove who
    wrote a line. After every write dispatchq keeps the finding's loop-written lines as it
    left them; before every use it compares. A line anyone else changed is reported, and
    the finding is set aside. The Redis operations are `FindingsStore`'s.
    """

    redis: redis.Redis
    root: Path
    repo: str = field(init=False)
    store: FindingsStore = field(init=False)

    def __post_init__(self) -> None:
        self.repo = repo_id(self.root)
        self.store = FindingsStore(self.redis)

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

    def changes(self, ref: str, finding: Finding) -> list[str]:
        """Every difference between the report's loop-written lines and dispatchq's copy."""
        current = finding.loop_lines()
        stored = self.written(ref)
        if stored is None:
            # Nothing written yet: only a Location or Status can predate dispatchq.
            return [
                f"`**{n}:** {v}` was not written by dispatchq"
                for n, v in current
                if n not in (STATUS, LOCATION)
            ]
        if stored == current:
            return []
        mine = [f"**{n}:** {v}" for n, v in stored]
        theirs = [f"**{n}:** {v}" for n, v in current]
        out = []
        for op, a1, a2, b1, b2 in difflib.SequenceMatcher(a=mine, b=theirs, autojunk=False).get_opcodes():
            if op in ("delete", "replace"):
                out.extend(f"`{line}` written by dispatchq is gone" for line in mine[a1:a2])
            if op in ("insert", "replace"):
                out.extend(f"`{line}` was not written by dispatchq" for line in theirs[b1:b2])
        return out

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

    def ref(self, finding_id: str) -> str:
        return finding_ref(self.report, self.root, finding_id)

    def read(self) -> Report:
        return read_report(self.report)

    def changes(self, finding: Finding) -> list[str]:
        return self.store.changes(self.ref(finding.id), finding) if self.store else []

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

        return update_finding(self.report, finding_id, change, hooks=Hooks(before, after))

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
) -> FindingInspection:
    """Everything `findings check` says about one finding; `changes` adds tamper evidence."""
    violations = list(finding_violations(finding))
    violations.extend(_plan_paths(finding, root))
    if changes is not None:
        violations.extend(Violation(finding.number, msg) for msg in changes(finding))
    return FindingInspection(
        finding,
        check_location(root, finding.value(LOCATION)),
        finding_state(finding),
        tuple(violations),
    )
