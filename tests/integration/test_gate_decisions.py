"""Issue 13, cases 5 and 6: what a person is offered at the sweep, and what a decision pins.

The real `dispatchq findings` CLI, real Redis, the fake `claude` as analyst and fixer, the
sweep driven through a pseudo-terminal."""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.gate import (
    REMOVE_EDIT,
    World,
    alt,
    analysis,
    analyst_step,
    finding_block,
    fixer_step,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="pty and process tests need Linux"
)

RENAME = "rename the call old_name() to new_name() at src/app.py:2"
NO_OLD = "grep -F old_name src → empty"


# --- case 5: a divergence withholds reject, whatever else was cited ----------------------------
def test_a_diverging_citation_withholds_reject_even_beside_one_outside_the_boundary(world: World) -> None:
    world.report.write_text(
        "# Review\n\n"
        + finding_block(
            "R-1",
            "old_name is deprecated",
            location="`src/app.py:2`",
            drift=None,
            problem="src/app.py calls old_name().",
            remediation="Call new_name() instead.",
        )
    )
    candidate = {
        "reason": "already renamed",
        "citations": [
            {"command": "grep -F old_name src", "output": "src/app.py:2:    return renamed()\n"},  # diverges
            {"command": "run pytest -q", "output": "1 passed"},  # outside the boundary: not run
        ],
    }
    answer = analysis(
        [
            alt("A", RENAME, [("src/app.py", "edit")], [NO_OLD]),
            alt(
                "B", "delete the line calling old_name() at src/app.py:2", [("src/app.py", "edit")], [NO_OLD]
            ),
        ],
        target="src/app.py:2",
        candidate=candidate,
    )
    world.steps(analyst_step("R-1", answer))
    p = world.pty("sweep", "--json")
    try:
        p.expect(r"DIVERGES — recorded \| fresh:")
        p.expect(r"reject is withheld")
        p.expect(r"R-1 decision \[A\] \[B\] \[skip\] \[other…\]> ")
        p.send("reject")
        p.expect(r"choose one of \[A\] \[B\] \[skip\] \[other…\]")
        p.send("skip")
        assert p.finish() == 0
    finally:
        p.close()
    assert "no re-runnable evidence" not in p.output
    assert world.line("R-1", "Status") is None


# --- case 6: the Target is pinned `:edit` only when the resolution writes there -------------------
def test_a_fix_that_edits_only_the_target_its_resolution_never_names_fails_out_of_scope(world: World) -> None:
    world.report.write_text("# Review\n\n" + finding_block("DOC-1", "Guide cites a removed script"))
    elsewhere = "add the sentence See the API guide. at docs/notes.md:3"
    world.decide(
        "DOC-1", "B", elsewhere, plan=["grep -F API docs/notes.md → lines 1"], roles={"docs/notes.md": "edit"}
    )
    pin = world.line("DOC-1", "Decision-pin") or ""
    assert "docs/guide.md=" in pin and ":ref" in pin.split("docs/guide.md=", 1)[1].split(",")[0]
    world.steps(fixer_step("DOC-1", [REMOVE_EDIT]))  # edits only the Target, docs/guide.md
    summary, done = world.summary("dispatch")
    assert done.returncode == 0, done.stderr
    assert summary["partially_fixed"] == [] and summary["fixed"] == []
    assert summary["failed"] == [["DOC-1", "attempt 1: failed"]]
    assert summary["out_of_scope"] == [["DOC-1", ["docs/guide.md"]]]
    assert world.line("DOC-1", "Status") is None
    assert (world.line("DOC-1", "Decision") or "").endswith("; attempt 1: failed]")
    assert json.loads(json.dumps(summary))  # the summary is plain JSON
