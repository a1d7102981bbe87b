"""Codex CLI's limit statements to their lift instants: the words in the host's zone, and the fields.

Each text form is the one `UsageLimitReachedError` writes (`codex-rs/protocol/src/error.rs`,
docs/codex-cli.md): the plan's sentence, then the retry clause in chrono's `Local` time with no
zone. The zone each case reads it in is given beside it, and chosen so that reading it in any
other zone, or as UTC, lands on a different instant. Pure and clock-free: `now` is given.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatchq.window.codex_limits import (
    CodexWindow,
    detect_codex_limit,
    is_codex_credential_refused,
    is_codex_transient,
    limits_from_429,
    limits_from_windows,
    prefer_structured,
    windows_from_headers,
    windows_from_rate_limits,
)
from dispatchq.window.limits import LimitSignal, reprobe_backoff

UNKNOWN = 1800.0
# Wednesday 25 Nov 2026, 12:00 UTC = 07:00 in New York (EST, UTC-5) = 21:00 in Tokyo (UTC+9)
# = 13:00 in Berlin (CET, UTC+1) = 17:30 in Kolkata (UTC+5:30).
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
NY, TOKYO, BERLIN, KOLKATA = "America/New_York", "Asia/Tokyo", "Europe/Berlin", "Asia/Kolkata"
HIT = "You've hit your usage limit."
SPARK = "model:gpt-5.3-codex-spark"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def detect(text: str, zone: str, now: datetime = NOW) -> LimitSignal | None:
    return detect_codex_limit(text, now=now, default_tz=zone, unknown_reset=UNKNOWN)


# (text, zone of the host that ran the CLI, lifts_at (None: unknown reset), scope, just_reset)
TEXTS = [
    pytest.param(
        f"{HIT} Try again at 3:04 PM.", NY, utc(2026, 11, 25, 20, 4), "general", False,
        id="same-day-new-york",  # 15:04 EST is 20:04 UTC, still ahead of 07:00 there
    ),
    pytest.param(
        f"{HIT} Try again at 3:04 PM.", TOKYO, utc(2026, 11, 26, 6, 4), "general", False,
        id="time-passed-means-tomorrow-tokyo",  # 15:04 JST passed at 21:00: the next day's, 06:04 UTC
    ),
    pytest.param(
        f"{HIT} Try again at 11:30 AM.", "UTC", NOW, "general", True,
        id="just-passed-means-just-reset-utc",  # 30 minutes ago: lift now, one probe finds out
    ),
    pytest.param(
        f"{HIT} Try again at 12:15 AM.", NY, utc(2026, 11, 26, 5, 15), "general", False,
        id="midnight-hour-is-zero-new-york",  # 00:15 EST next day; 12 AM is hour 0, not 12
    ),
    pytest.param(
        f"{HIT} Try again at Nov 26th, 2026 3:04 PM.", BERLIN, utc(2026, 11, 26, 14, 4), "general", False,
        id="another-day-berlin",
    ),
    pytest.param(
        f"{HIT} Try again at Dec 3rd, 2026 9:00 AM.", KOLKATA, utc(2026, 12, 3, 3, 30), "general", False,
        id="another-day-half-hour-zone-kolkata",
    ),
    pytest.param(
        f"{HIT} Try again at Nov 22nd, 2026 3:04 PM.", NY, NOW, "general", True,
        id="a-date-already-past-is-just-reset",
    ),
    pytest.param(f"{HIT} Try again later.", NY, None, "general", False, id="later-no-time"),
    pytest.param(
        f"{HIT} Upgrade to Pro (https://chatgpt.com/explore/pro), visit https://chatgpt.com/codex/settings/usage"
        " to purchase more credits or try again at 3:04 PM.",
        NY, utc(2026, 11, 25, 20, 4), "general", False,
        id="plus-plan-or-try-again",
    ),
    pytest.param(
        f"{HIT} To get more access now, send a request to your admin or try again later.",
        NY, None, "general", False,
        id="team-plan-later",
    ),
    pytest.param(
        f"{HIT} Upgrade to Plus to continue using Codex (https://chatgpt.com/explore/plus),"
        " or try again at Nov 30th, 2026 8:45 PM.",
        TOKYO, utc(2026, 11, 30, 11, 45), "general", False,
        id="free-plan-another-day-tokyo",
    ),
    pytest.param(
        f"{HIT} Visit https://chatgpt.com/codex/settings/usage to purchase more credits"
        " or try again at 9:05 AM.",
        KOLKATA, utc(2026, 11, 26, 3, 35), "general", False,
        id="pro-plan-passed-kolkata",  # 09:05 IST passed at 17:30: tomorrow
    ),
    pytest.param(
        "You've hit your usage limit for GPT-5.3-Codex-Spark. Switch to another model now, or try again at"
        " 3:04 PM.",
        NY, utc(2026, 11, 25, 20, 4), SPARK, False,
        id="per-model-same-day",
    ),
    pytest.param(
        "You've hit your usage limit for GPT-5.3-Codex-Spark. Switch to another model now,"
        " or try again later.",
        NY, None, SPARK, False,
        id="per-model-later",
    ),
    pytest.param(
        "You've hit your usage limit for GPT-5.3-Codex-Spark. Switch to another model now, or try again at"
        " Nov 27th, 2026 10:00 AM.",
        BERLIN, utc(2026, 11, 27, 9, 0), SPARK, False,
        id="per-model-another-day-berlin",
    ),
    pytest.param(
        f"{HIT} Try again at 3:04 PM. (request id: req_123)", NY, utc(2026, 11, 25, 20, 4), "general", False,
        id="details-appended",  # `codex exec --json` adds "(details)" after the message
    ),
    pytest.param(
        f"stream error: {HIT} Try again at 3:04\u202fPM.", NY, utc(2026, 11, 25, 20, 4), "general", False,
        id="prefixed-narrow-space",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("text", "zone", "lifts_at", "scope", "just_reset"), TEXTS)
def test_each_text_form_lifts_at_its_instant_in_the_hosts_zone(
    text: str, zone: str, lifts_at: datetime | None, scope: str, just_reset: bool
) -> None:
    signal = detect(text, zone)
    assert signal is not None
    assert signal.scope == scope
    assert signal.just_reset is just_reset
    if lifts_at is None:
        assert not signal.reset_known
        assert signal.lifts_at == NOW + timedelta(seconds=UNKNOWN)
        assert signal.stated == "unknown"
    else:
        assert signal.reset_known
        assert signal.lifts_at == lifts_at
    assert signal.source == "text"
    assert signal.message.startswith("You've hit your usage limit")


def test_the_zone_decides_the_instant_of_the_same_words() -> None:
    text = f"{HIT} Try again at 3:04 PM."
    ny, berlin = detect(text, NY), detect(text, BERLIN)
    assert ny is not None and berlin is not None
    assert ny.lifts_at - berlin.lifts_at == timedelta(hours=6)
    assert ny.stated.endswith("|America/New_York")


def test_a_time_read_as_just_reset_moves_to_the_next_day_when_refused_again() -> None:
    signal = detect(f"{HIT} Try again at 11:30 AM.", "UTC")
    assert signal is not None and signal.just_reset
    assert signal.next_lifts_at == utc(2026, 11, 26, 11, 30)
    moved, refusals = reprobe_backoff(
        signal, previous_stated=signal.stated, previous_refusals=5, now=NOW, reprobe_min=60.0,
        previous_stated_at=signal.stated_at,
    )  # fmt: skip
    assert refusals == 6
    assert moved.lifts_at == utc(2026, 11, 26, 11, 30)


@pytest.mark.parametrize(
    ("text", "kind", "scope"),
    [
        ("Your workspace is out of credits. Add credits to continue.", "credits", "general"),
        (
            "Your workspace is out of credits. Ask your workspace owner to refill in order to continue.",
            "credits",
            "general",
        ),
        ("You hit your spend cap set in your workspace. Increase your spend cap to continue.", "member_spend",
         "spend:member"),
        ("You hit your spend cap set by the owner of your workspace. Ask an owner to increase your spend cap"
         " to continue.", "member_spend", "spend:member"),
    ],
)  # fmt: skip
def test_a_workspace_without_credits_waits_for_a_person(text: str, kind: str, scope: str) -> None:
    signal = detect(text, NY)
    assert signal is not None
    assert (signal.kind, signal.scope) == (kind, scope)
    assert not signal.reset_known
    assert signal.lifts_at > NOW + timedelta(days=7)
    assert "dispatchq window open" in signal.message


@pytest.mark.parametrize(
    "text",
    [
        "Selected model is at capacity. Please try a different model.",
        "We're currently experiencing high demand, which may cause temporary errors.",
        "exceeded retry limit, last status: 503 Service Unavailable, request id: abc",
        "stream disconnected before completion: connection reset",
    ],
)
def test_throttles_are_transient_and_no_limit(text: str) -> None:
    assert is_codex_transient(text)
    assert detect(text, NY) is None
    assert not is_codex_credential_refused(text)


@pytest.mark.parametrize(
    "text",
    [
        "Quota exceeded. Check your plan and billing details.",
        "To use Codex with your ChatGPT plan, upgrade to Plus: https://chatgpt.com/explore/plus.",
        "unexpected status 401 Unauthorized: Incorrect API key provided",
    ],
)
def test_a_refused_credential_is_no_limit(text: str) -> None:
    assert is_codex_credential_refused(text)
    assert detect(text, NY) is None
    assert not is_codex_transient(text)


def test_a_bare_429_is_the_limit_with_an_unknown_reset() -> None:
    signal = detect("exceeded retry limit, last status: 429 Too Many Requests", NY)
    assert signal is not None
    assert (signal.scope, signal.reset_known, signal.source) == ("general", False, "status")
    assert signal.lifts_at == NOW + timedelta(seconds=UNKNOWN)
    assert not is_codex_transient("exceeded retry limit, last status: 429 Too Many Requests")


def test_a_limit_message_is_neither_throttle_nor_refusal() -> None:
    text = f"{HIT} Upgrade to Plus to continue using Codex (https://chatgpt.com/explore/plus), or try again"
    text += " later."
    assert not is_codex_transient(text)
    assert not is_codex_credential_refused(text)


# --- the fields ----------------------------------------------------------------------------
PRIMARY_RESET = 1795622400  # 2026-11-25 16:00 UTC
SECONDARY_RESET = 1796083200  # 2026-12-01 00:00 UTC


def headers(primary: str, secondary: str) -> dict[str, str]:
    return {
        "X-Codex-Primary-Used-Percent": primary,
        "x-codex-primary-window-minutes": "300",
        "x-codex-primary-reset-at": str(PRIMARY_RESET),
        "x-codex-secondary-used-percent": secondary,
        "x-codex-secondary-window-minutes": "10080",
        "x-codex-secondary-reset-at": str(SECONDARY_RESET),
    }


def body(**error: object) -> dict[str, object]:
    return {"error": {"type": "usage_limit_reached", "plan_type": "plus", **error}}


def test_a_429_with_the_primary_full_closes_the_general_window_at_its_reset() -> None:
    (signal,) = limits_from_429(body(resets_at=PRIMARY_RESET), headers("100", "41.5"), now=NOW,
                                unknown_reset=UNKNOWN)  # fmt: skip
    assert (signal.kind, signal.scope) == ("five_hour", "general")
    assert signal.lifts_at == datetime.fromtimestamp(PRIMARY_RESET, UTC)
    assert signal.source == "event"
    assert signal.stated == f"resetsAt={PRIMARY_RESET}"


def test_a_429_with_the_secondary_full_closes_the_weekly_window() -> None:
    (signal,) = limits_from_429(
        body(resets_at=SECONDARY_RESET), headers("12", "100.0"), now=NOW, unknown_reset=UNKNOWN
    )
    assert (signal.kind, signal.scope) == ("seven_day", "weekly")
    assert signal.lifts_at == datetime.fromtimestamp(SECONDARY_RESET, UTC)


def test_both_windows_full_are_two_limits_of_the_credential() -> None:
    signals = limits_from_429(body(resets_at=SECONDARY_RESET), headers("100", "100"), now=NOW,
                              unknown_reset=UNKNOWN)  # fmt: skip
    assert {(s.scope, s.lifts_at) for s in signals} == {
        ("general", datetime.fromtimestamp(PRIMARY_RESET, UTC)),
        ("weekly", datetime.fromtimestamp(SECONDARY_RESET, UTC)),
    }


def test_a_429_body_alone_states_the_general_lift() -> None:
    (at,) = limits_from_429(body(resets_at=PRIMARY_RESET), {}, now=NOW, unknown_reset=UNKNOWN)
    assert (at.scope, at.lifts_at) == ("general", datetime.fromtimestamp(PRIMARY_RESET, UTC))
    assert "plus" in at.message
    (after,) = limits_from_429(
        '{"error": {"type": "usage_limit_reached", "resets_in_seconds": 5400}}', {}, now=NOW,
        unknown_reset=UNKNOWN,
    )  # fmt: skip
    assert after.lifts_at == NOW + timedelta(seconds=5400)
    assert after.reset_known
    (nothing,) = limits_from_429(body(), {}, now=NOW, unknown_reset=UNKNOWN)
    assert not nothing.reset_known
    assert nothing.lifts_at == NOW + timedelta(seconds=UNKNOWN)


@pytest.mark.parametrize(
    "answer",
    [
        {"error": {"type": "usage_not_included"}},
        {"error": {"type": "rate_limit_exceeded", "message": "Rate limit reached for requests"}},
        "not json",
        {"detail": "no error key"},
    ],
)
def test_other_429s_are_no_usage_limit(answer: object) -> None:
    assert limits_from_429(answer, headers("100", "0"), now=NOW, unknown_reset=UNKNOWN) == []  # type: ignore[arg-type]


def test_headers_of_a_model_limit_name_its_own_scope() -> None:
    windows = windows_from_headers(
        {
            "x-codex-primary-used-percent": "20",
            "x-codex-bengalfox-primary-used-percent": "100",
            "x-codex-bengalfox-primary-window-minutes": "300",
            "x-codex-bengalfox-primary-reset-at": str(PRIMARY_RESET),
            "x-codex-bengalfox-limit-name": "GPT-5.3-Codex-Spark",
        }
    )
    assert {(w.limit_id, w.scope, w.full) for w in windows} == {
        ("codex", "general", False),
        ("codex_bengalfox", SPARK, True),
    }
    (signal,) = limits_from_windows(windows, now=NOW, unknown_reset=UNKNOWN)
    assert signal.scope == SPARK


def rate_limits_reply(**snapshot: object) -> dict[str, object]:
    base: dict[str, object] = {
        "limitId": "codex",
        "limitName": None,
        "primary": {"usedPercent": 100, "windowDurationMins": 300, "resetsAt": PRIMARY_RESET},
        "secondary": {"usedPercent": 64, "windowDurationMins": 10080, "resetsAt": SECONDARY_RESET},
        "credits": None,
        "planType": "pro",
        "rateLimitReachedType": None,
    }
    base.update(snapshot)
    return {"jsonrpc": "2.0", "id": 7, "result": {"rateLimits": base, "rateLimitsByLimitId": None}}


def test_the_app_server_reading_closes_only_the_full_window() -> None:
    windows = windows_from_rate_limits(rate_limits_reply())
    assert [(w.slot, w.used_percent) for w in windows] == [("primary", 100.0), ("secondary", 64.0)]
    (signal,) = limits_from_windows(windows, now=NOW, unknown_reset=UNKNOWN)
    assert (signal.kind, signal.scope, signal.lifts_at) == (
        "five_hour", "general", datetime.fromtimestamp(PRIMARY_RESET, UTC),
    )  # fmt: skip


def test_the_app_server_reading_per_limit_id_and_its_notification() -> None:
    spark = {
        "limitId": "codex_bengalfox",
        "limitName": "GPT-5.3-Codex-Spark",
        "primary": None,
        "secondary": {"usedPercent": 100, "windowDurationMins": 10080, "resetsAt": SECONDARY_RESET},
    }
    reply = {"result": {"rateLimits": {}, "rateLimitsByLimitId": {"codex_bengalfox": spark}}}
    (signal,) = limits_from_windows(windows_from_rate_limits(reply), now=NOW, unknown_reset=UNKNOWN)
    assert (signal.kind, signal.scope) == ("seven_day", SPARK)
    notice = {"method": "account/rateLimits/updated", "params": {"rateLimits": spark}}
    assert [w.scope for w in windows_from_rate_limits(notice)] == [SPARK]


def test_an_open_reading_and_a_depleted_workspace() -> None:
    open_reply = rate_limits_reply(
        primary={"usedPercent": 99, "windowDurationMins": 300, "resetsAt": PRIMARY_RESET}
    )
    assert limits_from_windows(windows_from_rate_limits(open_reply), now=NOW, unknown_reset=UNKNOWN) == []
    depleted = rate_limits_reply(
        primary={"usedPercent": 3, "windowDurationMins": 300, "resetsAt": PRIMARY_RESET},
        rateLimitReachedType="workspace_member_credits_depleted",
    )
    (hold,) = limits_from_windows(windows_from_rate_limits(depleted), now=NOW, unknown_reset=UNKNOWN)
    assert hold.kind == "credits" and not hold.reset_known


def test_a_reset_already_past_is_just_reset() -> None:
    window = CodexWindow("codex", "primary", 100.0, 300, NOW - timedelta(seconds=5))
    (signal,) = limits_from_windows([window], now=NOW, unknown_reset=UNKNOWN)
    assert signal.just_reset and signal.lifts_at == NOW


def test_the_fields_win_over_the_words() -> None:
    words = detect(f"{HIT} Try again at 3:04 PM.", NY)
    fields = limits_from_429(
        body(resets_at=PRIMARY_RESET), headers("100", "3"), now=NOW, unknown_reset=UNKNOWN
    )
    (chosen,) = prefer_structured(fields, words)
    assert chosen.lifts_at == datetime.fromtimestamp(PRIMARY_RESET, UTC)
    assert chosen.kind == "five_hour"
    assert words is not None and chosen.message == words.message
    assert prefer_structured([], words) == (words,)
    assert prefer_structured([], None) == ()
