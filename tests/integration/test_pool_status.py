"""The pool as people see it, on a real Redis: `dispatchq status` (text and `--json`),
`dispatchq credentials --json` and `/metrics` with two credentials, one closed by an operator
and one metered with a settled spend, three judgements in the session line and a measured
session rate in the scheduler's history."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dispatchq.core.status import status_json_schema
from dispatchq.pools.spend import spend_periods
from dispatchq.serve.metrics import StoreCollector
from dispatchq.storage import keys
from tests.support.session import CONFIG, Harness

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")

SECRET_A = "tok-A-do-not-print"
SECRET_B = "key-B-do-not-print"


def _secret(harness: Harness, name: str, value: str) -> Path:
    path = harness.tmp / "secrets" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def _two_credentials(harness: Harness) -> tuple[Path, Path]:
    a = _secret(harness, "a", SECRET_A)
    b = _secret(harness, "b", SECRET_B)
    credentials = f"""
    a:
      token_file: {a}
      concurrency: 2
    b:
      api_key_file: {b}
      billing: metered
      concurrency: 2
      order: 1
      spend_cap: {{day: 20.0, month: 300.0}}
    """
    text = textwrap.dedent(CONFIG) + "credentials:\n" + textwrap.indent(textwrap.dedent(credentials), "  ")
    (harness.tmp / "dispatchq.yaml").write_text(text)
    harness.rt.__dict__.pop("config", None)
    return a, b


def _measured_history(harness: Harness, minutes: int, per_minute: int) -> None:
    """The scheduler's samples of the last `minutes` minutes: `per_minute` sessions answered in each."""
    start = time.time() - minutes * 60
    for i in range(minutes + 1):
        if i:
            harness.redis.incrby(keys.answered_counter("session"), per_minute)
        assert harness.rt.storage.history.sample(start + i * 60, window_closed=False)


def _scrape(rt: Any) -> dict[str, Any]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(lambda: rt))
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_status_credentials_and_metrics_show_each_credential_and_the_backlog(harness: Harness) -> None:
    a_file, b_file = _two_credentials(harness)
    lift = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    harness.rt.window.close(lift, reason="kept for people", who="test", credential="a")
    now = time.time()
    periods = spend_periods(now, harness.rt.settings.timezone)
    slot = "test-holder:0001#b"
    verdict = harness.rt.storage.pool.admit(
        "b",
        slot,
        lease=30.0,
        limit=2,
        markers=[],
        estimate=1.0,
        caps=(20.0, 300.0),
        periods=periods,
    )
    assert verdict == "ok"
    assert harness.rt.storage.pool.settle(slot, 0.5)
    harness.rt.window.release(slot, [])
    jobs = [harness.enqueue("ask", f"t{i}") for i in range(3)]
    assert len(set(jobs)) == 3
    _measured_history(harness, minutes=30, per_minute=2)  # 60 in half an hour: 120 an hour

    # `status --json`: the typed document, per credential and for the backlog.
    status = harness.status()
    assert status["schema"] == 1
    a, b = status["pool"]["credentials"]
    assert (a["name"], a["state"], a["billing"], a["concurrency"]) == ("a", "closed", "subscription", 2)
    assert a["why"] == f"closed until {lift.strftime('%Y-%m-%d %H:%M')} UTC (operator)"
    assert a["lifts_at_epoch"] == lift.timestamp()
    assert [m["scope"] for m in a["markers"]] == ["a/general"]
    assert (b["name"], b["state"], b["billing"], b["why"]) == ("b", "open", "metered", "open")
    assert b["spend"] == {"day": 0.5, "month": 0.5, "cap_day": 20.0, "cap_month": 300.0}
    assert a["spend"]["cap_day"] is None and a["running"] == 0 and b["running"] == 0
    backlog = status["backlog"]
    assert backlog["waiting"] == 3
    assert backlog["rate_per_hour"] == pytest.approx(120.0)
    assert backlog["rate_hours"] == pytest.approx(0.5)
    # Some credential (b) is open: the drain starts now, 3 at 120 an hour is 90 seconds.
    assert backlog["drain_seconds"] == pytest.approx(90, abs=10)
    assert backlog["drain_at_epoch"] == pytest.approx(status["now"] + 90, abs=10)
    assert backlog["drain_text"].startswith("3 waiting: ~") and backlog["drain_text"].endswith(
        "at today's rate"
    )

    # The text view: a line per credential (two of them, one metered) and the backlog.
    text = harness.cli("status")
    assert text.returncode == 0, text.stderr
    assert f"credential a: closed until {lift.strftime('%H:%M')} (operator) · 0 running of 2" in text.stdout
    assert "credential b: open · 0 running of 2 · spend today $0.50 of $20.00" in text.stdout
    assert "session backlog: 3 waiting: ~" in text.stdout

    # `credentials --json`: the configuration with the live state, the file's path, never its content.
    listed = harness.cli("credentials", "--json")
    assert listed.returncode == 0, listed.stderr
    assert SECRET_A not in listed.stdout and SECRET_B not in listed.stdout
    rows = {row["name"]: row for row in json.loads(listed.stdout)["credentials"]}
    assert list(rows) == ["a", "b"]
    assert (rows["a"]["file"], rows["a"]["variable"], rows["a"]["state"]) == (
        str(a_file),
        "CLAUDE_CODE_OAUTH_TOKEN",
        "closed",
    )
    assert (rows["b"]["file"], rows["b"]["variable"], rows["b"]["billing"]) == (
        str(b_file),
        "ANTHROPIC_API_KEY",
        "metered",
    )
    assert rows["b"]["spend_cap"] == {"day": 20.0, "month": 300.0} and rows["a"]["spend_cap"] is None
    assert (rows["a"]["order"], rows["b"]["order"]) == (0, 1)
    assert rows["b"]["spend"] == {"day": 0.5, "month": 0.5} and rows["b"]["state"] == "open"
    table = harness.cli("credentials")
    assert table.returncode == 0 and str(b_file) in table.stdout and SECRET_B not in table.stdout
    helped = harness.cli("credentials", "--help")
    assert "never printed" in helped.stdout

    # /metrics: the families labelled `credential`, and the backlog's.
    families = _scrape(harness.rt)

    def values(name: str) -> dict[tuple[str, ...], float]:
        return {tuple(s.labels.values()): s.value for s in families[name].samples}

    assert values("dispatchq_credential_open") == {("a",): 0.0, ("b",): 1.0}
    assert values("dispatchq_credential_sessions_running") == {("a",): 0.0, ("b",): 0.0}
    spend = values("dispatchq_credential_spend_usd")
    assert spend[("b", "day")] == 0.5 and spend[("b", "month")] == 0.5 and spend[("a", "day")] == 0.0
    assert values("dispatchq_credential_spend_cap_usd") == {("b", "day"): 20.0, ("b", "month"): 300.0}
    assert values("dispatchq_session_backlog") == {(): 3.0}
    (drain,) = values("dispatchq_session_drain_seconds").values()
    assert drain == pytest.approx(90, abs=10)


def test_a_credential_s_reported_window_reaches_status_and_metrics(harness: Harness) -> None:
    _two_credentials(harness)
    resets = time.time() + 3 * 3600
    harness.rt.storage.usage.record(
        [{"window": "a/five_hour", "utilization": 0.83, "resets_at": resets, "status": "allowed"}],
        reported_at=time.time() - 240,
        session="s-1",
        host="h",
    )
    harness.rt.window.close(datetime.now(UTC) + timedelta(hours=1), reason="x", who="t", credential="b")
    status = harness.status()
    a, b = status["pool"]["credentials"]
    assert [(w["window"], w["utilization"]) for w in a["windows"]] == [("five_hour", 0.83)]
    assert 240 <= a["windows"][0]["age_seconds"] < 300
    assert b["windows"] == [] and b["state"] == "closed"
    # No history sampled and nothing waiting: no rate, nothing to drain.
    assert status["backlog"]["rate_per_hour"] is None and status["backlog"]["drain_at"] is None
    assert status["backlog"]["drain_text"] == "nothing waiting" and status["backlog"]["drain_seconds"] == 0
    assert set(status["backlog"]) == set(status_json_schema()["$defs"]["BacklogPart"]["properties"])
    assert set(a) == set(status_json_schema()["$defs"]["PoolCredential"]["properties"])
    families = _scrape(harness.rt)
    used = {
        tuple(s.labels.values()): s.value
        for s in families["dispatchq_credential_window_utilization_ratio"].samples
    }
    assert used == {("a", "five_hour"): 0.83}


def test_a_running_session_is_counted_on_its_credential(harness: Harness) -> None:
    _two_credentials(harness)
    harness.rt.window.close(datetime.now(UTC) + timedelta(hours=1), reason="x", who="t", credential="a")
    barrier = harness.tmp / "may-finish"
    harness.plan({"scenario": "answer", "wait_for": str(barrier)})
    harness.workers(1)
    client_jid = harness.enqueue("ask", "held")
    # b is metered and serves anyone here: the judgement runs there, a being closed.
    running = harness.wait(
        lambda: (harness.status()["sessions"]["running"] or {}).get(client_jid), "the session running on b"
    )
    assert running["credential"] == "b"
    a, b = harness.status()["pool"]["credentials"]
    assert (a["running"], b["running"]) == (0, 1)
    barrier.write_text("")
    harness.wait(lambda: harness.statuses([client_jid]) == ["answered"], "the judgement answered")
