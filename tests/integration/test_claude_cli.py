"""The session tier against the real Claude Code CLI (each supported release, from npm) and a stand-in API.

`tests/support/fake_claude.py` prints what we believe Claude Code prints; here the real CLI
(`@anthropic-ai/claude-code`, each release of `dispatchq.launcher.releases.RELEASES`, installed
by `python3 ops/dev.py test` under `.cache/claude-code/<version>/`) is the session command,
exactly as a user configures it, and `dispatchq/testing/anthropic.py` answers its API calls
on 127.0.0.1. What the CLI then prints (events, result text, stderr) is the CLI's own, so
what is asserted is how dispatchq reads the real thing: one spawn for a limit hit and none
until the lift, no marker for a throttle, a paid answer kept.

Every case runs on every release (the `real` fixture's parameter, ids `cc2.1.197`, ...), but
for the ones that check a wording only the oldest prints (`@oldest_only`). Where npm cannot be
had a release's cases are skipped with the reason; under `CI=true` the module fails instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dispatchq.client import Client
from dispatchq.launcher.releases import OLDEST
from dispatchq.pools.credentials import qualify
from dispatchq.pools.spend import spend_periods
from dispatchq.testing.anthropic import Reply, Seen
from dispatchq.window.limits import GENERAL_SCOPE, WEEKLY_SCOPE
from tests.support.ci import require_bwrap
from tests.support.pool_config import secret_file, write_pool
from tests.support.real_client import (
    RealHarness,
    path_without_bwrap,
    refuse_a_missing_cli_under_ci,
    release_params,
)
from tests.support.session import iso_epoch

refuse_a_missing_cli_under_ci()


#: For a case that checks a wording only the oldest release prints (the newest prints another
#: form, read by its own case): it runs on the oldest only.
oldest_only = pytest.mark.parametrize("release", release_params((OLDEST,)))


def newest_gap(real: RealHarness, why: str, *, strict: bool = True) -> None:
    """A case dispatchq does not yet pass on a newer release, for a reason another file owns.

    An expected failure rather than a skip: it still runs (under `CI=true` too), and a strict
    one fails loudly the day the gap is closed, so the mark is taken off. `why` names it.
    """
    if real.version != OLDEST:
        real.node.add_marker(pytest.mark.xfail(reason=f"Claude Code {real.version}: {why}", strict=strict))


def run_jsonl(real: RealHarness, lines: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    source = real.tmp / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    return real.cli("run", str(source), "--json", **env)


# --- an answer ------------------------------------------------------------------------------------
def test_the_real_cli_answers_through_a_session_worker(real: RealHarness) -> None:
    real.api.answer("forty-two")
    jid = real.enqueue("ask", "the question")
    done = real.cli("worker", "session", "--burst")
    assert done.returncode == 0, done.stdout + done.stderr
    record = real.record(jid)
    assert record.status == "answered", (record.reason, done.stderr[-2000:])
    assert record.value == "forty-two"
    assert real.spawns() == 1
    real.figure("answer", 1, spawns=1)
    assert len(real.api.message_requests) == 1
    sent = real.api.message_requests[0]
    assert sent.headers.get("authorization") == "Bearer stand-in-token"
    assert "the question" in str(sent.body)


def test_with_bwrap_usable_sessions_get_the_subprocess_scrub_and_still_answer(real: RealHarness) -> None:
    require_bwrap()
    real.api.answer("scrubbed")
    jid = real.enqueue("ask", "q")
    done = real.cli("worker", "session", "--burst", DISPATCHQ_SESSION_SUBPROCESS_SCRUB="on")
    assert done.returncode == 0, done.stderr
    assert real.record(jid).status == "answered"
    assert "subprocess scrubbing is off" not in done.stderr


def test_without_bwrap_auto_warns_once_and_the_session_still_answers(real: RealHarness) -> None:
    real.api.answer("unscrubbed")
    path = path_without_bwrap(real.tmp, real.env.get("PATH", os.defpath))
    jid = real.enqueue("ask", "q")
    # Unconfined: a confined session on a host without bwrap never starts (test_sandbox.py).
    done = real.cli("worker", "session", "--burst", PATH=path, DISPATCHQ_SESSION_SANDBOX="off")
    assert done.returncode == 0, done.stderr
    assert real.record(jid).status == "answered", real.record(jid).reason
    assert done.stderr.count("subprocess scrubbing is off: bwrap not found on PATH") == 1


def test_without_bwrap_on_refuses_to_start_the_worker_with_the_hint(real: RealHarness) -> None:
    path = path_without_bwrap(real.tmp, real.env.get("PATH", os.defpath))
    jid = real.enqueue("ask", "q")
    done = real.cli("worker", "session", "--burst", PATH=path, DISPATCHQ_SESSION_SUBPROCESS_SCRUB="on")
    assert done.returncode == 2, done.stderr
    assert "apt-get install -y bubblewrap" in done.stderr
    assert real.spawns() == 0
    assert real.record(jid).status == "queued"


# --- a usage limit: one spawn, none while closed, the lift within seconds -------------------------
def test_a_real_usage_limit_costs_one_spawn_then_none_until_the_lift(real: RealHarness) -> None:
    resets = int(time.time()) + 8
    real.api.push(Reply.limit(resets_at=resets, claim="five_hour"))  # the first request only
    real.api.answer("after the lift")
    ids = [real.enqueue("ask", f"q{i}") for i in range(2)]
    real.workers(1)
    real.wait(lambda: real.marker() is not None, "the marker to go up", timeout=60)
    marker = real.marker()
    assert marker is not None
    assert marker.stated == f"resetsAt={resets}"  # the instant the CLI reported
    assert marker.lifts_at >= resets  # (a loaded host may spawn after it: then it lifts at once)
    assert marker.kind == "five_hour"
    assert ("session limit" if real.version == OLDEST else "5-hour limit") in marker.message  # its own words
    real.wait(
        lambda: real.all_status(ids, "waiting") or time.time() >= resets,
        "every judgement to wait behind the marker",
        timeout=60,
    )
    # Closed: the worker looks at the line and spawns nothing (checked while it is still closed).
    closed = real.spawns()
    assert closed == 1
    if time.time() < resets - 2:
        assert real.spawns_stay(1, period=1.5) == 1
    real.wait(lambda: real.all_status(ids, "answered"), "the lift, one probe, then the drain", timeout=60)
    assert real.spawns() == 3
    assert len(real.api.message_requests) == 3
    real.figure("usage limit (five_hour)", 2, until_lift=closed, while_closed=0, total=real.spawns())
    assert real.marker(GENERAL_SCOPE) is None
    for jid in ids:
        assert real.record(jid).attempts == 0


# --- a transient throttle: no marker --------------------------------------------------------------
def test_a_real_transient_429_puts_up_no_marker(real: RealHarness) -> None:
    # 2.1.332 retries a subscriber's transient 429 once itself (CLAUDE_CODE_MAX_RETRIES=1): two
    # throttles in a row reach dispatchq there, one on 2.1.197.
    throttles = 1 if real.version == OLDEST else 2
    real.api.push(*[Reply.error(429, "rate_limit_error", "Rate limited")] * throttles)
    real.api.answer("after the throttle")
    jid = real.enqueue("ask", "q")
    real.workers(1)
    real.wait(lambda: real.all_status([jid], "answered"), "the retry after the back-off", timeout=60)
    assert real.marker() is None
    assert not [a for a in real.audit() if a["action"] == "closed"]
    assert real.spawns() == 2
    real.figure("transient 429 (not your usage limit)", 1, total=2)


# --- an overage-billed answer is an answer --------------------------------------------------------
def test_a_real_answer_billed_as_extra_usage_is_kept(real: RealHarness) -> None:
    resets = int(time.time()) + 7200
    real.api.answer(
        "paid for",
        **{
            "anthropic-ratelimit-unified-status": "rejected",
            "anthropic-ratelimit-unified-overage-status": "allowed",
            "anthropic-ratelimit-unified-reset": str(resets),
            "anthropic-ratelimit-unified-representative-claim": "five_hour",
        },
    )
    jid = real.enqueue("ask", "q")
    done = real.cli("worker", "session", "--burst")
    assert done.returncode == 0, done.stderr
    record = real.record(jid)
    assert record.status == "answered", record.reason
    assert record.value == "paid for"
    assert real.spawns() == 1
    real.figure("answer billed as extra usage", 1, total=1)


# --- the reason is the error line; the whole stderr is in the session log -------------------------
def test_a_cli_that_refuses_to_start_shows_its_error_line_and_logs_the_rest(real: RealHarness) -> None:
    require_bwrap()
    # Scrubbing is on (bwrap works for the worker) but the session's own PATH has no bwrap: the
    # real CLI exits 1 with ~5 KB of minified source, the message, stack frames and its banner.
    real.env["DISPATCHQ_SESSION_COMMAND"] = f"/usr/bin/env PATH=/nonexistent {real.command}"
    real.env["DISPATCHQ_SESSION_SANDBOX_BIND"] = str(real.claude.parents[1])  # env, not claude, is argv[0]
    jid = real.enqueue("ask", "q")
    done = real.cli("worker", "session", "--burst", DISPATCHQ_SESSION_SUBPROCESS_SCRUB="on")
    assert done.returncode == 0, done.stderr
    record = real.record(jid)
    assert record.reason is not None
    # 2.1.197 prints `error: bubblewrap is required ...` amid its minified source and stack;
    # 2.1.332 prints `Claude Code could not start: bubblewrap is required ...`, one line.
    assert "bubblewrap is required for subprocess env scrubbing" in record.reason, record.reason
    assert " at " not in record.reason.split("isolation", 1)[0][-40:]
    assert "Bun v" not in record.reason and "$bunfs" not in record.reason and "|" not in record.reason
    shown = json.loads(real.cli("result", jid, "--json").stdout)
    log = Path(shown["session_log"])
    text = log.read_text()
    assert "bubblewrap is required" in text
    if real.version == OLDEST:
        assert "error: bubblewrap is required" in record.reason
        assert "$bunfs" in text and "Bun v" in text and len(text) > 3000


# --- host-wide failures: one spawn, then none until cleared ---------------------------------------
@pytest.mark.parametrize(
    ("setup", "why"),
    [
        pytest.param(
            {"reply": Reply.error(401, "authentication_error", "Invalid bearer token")}, "401", id="401"
        ),
        pytest.param(
            {"reply": Reply.error(403, "permission_error", "OAuth token has been revoked.")},
            "does not have access",  # 2.1.332: "Failed to authenticate: OAuth token revoked. ..."
            id="revoked",
        ),
        pytest.param(
            {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}, "Unable to connect to API", id="no-network"
        ),
    ],
)
def test_a_host_wide_failure_blocks_the_host_after_one_spawn(
    real: RealHarness, setup: dict[str, Any], why: str
) -> None:
    if real.version != OLDEST and why == "does not have access":
        why = "OAuth token revoked"  # its own words for the same 403
    if real.version != OLDEST and "ANTHROPIC_BASE_URL" in setup:
        why = "Connection dropped (ECONNRESET)"  # its own words: the egress proxy resets an unreachable API
    setup = dict(setup)
    reply = setup.pop("reply", None)
    if reply is not None:
        real.api.default = reply
    real.env.update(setup)
    ids = [real.enqueue("ask", f"q{i}") for i in range(2)]
    real.workers(1)
    real.wait(lambda: real.all_status(ids, "waiting"), "the host block to hold every judgement", timeout=60)
    assert real.spawns_stay(1, period=2.0) == 1
    blocked_after = real.spawns()
    blocked = real.status()["sessions"]["blocked"]
    assert why in blocked[real.rt.settings.host], blocked
    assert real.marker() is None
    for jid in ids:
        record = real.record(jid)
        assert record.attempts == 0 and why in (record.reason or ""), record.reason

    # The host is fixed: a new credential clears the block by itself; otherwise the operator does.
    real.api.answer("fixed")
    if reply is None:
        real.stop(real.procs[-1][0])
        real.env.update({"CLAUDE_CODE_OAUTH_TOKEN": "stand-in-token", "ANTHROPIC_BASE_URL": real.api.url})
    if "CLAUDE_CODE_OAUTH_TOKEN" not in setup:
        done = real.cli("window", "open", "--host")
        assert done.returncode == 0 and "unblocked" in done.stdout, done.stdout + done.stderr
    if reply is None:
        real.workers(1)
    real.wait(lambda: real.all_status(ids, "answered"), "the drain after the host is cleared", timeout=60)
    assert real.spawns() == 3
    real.figure(f"host-wide: {why}", 2, until_cleared=blocked_after, total=real.spawns())


def test_a_blocked_host_probes_once_per_interval_and_clears_itself(real: RealHarness) -> None:
    real.api.default = Reply.error(401, "authentication_error", "Invalid bearer token")
    ids = [real.enqueue("ask", f"q{i}") for i in range(2)]
    real.workers(1, DISPATCHQ_HOST_PROBE_INTERVAL="3")
    real.wait(lambda: real.all_status(ids, "waiting"), "the host block", timeout=60)
    real.wait(lambda: real.spawns() >= 2, "the periodic probe", timeout=30)
    real.api.answer("credential renewed upstream")
    real.wait(
        lambda: real.all_status(ids, "answered"), "a probe to clear the block and the drain", timeout=60
    )
    assert real.status()["sessions"]["blocked"] == {}
    assert real.spawns() <= 5


# --- resume with no transcript: a fresh session ---------------------------------------------------
def test_a_resume_without_a_transcript_falls_back_to_a_fresh_session(real: RealHarness) -> None:
    real.api.answer("fresh")
    jid = real.enqueue("ask", "q")
    real.rt.storage.records.set_fields(jid, resume_session="0f0e5c0e-8a0b-4c9e-9d51-2f6f0c4c1a11")
    done = real.cli("worker", "session", "--burst")
    assert done.returncode == 0, done.stderr
    record = real.record(jid)
    assert record.status == "answered", record.reason
    assert record.attempts == 0
    assert any("starting a fresh session" in step.why for step in record.trail)
    assert real.spawns() == 2
    real.figure("resume with no transcript", 1, total=2)


# --- a model's own weekly limit: no spawn loop ----------------------------------------------------
FABLE_KIND = """
  fable:
    session:
      prompt: "Answer {{ target }}"
      model: claude-fable-5
"""


def test_a_models_own_limit_costs_one_spawn_and_the_burst_worker_exits(real: RealHarness) -> None:
    config = real.tmp / "dispatchq.yaml"
    config.write_text(config.read_text() + FABLE_KIND)
    resets = int(time.time()) + 3 * 86400
    real.api.push(Reply.limit(resets_at=resets, claim="seven_day_overage_included"))
    real.api.answer("sonnet still answers")
    fables = [real.enqueue("fable", f"f{i}") for i in range(2)]
    other = real.enqueue("sonnet", "s")
    done = real.cli("worker", "session", "--burst")  # exits by itself: no spawn loop
    assert done.returncode == 0, done.stderr
    assert real.spawns() == 2
    marker = real.marker("model:fable")
    assert marker is not None and marker.closed() and marker.lifts_at == resets
    assert real.marker() is None  # the general window stays open
    assert real.all_status(fables, "waiting")
    assert real.record(other).status == "answered"
    real.figure("model's own weekly limit (Fable)", 2, until_lift=real.spawns() - 1, while_closed=0)


# --- the reserve: the end of the window kept for people -------------------------------------------
def test_the_reserve_keeps_the_last_slice_of_the_window_for_people(real: RealHarness) -> None:
    resets = int(time.time()) + 7200
    real.api.answer(
        "answered near the end",
        **{
            "anthropic-ratelimit-unified-status": "allowed_warning",
            "anthropic-ratelimit-unified-reset": str(resets),
            "anthropic-ratelimit-unified-representative-claim": "five_hour",
            "anthropic-ratelimit-unified-5h-utilization": "0.95",
            "anthropic-ratelimit-unified-5h-reset": str(resets),
            "anthropic-ratelimit-unified-5h-surpassed-threshold": "0.9",
        },
    )
    first, second = real.enqueue("ask", "a"), real.enqueue("ask", "b")
    done = real.cli("worker", "session", "--burst", DISPATCHQ_WINDOW_RESERVE="0.1")
    assert done.returncode == 0, done.stderr
    assert real.record(first).status == "answered"  # the answer that reported it is kept
    assert real.record(second).status == "waiting"
    assert real.spawns() == 1
    (marker,) = real.status()["markers"]
    assert (marker["kind"], marker["up"], marker["utilization"]) == ("reserved", True, 0.95)
    assert iso_epoch(marker["lifts_at"]) == resets
    # An operator may spend it: open the window, the rest runs.
    assert real.cli("window", "open").returncode == 0
    done = real.cli("worker", "session", "--burst")
    assert real.record(second).status == "answered", real.record(second).reason


# --- issue 12 case 6: a weekly limit printed with the time only -----------------------------------
def test_a_weekly_limit_printed_with_the_time_only_is_tomorrow_never_just_reset(real: RealHarness) -> None:
    # 23.5 h ahead the CLI prints the time only, and that time of day passed half an hour ago
    # (`resets 6:46am (UTC)` at 07:16). With `--output-format json` the CLI prints no events:
    # that text is all dispatchq has. Read as "just reset" it would probe at once, every time.
    resets = int(time.time()) + 84_600
    real.api.default = Reply.limit(resets_at=resets, claim="seven_day")
    real.env["DISPATCHQ_SESSION_COMMAND"] = f"{real.claude} -p --output-format json"
    ids = [real.enqueue("ask", f"q{i}") for i in range(2)]
    real.bursts()  # exits by itself: read as "just reset" it would probe again at once
    assert real.spawns() == 1
    marker = real.marker(WEEKLY_SCOPE)  # the weekly window's own marker, apart from the 5-hour one
    assert marker is not None and marker.closed(), marker
    assert real.marker() is None
    assert marker.kind == "seven_day" and "weekly limit · resets" in marker.message, marker
    assert resets - 60 < marker.lifts_at <= resets  # tomorrow, at the printed minute
    assert real.all_status(ids, "waiting")
    real.figure("weekly limit, time only (json output)", 2, until_lift=1, while_closed=0)


# --- case 7: throttles that are not the usage window ----------------------------------------------
PER_MINUTE = (
    "This request would exceed the rate limit for your organization (0000) of 50,000 input tokens "
    "per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits."
)


def test_an_api_keys_per_minute_429_is_a_throttle_with_back_off_not_the_window(real: RealHarness) -> None:
    # The real CLI prints `API Error: Request rejected (429) · This request would exceed the rate
    # limit for your organization … per minute` (after one retry of its own).
    real.use_api_key()
    per_minute = Reply.error(429, "rate_limit_error", PER_MINUTE, **{"retry-after": "1"})
    real.api.push(per_minute, per_minute)
    real.api.answer("a minute later")
    jid = real.enqueue("ask", "q")
    real.workers(1)
    real.wait(lambda: real.all_status([jid], "answered"), "the answer after the back-off", timeout=90)
    assert real.marker() is None
    assert not [a for a in real.audit() if a["action"] == "closed"]
    assert real.spawns() == 2
    record = real.record(jid)
    backed_off = [step.why for step in record.trail if "transient throttle, retrying after" in step.why]
    assert len(backed_off) == 1 and "per minute" in backed_off[0], [s.why for s in record.trail]
    assert real.api.message_requests[0].headers.get("x-api-key") == "sk-ant-stand-in"
    real.figure("API key per-minute 429 (transient)", 1, total=2)


OPUS_HIGH_LOAD = "Opus is experiencing high load, please use /model to switch to Sonnet"


def test_opus_high_load_backs_off_that_judgement_and_pauses_no_other_model(real: RealHarness) -> None:
    overloaded: list[Seen] = []

    # 2.1.332 retries this 429 once itself: two in a row reach dispatchq there, one on 2.1.197.
    overloads = 1 if real.version == OLDEST else 2

    def opus_overloaded_once(seen: Seen) -> Reply | None:
        if "opus" in seen.model and len(overloaded) < overloads:
            overloaded.append(seen)
            return Reply.error(429, "rate_limit_error", OPUS_HIGH_LOAD)
        return None

    real.api.rule = opus_overloaded_once
    real.api.answer("answered")
    opus = real.enqueue("opus", "o")  # first in line: it meets the overload
    sonnets = [real.enqueue("sonnet", "s")]
    real.workers(1)
    real.wait(lambda: real.all_status([opus, *sonnets], "answered"), "every answer", timeout=120)
    assert real.window_markers() == []
    assert not [a for a in real.audit() if a["action"] == "closed"]
    assert real.spawns() == 3
    requests = real.api.message_requests
    opus_asks = [r for r in requests if "opus" in r.model]
    sonnet_asks = [r for r in requests if "sonnet" in r.model]
    assert len(opus_asks) == overloads + 1 and len(sonnet_asks) == 1, [r.model for r in requests]
    # While the Opus judgement backed off, a Sonnet one ran: nothing paused it.
    assert min(r.at for r in sonnet_asks) < opus_asks[overloads].at  # its next spawn
    assert any(OPUS_HIGH_LOAD in step.why for step in real.record(opus).trail)
    real.figure("Opus high load 429 (transient, Sonnet not paused)", 2, total=3)


# --- case 10: the wordings missed before ----------------------------------------------------------
def _clock_hour(at: datetime) -> str:
    return f"{at.hour % 12 or 12}{'am' if at.hour < 12 else 'pm'}"


@pytest.mark.parametrize(
    "wording",
    [
        pytest.param("Usage limit reached · resets {at} (UTC)", id="usage-limit-reached"),
        pytest.param("Limit reached · resets {at} (UTC) · /upgrade to Max 20x", id="limit-reached-upgrade"),
    ],
)
def test_older_limit_wordings_the_real_cli_passes_through_close_the_window(
    real: RealHarness, wording: str
) -> None:
    # Claude Code 2.1.197 never composes these itself; on a subscriber 429 whose only window
    # header is `-overage-disabled-reason` it prints the API's message verbatim (and a rejected
    # event with no reset), which is how they reach dispatchq here.
    at = (datetime.now(UTC) + timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    text = wording.format(at=_clock_hour(at))
    real.api.default = Reply.error(
        429,
        "rate_limit_error",
        text,
        **{"anthropic-ratelimit-unified-overage-disabled-reason": "org_level_disabled"},
    )
    ids = [real.enqueue("ask", f"q{i}") for i in range(2)]
    real.bursts()
    assert real.spawns() == 1
    marker = real.marker()
    assert marker is not None and marker.closed(), marker
    assert marker.lifts_at == at.timestamp(), (marker, text)
    assert real.all_status(ids, "waiting")
    real.figure(f"wording: {wording.split(' · ')[0]}", 2, until_lift=1, while_closed=0)


FABLE_AND_SONNET = """
  fable:
    session:
      prompt: "Answer {{ target }}"
      model: claude-fable-5
"""


def test_fables_monthly_spend_limit_pauses_fable_only(real: RealHarness) -> None:
    # A Fable session, 429, claim seven_day_overage_included, spend cap reached: the real CLI
    # prints `You've hit your monthly spend limit. /model to switch models.`
    real.add_kinds(FABLE_AND_SONNET)
    resets = int(time.time()) + 20 * 86400
    spent = Reply.limit(
        resets_at=resets, claim="seven_day_overage_included", overage_disabled_reason="org_spend_cap_reached"
    )
    real.api.rule = lambda seen: spent if "fable" in seen.model else None
    real.api.answer("sonnet answers")
    fables = [real.enqueue("fable", f"f{i}") for i in range(2)]
    other = real.enqueue("sonnet", "s")
    real.bursts()
    assert real.spawns() == 2
    marker = real.marker("model:fable")
    assert marker is not None and marker.closed() and marker.lifts_at == resets
    if real.version == OLDEST:  # 2.1.332's marker names the event, not its spend-limit text
        assert "monthly spend limit" in marker.message, marker
    assert real.marker() is None  # the other models still answer
    assert real.all_status(fables, "waiting")
    assert real.record(other).status == "answered"
    real.figure("wording: Fable monthly spend limit", 2, until_lift=1, while_closed=0)


def test_an_api_keys_usage_limits_400_closes_the_window_until_the_stated_day(real: RealHarness) -> None:
    # The API's own words on a 400; the real CLI prints `API Error: 400 You have reached …`.
    real.use_api_key()
    day = (datetime.now(UTC) + timedelta(days=31)).replace(hour=0, minute=0, second=0, microsecond=0)
    text = (
        "You have reached your specified API usage limits. "
        f"You will regain access on {day.date().isoformat()} at 00:00 UTC."
    )
    real.api.default = Reply.error(400, "invalid_request_error", text)
    ids = [real.enqueue("ask", f"q{i}") for i in range(2)]
    real.bursts()
    assert real.spawns() == 1
    marker = real.marker()
    assert marker is not None and marker.closed(), marker
    assert (marker.kind, marker.lifts_at) == ("api_usage", day.timestamp()), marker
    assert real.all_status(ids, "waiting")
    assert real.status()["sessions"]["blocked"] == {}  # a limit, not a broken host
    real.figure("wording: API usage limits (400)", 2, until_lift=1, while_closed=0)


# --- case 11: a probe a moment early --------------------------------------------------------------
def test_a_probe_refused_a_moment_after_the_stated_reset_is_retried_in_seconds(real: RealHarness) -> None:
    # The API's clock is behind the host's: at the stated instant it still refuses, stating the
    # same reset. DISPATCHQ_REPROBE_MIN stays at its 300 s: read as a wrong time, this would stall.
    stated: list[int] = []
    refused: list[Seen] = []

    def skewed(seen: Seen) -> Reply | None:
        if not stated:
            stated.append(int(seen.at) + 4)
        if len(refused) < 3:  # the hit, then two probes
            refused.append(seen)
            return Reply.limit(resets_at=stated[0], claim="five_hour")
        return None

    real.api.rule = skewed
    real.api.answer("after the skew")
    ids = [real.enqueue("ask", "q")]
    real.workers(1)
    real.wait(lambda: real.all_status(ids, "answered"), "the answer after two skew retries", timeout=120)
    assert len(real.api.message_requests) == 4 and real.spawns() == 4
    closes = [a for a in reversed(real.audit()) if a["action"] == "closed"]
    assert len(closes) == 3, closes
    delays = [
        datetime.fromisoformat(a["lifts_at"]).timestamp() - datetime.fromisoformat(a["at"]).timestamp()
        for a in closes[1:]
    ]
    assert all(0 < d < 60 for d in delays) and delays[0] < delays[1], delays  # 2 s, then 4 s
    real.figure("probe refused a moment early (clock skew)", 1, until_lift=1, total=4)


def test_a_probe_refused_with_a_long_past_reset_waits_reprobe_min(real: RealHarness) -> None:
    stale = int(time.time()) - 600  # the API keeps stating a reset ten minutes gone
    real.api.default = Reply.limit(resets_at=stale, claim="five_hour")
    ids = [real.enqueue("ask", "q")]
    real.workers(1, DISPATCHQ_REPROBE_MIN="120")
    real.wait(lambda: (m := real.marker()) is not None and m.refusals >= 2, "the probe's refusal", timeout=60)
    marker = real.marker()
    assert marker is not None and marker.closed(), marker
    assert 100 < marker.lifts_at - marker.set_at <= 120
    assert real.spawns_stay(2, period=2.0) == 2
    assert real.all_status(ids, "waiting")
    real.figure("stale stated reset (reprobe min)", 1, until_lift=2, while_closed=0)


# --- two session slots, two workers: the limit still stops every spawn ----------------------------
def test_with_two_session_slots_a_limit_stops_both_workers_until_the_lift(real: RealHarness) -> None:
    real.env["DISPATCHQ_SESSION_CONCURRENCY"] = "2"
    resets: list[int] = []

    def closed_for_a_while(seen: Seen) -> Reply | None:
        if not resets:
            resets.append(int(seen.at) + 8)
        return Reply.limit(resets_at=resets[0], claim="five_hour") if seen.at < resets[0] else None

    real.api.rule = closed_for_a_while
    real.api.answer("drained")
    ids = [real.enqueue("ask", f"q{i}") for i in range(3)]
    real.workers(2)
    real.wait(lambda: real.all_status(ids, "answered"), "the lift and the drain", timeout=150)
    requests = real.api.message_requests
    refused = [r for r in requests if r.at < resets[0]]
    # At most the sessions already running when the limit came (one per slot); then, after the
    # lift, each judgement once (the probe is one of them).
    assert 1 <= len(refused) <= 2, [r.at - resets[0] for r in requests]
    assert len(requests) == len(refused) + 3
    assert real.spawns() == len(requests)
    for jid in ids:
        assert real.record(jid).attempts == 0
    real.figure(
        "usage limit, 2 slots and 2 workers", 3, until_lift=len(refused), while_closed=0, total=len(requests)
    )


def test_with_two_session_slots_a_models_own_limit_is_no_spawn_loop(real: RealHarness) -> None:
    real.env["DISPATCHQ_SESSION_CONCURRENCY"] = "2"
    real.add_kinds(FABLE_AND_SONNET)
    resets = int(time.time()) + 3 * 86400
    weekly = Reply.limit(resets_at=resets, claim="seven_day_overage_included")
    real.api.rule = lambda seen: weekly if "fable" in seen.model else None
    real.api.answer("sonnet still answers")
    fables = [real.enqueue("fable", f"f{i}") for i in range(3)]
    other = real.enqueue("sonnet", "s")
    real.bursts(2)
    fable_asks = [r for r in real.api.message_requests if "fable" in r.model]
    assert 1 <= len(fable_asks) <= 2
    assert real.spawns() == len(fable_asks) + 1
    marker = real.marker("model:fable")
    assert marker is not None and marker.closed() and marker.lifts_at == resets
    assert real.all_status(fables, "waiting")
    assert real.record(other).status == "answered"
    real.figure("model's own limit, 2 slots and 2 workers", 3, until_lift=len(fable_asks), while_closed=0)


# --- a pool of credentials: the limit on one token moves work to the other; the API key --------
PRICED = """
priced:
  session:
    prompt: "Answer {{ target }}"
    cost_estimate: 0.5
"""


def test_a_limit_on_one_token_moves_work_to_the_other_and_the_api_key_answers_urgent(
    real: RealHarness,
) -> None:
    team_a = secret_file(real, "team-a", "tok-A")
    team_b = secret_file(real, "team-b", "tok-B")
    key = secret_file(real, "api", "sk-ant-key-M")
    write_pool(
        real,
        f"""
        team-a:
          token_file: {team_a}
        team-b:
          token_file: {team_b}
          order: 1
        api:
          api_key_file: {key}
          billing: metered
          spend_cap: {{day: 5.0}}
          serves: {{priority: urgent}}
        """,
        kinds_extra=PRICED,
    )
    resets = int(time.time()) + 3600
    real.api.limit_credential("tok-A", resets_at=resets)  # A's window closed; B and the key answer
    real.api.answer("answered")
    first = real.enqueue("ask", "first")
    real.workers(1)
    real.wait(lambda: real.all_status([first], "answered"), "the first judgement answered on B", timeout=60)
    on_a = real.api.requests_with("tok-A")
    assert len(on_a) == 1, [s.credential for s in real.api.message_requests]  # A's refusal, one spawn
    marker = real.marker(qualify("team-a", GENERAL_SCOPE))
    assert marker is not None and marker.closed() and int(marker.lifts_at) == resets
    assert real.marker(qualify("team-b", GENERAL_SCOPE)) is None
    assert any("refused at spawn" in step.why for step in real.record(first).trail)

    second = real.enqueue("ask", "second")
    real.wait(lambda: real.all_status([second], "answered"), "the second judgement answered on B", timeout=60)
    after = [s.credential for s in real.api.message_requests if s.at > on_a[0].at]
    assert after and set(after) == {"tok-B"}, after  # nothing more on A before its lift
    assert real.spawns() == 3

    # Both subscriptions closed: the API key answers an urgent judgement, and only that one.
    real.rt.window.close(
        datetime.now(UTC) + timedelta(hours=1), reason="kept for people", who="test", credential="team-b"
    )
    client = Client(runtime=real.rt)
    normal = client.enqueue("priced", "normal", priority="normal")
    urgent = client.enqueue("priced", "urgent", priority="urgent")
    real.wait(
        lambda: real.all_status([urgent], "answered"), "the urgent judgement answered on the key", timeout=60
    )
    real.wait(lambda: real.all_status([normal], "waiting"), "the normal judgement waiting")
    keyed = real.api.requests_with("sk-ant-key-M")
    assert len(keyed) == 1 and "authorization" not in keyed[0].headers
    assert [s.credential for s in real.api.message_requests].count("tok-A") == 1
    cost = (real.record(urgent).raw or {}).get("cost_usd")
    assert isinstance(cost, float) and cost > 0, real.record(urgent).raw  # the CLI's own total_cost_usd
    day, month = real.rt.storage.pool.spent("api", spend_periods(time.time(), real.rt.settings.timezone))
    # What it reported, not the 0.50 reserved at admission.
    assert day == pytest.approx(cost, abs=1e-6) and month == pytest.approx(cost, abs=1e-6)
    assert real.spawns() == 4
    real.figure("a pool: A limited, B answers, the key answers urgent", 4, on_a=1, total=real.spawns())


def test_a_session_cut_off_on_one_token_resumes_on_the_other_and_its_trail_says_so(real: RealHarness) -> None:
    team_a = secret_file(real, "team-a", "tok-A")
    team_b = secret_file(real, "team-b", "tok-B")
    write_pool(real, f"team-a:\n  token_file: {team_a}\nteam-b:\n  token_file: {team_b}\n  order: 1\n")
    resets = int(time.time()) + 3600

    def cut_off_on_a(seen: Seen) -> Reply | None:
        """On A the model calls a tool (a first turn, with usage), and the call after it meets
        A's limit: the session is cut off mid-run. B answers whatever it is asked."""
        if seen.credential != "tok-A":
            return None
        if seen.tool_results:
            return Reply.limit(resets_at=resets)
        return Reply.tool_use("Bash", {"command": "echo marmot", "description": "look"})

    real.api.rule = cut_off_on_a
    real.api.answer("resumed on B")
    jid = real.enqueue("ask", "remember the marmot")
    real.workers(1)
    real.wait(lambda: real.all_status([jid], "answered"), "the answer on B", timeout=90)
    record = real.record(jid)
    trail = [step.why for step in record.trail]
    assert any("cut off mid-run" in why for why in trail), trail
    assert any("resumed on team-b after a cut-off on team-a" in why for why in trail), trail
    assert record.value == "resumed on B"
    assert len(real.api.requests_with("tok-A")) == 2  # the tool call, then the refusal
    (on_b,) = real.api.requests_with("tok-B")
    history = on_b.body.get("messages", []) if isinstance(on_b.body, dict) else []
    # The transcript carried over (it lives in the judgement's config folder, not the login's):
    # B's one request sends A's turns back, the prompt and the tool call first.
    assert "remember the marmot" in json.dumps(history[0]), history
    assert "tool_use" in json.dumps(history) and on_b.tool_results, history
    assert real.spawns() == 2
