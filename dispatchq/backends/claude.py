"""Claude Code (`claude -p`) as a `SessionBackend`.

Each method hands over to the module that has long owned that part, so the rule and its
tests stay where they are and this class is only the seam: `launcher.spawn.build_argv` and
`launcher.environment.session_argv` (argv, `--resume`, the forced settings),
`launcher.environment.session_environment` (the allowlist and the one credential),
`launcher.egress.allowed_destinations` (`ANTHROPIC_BASE_URL`, else `api.anthropic.com:443`),
`window.limits` (what a run printed, a live event, the reserve) and `launcher.releases`
(the tested releases).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

from dispatchq.backends.base import Destination, ReleaseCheck
from dispatchq.launcher.egress import allowed_destinations
from dispatchq.launcher.environment import session_argv, session_environment
from dispatchq.launcher.releases import supported_range, warn_if_unsupported
from dispatchq.launcher.spawn import build_argv
from dispatchq.pools.credentials import API_KEY_VAR, TOKEN_VAR
from dispatchq.window import limits
from dispatchq.window.limits import LimitSignal, SessionOutcome, WindowState

__all__ = ["CLAUDE_CONFIG_VAR", "CLAUDE_CREDENTIAL_VARS", "ClaudeBackend"]

#: Where Claude Code keeps its login, settings and transcripts (one folder per judgement).
CLAUDE_CONFIG_VAR = "CLAUDE_CONFIG_DIR"
#: What Claude Code authenticates with: a subscription's long-lived token, an API key, or a
#: bearer token for a gateway. A session gets exactly the one it was chosen with.
CLAUDE_CREDENTIAL_VARS = frozenset({TOKEN_VAR, API_KEY_VAR, "ANTHROPIC_AUTH_TOKEN"})


@dataclass(frozen=True)
class ClaudeBackend:
    """Claude Code's argv, environment, egress, output readers and release table.

    `resumes_across_credentials` is True: Claude Code keeps a session's transcript in its
    config folder, and that folder is the judgement's (`tiers.confine.config_dir`, kept
    until the judgement ends), not the credential's. A judgement cut off under one
    credential and started again under another gets the same `CLAUDE_CONFIG_DIR`, so
    `--resume <id>` finds the transcript; the credential only authenticates the next call.
    """

    name: str = "claude"
    config_var: str = CLAUDE_CONFIG_VAR
    credential_vars: frozenset[str] = CLAUDE_CREDENTIAL_VARS
    resumes_across_credentials: bool = True

    def argv(self, command: str, extra_args: Sequence[str] = (), resume: str | None = None) -> list[str]:
        """`build_argv` (`--resume ID`), then the forced settings as `--settings` for `claude`."""
        return session_argv(build_argv(command, extra_args=extra_args, resume=resume))

    def environment(
        self,
        parent_environ: Mapping[str, str],
        *,
        deny: Iterable[str],
        allow: Iterable[str],
        credential_var: str,
        credential_value: str | None,
        scrub_subprocesses: bool,
        config_dir: Path,
    ) -> dict[str, str]:
        """`session_environment`, the other credential variables withheld, `CLAUDE_CONFIG_DIR` set.

        The allowlist already withholds every secret-shaped name; removing the CLI's other
        credential variables by name as well keeps "a session sees exactly the credential it
        was given" true even if that rule is ever widened: the CLI would pick a second
        credential up on its own, and choose between the two by its own precedence.
        """
        env = session_environment(
            parent_environ,
            deny=deny,
            allow=allow,
            credential_var=credential_var,
            credential_value=credential_value,
            scrub_subprocesses=scrub_subprocesses,
        )
        for name in self.credential_vars:
            if name != credential_var:
                env.pop(name, None)
            env.pop(f"{name}_FILE", None)  # dispatchq reads files; a session gets values only
        env[self.config_var] = str(config_dir)
        return env

    def config_files(
        self, session_env: Mapping[str, str], credential_var: str, credential_value: str | None
    ) -> dict[str, str]:
        """None: Claude Code takes its credential from a variable and its settings from `--settings`."""
        return {}

    def renewed_login(self, config_dir: Path, given: str | None) -> str | None:
        """None: the credential is a variable's token, which a session cannot renew in place."""
        return None

    def egress(self, session_env: Mapping[str, str], extra: Iterable[str] = ()) -> frozenset[Destination]:
        return allowed_destinations(session_env, extra)

    def read_outcome(
        self,
        stdout: str,
        *,
        now: datetime,
        default_tz: str | tzinfo,
        unknown_reset: float,
        returncode: int | None = None,
        stderr: str = "",
    ) -> SessionOutcome:
        return limits.read_outcome(
            stdout,
            now=now,
            default_tz=default_tz,
            unknown_reset=unknown_reset,
            returncode=returncode,
            stderr=stderr,
        )

    def refine_limits(
        self,
        outcome: SessionOutcome,
        *,
        command: str,
        session_env: Mapping[str, str],
        cwd: Path,
        now: datetime,
        unknown_reset: float,
    ) -> SessionOutcome:
        """As it is: Claude Code's stream already carries its limits in fields."""
        return outcome

    def cost(self, outcome: SessionOutcome, *, model: str | None, prices: str) -> float | None:
        """What Claude Code reported (`total_cost_usd`): it prices its own runs."""
        return outcome.total_cost_usd

    def window_state(self, event: Mapping[str, Any]) -> WindowState | None:
        return limits.window_state(event)

    def reserve_signals(
        self, events: Sequence[Mapping[str, Any]], *, reserve: float, now: datetime
    ) -> list[tuple[LimitSignal, float]]:
        return limits.reserve_signals(events, reserve=reserve, now=now)

    def check_release(self, command: str, environ: Mapping[str, str]) -> ReleaseCheck | None:
        check = warn_if_unsupported(command, environ)
        if check is None:
            return None
        return ReleaseCheck(
            backend=self.name,
            executable=check.executable,
            version=check.version,
            supported=check.supported,
            supported_range=supported_range(),
            problem=check.problem,
        )
