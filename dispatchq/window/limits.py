"""Reading what a headless Claude Code session printed: answer, usage limit, throttle or error.

Pure functions over stdout text, with `now` and every default passed in, so every message
form Claude Code has printed can be pinned down in a table-driven test.

Output shapes this module reads, as Claude Code prints them (checked against public sources;
field names are the CLI's own):

- `--output-format json`: one result object, e.g. as captured from Claude Code 2.1.175 on a
  usage-limit hit (a test fixture quoted in a public repository's headless-runner tests)::

      {"type": "result", "subtype": "success", "is_error": true, "api_error_status": 429,
       "num_turns": 35, "result": "You've hit your session limit • resets 4:50pm (America/Denver)",
       "session_id": "30f7a294-…", "total_cost_usd": 0.15, "stop_reason": "stop_sequence"}

  Note `subtype` stays "success" and the separator there is U+2022 `•`. An authentication
  failure looks alike with `terminal_reason: "api_error"`. With `--verbose` the json format
  prints an array of every message instead; both are accepted.
- `--output-format stream-json --verbose`: one event per line. The first is
  `{"type": "system", "subtype": "init", "session_id": …, "cwd": …, "model": …, "tools": […]}`
  (field list per the Elixir `ClaudeCode.Message.SystemMessage.Init` docs on hexdocs.pm), so the
  session id is known before any model call. Then `rate_limit_event`s (docs of the Rust crate
  `claude-codes`, struct `io::RateLimitEvent` on docs.rs)::

      {"type": "rate_limit_event", "rate_limit_info": {"status": "allowed", "resetsAt": 1771390800,
       "rateLimitType": "five_hour", "overageStatus": "rejected",
       "overageDisabledReason": "org_level_disabled", "isUsingOverage": false},
       "uuid": "…", "session_id": "…"}

  `status` is `allowed | allowed_warning | rejected`; `rateLimitType` is one of `five_hour`,
  `seven_day`, `seven_day_opus`, `seven_day_sonnet`, `overage`. The CLI emits one on every
  run, informationally, so only `rejected` means closed (several public fixes say exactly that:
  Anantys-oss/koan#1596, closedloop-ai/claude-plugins#79, alpha-omega-security/scrutineer#551,
  which also counts `isUsingOverage && overageStatus == "rejected"`). `resetsAt` is epoch
  seconds; one SDK documents milliseconds, so values above 1e11 are read as milliseconds.
  A limit also shows up as an `assistant` event whose `message.model` is `"<synthetic>"`
  (with `error: "rate_limit"`, `apiErrorStatus: 429` in transcripts), then the `result` event.
- Text forms (titles of anthropics/claude-code issues, e.g. #1328 `Claude AI usage limit
  reached|1748268000`, #6119 `Claude usage limit reached. Your limit will reset at 5pm
  (Europe/Warsaw).`, #42801 `You've hit your limit · resets 8pm (America/New_York)`) and the
  throttles that are *not* the usage window: `API Error: Rate limit reached` (#34413),
  `API Error: Server is temporarily limiting requests (not your usage limit) · Rate limited`
  (#63014; manaflow-ai/subrouter#24 traces it to `overloaded_error`) and
  `API Error: 529 Overloaded…` / `API Error: 529 {"type":"error","error":{"type":"overloaded_error"…`
  (#39745, #72390).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, tzinfo
from typing import Any, Literal

from dispatchq.window.messages import (
    GENERAL_SCOPE,
    MODELS,
    SKEW_WINDOW,
    STATEMENT_PRECISION,
    WEEKLY_SCOPE,
    LimitKind,
    LimitSignal,
    detect_limit,
    epoch_instant,
    error_line,
    is_transient,
    is_whole_limit,
    is_whole_transient,
    limit_kind,
    normalize_message,
    person_hold,
    require_aware,
    resolve_timezone,
)
from dispatchq.window.signals import (
    UsageReport,
    api_error_verdict,
    assistant_rate_limit_info,
    credential_expires_at,
    spend_limit,
    startup_failure,
    startup_verdict,
    startup_words,
    usage_reports,
)

__all__ = [
    "GENERAL_SCOPE",
    "WEEKLY_SCOPE",
    "LimitKind",
    "LimitSignal",
    "OutcomeKind",
    "SessionOutcome",
    "UsageReport",
    "WindowState",
    "detect_limit",
    "is_credential_refused",
    "is_host_wide",
    "is_transient",
    "limit_from_event",
    "normalize_message",
    "parse_events",
    "read_outcome",
    "reprobe_backoff",
    "reserve_signals",
    "resolve_timezone",
    "window_state",
]

OutcomeKind = Literal["answer", "limit", "transient", "error", "host"]
WindowState = Literal["open", "closed"]
SYNTHETIC_MODEL = "<synthetic>"


@dataclass(frozen=True)
class SessionOutcome:
    """What one session run amounted to.

    - `answer`: a normal result; `text` is the answer.
    - `limit`: the usage window is closed; `limit` says until when. `refused_at_spawn` means
      nothing ran (one turn, no cost, no sign the window was ever open): the judgement goes
      back to the front of the line. Otherwise it was cut off mid-run and can be resumed with
      `--resume session_id`.
    - `transient`: a throttle or overload that is not the usage limit; retry with backoff, no
      marker.
    - `error`: anything else that failed; `text` carries the cause.
    - `host`: a failure that says nothing about the judgement and everything about the host
      (not logged in, a rejected credential, no network, no credit, the command refusing to
      start): the host is blocked, the judgement waits uncharged.

    `resume_missing`: a `--resume` found no transcript on this host (`No conversation found
    with session ID`): a fresh session for the same judgement will do.
    """

    kind: OutcomeKind
    text: str
    session_id: str | None = None
    is_error: bool = False
    limit: LimitSignal | None = None
    limits: tuple[LimitSignal, ...] = ()
    api_error_status: int | None = None
    subtype: str | None = None
    terminal_reason: str | None = None
    num_turns: int | None = None
    total_cost_usd: float | None = None
    window_opened: bool = False
    result: Mapping[str, Any] | None = None
    resume_missing: bool = False
    events: tuple[Mapping[str, Any], ...] = ()
    usage: tuple[UsageReport, ...] = ()
    credential_expires_at: datetime | None = None
    startup_failure: str | None = None

    @property
    def refused_at_spawn(self) -> bool:
        if self.kind != "limit" or self.window_opened:
            return False
        return (self.num_turns or 0) <= 1 and not (self.total_cost_usd or 0.0)

    @property
    def cut_off_mid_run(self) -> bool:
        return self.kind == "limit" and not self.refused_at_spawn


# --- stdout ------------------------------------------------------------------------------
def parse_events(stdout: str) -> list[dict[str, Any]]:
    """Every JSON object Claude Code printed, in order.

    Accepts stream-json (one object per line), the json format (one object) and the json
    format with `--verbose` (one array). Lines that are not JSON objects (warnings, plain
    text output) are skipped; a caller that finds no events reads stdout as plain text.
    """
    text = stdout.strip()
    if not text:
        return []
    if text[0] in "[{":
        try:
            whole = json.loads(text)
        except ValueError:
            whole = None
        if isinstance(whole, dict):
            return [whole]
        if isinstance(whole, list):
            return [item for item in whole if isinstance(item, dict)]
    events: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            events.append(item)
    return events


# --- structured events ---------------------------------------------------------------------
_RATE_TYPE = re.compile(r"^[a-z0-9_]{1,48}$")
_EVENT_MODELS = frozenset(MODELS)
# Window types whose scope the event states itself; any other (a model's own limit) takes the
# scope the message names (`You've hit your Fable 5 limit`).
_STATED_SCOPE = frozenset({"five_hour", "seven_day", "overage"})
# Types that name their model another way. Claude Code 2.1.197 words `seven_day_overage_included`
# as "Fable 5 limit" and reports it only for Fable sessions, also under a message that names no
# model (`You've hit your monthly spend limit. /model to switch models.`): Fable's scope, never
# the general one (other models still answer).
_TYPE_SCOPES = {"seven_day_overage_included": "model:fable"}


def _event_kind(rate_type: object) -> tuple[LimitKind, str]:
    """The (kind, scope) a `rateLimitType` names; a type `LimitKind` does not know is `unknown`."""
    if not isinstance(rate_type, str) or not _RATE_TYPE.match(rate_type):
        return "unknown", GENERAL_SCOPE
    if rate_type == "overage":
        return "credits", GENERAL_SCOPE
    if rate_type in _TYPE_SCOPES:
        return limit_kind(rate_type), _TYPE_SCOPES[rate_type]
    model = rate_type.removeprefix("seven_day_")
    if rate_type.startswith("seven_day_") and model in _EVENT_MODELS:
        return limit_kind(rate_type), f"model:{model}"
    if rate_type == "seven_day":
        return "seven_day", WEEKLY_SCOPE
    return limit_kind(rate_type), GENERAL_SCOPE


def _rejected_info(event: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The `rate_limit_info` of a rate_limit_event, or of a refused turn's assistant message."""
    if event.get("type") == "assistant":
        return assistant_rate_limit_info(event)
    if event.get("type") != "rate_limit_event":
        return None
    info = event.get("rate_limit_info")
    return info if isinstance(info, Mapping) else None


def _rejection(event: Mapping[str, Any]) -> tuple[object, object] | None:
    """(rateLimitType, resetsAt) of a rejecting rate_limit_event (or refused turn), else None."""
    info = _rejected_info(event)
    if info is None:
        return None
    if info.get("status") == "rejected":
        if info.get("isUsingOverage") is True and info.get("overageStatus") in ("allowed", "allowed_warning"):
            return None  # served and billed as extra usage: the request went through
        return info.get("rateLimitType"), info.get("resetsAt")
    if info.get("isUsingOverage") is True and info.get("overageStatus") == "rejected":
        return "overage", info.get("overageResetsAt", info.get("resetsAt"))
    return None


def limit_from_event(event: Mapping[str, Any], *, now: datetime, unknown_reset: float) -> LimitSignal | None:
    """The structured signal: a `rate_limit_event` that rejected, with its `resetsAt`.

    Also the refused turn's own record (2.1.332's `api_error_params.rate_limit_info`), and a
    spend cap named by whose it is (`spend_limit`), which lifts when the cap does.
    """
    require_aware(now)
    rejection = _rejection(event)
    if rejection is None:
        return None
    info = _rejected_info(event) or {}
    spend = spend_limit(info) if info.get("status") == "rejected" else None
    if spend is not None:
        return _spend_signal(*spend, now=now)
    rate_type, resets_at = rejection
    kind, scope = _event_kind(rate_type)
    lifts = epoch_instant(resets_at)
    label = rate_type if isinstance(rate_type, str) else "unknown"
    if lifts is None:
        return LimitSignal(
            lifts_at=now + timedelta(seconds=unknown_reset),
            kind=kind,
            scope=scope,
            message=f"rate_limit_event rejected ({label}), no reset time",
            source="event",
            reset_known=False,
        )
    message = f"rate_limit_event rejected ({label}), resets {lifts.isoformat()}"
    stated = f"resetsAt={int(lifts.timestamp())}"
    if lifts <= now:
        return LimitSignal(
            now, kind, scope, message, just_reset=True, stated=stated, source="event", stated_at=lifts
        )
    return LimitSignal(lifts, kind, scope, message, stated=stated, source="event", stated_at=lifts)


def _spend_signal(kind: LimitKind, scope: str, lifts: datetime | None, *, now: datetime) -> LimitSignal:
    """A spend cap or a paused organisation: up until the cap's stated turn, else until a person clears it."""
    if lifts is None:
        return replace(person_hold(kind, scope, f"rate_limit_event rejected ({kind})", now), source="event")
    message = f"rate_limit_event rejected ({kind}), resets {lifts.isoformat()}"
    stated = f"resetsAt={int(lifts.timestamp())}"
    return LimitSignal(
        max(lifts, now),
        kind,
        scope,
        message,
        just_reset=lifts <= now,
        stated=stated,
        source="event",
        stated_at=lifts,
    )


def _assistant_text(event: Mapping[str, Any]) -> str:
    message = event.get("message")
    if not isinstance(message, Mapping):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        str(block.get("text", ""))
        for block in content
        if isinstance(block, Mapping) and block.get("type") == "text"
    )


def _is_synthetic(event: Mapping[str, Any]) -> bool:
    message = event.get("message")
    model = message.get("model") if isinstance(message, Mapping) else None
    return (
        model == SYNTHETIC_MODEL
        or bool(event.get("error"))
        or bool(event.get("isApiErrorMessage"))
        or bool(event.get("is_api_error_message"))
    )


_LOOKS_LIKE_LIMIT = re.compile(
    r"limit reached|hit your .{0,40}limit|out of extra usage|usage limit", re.IGNORECASE
)


def window_state(event: Mapping[str, Any]) -> WindowState | None:
    """What one stream event says about the usage window, for a probe watching a live session.

    `open`: the API answered (a non-rejecting `rate_limit_event`, a real model's assistant
    message, a tool result coming back, a successful result). `closed`: a rejection, or a
    synthetic assistant message or failed result carrying a limit. None: no evidence either way
    (notably the `system/init` event, printed before any model call).
    """
    kind = event.get("type")
    if kind == "rate_limit_event":
        return "closed" if _rejection(event) is not None else "open"
    if kind == "assistant":
        if not _is_synthetic(event):
            return "open"
        text = _assistant_text(event)
        if event.get("error") == "rate_limit" or (not is_transient(text) and _LOOKS_LIKE_LIMIT.search(text)):
            return "closed"
        return None
    if kind == "stream_event":
        return "open"
    if kind == "user":
        message = event.get("message")
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and any(
            isinstance(block, Mapping) and block.get("type") == "tool_result" for block in content
        ):
            return "open"
        return None
    if kind == "result":
        raw = event.get("result")
        text = raw if isinstance(raw, str) else ""
        if not event.get("is_error"):
            return "closed" if is_whole_limit(text) else "open"
        status = _int(event.get("api_error_status"))
        if is_transient(text, status):
            return None
        if status == 429 or _LOOKS_LIKE_LIMIT.search(text):
            return "closed"
    return None


# --- host-wide failures --------------------------------------------------------------------
#: What a refused credential says (rejected, revoked, expired, out of credit): with a pool, another
#: credential still answers, so these block the credential, not the host.
_CREDENTIAL_WORDS = (
    r"not logged in|please run /login"
    r"|invalid api key|invalid bearer token|failed to authenticate"
    r"|oauth token has been revoked|token (?:has )?expired|authentication_(?:error|failed)"
    r"|credit balance is too low"
    r"|your account does not have access to claude"
    r"|this service is disabled for your org"
    # Claude Code 2.1.332's sign-in failures (its message table; all say so in these words).
    r"|invalid auth token|fix external auth token|login expired|reached its time limit"
    r"|authentication required · sign in again|could not refresh your login"
)
_CREDENTIAL_REFUSED = re.compile(_CREDENTIAL_WORDS, re.IGNORECASE)
_HOST_WIDE = re.compile(
    _CREDENTIAL_WORDS + r"|unable to connect to api|connectionrefused|econnrefused|enotfound|getaddrinfo"
    r"|bubblewrap is required|invalid anthropic_custom_headers|apikeyhelper script is failing",
    re.IGNORECASE,
)
_NO_TRANSCRIPT = re.compile(r"no conversation found with session id", re.IGNORECASE)


def is_credential_refused(
    text: str, api_error_status: int | None = None, *, auth_failed: bool = False
) -> bool:
    """A host-wide failure that is the credential's (rejected, revoked, out of credit), not the
    host's (no network, no sandbox): with a pool, another credential still answers."""
    if api_error_status in (401, 403) or auth_failed:
        return True
    return bool(_CREDENTIAL_REFUSED.search(normalize_message(text)))


def is_host_wide(text: str, api_error_status: int | None = None, *, auth_failed: bool = False) -> bool:
    """A failure of the host, not of the judgement: every session here would fail the same way."""
    if api_error_status in (401, 403) or auth_failed:
        return True
    return bool(_HOST_WIDE.search(normalize_message(text)))


# --- the whole run -----------------------------------------------------------------------
def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = re.match(r"\s*(\d{3})\b", value)
        return int(match.group(1)) if match else None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _merge(structured: LimitSignal, text: LimitSignal | None) -> LimitSignal:
    """The event's instant and kind, the message's words (and its kind if the event had none)."""
    if text is None:
        return structured
    kind, scope = structured.kind, structured.scope
    if kind == "unknown":
        kind, scope = text.kind, text.scope
    elif kind not in _STATED_SCOPE and not scope.startswith("model:") and text.scope.startswith("model:"):
        scope = text.scope
    if not structured.reset_known and text.reset_known:
        return replace(text, kind=kind, scope=scope)
    return replace(structured, kind=kind, scope=scope, message=text.message)


def _primary(signals: Sequence[LimitSignal]) -> LimitSignal:
    """Every rejected window must clear; the general scope pauses everything, so it leads."""
    general = [s for s in signals if s.scope == GENERAL_SCOPE]
    return max(general or signals, key=lambda s: s.lifts_at)


@dataclass(frozen=True)
class _Run:
    """One run as `read_outcome` has gathered it, with the clock its limit messages are read against.

    Gathering (which event is the result, what text speaks for the run, did it fail) is
    apart from classifying, so each rule of the classification reads as one line.
    """

    text: str
    is_error: bool
    session_id: str | None
    status: int | None
    result: dict[str, Any] | None
    opened: bool
    auth_failed: bool
    resume_missing: bool
    events: tuple[Mapping[str, Any], ...]
    verdict: Literal["host", "transient", "error"] | None
    now: datetime
    default: tzinfo
    unknown_reset: float

    def limit_in(self, words: str, *, whole: bool = False) -> LimitSignal | None:
        if not words:
            return None
        return detect_limit(
            words, now=self.now, default_tz=self.default, unknown_reset=self.unknown_reset, whole=whole
        )

    def outcome(
        self, kind: OutcomeKind, *signals: LimitSignal, primary: LimitSignal | None = None
    ) -> SessionOutcome:
        result = self.result
        return SessionOutcome(
            kind=kind,
            text=self.text,
            session_id=self.session_id,
            is_error=self.is_error,
            limit=primary if primary is not None else (signals[0] if signals else None),
            limits=signals,
            api_error_status=self.status,
            subtype=result.get("subtype") if result is not None else None,
            terminal_reason=result.get("terminal_reason") if result is not None else None,
            num_turns=_count(result.get("num_turns")) if result is not None else None,
            total_cost_usd=_float(result.get("total_cost_usd")) if result is not None else None,
            window_opened=self.opened,
            result=result,
            resume_missing=self.resume_missing,
            events=tuple(e for e in self.events if e.get("type") == "rate_limit_event"),
            usage=tuple(usage_reports(self.events)),
            credential_expires_at=credential_expires_at(result),
            startup_failure=startup_failure(result),
        )


def read_outcome(
    stdout: str,
    *,
    now: datetime,
    default_tz: str | tzinfo,
    unknown_reset: float,
    returncode: int | None = None,
    stderr: str = "",
) -> SessionOutcome:
    """Classify one session run from what it printed (a failure's cause is on stdout).

    Order: a rejecting `rate_limit_event` (structured) first; then the result text, where a
    transient throttle is recognised before a limit message (its text says "usage limit");
    a failed result with a limit message anywhere is the limit; a failed result with HTTP 429
    and no words we know is treated as the limit with an unknown reset (a probe after
    `unknown_reset` seconds costs one spawn; assuming a throttle could burn many); a
    *successful* result is the limit only when its whole text is a limit message.
    """
    require_aware(now)
    default = resolve_timezone(default_tz)
    events = parse_events(stdout)
    result = _result_event(events)
    structured = _structured(events, now=now, unknown_reset=unknown_reset)
    text, is_error = _run_text(stdout, events, result, returncode=returncode, stderr=stderr)
    run = _Run(
        text=text,
        is_error=is_error,
        session_id=next(
            (e["session_id"] for e in events if isinstance(e.get("session_id"), str) and e["session_id"]),
            None,
        ),
        status=_int(result.get("api_error_status")) if result is not None else None,
        result=result,
        opened=any(window_state(e) == "open" for e in events if e is not result),
        auth_failed=any(
            e.get("error") == "authentication_failed" and e.get("type") == "assistant" for e in events
        ),
        resume_missing=bool(_NO_TRANSCRIPT.search(stderr) or _NO_TRANSCRIPT.search(text)),
        events=tuple(events),
        verdict=api_error_verdict(events, result) if is_error else None,
        now=now,
        default=default,
        unknown_reset=unknown_reset,
    )
    refused = startup_failure(result)
    if refused is not None:
        return _refused_to_start(run, refused)
    if structured and result is not None and not is_error and not is_whole_limit(text):
        structured = []  # a completed answer contradicts the event: it is an answer, never thrown away
    if structured:
        if is_error and is_transient(text, run.status):
            return run.outcome("transient")  # "(not your usage limit)": the event alone is no limit
        text_signal = run.limit_in(text)
        merged = tuple(_merge(s, text_signal) for s in structured)
        return run.outcome("limit", *merged, primary=_primary(merged))
    if is_error:
        return _failed_outcome(run)
    if text and is_whole_transient(text):
        return run.outcome("transient")
    signal = run.limit_in(text, whole=True)
    if signal is not None:
        return run.outcome("limit", signal)
    return run.outcome("answer")


def _structured(
    events: Sequence[Mapping[str, Any]], *, now: datetime, unknown_reset: float
) -> list[LimitSignal]:
    """Every rejection the run recorded in fields, once each (the event and the turn's own record agree)."""
    seen: set[tuple[str, str]] = set()
    out: list[LimitSignal] = []
    for event in events:
        signal = limit_from_event(event, now=now, unknown_reset=unknown_reset)
        if signal is not None and (signal.scope, signal.stated) not in seen:
            seen.add((signal.scope, signal.stated))
            out.append(signal)
    return out


def _refused_to_start(run: _Run, reason: str) -> SessionOutcome:
    """The CLI refused to start and said why in `startup_failure_reason` (2.1.332).

    The host-wide reasons (its settings, sign-in, sandbox, version: any but the few that are
    the judgement's own) block the host with that reason; `session_held_by_background` backs
    off and retries.
    """
    said = startup_words(run.result)
    if not said and run.text and run.text != "error_during_execution":
        said = normalize_message(run.text)
    why = f"Claude Code refused to start ({reason})" + (f": {said}" if said else "")
    return replace(run, text=why).outcome(startup_verdict(reason, run.result))


def _result_event(events: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's result: the last `result` event, or the lone object of the older json format."""
    results = [e for e in events if e.get("type") == "result"]
    if results:
        return results[-1]
    if len(events) == 1 and "result" in events[0] and "is_error" in events[0]:
        return events[0]  # json format without a `type` field (older versions)
    return None


def _run_text(
    stdout: str,
    events: Sequence[dict[str, Any]],
    result: dict[str, Any] | None,
    *,
    returncode: int | None,
    stderr: str,
) -> tuple[str, bool]:
    """The text that speaks for the run, and whether it failed.

    The result's own text; failing that, what synthetic assistant messages said (a limit is
    often only there); with no JSON at all, stdout itself. A failure with no words yet takes
    the message line of stderr, then the result's subtype or terminal reason, so a failed
    judgement always shows why.
    """
    synthetic = "\n".join(
        t for e in events if e.get("type") == "assistant" and _is_synthetic(e) and (t := _assistant_text(e))
    )
    if result is not None:
        raw_text = result.get("result")
        text = raw_text if isinstance(raw_text, str) else ""
        subtype = result.get("subtype")
        # `error_max_turns`, `error_during_execution`, ...: a failure even where `is_error` is absent.
        is_error = bool(result.get("is_error")) or (isinstance(subtype, str) and subtype.startswith("error"))
        if not text and synthetic:
            text = synthetic
    elif events:
        text = synthetic
        is_error = bool(synthetic) or returncode not in (0, None)
    else:
        text = stdout.strip()
        is_error = returncode not in (0, None)
    if not text and is_error and stderr.strip():
        text = error_line(stderr)  # the whole stderr goes to the judgement's session log
    if not text and is_error and result is not None:
        reason = result.get("subtype") or result.get("terminal_reason")
        text = str(reason) if reason else ""
    return text, is_error


def _failed_outcome(run: _Run) -> SessionOutcome:
    """A failed run with no rejecting event: a throttle, a lost transcript, the host, a limit, or an error.

    HTTP 429 with no words we know is the limit with an unknown reset: a probe after
    `unknown_reset` costs one spawn, while assuming a throttle could burn many.
    """
    if is_transient(run.text, run.status) or run.verdict == "transient":
        return run.outcome("transient")
    if run.resume_missing:
        return run.outcome("error")
    if is_host_wide(run.text, run.status, auth_failed=run.auth_failed or run.verdict == "host"):
        return run.outcome("host")
    signal = run.limit_in(run.text)
    if signal is None and run.status == 429:
        signal = LimitSignal(
            lifts_at=run.now + timedelta(seconds=run.unknown_reset),
            kind="unknown",
            scope=GENERAL_SCOPE,
            message=normalize_message(run.text) or "HTTP 429 with no message",
            source="status",
            reset_known=False,
        )
    if signal is not None:
        return run.outcome("limit", signal)
    return run.outcome("error")


# --- the reserve ---------------------------------------------------------------------------
def reserve_signals(
    events: Sequence[Mapping[str, Any]], *, reserve: float, now: datetime
) -> list[tuple[LimitSignal, float]]:
    """The scopes whose reported use entered the slice kept for people, as `reserved` limits.

    An `allowed_warning` event with `utilization >= 1 - reserve` and a `resetsAt` in the
    future closes its scope for automation until that instant (with the utilisation, for
    `status`). `reserve` 0 keeps nothing back.
    """
    require_aware(now)
    out: list[tuple[LimitSignal, float]] = []
    if reserve <= 0:
        return out
    for event in events:
        info = event.get("rate_limit_info")
        if event.get("type") != "rate_limit_event" or not isinstance(info, Mapping):
            continue
        used = _float(info.get("utilization"))
        lifts = epoch_instant(info.get("resetsAt"))
        if info.get("status") != "allowed_warning" or used is None or lifts is None or lifts <= now:
            continue
        if used < 1 - reserve:
            continue
        rate_type, scope = _event_kind(info.get("rateLimitType"))
        message = (
            f"reserve: {used:.0%} of the {rate_type} window used, the last {reserve:.0%} is kept for people"
        )
        signal = LimitSignal(
            lifts, "reserved", scope, message, stated=f"reserve={int(lifts.timestamp())}", source="event"
        )
        out.append((signal, used))
    return out


# --- re-probe back-off -------------------------------------------------------------------
def reprobe_backoff(
    signal: LimitSignal,
    *,
    previous_stated: str | None,
    previous_refusals: int,
    now: datetime,
    reprobe_min: float,
    max_delay: float | None = None,
    skew_backoff: float = 2.0,
    skew_retries: int = 4,
    asked_at: datetime | None = None,
    previous_stated_at: datetime | None = None,
) -> tuple[LimitSignal, int]:
    """Push a repeated stale lift time out, so a stale message never causes a spawn loop.

    The marker remembers the `stated` reset that set it and how many refusals carried it.
    When a probe is refused again with the same stated time, the lift waits at least
    `reprobe_min` seconds, doubling with each further refusal (capped at `max_delay`).
    A different stated time starts the count afresh; the same instant stated another way (the
    event's `resetsAt` one time, the words' minute the next: `previous_stated_at`) is the same
    statement. Returns the (possibly moved) signal and the refusal count to store with the marker.

    Two exceptions, in this order. A refusal within `SKEW_WINDOW` of the stated instant is
    clock skew whatever the kind (resets are whole seconds, clocks differ; a reset stated in
    words is a minute on the clock, so it is that much less exact): retried after
    `skew_backoff` seconds, doubling, `skew_retries` times, before anything else applies (each
    round of that chain may start up to `SKEW_WINDOW` later than the back-off alone says).
    Only then: a message that names no kind (`You've hit your limit · resets 10:31am`) read as
    "just reset" and refused again with the same time meant the next day's occurrence. Read
    the other way round, an API clock two seconds behind closed the window for a day.
    `asked_at` is when the refused probe started (default `now`): a session takes seconds to
    reach the API, and that start-up time is no sign of a wrong statement.
    """
    require_aware(now)
    if previous_stated is None or not _same_statement(signal, previous_stated, previous_stated_at):
        return signal, 1
    refusals = max(previous_refusals, 1) + 1
    asked = asked_at if asked_at is not None else now
    # Each probe round may take SKEW_WINDOW to reach the API (a loaded host starts a session in
    # seconds), on top of the skew back-off already granted: the chain stays "a moment after".
    rounds = refusals - 1
    allowance = SKEW_WINDOW * rounds + timedelta(seconds=skew_backoff * (2 ** (rounds - 1) - 1))
    if _in_words(signal):
        allowance += STATEMENT_PRECISION
    near = signal.stated_at is not None and abs(signal.stated_at - asked) <= allowance
    if near and rounds <= skew_retries:
        delay = skew_backoff * 2 ** (refusals - 2)
        return replace(
            signal, lifts_at=max(signal.lifts_at, now + timedelta(seconds=delay)), just_reset=False
        ), refusals
    if signal.kind == "unknown" and signal.just_reset and signal.next_lifts_at is not None:
        return replace(signal, lifts_at=signal.next_lifts_at, just_reset=False), refusals
    delay = reprobe_min * 2 ** (refusals - 2 - (skew_retries if near else 0))
    if max_delay is not None:
        delay = min(delay, max_delay)
    floor = now + timedelta(seconds=delay)
    if signal.lifts_at >= floor:
        return signal, refusals
    return replace(signal, lifts_at=floor, just_reset=False), refusals


def _in_words(signal: LimitSignal) -> bool:
    """A reset read from a message's clock time (a minute), not from an epoch field."""
    return signal.source == "text" and not signal.stated.startswith(("epoch=", "resetsAt=", "in|"))


def _same_statement(signal: LimitSignal, previous: str, previous_at: datetime | None) -> bool:
    if signal.stated == previous:
        return True
    if signal.stated_at is None or previous_at is None or "unknown" in (signal.stated, previous):
        return False
    return abs(signal.stated_at - previous_at) <= STATEMENT_PRECISION
