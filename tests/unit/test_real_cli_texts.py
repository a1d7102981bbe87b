"""What the real Claude Code CLI (2.1.197, and 2.1.332's result form) printed, read as dispatchq must.

Every text here was printed by the real CLI against the stand-in API
(`dispatchq/testing/anthropic.py`) or is quoted in issue 12; `tests/unit/test_limits.py` keeps
the older forms. Pure and clock-free: `now` is always given.

The cases whose texts both releases print take `release` (each of `RELEASES`): the result and
the synthetic assistant message are then built in that release's own form (2.1.332 puts
`type` 18th, says `terminal_reason: "api_error"` and `api_error_type`, marks the message
`is_api_error_message`). Texts only 2.1.197 prints stay on its form; 2.1.332's new texts are
the signals work's own file.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dispatchq.launcher.releases import OLDEST
from dispatchq.window.limits import LimitSignal, read_outcome, reprobe_backoff, reserve_signals
from dispatchq.window.marker import applies, scope_pausing
from dispatchq.window.messages import detect_limit, error_line

NOW = datetime(2026, 12, 1, 7, 16, tzinfo=UTC)
UNKNOWN = 900.0

BUN_STDERR = (
    '472 | `),process.exit(1)}function a7r(){return!1}function NFd(e){return!1}var LBt="X";\n'
    "473 | var hRn,c7r;var u7r=E(()=>{Kr();hRn=ve(()=>H.object({restrictions:H.record(H.string())}))});\n"
    "                                                                                        ^\n"
    "error: bubblewrap is required for subprocess env scrubbing and isolation. Install with: sudo "
    "apt-get install -y bubblewrap, set sandbox.bwrapPath in managed settings, or set "
    "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB=0 to disable (loses subprocess isolation).\n"
    "      at M7r (/$bunfs/root/src/entrypoints/cli.js:477:6115)\n"
    "      at <anonymous> (/$bunfs/root/src/entrypoints/cli.js:11379:4615)\n"
    "      at n (/$bunfs/root/src/entrypoints/cli.js:12:20060)\n"
    "\n"
    "Bun v1.4.0 (Linux x64 baseline)\n"
)


def test_the_reason_is_the_error_line_not_source_frames_or_banner() -> None:
    line = error_line(BUN_STDERR)
    assert line.startswith("error: bubblewrap is required for subprocess env scrubbing")
    assert line.endswith("(loses subprocess isolation).")


@pytest.mark.parametrize(
    ("stderr", "line"),
    [
        (
            "No conversation found with session ID: 1234-abcd\n",
            "No conversation found with session ID: 1234-abcd",
        ),
        (
            "warning: something\nError: Invalid API key · Please run /login\n",
            "Error: Invalid API key · Please run /login",
        ),
        ("plain words only\n", "plain words only"),
        ("      at x (/a.js:1:2)\nBun v1.4.0 (Linux x64 baseline)\n", ""),
    ],
)
def test_error_line_forms(stderr: str, line: str) -> None:
    assert error_line(stderr) == line


def test_error_line_is_capped() -> None:
    assert len(error_line("error: " + "word " * 400)) <= 400


def _stream(*events: dict[str, Any]) -> str:
    return "\n".join(json.dumps(e) for e in events)


API_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def _result(
    text: str,
    *,
    is_error: bool,
    status: int | None,
    turns: int = 1,
    cost: float = 0.0,
    release: str = OLDEST,
) -> dict[str, Any]:
    if release == OLDEST:
        return {
            "type": "result",
            "subtype": "success",
            "is_error": is_error,
            "api_error_status": status,
            "num_turns": turns,
            "result": text,
            "session_id": "s-1",
            "total_cost_usd": cost,
            "terminal_reason": "completed",
        }
    # 2.1.332's order (observed): `type` is the 18th key, after the usage blocks.
    newer: dict[str, Any] = {
        "duration_api_ms": 0,
        "stop_reason": "stop_sequence",
        "session_id": "s-1",
        "total_cost_usd": cost,
        "usage": {},
        "modelUsage": {},
        "permission_denials": [],
        "terminal_reason": "api_error" if is_error else "completed",  # observed for "Not logged in"
        "fast_mode_state": "off",
        "is_error": is_error,
        "num_turns": turns,
        "subtype": "success",
        "api_error_status": status,
        "result": text,
        "type": "result",
        "duration_ms": 1,
        "result_index": 0,
    }
    if is_error and status:
        # The response body's `error.type`, as the Messages API names it per status.
        newer["api_error_type"] = API_ERROR_TYPES.get(status, "api_error")
    return newer


def _event(**info: Any) -> dict[str, Any]:
    return {"type": "rate_limit_event", "rate_limit_info": info, "session_id": "s-1"}


def outcome(stdout: str, now: datetime = NOW, **kwargs: Any) -> Any:
    return read_outcome(stdout, now=now, default_tz="UTC", unknown_reset=UNKNOWN, **kwargs)


def test_a_failed_start_reads_its_error_line_from_stderr() -> None:
    got = outcome("", returncode=1, stderr=BUN_STDERR)
    assert got.kind == "host"  # the command refuses to start: every session here would
    assert got.text.startswith("error: bubblewrap is required")


def test_a_subscriber_429_not_your_usage_limit_is_transient_despite_the_rejected_event(
    texts_release: str,
) -> None:
    text = "API Error: Server is temporarily limiting requests (not your usage limit) · Rate limited"
    result = _result(text, is_error=True, status=429, release=texts_release)
    got = outcome(_stream(_event(status="rejected", isUsingOverage=False), result))
    assert got.kind == "transient"
    assert got.limit is None


def test_a_completed_answer_billed_as_extra_usage_is_an_answer(texts_release: str) -> None:
    resets = int((NOW + timedelta(hours=2)).timestamp())
    event = _event(
        status="rejected",
        resetsAt=resets,
        rateLimitType="five_hour",
        overageStatus="allowed",
        isUsingOverage=True,
    )
    got = outcome(
        _stream(event, _result("4", is_error=False, status=None, cost=0.00005, release=texts_release))
    )
    assert got.kind == "answer"
    assert got.text == "4"


def test_the_real_session_limit_is_a_limit_at_its_resets_at(texts_release: str) -> None:
    resets = int((NOW + timedelta(minutes=30)).timestamp())
    event = _event(
        status="rejected",
        resetsAt=resets,
        rateLimitType="five_hour",
        overageStatus="rejected",
        overageDisabledReason="org_level_disabled",
        isUsingOverage=False,
    )
    # 2.1.197 calls five_hour "session limit", 2.1.332 "5-hour limit": the event's resetsAt rules.
    name = "session limit" if texts_release == OLDEST else "5-hour limit"
    text = f"You've hit your {name} · resets 7:46am (UTC)"
    got = outcome(_stream(event, _result(text, is_error=True, status=429, release=texts_release)))
    assert got.kind == "limit"
    assert got.limit is not None and got.limit.lifts_at.timestamp() == resets
    assert got.limit.kind == "five_hour" and got.refused_at_spawn


# --- every wording of issue 12, to (kind of outcome, limit kind, scope, lift) -----------------------
def detect(text: str, now: datetime = NOW) -> Any:
    return detect_limit(text, now=now, default_tz="UTC", unknown_reset=UNKNOWN, whole=True)


@pytest.mark.parametrize(
    ("text", "kind", "scope", "lifts_at", "just_reset"),
    [
        (
            "Usage limit reached · resets 5pm (UTC)",
            "unknown",
            "general",
            datetime(2026, 12, 1, 17, 0, tzinfo=UTC),
            False,
        ),
        (
            "Limit reached · resets 3pm (UTC) · /upgrade to Max 20x",
            "unknown",
            "general",
            datetime(2026, 12, 1, 15, 0, tzinfo=UTC),
            False,
        ),
        ("You've hit your monthly spend limit. /model to switch models.", "monthly", "general", None, False),
        (
            "You have reached your specified API usage limits. "
            "You will regain access on 2027-01-01 at 00:00 UTC.",
            "api_usage",
            "general",
            datetime(2027, 1, 1, 0, 0, tzinfo=UTC),
            False,
        ),
        # Weekly: the time only, 23.5 h ahead, is tomorrow's 6:46, never "just reset".
        (
            "You've hit your weekly limit · resets 6:46am (UTC)",
            "seven_day",
            "weekly",
            datetime(2026, 12, 2, 6, 46, tzinfo=UTC),
            False,
        ),
        (
            "You've hit your Fable 5 limit · resets 6:46am (UTC)",
            "seven_day_fable",
            "model:fable",
            datetime(2026, 12, 2, 6, 46, tzinfo=UTC),
            False,
        ),
        # No kind named and the time passed half an hour ago: one probe now.
        ("You've hit your limit · resets 6:46am (UTC)", "unknown", "general", NOW, True),
        (
            "You've hit your limit · resets 10:31am (UTC)",
            "unknown",
            "general",
            datetime(2026, 12, 1, 10, 31, tzinfo=UTC),
            False,
        ),
        (
            "You've hit your session limit · resets 10:43am (UTC)",
            "five_hour",
            "general",
            datetime(2026, 12, 1, 10, 43, tzinfo=UTC),
            False,
        ),
        (
            "You've hit your limit · resets Dec 4, 12pm (UTC)",
            "unknown",
            "general",
            datetime(2026, 12, 4, 12, 0, tzinfo=UTC),
            False,
        ),
        (
            "You've hit your weekly limit · resets Jan 10, 2027, 7:13am (Europe/Berlin)",
            "seven_day",
            "weekly",
            datetime(2027, 1, 10, 6, 13, tzinfo=UTC),
            False,
        ),
    ],
)
def test_every_limit_wording_the_real_cli_prints(
    text: str, kind: str, scope: str, lifts_at: datetime | None, just_reset: bool
) -> None:
    signal = detect(text)
    assert signal is not None, text
    assert (signal.kind, signal.scope, signal.just_reset) == (kind, scope, just_reset)
    if lifts_at is None:
        assert not signal.reset_known and signal.lifts_at == NOW + timedelta(seconds=UNKNOWN)
    else:
        assert signal.lifts_at == lifts_at


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("API Error: Server is temporarily limiting requests (not your usage limit) · Rate limited", 429),
        (
            "API Error: Request rejected (429) · This request would exceed the rate limit for your "
            "organization (0000) of 50 input tokens per minute.",
            429,
        ),
        ("Opus is experiencing high load, please use /model to switch to Sonnet", 429),
        (
            "API Error: 529 Overloaded. This is a server-side issue, usually temporary — "
            "try again in a moment.",
            529,
        ),
    ],
)
def test_throttles_the_real_cli_prints_are_transient_even_with_a_rejected_event(
    text: str, status: int, texts_release: str
) -> None:
    result = _result(text, is_error=True, status=status, release=texts_release)
    got = outcome(_stream(_event(status="rejected", isUsingOverage=False), result))
    assert got.kind == "transient", text
    assert detect(text) is None


def test_a_weekly_limit_never_reads_as_just_reset() -> None:
    at_0716 = datetime(2026, 12, 1, 7, 16, tzinfo=UTC)
    signal = detect("You've hit your weekly limit · resets 6:46am (UTC)", now=at_0716)
    assert signal is not None and not signal.just_reset
    assert (signal.lifts_at - at_0716).total_seconds() == 84_600


def test_a_model_limit_whose_type_names_no_model_takes_the_scope_its_message_names() -> None:
    resets = int((NOW + timedelta(days=3)).timestamp())
    event = _event(
        status="rejected", resetsAt=resets, rateLimitType="seven_day_overage_included", isUsingOverage=False
    )
    text = "You've hit your Fable 5 limit · resets Dec 4, 7:16am (UTC)"
    got = outcome(_stream(event, _result(text, is_error=True, status=429)))
    assert got.kind == "limit" and got.limit is not None
    assert got.limit.scope == "model:fable"
    assert got.limit.lifts_at.timestamp() == resets


def test_a_kindless_just_reset_refused_again_means_the_next_day() -> None:
    first = detect("You've hit your limit · resets 6:46am (UTC)")
    assert first is not None and first.just_reset
    again, refusals = reprobe_backoff(
        first, previous_stated=first.stated, previous_refusals=1, now=NOW, reprobe_min=300
    )
    assert again.lifts_at == datetime(2026, 12, 2, 6, 46, tzinfo=UTC) and not again.just_reset
    assert refusals == 2


def test_a_probe_refused_a_moment_early_is_clock_skew_retried_in_seconds() -> None:
    stated = NOW + timedelta(seconds=1)  # the host's clock runs a second ahead of the API's
    signal = LimitSignal(
        stated, "five_hour", "general", "m", stated=f"resetsAt={int(stated.timestamp())}", stated_at=stated
    )
    delays = []
    refusals = 1
    now = NOW
    for _ in range(6):
        moved, refusals = reprobe_backoff(
            signal, previous_stated=signal.stated, previous_refusals=refusals, now=now, reprobe_min=300
        )
        delays.append((moved.lifts_at - now).total_seconds())
    assert delays[:4] == [2.0, 4.0, 8.0, 16.0]
    assert delays[4:] == [300.0, 600.0]  # still refused: the stated time is really wrong


def test_a_refusal_long_after_the_stated_time_waits_reprobe_min() -> None:
    stated = NOW - timedelta(minutes=10)
    signal = LimitSignal(NOW, "five_hour", "general", "m", just_reset=True, stated="x", stated_at=stated)
    moved, _ = reprobe_backoff(signal, previous_stated="x", previous_refusals=1, now=NOW, reprobe_min=300)
    assert (moved.lifts_at - NOW).total_seconds() == 300


def _synthetic(text: str, error: str | None = None, release: str = OLDEST) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "assistant",
        "message": {"model": "<synthetic>", "role": "assistant", "content": [{"type": "text", "text": text}]},
        "session_id": "s-1",
    }
    if error:
        event["error"] = error
    if release != OLDEST:
        event["is_api_error_message"] = True
    return event


@pytest.mark.parametrize(
    ("text", "status", "error"),
    [
        ("Not logged in · Please run /login", None, "authentication_failed"),
        ("Failed to authenticate. API Error: 401 Invalid bearer token", 401, None),
        (
            "Your account does not have access to Claude. Please login again or contact your administrator.",
            403,
            None,
        ),
        ("OAuth token has been revoked. Please obtain a new token.", 403, None),
        ("Invalid API key · Fix external API key", None, None),
        ("Credit balance is too low", 400, None),
        ("This service is disabled for your org", 400, None),
        ("API Error: Unable to connect to API (ConnectionRefused)", None, None),
    ],
)
def test_host_wide_failures_the_real_cli_prints(
    text: str, status: int | None, error: str | None, texts_release: str
) -> None:
    result = _result(text, is_error=True, status=status, release=texts_release)
    got = outcome(_stream(_synthetic(text, error, texts_release), result))
    assert got.kind == "host", text


def test_a_resume_without_a_transcript_is_marked_for_a_fresh_session() -> None:
    result = {
        "type": "result",
        "subtype": "error_during_execution",
        "is_error": True,
        "num_turns": 0,
        "session_id": "0f0e5c0e-8a0b-4c9e-9d51-2f6f0c4c1a11",
        "total_cost_usd": 0,
    }
    stderr = "No conversation found with session ID: 0f0e5c0e-8a0b-4c9e-9d51-2f6f0c4c1a11\n"
    got = outcome(_stream(result), returncode=1, stderr=stderr)
    assert got.kind == "error" and got.resume_missing


def test_the_fable_limit_as_the_real_cli_prints_it() -> None:
    signal = detect("You've reached your Fable 5 limit. /model to switch models.")
    assert signal is not None and (signal.kind, signal.scope) == ("seven_day_fable", "model:fable")


@pytest.mark.parametrize(
    ("scope", "model", "pausing"),
    [
        ("model:fable", "claude-fable-5", "model:fable"),
        ("model:fable", None, "model:fable"),
        ("general", "claude-opus-4", "general"),
        # The message names a scope the kind's model never matches: close the kind's own model.
        ("model:opus", "claude-mythos-1", "model:claude-mythos-1"),
    ],
)
def test_a_limit_always_closes_a_scope_that_pauses_the_kind_that_hit_it(
    scope: str, model: str | None, pausing: str
) -> None:
    assert scope_pausing(scope, model) == pausing
    assert applies(pausing, model)


def _warning(used: float, resets: int) -> dict[str, Any]:
    return _event(
        status="allowed_warning",
        resetsAt=resets,
        rateLimitType="five_hour",
        utilization=used,
        isUsingOverage=False,
        surpassedThreshold=0.9,
    )


def test_the_reserve_closes_a_scope_whose_use_entered_the_kept_slice() -> None:
    resets = int((NOW + timedelta(hours=2)).timestamp())
    ((signal, used),) = reserve_signals([_warning(0.95, resets)], reserve=0.1, now=NOW)
    assert (signal.kind, signal.scope, signal.lifts_at.timestamp(), used) == (
        "reserved",
        "general",
        resets,
        0.95,
    )
    assert reserve_signals([_warning(0.85, resets)], reserve=0.1, now=NOW) == []
    assert reserve_signals([_warning(0.95, resets)], reserve=0.0, now=NOW) == []  # off by default
    assert reserve_signals([_event(status="allowed", resetsAt=resets)], reserve=0.5, now=NOW) == []


def test_a_probe_that_took_seconds_to_report_its_refusal_is_still_clock_skew() -> None:
    # The probe asked the API a moment after the stated reset; the session took 20 s to say so.
    stated = NOW
    signal = LimitSignal(
        stated, "five_hour", "general", "m", stated=f"resetsAt={int(stated.timestamp())}", stated_at=stated
    )
    reported = NOW + timedelta(seconds=20)
    kwargs: dict[str, Any] = {"previous_stated": signal.stated, "previous_refusals": 1, "reprobe_min": 300}
    moved, _ = reprobe_backoff(signal, now=reported, asked_at=NOW + timedelta(seconds=1), **kwargs)
    assert (moved.lifts_at - reported).total_seconds() == 2.0
    # Without the probe's start the 20 s read as a wrong statement: DISPATCHQ_REPROBE_MIN.
    moved, _ = reprobe_backoff(signal, now=reported, **kwargs)
    assert (moved.lifts_at - reported).total_seconds() == 300.0


def test_fables_monthly_spend_limit_as_the_real_cli_prints_it_pauses_fable_only() -> None:
    # Claude Code 2.1.197 on a Fable session: 429, claim seven_day_overage_included,
    # overage-disabled-reason org_spend_cap_reached (its event says org_level_disabled_until).
    resets = int((NOW + timedelta(days=20)).timestamp())
    event = _event(
        status="rejected",
        resetsAt=resets,
        rateLimitType="seven_day_overage_included",
        overageStatus="rejected",
        overageDisabledReason="org_level_disabled_until",
        isUsingOverage=False,
    )
    text = "You've hit your monthly spend limit. /model to switch models."
    got = outcome(_stream(event, _result(text, is_error=True, status=429)))
    assert got.kind == "limit" and got.limit is not None
    assert (got.limit.scope, got.limit.lifts_at.timestamp()) == ("model:fable", resets)
    assert scope_pausing(got.limit.scope, "claude-fable-5") == "model:fable"
    assert not applies(got.limit.scope, "claude-sonnet-4-5")


def test_the_orgs_monthly_spend_limit_on_the_general_window_pauses_everything() -> None:
    resets = int((NOW + timedelta(days=20)).timestamp())
    event = _event(status="rejected", resetsAt=resets, rateLimitType="five_hour", isUsingOverage=False)
    text = (
        "You've hit your org's monthly spend limit · ask your admin to raise it at claude.ai/settings/usage"
    )
    got = outcome(_stream(event, _result(text, is_error=True, status=429)))
    assert got.kind == "limit" and got.limit is not None and got.limit.scope == "general"


@pytest.mark.parametrize(
    "text",
    [
        # An API key's 400, as the real CLI prefixes it.
        "API Error: 400 You have reached your specified API usage limits. "
        "You will regain access on 2027-01-01 at 00:00 UTC.",
    ],
)
def test_the_api_usage_limit_as_the_real_cli_prints_it(text: str, texts_release: str) -> None:
    result = _result(text, is_error=True, status=400, release=texts_release)
    got = outcome(_stream(_synthetic(text, "unknown", texts_release), result))
    assert got.kind == "limit" and got.limit is not None
    assert (got.limit.kind, got.limit.lifts_at) == ("api_usage", datetime(2027, 1, 1, tzinfo=UTC))


def test_each_skew_retry_may_start_a_window_late_but_a_wrong_time_still_waits_reprobe_min() -> None:
    stated = NOW
    signal = LimitSignal(stated, "five_hour", "general", "m", stated="resetsAt=1", stated_at=stated)
    kwargs: dict[str, Any] = {"previous_stated": signal.stated, "reprobe_min": 300}
    # The second skew retry started 25 s after the stated instant (two slow start-ups): still skew.
    asked = NOW + timedelta(seconds=25)
    moved, _ = reprobe_backoff(signal, now=asked, asked_at=asked, previous_refusals=2, **kwargs)
    assert (moved.lifts_at - asked).total_seconds() == 4.0
    # A first re-refusal 25 s after the stated instant is no moment: the stated time is wrong.
    moved, _ = reprobe_backoff(signal, now=asked, asked_at=asked, previous_refusals=1, **kwargs)
    assert (moved.lifts_at - asked).total_seconds() == 300.0
