"""What a dispatch did, and how it is graded: two observations of the tree, four cases.

A fixer's work is only worth grading from what the tree shows, never from what the
session says. So dispatchq observes the tree before and after (every pinned path's git
blob hash, everything `git status` lists, the report minus the lines dispatchq owns) and
grades the dispatch in four cases, in order: fixed, partially fixed, failed, unverified.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dispatchq.errors import GitUnavailable, UserError
from dispatchq.findings.evidence.boundary import PlanResult
from dispatchq.findings.evidence.pins import (
    ABSENT,
    UNPINNABLE,
    DispatchLogEntry,
    PinSpec,
    hash_paths,
    report_content_hash,
)
from dispatchq.findings.grammar.lines import (
    PinEntry,
    Status,
    VerificationLine,
)
from dispatchq.findings.grammar.report import (
    Report,
    is_loop_own,
    read_report,
)
from dispatchq.git import runner as git

__all__ = [
    "GIT_INTERNAL",
    "Case",
    "Grade",
    "Observation",
    "changed_paths",
    "expected_set",
    "git_internal",
    "grade",
    "observe",
    "porcelain",
    "rebase",
    "verification_line",
]


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


GIT_INTERNAL = ".git/"  # the prefix of a watched path inside the repository's git directory
_GIT_WATCHED_DIRS = ("hooks", "info")


def _git_dir(root: Path) -> Path | None:
    """The directory holding the repository's config and hooks (a worktree's common dir)."""
    dot = root / ".git"
    if dot.is_dir():
        return dot
    if not dot.is_file():
        return None
    text = dot.read_text(encoding="utf-8", errors="replace").strip()
    if not text.startswith("gitdir:"):
        return None
    gitdir = Path(root, text.removeprefix("gitdir:").strip())
    common = gitdir / "commondir"
    if common.is_file():
        gitdir = gitdir / common.read_text(encoding="utf-8", errors="replace").strip()
    return Path(os.path.realpath(gitdir))


def _content(path: Path) -> str:
    """A watched git file's identity: its bytes and whether it is executable, or a link's target."""
    try:
        info = path.lstat()
        if os.path.islink(path):
            return "link:" + hashlib.sha256(os.readlink(path).encode("utf-8", "replace")).hexdigest()
        data = path.read_bytes()
    except OSError as error:
        return f"!{error.strerror or error}"
    mode = "x" if info.st_mode & 0o111 else "-"
    return f"file{mode}:" + hashlib.sha256(data).hexdigest()


def git_internal(root: Path | str, known: Iterable[str] = ()) -> dict[str, str]:
    """`.git/config` and every file under `.git/hooks/` and `.git/info/`, by content.

    Porcelain never lists them, yet a write there runs code at the person's next git
    command (a hook, `core.fsmonitor`, an alias): a fixer's change to any of them is an
    out-of-scope write that fails the attempt. `known` paths (seen before) that are gone
    now read `absent`, so a deletion is a change too. Files are read, never executed.
    """
    gitdir = _git_dir(Path(root))
    if gitdir is None:
        return {}
    files = [gitdir / "config"]
    for name in _GIT_WATCHED_DIRS:
        for folder, dirs, names in os.walk(gitdir / name, followlinks=False):
            dirs.sort()
            files.extend(Path(folder, n) for n in sorted(names))
            files.extend(Path(folder, d) for d in dirs if os.path.islink(Path(folder, d)))
    out: dict[str, str] = {}
    for path in files:
        if not os.path.lexists(path):
            continue
        rel = os.path.relpath(path, gitdir).replace(os.sep, "/")
        out[GIT_INTERNAL + rel] = _content(path)
    for seen in known:
        if seen.startswith(GIT_INTERNAL) and seen not in out:
            out[seen] = ABSENT
    return out


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

    wanted = [p for p in wanted if not p.startswith(GIT_INTERNAL) and not loop_own(p)]
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
    ordered.update(git_internal(root, carry.values if carry else ()))
    return Observation(ordered, frozenset(listed) if listed is not None else None, status_error)


def rebase(before: Observation, since: Iterable[DispatchLogEntry]) -> Observation:
    """A before-observation brought forward past the dispatches logged since it was taken.

    An attempt whose outcome was unknown (its dispatchq was killed) is verified later, after
    other fixers may have run on the same tree. What they wrote is logged; counted from the
    stale observation, it would be read as this attempt's work (a false out-of-scope write)
    and break the log's before→after chain (a false "changed since the decision"). Each
    logged after-value replaces the stale one, so only what happened since the last logged
    dispatch is this attempt's.
    """
    values = dict(before.values)
    for entry in since:
        values.update(entry.after)
    return Observation(values, before.listed, before.status_error)


def changed_paths(before: Observation, after: Observation) -> list[str]:
    """Paths that appeared, disappeared or changed content between two observations.

    A path only the after-observation knows was not listed before (so it was clean or
    absent) and is listed now: that is a change too.
    """
    out = []
    watched_git = any(p.startswith(GIT_INTERNAL) for p in before.values)
    for path in dict.fromkeys([*before.values, *after.values]):
        if path in before.values and path in after.values:
            if before.values[path] != after.values[path]:
                out.append(path)
        elif path in after.values and after.listed is not None and path in after.listed:
            out.append(path)
        elif path.startswith(GIT_INTERNAL) and path in after.values and watched_git:
            out.append(path)  # a new hook (or info file): porcelain never lists those
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
    level: Literal["hard", "advisory"] = "advisory" if not_run or plan.soft else "hard"
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
    git_writes = [p for p in out_of_scope if p.startswith(GIT_INTERNAL)]
    if git_writes:
        # A write into .git/ (config, a hook) can run code at the next git command: never fixed.
        case: Case = "failed"
        status: Status | None = None
        outcome: str | None = "failed"
    elif plan is not None and plan.passed:
        case = "fixed"
        status = Status.fixed(today)
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
