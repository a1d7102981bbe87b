"""Several credentials on one Redis: real `dispatchq worker session` processes and the fake `claude`,
which logs the credential each session was given and takes plan steps meant for one credential.

What is asserted is where each session ran and what the markers, spend and records say; every
wait is bounded, and "nothing more spawns on A" is a count over a bounded period after the
system visibly moved the work elsewhere.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from dispatchq.client import Client
from dispatchq.pools.credentials import qualify
from dispatchq.window.limits import GENERAL_SCOPE
from tests.support.pool_config import secret_file, write_pool
from tests.support.session import Harness

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")


def _two_subscriptions(harness: Harness) -> None:
    a = secret_file(harness, "team-a", "tok-A")
    b = secret_file(harness, "team-b", "tok-B")
    write_pool(
        harness,
        f"""
        team-a:
          token_file: {a}
          concurrency: 1
        team-b:
          token_file: {b}
          concurrency: 1
          order: 1
        """,
    )


def test_a_limit_on_one_credential_sends_the_next_judgement_to_the_other_with_no_wait(
    harness: Harness,
) -> None:
    _two_subscriptions(harness)
    resets = int(time.time()) + 3600
    harness.plan({"credential": "tok-A", "scenario": "limit_event", "resets_at": str(resets)})
    harness.workers(1)

    first = harness.enqueue("ask", "first")
    harness.wait(lambda: harness.statuses([first]) == ["answered"], "the first judgement answered on B")
    assert harness.spawns_on("tok-A") == 1 and harness.spawns_on("tok-B") == 1
    marker = harness.marker(qualify("team-a", GENERAL_SCOPE))
    assert marker is not None and marker.closed() and int(marker.lifts_at) == resets
    assert harness.marker(GENERAL_SCOPE) is None and harness.marker(qualify("team-b", GENERAL_SCOPE)) is None
    trail = [entry.why for entry in harness.record(first).trail]
    assert any("refused at spawn" in why for why in trail), trail

    # Everything after goes to B, none waits, and A sees no session until its lift.
    more = [harness.enqueue("ask", f"more-{i}") for i in range(3)]
    harness.wait(lambda: harness.all_status(more, "answered"), "the rest answered on B")
    assert harness.spawns_stay(5) == 5
    assert harness.spawns_on("tok-A") == 1 and harness.spawns_on("tok-B") == 4
    assert harness.retriggers() == [(qualify("team-a", GENERAL_SCOPE), resets)]


def test_after_its_lift_exactly_one_probe_runs_on_the_limited_credential(harness: Harness) -> None:
    _two_subscriptions(harness)
    barrier = harness.tmp / "probe-may-finish"
    harness.plan(
        {"credential": "tok-A", "scenario": "limit_event", "resets_in": "3"},
        {"credential": "tok-A", "scenario": "answer", "wait_for": str(barrier)},
    )
    harness.scheduler()
    harness.workers(3, DISPATCHQ_PROBE_GRACE="120")
    first = harness.enqueue("ask", "first")
    harness.wait(lambda: harness.statuses([first]) == ["answered"], "the first judgement answered on B")
    scope = qualify("team-a", GENERAL_SCOPE)
    harness.wait(lambda: harness.marker_state(scope) == "probing", "A's lift", timeout=20)
    # B has one slot: a burst of work puts judgements in front of A, which may take one probe.
    burst = [harness.enqueue("ask", f"burst-{i}") for i in range(4)]
    harness.wait(lambda: harness.spawns_on("tok-A") == 2, "the one probe on A")
    time.sleep(1.0)
    assert harness.spawns_on("tok-A") == 2  # the probe holds A: no second session there
    barrier.write_text("")
    harness.wait(lambda: harness.all_status(burst, "answered"), "the burst answered")
    assert harness.marker(scope) is None


def test_metered_money_is_spent_only_by_urgent_judgements_and_never_past_its_cap(harness: Harness) -> None:
    sub = secret_file(harness, "sub", "tok-S")
    api = secret_file(harness, "api", "key-M")
    write_pool(
        harness,
        f"""
        sub:
          token_file: {sub}
        api:
          api_key_file: {api}
          billing: metered
          spend_cap: {{day: 1.0}}
          serves: {{priority: urgent}}
        """,
        kinds_extra="""
          priced:
            session:
              prompt: "Answer {{ target }}"
              cost_estimate: 0.4
        """,
    )
    harness.rt.window.close(
        datetime.now(UTC) + timedelta(hours=2),
        reason="kept for people",
        who="test",
        credential="sub",
    )
    client = Client(runtime=harness.rt)
    harness.plan(*[{"credential": "key-M", "scenario": "answer", "cost": "0.35"} for _ in range(4)])
    harness.workers(1)
    background = client.enqueue("priced", "sweep", priority="background")
    normal = client.enqueue("priced", "plain", priority="normal")
    urgent = [client.enqueue("priced", f"urgent-{i}", priority="urgent") for i in range(4)]
    # 0.35 each against a $1.00 day with a 0.40 estimate: two fit (0.35+0.35+0.40 > 1.0 after the third).
    harness.wait(lambda: harness.statuses(urgent).count("answered") == 2, "two urgent answers on the key")
    harness.wait(
        lambda: all(s == "waiting" for s in harness.statuses([background, normal, *urgent[2:]])),
        "the rest waiting",
    )
    assert harness.spawns_stay(2) == 2
    assert harness.spawns_on("key-M") == 2 and harness.spawns_on("tok-S") == 0
    day, _ = harness.rt.storage.pool.spent("api", _periods(harness))
    assert day == pytest.approx(0.70)
    assert day <= 1.0 + 0.4
    reason = harness.record(urgent[3]).reason or ""
    assert "sub closed until" in reason and "cap reached" in reason, reason
    # A background judgement may not spend metered money: it waits on the subscription alone.
    background_why = harness.record(background).reason or ""
    assert background_why.startswith("usage window: sub closed until") and "api" not in background_why


def _periods(harness: Harness) -> tuple[str, str]:
    from dispatchq.pools.spend import spend_periods

    return spend_periods(time.time(), harness.rt.settings.timezone)


def test_a_refused_credential_is_blocked_everywhere_and_the_other_answers_until_it_is_opened(
    harness: Harness,
) -> None:
    _two_subscriptions(harness)
    refused = {
        "credential": "tok-A",
        "scenario": "error",
        "message": "Invalid API key · Please run /login",
        "api_status": "401",
    }
    harness.plan(refused)
    harness.workers(1)
    first = harness.enqueue("ask", "first")
    harness.wait(lambda: harness.statuses([first]) == ["answered"], "the first judgement answered on B")
    assert harness.spawns_on("tok-A") == 1 and harness.spawns_on("tok-B") == 1
    blocked = harness.rt.storage.pool.blocked()
    assert list(blocked) == ["team-a"] and "Invalid API key" in blocked["team-a"]
    assert harness.rt.storage.window.blocked() == {}  # the host is not blocked: B answers here
    trail = [entry.why for entry in harness.record(first).trail]
    assert any("credential refused (no cost)" in why for why in trail), trail

    more = [harness.enqueue("ask", f"more-{i}") for i in range(2)]
    harness.wait(lambda: harness.all_status(more, "answered"), "the rest answered on B")
    assert harness.spawns_on("tok-A") == 1

    opened = harness.cli("window", "open", "--credential", "team-a")
    assert opened.returncode == 0, opened.stderr
    assert harness.rt.storage.pool.blocked() == {}
    unknown = harness.cli("window", "open", "--credential", "nobody")
    assert unknown.returncode == 2 and "no credential named 'nobody'" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1


def test_a_session_worker_refuses_to_start_when_a_credential_file_is_missing(harness: Harness) -> None:
    _two_subscriptions(harness)
    (harness.tmp / "secrets" / "team-b").unlink()
    done = harness.cli("worker", "session", "--burst")
    assert done.returncode == 2, done.stderr
    assert "team-b" in done.stderr and "does not exist" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_operator_closes_one_credentials_window_and_the_other_keeps_answering(harness: Harness) -> None:
    _two_subscriptions(harness)
    closed = harness.cli("window", "close", "--until", "2h", "--credential", "team-a", "--reason", "demo")
    assert closed.returncode == 0, closed.stderr
    assert "usage window of team-a closed until" in closed.stdout
    assert harness.marker(qualify("team-a", GENERAL_SCOPE)) is not None
    assert harness.marker(GENERAL_SCOPE) is None
    which = harness.cli("window", "close", "--until", "2h")
    assert which.returncode == 2 and "name one of team-a, team-b" in which.stderr
    harness.workers(1)
    ids = [harness.enqueue("ask", f"q{i}") for i in range(2)]
    harness.wait(lambda: harness.all_status(ids, "answered"), "both answered on team-b")
    assert harness.spawns_on("tok-A") == 0 and harness.spawns_on("tok-B") == 2
    opened = harness.cli("window", "open", "--credential", "team-a")
    assert opened.returncode == 0 and qualify("team-a", GENERAL_SCOPE) in opened.stdout
