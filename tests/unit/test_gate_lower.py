"""Issue 13, case 8 ("Lower"), where no process is needed: a session's check the grammar refuses
costs that check alone, a redundantly quoted operand is read, a range Location is told whole, a
plan the execution boundary refuses is no plan, and the degraded render says "unavailable" once."""

from __future__ import annotations

import calendar
import json
import os
from pathlib import Path

from dispatchq.findings.evidence.boundary import plan_rejection
from dispatchq.findings.evidence.pins import check_location
from dispatchq.findings.grammar.plans import Check
from dispatchq.findings.run.settle import describe_holders
from dispatchq.findings.texts.returns import parse_analysis, parse_restatement
from dispatchq.findings.texts.screens import render_proposal
from dispatchq.queue.liveness import SessionHolder
from tests.support.gate import GONE, REMOVE, alt, analysis, standard_alternatives


def with_plan(plan: list[object]) -> dict:
    alts = standard_alternatives()
    alts[0]["verification_plan"] = plan
    return json.loads(analysis(alts))


def test_a_redundantly_quoted_operand_in_an_analysts_plan_is_read_not_refused() -> None:
    proposal = parse_analysis(with_plan(["read docs/guide.md:1 → matches '.+'", GONE]))
    assert [c.text for c in proposal.alternatives[0].plan] == ["read docs/guide.md:1 → matches .+", GONE]
    assert proposal.alternatives[0].refused == ()


def test_a_check_the_grammar_refuses_drops_that_check_alone_and_is_shown() -> None:
    proposal = parse_analysis(with_plan(["grep x → maybe", GONE]))
    a, b = proposal.alternatives
    assert [c.text for c in a.plan] == [GONE]  # the rest of the plan, and of the analysis, stands
    assert [text for text, _ in a.refused] == ["grep x → maybe"]
    assert b.plan and b.refused == ()
    shown = "\n".join(render_proposal(proposal))
    assert "refused by the check grammar and dropped from the plan (the analyst's error)" in shown
    assert "! grep x → maybe" in shown


def test_a_restaters_run_check_parses_into_its_argv() -> None:
    value = {
        "restated": [
            alt("other", REMOVE, [("docs/guide.md", "edit")], ["run python3 -c 'print(1)' → contains 1"])
        ],
        "unrestatable": None,
    }
    (other,) = parse_restatement(value, mode="other")
    (check,) = other.plan
    assert check.args == ("python3", "-c", "print(1)") and not check.inside_boundary


def test_a_range_location_is_told_whole_and_written_by_its_start(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("one\ntwo\nthree\n")
    located = check_location(tmp_path, "`docs/guide.md:1-2`")
    assert located.span == "docs/guide.md:1-2"  # what the analyst is told
    assert located.target == "docs/guide.md:1"  # what the Location line carries
    assert check_location(tmp_path, "`docs/guide.md:2`").span == "docs/guide.md:2"


def refusing_tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]\n")
    (root / "docs").mkdir()
    (root / "docs" / "guide.md").write_text("Run scripts/old-tool.sh to build.\n")
    outside = tmp_path / "outside.md"
    outside.write_text("secret\n")
    os.symlink(outside, root / "docs" / "escape.md")
    return root


def test_a_plan_the_boundary_refuses_entirely_is_no_plan(tmp_path: Path) -> None:
    root = refusing_tree(tmp_path)
    plan = [Check.parse("read .git/config:1 → contains x"), Check.parse("read docs/escape.md:1 → contains y")]
    test = plan_rejection(plan, root)
    assert test.rejected
    assert test.why == "the execution boundary refuses every check"
    assert [r.check for r in test.refused] == plan


def test_a_refused_check_beside_a_useful_one_is_named(tmp_path: Path) -> None:
    root = refusing_tree(tmp_path)
    useful = Check.parse("read docs/guide.md:1 → equals 'The rest.'")
    refused = Check.parse("read .git/config:1 → contains x")
    test = plan_rejection([useful, refused], root)
    assert not test.rejected
    assert [r.check for r in test.refused] == [refused]
    assert "git internals" in (test.refused[0].why_not_run or "")


def test_a_plan_of_passing_and_refused_checks_is_no_plan(tmp_path: Path) -> None:
    root = refusing_tree(tmp_path)
    passing = Check.parse("read docs/guide.md:1 → contains old-tool")
    test = plan_rejection([passing, Check.parse("read .git/config:1 → contains x")], root)
    assert test.rejected and "1 refused by the execution boundary" in test.why


def test_the_degraded_render_does_not_repeat_that_analysis_is_unavailable() -> None:
    proposal = parse_analysis(json.loads(analysis(standard_alternatives())))
    degraded = type(proposal)(target=proposal.target, alternatives=proposal.alternatives, degraded=True)
    shown = "\n".join(render_proposal(degraded))
    assert "code analysis unavailable" not in shown  # the note above it says so, once
    assert "restate the Remediation" in shown


def test_a_wait_on_a_live_holder_names_it_and_when_it_is_recovered() -> None:
    expires = float(calendar.timegm((2026, 12, 1, 12, 30, 5)))
    holder = SessionHolder(
        "j1", "rq1", "rq1:e1", "dispatchq-session", "w:ab", "w", "build-01", 4242, expires, False
    )

    class Rec:
        kind = "findings-fixer"
        target = "reviews/report.md#DOC-1"

    text = describe_holders([holder], {"j1": Rec()}, mine=1, busy=1, limit=1)  # type: ignore[dict-item]
    assert text == (
        "waiting for 1 session(s) to finish; all 1 session slot(s) are busy: the fixer of "
        "reviews/report.md#DOC-1 (judgement j1) runs in worker w on host build-01, pid 4242; if that "
        "worker is gone it is recovered at about 12:30:05 UTC, when its heartbeat lapses"
    )
