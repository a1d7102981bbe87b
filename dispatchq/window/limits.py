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
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = [
    "GENERAL_SCOPE",
    "LimitSignal",
    "OutcomeKind",
    "SessionOutcome",
    "WindowState",
    "detect_limit",
    "is_transient",
    "limit_from_event",
    "normalize_message",
    "parse_events",
    "read_outcome",
    "reprobe_backoff",
    "resolve_timezone",
    "window_state",
]

OutcomeKind = Literal["answer", "limit", "transient", "error"]
WindowState = Literal["open", "closed"]
GENERAL_SCOPE = "general"

# Messages are rounded to the hour or so: a stated time this recently past means "just reset".
JUST_RESET_WINDOW = timedelta(hours=1)
SYNTHETIC_MODEL = "<synthetic>"


@dataclass(frozen=True)
class LimitSignal:
    """When the usage window reopens, and what said so.

    `lifts_at` is an aware UTC instant, never in the past (a stale or just-passed time is
    `now` with `just_reset=True`: lift and let one probe find out). `scope` is `general` or
    `model:<name>` (a model's own weekly limit pauses only what runs on that model).
    `stated` is the reset as the message stated it (`"8pm|America/New_York"`,
    `"resetsAt=1749924000"`, `"unknown"`): two refusals with the same `stated` are the same
    stale message, which is what `reprobe_backoff` keys on.
    """

    lifts_at: datetime
    kind: str
    scope: str
    message: str
    just_reset: bool = False
    stated: str = "unknown"
    source: Literal["event", "text", "status"] = "text"
    reset_known: bool = True

    @property
    def model(self) -> str | None:
        return self.scope.removeprefix("model:") if self.scope.startswith("model:") else None


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


# --- normalisation -------------------------------------------------------------------------
_JSON_UNICODE = re.compile(r"\\u([0-9a-fA-F]{4})(?:\\u([0-9a-fA-F]{4}))?")
_JSON_SIMPLE = re.compile(r"\\([\"\\/bfnrt])")
_SIMPLE_MAP = {'"': '"', "\\": "\\", "/": "/", "b": " ", "f": " ", "n": "\n", "r": " ", "t": " "}
_SEPARATORS = re.compile(r"\s*[·∙•‧⋅]\s*|\s+[-–—]\s+")


def _unescape_json(text: str) -> str:
    if "\\" not in text:
        return text

    def unicode(match: re.Match[str]) -> str:
        first = int(match.group(1), 16)
        if match.group(2):
            second = int(match.group(2), 16)
            if 0xD800 <= first < 0xDC00 and 0xDC00 <= second < 0xE000:
                return chr(0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00))
            return _safe_chr(first) + _safe_chr(second)
        return _safe_chr(first)

    text = _JSON_UNICODE.sub(unicode, text)
    return _JSON_SIMPLE.sub(lambda m: _SIMPLE_MAP[m.group(1)], text)


def _safe_chr(code: int) -> str:
    return " " if 0xD800 <= code < 0xE000 else chr(code)


def normalize_message(text: str, *, keep_lines: bool = False) -> str:
    """One spelling for the many ways the same message reaches us.

    JSON escapes decoded (a message copied out of a JSON string), curly apostrophes made
    straight, every separator (`·`, `∙`, `•`, ` - `, ` – `, ` — `) made ` · `, whitespace
    collapsed (messages wrap across lines in terminals). `keep_lines` keeps newlines, for the
    whole-text check that drops hint lines.
    """
    text = _unescape_json(text)
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u02bc", "'").replace("\u2032", "'")
    text = _SEPARATORS.sub(" · ", text)
    if keep_lines:
        lines = [re.sub(r"[ \t\r\f\v]+", " ", line).strip() for line in text.split("\n")]
        return "\n".join(lines).strip()
    return re.sub(r"\s+", " ", text).strip()


# --- transient throttles ------------------------------------------------------------------
_TRANSIENT = re.compile(
    r"api error:? rate limit reached"
    r"|server is temporarily limiting requests"
    r"|not your usage limit"
    r"|overloaded_error"
    r"|api error:? \(?529\b"
    r"|\b529 overloaded"
    r"|api error:? \(?5(?:00|02|03|04)\b"
    r"|request rejected \(429\) · rate limited"
    r"|rate limited\. please try again later",
    re.IGNORECASE,
)
_TRANSIENT_STATUSES = frozenset({500, 502, 503, 504, 529})


def is_transient(text: str, api_error_status: int | None = None) -> bool:
    """A throttle or overload that says nothing about the usage window.

    `Server is temporarily limiting requests (not your usage limit)` contains "usage limit",
    which is why this check runs before limit detection.
    """
    if api_error_status in _TRANSIENT_STATUSES:
        return True
    return bool(_TRANSIENT.search(normalize_message(text)))


# --- the limit message grammar -------------------------------------------------------------
_HIT = r"you(?:'ve| have) (?:hit|reached)"
_KNOWN_MODELS = r"opus|sonnet|haiku|fable"
_ORG = r"(?:org's|organization's|org|organization|team's)"
_NOT_A_MODEL = frozenset(
    {"your", "the", "a", "an", "all", "models", "claude", "ai", "session", "usage", "weekly", "monthly"}
)

# (regex, kind); kind "model" takes the model from the `model` group. First match wins.
_HEADS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), kind)
    for pattern, kind in (
        (r"(?:claude(?: ai)? )?usage limit reached\s*\|\s*(?P<epoch>\d{9,13})", "unknown"),
        (rf"{_HIT} (?:your |the )?{_ORG} monthly (?:usage |spend )?limit", "org_monthly"),
        (r"(?:org's|organization's) monthly (?:usage |spend )?limit (?:reached|hit)", "org_monthly"),
        (r"you(?:'re| are) out of (?:extra usage|usage credits|credits)", "credits"),
        (r"extra usage (?:limit )?(?:reached|exhausted)", "credits"),
        (rf"{_HIT} your (?:5-hour|five-hour|session) limit", "five_hour"),
        (r"(?:5|five)[- ]hour limit reached|session limit reached", "five_hour"),
        (rf"{_HIT} your (?P<model>[a-z][\w.]*) weekly limit", "model"),
        (r"(?P<model>\b[a-z][\w.]*) weekly limit reached", "model"),
        (rf"{_HIT} your (?P<model>{_KNOWN_MODELS})(?: [\d.]+)? limit", "model"),
        (rf"{_HIT} your weekly limit|weekly limit reached", "seven_day"),
        (r"claude(?: ai)? usage limit reached", "unknown"),
        (rf"{_HIT} your (?:usage )?limit", "unknown"),
    )
)

_MONTHS = {
    "jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6,
    "jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12,
}  # fmt: skip
_MON = r"(?P<mon>jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?(?:,? (?P<year>\d{4}))?"
_TIME = r"(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?\s*(?P<ampm>[ap]\.?m\.?)?(?![\w:])"
_ZONE = r"(?:\s*\((?P<zone>[^()]{1,64})\)|\s+(?P<bare_zone>UTC|GMT)\b)?"
_RESET_WORD = re.compile(r"\b(?:resets?|will reset|reset)(?: at| on)?\s+", re.IGNORECASE)
_SPECS = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        rf"{_MON} {_DAY}(?:(?:,| at|, at)? {_TIME})?{_ZONE}",
        rf"(?P<iso>\d{{4}}-\d{{2}}-\d{{2}})(?:[t ](?P<iso_h>\d{{2}}):(?P<iso_m>\d{{2}}))?{_ZONE}",
        rf"{_TIME}(?:,? (?:on )?{_MON} {_DAY})?{_ZONE}",
        r"in (?P<rel_n>\d+)\s*(?P<rel_u>hours?|hrs?|h|minutes?|mins?|m|days?|d)\b"
        r"(?:\s*(?:and )?(?P<rel_n2>\d+)\s*(?:minutes?|mins?|m)\b)?",
    )
)
_WHOLE_GAP = re.compile(r"^[\s.,;:!·]*(?:your (?:usage )?limit(?: will)?\s*)?$", re.IGNORECASE)
_WHOLE_TAIL = re.compile(r"^[\s.,;:!·]*$")


def resolve_timezone(zone: str | tzinfo) -> tzinfo:
    """A tzinfo from a setting (`Europe/Berlin`, `UTC`, `Etc/GMT+5`) or an object as is."""
    if isinstance(zone, tzinfo):
        return zone
    try:
        return ZoneInfo(zone.strip())
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {zone!r}") from None


def _zone(name: str | None, default: tzinfo) -> tuple[tzinfo, str]:
    if not name:
        return default, _zone_name(default)
    try:
        # zoneinfo knows what Etc/GMT+5 means (UTC-5); never parse signs by hand.
        return ZoneInfo(name.strip()), name.strip()
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return default, _zone_name(default)


def _zone_name(zone: tzinfo) -> str:
    return getattr(zone, "key", None) or str(zone)


def _epoch(value: object) -> datetime | None:
    if isinstance(value, bool):
        return None
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not math.isfinite(seconds) or seconds <= 0:
        return None
    if seconds > 1e11:  # milliseconds
        seconds /= 1000.0
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _clock(hour: str, minute: str | None, ampm: str | None) -> tuple[int, int] | None:
    h, m = int(hour), int(minute or 0)
    if m > 59:
        return None
    if ampm:
        if not 1 <= h <= 12:
            return None
        pm = ampm.lower().startswith("p")
        h = (h % 12) + (12 if pm else 0)
    elif h > 23:
        return None
    return h, m


def _local(day: date, hm: tuple[int, int], zone: tzinfo) -> datetime:
    return datetime(day.year, day.month, day.day, hm[0], hm[1], tzinfo=zone).astimezone(UTC)


def _nearest_year(month: int, day: int, hm: tuple[int, int], zone: tzinfo, now: datetime) -> datetime | None:
    """The instance of month/day nearest to now: a date well in the past means next year."""
    year = now.astimezone(zone).year
    best: datetime | None = None
    for y in (year - 1, year, year + 1):
        try:
            candidate = _local(date(y, month, day), hm, zone)
        except ValueError:  # Feb 29 in a common year
            continue
        if best is None or abs(candidate - now) < abs(best - now):
            best = candidate
    return best


@dataclass(frozen=True)
class _Reset:
    lifts_at: datetime | None  # None: no usable reset information
    just_reset: bool
    stated: str
    end: int  # where the reset clause ended in the searched text


def _resolve_spec(match: re.Match[str], now: datetime, default: tzinfo) -> _Reset:
    groups = match.groupdict()
    zone, zone_label = _zone(groups.get("zone") or groups.get("bare_zone"), default)
    stated = f"{match.group(0).strip().lower()}|{zone_label}"
    if groups.get("rel_n"):
        unit = groups["rel_u"].lower()
        n = int(groups["rel_n"])
        delta = (
            timedelta(days=n)
            if unit.startswith("d")
            else timedelta(hours=n)
            if unit.startswith("h")
            else timedelta(minutes=n)
        )
        delta += timedelta(minutes=int(groups.get("rel_n2") or 0))
        # Relative times move with `now`; state them by their absolute instant, minute-rounded.
        lifts = now + delta
        return _Reset(lifts, False, f"in|{lifts.replace(second=0, microsecond=0).isoformat()}", match.end())
    hm: tuple[int, int] | None = (0, 0)
    if groups.get("hour"):
        hm = _clock(groups["hour"], groups.get("minute"), groups.get("ampm"))
        if hm is None:
            return _Reset(None, False, "unknown", match.end())
    if groups.get("iso"):
        try:
            day = date.fromisoformat(groups["iso"])
            if groups.get("iso_h"):
                hm = _clock(groups["iso_h"], groups["iso_m"], None)
            lifts = _local(day, hm or (0, 0), zone) if hm else None
        except ValueError:
            lifts = None
        return _past_means_now(lifts, now, stated, match.end())
    if groups.get("mon"):
        month, day_n = _MONTHS[groups["mon"][:3].lower()], int(groups["day"])
        assert hm is not None
        try:
            if groups.get("year"):
                lifts: datetime | None = _local(date(int(groups["year"]), month, day_n), hm, zone)
            else:
                lifts = _nearest_year(month, day_n, hm, zone, now)
        except ValueError:
            lifts = None
        return _past_means_now(lifts, now, stated, match.end())
    # A time with no date: the next such time in that zone, unless it passed less than an
    # hour ago (messages are rounded): then it has just reset.
    assert hm is not None
    today = now.astimezone(zone).date()
    candidates = sorted(_local(today + timedelta(days=d), hm, zone) for d in (-1, 0, 1, 2))
    previous = max((c for c in candidates if c <= now), default=None)
    if previous is not None and now - previous < JUST_RESET_WINDOW:
        return _Reset(now, True, stated, match.end())
    upcoming = min(c for c in candidates if c > now)
    return _Reset(upcoming, False, stated, match.end())


def _past_means_now(lifts: datetime | None, now: datetime, stated: str, end: int) -> _Reset:
    if lifts is None:
        return _Reset(None, False, "unknown", end)
    if lifts <= now:
        return _Reset(now, True, stated, end)
    return _Reset(lifts, False, stated, end)


def _find_reset(text: str, start: int, now: datetime, default: tzinfo) -> tuple[_Reset | None, int]:
    """The reset clause following a limit head; returns it and where it began."""
    for word in _RESET_WORD.finditer(text, start):
        if word.start() - start > 160:  # a "reset" this far away belongs to other text
            break
        for spec in _SPECS:
            match = spec.match(text, word.end())
            if match:
                return _resolve_spec(match, now, default), word.start()
    return None, -1


def _whole_limit(text: str) -> bool:
    """Cheap live check: the text *starts* with a limit message and is message-sized."""
    norm = _strip_hints(text)
    if not norm or len(norm) > 300 or is_transient(norm):
        return False
    return any(head.match(norm) for head, _ in _HEADS)


def _whole_transient(text: str) -> bool:
    """A successful result whose whole text is an API error line (seen in some versions)."""
    norm = _strip_hints(text)
    lowered = norm.lower()
    starts = lowered.startswith(("api error", "server is temporarily limiting"))
    return starts and len(norm) <= 300 and is_transient(norm)


def _strip_hints(text: str) -> str:
    """Drop slash-command hint lines/segments (`/upgrade to …`) for the whole-text check."""
    lines = [
        line for line in normalize_message(text, keep_lines=True).split("\n") if not line.startswith("/")
    ]
    joined = " ".join(line for line in lines if line)
    return re.sub(r"\s*·\s*/\S.*$", "", joined)


def detect_limit(
    text: str,
    *,
    now: datetime,
    default_tz: str | tzinfo,
    unknown_reset: float,
    whole: bool = False,
) -> LimitSignal | None:
    """The usage limit stated in `text`, with the UTC instant it lifts; None if none.

    `whole=True` demands that the text *is* a limit message (optionally followed by
    slash-command hints): that is how a successful result carrying only the limit message
    (seen in some versions) is told from an answer that merely quotes one. Throttles that
    are not the usage limit are never a limit (`is_transient`).
    """
    _check_now(now)
    default = resolve_timezone(default_tz)
    if is_transient(text):
        return None
    norm = _strip_hints(text) if whole else normalize_message(text)
    for head, kind in _HEADS:
        match = head.search(norm)
        if not match:
            continue
        model = (match.groupdict().get("model") or "").lower()
        if kind == "model" and (not model or model in _NOT_A_MODEL):
            continue
        if whole and norm[: match.start()].strip(" .·"):
            return None
        return _signal(norm, match, kind, model, now, default, unknown_reset, whole)
    return None


def _signal(
    norm: str,
    match: re.Match[str],
    kind: str,
    model: str,
    now: datetime,
    default: tzinfo,
    unknown_reset: float,
    whole: bool,
) -> LimitSignal | None:
    scope = GENERAL_SCOPE
    if kind == "model":
        kind, scope = f"seven_day_{model}", f"model:{model}"
    epoch = match.groupdict().get("epoch")
    if epoch:
        end = match.end()
        lifts = _epoch(epoch)
        reset = _past_means_now(lifts, now, f"epoch={epoch}", end) if lifts else None
    else:
        reset, reset_start = _find_reset(norm, match.end(), now, default)
        if reset is not None and whole and not _WHOLE_GAP.match(norm[match.end() : reset_start]):
            return None
        end = reset.end if reset is not None else match.end()
    if whole and not _WHOLE_TAIL.match(norm[end:]):
        return None
    message = norm[match.start() : end].strip() if not whole else norm.strip()
    if reset is None or reset.lifts_at is None:
        return LimitSignal(
            lifts_at=now + timedelta(seconds=unknown_reset),
            kind=kind,
            scope=scope,
            message=message,
            stated="unknown",
            reset_known=False,
        )
    return LimitSignal(
        lifts_at=reset.lifts_at,
        kind=kind,
        scope=scope,
        message=message,
        just_reset=reset.just_reset,
        stated=reset.stated,
    )


# --- structured events ---------------------------------------------------------------------
_RATE_TYPE = re.compile(r"^[a-z0-9_]{1,48}$")


def _event_kind(rate_type: object) -> tuple[str, str]:
    if not isinstance(rate_type, str) or not _RATE_TYPE.match(rate_type):
        return "unknown", GENERAL_SCOPE
    if rate_type == "overage":
        return "credits", GENERAL_SCOPE
    if rate_type.startswith("seven_day_"):
        return rate_type, f"model:{rate_type.removeprefix('seven_day_')}"
    return rate_type, GENERAL_SCOPE


def _rejection(event: Mapping[str, Any]) -> tuple[object, object] | None:
    """(rateLimitType, resetsAt) of a rejecting rate_limit_event, else None."""
    if event.get("type") != "rate_limit_event":
        return None
    info = event.get("rate_limit_info")
    if not isinstance(info, Mapping):
        return None
    if info.get("status") == "rejected":
        return info.get("rateLimitType"), info.get("resetsAt")
    if info.get("isUsingOverage") is True and info.get("overageStatus") == "rejected":
        return "overage", info.get("overageResetsAt", info.get("resetsAt"))
    return None


def limit_from_event(event: Mapping[str, Any], *, now: datetime, unknown_reset: float) -> LimitSignal | None:
    """The structured signal: a `rate_limit_event` that rejected, with its `resetsAt`."""
    _check_now(now)
    rejection = _rejection(event)
    if rejection is None:
        return None
    rate_type, resets_at = rejection
    kind, scope = _event_kind(rate_type)
    lifts = _epoch(resets_at)
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
        return LimitSignal(now, kind, scope, message, just_reset=True, stated=stated, source="event")
    return LimitSignal(lifts, kind, scope, message, stated=stated, source="event")


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
        text = event.get("result") if isinstance(event.get("result"), str) else ""
        if not event.get("is_error"):
            return "closed" if _whole_limit(text) else "open"
        status = _int(event.get("api_error_status"))
        if is_transient(text, status):
            return None
        if status == 429 or _LOOKS_LIKE_LIMIT.search(text):
            return "closed"
    return None


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


def _check_now(now: datetime) -> None:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be an aware datetime")


def _merge(structured: LimitSignal, text: LimitSignal | None) -> LimitSignal:
    """The event's instant and kind, the message's words (and its kind if the event had none)."""
    if text is None:
        return structured
    kind, scope = structured.kind, structured.scope
    if kind == "unknown":
        kind, scope = text.kind, text.scope
    if not structured.reset_known and text.reset_known:
        return replace(text, kind=kind, scope=scope)
    return replace(structured, kind=kind, scope=scope, message=text.message)


def _primary(signals: Sequence[LimitSignal]) -> LimitSignal:
    """Every rejected window must clear; the general scope pauses everything, so it leads."""
    general = [s for s in signals if s.scope == GENERAL_SCOPE]
    return max(general or signals, key=lambda s: s.lifts_at)


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
    _check_now(now)
    default = resolve_timezone(default_tz)
    events = parse_events(stdout)
    results = [e for e in events if e.get("type") == "result"]
    result = results[-1] if results else None
    if result is None and len(events) == 1 and "result" in events[0] and "is_error" in events[0]:
        result = events[0]  # json format without a `type` field (older versions)
    session_id = next(
        (e["session_id"] for e in events if isinstance(e.get("session_id"), str) and e["session_id"]),
        None,
    )
    structured = [
        s for e in events if (s := limit_from_event(e, now=now, unknown_reset=unknown_reset)) is not None
    ]
    opened = any(window_state(e) == "open" for e in events if e is not result)
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
        text = stderr.strip()[-4000:]
    if not text and is_error and result is not None:
        reason = result.get("subtype") or result.get("terminal_reason")
        text = str(reason) if reason else ""

    status = _int(result.get("api_error_status")) if result is not None else None
    base = {
        "text": text,
        "session_id": session_id,
        "is_error": is_error,
        "api_error_status": status,
        "subtype": result.get("subtype") if result is not None else None,
        "terminal_reason": result.get("terminal_reason") if result is not None else None,
        "num_turns": _count(result.get("num_turns")) if result is not None else None,
        "total_cost_usd": _float(result.get("total_cost_usd")) if result is not None else None,
        "window_opened": opened,
        "result": result,
    }
    limit_args = {"now": now, "default_tz": default, "unknown_reset": unknown_reset}

    if structured:
        text_signal = detect_limit(text, **limit_args) if text else None
        merged = tuple(_merge(s, text_signal) for s in structured)
        return SessionOutcome(kind="limit", limit=_primary(merged), limits=merged, **base)
    if is_error:
        if is_transient(text, status):
            return SessionOutcome(kind="transient", **base)
        signal = detect_limit(text, **limit_args) if text else None
        if signal is None and status == 429:
            signal = LimitSignal(
                lifts_at=now + timedelta(seconds=unknown_reset),
                kind="unknown",
                scope=GENERAL_SCOPE,
                message=normalize_message(text) or "HTTP 429 with no message",
                source="status",
                reset_known=False,
            )
        if signal is not None:
            return SessionOutcome(kind="limit", limit=signal, limits=(signal,), **base)
        return SessionOutcome(kind="error", **base)
    if text and _whole_transient(text):
        return SessionOutcome(kind="transient", **base)
    signal = detect_limit(text, whole=True, **limit_args) if text else None
    if signal is not None:
        return SessionOutcome(kind="limit", limit=signal, limits=(signal,), **base)
    return SessionOutcome(kind="answer", **base)


# --- re-probe back-off -------------------------------------------------------------------
def reprobe_backoff(
    signal: LimitSignal,
    *,
    previous_stated: str | None,
    previous_refusals: int,
    now: datetime,
    reprobe_min: float,
    max_delay: float | None = None,
) -> tuple[LimitSignal, int]:
    """Push a repeated stale lift time out, so a stale message never causes a spawn loop.

    The marker remembers the `stated` reset that set it and how many refusals carried it.
    When a probe is refused again with the same stated time, the lift waits at least
    `reprobe_min` seconds, doubling with each further refusal (capped at `max_delay`).
    A different stated time starts the count afresh. Returns the (possibly moved) signal and
    the refusal count to store with the marker.
    """
    _check_now(now)
    if previous_stated is None or signal.stated != previous_stated:
        return signal, 1
    refusals = max(previous_refusals, 1) + 1
    delay = reprobe_min * 2 ** (refusals - 2)
    if max_delay is not None:
        delay = min(delay, max_delay)
    floor = now + timedelta(seconds=delay)
    if signal.lifts_at >= floor:
        return signal, refusals
    return replace(signal, lifts_at=floor, just_reset=False), refusals
