"""Reading a session's output: every usage-limit form to its lift instant, and what is not one.

Pure and clock-free: `now` is always given. Zones are chosen so that a sign error, a missed
DST change or a 12/24-hour mix-up lands on a different instant.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from dispatchq.window import limits
from dispatchq.window.limits import (
    LimitSignal,
    detect_limit,
    is_transient,
    limit_from_event,
    normalize_message,
    parse_events,
    read_outcome,
    reprobe_backoff,
    window_state,
)

BERLIN = "Europe/Berlin"
UNKNOWN = 1800.0
# Monday 20 Oct 2025, 15:30 UTC = 17:30 in Berlin (CEST, UTC+2 until 26 Oct) = 11:30 in New York
# = 08:30 in Los Angeles = 18:30 in Moscow.
NOW = datetime(2025, 10, 20, 15, 30, tzinfo=UTC)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def detect(text: str, now: datetime = NOW, tz: str = BERLIN, whole: bool = True) -> LimitSignal | None:
    return detect_limit(text, now=now, default_tz=tz, unknown_reset=UNKNOWN, whole=whole)


# (message, now, expected lifts_at, kind, scope, just_reset)
FORMS = [
    pytest.param(
        "Claude AI usage limit reached|1761000000",
        NOW,
        datetime.fromtimestamp(1761000000, UTC),
        "unknown",
        "general",
        False,
        id="pipe-epoch",
    ),
    pytest.param(
        "Claude usage limit reached. Your limit will reset at 1pm (Etc/GMT+5).",
        NOW,
        utc(2025, 10, 20, 18, 0),  # Etc/GMT+5 is UTC-5: 13:00 there is 18:00 UTC
        "unknown",
        "general",
        False,
        id="etc-gmt-sign",
    ),
    pytest.param(
        "Claude usage limit reached. Your limit will reset at 1pm (Etc/GMT-3).",
        NOW,
        utc(2025, 10, 21, 10, 0),  # UTC+3: 13:00 there was 10:00 UTC, long past today
        "unknown",
        "general",
        False,
        id="etc-gmt-minus",
    ),
    pytest.param(
        "5-hour limit reached ∙ resets 3am",
        NOW,
        utc(2025, 10, 21, 1, 0),  # no zone: the default zone's next 03:00
        "five_hour",
        "general",
        False,
        id="five-hour-no-zone-past-midnight",
    ),
    pytest.param(
        "Session limit reached ∙ resets 8pm",
        NOW,
        utc(2025, 10, 20, 18, 0),
        "five_hour",
        "general",
        False,
        id="session-no-zone",
    ),
    pytest.param(
        "Opus weekly limit reached ∙ resets Oct 24",
        NOW,
        utc(2025, 10, 23, 22, 0),  # start of that day in Berlin
        "seven_day_opus",
        "model:opus",
        False,
        id="model-weekly-date-only",
    ),
    pytest.param(
        "Opus weekly limit reached ∙ resets Oct 31, 9am",
        NOW,
        utc(2025, 10, 31, 8, 0),  # after Berlin's DST change: UTC+1
        "seven_day_opus",
        "model:opus",
        False,
        id="model-weekly-date-time-dst",
    ),
    pytest.param(
        "Weekly limit reached · resets Dec 2, 7pm (Europe/Moscow)",
        NOW,
        utc(2025, 12, 2, 16, 0),
        "seven_day",
        "weekly",
        False,
        id="weekly-zone",
    ),
    pytest.param(
        "You've hit your limit · resets May 5 at 9pm (America/New_York)",
        utc(2026, 5, 1, 12, 0),
        utc(2026, 5, 6, 1, 0),
        "unknown",
        "general",
        False,
        id="date-at-time",
    ),
    pytest.param(
        "You've hit your session limit · resets 12:50am (America/Los_Angeles)",
        NOW,
        utc(2025, 10, 21, 7, 50),  # 08:30 there now: the next 00:50 is tomorrow
        "five_hour",
        "general",
        False,
        id="minutes-past-midnight",
    ),
    pytest.param(
        "You've hit your weekly limit · resets Jul 31, 2am (UTC)",
        utc(2026, 7, 28, 10, 0),
        utc(2026, 7, 31, 2, 0),
        "seven_day",
        "weekly",
        False,
        id="weekly-utc",
    ),
    pytest.param(
        "You're out of extra usage · resets 5pm (Europe/Brussels)",
        utc(2025, 10, 20, 12, 0),
        utc(2025, 10, 20, 15, 0),
        "credits",
        "general",
        False,
        id="extra-usage",
    ),
    pytest.param(
        "You've hit your session limit • resets 4:50pm (America/Denver)",
        utc(2026, 7, 9, 20, 0),
        utc(2026, 7, 9, 22, 50),  # captured from Claude Code 2.1.175; U+2022 separator
        "five_hour",
        "general",
        False,
        id="captured-bullet",
    ),
    pytest.param(
        "You\u2019ve hit your session limit - resets 8pm",
        NOW,
        utc(2025, 10, 20, 18, 0),
        "five_hour",
        "general",
        False,
        id="curly-apostrophe-dash",
    ),
    pytest.param(
        "You\\u2019ve hit your weekly limit \\u00b7 resets Jul 31, 2am (UTC)",
        utc(2026, 7, 28, 10, 0),
        utc(2026, 7, 31, 2, 0),
        "seven_day",
        "weekly",
        False,
        id="json-escapes",
    ),
    pytest.param(
        "Session limit reached ∙ resets 5pm",
        NOW,  # 17:30 in Berlin: 5pm passed half an hour ago
        NOW,
        "five_hour",
        "general",
        True,
        id="just-reset",
    ),
    pytest.param(
        "Session limit reached ∙ resets 4pm",
        NOW,  # 90 minutes past: that was the last reset, the next is tomorrow
        utc(2025, 10, 21, 14, 0),
        "five_hour",
        "general",
        False,
        id="over-an-hour-past-is-tomorrow",
    ),
    pytest.param(
        "You've hit your session limit · resets 11:30pm (UTC)",
        utc(2025, 10, 21, 0, 10),  # 40 minutes after yesterday's 23:30
        utc(2025, 10, 21, 0, 10),
        "five_hour",
        "general",
        True,
        id="just-reset-across-midnight",
    ),
    pytest.param(
        "Weekly limit reached · resets Jan 2, 9am (UTC)",
        utc(2025, 12, 30, 10, 0),
        utc(2026, 1, 2, 9, 0),
        "seven_day",
        "weekly",
        False,
        id="year-rollover",
    ),
    pytest.param(
        "Weekly limit reached · resets Jan 2 (UTC)",
        utc(2025, 12, 30, 10, 0),
        utc(2026, 1, 2, 0, 0),
        "seven_day",
        "weekly",
        False,
        id="year-rollover-date-only",
    ),
    pytest.param(
        "Weekly limit reached · resets Oct 20 (UTC)",
        NOW,  # start of today is past: it has reset
        NOW,
        "seven_day",
        "weekly",
        True,
        id="date-today-just-reset",
    ),
    pytest.param(
        "5-hour limit reached · resets 14:30 (UTC)",
        utc(2025, 10, 20, 10, 0),
        utc(2025, 10, 20, 14, 30),
        "five_hour",
        "general",
        False,
        id="24-hour",
    ),
    pytest.param(
        "5-hour limit reached · resets 9:15 (UTC)",
        utc(2025, 10, 20, 8, 0),
        utc(2025, 10, 20, 9, 15),  # no am/pm: 24-hour, so not 21:15
        "five_hour",
        "general",
        False,
        id="no-ampm-is-24-hour",
    ),
    pytest.param(
        "5-hour limit reached · resets 12am (UTC)",
        utc(2025, 10, 20, 10, 0),
        utc(2025, 10, 21, 0, 0),
        "five_hour",
        "general",
        False,
        id="12am-is-midnight",
    ),
    pytest.param(
        "5-hour limit reached · resets 12pm (UTC)",
        utc(2025, 10, 20, 10, 0),
        utc(2025, 10, 20, 12, 0),
        "five_hour",
        "general",
        False,
        id="12pm-is-noon",
    ),
    pytest.param(
        "5-hour limit reached · resets 5pm UTC",
        utc(2025, 10, 20, 10, 0),
        utc(2025, 10, 20, 17, 0),
        "five_hour",
        "general",
        False,
        id="bare-utc",
    ),
    pytest.param(
        "Session limit reached · resets 8pm (Mars/Olympus_Mons)",
        NOW,
        utc(2025, 10, 20, 18, 0),  # an unknown zone falls back to the default zone
        "five_hour",
        "general",
        False,
        id="unknown-zone",
    ),
    pytest.param(
        "Weekly limit reached · resets in 3 hours",
        NOW,
        NOW + timedelta(hours=3),
        "seven_day",
        "weekly",
        False,
        id="relative",
    ),
    pytest.param(
        "You've hit your Sonnet limit · resets Oct 22, 6am (UTC)",
        NOW,
        utc(2025, 10, 22, 6, 0),
        "seven_day_sonnet",
        "model:sonnet",
        False,
        id="your-model-limit",
    ),
    pytest.param(
        "You've hit your org's monthly usage limit",
        NOW,
        NOW + timedelta(seconds=UNKNOWN),
        "org_monthly",
        "general",
        False,
        id="org-monthly-no-info",
    ),
    pytest.param(
        "You've hit your usage limit.",
        NOW,
        NOW + timedelta(seconds=UNKNOWN),
        "unknown",
        "general",
        False,
        id="no-info",
    ),
    pytest.param(
        "You've hit your limit · resets 9pm (America/New_York)\n\n/upgrade to increase your usage limit.",
        NOW,
        utc(2025, 10, 21, 1, 0),
        "unknown",
        "general",
        False,
        id="with-upgrade-hint",
    ),
]


@pytest.mark.parametrize(("message", "now", "lifts_at", "kind", "scope", "just_reset"), FORMS)
def test_every_message_form_gives_the_right_lift(
    message: str, now: datetime, lifts_at: datetime, kind: str, scope: str, just_reset: bool
) -> None:
    signal = detect(message, now=now)

    assert signal is not None
    assert signal.lifts_at == lifts_at
    assert signal.lifts_at.utcoffset() == timedelta(0)
    assert (signal.kind, signal.scope, signal.just_reset) == (kind, scope, just_reset)


def test_default_zone_is_used_only_without_a_zone() -> None:
    in_tokyo = detect("Session limit reached ∙ resets 8pm", tz="Asia/Tokyo")
    in_berlin = detect("Session limit reached ∙ resets 8pm", tz=BERLIN)
    named = detect("Session limit reached ∙ resets 8pm (Europe/Berlin)", tz="Asia/Tokyo")

    assert in_tokyo is not None and in_berlin is not None and named is not None
    assert in_tokyo.lifts_at == utc(2025, 10, 21, 11, 0)
    assert in_berlin.lifts_at == named.lifts_at == utc(2025, 10, 20, 18, 0)


def test_no_reset_information_is_flagged_and_uses_the_given_delay() -> None:
    signal = detect_limit(
        "You've hit your usage limit.", now=NOW, default_tz="UTC", unknown_reset=42, whole=True
    )

    assert signal is not None
    assert signal.lifts_at == NOW + timedelta(seconds=42)
    assert not signal.reset_known and signal.stated == "unknown"


def test_stated_time_is_the_same_for_the_same_message_at_different_moments() -> None:
    first = detect("Session limit reached ∙ resets 5pm", now=NOW)
    later = detect("Session limit reached ∙ resets 5pm", now=NOW + timedelta(minutes=10))

    assert first is not None and later is not None
    assert first.stated == later.stated


@pytest.mark.parametrize(
    "text",
    [
        "API Error: Rate limit reached",
        "API Error: Server is temporarily limiting requests (not your usage limit) · Rate limited",
        "API Error: Server is temporarily limiting requests (not your\n     usage limit) · Rate limited",
        'API Error: 529 {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
        "API Error: 529 Overloaded. This is a server-side issue, usually temporary — try again in a moment.",
        "API Error (529 Overloaded) · Retrying in 4 seconds… (attempt 4/10)",
    ],
)
def test_transient_throttles_are_not_the_usage_limit(text: str) -> None:
    assert is_transient(text)
    assert detect(text, whole=False) is None


@pytest.mark.parametrize(
    "text",
    [
        "The message 'Claude usage limit reached. Your limit will reset at 1pm' means you should wait.",
        "You've hit your limit · resets 8pm (America/New_York) is what users see; no code change needed.",
        "Here is my analysis. You've hit your session limit · resets 4:50pm (America/Denver)",
        "I reviewed the rate limit configuration and the 5-hour window handling; it is correct.",
        "Weekly limits reset every Monday.",
    ],
)
def test_an_answer_quoting_a_limit_message_is_not_the_limit(text: str) -> None:
    assert detect(text, whole=True) is None


def test_look_alike_model_word_is_not_a_model_scope() -> None:
    signal = detect("Claude weekly limit reached · resets Oct 22, 6am (UTC)", whole=False)

    assert signal is not None
    assert (signal.kind, signal.scope) == ("seven_day", "weekly")


def test_normalisation_unifies_separators_apostrophes_and_escapes() -> None:
    variants = [
        "You've hit your limit · resets 8pm",
        "You’ve hit your limit ∙ resets 8pm",
        "You've hit your limit • resets 8pm",
        "You've hit your limit - resets 8pm",
        "You\\u2019ve hit your limit \\u00b7 resets 8pm",
        "You've hit\n  your limit ·\n resets 8pm",
    ]
    assert {normalize_message(v) for v in variants} == {"You've hit your limit · resets 8pm"}


def test_aware_now_is_required() -> None:
    with pytest.raises(ValueError, match="aware"):
        detect_limit("Session limit reached", now=datetime(2025, 1, 1), default_tz="UTC", unknown_reset=1)


def test_an_unknown_default_zone_is_an_error() -> None:
    with pytest.raises(ValueError, match="Nowhere/City"):
        detect_limit("x", now=NOW, default_tz="Nowhere/City", unknown_reset=1)


# --- structured events ------------------------------------------------------------------------
def rate_event(
    status: str, resets_at: object = 1761000000, rate_type: str = "five_hour", **extra: object
) -> dict:
    info = {"status": status, "resetsAt": resets_at, "rateLimitType": rate_type, "isUsingOverage": False}
    info.update(extra)
    return {"type": "rate_limit_event", "rate_limit_info": info, "uuid": "u", "session_id": "s-1"}


@pytest.mark.parametrize(
    ("event", "lifts_at", "kind", "scope"),
    [
        (rate_event("rejected"), datetime.fromtimestamp(1761000000, UTC), "five_hour", "general"),
        (
            rate_event("rejected", 1761000000000),
            datetime.fromtimestamp(1761000000, UTC),
            "five_hour",
            "general",
        ),
        (
            rate_event("rejected", rate_type="seven_day"),
            datetime.fromtimestamp(1761000000, UTC),
            "seven_day",
            "weekly",
        ),
        (
            rate_event("rejected", rate_type="seven_day_opus"),
            datetime.fromtimestamp(1761000000, UTC),
            "seven_day_opus",
            "model:opus",
        ),
        (
            rate_event(
                "allowed",
                rate_type="overage",
                isUsingOverage=True,
                overageStatus="rejected",
                overageResetsAt=1761100000,
            ),
            datetime.fromtimestamp(1761100000, UTC),
            "credits",
            "general",
        ),
        (rate_event("rejected", None), NOW + timedelta(seconds=UNKNOWN), "five_hour", "general"),
    ],
)
def test_rejected_rate_limit_event(event: dict, lifts_at: datetime, kind: str, scope: str) -> None:
    signal = limit_from_event(event, now=NOW, unknown_reset=UNKNOWN)

    assert signal is not None
    assert (signal.lifts_at, signal.kind, signal.scope, signal.source) == (lifts_at, kind, scope, "event")


@pytest.mark.parametrize(
    "event",
    [
        rate_event("allowed"),
        rate_event("allowed_warning", utilization=0.91),
        rate_event("allowed", overageStatus="rejected", overageDisabledReason="org_level_disabled"),
        {"type": "system", "subtype": "init", "session_id": "s-1"},
    ],
)
def test_informational_rate_limit_events_are_not_a_limit(event: dict) -> None:
    assert limit_from_event(event, now=NOW, unknown_reset=UNKNOWN) is None


def test_a_past_resets_at_means_just_reset() -> None:
    signal = limit_from_event(rate_event("rejected", 1700000000), now=NOW, unknown_reset=UNKNOWN)

    assert signal is not None
    assert signal.just_reset and signal.lifts_at == NOW


# --- whole runs ----------------------------------------------------------------------------
def stream(*events: dict) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


INIT = {
    "type": "system",
    "subtype": "init",
    "session_id": "sess-42",
    "cwd": "/w",
    "model": "claude-sonnet-4-5",
}


def assistant(text: str, model: str = "claude-sonnet-4-5", **extra: object) -> dict:
    return {
        "type": "assistant",
        "message": {"model": model, "role": "assistant", "content": [{"type": "text", "text": text}]},
        "session_id": "sess-42",
        **extra,
    }


def result(text: str, is_error: bool = False, **extra: object) -> dict:
    base = {
        "type": "result",
        "subtype": "success",
        "is_error": is_error,
        "num_turns": 1,
        "result": text,
        "session_id": "sess-42",
        "total_cost_usd": 0 if is_error else 0.02,
        "api_error_status": None,
        "terminal_reason": "api_error" if is_error else "completed",
    }
    base.update(extra)
    return base


def outcome(stdout: str, returncode: int | None = 0, **kwargs: object) -> limits.SessionOutcome:
    return read_outcome(
        stdout, now=NOW, default_tz=BERLIN, unknown_reset=UNKNOWN, returncode=returncode, **kwargs
    )


def test_stream_answer() -> None:
    got = outcome(stream(INIT, rate_event("allowed"), assistant("yes"), result("yes")))

    assert (got.kind, got.text, got.session_id, got.is_error) == ("answer", "yes", "sess-42", False)
    assert got.window_opened
    assert got.total_cost_usd == 0.02 and got.num_turns == 1


def test_json_result_object_and_verbose_array() -> None:
    single = outcome(json.dumps(result("the answer")))
    array = outcome(json.dumps([INIT, assistant("the answer"), result("the answer")]))

    assert (single.kind, single.text, single.session_id) == ("answer", "the answer", "sess-42")
    assert (array.kind, array.text, array.session_id) == ("answer", "the answer", "sess-42")


def test_plain_text_output() -> None:
    assert outcome("just text\n").kind == "answer"
    failed = outcome("", returncode=2, stderr="Error: something broke")
    assert (failed.kind, failed.text) == ("error", "Error: something broke")


def test_structured_rejection_wins_over_the_text_time() -> None:
    got = outcome(
        stream(
            INIT,
            rate_event("rejected", 1761000000),
            assistant("You've hit your session limit · resets 3am", model="<synthetic>", error="rate_limit"),
            result("You've hit your session limit · resets 3am", is_error=True, api_error_status=429),
        ),
        returncode=1,
    )

    assert got.kind == "limit" and got.limit is not None
    assert got.limit.lifts_at == datetime.fromtimestamp(1761000000, UTC)
    assert got.limit.source == "event" and got.limit.kind == "five_hour"
    assert got.limit.message == "You've hit your session limit · resets 3am"
    assert got.refused_at_spawn and not got.cut_off_mid_run


def test_captured_json_limit_result() -> None:
    captured = {
        "type": "result",
        "subtype": "success",
        "is_error": True,
        "api_error_status": 429,
        "duration_ms": 115161,
        "num_turns": 35,
        "result": "You've hit your session limit • resets 4:50pm (America/Denver)",
        "stop_reason": "stop_sequence",
        "session_id": "30f7a294-526a-483e-b9c4-4384deb09e79",
        "total_cost_usd": 0.1517513,
    }
    got = read_outcome(
        json.dumps(captured),
        now=utc(2026, 7, 9, 20, 0),
        default_tz="UTC",
        unknown_reset=UNKNOWN,
        returncode=1,
    )

    assert got.kind == "limit" and got.limit is not None
    assert got.limit.lifts_at == utc(2026, 7, 9, 22, 50)
    assert got.session_id == "30f7a294-526a-483e-b9c4-4384deb09e79"
    assert got.cut_off_mid_run  # 35 turns and real cost: resume it, don't start over


def test_successful_result_whose_whole_text_is_a_limit_message_is_the_limit() -> None:
    got = outcome(json.dumps(result("Claude AI usage limit reached|1761000000")))

    assert got.kind == "limit" and got.limit is not None
    assert got.limit.lifts_at == datetime.fromtimestamp(1761000000, UTC)


def test_successful_answer_quoting_a_limit_is_an_answer() -> None:
    text = "Users see 'Claude AI usage limit reached|1761000000' when the window closes; handle it."
    got = outcome(stream(INIT, rate_event("allowed"), assistant(text), result(text)))

    assert got.kind == "answer" and got.limit is None


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("API Error: Rate limit reached", 429),
        ("API Error: Server is temporarily limiting requests (not your usage limit) · Rate limited", 429),
        ("API Error: 529 Overloaded. This is a server-side issue, usually temporary.", 529),
        ("Request failed", 529),
    ],
)
def test_failed_result_with_a_throttle_is_transient(text: str, status: int) -> None:
    got = outcome(json.dumps(result(text, is_error=True, api_error_status=status)), returncode=1)

    assert got.kind == "transient" and got.limit is None


def test_successful_result_that_is_only_an_api_error_line_is_transient() -> None:
    got = outcome(json.dumps(result("API Error: Rate limit reached")))

    assert got.kind == "transient"


def test_failed_429_without_known_words_is_the_limit_with_unknown_reset() -> None:
    got = outcome(json.dumps(result("Request rejected", is_error=True, api_error_status=429)), returncode=1)

    assert got.kind == "limit" and got.limit is not None
    assert got.limit.source == "status" and not got.limit.reset_known
    assert got.limit.lifts_at == NOW + timedelta(seconds=UNKNOWN)


def test_other_failures_are_errors() -> None:
    got = outcome(
        json.dumps(result("Error: tool failed", is_error=True, subtype="error_during_execution")),
        returncode=1,
    )

    assert (got.kind, got.text, got.subtype) == ("error", "Error: tool failed", "error_during_execution")


def test_an_error_subtype_without_text_is_an_error_that_says_why() -> None:
    got = outcome(
        json.dumps({"type": "result", "subtype": "error_max_turns", "num_turns": 30, "session_id": "s"})
    )

    assert (got.kind, got.text, got.is_error) == ("error", "error_max_turns", True)


def test_limit_hit_mid_run_is_resumable() -> None:
    got = outcome(
        stream(
            INIT,
            rate_event("allowed"),
            assistant("Reading files"),
            rate_event("rejected", 1761000000),
            assistant("You've hit your session limit · resets 3am", model="<synthetic>", error="rate_limit"),
            result("You've hit your session limit · resets 3am", is_error=True, api_error_status=429),
        ),
        returncode=1,
    )

    assert got.kind == "limit" and got.window_opened
    assert got.cut_off_mid_run and not got.refused_at_spawn
    assert got.session_id == "sess-42"


def test_killed_session_with_only_a_synthetic_limit_message() -> None:
    got = outcome(
        stream(INIT, assistant("5-hour limit reached ∙ resets 3am", model="<synthetic>", error="rate_limit")),
        returncode=-9,
    )

    assert got.kind == "limit" and got.limit is not None
    assert got.limit.lifts_at == utc(2025, 10, 21, 1, 0)


def test_killed_session_without_result_is_an_error_that_knows_its_session() -> None:
    got = outcome(stream(INIT), returncode=-9)

    assert (got.kind, got.session_id) == ("error", "sess-42")


def test_general_scope_leads_when_several_windows_reject() -> None:
    got = outcome(
        stream(
            INIT,
            rate_event("rejected", 1761500000, "seven_day_opus"),
            rate_event("rejected", 1761000000, "five_hour"),
            result("You've hit your limit", is_error=True, api_error_status=429),
        ),
        returncode=1,
    )

    assert got.limit is not None and got.limit.scope == "general"
    assert {s.scope for s in got.limits} == {"general", "model:opus"}


def test_parse_events_skips_noise() -> None:
    text = "warning: something\n" + json.dumps(INIT) + "\nnot json {\n[1, 2]\n" + json.dumps(result("x"))
    assert [e["type"] for e in parse_events(text)] == ["system", "result"]


# --- live window state (the probe) --------------------------------------------------------
@pytest.mark.parametrize(
    ("event", "state"),
    [
        (INIT, None),
        (rate_event("allowed"), "open"),
        (rate_event("allowed_warning"), "open"),
        (rate_event("rejected"), "closed"),
        (assistant("thinking"), "open"),
        (assistant("You've hit your limit · resets 3am", model="<synthetic>", error="rate_limit"), "closed"),
        (assistant("API Error: 529 Overloaded.", model="<synthetic>", error="server_error"), None),
        (
            {
                "type": "user",
                "message": {"role": "user", "content": [{"type": "tool_result", "content": "ok"}]},
            },
            "open",
        ),
        (result("done"), "open"),
        (result("You've hit your limit · resets 3am", is_error=True, api_error_status=429), "closed"),
        (result("Claude AI usage limit reached|1761000000"), "closed"),
        (result("API Error: Rate limit reached", is_error=True, api_error_status=429), None),
    ],
)
def test_window_state(event: dict, state: str | None) -> None:
    assert window_state(event) == state


# --- re-probe back-off ------------------------------------------------------------------------
def test_reprobe_backoff_doubles_for_the_same_stale_time() -> None:
    message = "Session limit reached ∙ resets 5pm"
    stated: str | None = None
    refusals = 0
    lifts = []
    now = NOW
    for _ in range(4):  # each probe is refused with the same (stale) message
        signal = detect(message, now=now)
        assert signal is not None and signal.just_reset
        signal, refusals = reprobe_backoff(
            signal, previous_stated=stated, previous_refusals=refusals, now=now, reprobe_min=60
        )
        stated = signal.stated
        lifts.append(signal.lifts_at - now)
        now = signal.lifts_at  # the next probe runs at the lift

    assert lifts == [timedelta(0), timedelta(seconds=60), timedelta(seconds=120), timedelta(seconds=240)]
    assert refusals == 4


def test_reprobe_backoff_resets_for_a_new_stated_time_and_respects_a_later_lift() -> None:
    first = detect("Session limit reached ∙ resets 5pm")
    assert first is not None
    other = detect("Session limit reached ∙ resets 9pm")
    assert other is not None

    moved, count = reprobe_backoff(
        other, previous_stated=first.stated, previous_refusals=3, now=NOW, reprobe_min=60
    )
    assert (moved, count) == (other, 1)

    later, count = reprobe_backoff(
        other, previous_stated=other.stated, previous_refusals=1, now=NOW, reprobe_min=60
    )
    assert later.lifts_at == other.lifts_at and count == 2  # already beyond the floor


def test_reprobe_backoff_is_capped() -> None:
    signal = LimitSignal(NOW, "five_hour", "general", "m", just_reset=True, stated="5pm|UTC")
    capped, _ = reprobe_backoff(
        signal, previous_stated="5pm|UTC", previous_refusals=20, now=NOW, reprobe_min=60, max_delay=3600
    )

    assert capped.lifts_at == NOW + timedelta(hours=1) and not capped.just_reset


# --- clock skew before "tomorrow" (issue 23, item 5) -------------------------------------------
# The API's clock 2 s behind this host's: the probe at the stated lift is refused with that (now
# just past) reset. Read as "unknown kind, just reset, refused again: the next day's occurrence"
# the window closed for a day; a refusal within the skew window is skew whatever the kind.
SKEW_AT = utc(2025, 10, 20, 13, 31)  # 15:31 in Berlin, on the minute the message states
UNKNOWN_TEXT = "You've hit your limit · resets 3:31pm (Europe/Berlin)"


def _refused_probe(
    stdout: str, previous: LimitSignal, asked: datetime, now: datetime
) -> tuple[LimitSignal, int]:
    out = read_outcome(stdout, now=now, default_tz=BERLIN, unknown_reset=UNKNOWN, returncode=1)
    assert out.limit is not None and out.limit.kind == "unknown"
    return limits.reprobe_backoff(
        out.limit,
        previous_stated=previous.stated,
        previous_refusals=1,
        now=now,
        reprobe_min=300,
        asked_at=asked,
        previous_stated_at=previous.stated_at,
    )


def _failed(*events: dict) -> str:
    return stream(INIT, *events, result(UNKNOWN_TEXT, is_error=True, api_error_status=429))


EVENT = rate_event("rejected", int(SKEW_AT.timestamp()))
EVENT["rate_limit_info"].pop("rateLimitType", None)  # a refusal that names no kind
SYNTHETIC = assistant(UNKNOWN_TEXT, model="<synthetic>", error="rate_limit")


@pytest.mark.parametrize(
    "stdout",
    [
        _failed(SYNTHETIC),  # the words alone (2.1.332 prints no event for a past reset)
        _failed(EVENT, SYNTHETIC),  # the event, then the words
        _failed(SYNTHETIC, EVENT),  # the words, then the event
    ],
    ids=["text-only", "event-then-text", "text-then-event"],
)
def test_an_unknown_kind_refused_a_moment_after_its_reset_is_skew_not_tomorrow(stdout: str) -> None:
    hit_at = SKEW_AT - timedelta(minutes=20)
    first = read_outcome(stdout, now=hit_at, default_tz=BERLIN, unknown_reset=UNKNOWN, returncode=1)
    assert first.limit is not None
    asked, now = SKEW_AT + timedelta(seconds=1), SKEW_AT + timedelta(seconds=3)
    moved, refusals = _refused_probe(stdout, first.limit, asked, now)
    assert refusals == 2
    assert moved.lifts_at == now + timedelta(seconds=2)  # a skew retry in seconds
    assert moved.lifts_at - SKEW_AT < timedelta(minutes=1)  # never "the same minute tomorrow"


def test_the_same_reset_stated_by_the_words_then_by_the_event_is_one_statement() -> None:
    """The hit read from text (`3:31pm|Europe/Berlin`), the probe's refusal from the event
    (`resetsAt=…`): the same instant, so the skew chain counts on instead of starting afresh."""
    words = read_outcome(
        _failed(SYNTHETIC),
        now=SKEW_AT - timedelta(minutes=20),
        default_tz=BERLIN,
        unknown_reset=UNKNOWN,
        returncode=1,
    )
    assert words.limit is not None and words.limit.stated.endswith("|Europe/Berlin")
    asked, now = SKEW_AT + timedelta(seconds=1), SKEW_AT + timedelta(seconds=3)
    moved, refusals = _refused_probe(_failed(EVENT, SYNTHETIC), words.limit, asked, now)
    assert refusals == 2 and moved.lifts_at == now + timedelta(seconds=2)


def test_after_the_skew_retries_an_unknown_just_reset_time_still_means_tomorrow() -> None:
    signal = detect(UNKNOWN_TEXT, now=SKEW_AT + timedelta(seconds=5))
    assert signal is not None and signal.just_reset and signal.next_lifts_at is not None
    moved, refusals = limits.reprobe_backoff(
        signal,
        previous_stated=signal.stated,
        previous_refusals=5,
        now=SKEW_AT + timedelta(minutes=5),
        reprobe_min=300,
        asked_at=SKEW_AT + timedelta(minutes=5),
    )
    assert refusals == 6 and moved.lifts_at == signal.next_lifts_at


def test_a_refusal_long_after_an_unknown_reset_means_tomorrow_at_once() -> None:
    signal = detect(UNKNOWN_TEXT, now=SKEW_AT + timedelta(minutes=10))
    assert signal is not None and signal.next_lifts_at is not None
    moved, _ = limits.reprobe_backoff(
        signal,
        previous_stated=signal.stated,
        previous_refusals=1,
        now=SKEW_AT + timedelta(minutes=10),
        reprobe_min=300,
    )
    assert moved.lifts_at == signal.next_lifts_at
