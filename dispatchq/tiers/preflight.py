"""Can this process start a session at all? Answered at start, not when the first judgement comes.

Every process that may spawn a session (`worker session`, `run`, `findings …`: all of them go
through the session worker's start, `workers.session.check_session_host`) resolves its session
command once: the first word of `DISPATCHQ_SESSION_COMMAND` looked up on PATH (or taken as a
path when it has a slash). A missing command is not fatal there (the judgements wait on the
blocked host, uncharged, until it is installed) but it must not be silent either: one WARNING
at start naming the command and the fix, and the worker's published facts say so, which
`status`, the page and `/metrics` turn into a warning.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dispatchq.settings import Settings

__all__ = ["COMMAND_HINT", "CommandCheck", "resolve_session_command", "warn_if_command_missing"]

log = logging.getLogger("dispatchq.session")

COMMAND_HINT = (
    "install Claude Code: npm install -g @anthropic-ai/claude-code, or set DISPATCHQ_SESSION_COMMAND"
)

_WARNED: set[str] = set()  # one warning per process and command, however many bursts `run` makes


@dataclass(frozen=True)
class CommandCheck:
    """The session command's first word and where it resolves (None: not found)."""

    command: str
    path: str | None

    @property
    def found(self) -> bool:
        return self.path is not None

    @property
    def problem(self) -> str | None:
        """The one line an operator reads when the command is missing, with the fix."""
        if self.found:
            return None
        name = self.command or "(empty)"
        return f"session command {name!r} not found on PATH: {COMMAND_HINT}"


def resolve_session_command(settings: Settings, environ: Mapping[str, str]) -> CommandCheck:
    """Where the session command's first word resolves in `environ`'s PATH (never raises)."""
    try:
        argv = shlex.split(settings.session_command)
    except ValueError:
        argv = []  # the settings validator refuses these; be safe if one slips through
    if not argv:
        return CommandCheck("", None)
    return CommandCheck(argv[0], shutil.which(argv[0], path=environ.get("PATH", os.defpath)))


def warn_if_command_missing(settings: Settings, environ: Mapping[str, str]) -> CommandCheck:
    """Resolve the command and, when it is missing, log one WARNING with the fix."""
    check = resolve_session_command(settings, environ)
    problem = check.problem
    if problem is not None and problem not in _WARNED:
        _WARNED.add(problem)
        log.warning("%s", problem)
    return check
