"""Killing dispatchq at each stage of the gate, then running it again: no decision is lost and
no fixer is ever dispatched twice blind.

The CLI is killed with SIGKILL (no cleanup of any kind); its sessions die with it. Recovery
goes the way it would in production: the dead job's heartbeat lapses, RQ fails it, the session
tier puts the judgement back in line, and the dead holder's session slot and repository lock
run out. The tests that wait for that are marked slow (tens of seconds, bounded).
"""

from __future__ import annotations

import json
import sys

import pytest

from dispatchq.findings.evidence.boundary import Approvals
from dispatchq.findings.evidence.pins import repo_id
from dispatchq.findings.grammar.plans import parse_plan
from dispatchq.storage.findings import FindingsStore
from tests.support.gate import (
    GONE,
    REMOVE,
    REMOVE_EDIT,
    World,
    analysis,
    analyst_count,
    analyst_step,
    finding_block,
    fixer_count,
    fixer_step,
    standard_alternatives,
    start,
    until,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")

ROLES = {"docs/guide.md": "edit", "scripts/old-tool.sh": "ref"}
NEVER = {"wait_for": "/nonexistent/never", "wait_timeout": "600"}


WORLD_REPORT = (
    finding_block("DOC-1", "Guide cites a removed script")
    + finding_block("DOC-2", "Second finding", location="`docs/notes.md:1`")
)


# --- stages 0 and 2 ---------------------------------------------------------------------------
def test_killed_in_the_sweep_the_next_run_replays_what_was_decided(world: World) -> None:
    world.report.write_text(
        "# Review\n\n"
        + finding_block("DOC-1", "Guide cites a removed script")
        + finding_block("DOC-2", "no location", location="—")
        + finding_block("DOC-3", "third")
    )
    world.steps(*(analyst_step(f"DOC-{n}", analysis(standard_alternatives())) for n in (1, 2, 3)))
    p = world.pty("sweep")
    try:
        p.expect(r"DOC-2 location path:line .*> ")
        p.send("docs/guide.md:1")  # stage 0's answer is written at once
        p.expect(r"DOC-1 decision .*> ")
        p.send("A")
        p.expect(r"DOC-2 decision .*> ")
        p.kill()  # stage 2, mid-sweep
    finally:
        p.close()
    decided = world.line("DOC-1", "Decision")
    assert decided is not None and world.line("DOC-2", "Decision") is None
    assert world.line("DOC-2", "Location") == "`docs/guide.md:1` (was: `—`)"
    assert analyst_count(world) == 3
    p = world.pty("sweep")
    try:
        p.expect(r"2 finding\(s\) need a decision; 1 decided earlier are replayed")
        p.expect(r"DOC-2 decision .*> ")  # no location question, DOC-1 not asked again
        p.send("B")
        p.expect(r"DOC-3 decision .*> ")
        p.send("A")
        assert p.finish() == 0
    finally:
        p.close()
    assert "location path:line" not in p.output and "DOC-1 decision" not in p.output
    assert world.line("DOC-1", "Decision") == decided
    assert world.line("DOC-2", "Decision") is not None and world.line("DOC-3", "Decision") is not None
    assert analyst_count(world) == 3  # unchanged findings reuse their analysis: no session spent


@pytest.mark.slow
def test_killed_during_analysis_the_question_is_simply_asked_again(world: World) -> None:
    world.report.write_text("# Review\n\n" + finding_block("DOC-1", "Guide cites a removed script"))
    world.steps(analyst_step("DOC-1", "never returned", **NEVER))
    p = world.pty("sweep")
    try:
        p.expect(r"batch 1 of 1: DOC-1")
        until(lambda: analyst_count(world) == 1, "the analyst to start")
        p.kill()  # stage 1, an analyst mid-session
    finally:
        p.close()
    world.steps(analyst_step("DOC-1", analysis(standard_alternatives())))
    p = world.pty("sweep")
    try:
        p.expect(r"DOC-1 decision .*> ", timeout=240)
        p.send("A")
        assert p.finish() == 0
    finally:
        p.close()
    assert analyst_count(world) == 2
    assert world.line("DOC-1", "Decision") is not None


# --- stage 3 ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_killed_after_the_fixer_edited_the_next_run_verifies_and_never_redispatches(world: World) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    world.steps(fixer_step("DOC-1", [REMOVE_EDIT], **NEVER))
    guide = world.root / "docs" / "guide.md"
    proc = start(world, "dispatch")
    until(lambda: "old-tool" not in guide.read_text(), "the fixer's edit")
    proc.kill()
    proc.wait()
    assert (world.line("DOC-1", "Dispatch") or "").startswith("attempt 1 dispatched")
    assert world.line("DOC-1", "Status") is None  # dispatched, outcome unknown
    summary, done = world.summary("dispatch")
    assert done.returncode == 0, done.stderr
    assert summary["fixed"] == ["DOC-1"]
    assert fixer_count(world) == 1  # verified, not dispatched again
    assert (world.line("DOC-1", "Status") or "").startswith("✅ Fixed")


@pytest.mark.slow
def test_killed_before_the_fixer_edited_the_attempt_is_recorded_then_redispatched(world: World) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    world.steps(fixer_step("DOC-1", [], **NEVER))
    proc = start(world, "dispatch")
    until(lambda: fixer_count(world) == 1, "the fixer to start")
    proc.kill()
    proc.wait()
    world.steps(fixer_step("DOC-1", [REMOVE_EDIT]))
    summary, done = world.summary("dispatch")
    assert done.returncode == 0, done.stderr
    assert summary["interrupted"] == [["DOC-1", 1]] and summary["fixed"] == ["DOC-1"]
    assert (world.line("DOC-1", "Decision") or "").endswith("; attempt 1: interrupted, unverified]")
    assert (world.line("DOC-1", "Dispatch") or "").startswith("attempt 2 dispatched")
    assert fixer_count(world) == 2


@pytest.mark.slow
def test_killed_during_verification_the_next_run_verifies_without_a_new_fixer(world: World) -> None:
    flag = world.tmp / "flag"
    started = world.tmp / "check-started"
    script = world.tmp / "wait_flag.py"
    script.write_text(
        "import os, sys, time\n"
        f"open({str(started)!r}, 'w').close()\n"
        "while not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"
        "print('ok')\n"
    )
    run = f"run {sys.executable} {script} {flag} → contains ok"
    world.decide("DOC-1", "A", REMOVE, plan=[GONE, run], roles=ROLES)
    checks = parse_plan(world.line("DOC-1", "Verification-plan") or "")
    Approvals(FindingsStore(world.redis), repo_id(world.root), world.record().ref("DOC-1")).approve(
        checks, [sys.executable, str(script), str(flag)], who="tester", at="now"
    )
    world.steps(fixer_step("DOC-1", [REMOVE_EDIT]))
    proc = start(world, "dispatch")
    until(started.exists, "verification to start")
    proc.kill()  # stage 3.5: the session is over, its grade not yet written
    proc.wait()
    assert world.line("DOC-1", "Status") is None
    flag.write_text("")
    summary, done = world.summary("dispatch")
    assert done.returncode == 0, done.stderr
    assert summary["fixed"] == ["DOC-1"]
    assert fixer_count(world) == 1
    assert world.line("DOC-1", "Verification") == "hard — 2 run, 2 passed"
    assert json.loads((world.plan_file).read_text()) == []
