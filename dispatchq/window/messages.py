"""The words of a usage-limit message: normalising it, telling a throttle from the limit, and its reset time.

Claude Code states a limit in prose (`You've hit your limit · resets 8pm (America/New_York)`,
`Claude AI usage limit reached|1748268000`, `Your limit will reset at 5pm (Europe/Warsaw).`)
and a throttle that is *not* the usage window in words that look alike (`API Error: Rate
limit reached`, `529 Overloaded`). This module is that grammar — pure, with `now` and the
default zone passed in — and the `LimitSignal` it produces; `dispatchq.window.limits` reads a
whole run (events, results) and calls it for the text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Literal, cast, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = [
    "GENERAL_SCOPE",
    "JUST_RESET_WINDOW",
    "MODELS",
    "ORG_PAUSED_SCOPE",
    "PERSON_CLEARS",
    "PERSON_HOLD",
    "SKEW_WINDOW",
    "STATEMENT_PRECISION",
    "WEEKLY_SCOPE",
    "LimitKind",
    "LimitSignal",
    "detect_limit",
    "epoch_instant",
    "error_line",
    "is_transient",
    "is_whole_limit",
    "is_whole_transient",
    "limit_kind",
    "normalize_message",
    "person_hold",
    "require_aware",
    "resolve_timezone",
    "spend_scope",
]

GENERAL_SCOPE = "general"
#: The plan's weekly window (`seven_day`): its own marker, so a later weekly lift neither hides
#: the 5-hour one in status nor is taken down by a probe that only showed the 5-hour one open.
WEEKLY_SCOPE = "weekly"
#: An organisation's usage paused by its daily cap (`dailyCapPaused`, "Usage is paused for your
#: organization"): every session of the account waits, apart from the plan's own windows.
ORG_PAUSED_SCOPE = "org:paused"

#: The models that have a usage limit of their own, as Claude Code names them (lower case):
#: in a message (`You've hit your Fable 5 limit`) and in a `rate_limit_event`'s
#: `rateLimitType` (`seven_day_opus`). The one list both readers derive theirs from.
MODELS: tuple[str, ...] = ("opus", "sonnet", "haiku", "fable")

#: Every kind of limit a `LimitSignal` (and so a marker) can carry. The window's own names
#: are the CLI's `rateLimitType`s (`five_hour`, `seven_day`, `seven_day_<model>` for each of
#: `MODELS`, `seven_day_overage_included`); the rest are what only a message states
#: (`monthly`, `org_monthly`, `api_usage`, `credits` for extra usage or credit run out, which
#: is also what an `overage` rejection is), the spend caps Claude Code 2.1.332 names by whose
#: they are (`group_pool`: the team's pooled group budget, `channel`, `service`, `member_spend`:
#: the person's own spend or usage cap, `org_paused`: the organisation paused), the reserve
#: kept for people (`reserved`), an operator's close (`operator`), and `unknown`: a limit that
#: names no kind, or one whose name this list does not know (`limit_kind`). Throttles and
#: overloads are no limit at all.
LimitKind = Literal[
    "five_hour",
    "seven_day",
    "seven_day_opus",
    "seven_day_sonnet",
    "seven_day_haiku",
    "seven_day_fable",
    "seven_day_overage_included",
    "monthly",
    "org_monthly",
    "api_usage",
    "credits",
    "org_paused",
    "group_pool",
    "channel",
    "service",
    "member_spend",
    "reserved",
    "operator",
    "unknown",
]
_LIMIT_KINDS: frozenset[str] = frozenset(get_args(LimitKind))


def limit_kind(name: str, default: LimitKind = "unknown") -> LimitKind:
    """`name` as a `LimitKind`, or `default` when it is none (a new CLI type, an old marker).

    The kinds that come from outside (a `rateLimitType`, a model named in a message, a stored
    marker) pass here, so the type says what every consumer may meet; the scope, not the
    kind, is what decides which sessions a limit pauses.
    """
    return cast(LimitKind, name) if name in _LIMIT_KINDS else default


def spend_scope(kind: LimitKind) -> str:
    """The marker scope of a spend cap: its own, so it lifts apart from the plan's windows.

    A pooled budget, a channel's cap or the person's own cap lift when an admin raises them or
    their period turns, never when the 5-hour window resets; each still pauses every session
    of the account (any scope that is not `model:` does).
    """
    if kind == "org_paused":
        return ORG_PAUSED_SCOPE
    if kind == "seven_day":
        return WEEKLY_SCOPE
    return f"spend:{kind.removesuffix('_spend')}" if kind in _SPEND_KINDS else GENERAL_SCOPE


_SPEND_KINDS: frozenset[str] = frozenset({"group_pool", "channel", "service", "member_spend"})
#: The kinds whose lift only a person brings when the signal states none (an admin raising a
#: cap, support lifting a pause): they wait `PERSON_HOLD` or until `dispatchq window open`.
PERSON_CLEARS: frozenset[str] = _SPEND_KINDS | {"org_paused"}
#: How long a marker that only a person can clear stays up (an operator's `window open` ends it).
PERSON_HOLD = timedelta(days=30)


def person_hold(kind: LimitKind, scope: str, message: str, now: datetime) -> LimitSignal:
    """A limit that states no lift and that only a person clears: up for `PERSON_HOLD`, saying so."""
    return LimitSignal(
        lifts_at=now + PERSON_HOLD,
        kind=kind,
        scope=scope,
        message=f"{message} · until a person clears it (`dispatchq window open`)",
        stated=f"person:{kind}",
        reset_known=False,
    )


# Messages are rounded to the hour or so: a stated time this recently past means "just reset".
JUST_RESET_WINDOW = timedelta(hours=1)
# Resets are stated in whole seconds and clocks differ: a refusal this close to the stated
# instant is clock skew, retried after a short back-off rather than DISPATCHQ_REPROBE_MIN.
SKEW_WINDOW = timedelta(seconds=15)
# A reset stated in words is a minute on the clock (`resets 1:30am`): the instant it names may
# be a minute from the one the service meant, so two statements this close are the same one.
STATEMENT_PRECISION = timedelta(seconds=60)


@dataclass(frozen=True)
class LimitSignal:
    """When the usage window reopens, and what said so.

    `lifts_at` is an aware UTC instant, never in the past (a stale or just-passed time is
    `now` with `just_reset=True`: lift and let one probe find out). `scope` is `general` or
    `model:<name>` (a model's own weekly limit pauses only what runs on that model).
    `stated` is the reset as the message stated it (`"8pm|America/New_York"`,
    `"resetsAt=1749924000"`, `"unknown"`): two refusals with the same `stated` are the same
    stale message, which is what `reprobe_backoff` keys on. `stated_at` is that instant before
    a past one was read as "now" (for telling clock skew from a wrong statement), and
    `next_lifts_at` the next occurrence of a time-only reset read as just passed (where a
    repeated refusal says the message meant tomorrow).
    """

    lifts_at: datetime
    kind: LimitKind
    scope: str
    message: str
    just_reset: bool = False
    stated: str = "unknown"
    source: Literal["event", "text", "status"] = "text"
    reset_known: bool = True
    stated_at: datetime | None = None
    next_lifts_at: datetime | None = None

    @property
    def model(self) -> str | None:
        return self.scope.removeprefix("model:") if self.scope.startswith("model:") else None


def require_aware(now: datetime) -> None:
    """`now` must carry a zone: every instant here is compared in UTC."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be an aware datetime")


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
    r"|rate limited\. please try again later"
    r"|rate limit for your organization"
    r"|\bper minute\b"
    r"|experiencing high load",
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
_KNOWN_MODELS = "|".join(re.escape(model) for model in MODELS)
_ORG = r"(?:org's|organization's|org|organization|team's)"
_NOT_A_MODEL = frozenset(
    {"your", "the", "a", "an", "all", "models", "claude", "ai", "session", "usage", "weekly", "monthly"}
)

# (regex, kind); kind "model" takes the model from the `model` group. First match wins.
_HeadKind = LimitKind | Literal["model", "model_credits"]
_CREDIT_MODELS = r"(?P<model>fable|haiku|mythos|opus|sonnet)"
_HEAD_TABLE: tuple[tuple[str, _HeadKind], ...] = (
    (r"(?:claude(?: ai)? )?usage limit reached\s*\|\s*(?P<epoch>\d{9,13})", "unknown"),
    # Claude Code 2.1.332's spend caps, each by whose it is (read from its binary and runs).
    (r"usage is paused for your organi[sz]ation", "org_paused"),
    (rf"{_HIT} your team's pooled group budget", "group_pool"),
    (rf"{_HIT} your channel's (?:daily |weekly |monthly )?(?:spend|usage) limit", "channel"),
    (rf"{_HIT} your individual (?:daily |weekly |monthly )?(?:spend|usage) limit", "member_spend"),
    (rf"(?:^|· ){_CREDIT_MODELS}(?: [^·\n]{{1,40}}?)? requires usage credits", "model_credits"),
    (rf"{_HIT} (?:your |the )?{_ORG} monthly (?:usage |spend )?limit", "org_monthly"),
    (rf"{_HIT} your monthly (?:usage |spend )?limit", "monthly"),
    (rf"{_HIT} your specified api usage limits?", "api_usage"),
    (r"(?:org's|organization's) monthly (?:usage |spend )?limit (?:reached|hit)", "org_monthly"),
    (r"you(?:'re| are) out of (?:extra usage|usage credits|credits)", "credits"),
    (r"extra usage (?:limit )?(?:reached|exhausted)", "credits"),
    (rf"{_HIT} your (?:5-hour|five-hour|session) limit", "five_hour"),
    (r"(?:5|five)[- ]hour limit reached|session limit reached", "five_hour"),
    (rf"{_HIT} your (?P<model>[a-z][\w.]*) weekly limit", "model"),
    (r"(?P<model>\b[a-z][\w.]*) weekly limit reached", "model"),
    (rf"{_HIT} your (?P<model>{_KNOWN_MODELS})(?: [\d.]+)? limit", "model"),
    (rf"{_HIT} your weekly limit|weekly limit reached", "seven_day"),
    (r"(?:claude(?: ai)? )?usage limit reached", "unknown"),
    (rf"{_HIT} your (?:usage )?limit", "unknown"),
    (r"(?:^|· )limit reached", "unknown"),
)
_HEADS: tuple[tuple[re.Pattern[str], _HeadKind], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), kind) for pattern, kind in _HEAD_TABLE
)

_MONTHS = {
    "jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6,
    "jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12,
}  # fmt: skip
_MON = r"(?P<mon>jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?(?:,? (?P<year>\d{4}))?"
_TIME = r"(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?\s*(?P<ampm>[ap]\.?m\.?)?(?![\w:])"
_ZONE = r"(?:\s*\((?P<zone>[^()]{1,64})\)|\s+(?P<bare_zone>UTC|GMT)\b)?"
_RESET_WORD = re.compile(r"\b(?:resets?|will reset|reset|regain access)(?: at| on)?\s+", re.IGNORECASE)
_SPECS = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        rf"{_MON} {_DAY}(?:(?:,| at|, at)? {_TIME})?{_ZONE}",
        rf"(?P<iso>\d{{4}}-\d{{2}}-\d{{2}})(?:(?:[t ]|,? at )(?P<iso_h>\d{{2}}):(?P<iso_m>\d{{2}}))?{_ZONE}",
        rf"{_TIME}(?:,? (?:on )?{_MON} {_DAY})?{_ZONE}",
        r"in (?P<rel_n>\d+)\s*(?P<rel_u>hours?|hrs?|h|minutes?|mins?|m|days?|d)\b"
        r"(?:\s*(?:and )?(?P<rel_n2>\d+)\s*(?:minutes?|mins?|m)\b)?",
    )
)
_WHOLE_GAP = re.compile(r"^[\s.,;:!·]*(?:(?:your (?:usage )?limit(?: will)?|you will)\s*)?$", re.IGNORECASE)
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


def epoch_instant(value: object) -> datetime | None:
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
    stated_at: datetime | None = None
    next_at: datetime | None = None


def _resolve_spec(match: re.Match[str], now: datetime, default: tzinfo, *, weekly: bool = False) -> _Reset:
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
        relative = now + delta
        return _Reset(
            relative, False, f"in|{relative.replace(second=0, microsecond=0).isoformat()}", match.end()
        )
    hm: tuple[int, int] | None = (0, 0)
    if groups.get("hour"):
        hm = _clock(groups["hour"], groups.get("minute"), groups.get("ampm"))
        if hm is None:
            return _Reset(None, False, "unknown", match.end())
    lifts: datetime | None
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
                lifts = _local(date(int(groups["year"]), month, day_n), hm, zone)
            else:
                lifts = _nearest_year(month, day_n, hm, zone, now)
        except ValueError:
            lifts = None
        return _past_means_now(lifts, now, stated, match.end())
    # A time with no date: the next such time in that zone, unless it passed less than an
    # hour ago (messages are rounded): then it has just reset. Never for a weekly limit: up to
    # 24 h ahead the CLI prints the time only, so "resets 6:46am" at 7:16 means tomorrow.
    assert hm is not None
    today = now.astimezone(zone).date()
    candidates = sorted(_local(today + timedelta(days=d), hm, zone) for d in (-1, 0, 1, 2))
    previous = max((c for c in candidates if c <= now), default=None)
    upcoming = min(c for c in candidates if c > now)
    if previous is not None and now - previous < JUST_RESET_WINDOW and not weekly:
        return _Reset(now, True, stated, match.end(), stated_at=previous, next_at=upcoming)
    return _Reset(upcoming, False, stated, match.end(), stated_at=upcoming)


def _past_means_now(lifts: datetime | None, now: datetime, stated: str, end: int) -> _Reset:
    if lifts is None:
        return _Reset(None, False, "unknown", end)
    if lifts <= now:
        return _Reset(now, True, stated, end, stated_at=lifts)
    return _Reset(lifts, False, stated, end, stated_at=lifts)


def _find_reset(
    text: str, start: int, now: datetime, default: tzinfo, *, weekly: bool = False
) -> tuple[_Reset | None, int]:
    """The reset clause following a limit head; returns it and where it began."""
    for word in _RESET_WORD.finditer(text, start):
        if word.start() - start > 160:  # a "reset" this far away belongs to other text
            break
        for spec in _SPECS:
            match = spec.match(text, word.end())
            if match:
                return _resolve_spec(match, now, default, weekly=weekly), word.start()
    return None, -1


def is_whole_limit(text: str) -> bool:
    """Cheap live check: the text *starts* with a limit message and is message-sized."""
    norm = _strip_hints(text)
    if not norm or len(norm) > 300 or is_transient(norm):
        return False
    return any(head.match(norm) for head, _ in _HEADS)


def is_whole_transient(text: str) -> bool:
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
    return re.sub(r"(?:\s*·\s*|(?<=\.)\s+)/[a-z]\S*.*$", "", joined)


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
    require_aware(now)
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
    head: _HeadKind,
    model: str,
    now: datetime,
    default: tzinfo,
    unknown_reset: float,
    whole: bool,
) -> LimitSignal | None:
    scope = GENERAL_SCOPE
    kind: LimitKind
    if head == "model":
        # A model `MODELS` does not know still has a weekly limit of its own: its scope says whose.
        kind, scope = limit_kind(f"seven_day_{model}", "seven_day"), f"model:{model}"
    elif head == "model_credits":
        # `Opus 4.5 requires usage credits.`: that model waits for credits, the others answer.
        kind, scope = "credits", f"model:{model}"
    else:
        kind, scope = head, spend_scope(head)
    epoch = match.groupdict().get("epoch")
    if epoch:
        end = match.end()
        lifts = epoch_instant(epoch)
        reset = _past_means_now(lifts, now, f"epoch={epoch}", end) if lifts else None
    else:
        weekly = kind.startswith("seven_day") or "weekly" in norm.lower()
        reset, reset_start = _find_reset(norm, match.end(), now, default, weekly=weekly)
        if reset is not None and whole and not _WHOLE_GAP.match(norm[match.end() : reset_start]):
            return None
        end = reset.end if reset is not None else match.end()
    if whole and not _WHOLE_TAIL.match(norm[end:]):
        return None
    message = norm[match.start() : end].strip() if not whole else norm.strip()
    if (reset is None or reset.lifts_at is None) and kind in PERSON_CLEARS:
        return person_hold(kind, scope, message, now)
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
        stated_at=reset.stated_at,
        next_lifts_at=reset.next_at,
    )


# --- the line that says what went wrong ---------------------------------------------------
_FRAME = re.compile(r"^at\s+\S.*(?:\(.*:\d+(?::\d+)?\)|:\d+:\d+)$|^at\s+<anonymous>")
_BANNER = re.compile(r"^(?:Bun v\d|Node\.js v\d|node:internal)")
_SOURCE = re.compile(r"^\d+\s*\|")
_MESSAGE = re.compile(r"^(?:error|[A-Za-z]*Error|fatal|warning)\b\s*:", re.IGNORECASE)
ERROR_LINE_MAX = 400


def _reads_as_message(line: str) -> bool:
    if not line or _FRAME.match(line) or _BANNER.match(line) or _SOURCE.match(line):
        return False
    if set(line) <= set("^~-=_*| "):  # a caret or rule under a source excerpt
        return False
    letters = sum(ch.isalpha() or ch == " " for ch in line)
    return letters >= 0.6 * len(line)  # prose, not minified code


def error_line(stderr: str, *, limit: int = ERROR_LINE_MAX) -> str:
    """The message of a failure from its stderr, never source excerpts, stack frames or banner.

    Claude Code's stderr on a start-up failure is ~5 KB: minified source lines (`474 | …`),
    then `error: bubblewrap is required …`, then `at M7r (/$bunfs/root/…:477:6115)` frames
    and `Bun v1.4.0 (Linux x64 baseline)`. The last line that starts like an error message
    wins; failing that, the last line that reads as prose; cut to `limit` characters.
    """
    lines = [line.strip() for line in stderr.splitlines()]
    candidates = [line for line in lines if _reads_as_message(line)]
    flagged = [line for line in candidates if _MESSAGE.match(line)]
    chosen = (flagged or candidates or [""])[-1]
    if len(chosen) > limit:
        chosen = chosen[: limit - 1].rstrip() + "…"
    return chosen
