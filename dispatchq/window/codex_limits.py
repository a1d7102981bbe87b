"""What OpenAI Codex CLI says about its usage windows: its words, and its machine forms (pure).

Codex states a limit in two ways, and this module turns both into the same `LimitSignal` the
markers take (docs/codex-cli.md names the source files and commits every form was read from):

- **In words**, the only form `codex exec --json` prints (an `error` event and the
  `turn.failed` event carry the message; no code, no reset field). `UsageLimitReachedError`
  (`codex-rs/protocol/src/error.rs`) writes "You've hit your usage limit." and a plan's
  upgrade sentence, then " Try again at 3:04 PM." when the reset falls on the host's local
  date, " Try again at Nov 26th, 2026 3:04 PM." on another date, or " Try again later." with
  none; a plan sentence ends " or try again at …" instead. A model's own limit reads "You've
  hit your usage limit for {name}. Switch to another model now, or try again at …". The clock
  time is chrono's `Local`: the zone of the host that ran the CLI, never named. A workspace
  that ran out of credits or hit its spend cap says so with no reset at all.
- **In fields**, underneath: the service's HTTP 429 body `{"error": {"type":
  "usage_limit_reached", "resets_at": <epoch s>, "resets_in_seconds": …}}` with the
  `x-codex-primary-*` / `x-codex-secondary-*` headers (`used-percent`, `window-minutes`,
  `reset-at`), and `codex app-server`'s `account/rateLimits/read` reply (the same windows as
  `usedPercent`, `windowDurationMins`, `resetsAt`, per `limitId`). These state the instant
  and which window closed, so `prefer_structured` lets them win over the words.

The primary window is the plan's general one (five hours on ChatGPT plans), the secondary its
weekly one: two windows of one credential, as Claude Code's `five_hour` and `seven_day`. A
limit id other than `codex` is a model's own limit (`limitName` is the model's name), scoped
`model:<name>` like the words' "for {name}".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal

from dispatchq.window.messages import (
    GENERAL_SCOPE,
    JUST_RESET_WINDOW,
    WEEKLY_SCOPE,
    LimitKind,
    LimitSignal,
    epoch_instant,
    normalize_message,
    person_hold,
    require_aware,
    resolve_timezone,
    spend_scope,
)

__all__ = [
    "CODEX_LIMIT_ID",
    "CodexWindow",
    "detect_codex_limit",
    "is_codex_credential_refused",
    "is_codex_transient",
    "limits_from_429",
    "limits_from_windows",
    "model_scope",
    "prefer_structured",
    "windows_from_headers",
    "windows_from_rate_limits",
]

#: The limit id of the plan's own windows (every other id is a model's limit).
CODEX_LIMIT_ID = "codex"
#: A window this full is closed: the service refuses at 100% used.
_FULL = 100.0
_WINDOW_KINDS: dict[int, LimitKind] = {300: "five_hour", 10080: "seven_day"}

Slot = Literal["primary", "secondary"]


def model_scope(name: str) -> str:
    """The marker scope of a model's own limit (`GPT-5.3-Codex-Spark` -> `model:gpt-5.3-codex-spark`)."""
    return f"model:{name.strip().lower()}"


# --- the words -----------------------------------------------------------------------------
_HIT = r"you(?:'ve| have) hit your usage limit"
_MODEL_HEAD = re.compile(rf"{_HIT} for (?P<limit>.{{1,80}}?)\. switch to another model", re.IGNORECASE)
_HEAD = re.compile(rf"{_HIT}\.", re.IGNORECASE)
# The retry clause closes the message: "Try again at 3:04 PM." / "or try again later."
_RETRY = re.compile(r"\btry again (?:(?P<later>later)|at (?P<when>[^.]{1,60}?))\.(?=\s|$|\))", re.IGNORECASE)
_RETRY_REACH = 400  # the plan sentences between the head and the retry clause are shorter
_CLOCK = r"(?P<hour>\d{1,2}):(?P<minute>\d{2})\s*(?P<ampm>[ap]\.?m\.?)"
_TIME_ONLY = re.compile(rf"^{_CLOCK}$", re.IGNORECASE)
_DATED = re.compile(
    rf"^(?P<mon>[a-z]{{3}})[a-z]*\.? (?P<day>\d{{1,2}})(?:st|nd|rd|th)?,? (?P<year>\d{{4}}),? {_CLOCK}$",
    re.IGNORECASE,
)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")

# A workspace's credits or spend cap: no reset stated, a person (the owner) lifts it.
_WORKSPACE: tuple[tuple[re.Pattern[str], LimitKind], ...] = (
    (re.compile(r"your workspace is out of credits", re.IGNORECASE), "credits"),
    (
        re.compile(r"you hit your spend cap set (?:in your workspace|by the owner)", re.IGNORECASE),
        "member_spend",
    ),
)
_TRANSIENT = re.compile(
    r"selected model is at capacity"
    r"|currently experiencing high demand"
    r"|exceeded retry limit, last status: 5\d\d"
    r"|stream disconnected before completion"
    r"|error while reading the server response"
    r"|request timed out",
    re.IGNORECASE,
)
_CREDENTIAL = re.compile(
    r"quota exceeded\. check your plan and billing"
    r"|to use codex with your chatgpt plan, upgrade"
    r"|unexpected status 40[13]\b"
    r"|refresh token|sign in again|log in again|not logged in"
    r"|missing environment variable: `?(?:openai|codex)_api_key",
    re.IGNORECASE,
)


# A 429 Codex did not read as `usage_limit_reached`: 0.171.0 says only this when the Responses
# WebSocket handshake is refused with the service's usage-limit body (recorded, docs/codex-cli.md).
_BARE_429 = re.compile(r"exceeded retry limit, last status: 429\b", re.IGNORECASE)


def is_codex_transient(text: str) -> bool:
    """A throttle or overload Codex reports that is not the usage window (retried, no marker)."""
    return bool(_TRANSIENT.search(normalize_message(text)))


def is_codex_credential_refused(text: str) -> bool:
    """A refusal that is the credential's: no quota on the key, a plan without Codex, a lost login."""
    return bool(_CREDENTIAL.search(normalize_message(text)))


def detect_codex_limit(
    text: str, *, now: datetime, default_tz: str | tzinfo, unknown_reset: float
) -> LimitSignal | None:
    """The usage limit Codex stated in `text`, with the UTC instant it lifts; None if none.

    A clock time is read in `default_tz`, the zone of the host that ran the CLI (Codex prints
    chrono's `Local` time and names no zone). A time alone is a time on that host's date: the
    next such time, unless it passed less than `JUST_RESET_WINDOW` ago (the message is minutes
    old, or the run crossed midnight): then the window has just reset, and a refusal with the
    same words means the next day's (`next_lifts_at`, which `reprobe_backoff` moves to).
    "Try again later." states nothing: the unknown-reset probe after `unknown_reset` seconds, as
    does a bare "exceeded retry limit, last status: 429" (a 429 Codex did not read as the usage
    limit: Codex never retries one, and taking it for a throttle could burn a spawn a minute).
    """
    require_aware(now)
    zone = resolve_timezone(default_tz)
    norm = normalize_message(text)
    for pattern, kind in _WORKSPACE:
        found = pattern.search(norm)
        if found:
            sentence = norm[found.start() :].split(". ")[0].rstrip(".") + "."
            return person_hold(kind, spend_scope(kind), sentence, now)
    head = _MODEL_HEAD.search(norm)
    scope = model_scope(head.group("limit")) if head else GENERAL_SCOPE
    head = head or _HEAD.search(norm)
    if head is None:
        bare = _BARE_429.search(norm)
        if bare is None:
            return None
        # No words for the window, but a 429 Codex does not retry: the limit with an unknown
        # reset costs one probe after `unknown_reset`; a throttle read as one costs that wait.
        return LimitSignal(
            now + timedelta(seconds=unknown_reset), "unknown", GENERAL_SCOPE, bare.group(0),
            source="status", reset_known=False,
        )  # fmt: skip
    retry = _RETRY.search(norm, head.end(), head.end() + _RETRY_REACH)
    end = retry.end() if retry else head.end()
    message = norm[head.start() : end].strip()
    when = retry.group("when") if retry else None
    lifts = _resolve(when, now, zone) if when else None
    if lifts is None:
        return LimitSignal(
            lifts_at=now + timedelta(seconds=unknown_reset),
            kind="unknown",
            scope=scope,
            message=message,
            reset_known=False,
        )
    return replace(lifts, scope=scope, message=message)


def _resolve(when: str, now: datetime, zone: tzinfo) -> LimitSignal | None:
    """The instant a retry clause names, as a signal with its kind and scope left to the caller."""
    stated = f"{when.strip().lower()}|{getattr(zone, 'key', None) or zone}"
    dated = _DATED.match(when.strip())
    if dated:
        mon = dated.group("mon").lower()
        if mon not in _MONTHS:
            return None
        hm = _clock(dated)
        if hm is None:
            return None
        try:
            local = datetime(int(dated.group("year")), _MONTHS.index(mon) + 1, int(dated.group("day")), *hm)
        except ValueError:  # Nov 31st
            return None
        at = local.replace(tzinfo=zone).astimezone(UTC)
        if at <= now:
            return LimitSignal(
                now, "unknown", GENERAL_SCOPE, "", just_reset=True, stated=stated, stated_at=at
            )
        return LimitSignal(at, "unknown", GENERAL_SCOPE, "", stated=stated, stated_at=at)
    alone = _TIME_ONLY.match(when.strip())
    if alone is None:
        return None
    hm = _clock(alone)
    if hm is None:
        return None
    today = now.astimezone(zone).date()
    # The host's date when it printed, give or take the minutes since: that day's time, else the next.
    candidates = sorted(
        datetime(day.year, day.month, day.day, *hm, tzinfo=zone).astimezone(UTC)
        for day in (today - timedelta(days=1), today, today + timedelta(days=1), today + timedelta(days=2))
    )
    previous = max((c for c in candidates if c <= now), default=None)
    upcoming = min(c for c in candidates if c > now)
    if previous is not None and now - previous < JUST_RESET_WINDOW:
        return LimitSignal(
            now, "unknown", GENERAL_SCOPE, "", just_reset=True, stated=stated, stated_at=previous,
            next_lifts_at=upcoming,
        )  # fmt: skip
    return LimitSignal(upcoming, "unknown", GENERAL_SCOPE, "", stated=stated, stated_at=upcoming)


def _clock(match: re.Match[str]) -> tuple[int, int] | None:
    """Hour and minute of a 12-hour `3:04 PM` (chrono's `%-I:%M %p`)."""
    hour, minute = int(match.group("hour")), int(match.group("minute"))
    if not 1 <= hour <= 12 or minute > 59:
        return None
    pm = match.group("ampm").lower().startswith("p")
    return (hour % 12) + (12 if pm else 0), minute


# --- the fields ----------------------------------------------------------------------------
@dataclass(frozen=True)
class CodexWindow:
    """One usage window as the service reported it: whose (`limit_id`), which, how full, until when."""

    limit_id: str
    slot: Slot
    used_percent: float
    window_minutes: int | None
    resets_at: datetime | None
    limit_name: str | None = None
    reached: str | None = None  # the snapshot's `rateLimitReachedType`, when it names one

    @property
    def scope(self) -> str:
        """Primary: the plan's general window; secondary: its weekly one; a model's: its own."""
        if self.limit_id != CODEX_LIMIT_ID:
            return model_scope(self.limit_name or self.limit_id)
        return GENERAL_SCOPE if self.slot == "primary" else WEEKLY_SCOPE

    @property
    def kind(self) -> LimitKind:
        return _WINDOW_KINDS.get(self.window_minutes or 0, "unknown")

    @property
    def full(self) -> bool:
        return self.used_percent >= _FULL


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _whole(value: object) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number.is_integer() else None


def windows_from_headers(headers: Mapping[str, str]) -> list[CodexWindow]:
    """The windows a response's `x-codex-*` headers report (`codex-rs/codex-api/src/rate_limits.rs`).

    `x-<id>-primary-used-percent` opens a window; `…-window-minutes` and `…-reset-at` (epoch
    seconds) complete it; `x-<id>-limit-name` names a model's limit. Names are matched without
    regard to case; a window with no used-percent is not reported.
    """
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    ids = sorted(
        {
            name.removeprefix("x-").removesuffix(f"-{slot}-used-percent")
            for name in lower
            for slot in ("primary", "secondary")
            if name.startswith("x-") and name.endswith(f"-{slot}-used-percent")
        }
    )
    out: list[CodexWindow] = []
    for prefix in ids:
        limit_id = prefix.replace("-", "_")
        name = lower.get(f"x-{prefix}-limit-name", "").strip() or None
        for slot in ("primary", "secondary"):
            used = _number(lower.get(f"x-{prefix}-{slot}-used-percent"))
            if used is None:
                continue
            out.append(
                CodexWindow(
                    limit_id=limit_id,
                    slot=slot,
                    used_percent=used,
                    window_minutes=_whole(lower.get(f"x-{prefix}-{slot}-window-minutes")),
                    resets_at=epoch_instant(lower.get(f"x-{prefix}-{slot}-reset-at")),
                    limit_name=name,
                )
            )
    return out


def windows_from_rate_limits(reply: Mapping[str, Any]) -> list[CodexWindow]:
    """The windows of an `account/rateLimits/read` reply (or an `account/rateLimits/updated` notice).

    Accepts the JSON-RPC envelope (`{"id", "result": …}`, `{"method", "params": …}`) or its
    body: `rateLimitsByLimitId` when given (every limit), else the single `rateLimits` snapshot.
    Each snapshot's `primary`/`secondary` is `{usedPercent, windowDurationMins, resetsAt}`.
    """
    body = reply.get("result", reply.get("params", reply))
    if not isinstance(body, Mapping):
        return []
    by_id = body.get("rateLimitsByLimitId")
    snapshots = list(by_id.values()) if isinstance(by_id, Mapping) else [body.get("rateLimits")]
    out: list[CodexWindow] = []
    for snapshot in snapshots:
        if not isinstance(snapshot, Mapping):
            continue
        limit_id = str(snapshot.get("limitId") or CODEX_LIMIT_ID).lower().replace("-", "_")
        name = snapshot.get("limitName")
        reached = snapshot.get("rateLimitReachedType")
        for slot in ("primary", "secondary"):
            window = snapshot.get(slot)
            used = _number(window.get("usedPercent")) if isinstance(window, Mapping) else None
            if used is None or not isinstance(window, Mapping):
                continue
            out.append(
                CodexWindow(
                    limit_id=limit_id,
                    slot=slot,
                    used_percent=used,
                    window_minutes=_whole(window.get("windowDurationMins")),
                    resets_at=epoch_instant(window.get("resetsAt")),
                    limit_name=(name.strip() or None) if isinstance(name, str) else None,
                    reached=reached if isinstance(reached, str) else None,
                )
            )
    return out


_REACHED_KINDS: dict[str, LimitKind] = {
    "workspace_owner_credits_depleted": "credits",
    "workspace_member_credits_depleted": "credits",
    "workspace_owner_usage_limit_reached": "member_spend",
    "workspace_member_usage_limit_reached": "member_spend",
}


def limits_from_windows(
    windows: Sequence[CodexWindow], *, now: datetime, unknown_reset: float
) -> list[LimitSignal]:
    """Every full window as a limit until its `resetsAt`, once per scope (the latest lift wins).

    A workspace's credits or spend cap (`rateLimitReachedType`) is a hold only a person lifts.
    A full window with no reset is the unknown-reset probe.
    """
    require_aware(now)
    by_scope: dict[str, LimitSignal] = {}
    for window in windows:
        hold = _REACHED_KINDS.get(window.reached or "")
        if hold is not None:
            by_scope[spend_scope(hold)] = person_hold(
                hold, spend_scope(hold), f"Codex: {window.reached}", now
            )
            continue
        if not window.full:
            continue
        signal = _window_signal(window, now=now, unknown_reset=unknown_reset)
        held = by_scope.get(signal.scope)
        if held is None or signal.lifts_at > held.lifts_at:
            by_scope[signal.scope] = signal
    return list(by_scope.values())


def _window_signal(window: CodexWindow, *, now: datetime, unknown_reset: float) -> LimitSignal:
    label = f"Codex {window.limit_id} {window.slot} window ({window.window_minutes or '?'} min) full"
    if window.resets_at is None:
        return LimitSignal(
            now + timedelta(seconds=unknown_reset), window.kind, window.scope, f"{label}, no reset time",
            source="event", reset_known=False,
        )  # fmt: skip
    stated = f"resetsAt={int(window.resets_at.timestamp())}"
    message = f"{label}, resets {window.resets_at.isoformat()}"
    return LimitSignal(
        max(window.resets_at, now), window.kind, window.scope, message, just_reset=window.resets_at <= now,
        stated=stated, source="event", stated_at=window.resets_at,
    )  # fmt: skip


def limits_from_429(
    body: str | Mapping[str, Any], headers: Mapping[str, str], *, now: datetime, unknown_reset: float
) -> list[LimitSignal]:
    """The limits a 429 states: `usage_limit_reached` with the windows its headers show full.

    The headers say which window closed (each with its own reset); the body's `resets_at`
    (else `now + resets_in_seconds`) is when requests pass again, and stands alone on the
    general scope when no header names a full window. Any other 429 (a throttle,
    `usage_not_included`) is no usage limit: an empty list.
    """
    require_aware(now)
    error = _error_body(body)
    if error is None or error.get("type") != "usage_limit_reached":
        return []
    closed = limits_from_windows(
        [w for w in windows_from_headers(headers) if w.full], now=now, unknown_reset=unknown_reset
    )
    lifts = epoch_instant(error.get("resets_at"))
    after = _number(error.get("resets_in_seconds"))
    if lifts is None and after is not None and after > 0:
        lifts = now + timedelta(seconds=after)
    if closed:
        return [_with_reset(s, lifts, now) if not s.reset_known and lifts is not None else s for s in closed]
    plan = error.get("plan_type")
    label = f"Codex usage_limit_reached ({plan})" if isinstance(plan, str) else "Codex usage_limit_reached"
    window = CodexWindow(CODEX_LIMIT_ID, "primary", _FULL, None, lifts)
    return [replace(_window_signal(window, now=now, unknown_reset=unknown_reset), message=label)]


def _with_reset(signal: LimitSignal, lifts: datetime, now: datetime) -> LimitSignal:
    return replace(
        signal, lifts_at=max(lifts, now), just_reset=lifts <= now, reset_known=True,
        stated=f"resetsAt={int(lifts.timestamp())}", stated_at=lifts,
    )  # fmt: skip


def _error_body(body: str | Mapping[str, Any]) -> Mapping[str, Any] | None:
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return None
    error = body.get("error") if isinstance(body, Mapping) else None
    return error if isinstance(error, Mapping) else None


def prefer_structured(structured: Sequence[LimitSignal], text: LimitSignal | None) -> tuple[LimitSignal, ...]:
    """The limits to act on: the fields' windows and instants first, the words only without them.

    The words keep their value as the message people read: a structured signal on the same
    scope (or a text naming no model) takes the words' message, its own instant and kind.
    """
    if not structured:
        return (text,) if text is not None else ()
    if text is None:
        return tuple(structured)
    out = []
    for signal in structured:
        same = text.scope == signal.scope or text.scope == GENERAL_SCOPE
        out.append(replace(signal, message=text.message) if same else signal)
    return tuple(out)
