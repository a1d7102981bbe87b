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
import datetime as dt
import fcntl
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, TypeVar

from dispatchq.errors import CheckError, GrammarError, ReportError, UserError
from dispatchq.findings.plans import parse_plan

T = TypeVar("T")

STATUS = "Status"
DECISION = "Decision"
RETIRED = "Decision-retired"
PLAN = "Verification-plan"
PIN = "Decision-pin"
DISPATCH = "Dispatch"
VERIFICATION = "Verification"
LOCATION = "Location"
FIX = "Fix"

# Every line the loop writes; the closed list the block hash and the dispatch copy key on.
LOOP_FIELDS = (STATUS, DECISION, RETIRED, PLAN, PIN, DISPATCH, VERIFICATION, LOCATION)
SINGLETONS = tuple(f for f in LOOP_FIELDS if f != RETIRED)
# Below the Status slot, new loop-written lines are placed in this order.
CLUSTER = (RETIRED, DECISION, PLAN, PIN, DISPATCH, VERIFICATION)

OUTCOMES = ("failed", "interrupted, unverified", "dispatched, unverified")
DASH = " — "

_FIELD = re.compile(r"^\*\*(?P<name>[A-Za-z][A-Za-z0-9 _-]*?):\*\*(?P<value>.*)$")
_ATX = re.compile(r"^ {0,3}(?P<level>#{1,6})(?:[ \t]|$)")
_FINDING = re.compile(r"^### \[(?P<severity>[^\]\s]+)\] (?P<id>[A-Za-z0-9][A-Za-z0-9._-]*): ?(?P<title>.*)$")
_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})")
_DATE = r"\d{4}-\d{2}-\d{2}"


def one_physical_line(value: str) -> bool:
    """True when no reader (ours, `grep`, `str.splitlines`) could see two lines in it."""
    return "\n" not in value and "\r" not in value and len(value.splitlines()) <= 1


def _require_one_line(name: str, value: str) -> None:
    if not one_physical_line(value):
        raise GrammarError(f"**{name}:** content would need two lines; rewrite or split it, never wrap")


def _parse_date(text: str, what: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise GrammarError(f"{what}: {text!r} is not a YYYY-MM-DD date") from None


# --- line grammars ----------------------------------------------------------------------
@dataclass(frozen=True)
class Attempt:
    number: int
    outcome: str

    def format(self) -> str:
        return f"attempt {self.number}: {self.outcome}"


@dataclass(frozen=True)
class Decision:
    """`<A|B|other> — <resolution> [<who>, <YYYY-MM-DD>; attempt N: <outcome>…]`.

    The resolution is what a fixer is sent; it lies between the first ` — ` and the
    final ` [`, so an em dash or a bracket inside it is harmless.
    """

    label: Literal["A", "B", "other"]
    resolution: str
    who: str
    date: dt.date
    attempts: tuple[Attempt, ...] = ()

    def __post_init__(self) -> None:
        if self.label not in ("A", "B", "other"):
            raise GrammarError(f"decision label must be A, B or other, not {self.label!r}")
        if not self.resolution.strip() or self.resolution != self.resolution.strip():
            raise GrammarError("decision resolution must be non-empty with no surrounding spaces")
        if not re.fullmatch(r"[^\[\],;\s](?:[^\[\],;]*[^\[\],;\s])?", self.who):
            raise GrammarError(f"decision author {self.who!r} must not contain [ ] , or ;")
        for index, attempt in enumerate(self.attempts, 1):
            if attempt.number != index:
                raise GrammarError(f"attempt entries must be numbered 1..n; found attempt {attempt.number}")
            if attempt.outcome not in OUTCOMES:
                raise GrammarError(f"attempt outcome {attempt.outcome!r} is not one of {', '.join(OUTCOMES)}")
        _require_one_line(DECISION, self.format())

    def format(self) -> str:
        book = [f"{self.who}, {self.date.isoformat()}", *(a.format() for a in self.attempts)]
        return f"{self.label}{DASH}{self.resolution} [{'; '.join(book)}]"

    def with_attempt(self, outcome: str) -> Decision:
        return replace(self, attempts=(*self.attempts, Attempt(len(self.attempts) + 1, outcome)))

    @classmethod
    def parse(cls, value: str) -> Decision:
        m = re.match(r"^(A|B|other) — ", value)
        if not m:
            raise GrammarError("decision must start with `A — `, `B — ` or `other — `")
        rest = value[m.end() :]
        cut = rest.rfind(" [")
        if cut < 0 or not rest.endswith("]"):
            raise GrammarError("decision must end with a bracketed `[<who>, <date>; …]` field")
        resolution, book = rest[:cut], rest[cut + 2 : -1].split("; ")
        who, sep, date = book[0].rpartition(", ")
        if not sep:
            raise GrammarError("decision bookkeeping must start with `<who>, <YYYY-MM-DD>`")
        attempts = []
        for entry in book[1:]:
            am = re.fullmatch(r"attempt (\d+): (.+)", entry)
            if not am:
                raise GrammarError(f"decision bookkeeping entry {entry!r} is not `attempt N: <outcome>`")
            attempts.append(Attempt(int(am[1]), am[2]))
        return cls(m[1], resolution, who, _parse_date(date, "decision date"), tuple(attempts))  # type: ignore[arg-type]


STATUS_FIXED = "✅ Fixed"
STATUS_PARTIAL = "⚠️ Partially Fixed"
STATUS_REJECTED = "🚫 Rejected"
# Matched by prefix, never by whole line: the tail is not always ours.
_TERMINAL_PREFIXES = {
    "fixed": ("✅ Fixed",),
    "partially-fixed": ("⚠️ Partially Fixed", "⚠ Partially Fixed"),
    "rejected": ("🚫 Rejected",),
}


def terminal_kind(value: str) -> str | None:
    """`fixed`, `partially-fixed` or `rejected` for a terminal status value, else None."""
    for kind, prefixes in _TERMINAL_PREFIXES.items():
        if value.startswith(prefixes):
            return kind
    return None


@dataclass(frozen=True)
class Status:
    """`<icon> <text> (YYYY-MM-DD)[ — <reason>]`; a reason only for 🚫 Rejected."""

    label: str
    date: dt.date
    reason: str | None = None

    def __post_init__(self) -> None:
        rejected = terminal_kind(self.label) == "rejected"
        if self.reason is not None and not rejected:
            raise GrammarError("only a 🚫 Rejected status carries a ` — <reason>` tail")
        if rejected and not (self.reason or "").strip():
            raise GrammarError("a 🚫 Rejected status needs a one-line reason")
        if not re.fullmatch(r"\S+ \S.*", self.label) or self.label != self.label.strip():
            raise GrammarError(f"status {self.label!r} must be `<icon> <text>`")
        _require_one_line(STATUS, self.format())

    @property
    def kind(self) -> str | None:
        return terminal_kind(self.label)

    def format(self) -> str:
        tail = f"{DASH}{self.reason}" if self.reason is not None else ""
        return f"{self.label} ({self.date.isoformat()}){tail}"

    @classmethod
    def fixed(cls, today: dt.date) -> Status:
        return cls(STATUS_FIXED, today)

    @classmethod
    def partially_fixed(cls, today: dt.date) -> Status:
        return cls(STATUS_PARTIAL, today)

    @classmethod
    def rejected(cls, today: dt.date, reason: str) -> Status:
        return cls(STATUS_REJECTED, today, " ".join(reason.split()))

    @classmethod
    def parse(cls, value: str) -> Status:
        m = re.fullmatch(rf"(?P<label>\S+ .+?) \((?P<date>{_DATE})\)(?: — (?P<reason>.+))?", value)
        if not m:
            raise GrammarError("status must be `<icon> <text> (YYYY-MM-DD)[ — <reason>]`")
        return cls(m["label"], _parse_date(m["date"], "status date"), m["reason"])


@dataclass(frozen=True)
class DispatchMarker:
    """`attempt <N> dispatched <YYYY-MM-DD>`, written before the fixer is spawned."""

    attempt: int
    date: dt.date

    def __post_init__(self) -> None:
        if self.attempt < 1:
            raise GrammarError("dispatch attempt numbers start at 1")

    def format(self) -> str:
        return f"attempt {self.attempt} dispatched {self.date.isoformat()}"

    @classmethod
    def parse(cls, value: str) -> DispatchMarker:
        m = re.fullmatch(rf"attempt (\d+) dispatched ({_DATE})", value)
        if not m:
            raise GrammarError("dispatch marker must be `attempt <N> dispatched <YYYY-MM-DD>`")
        return cls(int(m[1]), _parse_date(m[2], "dispatch date"))


@dataclass(frozen=True)
class VerificationLine:
    """`hard|advisory|unavailable — <checks run>[; <N> not run: <check>; …]`.

    The not-run suffix appears at most once and everything after it is the list of
    checks that did not run, never a further check that ran.
    """

    level: Literal["hard", "advisory", "unavailable"]
    summary: str
    not_run: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.level not in ("hard", "advisory", "unavailable"):
            raise GrammarError(f"verification level {self.level!r} is not hard, advisory or unavailable")
        if not self.summary or "; " in self.summary:
            raise GrammarError("verification summary must be non-empty and carry no '; '")
        if self.not_run and self.level == "hard":
            raise GrammarError("a verification with checks not run is never `hard`")
        _require_one_line(VERIFICATION, self.format())

    def format(self) -> str:
        tail = f"; {len(self.not_run)} not run: {'; '.join(self.not_run)}" if self.not_run else ""
        return f"{self.level}{DASH}{self.summary}{tail}"

    @classmethod
    def parse(cls, value: str) -> VerificationLine:
        m = re.fullmatch(r"(hard|advisory|unavailable) — (.+)", value)
        if not m:
            raise GrammarError("verification must be `hard|advisory|unavailable — <checks run>`")
        summary, sep, tail = m[2].partition("; ")
        not_run: tuple[str, ...] = ()
        if sep:
            nm = re.fullmatch(r"(\d+) not run: (.+)", tail)
            if not nm:
                raise GrammarError("verification suffix must be `; <N> not run: <check text>`")
            not_run = tuple(nm[2].split("; "))
            if int(nm[1]) != len(not_run):
                raise GrammarError(f"verification says {nm[1]} not run but lists {len(not_run)}")
        return cls(m[1], summary, not_run)  # type: ignore[arg-type]


PinValue = str  # a blob hash, "absent" or "unpinnable"
_HASH = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


@dataclass(frozen=True)
class PinEntry:
    """One pinned path: its observed value and its role (`edit` or `ref`)."""

    path: str
    value: PinValue
    role: Literal["edit", "ref"]

    def __post_init__(self) -> None:
        if self.role not in ("edit", "ref"):
            raise GrammarError(f"pin role must be edit or ref, not {self.role!r}")
        if self.value not in ("absent", "unpinnable") and not _HASH.match(self.value):
            raise GrammarError(f"pin value {self.value!r} is not a blob hash, absent or unpinnable")
        if not self.path or " | " in self.path or any(ch.isspace() for ch in self.path):
            raise GrammarError(f"pin path {self.path!r} is empty or holds whitespace")

    def format(self) -> str:
        return f"{self.path}={self.value}:{self.role}"


@dataclass(frozen=True)
class Pin:
    """`block=<sha256> | <path>=<value>:<edit|ref> | …`."""

    block: str
    entries: tuple[PinEntry, ...] = ()

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9a-f]{64}", self.block):
            raise GrammarError("pin block hash must be 64 lowercase hex digits")

    def format(self) -> str:
        return " | ".join([f"block={self.block}", *(e.format() for e in self.entries)])

    def entry(self, path: str) -> PinEntry | None:
        return next((e for e in self.entries if e.path == path), None)

    @classmethod
    def parse(cls, value: str) -> Pin:
        parts = value.split(" | ")
        if not parts[0].startswith("block="):
            raise GrammarError("pin must start with `block=<sha256>`")
        entries = []
        for part in parts[1:]:
            rest, colon, role = part.rpartition(":")
            path, eq, val = rest.rpartition("=")
            if not colon or not eq:
                raise GrammarError(f"pin entry {part!r} is not `<path>=<value>:<edit|ref>`")
            entries.append(PinEntry(path, val, role))  # type: ignore[arg-type]
        return cls(parts[0][len("block=") :], tuple(entries))


# --- Location -----------------------------------------------------------------------------
_PATH_LINE = re.compile(r"^(?P<path>[^\s`]+?):(?P<line>\d+)(?:-(?P<end>\d+))?$")
_WAS_TAIL = re.compile(r"\s*\(was: .*\)\s*$")
_EXTENDED = re.compile(r"^`(?P<token>[^`]*)`(?P<tail> \(was: .*\))$")


def location_token(value: str | None) -> str | None:
    """The one token the read rule looks at: the first backticked token, else the first
    whitespace-delimited token, after dropping a trailing `(was: …)` parenthetical. Never
    the whole line: whatever the `(was: …)` tail holds is the reviewer's original, never
    the location."""
    if value is None:
        return None
    value = _WAS_TAIL.sub("", value)
    m = re.search(r"`([^`]*)`", value)
    if m:
        return m[1]
    words = value.split()
    return words[0] if words else None


def parse_path_line(token: str | None) -> tuple[str, int, int] | None:
    """`path:line` or `path:line-range` as (path, first, last); None otherwise."""
    if token is None:
        return None
    m = _PATH_LINE.match(token)
    if not m:
        return None
    first = int(m["line"])
    last = int(m["end"]) if m["end"] else first
    if first < 1 or last < first:
        return None
    return m["path"], first, last


def _code_span(text: str) -> str:
    if "`" not in text:
        return f"`{text}`"
    return f"`` {text} ``"


def format_location(new: str, previous: str | None) -> str:
    """The extended form `` `path:line` (was: `original`) ``.

    Over a line that already has a `(was: …)` tail only the token is replaced, so the
    reviewer's original is kept exactly and a second `was` is never nested.
    """
    if parse_path_line(new) is None:
        raise GrammarError(f"location {new!r} is not path:line")
    if previous is not None:
        m = _EXTENDED.match(previous.strip())
        if m:
            return f"`{new}`{m['tail']}"
        original = previous.strip()
        single = re.fullmatch(r"`([^`]+)`", original)
        if single:
            original = single[1]
        if original == new:
            return f"`{new}`"
    else:
        original = "—"
    if not original:
        original = "—"
    value = f"`{new}` (was: {_code_span(original)})"
    _require_one_line(LOCATION, value)
    return value


def location_problems(value: str) -> list[str]:
    """Grammar problems of a Location value (not usability: that needs the tree)."""
    if value.count("(was:") > 1:
        return ["**Location:** nests a second `(was: …)`"]
    return []


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
        _require_one_line(name, value)
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
def lock_path(report: Path) -> Path:
    """The sidecar lock file. Kept, never deleted: deleting it would break the lock."""
    real = Path(os.path.realpath(report))
    return real.with_name(f".{real.name}.dispatchq-lock")


def is_loop_own(path: Path, report: Path) -> bool:
    """True for the lock file and the temp files of a report's atomic writes."""
    real = Path(os.path.realpath(report))
    name = path.name
    return path.parent == real.parent and (
        name == lock_path(report).name or (name.startswith(f".{real.name}.") and name.endswith(".tmp"))
    )


@contextlib.contextmanager
def locked(report: Path) -> Iterator[None]:
    """Hold the report's exclusive lock (blocking) for the duration."""
    fd = os.open(lock_path(report), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
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
) -> T:
    """Apply `change` to one finding under the report's lock, re-reading first.

    The change sees the report as it is on disk now, not as the caller last read it, so
    two writers never lose each other's lines. Nothing is written when nothing changed.
    """
    path = Path(path)
    with locked(path):
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
