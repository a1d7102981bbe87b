"""The window's usage for people: a real CLI run's report in `status`, `/status`, `/metrics` and the page.

A session reports each window's utilisation and reset (`unifiedWindows` on 2.1.332, the
`allowed_warning` event on both versions); the session worker keeps the latest per window in
Redis (`dispatchq.storage.usage`) and every view reads it from there. The page is checked in
headless Chromium as `test_serve_page.py` does; a stored login about to end (reported only
for a stored claude.ai login, so recorded here, not driven) is a WARNING on status and page.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dispatchq.core.status import Status
from dispatchq.serve.usage import usage_families
from dispatchq.storage import usage as usage_store
from dispatchq.testing.anthropic import Reply
from tests.support.page import CHROMIUM_ARGS, chromium_or_skip, serving
from tests.support.real_client import RealHarness, refuse_a_missing_cli_under_ci

refuse_a_missing_cli_under_ci()

pytestmark = [pytest.mark.slow]


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return bytes(response.read())


def samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_a_real_runs_usage_shows_in_status_metrics_and_the_page(real: RealHarness) -> None:
    five_reset = int(time.time()) + 3 * 3600
    week_reset = int(time.time()) + 4 * 86400
    headers = Reply.window_headers(five_hour=(0.92, five_reset, 0.9), seven_day=(0.13, week_reset))
    real.api.answer("used", **headers)
    jid = real.enqueue("ask", "q")
    done = real.cli("worker", "session", "--burst")
    assert done.returncode == 0, done.stderr[-2000:]
    assert real.record(jid).status == "answered"

    data = real.status()
    rows = {row["scope"]: row for row in data["window_usage"]}
    assert rows["five_hour"]["utilization"] == 0.92, data["window_usage"]
    assert rows["five_hour"]["resets_at_epoch"] == five_reset
    assert 0 <= rows["five_hour"]["age_seconds"] < 600
    assert rows["five_hour"]["session"]
    if "seven_day" in rows:  # 2.1.332 reports every window (`unifiedWindows`); 2.1.197 the warned one
        assert rows["seven_day"]["utilization"] == 0.13
    text = real.cli("status")
    assert "window usage [five_hour]: 92% used" in text.stdout, text.stdout

    # A stored login ending in three days (NOT DRIVEN: reported only for a stored claude.ai login).
    now = time.time()
    usage_store.record_credential(real.redis, "build-07", now + 3 * 86400, reported_at=now)
    text = real.cli("status")
    assert "WARNING: the stored Claude login on host build-07 ends in" in text.stdout, text.stdout

    with serving(real.rt) as url:
        status = json.loads(fetch(f"{url}/status"))
        assert {r["scope"]: r["utilization"] for r in status["window_usage"]}["five_hour"] == 0.92
        assert status["credentials"][0]["warning"]
        metrics = samples(fetch(f"{url}/metrics"))
        assert metrics[("dispatchq_window_utilization_ratio", (("scope", "five_hour"),))] == 0.92
        assert (
            metrics[("dispatchq_window_resets_at_timestamp_seconds", (("scope", "five_hour"),))] == five_reset
        )
        assert ("dispatchq_window_usage_reported_at_timestamp_seconds", (("scope", "five_hour"),)) in metrics
        expires = metrics[("dispatchq_credential_expires_at_timestamp_seconds", (("host", "build-07"),))]
        assert abs(expires - (now + 3 * 86400)) < 1
        page_shows_the_usage(url)


def page_shows_the_usage(url: str) -> None:
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            page.goto(url + "/")
            page.wait_for_selector("#usage .usage-used")
            row = page.locator("#usage tbody tr", has_text="five_hour")
            assert "92%" in row.inner_text()
            assert "ago" in row.inner_text()
            assert row.locator(".countdown").count() == 1
            warning = page.locator("#credential-warnings")
            assert warning.is_visible()
            assert "WARNING: the stored Claude login on host build-07" in warning.inner_text()
        finally:
            browser.close()


def test_the_later_report_of_a_window_is_kept_whatever_order_they_arrive(redis_client: Any) -> None:
    report = {"window": "five_hour", "utilization": 0.5, "resets_at": 1.0, "status": None}
    usage_store.record_usage(redis_client, [report], reported_at=200.0, session="late", host="h")
    stale = {**report, "utilization": 0.4}
    assert usage_store.record_usage(redis_client, [stale], reported_at=100.0, session="early", host="h") == 0
    kept = usage_store.read_usage(redis_client)["five_hour"]
    assert (kept["utilization"], kept["session"]) == (0.5, "late")
    assert (
        usage_store.record_usage(
            redis_client, [{**report, "utilization": 0.6}], reported_at=300.0, session="next", host="h"
        )
        == 1
    )
    assert usage_store.read_usage(redis_client)["five_hour"]["utilization"] == 0.6


def test_usage_families_export_only_what_was_reported() -> None:
    data = {
        "window_usage": [
            {
                "scope": "five_hour",
                "utilization": 0.42,
                "resets_at_epoch": 1700000000.0,
                "reported_at_epoch": 1.0,
            },
            {"scope": "seven_day", "utilization": None, "resets_at_epoch": None, "reported_at_epoch": None},
        ],
        "credentials": [],
    }
    got = {
        (s.name, tuple(s.labels.items())): s.value
        for f in usage_families(Status.model_validate(data))
        for s in f.samples
    }
    assert got == {
        ("dispatchq_window_utilization_ratio", (("scope", "five_hour"),)): 0.42,
        ("dispatchq_window_resets_at_timestamp_seconds", (("scope", "five_hour"),)): 1700000000.0,
        ("dispatchq_window_usage_reported_at_timestamp_seconds", (("scope", "five_hour"),)): 1.0,
    }
