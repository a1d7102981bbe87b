"""Issue 13, case 8 ("Lower"), driven through the real `dispatchq findings sweep` in a
pseudo-terminal: whose fault a restater's bad return is, a range Location, the degraded render,
and a plan the execution boundary refuses."""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.support.gate import (
    DAY,
    GONE,
    REMOVE,
    World,
    alt,
    analysis,
    analyst_step,
    finding_block,
    restater_step,
    standard_alternatives,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pty tests need Linux")

APP_EDIT = "rename the call old_name() to new_name() at src/app.py:2"
NO_OLD = "grep -F old_name src → empty"


def write_report(world: World, *blocks: str) -> None:
    world.report.write_text("# Review\n\n" + "".join(blocks))


def restater_prompts(world: World) -> int:
    return sum("dispatchq's restater" in p for p in world.prompts())


def test_a_restaters_check_the_grammar_refuses_is_its_fault_and_costs_the_person_nothing(
    world: World,
) -> None:
    write_report(world, finding_block("OT-1", "other answer"))
    plan = ["run python3 -c 'print(1)'", NO_OLD]  # the first has no expectation: the grammar refuses it
    world.steps(
        analyst_step("OT-1", analysis(standard_alternatives())),
        restater_step("OT-1", [alt("other", APP_EDIT, [("src/app.py", "edit")], plan)]),
    )
    p = world.pty("sweep")
    try:
        p.expect(r"OT-1 decision .*> ")
        p.send("o")
        p.expect(r"OT-1 your resolution> ")
        p.send("rename old_name to new_name in src/app.py line 2")
        p.expect(r"derived checks:\n    grep -F old_name src → empty\n")
        p.expect(r"1 check the restater wrote is refused by the check grammar .*\(the restater's error\)")
        p.expect(r"! run python3 -c 'print\(1\)' \(.*no ' → <expected>'")
        p.expect(r"OT-1 use this restatement\? \[y/n\]> ")
        p.send("y")
        assert p.finish() == 0
    finally:
        p.close()
    assert "Name every file and line" not in p.output  # the person's one re-ask was not spent
    assert (world.line("OT-1", "Decision") or "").startswith(f"other — {APP_EDIT} [")
    assert world.line("OT-1", "Verification-plan") == NO_OLD


def test_a_restater_that_breaks_its_contract_is_asked_again_not_the_person(world: World) -> None:
    write_report(world, finding_block("OT-2", "other answer"))
    good = alt("other", APP_EDIT, [("src/app.py", "edit")], [NO_OLD])
    twice = [good, alt("other", "delete src/app.py:2", [("src/app.py", "edit")])]
    world.steps(
        analyst_step("OT-2", analysis(standard_alternatives())),
        restater_step("OT-2", twice),  # an other… answer restates to one resolution: a broken return
        restater_step("OT-2", [good]),
    )
    p = world.pty("sweep")
    try:
        p.expect(r"OT-2 decision .*> ")
        p.send("o")
        p.expect(r"OT-2 your resolution> ")
        p.send("rename old_name to new_name in src/app.py line 2")
        p.expect(r"the restater's return could not be used \(.*exactly one resolution\): the session's error")
        p.expect(r"asking a fresh restater once more")
        p.expect(r"OT-2 use this restatement\? \[y/n\]> ")
        p.send("y")
        assert p.finish() == 0
    finally:
        p.close()
    assert p.output.count("OT-2 your resolution> ") == 1
    assert "Name every file and line" not in p.output
    assert restater_prompts(world) == 2
    assert (world.line("OT-2", "Decision") or "").startswith(f"other — {APP_EDIT} [")


def test_a_range_location_is_told_whole_and_rewritten_to_its_start_line(world: World) -> None:
    write_report(world, finding_block("RG-1", "a range", location="`docs/guide.md:1-2`"))
    world.steps(analyst_step("RG-1", analysis(standard_alternatives(), target="docs/guide.md:1-2")))
    p = world.pty("sweep")
    try:
        p.expect(r"Target: docs/guide\.md:1-2")  # the full range in the proposal
        p.expect(r"RG-1 decision .*> ")
        p.send("A")
        assert p.finish() == 0
    finally:
        p.close()
    (prompt,) = world.prompts()
    assert "Validated location: docs/guide.md:1-2\n" in prompt
    assert world.line("RG-1", "Location") == "`docs/guide.md:1` (was: `docs/guide.md:1-2`)"


def test_the_degraded_render_shows_the_block_and_says_unavailable_once(world: World) -> None:
    write_report(world, finding_block("DG-1", "analyst breaks the contract"))
    broken = json.loads(analysis(standard_alternatives()))
    broken["alternatives"][1]["resolution"] = "resolve differently"
    world.steps(
        analyst_step("DG-1", json.dumps(broken)),
        restater_step("DG-1", [alt("A", REMOVE, [("docs/guide.md", "edit")], [GONE])]),
    )
    p = world.pty("sweep")
    try:
        p.expect(r"DG-1 decision \[A\] \[skip\] \[reject\] \[other…\]> ")
        p.send("skip")
        assert p.finish() == 0
    finally:
        p.close()
    assert p.output.count("code analysis unavailable") == 1
    shown = p.output[p.output.index("code analysis unavailable") :]
    assert "The finding as written (not analysed; the block author's text):" in shown
    assert "    | **Remediation:** Remove the mention of scripts/old-tool.sh from docs/guide.md.\n" in shown
    assert "    | ### [MEDIUM] DG-1: analyst breaks the contract\n" in shown
    assert shown.index("| **Remediation:**") < shown.index(f"  A: {REMOVE}")


def test_a_plan_the_execution_boundary_refuses_is_no_plan_and_said_so(world: World) -> None:
    write_report(world, finding_block("BD-1", "a plan that reads git's own files"))
    alts = standard_alternatives()
    alts[0]["verification_plan"] = ["read .git/config:1 → contains url"]
    world.steps(analyst_step("BD-1", analysis(alts)))
    p = world.pty("sweep")
    try:
        p.expect(r"BD-1 decision .*> ")
        p.send("A")
        p.expect(r"1 check of this plan is refused by the execution boundary and cannot run")
        p.expect(r"! read \.git/config:1 → contains url \(path \.git/config refused \(git internals\)\)")
        p.expect(r"treated as no plan \(the execution boundary refuses every check\)")
        assert p.finish() == 0
    finally:
        p.close()
    assert world.line("BD-1", "Decision") is not None
    assert world.line("BD-1", "Verification-plan") is None


# --- re-deciding by hand (the README's way) ------------------------------------------------------
def test_deleting_the_decision_line_by_hand_retires_it_and_the_sweep_asks_again(world: World) -> None:
    write_report(world, finding_block("RD-1", "decided, then changed my mind"))
    world.decide("RD-1", "A", REMOVE, plan=[GONE])
    old = world.line("RD-1", "Decision")
    assert old is not None and world.line("RD-1", "Decision-pin") is not None
    world.report.write_text(world.text().replace(f"**Decision:** {old}\n", ""))
    world.steps(analyst_step("RD-1", analysis(standard_alternatives())))
    p = world.pty("sweep", "--json")
    try:
        p.expect(r"RD-1: its Decision line was deleted by hand: that decision is retired")
        p.expect(r"Retired decisions \(already tried\):\n  - " + re.escape(old))
        p.expect(r"RD-1 decision \[A\] \[B\] \[skip\] \[reject\] \[other…\]> ")
        p.send("B")
        assert p.finish() == 0
    finally:
        p.close()
    summary = json.loads(p.output[p.output.rindex('{\n  "fixed"') :])
    assert summary["tampered"] == [] and summary["decided"] == ["RD-1"]
    assert (world.line("RD-1", "Decision") or "").startswith("B — ")
    assert world.line("RD-1", "Decision-retired") == old
    done = world.cli("check")
    assert done.returncode == 0, done.stdout  # nothing left that reads as tamper evidence


def test_a_decision_line_deleted_while_a_dispatch_is_in_flight_stays_tamper_evidence(world: World) -> None:
    write_report(world, finding_block("RD-2", "dispatched, outcome unknown"))
    world.decide("RD-2", "A", REMOVE, plan=[GONE])
    world.record().mark_dispatch("RD-2", 1, DAY)  # its outcome must be verified first
    old = world.line("RD-2", "Decision")
    world.report.write_text(world.text().replace(f"**Decision:** {old}\n", ""))
    world.steps(analyst_step("RD-2", analysis(standard_alternatives())))
    p = world.pty("sweep", "--json")
    try:
        p.expect(r"RD-2 decision .*> ")
        p.send("B")
        assert p.finish() == 0
    finally:
        p.close()
    summary = json.loads(p.output[p.output.rindex('{\n  "fixed"') :])
    assert [fid for fid, _ in summary["tampered"]] == ["RD-2"]
    assert "deleted by hand" not in p.output
    assert world.line("RD-2", "Decision") is None and world.line("RD-2", "Decision-retired") is None
