"""What a decision was made against: where a finding points, its pin, and who moved it.

A person's decision is only worth replaying if it still applies. This module holds the
rules that say so, on top of `dispatchq.findings.grammar.lines` (the line grammars):

- which checkout and which finding a stored fact belongs to (`repo_id`, `finding_ref`);
- where a finding points (the Location read rule and containment);
- how tokens from a document become command operands (sanitisation: an allow-list,
  rejected never escaped);
- the pin: a block hash and one git blob hash per pinned file, and how it is computed;
- whether a pin mismatch was caused by dispatchq itself (attribution through the
  dispatch log).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dispatchq.errors import GitUnavailable, UnsafeToken, UserError
from dispatchq.findings.evidence.boundary import contain
from dispatchq.findings.grammar.lines import (
    LOCATION,
    PIN,
    Pin,
    PinEntry,
    location_token,
    parse_path_line,
)
from dispatchq.findings.grammar.plans import syntactic_path_problem
from dispatchq.findings.grammar.report import (
    Finding,
    Report,
    is_loop_line,
    read_report,
)
from dispatchq.findings.grammar.tokens import LINE_SUFFIX, path_tokens, sanitize
from dispatchq.git import runner as git

__all__ = [
    "ABSENT",
    "UNPINNABLE",
    "DispatchLogEntry",
    "LocationCheck",
    "PinComparison",
    "PinResult",
    "PinSpec",
    "Role",
    "block_hash",
    "canonical_block",
    "check_location",
    "compare_pin",
    "compute_pin",
    "finding_ref",
    "git_toplevel",
    "hash_paths",
    "pin_from_disk",
    "pin_specs",
    "repo_id",
    "report_content_hash",
    "specs_for",
]


ABSENT = "absent"
UNPINNABLE = "unpinnable"
Role = Literal["edit", "ref"]


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

    @property
    def span(self) -> str | None:
        """`path:line` or `path:line-line`: the whole place, as an analyst is told it (the
        report's Location line keeps only the start, `target`)."""
        if not self.usable:
            return None
        if self.end in (None, self.line):
            return f"{self.path}:{self.line}"
        return f"{self.path}:{self.line}-{self.end}"

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


# --- rule 8: the pinned set -----------------------------------------------------------------
_DEICTIC = re.compile(r"\b(?:here|there|this (?:file|line|location|spot|place|mention|reference))\b", re.I)


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

    Roles come from the analyst (`roles`, by path). Without one: a token carrying a
    `:<line>` is `:edit` (a place the resolution changes), a bare path is `:ref`; the
    Target is `:edit` when the resolution names it with a line, names no path at all, or
    refers to it deictically ("remove the mention here"), and `:ref` otherwise.
    """
    roles = dict(roles or {})
    tokens = path_tokens(resolution)
    wanted: list[tuple[str, bool]] = []
    if target:
        wanted.append((target, True))
    wanted.extend((token, False) for token in tokens)
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
            path, rejected = LINE_SUFFIX.sub("", token) or token, str(error)
        given = roles.get(path)
        if given in ("edit", "ref"):
            role: Role = given  # type: ignore[assignment]
        elif is_target:
            # The Target is where the finding points, not necessarily where this resolution
            # writes: `:edit` only when the resolution names no path at all (or names it
            # with a line below); otherwise a fix that edits only the Target, while its
            # resolution says to write elsewhere, would be graded on the wrong file.
            role = "ref" if tokens else "edit"
        elif LINE_SUFFIX.search(token):
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
    merged: dict[str, str] = {e.path: e.role for e in existing.entries} if existing else {}
    merged.update(roles or {})
    location = check_location(root, finding.value(LOCATION))
    return pin_specs(location.path if location.usable else None, decision.resolution, roles=merged)


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
