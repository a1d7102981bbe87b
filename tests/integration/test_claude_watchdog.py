"""A session never sleeps through a usage limit, whatever turns Claude Code's retry watchdog on.

Under `CLAUDE_CODE_RETRY_WATCHDOG=1` the real CLI answers a rejected 429 by sleeping until the
stated reset (measured: still asleep after 40 s on 2.1.197 and 2.1.332), holding a session
slot for hours while dispatchq believes it is working. dispatchq withholds the variable (even
when the operator's allow list globs it), sets it to 0 itself, and gives the same value as
`--settings`, because the CLI applies a checkout's `.claude/settings.json` `env` over its
process environment: a 0 in the environment alone loses to a checkout's 1 (measured).

Each case: a limit whose reset is ten minutes away, one burst worker, the real CLI confined as
deployed. The limit must be reported by the one spawn (the marker up, the judgement waiting)
and the worker back well within that spawn's length; asleep, it would still be waiting.
"""

from __future__ import annotations

import json
import time

import pytest

from dispatchq.client import Client
from dispatchq.testing.anthropic import Reply
from tests.support.real_client import RealHarness, refuse_a_missing_cli_under_ci

pytestmark = [pytest.mark.slow]
refuse_a_missing_cli_under_ci()

# A real spawn answers in seconds; one asleep until the reset would take ten minutes.
SPAWN_BOUND = 120
WATCHDOG_ON = {
    "CLAUDE_CODE_RETRY_WATCHDOG": "1",
    "CLAUDE_CODE_RETRY_WATCHDOG_MAX_USAGE_LIMIT_WAIT_MS": "3600000",
    "CLAUDE_CODE_RETRY_WATCHDOG_MAX_WAIT_MS": "3600000",
}


def _limit_reported_by_one_spawn(real: RealHarness, jid: str, **env: str) -> None:
    resets = int(time.time()) + 600
    real.api.default = Reply.limit(resets_at=resets, claim="five_hour")
    started = time.monotonic()
    real.bursts(**env)  # each burst worker must exit by itself within the harness's bound
    took = time.monotonic() - started
    assert took < SPAWN_BOUND, f"the burst took {took:.0f} s: the session slept through the limit"
    assert real.spawns() == 1
    assert len(real.api.message_requests) == 1  # asleep, it would ask again at the reset
    marker = real.marker()
    assert marker is not None and marker.closed(), marker
    assert resets - 60 < marker.lifts_at <= resets + 60, (marker, resets)
    assert real.record(jid).status == "waiting", real.record(jid).reason
    real.figure(f"watchdog on ({real.version})", 1, until_lift=1, while_closed=0)


def test_the_watchdog_in_the_workers_environment_even_allowed_by_glob_never_reaches_a_session(
    watchdog_real: RealHarness,
) -> None:
    watchdog_real.env.update(WATCHDOG_ON, DISPATCHQ_SESSION_ALLOW_ENV="CLAUDE_CODE_*")
    jid = watchdog_real.enqueue("ask", "q")
    _limit_reported_by_one_spawn(watchdog_real, jid)


def test_a_checkout_whose_settings_turn_the_watchdog_on_still_reports_the_limit(
    watchdog_real: RealHarness,
) -> None:
    checkout = watchdog_real.tmp / "checkout"
    (checkout / ".claude").mkdir(parents=True)
    settings = {"env": {**WATCHDOG_ON, "CLAUDE_CODE_STARTUP_FAILURE_RESULTS": "0"}}
    (checkout / ".claude" / "settings.json").write_text(json.dumps(settings))
    (checkout / ".claude" / "settings.local.json").write_text(json.dumps(settings))
    watchdog_real.env.update(WATCHDOG_ON)
    jid = Client(runtime=watchdog_real.rt).enqueue("ask", "q", context={"checkout": str(checkout)})
    _limit_reported_by_one_spawn(watchdog_real, jid)
