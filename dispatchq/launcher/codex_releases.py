"""The OpenAI Codex CLI releases dispatchq supports, and the check a session worker makes at its start.

The same rule as Claude Code's (`dispatchq.launcher.releases`): `RELEASES` is oldest first, a
worker whose Codex command runs a release outside `RELEASES[0]`..`RELEASES[-1]` says so in one
WARNING, and still starts (a newer CLI often works; its limit wordings are untested).
docs/codex-cli.md says what each bound was read against.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

from dispatchq.launcher.releases import ask_version, parse_version

__all__ = ["RELEASES", "CodexCheck", "check_codex", "is_codex_command", "supported", "supported_range"]

# Oldest first. The next release: append it here (and drop the oldest when no host runs it).
RELEASES: tuple[str, ...] = ("0.169.0", "0.171.0")
_COMMAND_NAMES = frozenset({"codex", "codex.exe"})

log = logging.getLogger("dispatchq.session")


def supported(version: str) -> bool:
    """True when `version` lies within the oldest and the newest release listed."""
    parsed, oldest, newest = parse_version(version), parse_version(RELEASES[0]), parse_version(RELEASES[-1])
    return parsed is not None and oldest is not None and newest is not None and oldest <= parsed <= newest


def supported_range() -> str:
    return f"{RELEASES[0]} to {RELEASES[-1]}"


def is_codex_command(executable: str) -> bool:
    """True when the session command's program is Codex (by its file name)."""
    return os.path.basename(executable) in _COMMAND_NAMES


@dataclass(frozen=True)
class CodexCheck:
    """What `codex --version` said at a worker's start."""

    executable: str
    version: str | None
    supported: bool
    problem: str | None  # the WARNING line, when there is one


_CHECKED: dict[tuple[str, float], CodexCheck] = {}
_WARNED: set[str] = set()


def check_codex(command: str, environ: Mapping[str, str]) -> CodexCheck | None:
    """The installed Codex against the range, warning once per process; None when not `codex`.

    Asked once per executable (again only when the file changes: an upgrade in place).
    """
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    path_var = environ.get("PATH")
    if not argv or not is_codex_command(argv[0]):
        return None
    executable = shutil.which(argv[0], path=path_var)
    if executable is None:
        return None  # missing: the spawn reports it
    try:
        stamp = os.stat(executable).st_mtime
    except OSError:
        return None
    check = _CHECKED.get((executable, stamp))
    if check is None:
        version, problem = ask_version(executable, path_var, config_var="CODEX_HOME")
        ok = version is not None and supported(version)
        if version is not None and not ok:
            problem = (
                f"Codex CLI {version} ({executable}) is outside the supported range {supported_range()}: "
                "its limit and error wordings are untested (docs/codex-cli.md)"
            )
        elif problem is not None:
            problem = f"cannot tell which Codex CLI this is: {problem}; supported: {supported_range()}"
        check = CodexCheck(executable, version, ok, problem)
        _CHECKED[(executable, stamp)] = check
    if check.problem is not None and check.problem not in _WARNED:
        _WARNED.add(check.problem)
        log.warning("%s", check.problem)
    return check
