"""The Claude Code releases dispatchq supports, and the check a session worker makes at its start.

`RELEASES` is the one list: `ops/dev.py` installs each into its own folder
(`.cache/claude-code/<version>/`), the real-client tests run against each, and a session
worker whose session command is `claude` warns when the installed CLI is outside
`RELEASES[0]`..`RELEASES[-1]`. Adding the next release is one edit: append it to `RELEASES`
(docs/claude-code.md). The oldest stays until its users have moved on, because a host that
has not upgraded still runs it.

Standard library only: `ops/dev.py` reads this file with `runpy` before anything is
installed.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "NEWEST",
    "OLDEST",
    "RELEASES",
    "VERSION_TIMEOUT",
    "ClaudeCodeCheck",
    "ask_version",
    "check_claude_code",
    "claude_code_fact",
    "install_dir",
    "installed_claude",
    "is_claude_command",
    "parse_version",
    "supported",
    "supported_range",
    "warn_if_unsupported",
]

# Oldest first. The next release: append it here (and drop the oldest when no host runs it).
RELEASES: tuple[str, ...] = ("2.1.197", "2.1.332")
OLDEST, NEWEST = RELEASES[0], RELEASES[-1]
#: `claude --version` answers in well under a second; a CLI that hangs must not hold a worker.
VERSION_TIMEOUT = 15.0

_VERSION = re.compile(r"(?<![\d.])(\d+)\.(\d+)\.(\d+)(?![\d.])")
_COMMAND_NAMES = frozenset({"claude", "claude.exe"})

log = logging.getLogger("dispatchq.session")


def parse_version(text: str) -> tuple[int, int, int] | None:
    """The first `X.Y.Z` in `text` (`2.1.332 (Claude Code)` -> (2, 1, 332)), else None."""
    match = _VERSION.search(text)
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def _key(version: str) -> tuple[int, int, int]:
    parsed = parse_version(version)
    if parsed is None:  # a typo in RELEASES: fail loudly where it is read
        raise ValueError(f"Claude Code release {version!r} is not X.Y.Z")
    return parsed


def supported(version: str) -> bool:
    """True when `version` lies within the oldest and the newest release dispatchq tests."""
    parsed = parse_version(version)
    return parsed is not None and _key(OLDEST) <= parsed <= _key(NEWEST)


def supported_range() -> str:
    return f"{OLDEST} to {NEWEST}"


def install_dir(root: Path, version: str) -> Path:
    """Where `ops/dev.py` installs one release: its own folder, so both can be had at once."""
    return root / ".cache" / "claude-code" / version


def installed_claude(root: Path, version: str) -> Path:
    return install_dir(root, version) / "node_modules" / ".bin" / "claude"


def is_claude_command(executable: str) -> bool:
    """True when the session command's program is Claude Code (by its file name)."""
    return os.path.basename(executable) in _COMMAND_NAMES


@dataclass(frozen=True)
class ClaudeCodeCheck:
    """What `claude --version` said at a worker's start: the version and whether it is supported."""

    executable: str
    version: str | None
    supported: bool
    problem: str | None  # the WARNING line, when there is one

    def fact(self) -> dict[str, object]:
        return {
            "version": self.version,
            "supported": self.supported,
            "supported_range": supported_range(),
            "problem": self.problem,
        }


_CHECKED: dict[tuple[str, float], ClaudeCodeCheck] = {}
_WARNED: set[str] = set()


def _executable(session_command: str, path_var: str | None) -> str | None:
    """The session command's program when it is `claude`, resolved on the worker's PATH."""
    try:
        argv = shlex.split(session_command)
    except ValueError:
        return None  # the spawn reports a command that cannot be split
    if not argv or not is_claude_command(argv[0]):
        return None
    return shutil.which(argv[0], path=path_var) or None


def _ask_version(executable: str, path_var: str | None) -> tuple[str | None, str | None]:
    """Claude Code's `--version` in an empty config folder, its updater and telemetry off."""
    extra = {"DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1"}
    return ask_version(executable, path_var, config_var="CLAUDE_CONFIG_DIR", extra=extra)


def ask_version(
    executable: str, path_var: str | None, *, config_var: str, extra: Mapping[str, str] | None = None
) -> tuple[str | None, str | None]:
    """(version, None) or (None, why not): `executable --version` with no credential, in an
    empty home that is also its config folder (`config_var`), so no login or setting of this
    host's can change or delay what it says."""
    with tempfile.TemporaryDirectory(prefix="dispatchq-version-") as home:
        env = {"PATH": path_var or os.defpath, "HOME": home, config_var: home, **(extra or {})}
        try:
            done = subprocess.run(
                [executable, "--version"],
                env=env,
                cwd=home,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=VERSION_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None, f"`{executable} --version` did not answer within {VERSION_TIMEOUT:g} s"
        except OSError as exc:
            return None, f"`{executable} --version` could not start ({exc.strerror or type(exc).__name__})"
    parsed = parse_version(done.stdout)
    if done.returncode != 0 or parsed is None:
        printed = (done.stdout.strip() or done.stderr.strip())[-200:]
        return None, f"`{executable} --version` printed {printed!r} (exit {done.returncode})"
    return ".".join(str(part) for part in parsed), None


def check_claude_code(session_command: str, environ: Mapping[str, str]) -> ClaudeCodeCheck | None:
    """The installed CLI's version against the supported range; None when the command is not `claude`.

    Run once per executable (and again only when the file changes: an upgrade in place), so a
    worker's heartbeat can report it without starting a process each time.
    """
    path_var = environ.get("PATH")
    executable = _executable(session_command, path_var)
    if executable is None:
        return None
    try:
        stamp = os.stat(executable).st_mtime
    except OSError:
        return None  # missing: the start-up check and the spawn say so
    cached = _CHECKED.get((executable, stamp))
    if cached is not None:
        return cached
    version, problem = _ask_version(executable, path_var)
    ok = version is not None and supported(version)
    if version is not None and not ok:
        problem = (
            f"Claude Code {version} ({executable}) is outside the supported range {supported_range()}: "
            "its limit and error wordings are untested (docs/claude-code.md)"
        )
    elif problem is not None:
        problem = f"cannot tell which Claude Code this is: {problem}; supported: {supported_range()}"
    check = ClaudeCodeCheck(executable, version, ok, problem)
    _CHECKED[(executable, stamp)] = check
    return check


def warn_if_unsupported(session_command: str, environ: Mapping[str, str]) -> ClaudeCodeCheck | None:
    """`check_claude_code`, and one WARNING per process when the CLI is outside the range."""
    check = check_claude_code(session_command, environ)
    if check is not None and check.problem is not None and check.problem not in _WARNED:
        _WARNED.add(check.problem)
        log.warning("%s", check.problem)
    return check


def claude_code_fact(session_command: str, environ: Mapping[str, str]) -> dict[str, object] | None:
    """The worker fact `claude_code`: version, supported, range, problem (None when not `claude`)."""
    check = check_claude_code(session_command, environ)
    return None if check is None else check.fact()
