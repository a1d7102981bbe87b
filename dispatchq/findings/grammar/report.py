"""The Markdown findings report: lossless parsing, line grammars and locked writes.

A report belongs to people and to other tools; dispatchq owns only the lines it writes
(the *loop-written* lines). So the file is kept as a list of physical lines with their
own terminators, and a write touches only the lines it means to: every other byte,
CRLF endings, a missing final newline and non-ASCII text included, comes back as it
was read.

A finding is a heading `### [SEVERITY] ID: title` and everything up to the next heading
of level 1 to 3 (a `####` inside a finding belongs to it; headings inside fenced code
do not count). Fields are `**Name:** value` lines.

Every write takes an exclusive `flock` on a sidecar lock file, re-reads the report,
applies the change to the finding by its id, and replaces the file atomically (a temp
file in the same directory, `os.replace`, the original mode kept). A sweep in a
terminal and a worker grading in the background therefore never lose each other's
lines, and a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from dispatchq.errors import CheckError, GrammarError, ReportError, UserError
from dispatchq.findings.grammar.lines import (
    CLUSTER,
    DECISION,
    DISPATCH,
    FIX,
    LOCATION,
    LOOP_FIELDS,
    PIN,
    PLAN,
    RETIRED,
    SINGLETONS,
    STATUS,
    VERIFICATION,
    Decision,
    DispatchMarker,
    Pin,
    Status,
    VerificationLine,
    location_problems,
    require_one_line,
    terminal_kind,
)
from dispatchq.findings.grammar.plans import parse_plan

__all__ = [
    "FieldLine",
    "Finding",
    "FindingEditor",
    "Hooks",
    "Line",
    "Report",
    "Violation",
    "atomic_write",
    "fenced_indexes",
    "field_of",
    "finding_violations",
    "is_loop_line",
    "is_loop_own",
    "lock_path",
    "locked",
    "read_report",
    "split_lines",
    "update_finding",
]

T = TypeVar("T")


_FIELD = re.compile(r"^\*\*(?P<name>[A-Za-z][A-Za-z0-9 _-]*?):\*\*(?P<value>.*)$")
_ATX = re.compile(r"^ {0,3}(?P<level>#{1,6})(?:[ \t]|$)")
_FINDING = re.compile(r"^### \[(?P<severity>[^\]\s]+)\] (?P<id>[A-Za-z0-9][A-Za-z0-9._-]*): ?(?P<title>.*)$")
_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})")


# --- parsing ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    """One physical line: its text without terminator, and the terminator itself."""

    text: str
    ending: str

    @property
    def raw(self) -> str:
        return self.text + self.ending


def split_lines(text: str) -> list[Line]:
    lines = []
    for piece in _split_keep(text):
        if piece.endswith("\r\n"):
            lines.append(Line(piece[:-2], "\r\n"))
        elif piece.endswith("\n"):
            lines.append(Line(piece[:-1], "\n"))
        else:
            lines.append(Line(piece, ""))
    return lines


def _split_keep(text: str) -> list[str]:
    # Only "\n" ends a line: a lone "\r" or U+2028 in someone's prose stays prose.
    pieces = text.split("\n")
    out = [p + "\n" for p in pieces[:-1]]
    if pieces[-1]:
        out.append(pieces[-1])
    return out


def _scan_fences(lines: Sequence[Line]) -> tuple[set[int], int | None]:
    fence: str | None = None
    opened = 0
    fenced: set[int] = set()
    for index, line in enumerate(lines):
        m = _FENCE.match(line.text.lstrip("\ufeff") if index == 0 else line.text)
        if fence is not None:
            fenced.add(index)
            if m and m["fence"][0] == fence[0] and len(m["fence"]) >= len(fence):
                fence = None
        elif m:
            fence, opened = m["fence"], index
            fenced.add(index)
    return fenced, (opened if fence is not None else None)


def fenced_indexes(lines: Sequence[Line]) -> set[int]:
    """Indexes of lines inside fenced code (fences included): not headings, not fields."""
    return _scan_fences(lines)[0]


def _unterminated_fence(lines: Sequence[Line]) -> int | None:
    return _scan_fences(lines)[1]


def field_of(text: str) -> tuple[str, str] | None:
    """(name, value) when a line is a `**Name:** value` field line."""
    m = _FIELD.match(text)
    if not m:
        return None
    return m["name"], m["value"].strip()


def is_loop_line(text: str) -> bool:
    """True for a line starting with a loop-written field's `**<Field>:**` prefix.

    Keyed on the prefix alone, like the `grep -v` the source design pins with, so the
    block hash and the dispatch copy drop exactly the same lines.
    """
    return text.startswith(tuple(f"**{name}:**" for name in LOOP_FIELDS))


@dataclass(frozen=True)
class FieldLine:
    name: str
    value: str
    index: int  # position in the finding's lines (0 = heading)
    number: int  # 1-based line number in the report


@dataclass(frozen=True)
class Finding:
    """One finding block: its heading line and every line up to the next heading."""

    id: str
    severity: str
    title: str
    start: int  # index of the heading in the report's lines
    lines: tuple[Line, ...]
    fenced: frozenset[int] = frozenset()  # block indexes inside fenced code

    @property
    def number(self) -> int:
        return self.start + 1

    @property
    def end(self) -> int:
        return self.start + len(self.lines)

    @property
    def heading(self) -> str:
        return self.lines[0].text

    @property
    def text(self) -> str:
        return "".join(line.raw for line in self.lines)

    @property
    def fields(self) -> tuple[FieldLine, ...]:
        out = []
        for index, line in enumerate(self.lines[1:], 1):
            if index in self.fenced:
                continue
            parsed = field_of(line.text)
            if parsed:
                out.append(FieldLine(parsed[0], parsed[1], index, self.start + index + 1))
        return tuple(out)

    def all(self, name: str) -> list[FieldLine]:
        return [f for f in self.fields if f.name == name]

    def field(self, name: str) -> FieldLine | None:
        found = self.all(name)
        return found[0] if found else None

    def value(self, name: str) -> str | None:
        found = self.field(name)
        return found.value if found else None

    @property
    def needs_decision(self) -> bool:
        return (self.value(FIX) or "auto").strip().lower() == "needs-decision"

    @property
    def terminal(self) -> str | None:
        """The terminal status kind, matched by prefix; a terminal finding is never selected."""
        value = self.value(STATUS)
        return terminal_kind(value) if value is not None else None

    def decision(self) -> Decision | None:
        value = self.value(DECISION)
        if value is None:
            return None
        try:
            return Decision.parse(value)
        except GrammarError:
            return None

    def pin(self) -> Pin | None:
        value = self.value(PIN)
        if value is None:
            return None
        try:
            return Pin.parse(value)
        except GrammarError:
            return None

    def dispatch_marker(self) -> DispatchMarker | None:
        value = self.value(DISPATCH)
        if value is None:
            return None
        try:
            return DispatchMarker.parse(value)
        except GrammarError:
            return None

    def retired(self) -> list[Decision]:
        out = []
        for f in self.all(RETIRED):
            with contextlib.suppress(GrammarError):
                out.append(Decision.parse(f.value))
        return out

    def loop_lines(self) -> list[tuple[str, str]]:
        """(field, value) of every loop-written line, in block order."""
        return [(f.name, f.value) for f in self.fields if f.name in LOOP_FIELDS]


@dataclass(frozen=True)
class Violation:
    line: int
    message: str

    def to_json(self) -> dict[str, object]:
        return {"line": self.line, "message": self.message}


@dataclass(frozen=True)
class Report:
    """A parsed report. `render()` of an unedited report gives back the exact bytes."""

    lines: tuple[Line, ...]
    findings: tuple[Finding, ...]
    problems: tuple[Violation, ...] = ()

    @classmethod
    def parse(cls, data: bytes | str, *, path: str | Path = "<report>") -> Report:
        if isinstance(data, bytes):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as error:
                at_line = data[: error.start].count(b"\n") + 1
                raise ReportError(path, [(at_line, f"not valid UTF-8 (byte {error.start})")]) from None
        else:
            text = data
        lines = split_lines(text)
        findings: list[Finding] = []
        problems: list[Violation] = []
        fenced = fenced_indexes(lines)
        boundaries: list[tuple[int, re.Match[str] | None]] = []
        for index, line in enumerate(lines):
            if index in fenced:
                continue
            body = line.text.lstrip("\ufeff") if index == 0 else line.text
            hm = _ATX.match(body)
            if hm and len(hm["level"]) <= 3:
                m = _FINDING.match(body)
                if m is None and body.startswith("### ["):
                    problems.append(
                        Violation(index + 1, "malformed finding heading (`### [SEVERITY] ID: title`)")
                    )
                boundaries.append((index, m))
        unterminated = _unterminated_fence(lines)
        if unterminated is not None:
            problems.append(Violation(unterminated + 1, "fenced code block never closed"))
        seen: dict[str, int] = {}
        for position, (index, m) in enumerate(boundaries):
            if m is None:
                continue
            end = boundaries[position + 1][0] if position + 1 < len(boundaries) else len(lines)
            local = frozenset(i - index for i in fenced if index <= i < end)
            finding = Finding(
                m["id"], m["severity"], m["title"].strip(), index, tuple(lines[index:end]), local
            )
            if finding.id in seen:
                problems.append(
                    Violation(
                        index + 1, f"duplicate finding id {finding.id} (first at line {seen[finding.id]})"
                    )
                )
            else:
                seen[finding.id] = index + 1
            findings.append(finding)
        return cls(tuple(lines), tuple(findings), tuple(sorted(problems, key=lambda v: v.line)))

    def render(self) -> bytes:
        return "".join(line.raw for line in self.lines).encode("utf-8")

    def finding(self, finding_id: str) -> Finding:
        found = [f for f in self.findings if f.id == finding_id]
        if not found:
            raise UserError(f"no finding {finding_id} in the report")
        if len(found) > 1:
            where = ", ".join(str(f.number) for f in found)
            raise UserError(f"finding id {finding_id} appears more than once (lines {where})")
        return found[0]

    def eol(self) -> str:
        """The terminator new lines get: CRLF in a CRLF file, LF otherwise."""
        endings = [line.ending for line in self.lines if line.ending]
        if endings and endings.count("\r\n") > len(endings) / 2:
            return "\r\n"
        return "\n"

    def with_block(self, finding: Finding, lines: Sequence[Line]) -> Report:
        new = (*self.lines[: finding.start], *lines, *self.lines[finding.end :])
        return Report.parse("".join(line.raw for line in new))


# --- grammar violations ------------------------------------------------------------------
def finding_violations(finding: Finding) -> list[Violation]:
    """Every grammar violation in a finding, each with its report line number."""
    out: list[Violation] = []
    fields = finding.fields
    for name in SINGLETONS:
        found = [f for f in fields if f.name == name]
        for extra in found[1:]:
            out.append(
                Violation(extra.number, f"second live **{name}:** line (first at line {found[0].number})")
            )
    status = finding.field(STATUS)
    if status is not None:
        first = next((i for i, line in enumerate(finding.lines[1:], 1) if line.text.strip()), None)
        if first != status.index:
            out.append(
                Violation(status.number, "**Status:** must be the first non-blank line under the heading")
            )
    for f in fields:
        if f.name not in LOOP_FIELDS:
            continue
        nxt = f.index + 1
        if nxt < len(finding.lines) and nxt not in finding.fenced:
            text = finding.lines[nxt].text
            if text.strip() and field_of(text) is None and not _ATX.match(text):
                out.append(
                    Violation(f.number + 1, f"continuation line after **{f.name}:** (one physical line each)")
                )
        try:
            _check_grammar(f.name, f.value)
        except (GrammarError, CheckError) as error:
            out.append(Violation(f.number, f"**{f.name}:** {error}"))
    out.extend(_consistency(finding))
    fix = finding.value(FIX)
    if fix is not None and fix.strip().lower() not in ("auto", "needs-decision"):
        line = finding.field(FIX)
        assert line is not None
        out.append(Violation(line.number, f"**Fix:** must be `auto` or `needs-decision`, not {fix!r}"))
    return sorted(out, key=lambda v: v.line)


def _check_grammar(name: str, value: str) -> None:
    if name in (DECISION, RETIRED):
        Decision.parse(value)
    elif name == STATUS:
        Status.parse(value)
    elif name == PIN:
        Pin.parse(value)
    elif name == DISPATCH:
        DispatchMarker.parse(value)
    elif name == VERIFICATION:
        VerificationLine.parse(value)
    elif name == PLAN:
        parse_plan(value)
    elif name == LOCATION:
        problems = location_problems(value)
        if problems:
            raise GrammarError(problems[0].removeprefix("**Location:** "))


def _consistency(finding: Finding) -> list[Violation]:
    out: list[Violation] = []
    decision = finding.decision()
    line = finding.field(DECISION)
    if decision is not None and line is not None:
        if len(decision.attempts) >= 2:
            out.append(Violation(line.number, "two attempt entries: the decision should have been retired"))
        if finding.terminal == "rejected":
            out.append(Violation(line.number, "a live decision under a 🚫 Rejected status"))
    marker = finding.dispatch_marker()
    mline = finding.field(DISPATCH)
    if marker is not None and mline is not None:
        if decision is None and line is None and not finding.all(RETIRED):
            out.append(Violation(mline.number, "**Dispatch:** marker without a decision"))
        if decision is not None and marker.attempt > len(decision.attempts) + 1:
            out.append(
                Violation(
                    mline.number,
                    f"**Dispatch:** attempt {marker.attempt} but the decision records "
                    f"{len(decision.attempts)} attempt(s)",
                )
            )
        anchor = finding.field(PIN) or line
        if anchor is not None and mline.index < anchor.index:
            out.append(Violation(mline.number, f"**Dispatch:** must sit below **{anchor.name}:**"))
    return out


# --- editing ------------------------------------------------------------------------------
class FindingEditor:
    """In-place edits to one finding's lines; only the lines touched change."""

    def __init__(self, finding: Finding, eol: str) -> None:
        self.finding = finding
        self.lines: list[Line] = list(finding.lines)
        self.eol = eol
        self.changed = False

    def _indexes(self, name: str) -> list[int]:
        fenced = fenced_indexes(self.lines)
        out = []
        for index, line in enumerate(self.lines[1:], 1):
            if index in fenced:
                continue
            parsed = field_of(line.text)
            if parsed and parsed[0] == name:
                out.append(index)
        return out

    def get(self, name: str) -> str | None:
        found = self._indexes(name)
        if not found:
            return None
        parsed = field_of(self.lines[found[0]].text)
        assert parsed is not None
        return parsed[1]

    def get_all(self, name: str) -> list[str]:
        out = []
        for index in self._indexes(name):
            parsed = field_of(self.lines[index].text)
            assert parsed is not None
            out.append(parsed[1])
        return out

    def _live(self, name: str) -> int | None:
        found = self._indexes(name)
        if len(found) > 1 and name != RETIRED:
            numbers = ", ".join(str(self.finding.start + i + 1) for i in found)
            raise UserError(
                f"{self.finding.id}: more than one **{name}:** line (lines {numbers}); fix by hand"
            )
        return found[0] if found else None

    def _insert(self, index: int, text: str) -> None:
        # Inserting after a final line with no terminator: it gets one, the new line
        # becomes the unterminated last line, so the file still ends the way it did.
        previous = self.lines[index - 1]
        if previous.ending == "":
            self.lines[index - 1] = Line(previous.text, self.eol)
            self.lines.insert(index, Line(text, ""))
        else:
            self.lines.insert(index, Line(text, self.eol))
        self.changed = True

    def _slot(self, name: str) -> int:
        """Where a new line of `name` goes: Status right under the heading; the cluster
        below it in CLUSTER order; anything else after the last non-blank line."""
        if name == STATUS:
            return 1
        status = self._live(STATUS)
        after = status if status is not None else 0
        if name in CLUSTER:
            for earlier in CLUSTER[: CLUSTER.index(name) + 1]:
                found = self._indexes(earlier)
                if found:
                    after = max(after, found[-1])
            return after + 1
        last = max((i for i, line in enumerate(self.lines) if line.text.strip()), default=0)
        return last + 1

    def set(self, name: str, value: str) -> None:
        """Write `**name:** value`: replace the live line in place, or insert it in its slot."""
        require_one_line(name, value)
        value = value.strip()
        if name in LOOP_FIELDS:
            _check_grammar(name, value)
        text = f"**{name}:** {value}"
        index = self._live(name) if name != RETIRED else None
        if index is not None:
            if self.lines[index].text != text:
                self.lines[index] = Line(text, self.lines[index].ending)
                self.changed = True
            return
        self._insert(self._slot(name), text)

    def remove(self, name: str) -> str | None:
        """Delete the live line of `name`; returns its value, None when there was none."""
        index = self._live(name)
        if index is None:
            return None
        parsed = field_of(self.lines[index].text)
        assert parsed is not None
        removed = self.lines.pop(index)
        if removed.ending == "" and index > 0:
            self.lines[index - 1] = Line(self.lines[index - 1].text, "")
        self.changed = True
        return parsed[1]

    def retire_decision(self) -> str | None:
        """Rewrite the live `**Decision:**` line to `**Decision-retired:**` in place."""
        index = self._live(DECISION)
        if index is None:
            return None
        parsed = field_of(self.lines[index].text)
        assert parsed is not None
        self.lines[index] = Line(f"**{RETIRED}:** {parsed[1]}", self.lines[index].ending)
        self.changed = True
        return parsed[1]

    def snapshot(self) -> Finding:
        """The finding as it now stands (line numbers as if written)."""
        report = Report.parse("".join(line.raw for line in self.lines))
        base = report.findings[0]
        return replace(base, start=self.finding.start)


# --- locked, atomic writes ------------------------------------------------------------------
def lock_path(report: Path, lock_dir: Path | None = None) -> Path:
    """The report's lock file. Kept, never deleted: deleting it would break the lock.

    With `lock_dir` (dispatchq's data dir, as the gate passes it) it lives there, named by a
    hash of the report's physical path, so nothing is left beside the report inside the
    repository (where `git status` shows it and it is easily committed). Without one it is
    the sidecar `.<report>.dispatchq-lock`.
    """
    real = Path(os.path.realpath(report))
    if lock_dir is not None:
        digest = hashlib.sha256(str(real).encode("utf-8", "surrogateescape")).hexdigest()[:32]
        return Path(lock_dir) / f"{digest}.lock"
    return real.with_name(f".{real.name}.dispatchq-lock")


def is_loop_own(path: Path, report: Path) -> bool:
    """True for the lock file and the temp files of a report's atomic writes."""
    real = Path(os.path.realpath(report))
    name = path.name
    return path.parent == real.parent and (
        name == lock_path(report).name or (name.startswith(f".{real.name}.") and name.endswith(".tmp"))
    )


@contextlib.contextmanager
def locked(report: Path, lock_dir: Path | None = None) -> Iterator[None]:
    """Hold the report's exclusive lock (blocking) for the duration."""
    if lock_dir is not None:
        Path(lock_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(lock_path(report, lock_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` in one rename, keeping its permission bits."""
    real = Path(os.path.realpath(path))
    mode = stat.S_IMODE(real.stat().st_mode) if real.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(real.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_report(path: Path) -> Report:
    """Parse the report at `path`; a missing or unreadable file is a user error."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such report") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a report") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read the report: {error.strerror}") from None
    return Report.parse(data, path=path)


@dataclass
class Hooks:
    """Called under the lock: `before` sees the fresh finding (and may refuse by raising);
    `after` sees the finding as written, so a store copy can be taken atomically with it."""

    before: Callable[[Finding], None] | None = None
    after: Callable[[Finding], None] | None = None


def update_finding(
    path: Path,
    finding_id: str,
    change: Callable[[FindingEditor], T],
    *,
    hooks: Hooks | None = None,
    lock_dir: Path | None = None,
) -> T:
    """Apply `change` to one finding under the report's lock, re-reading first.

    The change sees the report as it is on disk now, not as the caller last read it, so
    two writers never lose each other's lines. Nothing is written when nothing changed.
    """
    path = Path(path)
    with locked(path, lock_dir):
        report = read_report(path)
        finding = report.finding(finding_id)
        if hooks and hooks.before:
            hooks.before(finding)
        editor = FindingEditor(finding, report.eol())
        result = change(editor)
        if editor.changed:
            new = report.with_block(finding, editor.lines)
            atomic_write(path, new.render())
            if hooks and hooks.after:
                hooks.after(new.finding(finding_id))
        return result
