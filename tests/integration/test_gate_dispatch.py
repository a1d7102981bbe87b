"""The decision gate's stages 3-4 end to end: `dispatchq findings dispatch` (unattended) with the
fake `claude` as a fixer that edits a real git checkout as told, real Redis, real subprocesses.

Decisions are set up exactly as the sweep writes them (through `DecisionRecord.write_decision`, so
dispatchq's tamper evidence knows them); what is asserted is what the report says afterwards,
what the run summary discloses, and how many fixers were spawned.
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from dispatchq.findings.evidence.boundary import Approvals
from dispatchq.findings.evidence.pins import repo_id
from dispatchq.findings.grammar.plans import parse_plan
from dispatchq.queue.parts import QUEUE_PARTS
from dispatchq.storage import keys
from dispatchq.storage.findings import FindingsStore
from tests.support.gate import (
    GONE,
    REMOVE,
    REMOVE_EDIT,
    World,
    finding_block,
    fixer_step,
)
from tests.support.helpers import run_cli

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")

ROLES = {"docs/guide.md": "edit", "scripts/old-tool.sh": "ref"}
APPEND = "append the line See-also-notes to docs/guide.md:2"
APPEND_CHECK = "grep -F See-also-notes docs/guide.md → lines 1"
APPEND_EDIT = {"path": "docs/guide.md", "append": "See-also-notes\n"}


WORLD_REPORT = (
    finding_block("DOC-1", "Guide cites a removed script")
    + finding_block("DOC-2", "Guide should point at the notes", location="`docs/guide.md:2`")
)


def fixer_spawns(world: World) -> list[str]:
    return [p for p in world.prompts() if "dispatchq's fixer" in p]


def attempts(world: World, fid: str) -> list[str]:
    value = world.line(fid, "Decision") or ""
    return re.findall(r"attempt \d+: [a-z, ]+?(?=;|\]$)", value)


# --- grading ----------------------------------------------------------------------------------
def test_a_fix_is_graded_from_the_tree_and_the_copy_strips_the_record(world: World) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    world.steps(fixer_step("DOC-1", [REMOVE_EDIT]))
    summary, done = world.summary("dispatch")
    assert done.returncode == 0, done.stderr
    assert (
        summary["fixed"] == ["DOC-1"] and not summary["out_of_scope"]
    )  # its own writes are not out of scope
    assert (world.line("DOC-1", "Status") or "").startswith("✅ Fixed (")
    assert world.line("DOC-1", "Verification") == "hard — 1 run, 1 passed"
    assert world.line("DOC-1", "Dispatch") is not None
    (prompt,) = fixer_spawns(world)
    assert f"User decision: {REMOVE}" in prompt
    for stripped in ("Verification-plan", "Decision-pin", "**Dispatch:**", "**Decision:**", GONE):
        assert stripped not in prompt  # the fixer never sees the checks it is graded by
    assert "**Location:** `docs/guide.md:1`" in prompt
    check = run_cli(["findings", "check", str(world.report), "--repo", str(world.root)], world.env)
    assert check.returncode == 0, check.stdout  # every line the gate wrote keeps its grammar


def test_a_fixer_that_changes_nothing_fails_twice_and_the_decision_retires(world: World) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    world.steps(fixer_step("DOC-1"), fixer_step("DOC-1"))
    summary, _ = world.summary("dispatch")
    assert summary["failed"] == [["DOC-1", "attempt 1: failed"]]
    assert attempts(world, "DOC-1") == ["attempt 1: failed"]
    assert world.line("DOC-1", "Status") is None  # the finding reappears next run
    summary, _ = world.summary("dispatch")
    assert summary["failed"] == [["DOC-1", "attempt 2: failed"]] and summary["retired"] == ["DOC-1"]
    assert world.line("DOC-1", "Decision") is None
    retired = world.line("DOC-1", "Decision-retired") or ""
    assert retired.endswith("attempt 1: failed; attempt 2: failed]")
    summary, _ = world.summary("dispatch")
    assert summary["fixed"] == [] and len(fixer_spawns(world)) == 2  # a retired decision never replays


def test_a_second_retirement_is_stalled_and_offers_only_reject(world: World) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    world.steps(*[fixer_step("DOC-1") for _ in range(4)])
    world.summary("dispatch")
    world.summary("dispatch")
    other = "replace the sentence at docs/guide.md:1 with Build with make."
    world.decide("DOC-1", "other", other, plan=[GONE], roles={"docs/guide.md": "edit"})
    world.summary("dispatch")
    summary, _ = world.summary("dispatch")
    assert summary["stalled"] == [["DOC-1", [REMOVE, other]]]
    check = run_cli(["findings", "check", str(world.report), "--repo", str(world.root), "--json"], world.env)
    (state,) = [f["state"] for f in json.loads(check.stdout)["findings"] if f["id"] == "DOC-1"]
    assert state == "stalled"
    p = world.pty("sweep")
    try:
        p.expect(r"stalled — no progress: two decisions were tried and retired:")
        p.expect(re.escape(other))
        p.expect(r"DOC-1 decision \[skip\] \[reject\]> ")
        p.send("reject")
        p.expect(r"DOC-1 reject reason \(one line, required\)> ")
        p.send("cannot land")
        p.expect(r"DOC-2 decision")  # DOC-2 was analysed; DOC-1 never was again
        p.kill()
    finally:
        p.close()
    assert (world.line("DOC-1", "Status") or "").endswith(" — cannot land")
    assert not any("Finding: DOC-1 (" in prompt for prompt in world.prompts())


# --- the pin ----------------------------------------------------------------------------------
def test_a_mismatch_caused_by_an_earlier_dispatch_is_repinned_silently(world: World) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    world.decide("DOC-2", "A", APPEND, plan=[APPEND_CHECK], roles={"docs/guide.md": "edit"})
    pinned = world.line("DOC-2", "Decision-pin")
    world.steps(fixer_step("DOC-1", [REMOVE_EDIT]), fixer_step("DOC-2", [APPEND_EDIT]))
    summary, _ = world.summary("dispatch")
    assert summary["fixed"] == ["DOC-1", "DOC-2"] and summary["set_aside"] == []
    assert world.line("DOC-2", "Decision-pin") != pinned  # re-pinned against the tree it saw
    assert len(fixer_spawns(world)) == 2


def test_an_unattributable_mismatch_sets_the_finding_aside_without_a_dispatch(world: World) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    decision = world.line("DOC-1", "Decision")
    (world.root / "docs" / "guide.md").write_text("Someone rewrote the guide.\n")  # not a logged dispatch
    world.steps(fixer_step("DOC-1", [REMOVE_EDIT]))
    summary, done = world.summary("dispatch")
    assert done.returncode == 0
    assert [fid for fid, _ in summary["set_aside"]] == ["DOC-1"]
    assert "docs/guide.md" in summary["set_aside"][0][1]
    assert world.line("DOC-1", "Decision") is None
    assert world.line("DOC-1", "Decision-retired") == decision  # superseded, history kept
    assert world.line("DOC-1", "Dispatch") is None
    assert fixer_spawns(world) == []
    assert "dispatchq findings sweep" in " ".join(summary["notes"])


# --- scope, verification ----------------------------------------------------------------------
def test_an_out_of_scope_write_is_reported_and_the_report_edit_too(world: World) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    edits = [
        REMOVE_EDIT,
        {"path": "src/app.py", "append": "# touched\n"},
        {"path": "reviews/report.md", "append": "\nA fixer's note.\n"},
    ]
    world.steps(fixer_step("DOC-1", edits))
    summary, _ = world.summary("dispatch")
    assert summary["fixed"] == ["DOC-1"]
    ((fid, paths),) = summary["out_of_scope"]
    assert fid == "DOC-1" and sorted(paths) == ["reviews/report.md", "src/app.py"]


def test_approved_checks_run_and_a_missing_approval_is_unrunnable_not_an_abort(world: World) -> None:
    run = "run git --version → contains git"
    world.decide("DOC-1", "A", REMOVE, plan=[GONE, run], roles=ROLES)
    world.decide("DOC-2", "A", APPEND, plan=[run], roles={"docs/guide.md": "edit"})
    checks = parse_plan(world.line("DOC-1", "Verification-plan") or "")
    Approvals(FindingsStore(world.redis), repo_id(world.root), world.record().ref("DOC-1")).approve(
        checks, ["git", "--version"], who="tester", at="now"
    )
    world.steps(fixer_step("DOC-1", [REMOVE_EDIT]), fixer_step("DOC-2", [APPEND_EDIT]))
    summary, done = world.summary("dispatch")
    assert done.returncode == 0
    assert summary["fixed"] == ["DOC-1"]
    assert world.line("DOC-1", "Verification") == "hard — 2 run, 2 passed"
    assert summary["unavailable"][0][0] == "DOC-2"
    assert attempts(world, "DOC-2") == ["attempt 1: dispatched, unverified"]
    assert world.line("DOC-2", "Verification") == f"unavailable — 0 run; 1 not run: {run}"


def test_partial_coverage_is_disclosed(world: World) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE, "run git --version → contains git"], roles=ROLES)
    world.steps(fixer_step("DOC-1", [REMOVE_EDIT]))
    summary, _ = world.summary("dispatch")
    assert summary["fixed"] == ["DOC-1"] and summary["advisory"] == ["DOC-1"]
    assert summary["coverage"][0][0] == "DOC-1"
    assert (world.line("DOC-1", "Verification") or "").startswith(
        "advisory — 1 run, 1 passed; 1 not run: run git"
    )


def test_an_unpinnable_path_is_named_and_never_reaches_a_command(world: World) -> None:
    resolution = "delete the sentence at docs/guide.md:1 and the copy in docs/a.md;id"
    pin = world.decide("DOC-1", "A", resolution, plan=[GONE], roles={"docs/guide.md": "edit"})
    assert pin.pin is not None and any(e.value == "unpinnable" for e in pin.pin.entries)
    world.steps(fixer_step("DOC-1", [REMOVE_EDIT]))
    summary, _ = world.summary("dispatch")
    assert summary["fixed"] == ["DOC-1"]
    assert [entry[:2] for entry in summary["unpinnable"]] == [["DOC-1", "docs/a.md;id"]]


# --- the usage window -------------------------------------------------------------------------
def test_a_fixer_refused_at_spawn_costs_no_attempt_and_waits_for_the_window(world: World) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    world.steps(fixer_step("DOC-1", scenario="limit_event"), fixer_step("DOC-1", [REMOVE_EDIT]))
    summary, done = world.summary("dispatch")
    assert done.returncode == 1  # something still waits
    assert summary["waiting"][0][0] == "DOC-1"
    assert world.line("DOC-1", "Dispatch") is None  # the marker was rewritten back
    assert attempts(world, "DOC-1") == []
    assert world.redis.exists(keys.marker("general"))
    summary, done = world.summary("dispatch")  # still closed: nothing is spawned
    assert done.returncode == 1 and len(fixer_spawns(world)) == 1
    assert run_cli(["window", "open"], world.env).returncode == 0
    summary, done = world.summary("dispatch")
    assert done.returncode == 0 and summary["fixed"] == ["DOC-1"]
    assert attempts(world, "DOC-1") == []  # the refusal was never an attempt
    assert world.line(
        "DOC-1",
        "Dispatch",
    ).startswith("attempt 1 dispatched ")


def test_a_fixer_cut_off_mid_run_is_resumed_with_its_session(world: World) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    half = {"path": "docs/guide.md", "replace": ["Run scripts/", "Run "]}
    rest = {"path": "docs/guide.md", "replace": ["Run old-tool.sh to build.\n", ""]}
    world.steps(
        fixer_step("DOC-1", [half], scenario="limit_mid_run", session_id="sess-fix-1"),
        fixer_step("DOC-1", [rest]),
    )
    summary, done = world.summary("dispatch")
    assert done.returncode == 1 and summary["waiting"][0][0] == "DOC-1"
    assert (world.line("DOC-1", "Dispatch") or "").startswith("attempt 1 dispatched")  # still in flight
    assert run_cli(["window", "open"], world.env).returncode == 0
    summary, done = world.summary("dispatch")
    assert summary["fixed"] == ["DOC-1"]
    first, second = [
        json.loads(line)["argv"] for line in (world.tmp / "prompts.jsonl").read_text().splitlines()
    ]
    assert "--resume" not in first and second[second.index("--resume") + 1] == "sess-fix-1"
    assert attempts(world, "DOC-1") == []
    assert "old-tool" not in (world.root / "docs" / "guide.md").read_text()


def test_a_change_in_the_expected_set_with_a_failing_plan_is_partially_fixed(world: World) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    world.steps(fixer_step("DOC-1", [{"path": "docs/guide.md", "append": "half done\n"}]))
    summary, _ = world.summary("dispatch")
    assert summary["partially_fixed"] == ["DOC-1"]
    assert (world.line("DOC-1", "Status") or "").startswith("⚠️ Partially Fixed")


def test_fixer_judgements_are_bound_to_this_host_and_checkout(world: World) -> None:
    from dispatchq.findings.texts.returns import FIXER
    from dispatchq.settings import load_settings
    from dispatchq.storage.store import Store

    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    world.steps(fixer_step("DOC-1", [REMOVE_EDIT]))
    world.summary("dispatch")
    store = Store(world.redis)
    (fixer,) = [r for r in store.get_many(store.ids()) if r is not None and r.kind == FIXER]
    assert fixer.host == load_settings(world.env).host
    assert fixer.context["checkout"] == str(world.root)
    block = json.loads(json.dumps(fixer.state))["block"]
    assert fixer.item == f"attempt 1 block {block}"


def test_the_repository_lock_is_held_by_one_judgement_at_a_time(world: World) -> None:
    from dispatchq.findings.run.fixer import RepoLock
    from dispatchq.runtime import Runtime
    from dispatchq.settings import load_settings

    runtime = Runtime(settings=load_settings(world.env), redis=world.redis, queue_parts=QUEUE_PARTS)
    repo = repo_id(world.root)
    first, second = RepoLock(runtime, repo, "j-one"), RepoLock(runtime, repo, "j-two")
    try:
        assert first.acquire(wait=0)
        assert not second.acquire(wait=0.3)
        assert first.acquire(wait=0)  # re-entrant: RQ re-running the same job takes it back
        assert world.redis.ttl(keys.findings_lock(repo)) > 0  # a dead holder's lease runs out
        first.release()
        assert second.acquire(wait=0)
        first.release()  # releasing a lock one does not hold is a no-op
        assert world.redis.get(keys.findings_lock(repo)) == b"j:j-two"
    finally:
        first.release()
        second.release()
