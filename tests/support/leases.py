"""The scripted fake `claude` and its plan and spawn count, shared by the lease tests and their fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["FAKE_CLAUDE", "SPOOL_WAIT", "WAIT_LEASE", "plan", "spawns"]


# --- a real (fake) session run in-process: the fence ends it, an unwritable answer is spooled -----
FAKE_CLAUDE = Path(__file__).resolve().parents[1] / "support" / "fake_claude.py"


def plan(tmp_path: Path, *steps: dict[str, Any]) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(list(steps)))


def spawns(tmp_path: Path) -> int:
    log = tmp_path / "spawns.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


# --- the spool wait's two hosts (tests/integration/test_spool_wait.py) ----------------------------
#: DISPATCHQ_SESSION_LEASE of the holder's host: it holds for this plus the wait.
WAIT_LEASE = 2
#: DISPATCHQ_SESSION_SPOOL_WAIT of the holder's host, seconds.
SPOOL_WAIT = 3
