"""OpenAI Codex CLI (`codex exec --json`) as a `SessionBackend`.

What it runs and why (docs/codex-cli.md, with the sources each fact was read from):

- argv: `codex exec --json --skip-git-repo-check --sandbox workspace-write -c
  approval_policy="never" [kind args] [resume <thread>] -`, the prompt on stdin;
- environment: the allowlist, `CODEX_HOME` (the judgement's config folder) and exactly one
  credential: an API key as `CODEX_API_KEY` (metered), or a ChatGPT plan's `auth.json`, which
  is no variable at all: `config_files` hands it to the tier to write into that `CODEX_HOME`;
- egress: `OPENAI_BASE_URL` when the session's environment names one (a stand-in, a gateway),
  else the plan's hosts or the API's;
- readers: `dispatchq.backends.codex_stream` (the JSON Lines) and
  `dispatchq.window.codex_limits` (the limit words, in the zone of the host that ran the CLI).
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, tzinfo
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dispatchq.backends.base import Destination, ReleaseCheck
from dispatchq.backends.codex_appserver import read_rate_limits
from dispatchq.backends.codex_prices import cost_usd, price_table
from dispatchq.backends.codex_stream import codex_window_state, read_codex_outcome, token_usage
from dispatchq.errors import ConfigError, UserError
from dispatchq.launcher.codex_releases import check_codex
from dispatchq.launcher.codex_releases import supported_range as codex_range
from dispatchq.launcher.egress import parse_destination
from dispatchq.launcher.environment import SESSION_FORCED, SESSION_SCRUB_FLAG, session_environment
from dispatchq.launcher.spawn import build_argv
from dispatchq.pools.credentials import CODEX_API_KEY_VAR, CODEX_AUTH_VAR, OPENAI_API_KEY_VAR
from dispatchq.window.codex_limits import (
    CODEX_LIMIT_ID,
    CodexWindow,
    limits_from_windows,
    prefer_structured,
    windows_from_rate_limits,
)
from dispatchq.window.limits import GENERAL_SCOPE, LimitSignal, SessionOutcome, UsageReport, WindowState

__all__ = [
    "CHATGPT_BASE_URL_VAR",
    "CODEX_API_KEY_VAR",
    "CODEX_AUTH_VAR",
    "CODEX_BASE_URL_VAR",
    "CODEX_CONFIG_VAR",
    "CODEX_CREDENTIAL_VARS",
    "SHELL_SECRETS_EXCLUDED",
    "CodexBackend",
]

#: Where Codex keeps its login (`auth.json`), its config and its threads.
CODEX_CONFIG_VAR = "CODEX_HOME"
#: Every variable Codex takes a credential from; a session sees at most the one it was given.
CODEX_CREDENTIAL_VARS = frozenset(
    {CODEX_API_KEY_VAR, OPENAI_API_KEY_VAR, "CODEX_ACCESS_TOKEN", CODEX_AUTH_VAR}
)
#: The API base a session is pointed at (Codex's `openai_base_url`), passed through when set.
CODEX_BASE_URL_VAR = "OPENAI_BASE_URL"
#: The ChatGPT backend a plan's login talks to (Codex's `chatgpt_base_url`: its usage readings,
#: its account checks), passed through when set, as a stand-in or a gateway needs.
CHATGPT_BASE_URL_VAR = "CHATGPT_BASE_URL"
#: Each passed-through base, by the config key Codex reads it from.
_BASES = {CODEX_BASE_URL_VAR: "openai_base_url", CHATGPT_BASE_URL_VAR: "chatgpt_base_url"}

_PLAN_HOSTS: frozenset[Destination] = frozenset({("chatgpt.com", 443), ("auth.openai.com", 443)})
_API_HOSTS: frozenset[Destination] = frozenset({("api.openai.com", 443)})
_SANDBOX_FLAGS = (
    "--sandbox",
    "-s",
    "--dangerously-bypass-approvals-and-sandbox",
    "--yolo",
    "--approve-for-me",
    "--not-so-yolo",
)
#: Codex's filter of secret-shaped names (`*KEY*`, `*SECRET*`, `*TOKEN*`) out of the environment
#: of the commands the model runs: the session's API key never reaches them.
SHELL_SECRETS_EXCLUDED = "shell_environment_policy.ignore_default_excludes=false"
_THREAD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def _has_flag(words: Sequence[str], flags: Iterable[str]) -> bool:
    wanted = tuple(flags)
    return any(w in wanted or any(w.startswith(f"{f}=") for f in wanted if f.startswith("--")) for w in words)


def _has_override(words: Sequence[str], key: str) -> bool:
    """Whether a `-c key=…` (or `--config key=…`) is among `words`."""
    return any(
        flag in ("-c", "--config") and value.split("=", 1)[0].strip() == key
        for flag, value in pairwise(words)
    )


def _usage_report(window: CodexWindow) -> UsageReport:
    """A window's reading as the usage store keeps it: the plan's by its kind (`five_hour`,
    `seven_day`), any other by its limit id and slot; use as a share of 1."""
    named = window.kind if window.limit_id == CODEX_LIMIT_ID and window.kind != "unknown" else None
    return UsageReport(
        window=named or f"{window.limit_id}_{window.slot}",
        utilization=window.used_percent / 100,
        resets_at=window.resets_at.timestamp() if window.resets_at is not None else None,
        status="rejected" if window.full else "allowed",
    )


@dataclass(frozen=True)
class CodexBackend:
    """Codex's argv, environment, config files, egress, output readers and release table.

    `resumes_across_credentials` is False: a thread lives under `CODEX_HOME` beside the login
    it ran under, and whether the service continues one account's thread under another was not
    verified; a judgement moved to another credential starts afresh, which costs a run but
    never a resume that finds nothing.
    """

    name: str = "codex"
    config_var: str = CODEX_CONFIG_VAR
    credential_vars: frozenset[str] = CODEX_CREDENTIAL_VARS
    resumes_across_credentials: bool = False

    def argv(self, command: str, extra_args: Sequence[str] = (), resume: str | None = None) -> list[str]:
        """`command exec --json …`, the kind's args, `resume <thread>` when resuming, `-` (stdin).

        Each of dispatchq's words is added only where the command and the kind's args do not
        already say it: `exec`, `--json`, `--skip-git-repo-check`, a sandbox (a kind may choose
        `--sandbox read-only`), `approval_policy`. `SHELL_SECRETS_EXCLUDED` comes after the
        kind's args, always: a kind cannot hand the credential to the model's commands.
        """
        base = build_argv(command)
        extra = list(extra_args)
        if not all(isinstance(arg, str) for arg in extra):
            raise ConfigError("session args must be a list of strings")
        given = [*base[1:], *extra]
        # After the whole command: it may be a wrapper (`env … codex`, an interpreter and a script).
        words = [*base, *([] if "exec" in given else ["exec"])]
        if not _has_flag(given, ("--json", "--experimental-json")):
            words.append("--json")
        if "--skip-git-repo-check" not in given:
            words.append("--skip-git-repo-check")
        if not _has_flag(given, _SANDBOX_FLAGS):
            words += ["--sandbox", "workspace-write"]
        if (
            not _has_override(given, "approval_policy")
            and "--dangerously-bypass-approvals-and-sandbox" not in given
        ):
            words += ["-c", 'approval_policy="never"']
        # Last, so it wins over a kind's own: Codex's filter of *KEY*/*SECRET*/*TOKEN* names out of
        # the environment of the commands the model runs stays on (its default is off).
        words += [*extra, "-c", SHELL_SECRETS_EXCLUDED]
        if resume is not None:
            if not _THREAD_ID.match(resume):
                raise UserError(f"thread id {resume!r} is not a plain token; refusing to resume it")
            words += ["resume", resume]
        return [*words, "-"]

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
        """The allowlist, the one credential (an API key only: a plan's login goes in a file),
        `CODEX_HOME`, and `OPENAI_BASE_URL` / `CHATGPT_BASE_URL` when the parent names them and
        `deny` does not.

        Claude Code's forced variables are not Codex's and are left out; every credential
        variable Codex reads but the chosen one is withheld by name, with its `_FILE` form.
        """
        in_env = credential_var != CODEX_AUTH_VAR
        env = session_environment(
            parent_environ,
            deny=deny,
            allow=allow,
            credential_var=credential_var,
            credential_value=credential_value if in_env else None,
            scrub_subprocesses=scrub_subprocesses,
        )
        for name in [*SESSION_FORCED, SESSION_SCRUB_FLAG]:
            env.pop(name, None)
        for name in self.credential_vars:
            if name != credential_var or not in_env:
                env.pop(name, None)
            env.pop(f"{name}_FILE", None)
        denied = list(deny)
        for name in _BASES:
            base = parent_environ.get(name, "").strip()
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in denied):
                continue
            if base and not urlsplit(base).username and not urlsplit(base).password:
                env[name] = base  # a URL with a password in it stays behind
        env[self.config_var] = str(config_dir)
        return env

    def config_files(
        self, session_env: Mapping[str, str], credential_var: str, credential_value: str | None
    ) -> dict[str, str]:
        """What goes into the session's `CODEX_HOME` before it starts (name -> text, written 0600).

        `auth.json`: a plan's login, the credential itself. `config.toml`: `openai_base_url` and
        `chatgpt_base_url` when the session's environment names `OPENAI_BASE_URL` or
        `CHATGPT_BASE_URL` (Codex takes them from its config, not from those variables), so the
        egress and the CLI agree on the hosts.
        """
        files: dict[str, str] = {}
        if credential_var == CODEX_AUTH_VAR and credential_value:
            files["auth.json"] = credential_value
        config = "".join(
            f"{key} = {json.dumps(session_env[name])}\n"
            for name, key in _BASES.items()
            if session_env.get(name)
        )
        if config:
            files["config.toml"] = config
        return files

    def renewed_login(self, config_dir: Path, given: str | None) -> str | None:
        """The plan's `auth.json` when Codex rewrote it (it does when it refreshes the access
        token, and the refresh may rotate the refresh token too); None when it is as given,
        gone, not a login, or another account's.

        The session is untrusted and its `CODEX_HOME` is its own to write: a login it left
        there is carried back only when it names the same account as the one it was given
        (`tokens.account_id` and the ID token's subject), so a session cannot swap in a
        login of its own choosing for the sessions after it.
        """
        if not given:
            return None
        try:
            text = (config_dir / "auth.json").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        if text == given.strip():
            return None
        renewed, before = login_identity(text), login_identity(given)
        if renewed is None or renewed != before:
            return None
        return text

    def egress(self, session_env: Mapping[str, str], extra: Iterable[str] = ()) -> frozenset[Destination]:
        """The hosts `OPENAI_BASE_URL` and `CHATGPT_BASE_URL` name when set (a stand-in, a gateway);
        else the API for a key, the plan's hosts for a login."""
        found: set[Destination] = set()
        for name in _BASES:
            parts = urlsplit(session_env.get(name) or "")
            if parts.hostname:
                found.add((parts.hostname.lower(), parts.port or (80 if parts.scheme == "http" else 443)))
        if not found:
            keyed = any(session_env.get(name) for name in CODEX_CREDENTIAL_VARS - {CODEX_AUTH_VAR})
            found = set(_API_HOSTS if keyed else _PLAN_HOSTS)
        found.update(parse_destination(item) for item in extra if item.strip())
        return frozenset(found)

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
        return read_codex_outcome(
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
        """A limit read from the words, replaced by `account/rateLimits/read`'s full windows.

        Asked only after a limit, with the session's environment and in its `CODEX_HOME` (never
        the checkout, whose project config is not the app-server's to read). No reading, or no
        full window in it (a model's own limit), leaves the words' limit as it is.
        """
        if outcome.kind != "limit" or outcome.limit is None:
            return outcome
        home = session_env.get(self.config_var)
        where = Path(home) if home else cwd
        reply = read_rate_limits([*build_argv(command), "app-server"], session_env, where)
        if reply is None:
            return outcome
        windows = windows_from_rate_limits(reply)
        # Each window's use, for status and pacing, as Claude Code's `unifiedWindows` are kept.
        outcome = replace(outcome, usage=tuple(_usage_report(w) for w in windows))
        structured = limits_from_windows(windows, now=now, unknown_reset=unknown_reset)
        if not structured:
            return outcome
        chosen = prefer_structured(structured, outcome.limit)
        general = [s for s in chosen if s.scope == GENERAL_SCOPE]
        lead = max(general or chosen, key=lambda s: s.lifts_at)
        return replace(outcome, limit=lead, limits=chosen)

    def cost(self, outcome: SessionOutcome, *, model: str | None, prices: str) -> float | None:
        """The run's tokens times `model`'s price (`PRICES` under the operator's `prices`); None
        when the run reported no tokens or the model has no price (the estimate then stays)."""
        usage = token_usage(outcome)
        if usage is None:
            return None
        return cost_usd(usage, model, price_table(prices))

    def window_state(self, event: Mapping[str, Any]) -> WindowState | None:
        return codex_window_state(event)

    def reserve_signals(
        self, events: Sequence[Mapping[str, Any]], *, reserve: float, now: datetime
    ) -> list[tuple[LimitSignal, float]]:
        """None from the stream: `codex exec --json` reports no window's use (the app-server does)."""
        return []

    def check_release(self, command: str, environ: Mapping[str, str]) -> ReleaseCheck | None:
        check = check_codex(command, environ)
        if check is None:
            return None
        return ReleaseCheck(
            backend=self.name,
            executable=check.executable,
            version=check.version,
            supported=check.supported,
            supported_range=codex_range(),
            problem=check.problem,
        )


def login_identity(text: str) -> tuple[str, str] | None:
    """Whose login an `auth.json` is: its account and its ID token's subject, read without
    verifying the token (None when it is not a plan login with a refresh token)."""
    try:
        login = json.loads(text)
    except ValueError:
        return None
    tokens = login.get("tokens") if isinstance(login, dict) else None
    if not isinstance(tokens, dict) or not tokens.get("refresh_token"):
        return None
    account = tokens.get("account_id")
    subject = _jwt_subject(tokens.get("id_token"))
    if not account and not subject:
        return None
    return str(account or ""), subject


def _jwt_subject(token: object) -> str:
    """The `sub` claim of a JWT's payload, unverified ('' when there is none)."""
    if not isinstance(token, str) or token.count(".") != 2:
        return ""
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error):
        return ""
    return str(claims.get("sub") or "") if isinstance(claims, dict) else ""
