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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dispatchq.settings import Settings

__all__ = [
    "COMMAND_HINT",
    "CommandCheck",
    "resolve_command",
    "resolve_session_command",
    "unrunnable_backends",
    "warn_if_command_missing",
]

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
    return resolve_command(settings.session_command, environ)


def resolve_command(command: str, environ: Mapping[str, str]) -> CommandCheck:
    """Where `command`'s first word resolves in `environ`'s PATH (never raises)."""
    try:
        argv = shlex.split(command)
    except ValueError:
        argv = []  # the settings validator refuses these; be safe if one slips through
    if not argv:
        return CommandCheck("", None)
    return CommandCheck(argv[0], shutil.which(argv[0], path=environ.get("PATH", os.defpath)))


def unrunnable_backends(
    backends: Iterable[str], settings: Settings, environ: Mapping[str, str]
) -> dict[str, str]:
    """The pool's backends whose command this host lacks, each with why, while another's is here.

    A pool of Claude Code and Codex credentials on a host with only one of the two CLIs should
    answer on that one: the other's credentials are refused here (routing), and judgements
    only they may take wait, naming the missing command, for a host that has it. With no
    backend's command here, or one backend only, nothing is named: the first spawn finds the
    command missing and the host breaker holds the host, as it always has.
    """
    # Lazy: `status` reads this module (its warnings) and must not import every backend to start.
    from dispatchq.backends import command_for  # noqa: PLC0415

    named = sorted(set(backends))
    missing: dict[str, str] = {}
    for backend in named:
        check = resolve_command(command_for(backend, settings), environ)
        if not check.found:
            missing[backend] = (
                f"{backend} sessions cannot start on host {settings.host}: "
                f"{check.command or '(empty)'!r} not found on PATH"
            )
    if len(named) < 2 or len(missing) == len(named):
        return {}
    for why in missing.values():
        if why not in _WARNED:
            _WARNED.add(why)
            log.warning("%s; their credentials are left to the other backends and hosts", why)
    return missing


def warn_if_command_missing(settings: Settings, environ: Mapping[str, str]) -> CommandCheck:
    """Resolve the command and, when it is missing, log one WARNING with the fix."""
    check = resolve_session_command(settings, environ)
    problem = check.problem
    if problem is not None and problem not in _WARNED:
        _WARNED.add(problem)
        log.warning("%s", problem)
    return check
