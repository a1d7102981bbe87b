"""A session command whose whole output is held back until the test opens a gate.

What the session says (its answer, a limit) then reaches its worker only after the test has cut
the worker's host off from Redis: the fake `claude` runs to its end at once, its output waits.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["GATE", "gated_command"]

GATE = r"""
import os, subprocess, sys, time
gate, command = sys.argv[1], sys.argv[2:]
done = subprocess.run(command, input=sys.stdin.buffer.read(), stdout=subprocess.PIPE)
limit = time.monotonic() + 120
while not os.path.exists(os.path.join(gate, "open")) and time.monotonic() < limit:
    time.sleep(0.02)
sys.stdout.buffer.write(done.stdout)
sys.stdout.flush()
sys.exit(done.returncode)
"""


def gated_command(folder: Path, command: str) -> tuple[Path, str]:
    """`command` behind a gate in `folder`: the gate folder (touch `<gate>/open`) and the command."""
    gate = folder / "gate"
    gate.mkdir()
    script = folder / "gate.py"
    script.write_text(GATE)
    return gate, f"{sys.executable} {script} {gate} {command}"
