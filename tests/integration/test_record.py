"""The decision record's rules (dispatchq.findings.evidence.record), with real git repositories."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from pathlib import Path

import pytest

from dispatchq.errors import TamperError, UnsafeToken, UserError
from dispatchq.findings.evidence.boundary import CheckResult, PlanResult
from dispatchq.findings.evidence.grading import (
    Grade,
    Observation,
    changed_paths,
    expected_set,
    grade,
    observe,
    porcelain,
    verification_line,
)
from dispatchq.findings.evidence.pins import (
    ABSENT,
    UNPINNABLE,
    DispatchLogEntry,
    PinSpec,
    block_hash,
    canonical_block,
    check_location,
    compare_pin,
    compute_pin,
    finding_ref,
    git_toplevel,
    hash_paths,
    pin_from_disk,
    pin_specs,
    repo_id,
    specs_for,
)
from dispatchq.findings.evidence.record import (
    DecisionRecord,
    RecordStore,
    apply_grade,
    dispatch_copy,
    finding_state,
    mark_dispatch,
    record_interrupted,
    reject,
    restore_dispatch,
    stalled_resolutions,
    supersede,
    write_decision,
    write_location,
)
from dispatchq.findings.grammar.lines import (
    DECISION,
    DISPATCH,
    LOCATION,
    PIN,
    PLAN,
    RETIRED,
    STATUS,
    VERIFICATION,
    Decision,
    Pin,
    PinEntry,
)
from dispatchq.findings.grammar.plans import Check, parse_plan
from dispatchq.findings.grammar.report import FindingEditor, Report, finding_violations, lock_path
from dispatchq.findings.grammar.tokens import path_tokens, sanitize
from tests.support.repos import record_git

DAY = dt.date(2026, 8, 27)
H1, H2, H3 = "1" * 40, "2" * 40, "3" * 40


def blob(root: Path, path: str) -> str:
    return record_git(root, "hash-object", "--no-filters", "--", path).strip()


# --- rules 1-2: Location --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "usable", "path", "line", "why"),
    [
        ("`docs/a.md:2`", True, "docs/a.md", 2, None),
        ("`docs/a.md:1-2`", True, "docs/a.md", 1, None),
        ("docs/a.md:2", True, "docs/a.md", 2, None),
        ("docs/a.md:2 (legacy, unbackticked)", True, "docs/a.md", 2, None),
        ("`docs/a.md:2` (was: `—`)", True, "docs/a.md", 2, None),
        ("`docs/a.md:2` (was: `unknown:0`)", True, "docs/a.md", 2, None),
        ("`docs/alias.md:1`", True, "docs/alias.md", 1, None),
        ("— (was: `docs/a.md:2`)", False, None, None, "unparseable"),
        ("—", False, None, None, "unparseable"),
        ("`unknown:0`", False, None, None, "unparseable"),
        ("`docs/a.md`", False, None, None, "unparseable"),
        ("see docs/a.md:2", False, None, None, "unparseable"),
        ("`/etc/hosts:1`", False, "/etc/hosts", 1, "absolute"),
        ("`../root-evil/secret.md:1`", False, "../root-evil/secret.md", 1, ".."),
        ("`docs/../../root-evil/secret.md:1`", False, "docs/../../root-evil/secret.md", 1, ".."),
        ("`out/secret.md:1`", False, "out/secret.md", 1, "symlink escape"),
        ("`out/missing.md:1`", False, "out/missing.md", 1, "symlink escape"),
        ("`docs/escape.md:1`", False, "docs/escape.md", 1, "symlink escape"),
        ("`.git/config:1`", False, ".git/config", 1, "git internals"),
        ("`docs/missing.md:1`", False, "docs/missing.md", 1, "missing"),
        ("`docs:1`", False, "docs", 1, "not a file"),
        (None, False, None, None, "no location"),
    ],
)
def test_location_usability(
    record_repo: Path, value: str | None, usable: bool, path: str | None, line: int | None, why: str | None
) -> None:
    result = check_location(record_repo, value)
    assert (result.usable, result.path, result.line, result.why) == (usable, path, line, why)
    assert result.to_json() == {"usable": usable, "path": path, "line": line, "why": why}


def test_a_contained_but_missing_path_is_missing_and_an_escape_never_is(record_repo: Path) -> None:
    assert check_location(record_repo, "`docs/nope.md:1`").why == "missing"
    assert check_location(record_repo, "`out/nope.md:1`").why == "symlink escape"


# --- rule 9: sanitisation -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("token", "path"),
    [
        ("docs/a.md", "docs/a.md"),
        ("docs/a.md:12", "docs/a.md"),
        ("docs/a.md:12-14", "docs/a.md"),
        ("src/routes/+page.svelte", "src/routes/+page.svelte"),
        ("node_modules/@types/x/index.d.ts", "node_modules/@types/x/index.d.ts"),
        ("a,b.md", "a,b.md"),
        ("../escape.md", "../escape.md"),  # sanitisation passes it; containment refuses it
    ],
)
def test_sanitize_accepts_the_allow_list(token: str, path: str) -> None:
    assert sanitize(token) == path


@pytest.mark.parametrize(
    "token",
    [
        "docs/a.md;id",
        "docs/a.md$(id)",
        "--foo=x/y",
        "-rf",
        "docs/a.md|sh",
        "docs/`id`.md",
        "docs/a b.md",
        "docs/a.md&",
        "docs/a.md>x",
        "docs/ä.md",
        "docs/a.md:12:13",
        ":12",
        "docs/*.md",
        "~/x.md",
    ],
)
def test_sanitize_rejects_never_escapes(token: str) -> None:
    with pytest.raises(UnsafeToken, match=r"allow-list|leading|empty"):
        sanitize(token)


# --- rule 8: the pinned set -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("delete the line at docs/a.md:88.", ["docs/a.md:88"]),
        ("edit `docs/a.md:3`, then README.md", ["docs/a.md:3", "README.md"]),
        ("restore (scripts/tool.sh) and docs/x.md:1-4;", ["scripts/tool.sh", "docs/x.md:1-4"]),
        ("see https://example.com/a/b.md e.g. this, i.e. that, and/or more", []),
        ("run the 1.2 release", []),
        ("a/b/c and Makefile", ["a/b/c"]),
        ("docs/a.md;id and docs/a.md$(id) and --foo=x/y", ["docs/a.md;id", "docs/a.md$(id)", "--foo=x/y"]),
    ],
)
def test_path_tokens_are_recognised_by_shape(text: str, tokens: list[str]) -> None:
    assert path_tokens(text) == tokens


@pytest.mark.parametrize(
    ("target", "resolution", "roles", "expected"),
    [
        (
            "docs/a.md",
            "delete the line citing scripts/example-tool.sh at docs/a.md:2",
            None,
            [("docs/a.md", "edit", False), ("scripts/example-tool.sh", "ref", False)],
        ),
        (
            "docs/a.md",
            "also update docs/b.md:1 and docs/c.md",
            {"docs/c.md": "edit", "docs/b.md": "ref"},
            # issue 13 case 6: a Target the resolution does not name is a referent, not an edit
            [("docs/a.md", "ref", False), ("docs/b.md", "ref", False), ("docs/c.md", "edit", False)],
        ),
        (
            "docs/a.md",
            "remove the mention here",
            {"docs/a.md": "ref"},
            [("docs/a.md", "edit", False)],
        ),
        (
            None,
            "edit docs/a.md;id then ./docs/b.md:3 and docs/b.md",
            None,
            [("docs/a.md;id", "ref", True), ("docs/b.md", "edit", False)],
        ),
        (
            "docs/a.md",
            "copy /etc/passwd to ../x.md:1",
            None,
            [("docs/a.md", "ref", False), ("/etc/passwd", "ref", True), ("../x.md", "edit", True)],
        ),
    ],
)
def test_pin_specs(
    target: str | None,
    resolution: str,
    roles: Mapping[str, str] | None,
    expected: list[tuple[str, str, bool]],
) -> None:
    specs = pin_specs(target, resolution, roles=roles)
    assert [(s.path, s.role, s.rejected is not None) for s in specs] == expected


def test_rejected_tokens_are_named_with_the_reason() -> None:
    (spec,) = pin_specs(None, "fix docs/a.md$(id)")
    assert spec.path == "docs/a.md$(id)"
    assert spec.rejected is not None and "allow-list" in spec.rejected


# --- hashing and pins ---------------------------------------------------------------------------
def test_hash_paths_match_git_and_never_follow_out(record_repo: Path) -> None:
    (record_repo / "docs" / "pinned.md").write_text("changed under assume-unchanged\n")
    (record_repo / "local.env").write_text("IGNORED=2\n")
    values = hash_paths(
        record_repo,
        [
            "docs/a.md",
            "docs/pinned.md",
            "local.env",
            "docs/gone.md",
            "docs/escape.md",
            "docs",
            "docs/alias.md",
        ],
    )
    assert values["docs/a.md"] == blob(record_repo, "docs/a.md")
    assert values["docs/pinned.md"] == blob(record_repo, "docs/pinned.md")
    assert values["docs/pinned.md"] != record_git(record_repo, "ls-files", "-s", "docs/pinned.md").split()[1]
    assert values["local.env"] == blob(record_repo, "local.env")
    assert values["docs/gone.md"] == ABSENT
    assert values["docs/escape.md"] == "!symlink escape"
    assert values["docs"] == "!not a regular file"
    assert values["docs/alias.md"] == values["docs/a.md"]
    assert "docs/pinned.md" not in porcelain(record_repo)  # porcelain cannot see it; the hash can
    assert "local.env" not in porcelain(record_repo)


def test_hash_paths_handle_many_and_odd_names(record_repo: Path) -> None:
    names = [f"many/f{i}.txt" for i in range(230)] + ["many/-dash.txt", "many/sp ace.txt"]
    (record_repo / "many").mkdir()
    for name in names:
        (record_repo / name).write_text(name)
    values = hash_paths(record_repo, names)
    assert all(len(values[n]) == 40 for n in names)
    assert values["many/-dash.txt"] == blob(record_repo, "many/-dash.txt")


BLOCK_TEXT = (
    "### [MEDIUM] DOC-004: Doc cites a removed script\n"
    "**Location:** `docs/a.md:2`\n"
    "**Fix:** needs-decision\n"
    "**Problem:** cites scripts/example-tool.sh\n"
    "\n"
)


def test_block_hash_excludes_loop_lines_and_canonicalises() -> None:
    base = Report.parse(BLOCK_TEXT).findings[0]
    digest = block_hash(base)
    assert canonical_block(base).endswith("scripts/example-tool.sh\n")
    assert not canonical_block(base).endswith("\n\n")
    assert hashlib.sha256(canonical_block(base).encode()).hexdigest() == digest
    same = [
        BLOCK_TEXT.replace("**Fix:**", "**Status:** ✅ Fixed (2026-01-01)\n**Fix:**"),
        BLOCK_TEXT.replace("`docs/a.md:2`", "`docs/a.md:9` (was: `docs/a.md:2`)"),
        BLOCK_TEXT + "**Decision:** A — x [u, 2026-01-01]\n**Decision-pin:** block=" + "0" * 64 + "\n",
        BLOCK_TEXT
        + "**Dispatch:** attempt 1 dispatched 2026-01-01\n**Verification:** hard — 1 run, 1 passed\n",
        BLOCK_TEXT + "**Decision-retired:** A — x [u, 2026-01-01]\n**Verification-plan:** glob x → empty\n",
        BLOCK_TEXT.replace("\n", "\r\n"),
        BLOCK_TEXT.replace("example-tool.sh\n", "example-tool.sh   \t\n"),
        BLOCK_TEXT + "\n\n\n",
        BLOCK_TEXT.rstrip("\n"),
    ]
    for text in same:
        assert block_hash(Report.parse(text).findings[0]) == digest, text
    different = [
        BLOCK_TEXT.replace("cites", "mentions"),
        BLOCK_TEXT.replace("**Fix:** needs-decision", "**Fix:** auto"),
        BLOCK_TEXT + "A new paragraph.\n",
        BLOCK_TEXT.replace("[MEDIUM]", "[HIGH]"),
    ]
    for text in different:
        assert block_hash(Report.parse(text).findings[0]) != digest, text


def test_compute_pin_against_a_real_tree(record_repo: Path) -> None:
    finding = Report.parse(BLOCK_TEXT).findings[0]
    specs = pin_specs(
        "docs/a.md",
        "delete the line citing scripts/example-tool.sh at docs/a.md:2, see docs/escape.md and docs/a.md;id",
    )
    result = compute_pin(finding, specs, record_repo)
    assert result.pin is not None
    values = {e.path: (e.value, e.role) for e in result.pin.entries}
    assert values == {
        "docs/a.md": (blob(record_repo, "docs/a.md"), "edit"),
        "scripts/example-tool.sh": (ABSENT, "ref"),
        "docs/escape.md": (UNPINNABLE, "ref"),
        "docs/a.md;id": (UNPINNABLE, "ref"),
    }
    assert dict(result.unpinnable) == {
        "docs/escape.md": "symlink escape",
        "docs/a.md;id": result.unpinnable[1][1],
    }
    assert "allow-list" in result.unpinnable[1][1]
    assert Pin.parse(result.pin.format()) == result.pin
    assert result.line is not None and result.line.startswith("**Decision-pin:** block=")


def test_pin_is_cut_from_the_file_on_disk(record_repo: Path) -> None:
    report = record_repo / "review.md"
    report.write_text(BLOCK_TEXT)
    specs = pin_specs("docs/a.md", "edit docs/a.md:2")
    first = pin_from_disk(report, "DOC-004", specs, record_repo)
    report.write_text(BLOCK_TEXT.replace("cites", "cited"))
    second = pin_from_disk(report, "DOC-004", specs, record_repo)
    assert first.pin and second.pin and first.pin.block != second.pin.block


def test_no_git_means_unpinned(record_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(record_repo / "no-such-bin"))
    result = compute_pin(Report.parse(BLOCK_TEXT).findings[0], pin_specs("docs/a.md", "x"), record_repo)
    assert result.pin is None and result.why_unpinned == "git is not installed"


# --- rule 10: observations -------------------------------------------------------------------------
def test_a_path_already_modified_is_still_seen_to_change(record_repo: Path) -> None:
    (record_repo / "docs" / "b.md").write_text("bravo, first edit\n")
    assert " M docs/b.md" in record_git(record_repo, "status", "--porcelain")
    before = observe(record_repo, ["docs/a.md"])
    (record_repo / "docs" / "b.md").write_text("bravo, second edit\n")
    after = observe(record_repo, ["docs/a.md"], carry=before)
    assert (
        record_git(record_repo, "status", "--porcelain").count("docs/b.md") == 1
    )  # porcelain alone cannot tell
    assert changed_paths(before, after) == ["docs/b.md"]


@pytest.mark.parametrize(
    ("action", "changed"),
    [
        ("create", ["docs/new.md"]),
        ("delete", ["docs/b.md"]),
        ("revert", ["docs/b.md"]),
        ("ignored", ["local.env"]),
        ("assumed", ["docs/pinned.md"]),
        ("nothing", []),
        ("symlink-out", ["docs/evil-link.md"]),
    ],
)
def test_observable_changes(record_repo: Path, action: str, changed: list[str]) -> None:
    pinned = ["docs/a.md", "local.env", "docs/pinned.md"]
    if action == "revert":
        (record_repo / "docs" / "b.md").write_text("dirty\n")
    before = observe(record_repo, pinned)
    if action == "create":
        (record_repo / "docs" / "new.md").write_text("new\n")
    elif action == "delete":
        (record_repo / "docs" / "b.md").unlink()
    elif action == "revert":
        record_git(record_repo, "checkout", "--", "docs/b.md")
    elif action == "ignored":
        (record_repo / "local.env").write_text("IGNORED=3\n")
    elif action == "assumed":
        (record_repo / "docs" / "pinned.md").write_text("edited behind the index\n")
    elif action == "symlink-out":
        (record_repo / "docs" / "evil-link.md").symlink_to(record_repo.parent / "root-evil" / "secret.md")
    after = observe(record_repo, pinned, carry=before)
    assert changed_paths(before, after) == changed
    if action == "symlink-out":
        assert after.values["docs/evil-link.md"] == "!symlink escape"


def test_the_loops_own_report_writes_are_never_changes(record_repo: Path) -> None:
    report = record_repo / "review.md"
    report.write_text(BLOCK_TEXT)
    record = DecisionRecord(report, record_repo)
    before = record.observe(["docs/a.md"])
    assert before.values["review.md"].startswith("report:")
    record.update("DOC-004", lambda e: e.set(STATUS, "✅ Fixed (2026-08-27)"))
    after = record.observe(["docs/a.md"], carry=before)
    assert lock_path(report).exists()
    assert changed_paths(before, after) == []
    assert not any("dispatchq-lock" in p for p in after.values)
    report.write_text(report.read_text().replace("cites", "was edited by a fixer; cites"))
    fixer = record.observe(["docs/a.md"], carry=after)
    assert changed_paths(after, fixer) == ["review.md"]


def test_observation_round_trips_through_json(record_repo: Path) -> None:
    obs = observe(record_repo, ["docs/a.md", "docs/escape.md"])
    assert Observation.from_json(obs.to_json()) == obs
    assert obs.failed["docs/escape.md"] == "symlink escape"
    assert obs.failed["out"] == "symlink escape"  # an untracked symlink out of the tree: never followed


# --- rule 10: grading -----------------------------------------------------------------------------
def obs(values: Mapping[str, str], listed: tuple[str, ...] = ()) -> Observation:
    return Observation(dict(values), frozenset(listed))


def result(text: str, *, ran: bool = True, passed: bool = True) -> CheckResult:
    check = Check.parse(text)
    return CheckResult(check, ran=ran, passed=passed and ran, why_not_run=None if ran else "refused")


PASS = PlanResult((result("grep -F x docs → empty"),))
FAIL = PlanResult((result("grep -F x docs → empty", passed=False),))
NONE_RAN = PlanResult((result("run make check → contains ok", ran=False),))
PARTIAL = PlanResult((result("grep -F x docs → empty"), result("run make check → contains ok", ran=False)))
SOFT = PlanResult((result("read a.md:1 → contains y (soft)"),))
ENTRIES = [
    PinEntry("a.md", H1, "edit"),
    PinEntry("ref.md", H1, "ref"),
    PinEntry("bad;x", UNPINNABLE, "edit"),
]
BEFORE = obs({"a.md": H1, "ref.md": H1})
SAME = obs({"a.md": H1, "ref.md": H1})
EDITED = obs({"a.md": H2, "ref.md": H1}, ("a.md",))
REF_EDITED = obs({"a.md": H1, "ref.md": H2}, ("ref.md",))
STRAY = obs({"a.md": H1, "ref.md": H1, "other.md": H3}, ("other.md",))
BLIND = obs({"a.md": "!git is not installed", "ref.md": "!git is not installed"})


@pytest.mark.parametrize(
    ("after", "plan", "errored", "case", "outcome", "level", "extra"),
    [
        (EDITED, PASS, False, "fixed", None, "hard", {}),
        (SAME, PASS, False, "fixed", None, "hard", {}),
        (EDITED, PASS, True, "fixed", None, "hard", {}),
        (EDITED, PARTIAL, False, "fixed", None, "advisory", {"coverage_warning": True}),
        (EDITED, SOFT, False, "fixed", None, "advisory", {"advisory": True}),
        (EDITED, FAIL, False, "partially-fixed", None, "hard", {"changed": ("a.md",)}),
        (EDITED, None, False, "unverified", "dispatched, unverified", "unavailable", {}),
        (EDITED, NONE_RAN, False, "unverified", "dispatched, unverified", "unavailable", {}),
        (SAME, FAIL, False, "failed", "failed", "hard", {}),
        (SAME, None, False, "failed", "failed", "unavailable", {}),
        (EDITED, None, True, "failed", "failed", "unavailable", {}),
        (EDITED, FAIL, True, "partially-fixed", None, "hard", {}),
        (REF_EDITED, FAIL, False, "failed", "failed", "hard", {"out_of_scope": ("ref.md",)}),
        (STRAY, FAIL, False, "failed", "failed", "hard", {"out_of_scope": ("other.md",)}),
        (BLIND, FAIL, False, "unverified", "dispatched, unverified", "hard", {"unobservable": True}),
        (BLIND, FAIL, True, "failed", "failed", "hard", {"unobservable": True}),
        (BLIND, PASS, False, "fixed", None, "hard", {"unobservable": True}),
    ],
)
def test_the_four_cases_in_order(
    after: Observation,
    plan: PlanResult | None,
    errored: bool,
    case: str,
    outcome: str | None,
    level: str,
    extra: dict[str, object],
) -> None:
    graded = grade(
        entries=ENTRIES, before=BEFORE, after=after, plan=plan, errored=errored, attempt=1, today=DAY
    )
    assert graded.case == case
    assert graded.outcome == outcome
    assert graded.verification.level == level
    assert (graded.status is None) == (case in ("failed", "unverified"))
    for name, value in extra.items():
        assert getattr(graded, name) == value, name
    assert "bad;x" not in graded.changed + graded.out_of_scope


def test_an_unobservable_dispatch_is_never_no_edit() -> None:
    graded = grade(entries=ENTRIES, before=None, after=EDITED, plan=None, errored=False, attempt=2, today=DAY)
    assert graded.case == "unverified" and graded.unobservable
    only_unpinnable = [PinEntry("bad;x", UNPINNABLE, "edit"), PinEntry("ref.md", H1, "ref")]
    graded = grade(
        entries=only_unpinnable, before=BEFORE, after=SAME, plan=FAIL, errored=False, attempt=1, today=DAY
    )
    assert graded.case == "unverified" and graded.unobservable


def test_unpinned_findings_are_graded_from_the_resolution_text(record_repo: Path) -> None:
    specs = pin_specs("docs/a.md", "remove the citation of scripts/example-tool.sh at docs/a.md:2")
    assert expected_set(specs) == ["docs/a.md"]
    paths = [s.path for s in specs if s.rejected is None]
    before = observe(record_repo, paths)
    (record_repo / "docs" / "a.md").write_text("alpha\n")
    after = observe(record_repo, paths, carry=before)
    graded = grade(entries=specs, before=before, after=after, plan=FAIL, errored=False, attempt=1, today=DAY)
    assert graded.case == "partially-fixed"
    untouched = grade(
        entries=specs, before=before, after=before, plan=None, errored=False, attempt=1, today=DAY
    )
    assert untouched.case == "failed"


@pytest.mark.parametrize(
    ("plan", "written"),
    [
        (None, "unavailable — no plan"),
        (PlanResult(()), "unavailable — no plan"),
        (PASS, "hard — 1 run, 1 passed"),
        (FAIL, "hard — 1 run, 0 passed"),
        (SOFT, "advisory — 1 run, 1 passed"),
        (PARTIAL, "advisory — 1 run, 1 passed; 1 not run: run make check → contains ok"),
        (NONE_RAN, "unavailable — 0 run; 1 not run: run make check → contains ok"),
    ],
)
def test_verification_line(plan: PlanResult | None, written: str) -> None:
    assert verification_line(plan, why_none="no plan").format() == written


# --- rules 3, 4, 11: writes, retirement, stalled -------------------------------------------------
def editor_for(text: str) -> FindingEditor:
    report = Report.parse(text)
    return FindingEditor(report.findings[0], report.eol())


def text_of(editor: FindingEditor) -> str:
    return "".join(line.raw for line in editor.lines)


DECIDED = BLOCK_TEXT + "Prose.\n"
DECISION_A = Decision("A", "delete the citation at docs/a.md:2", "user", DAY)


def decided_editor() -> FindingEditor:
    editor = editor_for(DECIDED)
    write_decision(editor, DECISION_A, plan=parse_plan("grep -F example-tool.sh docs → empty"), pin=None)
    return editor


def graded(case: str, attempt: int) -> Grade:
    after = {"failed": SAME, "unverified": EDITED, "fixed": EDITED, "partially-fixed": EDITED}[case]
    plan = {"failed": FAIL, "unverified": None, "fixed": PASS, "partially-fixed": FAIL}[case]
    return grade(
        entries=ENTRIES, before=BEFORE, after=after, plan=plan, errored=False, attempt=attempt, today=DAY
    )


def test_two_attempt_entries_retire_the_decision_in_place() -> None:
    editor = decided_editor()
    assert apply_grade(editor, graded("failed", 1)) is False
    assert Decision.parse(editor.get(DECISION) or "").attempts[0].outcome == "failed"
    assert editor.get(VERIFICATION) == "hard — 1 run, 0 passed"
    assert apply_grade(editor, graded("unverified", 2)) is True
    assert editor.get(DECISION) is None
    (retired,) = editor.get_all(RETIRED)
    assert retired.endswith("[user, 2026-08-27; attempt 1: failed; attempt 2: dispatched, unverified]")
    finding = editor.snapshot()
    assert finding_state(finding) == "retired"
    assert finding_violations(finding) == []


def test_regrading_the_same_attempt_is_not_counted_twice() -> None:
    editor = decided_editor()
    apply_grade(editor, graded("failed", 1))
    apply_grade(editor, graded("failed", 1))
    assert len(Decision.parse(editor.get(DECISION) or "").attempts) == 1
    with pytest.raises(UserError, match="attempt 3"):
        apply_grade(editor, graded("failed", 3))


def test_terminal_grades_write_status_first_and_verification_together() -> None:
    editor = decided_editor()
    assert apply_grade(editor, graded("partially-fixed", 1)) is False
    lines = text_of(editor).splitlines()
    assert lines[1] == "**Status:** ⚠️ Partially Fixed (2026-08-27)"
    assert editor.get(VERIFICATION) == "hard — 1 run, 0 passed"
    assert finding_state(editor.snapshot()) == "partially-fixed"


def test_a_second_retirement_stalls_and_supersession_does_not_count() -> None:
    editor = decided_editor()
    supersede(editor)
    write_decision(editor, DECISION_A, plan=None, pin=None)
    supersede(editor)
    assert finding_state(editor.snapshot()) == "retired"  # two supersessions: not stalled
    for round_ in range(2):
        write_decision(
            editor, Decision("B", f"try {round_} at docs/a.md:2", "user", DAY), plan=None, pin=None
        )
        apply_grade(editor, graded("failed", 1))
        assert apply_grade(editor, graded("failed", 2)) is True
    finding = editor.snapshot()
    assert finding_state(finding) == "stalled"
    assert stalled_resolutions(finding) == ["try 0 at docs/a.md:2", "try 1 at docs/a.md:2"]
    assert len(finding.all(RETIRED)) == 4


def test_interrupted_attempts_count_toward_retirement() -> None:
    editor = decided_editor()
    mark_dispatch(editor, 1, DAY)
    assert finding_state(editor.snapshot()) == "dispatched-outcome-unknown"
    assert record_interrupted(editor, 1) is False
    assert finding_state(editor.snapshot()) == "decided"
    assert record_interrupted(editor, 1) is False  # idempotent
    mark_dispatch(editor, 2, DAY)
    assert record_interrupted(editor, 2) is True
    assert "attempt 2: interrupted, unverified" in editor.get_all(RETIRED)[0]


def test_a_fresh_decision_overwrites_in_place_and_clears_stale_companions() -> None:
    editor = decided_editor()
    editor.set(PIN, Pin("0" * 64, (PinEntry("docs/a.md", H1, "edit"),)).format())
    mark_dispatch(editor, 1, DAY)
    editor.set(VERIFICATION, "hard — 1 run, 0 passed")
    position = [i for i, line in enumerate(editor.lines) if line.text.startswith("**Decision:**")]
    write_decision(editor, Decision("B", "another way at docs/a.md:2", "user", DAY), plan=None, pin=None)
    assert [i for i, line in enumerate(editor.lines) if line.text.startswith("**Decision:**")] == position
    assert (editor.get(DECISION) or "").startswith("B — ")
    for stale in (PLAN, PIN, DISPATCH, VERIFICATION):
        assert editor.get(stale) is None, stale
    with pytest.raises(UserError):
        write_decision(editor, DECISION_A.with_attempt("failed"), plan=None, pin=None)


def test_dispatch_marker_can_be_rewritten_back() -> None:
    editor = decided_editor()
    previous = mark_dispatch(editor, 1, DAY)
    assert previous is None and editor.get(DISPATCH) == "attempt 1 dispatched 2026-08-27"
    restore_dispatch(editor, previous)
    assert editor.get(DISPATCH) is None
    mark_dispatch(editor, 1, DAY)
    again = mark_dispatch(editor, 2, DAY + dt.timedelta(days=1))
    restore_dispatch(editor, again)
    assert editor.get(DISPATCH) == "attempt 1 dispatched 2026-08-27"
    with pytest.raises(UserError):
        mark_dispatch(editor_for(DECIDED), 1, DAY)


def test_reject_writes_status_and_never_leaves_a_live_decision() -> None:
    editor = decided_editor()
    reject(editor, "the script\nstill exists", DAY)
    finding = editor.snapshot()
    assert finding.value(STATUS) == "🚫 Rejected (2026-08-27) — the script still exists"
    assert finding.value(DECISION) is None and finding.all(RETIRED)
    assert finding_state(finding) == "rejected"
    assert finding_violations(finding) == []


def test_location_rewrite_keeps_the_reviewers_original() -> None:
    editor = editor_for(BLOCK_TEXT.replace("`docs/a.md:2`", "`unknown:0`"))
    write_location(editor, "docs/a.md:2")
    write_location(editor, "docs/a.md:1")
    assert editor.get(LOCATION) == "`docs/a.md:1` (was: `unknown:0`)"


@pytest.mark.parametrize(
    ("lines", "state"),
    [
        ([], "undecided"),
        (["**Decision:** A — x [u, 2026-01-01]"], "decided"),
        (
            ["**Decision:** A — x [u, 2026-01-01]", "**Dispatch:** attempt 1 dispatched 2026-01-01"],
            "dispatched-outcome-unknown",
        ),
        (
            [
                "**Decision:** A — x [u, 2026-01-01; attempt 1: failed]",
                "**Dispatch:** attempt 1 dispatched 2026-01-01",
            ],
            "decided",
        ),
        (
            [
                "**Decision:** A — x [u, 2026-01-01; attempt 1: failed]",
                "**Dispatch:** attempt 2 dispatched 2026-01-02",
            ],
            "dispatched-outcome-unknown",
        ),
        (["**Decision-retired:** A — x [u, 2026-01-01]"], "retired"),
        (
            [
                "**Decision-retired:** A — x [u, 2026-01-01; attempt 1: failed; attempt 2: failed]",
                "**Decision-retired:** B — y [u, 2026-01-02; attempt 1: failed; attempt 2: failed]",
            ],
            "stalled",
        ),
        (["**Status:** ✅ Fixed (2026-01-01)", "**Decision:** A — x [u, 2026-01-01]"], "fixed"),
        (["**Status:** ⚠️ Partially Fixed (2026-01-01) extra"], "partially-fixed"),
        (["**Status:** 🚫 Rejected (2026-01-01) — no"], "rejected"),
        (["**Status:** ⏳ Working (2026-01-01)"], "undecided"),
    ],
)
def test_finding_state(lines: list[str], state: str) -> None:
    text = "### [L] A-1: x\n" + "".join(line + "\n" for line in lines) + "**Fix:** needs-decision\n"
    assert finding_state(Report.parse(text).findings[0]) == state


# --- rule 12: attribution ---------------------------------------------------------------------------
BLOCK = "b" * 64
PIN_AB = Pin(
    BLOCK, (PinEntry("a.md", H1, "edit"), PinEntry("b.md", ABSENT, "ref"), PinEntry("x;y", UNPINNABLE, "ref"))
)


def entry(position: int, before: Mapping[str, str], after: Mapping[str, str]) -> DispatchLogEntry:
    return DispatchLogEntry(position, "r.md#OTHER", 1, "2026-08-27T00:00:00Z", before, after)


@pytest.mark.parametrize(
    ("block", "current", "log", "verdict", "unexplained"),
    [
        (BLOCK, {"a.md": H1, "b.md": ABSENT}, [], "match", ()),
        (BLOCK, {"a.md": H2, "b.md": ABSENT}, [entry(1, {"a.md": H1}, {"a.md": H2})], "attributable", ()),
        (
            BLOCK,
            {"a.md": H3, "b.md": H1},
            [
                entry(1, {"a.md": H1, "b.md": ABSENT}, {"a.md": H2, "b.md": H1}),
                entry(2, {"a.md": H2}, {"a.md": H3}),
            ],
            "attributable",
            (),
        ),
        (
            BLOCK,
            {"a.md": H3, "b.md": ABSENT},
            [entry(1, {"a.md": H1}, {"a.md": H2}), entry(2, {"a.md": H2}, {"a.md": H2})],
            "unattributable",
            ("a.md",),
        ),
        (
            BLOCK,
            {"a.md": H3, "b.md": ABSENT},
            [entry(1, {"a.md": H1}, {"a.md": H2}), entry(2, {"a.md": H3}, {"a.md": H3})],
            "unattributable",
            ("a.md",),
        ),
        (BLOCK, {"a.md": H2, "b.md": ABSENT}, [], "unattributable", ("a.md",)),
        (
            BLOCK,
            {"a.md": H2, "b.md": ABSENT},
            [entry(1, {"c.md": H1}, {"c.md": H2})],
            "unattributable",
            ("a.md",),
        ),
        (BLOCK, {"a.md": H2, "b.md": ABSENT}, [entry(1, {}, {"a.md": H2})], "unattributable", ("a.md",)),
        ("c" * 64, {"a.md": H1, "b.md": ABSENT}, [], "unattributable", ("block",)),
        (BLOCK, {"a.md": "!git is not installed", "b.md": ABSENT}, [], "unattributable", ("a.md",)),
    ],
)
def test_attribution(
    block: str,
    current: Mapping[str, str],
    log: list[DispatchLogEntry],
    verdict: str,
    unexplained: tuple[str, ...],
) -> None:
    comparison = compare_pin(PIN_AB, block, current, log)
    assert comparison.verdict == verdict
    assert comparison.unexplained == unexplained
    assert "x;y" not in comparison.changed


# --- rule 13: the dispatch copy -------------------------------------------------------------------------
FULL = (
    "### [MEDIUM] DOC-004: Doc cites a removed script\n"
    "**Status:** ⏳ Waiting (2026-08-01)\n"
    "**Decision-retired:** B — old way [user, 2026-08-01; attempt 1: failed; attempt 2: failed]\n"
    "**Decision:** A — delete the line at docs/a.md:2 — carefully [user, 2026-08-27; attempt 1: failed]\n"
    "**Verification-plan:** grep -F example-tool.sh docs → empty\n"
    f"**Decision-pin:** block={'0' * 64} | docs/a.md={H1}:edit\n"
    "**Dispatch:** attempt 2 dispatched 2026-08-27\n"
    "**Verification:** hard — 1 run, 0 passed\n"
    "**Location:** `docs/a.md:2` (was: `—`)\n"
    "**Source:** @reviewer — [PR #1 comment](https://example.com)\n"
    "**Problem:** cites a removed script\n"
    "\n"
)


@pytest.mark.parametrize(
    ("status_at_start", "status_travels"),
    [("⏳ Waiting (2026-08-01)", True), (None, False), ("⏳ Waiting (2026-07-01)", False)],
)
def test_dispatch_copy_follows_the_strip_list(status_at_start: str | None, status_travels: bool) -> None:
    finding = Report.parse(FULL).findings[0]
    copy = dispatch_copy(finding, status_at_run_start=status_at_start)
    lines = copy.splitlines()
    assert lines[0] == "### [MEDIUM] DOC-004: Doc cites a removed script"
    assert "**Location:** `docs/a.md:2` (was: `—`)" in lines
    assert "**Source:** @reviewer — [PR #1 comment](https://example.com)" in lines
    for stripped in (
        "**Verification-plan:**",
        "**Decision-pin:**",
        "**Dispatch:**",
        "**Verification:**",
        "**Decision",
    ):
        assert not any(line.startswith(stripped) for line in lines), stripped
    assert ("**Status:** ⏳ Waiting (2026-08-01)" in lines) is status_travels
    assert lines[-1] == "User decision: delete the line at docs/a.md:2 — carefully"
    assert "example-tool.sh" not in copy and "attempt" not in copy


def test_dispatch_copy_needs_a_live_decision() -> None:
    with pytest.raises(UserError):
        dispatch_copy(Report.parse(BLOCK_TEXT).findings[0], status_at_run_start=None)


def verdict(record: DecisionRecord, finding_id: str) -> str | None:
    comparison = record.check_pin(finding_id)
    return comparison.verdict if comparison else None


def dispatch(record: DecisionRecord, finding_id: str, edit: Path, content: str, paths: list[str]) -> int:
    assert record.store is not None
    before = record.observe(paths)
    record.mark_dispatch(finding_id, 1, DAY)
    edit.write_text(content)
    after = record.observe(paths, carry=before)
    return record.store.log_dispatch(record.ref(finding_id), 1, before, after, at="2026-08-27T00:00:00Z")


def test_a_mismatch_caused_by_a_logged_dispatch_re_pins_silently(
    record: DecisionRecord, record_repo: Path
) -> None:
    a = Decision("A", "rewrite docs/a.md:2", "user", DAY)
    b = Decision("A", "tweak docs/a.md:1", "user", DAY)
    assert record.write_decision("F-1", a, plan=None).pin is not None
    record.write_decision("F-2", b, plan=None)
    assert verdict(record, "F-2") == "match"
    dispatch(record, "F-1", record_repo / "docs" / "a.md", "alpha\nfixed\n", ["docs/a.md", "docs/b.md"])
    # Another process, same store: the log is shared.
    assert record.store is not None
    other = DecisionRecord(record.report, record_repo, RecordStore(record.store.store, record_repo))
    comparison = other.check_pin("F-2")
    assert comparison is not None and comparison.verdict == "attributable"
    other.repin("F-2")
    assert verdict(other, "F-2") == "match"
    (record_repo / "docs" / "a.md").write_text("someone else\n")
    assert verdict(other, "F-2") == "unattributable"


def test_dispatches_before_the_pin_never_explain_it(record: DecisionRecord, record_repo: Path) -> None:
    record.write_decision("F-1", Decision("A", "rewrite docs/a.md:2", "user", DAY), plan=None)
    dispatch(record, "F-1", record_repo / "docs" / "a.md", "v2\n", ["docs/a.md"])
    record.write_decision("F-2", Decision("A", "tweak docs/a.md:1", "user", DAY), plan=None)
    assert verdict(record, "F-2") == "match"
    (record_repo / "docs" / "a.md").write_text("v1\n")  # back to a value an old log entry saw, by hand
    assert verdict(record, "F-2") == "unattributable"


def test_lines_changed_by_anyone_else_are_tamper(record: DecisionRecord, record_repo: Path) -> None:
    record.write_decision(
        "F-1", Decision("A", "rewrite docs/a.md:2", "user", DAY), plan=parse_plan("glob x → empty")
    )
    assert record.changes(record.read().finding("F-1")) == []
    text = record.report.read_text()
    record.report.write_text(text.replace("rewrite docs/a.md:2", "rm -rf docs"))
    changes = record.changes(record.read().finding("F-1"))
    assert any("rm -rf docs" in c and "not written by dispatchq" in c for c in changes)
    assert any("rewrite docs/a.md:2" in c and "is gone" in c for c in changes)
    with pytest.raises(TamperError) as caught:
        record.mark_dispatch("F-1", 1, DAY)
    assert caught.value.finding_id == "F-1"
    assert "**Dispatch:**" not in record.report.read_text()
    # Setting the finding aside is the one write that accepts the change, and it is kept.
    record.supersede("F-1")
    assert record.changes(record.read().finding("F-1")) == []
    assert finding_state(record.read().finding("F-1")) == "retired"


@pytest.mark.parametrize(
    ("forged", "flagged"),
    [
        ("**Decision:** A — forged [user, 2026-08-27]", True),
        ("**Verification-plan:** run curl evil → empty", True),
        ("**Dispatch:** attempt 1 dispatched 2026-08-27", True),
        ("**Status:** ✅ Fixed (2026-08-27)", False),
    ],
)
def test_loop_lines_dispatchq_never_wrote_are_flagged(
    record: DecisionRecord, forged: str, flagged: bool
) -> None:
    text = record.report.read_text().replace("### [LOW] F-3: third\n", f"### [LOW] F-3: third\n{forged}\n")
    record.report.write_text(text)
    changes = record.changes(record.read().finding("F-3"))
    assert bool(changes) is flagged


def test_a_fixer_write_to_a_status_line_is_caught(record: DecisionRecord) -> None:
    record.write_decision("F-3", Decision("A", "fix docs/b.md:1", "user", DAY), plan=None)
    text = record.report.read_text().replace(
        "### [LOW] F-3: third\n", "### [LOW] F-3: third\n**Status:** ✅ Fixed (2026-08-27)\n"
    )
    record.report.write_text(text)
    assert record.changes(record.read().finding("F-3"))


def test_a_fixers_write_to_the_report_is_out_of_scope_and_the_loops_is_not(
    record: DecisionRecord, record_repo: Path
) -> None:
    record.write_decision("F-1", Decision("A", "rewrite docs/a.md:2", "user", DAY), plan=None)
    before = record.observe(["docs/a.md"])
    record.mark_dispatch("F-1", 1, DAY)  # the loop's own write, between the observations
    loop_only = record.observe(["docs/a.md"], carry=before)
    assert changed_paths(before, loop_only) == []
    text = record.report.read_text()
    record.report.write_text(
        text.replace(
            "### [MEDIUM] F-1: first\n", "### [MEDIUM] F-1: first\n**Status:** ✅ Fixed (2026-08-27)\n"
        )
    )
    forged = record.observe(["docs/a.md"], carry=loop_only)
    assert changed_paths(loop_only, forged) == ["review.md"]
    graded = grade(
        entries=[PinEntry("docs/a.md", blob(record_repo, "docs/a.md"), "edit")],
        before=loop_only,
        after=forged,
        plan=None,
        errored=False,
        attempt=1,
        today=DAY,
    )
    assert graded.out_of_scope == ("review.md",) and graded.case == "failed"


def test_store_keeps_the_pin_position(record: DecisionRecord, record_repo: Path) -> None:
    assert record.store is not None
    record.write_decision("F-1", Decision("A", "rewrite docs/a.md:2", "user", DAY), plan=None)
    assert record.store.pin_position(record.ref("F-1")) == 0
    dispatch(record, "F-1", record_repo / "docs" / "a.md", "v2\n", ["docs/a.md"])
    record.write_decision("F-2", Decision("A", "tweak docs/a.md:1", "user", DAY), plan=None)
    assert record.store.pin_position(record.ref("F-2")) == 1
    assert len(record.store.log_since(0)) == 1
    assert record.store.log_since(1) == []
    (logged,) = record.store.log_since(0)
    assert logged.before["docs/a.md"] != logged.after["docs/a.md"]
    assert logged.finding == "review.md#F-1"


def test_write_decision_pins_the_target_and_the_resolution(record: DecisionRecord, record_repo: Path) -> None:
    result = record.write_decision(
        "F-1",
        Decision(
            "A",
            "delete the citation of scripts/example-tool.sh at docs/a.md:2 and fix docs/a.md$(id)",
            "u",
            DAY,
        ),
        plan=parse_plan("grep -F example-tool.sh docs → empty"),
        roles={"docs/a.md": "edit"},
    )
    finding = record.read().finding("F-1")
    pin = finding.pin()
    assert pin is not None and result.pin == pin
    assert [(e.path, e.value, e.role) for e in pin.entries] == [
        ("docs/a.md", blob(record_repo, "docs/a.md"), "edit"),
        ("scripts/example-tool.sh", ABSENT, "ref"),
        ("docs/a.md$(id)", UNPINNABLE, "ref"),
    ]
    assert pin.block == block_hash(finding)
    assert finding.value(PLAN) == "grep -F example-tool.sh docs → empty"
    assert finding_violations(finding) == []
    assert specs_for(finding, record_repo) == [
        PinSpec("docs/a.md", "edit"),
        PinSpec("scripts/example-tool.sh", "ref"),
        PinSpec("docs/a.md$(id)", "ref", specs_for(finding, record_repo)[2].rejected),
    ]


def test_identities(record_repo: Path, tmp_path: Path) -> None:
    assert git_toplevel(record_repo / "docs") == record_repo.resolve()
    with pytest.raises(UserError, match="not inside a git repository"):
        git_toplevel(tmp_path / "root-evil")
    assert repo_id(record_repo) == repo_id(record_repo / ".") != repo_id(tmp_path / "root-evil")
    assert finding_ref(record_repo / "review.md", record_repo, "F-1") == "review.md#F-1"
    outside = tmp_path / "elsewhere.md"
    assert finding_ref(outside, record_repo, "F-1") == f"{outside.resolve()}#F-1"


def test_a_location_write_is_remembered_as_dispatchqs_own(record: DecisionRecord) -> None:
    assert record.store is not None
    record.write_location("F-3", "docs/a.md:1")
    finding = record.read().finding("F-3")
    assert finding.value(LOCATION) == "`docs/a.md:1` (was: `docs/b.md:1`)"
    assert record.store.written(record.ref("F-3")) == [(LOCATION, "`docs/a.md:1` (was: `docs/b.md:1`)")]
    assert record.changes(finding) == []
