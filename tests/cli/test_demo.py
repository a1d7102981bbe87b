"""`dispatchq demo` shows the whole ladder with its stand-ins, and spends nothing.

Run as a newcomer runs it (a real process, the shipped examples as package data, a fresh
embedded Redis of its own): typed answers appear with their confidence, one judgement is
too unsure and climbs to a session, the stand-in session's usage limit pauses the line and
the probe at the lift drains it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from dispatchq.settings import parent_environment


def test_the_demo_shows_every_tier_a_typed_confidence_an_escalation_and_the_window(tmp_path: Path) -> None:
    env = {k: v for k, v in parent_environment().items() if not k.startswith(("DISPATCHQ_", "TYPESAFE_"))}
    env["DISPATCHQ_SESSION_COMMAND"] = "claude -p"  # a person's real command: the demo must ignore it
    done = subprocess.run(
        [sys.executable, "-m", "dispatchq.cli", "demo", "--lift-after", "2"],
        env=env,
        cwd=tmp_path,  # not the repository: the examples come from the package
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Traceback" not in out
    narration = [line for line in done.stdout.splitlines() if line.startswith("  - ")]
    assert len(narration) == 12, narration  # one line per judgement, after each of the two runs
    final = narration[6:]
    assert re.search(
        r"comment:9001 \(comment-actionable\): the typed tier answered yes at 0\.\d\d confidence", final[2]
    )
    assert "issue-area): the typed tier answered docs at 0.91 confidence" in final[4]
    assert "the code tier answered merge-by-hand" in final[1]  # the file list knows; no "cannot tell"
    assert "comment:9002" in final[3] and "the session tier answered" in final[3]
    assert "typed moved-up (confidence 0.4 < 0.6" in final[3]  # the escalation, with its reason
    assert any("waits for a session: usage window closed" in line for line in narration[:6])
    assert re.search(r"typed requests the stand-in TypeSafe API answered: [1-9]", done.stderr)
