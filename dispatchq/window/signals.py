"""What Claude Code says in fields, read before its words: the machine signals of a run (pure).

Claude Code 2.1.332 states what happened beside the prose (read from its binary's schemas and
from runs against `dispatchq.testing.anthropic`; 2.1.197 has none of it, so every reader here
answers "nothing said" on the older forms and the text table decides as before):

- the synthetic `assistant` message of a refused turn carries `api_error` (`usage_limit_reached`,
  `model_requires_usage_credits`, auth and connection kinds) and, for the two usage ones,
  `api_error_params.rate_limit_info` with `rateLimitType` and `resetsAt`. It is the only
  structured signal when the stated reset is already past: 2.1.332 then prints no
  `rate_limit_event` at all;
- `rate_limit_info` (there and on `rate_limit_event`) names whose spend cap refused:
  `limitScope` (`service|channel|group_pool`), `memberSpendLimit` (the person's own cap),
  `dailyCapPaused` (the organisation paused); their lift is `overageResetsAt` when stated (the
  unified `resetsAt` is the plan window's, not the cap's), else only a person clears them;
- `unifiedWindows` (and `allowed_warning` events, in both versions) report each window's
  utilisation and reset: `usage_reports`, for people;
- the result's `startup_failure_reason` (stream-json, written when the host sets
  `CLAUDE_CODE_STARTUP_FAILURE_RESULTS`; three reasons always) and `credential_expires_at`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from dispatchq.window.messages import LimitKind, epoch_instant, spend_scope

__all__ = [
    "HOST_API_ERRORS",
    "JUDGEMENT_STARTUP_FAILURES",
    "RETRY_STARTUP_FAILURES",
    "TRANSIENT_API_ERRORS",
    "USAGE_API_ERRORS",
    "UsageReport",
    "api_error_verdict",
    "assistant_rate_limit_info",
    "credential_expires_at",
    "spend_limit",
    "startup_failure",
    "startup_verdict",
    "startup_words",
    "usage_reports",
]

#: `api_error` values that mean the account's usage or a credit gate refused the turn, with a
#: `rate_limit_info` record attached.
USAGE_API_ERRORS = frozenset({"usage_limit_reached", "model_requires_usage_credits"})
#: `api_error` (and the assistant `error`) values that every session of this host would meet:
#: the credential or the sign-in, not the judgement. They go to the host breaker.
HOST_API_ERRORS = frozenset(
    {
        "api_key_auth_disabled",
        "org_disabled_credential",
        "invalid_credential_header",
        "stored_login_refused",
        "oauth_refresh_store_refused",
        "gateway_signin_required",
        "gateway_session_expired",
        "connection_failed",
        "authentication_failed",
        "oauth_org_not_allowed",
        "account_on_hold",
        "verification_required",
        "cloud_credential_error",
    }
)
#: `api_error` values that say the request never got an answer: retry with back-off, no marker.
TRANSIENT_API_ERRORS = frozenset({"no_response", "stream_idle_timeout", "computer_slept"})
#: `api_error_type` values (the response body's `error.type`) that are a throttle, not the window.
_TRANSIENT_ERROR_TYPES = frozenset({"overloaded_error", "api_error"})

#: Start-up refusals that are this judgement's own (its checkout, the session it resumes): every
#: other judgement would start. The rest, and any reason newer than this list, refuse every
#: session on the host (its settings, sign-in, sandbox, CLI version): the host breaker.
JUDGEMENT_STARTUP_FAILURES = frozenset({"cwd_unavailable", "worktree_resume_refused", "worktree_unverified"})
#: The conversation to resume is running as a background session elsewhere: it ends by
#: itself, so the judgement backs off and retries (a throttle's path), charged nothing else.
RETRY_STARTUP_FAILURES = frozenset({"session_held_by_background"})

Verdict = Literal["host", "transient", "error"]


def _info(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def assistant_rate_limit_info(event: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The `rate_limit_info` of a refused turn's synthetic assistant message (2.1.332), else None.

    Marked rejected whatever it says: the message is the refusal's own record.
    """
    if event.get("type") != "assistant" or event.get("api_error") not in USAGE_API_ERRORS:
        return None
    params = _info(event.get("api_error_params"))
    info = _info(params.get("rate_limit_info")) if params is not None else None
    if info is None:
        return None
    return {**info, "status": "rejected"}


def spend_limit(info: Mapping[str, Any]) -> tuple[LimitKind, str, datetime | None] | None:
    """(kind, scope, lift) of a spend cap the record names by whose it is, else None.

    The lift is `overageResetsAt` (when the cap's period turns) or None: only a person clears
    it. An organisation paused outranks a cap (nothing runs while it is paused).
    """
    kind: LimitKind
    if info.get("dailyCapPaused") is True:
        kind = "org_paused"
    elif info.get("limitScope") in ("group_pool", "channel", "service"):
        kind = info["limitScope"]
    elif isinstance(info.get("memberSpendLimit"), Mapping) and info["memberSpendLimit"]:
        # 2.1.332 sends `memberSpendLimit: {}` on every rejection (a Fable cap too): only a
        # filled one names the person's own cap.
        kind = "member_spend"
    else:
        return None
    return kind, spend_scope(kind), epoch_instant(info.get("overageResetsAt"))


def api_error_verdict(
    events: Iterable[Mapping[str, Any]], result: Mapping[str, Any] | None
) -> Verdict | None:
    """What the run's own error fields say when no usage record does: host, transient, or nothing.

    Read only for a failed run: the assistant message's `error`/`api_error`, then the result's
    `api_error` and `api_error_type` (`overloaded_error`: the service's throttle).
    """
    said: list[object] = []
    for event in events:
        if event.get("type") == "assistant":
            said += [event.get("error"), event.get("api_error")]
    if result is not None:
        said.append(result.get("api_error"))
    if any(isinstance(v, str) and v in HOST_API_ERRORS for v in said):
        return "host"
    if any(isinstance(v, str) and v in TRANSIENT_API_ERRORS for v in said):
        return "transient"
    if result is not None and result.get("api_error_type") in _TRANSIENT_ERROR_TYPES:
        return "transient"
    return None


def startup_failure(result: Mapping[str, Any] | None) -> str | None:
    """The result's `startup_failure_reason`, when the CLI refused to start."""
    reason = result.get("startup_failure_reason") if result is not None else None
    return reason if isinstance(reason, str) and reason else None


def startup_verdict(reason: str, result: Mapping[str, Any] | None = None) -> Verdict:
    """Where a start-up refusal goes: the judgement's own error, a retry, or the host breaker.

    `config_file_invalid` names the file (`invalid_config_file`): the CLI's global config
    (`.claude.json` in its config folder: every session of the host) unless it says otherwise.
    """
    if reason in JUDGEMENT_STARTUP_FAILURES:
        return "error"
    named = _info(result.get("invalid_config_file")) if result is not None else None
    if reason == "config_file_invalid" and named is not None and named.get("is_global") is False:
        return "error"
    if reason in RETRY_STARTUP_FAILURES:
        return "transient"
    return "host"


def startup_words(result: Mapping[str, Any] | None) -> str:
    """The first line of what a refused start said (`errors`), for the host's block reason."""
    errors = result.get("errors") if result is not None else None
    if isinstance(errors, list):
        for said in errors:
            if isinstance(said, str) and said.strip():
                return said.strip().splitlines()[0]
    return ""


def credential_expires_at(result: Mapping[str, Any] | None) -> datetime | None:
    """When the stored claude.ai login ends for good (absent for a token from the environment)."""
    raw = result.get("credential_expires_at") if result is not None else None
    if not isinstance(raw, str) or not raw:
        return epoch_instant(raw) if isinstance(raw, int | float) else None
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


@dataclass(frozen=True)
class UsageReport:
    """One window's use as a session reported it: `window` is the CLI's name (`five_hour`, ...)."""

    window: str
    utilization: float | None
    resets_at: float | None
    status: str | None = None


def _share(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _report(window: object, entry: Mapping[str, Any], status: object) -> UsageReport | None:
    if not isinstance(window, str) or not window or len(window) > 48:
        return None
    used = _share(entry.get("utilization"))
    resets = epoch_instant(entry.get("resetsAt", entry.get("resets_at")))
    if used is None and resets is None:
        return None
    return UsageReport(
        window,
        used,
        resets.timestamp() if resets is not None else None,
        status if isinstance(status, str) else None,
    )


def usage_reports(events: Sequence[Mapping[str, Any]]) -> list[UsageReport]:
    """The latest utilisation and reset per window the run reported (the last event wins).

    From `unifiedWindows` (2.1.332, on every `rate_limit_event` whose rounded percentage moved)
    and from the `allowed_warning` / `rejected` record's own `rateLimitType` (both versions).
    """
    latest: dict[str, UsageReport] = {}
    for event in events:
        info = _info(event.get("rate_limit_info")) if event.get("type") == "rate_limit_event" else None
        if info is None:
            continue
        status = info.get("status")
        if status in ("allowed_warning", "rejected") and info.get("utilization") is not None:
            own = _report(info.get("rateLimitType"), info, status)
            if own is not None:
                latest[own.window] = own
        windows = _info(info.get("unifiedWindows")) or {}
        for window, entry in windows.items():
            if isinstance(entry, Mapping) and (report := _report(window, entry, entry.get("status"))):
                latest[report.window] = report
    return list(latest.values())
