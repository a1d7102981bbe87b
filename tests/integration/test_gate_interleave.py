"""Issue 13, case 1: a resumed verify-first after another fixer ran on the same file.

One finding pins `docs/guide.md`. `findings dispatch` is killed (SIGKILL) while its fixer is
paused before editing. Before it is verified, another fixer of the same checkout edits that
file (and creates another) and its dispatch is logged, as a second finding dispatched first
would be. The first is then verified, fails, is recorded interrupted; what the other wrote is
attributable to a logged dispatch, so it re-pins silently and dispatches attempt 2, and
nobody is blamed for the other fixer's writes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.gate import GONE, REMOVE, REMOVE_EDIT, World, finding_block, fixer_step, until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")

ROLES = {"docs/guide.md": "edit", "scripts/old-tool.sh": "ref"}
NEVER = {"wait_for": "/nonexistent/never", "wait_timeout": "600"}
TRIM = "delete the line The rest of the guide. at docs/guide.md:2"
TRIM_EDIT = {"path": "docs/guide.md", "replace": ["The rest of the guide.\n", ""]}
TRIMMED = "grep -F rest docs → empty"


WORLD_REPORT = (
    finding_block("DOC-2", "Guide has a filler line", location="`docs/guide.md:2`")
    + finding_block("DOC-1", "Guide cites a removed script")
)


def fixer_prompts(world: World) -> list[str]:
    return [p for p in world.prompts() if "dispatchq's fixer" in p]


def test_a_resumed_verify_first_after_another_fixers_write_repins_and_dispatches_attempt_2(
    world: World,
) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    world.steps(fixer_step("DOC-1", [], **NEVER))
    proc = subprocess.Popen(
        world.argv("dispatch", "--json"),
        env=world.env,
        cwd=world.tmp,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    until(lambda: len(fixer_prompts(world)) == 1, "DOC-1's fixer to start")
    proc.kill()  # DOC-1's fixer is paused before editing; its before-observation is stored
    proc.wait()
    # Before DOC-1 is verified, another fixer of this checkout (another report's finding,
    # dispatched by another dispatchq) edits the same file, and its dispatch is logged.
    record = world.record()
    assert record.store is not None
    guide = world.root / "docs" / "guide.md"
    before = record.observe(["docs/guide.md"])
    guide.write_text(guide.read_text().replace(TRIM_EDIT["replace"][0], ""))
    (world.root / "docs" / "api.md").write_text("new page\n")  # a file that fixer created
    after = record.observe(["docs/guide.md"], carry=before)
    record.store.log_dispatch("reviews/other.md#OTHER-1", 1, before, after, at="now")
    world.steps(fixer_step("DOC-1", [REMOVE_EDIT]))
    summary, done = world.summary("dispatch")
    assert done.returncode == 0, done.stderr
    assert summary["interrupted"] == [["DOC-1", 1]], summary
    assert summary["fixed"] == ["DOC-1"], summary
    assert summary["set_aside"] == [] and summary["tampered"] == []
    assert summary["out_of_scope"] == []  # nobody is blamed for another fixer's write
    assert world.line("DOC-1", "Decision-retired") is None
    assert (world.line("DOC-1", "Decision") or "").endswith("; attempt 1: interrupted, unverified]")
    assert (world.line("DOC-1", "Dispatch") or "").startswith("attempt 2 dispatched")
    assert len(fixer_prompts(world)) == 2
    assert guide.read_text() == ""
