"""Whether a session may ask Claude Code to scrub its own tool subprocesses.

dispatchq scrubs the environment a session starts with; `CLAUDE_CODE_SUBPROCESS_ENV_SCRUB=1`
asks Claude Code to do the same for every tool it runs (a `Bash` tool call, a hook) inside a
bubblewrap sandbox, so a command the model runs cannot read the session's own credential
from its environment. Claude Code 2.1.197 refuses to start at all with the flag set when
`bwrap` is missing (exit 1, `error: bubblewrap is required for subprocess env scrubbing …`),
and bwrap can be installed but unusable inside a container (no user namespaces). So the
setting `DISPATCHQ_SESSION_SUBPROCESS_SCRUB` is decided here, once per process:

- `auto` (default): on when `bwrap --ro-bind / / true` succeeds, else off with one warning;
- `on`: bwrap must work, else the session worker refuses to start (exit 2, with the hint);
- `off`: never asked for.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

from dispatchq.errors import SettingsError
from dispatchq.launcher.sandbox import nested_bwrap_problem, probe_problem

__all__ = ["BWRAP_HINT", "SCRUB_MODES", "ScrubDecision", "bwrap_check", "decide_scrub"]

SCRUB_MODES = ("auto", "on", "off")
BWRAP_HINT = (
    "install bubblewrap and socat (Debian/Ubuntu: sudo apt-get install -y bubblewrap socat; "
    "Fedora: sudo dnf install -y bubblewrap socat) on a host that allows user namespaces"
)


@dataclass(frozen=True)
class ScrubDecision:
    """Whether sessions get the scrub flag, and the one line to log when `auto` turned it off."""

    enabled: bool
    warning: str | None = None


@functools.lru_cache(maxsize=8)
def bwrap_check(path_var: str) -> str | None:
    """None when `bwrap --ro-bind / / true` works on this PATH, else why not (one line)."""
    bwrap = shutil.which("bwrap", path=path_var)
    if bwrap is None:
        return "bwrap not found on PATH"
    return probe_problem(
        [bwrap, "--ro-bind", "/", "/", "true"], path_var, "bwrap --ro-bind / / true failed", timeout=15
    )


def decide_scrub(mode: str, environ: Mapping[str, str], *, confined: bool = False) -> ScrubDecision:
    """What `mode` means on this host (PATH from `environ`, as the session would see it).

    `confined` (the session runs in dispatchq's own sandbox): the probe runs inside that same
    sandbox, since that is where Claude Code will start its bwrap.
    """
    if mode == "off":
        return ScrubDecision(False)
    path_var = environ.get("PATH", os.defpath)
    problem = nested_bwrap_problem(path_var) if confined else bwrap_check(path_var)
    if problem is None and shutil.which("socat", path=path_var) is None:
        # Claude Code's tool sandbox relays its network through socat: without it every Bash
        # call fails ("Sandbox dependencies not available: socat not installed").
        problem = "socat not found on PATH (Claude Code's tool scrub needs it beside bwrap)"
    if problem is None:
        return ScrubDecision(True)
    if mode == "on":
        raise SettingsError(
            f"DISPATCHQ_SESSION_SUBPROCESS_SCRUB=on needs a usable bubblewrap ({problem}): {BWRAP_HINT}, "
            "or set DISPATCHQ_SESSION_SUBPROCESS_SCRUB=auto"
        )
    return ScrubDecision(
        False,
        f"subprocess scrubbing is off: {problem} (sessions' tool subprocesses inherit the session's "
        f"environment; {BWRAP_HINT})",
    )
