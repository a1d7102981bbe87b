"""Claude Code's newer refusals, driven through the real CLI with the service's headers and bodies.

Same harness as `test_claude_cli.py` (`RealHarness`: the real CLI as the session command,
confined, answering through `dispatchq.testing.anthropic`), on whatever CLI it gives. Each
case states what the newest CLI (2.1.332: the fields `limitScope`, `dailyCapPaused`,
`memberSpendLimit`, `api_error_params`) and what an older one (2.1.197: its own words for the
same refusal) must lead to, so the file runs on either and the lead runs it on both. Each case
writes its figure (spawns until the lift, the marker's scope and lift) when bench asks.

Driven here: an organisation paused, a pooled group budget (with and without its stated
turn), a channel's cap, the person's own cap, and the API's clock 2 s behind this host's.
Not drivable by the stand-in (recorded lines in `tests/unit/test_cli_signals.py`):
`sandbox_required_unavailable`, `cli_version_too_old`, `session_held_by_background`,
`credential_expires_at`.
"""

from __future__ import annotations

import re
import subprocess
import time
from datetime import datetime

import pytest

from dispatchq.testing.anthropic import Reply
from dispatchq.window.messages import ORG_PAUSED_SCOPE, PERSON_HOLD, SKEW_WINDOW
from tests.support.real_client import RealHarness, refuse_a_missing_cli_under_ci

refuse_a_missing_cli_under_ci()

pytestmark = [pytest.mark.slow]


def cli_version(h: RealHarness) -> tuple[int, ...]:
    """The version of the CLI this harness runs (its session command's first word)."""
    command = h.env["DISPATCHQ_SESSION_COMMAND"].split()[0]
    done = subprocess.run([command, "--version"], capture_output=True, text=True, timeout=60)
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", done.stdout)
    assert found, done.stdout + done.stderr
    return tuple(int(n) for n in found.groups())


def names_the_cap(h: RealHarness) -> bool:
    """Does this CLI say whose spend cap refused (2.1.332's `limitScope` and kin)?"""
    return cli_version(h) >= (2, 1, 332)


def version_label(h: RealHarness) -> str:
    return ".".join(map(str, cli_version(h)))


def drain_after_open(h: RealHarness, ids: list[str]) -> None:
    done = h.cli("window", "open")
    assert done.returncode == 0, done.stdout + done.stderr
    h.wait(lambda: h.all_status(ids, "answered"), "the drain once a person opened the window", timeout=90)


# --- a cap only a person clears -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("whose", "scope", "words"),
    [
        ("org_paused", ORG_PAUSED_SCOPE, "Usage is paused for your organization"),
        ("group_pool", "spend:group_pool", "You've hit your team's pooled group budget"),
        ("channel", "spend:channel", "You've hit your channel's monthly spend limit"),
        ("member", "spend:member", "You've hit your individual spend limit"),
    ],
)
def test_a_spend_cap_with_no_stated_turn_holds_its_scope_until_a_person_clears_it(
    real: RealHarness, whose: str, scope: str, words: str
) -> None:
    plan_reset = int(time.time()) + 3600  # the plan window's reset, sent beside the cap: not its lift
    real.api.push(Reply.spend_cap(whose, resets_at=plan_reset, period="monthly"))
    real.api.answer("after a person raised it")
    ids = [real.enqueue("ask", f"q{i}") for i in range(2)]
    real.workers(1)
    if names_the_cap(real):
        real.wait(lambda: real.marker(scope) is not None, f"the {scope} marker", timeout=90)
        marker = real.marker(scope)
        assert marker is not None and marker.closed()
        assert words in marker.message and "until a person clears it" in marker.message
        assert marker.lifts_at - marker.set_at > PERSON_HOLD.total_seconds() - 60
        assert real.marker() is None  # the plan's own window is not what closed
    else:  # an older CLI words it as a plan or org limit, lifting at the stated reset
        real.wait(lambda: bool(real.window_markers()), "a marker", timeout=90)
        marker = real.window_markers()[0]
        assert marker.closed() and marker.scope not in (scope,)
    real.wait(lambda: real.all_status(ids, "waiting"), "every judgement to wait", timeout=60)
    assert real.spawns_stay(1, period=2.0) == 1
    real.figure(
        f"{whose} cap, no stated turn ({version_label(real)}): scope {marker.scope}, "
        f"lifts {datetime.fromtimestamp(marker.lifts_at).isoformat()}",
        2,
        until_lift=1,
        while_closed=0,
    )
    drain_after_open(real, ids)
    assert real.spawns() == 3


def test_a_pooled_group_budget_lifts_when_the_cap_says_it_turns(real: RealHarness) -> None:
    turn = int(time.time()) + 8
    real.api.push(Reply.spend_cap("group_pool", resets_at=turn, cap_resets_at=turn))
    real.api.answer("after the turn")
    ids = [real.enqueue("ask", f"q{i}") for i in range(2)]
    real.workers(1)
    scope = "spend:group_pool" if names_the_cap(real) else "general"
    real.wait(lambda: real.marker(scope) is not None, f"the {scope} marker", timeout=90)
    marker = real.marker(scope)
    assert marker is not None
    assert marker.stated == f"resetsAt={turn}"
    assert marker.lifts_at >= turn  # (a loaded host may spawn after it: then it lifts at once)
    if names_the_cap(real):
        assert marker.kind == "group_pool" and "pooled group budget" in marker.message
    real.wait(lambda: real.all_status(ids, "answered"), "the lift, one probe, then the drain", timeout=90)
    assert real.spawns() == 3
    real.figure(
        f"pooled group budget with its turn ({version_label(real)}): scope {scope}, lifts at the turn",
        2,
        until_lift=1,
        total=real.spawns(),
    )


# --- the API's clock 2 s behind this host's ---------------------------------------------------
def test_with_the_apis_clock_behind_the_probe_is_retried_in_seconds_never_tomorrow(real: RealHarness) -> None:
    """Issue 23 item 5: the probe at the stated lift is refused with that (now just past) reset.

    2.1.332 then prints no rate_limit_event: only the refused turn's record states the instant.
    Read as "unknown kind, just reset" it meant tomorrow and the line stalled for a day.
    """
    real.api.clock_offset = -2.0
    stated = int(time.time()) + 12  # past the first spawn's start-up, even on a loaded host
    real.api.close_until(stated, claim="five_hour")
    real.api.answer("after the skew")
    ids = [real.enqueue("ask", "q")]
    real.workers(1)
    real.wait(lambda: real.all_status(ids, "answered"), "the answer after the skew retries", timeout=120)
    closes = [a for a in reversed(real.audit()) if a["action"] == "closed"]
    assert closes, real.audit()
    allowance = SKEW_WINDOW.total_seconds() * len(closes) + 2.0 * 2 ** len(closes)
    for close in closes:  # the marker never lifts later than the stated instant plus the skew allowance
        assert datetime.fromisoformat(close["lifts_at"]).timestamp() <= stated + allowance, closes
    extra_probes = real.spawns() - 2  # beyond the hit and the answer
    assert 0 <= extra_probes <= 4, real.spawns()  # at most the skew retries
    real.figure(
        f"API clock 2 s behind ({version_label(real)}): general, lifts a moment after the stated instant",
        1,
        until_lift=1,
        skew_probes=extra_probes,
        total=real.spawns(),
    )
