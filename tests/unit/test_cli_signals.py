"""Claude Code 2.1.332's machine signals, read first: recorded stream lines, classified.

Two kinds of recording. DRIVEN lines are what the real 2.1.332 printed against
`dispatchq.testing.anthropic` (`tests/integration/test_claude_signals.py` drives the same forms
through a session worker). NOT DRIVEN lines are built from the 2.1.332 binary's own schemas
(`startup_failure_reason`, `credential_expires_at`): the stand-in cannot make the CLI print
them (they need a sandbox policy, an older-than-required CLI pin by the organisation, a
background session holding the conversation, a stored claude.ai login). Each test says which.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dispatchq.core.status import Status
from dispatchq.window.limits import SessionOutcome, read_outcome, reprobe_backoff
from dispatchq.window.messages import ORG_PAUSED_SCOPE, PERSON_HOLD
from dispatchq.window.signals import usage_reports
from dispatchq.window.usage import credential_rows, usage_lines, usage_rows

NOW = datetime(2026, 12, 2, 0, 30, tzinfo=UTC)
T = int(NOW.timestamp())
SID = "2ed09427-82a1-42b3-a0e8-5ba94993f918"


def lines(*events: dict[str, Any]) -> str:
    return "\n".join(json.dumps(e) for e in events) + "\n"


def init() -> dict[str, Any]:
    return {"type": "system", "subtype": "init", "session_id": SID, "model": "claude-sonnet-4-5"}


def event(**info: Any) -> dict[str, Any]:
    return {"type": "rate_limit_event", "rate_limit_info": info, "uuid": "u", "session_id": SID}


def refused_turn(
    text: str, info: dict[str, Any] | None, api_error: str | None = "usage_limit_reached"
) -> dict:
    return {
        "type": "assistant",
        "message": {"model": "<synthetic>", "role": "assistant", "content": [{"type": "text", "text": text}]},
        "session_id": SID,
        "error": "rate_limit",
        "api_error": api_error,
        "api_error_params": {"rate_limit_info": info} if info is not None else None,
        "is_api_error_message": True,
    }


def result(text: str | None, **fields: Any) -> dict[str, Any]:
    base = {
        "type": "result",
        "subtype": "success",
        "is_error": True,
        "api_error_status": 429,
        "num_turns": 1,
        "total_cost_usd": 0,
        "result": text,
        "session_id": SID,
        "terminal_reason": "api_error",
        "api_error_type": "rate_limit_error",
        "api_error": "usage_limit_reached",
    }
    return {**base, **fields}


def read(stdout: str, now: datetime = NOW) -> SessionOutcome:
    return read_outcome(stdout, now=now, default_tz="UTC", unknown_reset=600, returncode=1)


# --- DRIVEN: recorded from 2.1.332 against the stand-in ---------------------------------------
def test_driven_a_past_reset_has_no_rate_limit_event_only_the_refused_turns_record() -> None:
    """2.1.332 prints no rate_limit_event when the stated reset is already past (the skew case):
    the refused turn's `api_error_params.rate_limit_info` is then the only exact instant."""
    info = {"status": "rejected", "resetsAt": T - 2, "rateLimitType": "five_hour", "isUsingOverage": False}
    text = "You've hit your 5-hour limit · resets 12:29am (UTC)"
    out = read(lines(init(), refused_turn(text, info), result(text)))
    assert out.kind == "limit" and out.limit is not None
    assert out.limit.source == "event" and out.limit.stated == f"resetsAt={T - 2}"
    assert out.limit.kind == "five_hour" and out.limit.just_reset
    assert out.limit.message == "You've hit your 5-hour limit · resets 12:29am (UTC)"


def test_driven_the_event_and_the_turns_record_are_one_signal() -> None:
    info = {"status": "rejected", "resetsAt": T + 3600, "rateLimitType": "five_hour", "isUsingOverage": False}
    text = "You've hit your 5-hour limit · resets 1:30am (UTC)"
    out = read(lines(init(), event(**info), refused_turn(text, info), result(text)))
    assert out.kind == "limit" and len(out.limits) == 1
    assert out.limit is not None and out.limit.lifts_at.timestamp() == T + 3600


@pytest.mark.parametrize(
    ("info", "text", "scope", "kind"),
    [
        (
            {"status": "rejected", "resetsAt": T + 3600, "overageStatus": "rejected", "dailyCapPaused": True},
            "Usage is paused for your organization. For help, please contact support.",
            ORG_PAUSED_SCOPE,
            "org_paused",
        ),
        (
            {
                "status": "rejected",
                "resetsAt": T + 3600,
                "overageDisabledReason": "org_level_disabled_until",
                "limitScope": "group_pool",
            },
            "You've hit your team's pooled group budget · ask your admin to raise it at "
            "https://claude.ai/admin-settings/usage",
            "spend:group_pool",
            "group_pool",
        ),
        (
            {
                "status": "rejected",
                "resetsAt": T + 3600,
                "overageDisabledReason": "org_level_disabled_until",
                "limitScope": "channel",
            },
            "You've hit your channel's monthly spend limit · an org owner or channel manager can raise it "
            "in the channel's Claude settings",
            "spend:channel",
            "channel",
        ),
        (
            {
                "status": "rejected",
                "resetsAt": T + 3600,
                "overageDisabledReason": "org_level_disabled_until",
                "memberSpendLimit": {"period": "monthly"},
            },
            "You've hit your individual spend limit · ask your admin to raise it at "
            "https://claude.ai/admin-settings/usage",
            "spend:member",
            "member_spend",
        ),
    ],
    ids=["org-paused", "group-pool", "channel", "individual"],
)
def test_driven_a_spend_cap_with_no_stated_turn_waits_for_a_person(
    info: dict[str, Any], text: str, scope: str, kind: str
) -> None:
    """The unified `resetsAt` beside a spend cap is the plan window's, not the cap's: no lift is stated."""
    full = {**info, "overageStatus": "rejected", "isUsingOverage": False}
    out = read(lines(init(), event(**full), refused_turn(text, full), result(text)))
    assert out.kind == "limit" and out.limit is not None
    assert (out.limit.scope, out.limit.kind) == (scope, kind)
    assert out.limit.lifts_at == NOW + PERSON_HOLD
    assert not out.limit.reset_known
    assert "until a person clears it" in out.limit.message
    assert out.limit.message.startswith(text[:30])  # the words, with what lifts it


def test_driven_a_pooled_budget_lifts_when_the_signal_says() -> None:
    cap = T + 5 * 86400
    info = {
        "status": "rejected",
        "resetsAt": T + 3600,
        "overageStatus": "rejected",
        "overageResetsAt": cap,
        "overageDisabledReason": "org_level_disabled_until",
        "limitScope": "group_pool",
        "isUsingOverage": False,
    }
    text = (
        "You've hit your team's pooled group budget · resets Dec 7, 12:30am (UTC) · ask your admin to "
        "raise it at https://claude.ai/admin-settings/usage"
    )
    out = read(lines(init(), event(**info), refused_turn(text, info), result(text)))
    assert out.limit is not None and out.limit.scope == "spend:group_pool"
    assert out.limit.lifts_at.timestamp() == cap
    assert "pooled group budget" in out.limit.message


def test_driven_the_texts_alone_name_the_same_scopes() -> None:
    """2.1.197 has no such fields: the words decide (and any future form without them)."""
    for text, scope in [
        ("Usage is paused for your organization. For help, please contact support.", ORG_PAUSED_SCOPE),
        ("You've hit your team's pooled group budget. It resets Dec 9.", "spend:group_pool"),
        ("You've hit your channel's monthly usage limit · an org owner can raise it", "spend:channel"),
        ("You've hit your individual usage limit · ask your admin", "spend:member"),
        ("Opus 4.5 requires usage credits. /usage-credits to turn them on", "model:opus"),
        ("Mythos requires usage credits.", "model:mythos"),
    ]:
        out = read(lines(init(), refused_turn(text, None, None), result(text, api_error=None)))
        assert out.kind == "limit", text
        assert out.limit is not None and out.limit.scope == scope, text
    dated = read(lines(init(), result("You've hit your team's pooled group budget. It resets Dec 9.")))
    assert dated.limit is not None and dated.limit.lifts_at == datetime(2026, 12, 9, tzinfo=UTC)


def test_driven_out_of_usage_credits_lifts_at_the_stated_reset() -> None:
    info = {
        "status": "rejected",
        "resetsAt": T + 3600,
        "overageStatus": "rejected",
        "overageDisabledReason": "out_of_credits",
        "isUsingOverage": False,
    }
    text = "You're out of usage credits · resets 1:30am (UTC)"
    out = read(lines(init(), event(**info), refused_turn(text, info), result(text)))
    assert (
        out.limit is not None and out.limit.kind == "credits" and out.limit.lifts_at.timestamp() == T + 3600
    )


def test_driven_the_servers_own_throttle_stays_a_throttle_despite_its_rejected_event() -> None:
    info = {"status": "rejected", "resetsAt": T + 3600, "isUsingOverage": False}
    text = "API Error: Server is temporarily limiting requests (not your usage limit) · x"
    out = read(lines(init(), event(**info), refused_turn(text, None, None), result(text, api_error=None)))
    assert out.kind == "transient"


def test_driven_each_windows_use_is_reported_for_people() -> None:
    windows = {
        "five_hour": {"utilization": 0.42, "resetsAt": T + 3600},
        "seven_day": {"utilization": 0.13, "resetsAt": T + 3 * 86400},
    }
    out = read(
        lines(
            init(),
            event(status="allowed", isUsingOverage=False, unifiedWindows=windows),
            event(
                status="allowed_warning",
                resetsAt=T + 3600,
                rateLimitType="five_hour",
                utilization=0.92,
                surpassedThreshold=0.9,
                unifiedWindows={"five_hour": {"utilization": 0.92, "resetsAt": T + 3600}},
            ),
            {
                **result("hi", is_error=False, api_error_status=None, api_error=None),
                "terminal_reason": "completed",
            },
        )
    )
    assert out.kind == "answer"
    by_window = {r.window: r for r in out.usage}
    assert by_window["five_hour"].utilization == 0.92  # the later report wins
    assert by_window["seven_day"].utilization == 0.13
    assert by_window["seven_day"].resets_at == T + 3 * 86400


def test_driven_a_197_warning_event_is_reported_too() -> None:
    warn = event(status="allowed_warning", resetsAt=T + 3600, rateLimitType="five_hour", utilization=0.92)
    assert [(r.window, r.utilization) for r in usage_reports([warn])] == [("five_hour", 0.92)]
    assert usage_reports([event(status="allowed", overageResetsAt=T + 9)]) == []


def test_driven_a_broken_global_config_blocks_the_host_with_its_reason() -> None:
    refused = {
        "type": "result",
        "subtype": "error_during_execution",
        "is_error": True,
        "num_turns": 0,
        "result": None,
        "session_id": SID,
        "startup_failure_reason": "config_file_invalid",
        "invalid_config_file": {"path": "/h/.claude.json", "is_global": True, "backup_searched": True},
        "errors": ["Configuration error in /h/.claude.json: JSON Parse error: Expected '}'\nNo backup."],
    }
    out = read(lines(refused))
    assert out.kind == "host" and out.startup_failure == "config_file_invalid"
    assert out.text == (
        "Claude Code refused to start (config_file_invalid): "
        "Configuration error in /h/.claude.json: JSON Parse error: Expected '}'"
    )
    project = {**refused, "invalid_config_file": {"path": "/w/.claude/settings.json", "is_global": False}}
    assert read(lines(project)).kind == "error"  # the checkout's own file: that judgement's


@pytest.mark.parametrize(
    "text",
    [
        "Login expired · Please run /login",
        "Login reached its time limit · Please run /login",
        "Invalid auth token · Fix external auth token",
        "Failed to authenticate: this login reached its time limit and cannot be renewed.",
        "Authentication required · Sign in again to continue",
    ],
)
def test_the_new_sign_in_failures_block_the_host(text: str) -> None:
    out = read(lines(init(), result(text, api_error_status=None, api_error=None, api_error_type=None)))
    assert out.kind == "host", text


def test_an_auth_api_error_blocks_the_host_whatever_the_words() -> None:
    turn = {**refused_turn("Something new went wrong", None, "org_disabled_credential"), "error": "unknown"}
    out = read(
        lines(
            init(),
            turn,
            result("Something new went wrong", api_error_status=None, api_error=None, api_error_type=None),
        )
    )
    assert out.kind == "host"


def test_an_overloaded_api_error_type_is_a_throttle() -> None:
    out = read(
        lines(
            init(),
            result(
                "API Error: something",
                api_error_status=None,
                api_error=None,
                api_error_type="overloaded_error",
            ),
        )
    )
    assert out.kind == "transient"


# --- NOT DRIVEN: recorded from the binary's schemas, not printed by a run here ----------------
def startup_refusal(reason: str) -> str:
    return lines(
        {
            "type": "result",
            "subtype": "error_during_execution",
            "is_error": True,
            "num_turns": 0,
            "total_cost_usd": 0,
            "result": None,
            "session_id": SID,
            "startup_failure_reason": reason,
            "errors": [f"refused: {reason}"],
        }
    )


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("sandbox_required_unavailable", "host"),  # NOT DRIVEN: needs a required-sandbox policy
        ("cli_version_too_old", "host"),  # NOT DRIVEN: needs an organisation's minimum version
        ("session_held_by_background", "transient"),  # NOT DRIVEN: needs a background session
        ("cwd_unavailable", "error"),  # the judgement's checkout: its own
        ("a_reason_newer_than_this_list", "host"),  # refuses every start here until known
    ],
)
def test_not_driven_startup_failures_go_where_their_reason_says(reason: str, kind: str) -> None:
    out = read(startup_refusal(reason))
    assert out.kind == kind
    assert out.text == f"Claude Code refused to start ({reason}): refused: {reason}"


def test_not_driven_a_stored_logins_end_is_a_warning_within_a_week() -> None:
    """NOT DRIVEN: `credential_expires_at` is only written for a stored claude.ai login."""
    soon = (NOW + timedelta(days=3)).isoformat().replace("+00:00", "Z")
    answer = {
        **result("hi", is_error=False, api_error_status=None, api_error=None),
        "credential_expires_at": soon,
    }
    out = read(lines(init(), answer))
    assert out.kind == "answer" and out.credential_expires_at == NOW + timedelta(days=3)
    now = NOW.timestamp()
    rows = credential_rows({"h1": {"expires_at": now + 3 * 86400, "reported_at": now}}, now)
    assert rows[0].warning is not None and "h1" in rows[0].warning and "3.0 days" in rows[0].warning
    later = credential_rows({"h1": {"expires_at": now + 30 * 86400, "reported_at": now}}, now)
    assert later[0].warning is None
    assert usage_lines(Status.model_validate({"credentials": rows}))[0].startswith(
        "WARNING: the stored Claude login on host h1"
    )
    no_login = read(lines(init(), {**answer, "credential_expires_at": None}))
    assert no_login.credential_expires_at is None  # a token from the environment: none reported


def test_usage_rows_carry_their_age() -> None:
    now = NOW.timestamp()
    rows = usage_rows(
        {"five_hour": {"utilization": 0.42, "resets_at": now + 60, "reported_at": now - 90, "session": SID}},
        now,
    )
    assert rows[0].age_seconds == 90 and rows[0].utilization == 0.42
    resets = rows[0].resets_at
    assert usage_lines(Status.model_validate({"window_usage": rows})) == [
        f"window usage [five_hour]: 42% used, resets {resets} (reported 90s ago by session {SID})"
    ]


# --- the skew fix, on the recorded 2.1.332 forms -----------------------------------------------
def test_a_probe_refused_just_after_the_stated_reset_is_skew_on_the_332_record() -> None:
    info = {"status": "rejected", "resetsAt": T, "isUsingOverage": False}  # no rateLimitType: unknown kind
    text = "You've hit your limit · resets 12:30am (UTC)"
    out = read(lines(init(), refused_turn(text, info), result(text)), now=NOW + timedelta(seconds=2))
    assert out.limit is not None and out.limit.kind == "unknown"
    moved, refusals = reprobe_backoff(
        out.limit,
        previous_stated=out.limit.stated,
        previous_refusals=1,
        now=NOW + timedelta(seconds=3),
        reprobe_min=300,
        asked_at=NOW + timedelta(seconds=1),
    )
    assert refusals == 2
    assert moved.lifts_at - (NOW + timedelta(seconds=3)) == timedelta(seconds=2)  # seconds, never tomorrow


def test_an_empty_member_spend_limit_names_no_cap_so_fables_cap_stays_fables() -> None:
    """Recorded from 2.1.332 (a Fable session, `seven_day_overage_included`): `memberSpendLimit`
    is `{}` on every rejection; read as the person's own cap it paused every model."""
    from dispatchq.window.signals import spend_limit

    info = {
        "status": "rejected",
        "resetsAt": 1797905280,
        "rateLimitType": "seven_day_overage_included",
        "overageStatus": "rejected",
        "overageDisabledReason": "org_level_disabled_until",
        "memberSpendLimit": {},
        "isUsingOverage": False,
    }
    assert spend_limit(info) is None
    assert spend_limit({**info, "memberSpendLimit": {"used": 50, "limit": 50}}) is not None
