"""Where a judgement's sessions' stderr is kept, apart from the session tier's machinery.

`dispatchq result`, `serve`'s judgement page and the session tier all need the path; only
the tier writes. Its own module so that the readers do not import the whole tier (a
`result` in a loop pays for nothing it does not show).
"""

from __future__ import annotations

import logging
import os
import shlex
from datetime import UTC, datetime
from pathlib import Path

from dispatchq.launcher.spawn import LaunchResult

__all__ = ["session_log_path", "write_session_log"]

log = logging.getLogger(__name__)


def session_log_path(data_dir: Path, jid: str) -> Path:
    """Where a judgement's sessions' stderr is kept (`dispatchq result --json` shows it)."""
    return data_dir.expanduser() / "session-logs" / f"{jid}.log"


def write_session_log(data_dir: Path, jid: str, result: LaunchResult) -> None:
    """Append one spawn's whole stderr: the reason shown is one line of it, this is the rest."""
    path = session_log_path(data_dir, jid)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8", errors="replace") as out:
            when = datetime.now(UTC).isoformat(timespec="seconds")
            out.write(f"=== {when} spawn: {shlex.join(result.argv)} (exit {result.returncode})\n")
            out.write(
                result.stderr if result.stderr.endswith("\n") or not result.stderr else result.stderr + "\n"
            )
    except OSError:
        log.warning("cannot write the session log %s", path, exc_info=True)
