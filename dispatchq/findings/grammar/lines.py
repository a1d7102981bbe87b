"""The grammars of the lines dispatchq writes into a findings report, and the Location rule.

Each loop-written field (`**Decision:**`, `**Status:**`, `**Decision-pin:**`, `**Dispatch:**`,
`**Verification:**`, `**Location:**`…) has one grammar here: a dataclass that parses the
value and formats it back, refusing anything it would not have written. Pure text in and
out; `dispatchq.findings.grammar.report` reads and writes the file these lines live in.

A value must fit on one physical line: a reader (ours, `grep`, `str.splitlines`) that saw
two lines in it would read a different field, so such content is refused, never wrapped.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, replace
from typing import Literal

from dispatchq.errors import GrammarError

__all__ = [
    "CLUSTER",
    "DASH",
    "DECISION",
    "DISPATCH",
    "FIX",
    "LOCATION",
    "LOOP_FIELDS",
    "OUTCOMES",
    "PIN",
    "PLAN",
    "RETIRED",
    "SINGLETONS",
    "STATUS",
    "STATUS_FIXED",
    "STATUS_PARTIAL",
    "STATUS_REJECTED",
    "VERIFICATION",
    "Attempt",
    "Decision",
    "DispatchMarker",
    "Pin",
    "PinEntry",
    "PinValue",
    "Status",
    "VerificationLine",
    "format_location",
    "location_problems",
    "location_token",
    "one_physical_line",
    "parse_path_line",
    "require_one_line",
    "terminal_kind",
]

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
_DATE = r"\d{4}-\d{2}-\d{2}"


def one_physical_line(value: str) -> bool:
    """True when no reader (ours, `grep`, `str.splitlines`) could see two lines in it."""
    return "\n" not in value and "\r" not in value and len(value.splitlines()) <= 1


def require_one_line(name: str, value: str) -> None:
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
        require_one_line(DECISION, self.format())

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
        require_one_line(STATUS, self.format())

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
        require_one_line(VERIFICATION, self.format())

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
    require_one_line(LOCATION, value)
    return value


def location_problems(value: str) -> list[str]:
    """Grammar problems of a Location value (not usability: that needs the tree)."""
    if value.count("(was:") > 1:
        return ["**Location:** nests a second `(was: …)`"]
    return []
