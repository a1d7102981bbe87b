"""The findings report: lossless parsing, line grammars, slots and locked writes."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import stat
from pathlib import Path

import pytest

from dispatchq.errors import GrammarError, ReportError, UserError
from dispatchq.findings.grammar.lines import (
    DECISION,
    DISPATCH,
    LOCATION,
    PIN,
    PLAN,
    RETIRED,
    STATUS,
    VERIFICATION,
    Attempt,
    Decision,
    DispatchMarker,
    Pin,
    PinEntry,
    Status,
    VerificationLine,
    format_location,
    location_token,
    parse_path_line,
    terminal_kind,
)
from dispatchq.findings.grammar.report import (
    FindingEditor,
    Hooks,
    Report,
    finding_violations,
    is_loop_line,
    is_loop_own,
    lock_path,
    read_report,
    update_finding,
)

DAY = dt.date(2026, 8, 27)
HASH40 = "f" * 40
BLOCK = "a" * 64

SAMPLE = """# Review of the docs

Some intro. Not a finding.

### [MEDIUM] DOC-004: Doc cites a removed script
**Location:** `docs/widget.md:88`
**Fix:** needs-decision
**Problem:** The doc cites scripts/example-tool.sh, which is gone.
**Remediation:** Remove the mention.

```sh
# not a heading
### [HIGH] FAKE-1: inside a fence
**Decision:** A — not a field either [x, 2026-01-01]
```

#### Notes inside the finding
still DOC-004.

### [LOW] DOC-005: Second finding
**Location:** src/foo.ts:12
Free text.

## Appendix
not part of any finding
"""


def variants() -> list[tuple[str, bytes]]:
    unicode = SAMPLE.replace("Some intro.", "Intro — naïve café ✅ 🚫 漢字.")
    return [
        ("lf", SAMPLE.encode()),
        ("crlf", SAMPLE.replace("\n", "\r\n").encode()),
        ("no-final-newline", SAMPLE.rstrip("\n").encode()),
        ("crlf-no-final-newline", SAMPLE.rstrip("\n").replace("\n", "\r\n").encode()),
        ("unicode", unicode.encode()),
        ("bom", b"\xef\xbb\xbf" + SAMPLE.encode()),
        ("mixed-endings", SAMPLE.replace("Free text.\n", "Free text.\r\n").encode()),
        ("trailing-spaces", SAMPLE.replace("Remove the mention.", "Remove the mention.   \t").encode()),
        ("lone-cr", SAMPLE.replace("Some intro.", "Some\rintro.\u2028x").encode()),
    ]


VARIANTS = variants()


@pytest.mark.parametrize(("name", "data"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_parse_render_is_byte_identical(name: str, data: bytes) -> None:
    report = Report.parse(data)
    assert report.render() == data
    assert [f.id for f in report.findings] == ["DOC-004", "DOC-005"]


def test_blocks_end_at_the_next_heading_of_level_three_or_above() -> None:
    report = Report.parse(SAMPLE)
    first, second = report.findings
    assert first.heading == "### [MEDIUM] DOC-004: Doc cites a removed script"
    assert first.severity == "MEDIUM" and first.title == "Doc cites a removed script"
    assert "still DOC-004." in first.text  # a #### belongs to the finding
    assert "FAKE-1" in first.text  # a heading inside a fence is not a heading
    assert first.value(DECISION) is None  # nor is a field inside a fence
    assert second.text.endswith("Free text.\n\n")
    assert "Appendix" not in second.text
    assert first.number == 5
    assert first.field(LOCATION) is not None and first.field(LOCATION).number == 6  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("heading", "finding_id"),
    [
        ("### [HIGH] SEC-1: title", "SEC-1"),
        ("### [LOW] a.b_c-9: x", "a.b_c-9"),
        ("### [MEDIUM] X:", "X"),
        ("### [CRITICAL] DOC-12: a: b: c", "DOC-12"),
    ],
)
def test_finding_headings(heading: str, finding_id: str) -> None:
    report = Report.parse(f"{heading}\n**Fix:** auto\n")
    assert [f.id for f in report.findings] == [finding_id]
    assert report.problems == ()


@pytest.mark.parametrize(
    "heading",
    ["### [HIGH]SEC-1: x", "### [HIGH] SEC 1: x", "### [] A: x", "### [HIGH] -A: x", "### [HIGH] A x"],
)
def test_malformed_finding_headings_are_reported_with_their_line(heading: str) -> None:
    report = Report.parse(f"intro\n{heading}\n**Fix:** auto\n")
    assert report.findings == ()
    assert [(p.line, "malformed" in p.message) for p in report.problems] == [(2, True)]


def test_duplicate_ids_are_problems_and_writes_refuse_them(tmp_path: Path) -> None:
    text = "### [LOW] A-1: one\n\n### [LOW] A-1: two\n"
    report = Report.parse(text)
    assert [p.line for p in report.problems] == [3]
    path = tmp_path / "r.md"
    path.write_text(text)
    with pytest.raises(UserError, match="more than once"):
        update_finding(path, "A-1", lambda e: e.set(STATUS, Status.fixed(DAY).format()))
    assert path.read_text() == text


def test_undecodable_report_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "r.md"
    path.write_bytes(b"line one\nline two\nbad \xff byte\n")
    with pytest.raises(ReportError) as caught:
        read_report(path)
    assert caught.value.problems[0][0] == 3
    assert f"{path}:3:" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_missing_report_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such report"):
        read_report(tmp_path / "nope.md")


def test_unterminated_fence_is_reported() -> None:
    report = Report.parse("### [LOW] A: x\n```\n### [LOW] B: y\n")
    assert [f.id for f in report.findings] == ["A"]
    assert [p.line for p in report.problems] == [2]


# --- line grammars --------------------------------------------------------------------------
DECISIONS_OK = [
    ("A — delete the line [user, 2026-08-27]", ("A", "delete the line", "user", 0)),
    (
        "B — restore it — with an em dash [bob smith, 2026-01-02]",
        ("B", "restore it — with an em dash", "bob smith", 0),
    ),
    (
        "other — see [the docs] here [user, 2026-08-27; attempt 1: failed]",
        ("other", "see [the docs] here", "user", 1),
    ),
    (
        "A — x [u, 2026-08-27; attempt 1: interrupted, unverified; attempt 2: dispatched, unverified]",
        ("A", "x", "u", 2),
    ),
]


@pytest.mark.parametrize(("value", "parts"), DECISIONS_OK)
def test_decision_grammar(value: str, parts: tuple[str, str, str, int]) -> None:
    decision = Decision.parse(value)
    assert (decision.label, decision.resolution, decision.who, len(decision.attempts)) == parts
    assert decision.format() == value


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("C — x [u, 2026-08-27]", "must start"),
        ("A - x [u, 2026-08-27]", "must start"),
        ("A — x", "bracketed"),
        ("A — x [u 2026-08-27]", "<who>, <YYYY-MM-DD>"),
        ("A — x [u, 27-08-2026]", "YYYY-MM-DD"),
        ("A — x [u, 2026-02-30]", "YYYY-MM-DD"),
        ("A — x [u, 2026-08-27; attempt 2: failed]", "numbered 1..n"),
        ("A — x [u, 2026-08-27; attempt 1: failed; attempt 1: failed]", "numbered 1..n"),
        ("A — x [u, 2026-08-27; attempt 1: crashed]", "is not one of"),
        ("A — x [u, 2026-08-27; tried once]", "attempt N"),
        ("A —  [u, 2026-08-27]", "non-empty"),
        ("A — x [, 2026-08-27]", "author"),
    ],
)
def test_decision_grammar_violations(value: str, why: str) -> None:
    with pytest.raises(GrammarError, match=why.replace("[", r"\[").replace(".", r"\.")):
        Decision.parse(value)


def test_decision_attempts_and_one_line_rule() -> None:
    decision = Decision("A", "fix it", "user", DAY)
    assert decision.with_attempt("failed").attempts == (Attempt(1, "failed"),)
    assert (
        decision.with_attempt("failed")
        .with_attempt("dispatched, unverified")
        .format()
        .endswith("attempt 1: failed; attempt 2: dispatched, unverified]")
    )
    for bad in ("two\nlines", "cr\rinside", "sep\u2028arator", "form\x0cfeed"):
        with pytest.raises(GrammarError):
            Decision("A", bad, "user", DAY)


@pytest.mark.parametrize(
    ("value", "kind", "ok"),
    [
        ("✅ Fixed (2026-08-27)", "fixed", True),
        ("⚠️ Partially Fixed (2026-08-27)", "partially-fixed", True),
        ("⚠ Partially Fixed (2026-08-27)", "partially-fixed", True),
        ("🚫 Rejected (2026-08-27) — the script still exists", "rejected", True),
        ("⏳ In progress (2026-08-27)", None, True),
        ("🚫 Rejected (2026-08-27)", "rejected", False),
        ("✅ Fixed (2026-08-27) — because", "fixed", False),
        ("✅ Fixed", "fixed", False),
        ("Fixed(2026-08-27)", None, False),
    ],
)
def test_status_grammar_and_prefix_matching(value: str, kind: str | None, ok: bool) -> None:
    assert terminal_kind(value) == kind
    if ok:
        assert Status.parse(value).format() == value
    else:
        with pytest.raises(GrammarError):
            Status.parse(value)


def test_status_constructors() -> None:
    assert Status.fixed(DAY).format() == "✅ Fixed (2026-08-27)"
    assert Status.partially_fixed(DAY).format() == "⚠️ Partially Fixed (2026-08-27)"
    assert (
        Status.rejected(DAY, "multi\nline   reason").format()
        == "🚫 Rejected (2026-08-27) — multi line reason"
    )
    with pytest.raises(GrammarError):
        Status.rejected(DAY, "   ")


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("attempt 1 dispatched 2026-08-27", True),
        ("attempt 12 dispatched 2026-08-27", True),
        ("attempt 0 dispatched 2026-08-27", False),
        ("attempt 1 dispatched", False),
        ("attempt one dispatched 2026-08-27", False),
    ],
)
def test_dispatch_marker_grammar(value: str, ok: bool) -> None:
    if ok:
        assert DispatchMarker.parse(value).format() == value
    else:
        with pytest.raises(GrammarError):
            DispatchMarker.parse(value)


@pytest.mark.parametrize(
    ("value", "ok", "not_run"),
    [
        ("hard — 3 run, 3 passed", True, 0),
        ("advisory — 2 run, 2 passed; 1 not run: run pytest -q → contains passed", True, 1),
        ("advisory — 1 run, 1 passed; 2 not run: run a → empty; run b → empty", True, 2),
        ("unavailable — no plan", True, 0),
        ("unavailable — 0 run; 1 not run: run a → empty", True, 1),
        ("hard — 1 run; 1 not run: run a → empty", False, 0),
        ("advisory — 1 run; 2 not run: run a → empty", False, 0),
        ("advisory — 1 run; and more", False, 0),
        ("soft — 1 run", False, 0),
    ],
)
def test_verification_grammar(value: str, ok: bool, not_run: int) -> None:
    if ok:
        parsed = VerificationLine.parse(value)
        assert parsed.format() == value and len(parsed.not_run) == not_run
    else:
        with pytest.raises(GrammarError):
            VerificationLine.parse(value)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (f"block={BLOCK}", True),
        (f"block={BLOCK} | docs/a.md={HASH40}:edit | scripts/x.sh=absent:ref", True),
        (f"block={BLOCK} | docs/a.md;id=unpinnable:edit", True),
        (f"block={BLOCK} | --foo=x/y=unpinnable:ref", True),
        (f"block={BLOCK} | a:b={'0' * 64}:edit", True),
        (f"block={BLOCK[:-1]}", False),
        (f"block={BLOCK} | docs/a.md={HASH40}", False),
        (f"block={BLOCK} | docs/a.md={HASH40}:both", False),
        (f"block={BLOCK} | docs/a.md=present:edit", False),
        (f"docs/a.md={HASH40}:edit", False),
    ],
)
def test_pin_grammar(value: str, ok: bool) -> None:
    if ok:
        assert Pin.parse(value).format() == value
    else:
        with pytest.raises(GrammarError):
            Pin.parse(value)


def test_pin_entries_look_up_by_path() -> None:
    pin = Pin.parse(f"block={BLOCK} | --foo=x/y=unpinnable:ref | a.md=absent:edit")
    assert pin.entry("--foo=x/y") == PinEntry("--foo=x/y", "unpinnable", "ref")
    assert pin.entry("a.md") == PinEntry("a.md", "absent", "edit")
    assert pin.entry("b.md") is None


# --- Location ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "token"),
    [
        ("`docs/a.md:3`", "docs/a.md:3"),
        ("`docs/a.md:3` (was: `—`)", "docs/a.md:3"),
        ("— (was: `docs/a.md:3`)", "—"),
        ("src/foo.ts:12", "src/foo.ts:12"),
        ("src/foo.ts:12 in the helper", "src/foo.ts:12"),
        ("see `x.md:1` and `y.md:2`", "x.md:1"),
        ("", None),
        (None, None),
    ],
)
def test_location_read_rule_takes_one_token(value: str | None, token: str | None) -> None:
    assert location_token(value) == token


@pytest.mark.parametrize(
    ("token", "parsed"),
    [
        ("docs/a.md:3", ("docs/a.md", 3, 3)),
        ("docs/a.md:3-7", ("docs/a.md", 3, 7)),
        ("a:b.md:3", ("a:b.md", 3, 3)),
        ("unknown:0", None),
        ("docs/a.md:7-3", None),
        ("docs/a.md", None),
        ("—", None),
        ("docs/a.md:x", None),
        (None, None),
    ],
)
def test_path_line_parsing(token: str | None, parsed: tuple[str, int, int] | None) -> None:
    assert parse_path_line(token) == parsed


@pytest.mark.parametrize(
    ("new", "previous", "written"),
    [
        ("docs/a.md:3", "—", "`docs/a.md:3` (was: `—`)"),
        ("docs/a.md:3", "`unknown:0`", "`docs/a.md:3` (was: `unknown:0`)"),
        ("docs/a.md:3", "src/old.ts:12 near the top", "`docs/a.md:3` (was: `src/old.ts:12 near the top`)"),
        ("docs/a.md:9", "`docs/a.md:3` (was: `—`)", "`docs/a.md:9` (was: `—`)"),
        ("docs/a.md:9", "`docs/a.md:3` (was: `x (was: y)`)", "`docs/a.md:9` (was: `x (was: y)`)"),
        ("docs/a.md:3", "`docs/a.md:3`", "`docs/a.md:3`"),
        ("docs/a.md:3", "`a` and `b`", "`docs/a.md:3` (was: `` `a` and `b` ``)"),
        ("docs/a.md:3", None, "`docs/a.md:3` (was: `—`)"),
    ],
)
def test_location_extended_form_never_nests(new: str, previous: str | None, written: str) -> None:
    value = format_location(new, previous)
    assert value == written
    assert value.count(" (was: ") <= 1 or "(was: `x (was: y)`)" in value
    assert location_token(value) == new or new not in value


def test_location_must_be_path_line() -> None:
    with pytest.raises(GrammarError):
        format_location("docs/a.md", "—")


# --- violations ---------------------------------------------------------------------------------
def violations_of(block: str) -> list[tuple[int, str]]:
    report = Report.parse(block)
    return [(v.line, v.message) for v in finding_violations(report.findings[0])]


@pytest.mark.parametrize(
    ("block", "line", "fragment"),
    [
        ("### [L] A: x\n**Fix:** auto\n**Status:** ✅ Fixed (2026-01-01)\n", 3, "first non-blank"),
        (
            "### [L] A: x\n**Decision:** A — a [u, 2026-01-01]\n**Decision:** B — b [u, 2026-01-01]\n",
            3,
            "second live",
        ),
        ("### [L] A: x\n**Decision-pin:** block=x\n", 2, "**Decision-pin:**"),
        ("### [L] A: x\n**Decision:** A — a [u, 2026-01-01]\nand a continuation\n", 3, "continuation"),
        ("### [L] A: x\n**Verification-plan:** cat x → empty\n", 2, "unknown check kind"),
        (
            "### [L] A: x\n**Verification-plan:** grep x docs → empty;read a:1 → empty\n",
            2,
            "Verification-plan",
        ),
        ("### [L] A: x\n**Fix:** maybe\n", 2, "auto` or `needs-decision"),
        ("### [L] A: x\n**Location:** `a:1` (was: `b`) (was: `c`)\n", 2, "nests"),
        (
            "### [L] A: x\n**Decision:** A — a [u, 2026-01-01; attempt 1: failed; attempt 2: failed]\n",
            2,
            "should have been retired",
        ),
        (
            "### [L] A: x\n**Status:** 🚫 Rejected (2026-01-01) — no\n**Decision:** A — a [u, 2026-01-01]\n",
            3,
            "under a 🚫 Rejected",
        ),
        (
            "### [L] A: x\n**Dispatch:** attempt 1 dispatched 2026-01-01\n"
            "**Decision:** A — a [u, 2026-01-01]\n",
            2,
            "must sit below",
        ),
        (
            "### [L] A: x\n**Decision:** A — a [u, 2026-01-01]\n"
            "**Dispatch:** attempt 3 dispatched 2026-01-01\n",
            3,
            "attempt 3",
        ),
        ("### [L] A: x\n**Dispatch:** attempt 1 dispatched 2026-01-01\n", 2, "without a decision"),
        ("### [L] A: x\n**Status:** ✅ Fixed (2026-01-01) — why\n", 2, "only a 🚫 Rejected"),
    ],
)
def test_violations_name_their_line(block: str, line: int, fragment: str) -> None:
    found = violations_of(block)
    assert any(n == line and fragment in msg for n, msg in found), found


def test_a_well_formed_block_has_no_violations() -> None:
    block = (
        "### [L] A: x\n"
        "**Status:** ⚠️ Partially Fixed (2026-01-02)\n"
        "**Decision-retired:** A — a [u, 2026-01-01; attempt 1: failed; attempt 2: failed]\n"
        "**Decision:** B — b [u, 2026-01-01; attempt 1: failed]\n"
        "**Verification-plan:** grep -F x docs → empty; read a.md:1 → contains y (soft)\n"
        f"**Decision-pin:** block={BLOCK} | a.md={HASH40}:edit\n"
        "**Dispatch:** attempt 2 dispatched 2026-01-02\n"
        "**Verification:** advisory — 1 run, 0 passed; 1 not run: read a.md:1 → contains y (soft)\n"
        "**Location:** `a.md:1` (was: `—`)\n"
        "**Fix:** needs-decision\n"
        "\n"
        "Free text paragraph.\n"
    )
    assert violations_of(block) == []


# --- editing: slots, in-place replacement --------------------------------------------------------
def edit(block: str, *ops: tuple[str, ...]) -> str:
    report = Report.parse(block)
    editor = FindingEditor(report.findings[0], report.eol())
    for op in ops:
        getattr(editor, op[0])(*op[1:])
    return "".join(line.raw for line in report.with_block(report.findings[0], editor.lines).lines)


BASE = "### [L] A: x\n**Location:** `a.md:1`\n**Fix:** needs-decision\n\nProse.\n"
DEC = "A — fix a.md:1 [u, 2026-08-27]"


def test_status_goes_first_and_the_cluster_below_it() -> None:
    text = edit(BASE, ("set", DECISION, DEC), ("set", STATUS, "✅ Fixed (2026-08-27)"))
    assert text.splitlines()[:3] == [
        "### [L] A: x",
        "**Status:** ✅ Fixed (2026-08-27)",
        f"**Decision:** {DEC}",
    ]
    assert violations_of(text) == []


def test_cluster_lines_take_their_slots_in_order() -> None:
    pin = f"block={BLOCK} | a.md={HASH40}:edit"
    text = edit(
        BASE,
        ("set", DISPATCH, "attempt 1 dispatched 2026-08-27"),
        ("set", VERIFICATION, "hard — 1 run, 1 passed"),
        ("set", PIN, pin),
        ("set", PLAN, "grep -F x a.md → empty"),
        ("set", DECISION, DEC),
        ("set", RETIRED, "B — old [u, 2026-08-01; attempt 1: failed; attempt 2: failed]"),
    )
    names = [line.split(":**")[0].lstrip("*") for line in text.splitlines()[1:7]]
    assert names == [RETIRED, DECISION, PLAN, PIN, DISPATCH, VERIFICATION]


def test_dispatch_marker_goes_directly_beneath_the_pin() -> None:
    block = (
        f"### [L] A: x\n**Decision:** {DEC}\n**Decision-pin:** block={BLOCK}\n"
        "**Location:** `a.md:1`\nProse.\n"
    )
    text = edit(block, ("set", DISPATCH, "attempt 1 dispatched 2026-08-27"))
    lines = text.splitlines()
    assert lines[lines.index(f"**Decision-pin:** block={BLOCK}") + 1].startswith("**Dispatch:**")
    assert not lines[-1].startswith("**Dispatch:**")


def test_replacement_is_in_place_and_everything_else_is_untouched() -> None:
    block = (
        "### [L] A: x\r\n**Location:** `a.md:1`  \r\n"
        f"**Decision:** {DEC}\r\n**Problem:** café ✅\r\nProse with trailing   \r\n"
    )
    text = edit(block, ("set", DECISION, "B — other [u, 2026-08-27]"))
    before, after = block.split("\r\n"), text.split("\r\n")
    assert len(before) == len(after)
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [2]


def test_retiring_rewrites_in_place_and_keeps_history() -> None:
    block = f"### [L] A: x\n**Decision:** {DEC}\n**Location:** `a.md:1`\n"
    text = edit(block, ("retire_decision",), ("set", DECISION, "B — new [u, 2026-08-28]"))
    lines = text.splitlines()
    assert lines[1] == f"**Decision-retired:** {DEC}"
    assert lines[2] == "**Decision:** B — new [u, 2026-08-28]"
    again = edit(text, ("retire_decision",), ("set", DECISION, "A — third [u, 2026-08-29]"))
    assert [line.split(":**")[0] for line in again.splitlines()[1:4]] == [
        "**Decision-retired",
        "**Decision-retired",
        "**Decision",
    ]


def test_inserting_at_the_end_of_a_file_without_final_newline() -> None:
    text = edit("### [L] A: x", ("set", STATUS, "✅ Fixed (2026-08-27)"))
    assert text == "### [L] A: x\n**Status:** ✅ Fixed (2026-08-27)"
    crlf = edit("intro\r\n### [L] A: x", ("set", STATUS, "✅ Fixed (2026-08-27)"))
    assert crlf == "intro\r\n### [L] A: x\r\n**Status:** ✅ Fixed (2026-08-27)"


def test_removing_the_last_line_keeps_the_file_unterminated() -> None:
    text = edit(f"### [L] A: x\n**Decision:** {DEC}", ("remove", DECISION))
    assert text == "### [L] A: x"


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\u2028b", "a\u0085b", "a\x0bb"])
def test_content_that_needs_two_lines_is_rejected_never_wrapped(bad: str) -> None:
    report = Report.parse(BASE)
    editor = FindingEditor(report.findings[0], "\n")
    with pytest.raises(GrammarError, match="two lines"):
        editor.set("Remediation", bad)
    assert not editor.changed


def test_set_validates_loop_line_grammar_and_refuses_duplicates() -> None:
    report = Report.parse(BASE)
    editor = FindingEditor(report.findings[0], "\n")
    with pytest.raises(GrammarError):
        editor.set(STATUS, "✅ Fixed")
    with pytest.raises(GrammarError):
        editor.set(DISPATCH, "soon")
    dup = Report.parse(f"### [L] A: x\n**Decision:** {DEC}\n**Decision:** {DEC}\n")
    with pytest.raises(UserError, match="more than one"):
        FindingEditor(dup.findings[0], "\n").set(DECISION, DEC)


@pytest.mark.parametrize(("name", "data"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_a_write_leaves_every_unowned_byte_identical(tmp_path: Path, name: str, data: bytes) -> None:
    path = tmp_path / "report.md"
    path.write_bytes(data)
    update_finding(path, "DOC-005", lambda e: e.set(STATUS, "✅ Fixed (2026-08-27)"))
    update_finding(path, "DOC-004", lambda e: e.set(DECISION, DEC))
    after = path.read_bytes()
    reparsed = Report.parse(after)
    assert [f.id for f in reparsed.findings] == ["DOC-004", "DOC-005"]
    assert reparsed.finding("DOC-005").value(STATUS) == "✅ Fixed (2026-08-27)"
    kept = b"".join(line.raw.encode() for line in reparsed.lines if not is_loop_line(line.text))
    original = b"".join(line.raw.encode() for line in Report.parse(data).lines if not is_loop_line(line.text))
    assert kept == original
    assert Report.parse(after).render() == after
    if b"\r\n" in data and b"\n\n" not in data.replace(b"\r\n", b"\r\r"):
        assert b"**Status:** \xe2\x9c\x85 Fixed (2026-08-27)\r\n" in after


def test_update_re_reads_the_file_under_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    path.write_text(SAMPLE)
    stale = read_report(path)
    update_finding(path, "DOC-004", lambda e: e.set(DECISION, DEC))
    # A writer holding the stale parse still applies its change to the fresh file.
    assert stale.finding("DOC-004").value(DECISION) is None
    update_finding(path, "DOC-004", lambda e: e.set(STATUS, "✅ Fixed (2026-08-27)"))
    fresh = read_report(path).finding("DOC-004")
    assert fresh.value(DECISION) == DEC and fresh.value(STATUS) == "✅ Fixed (2026-08-27)"


def test_writes_are_atomic_keep_the_mode_and_follow_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real.md"
    real.write_text(SAMPLE)
    real.chmod(0o640)
    link = tmp_path / "link.md"
    link.symlink_to(real)
    inode = real.stat().st_ino
    update_finding(link, "DOC-004", lambda e: e.set(DECISION, DEC))
    assert link.is_symlink()
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert real.stat().st_ino != inode  # replaced by rename, never rewritten in place
    assert read_report(link).finding("DOC-004").value(DECISION) == DEC
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    assert lock_path(link).exists() and lock_path(link).parent == tmp_path
    assert is_loop_own(lock_path(link), link)
    assert is_loop_own(tmp_path / ".real.md.x1y2.tmp", link)
    assert not is_loop_own(tmp_path / "real.md", link)


def test_nothing_is_written_when_nothing_changes(tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    path.write_text(SAMPLE)
    inode = path.stat().st_ino
    seen: list[str] = []
    update_finding(path, "DOC-004", lambda e: e.get(LOCATION), hooks=Hooks(after=lambda f: seen.append(f.id)))
    assert path.stat().st_ino == inode and seen == []


def test_a_failing_change_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    path.write_text(SAMPLE)

    def change(editor: FindingEditor) -> None:
        editor.set(DECISION, DEC)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        update_finding(path, "DOC-004", change)
    assert path.read_text() == SAMPLE


def test_hooks_see_the_fresh_and_the_written_finding(tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    path.write_text(SAMPLE)
    seen: list[tuple[str, str | None]] = []
    hooks = Hooks(
        before=lambda f: seen.append(("before", f.value(DECISION))),
        after=lambda f: seen.append(("after", f.value(DECISION))),
    )
    update_finding(path, "DOC-004", lambda e: e.set(DECISION, DEC), hooks=hooks)
    assert seen == [("before", None), ("after", DEC)]

    def refuse(_finding: object) -> None:
        raise UserError("refused")

    with pytest.raises(UserError):
        update_finding(path, "DOC-004", lambda e: e.remove(DECISION), hooks=Hooks(before=refuse))
    assert read_report(path).finding("DOC-004").value(DECISION) == DEC


# --- two writers --------------------------------------------------------------------------------
ROUNDS = 40


def _writer(path: str, finding: str, counter_finding: str) -> None:
    for n in range(1, ROUNDS + 1):
        update_finding(Path(path), finding, lambda e, n=n: e.set("Progress", str(n)))

        def bump(editor: FindingEditor) -> None:
            editor.set("Counter", str(int(editor.get("Counter") or "0") + 1))

        update_finding(Path(path), counter_finding, bump)


def test_two_writers_racing_on_one_report_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    path.write_text("# R\n\n### [L] W-1: one\n\n### [L] W-2: two\n\n### [L] SHARED: both\n")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), fid, "SHARED")) for fid in ("W-1", "W-2")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    report = read_report(path)
    assert report.finding("W-1").value("Progress") == str(ROUNDS)
    assert report.finding("W-2").value("Progress") == str(ROUNDS)
    assert report.finding("SHARED").value("Counter") == str(2 * ROUNDS)
    assert os.path.exists(lock_path(path))
