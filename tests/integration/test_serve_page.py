"""The status page, `/status` and `/metrics` over real HTTP, and the page in headless Chromium.

The routes are served by uvicorn on 127.0.0.1 from a small Starlette app made of the three
route lists (`dispatchq serve` wires the same lists into its app). The browser is Debian's
`chromium`, driven by Playwright for Python (never `playwright install`: it would download
a browser build from outside the package registries).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dispatchq.storage import keys
from dispatchq.storage.store import NewRecord
from dispatchq.storage.triage import TriageStorage
from dispatchq.storage.window import WindowStore
from tests.conftest import wait_for

EVIL = "<script>alert(1)</script>"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
WAITING = 25


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def populated(make_runtime: Any, dq_env: dict[str, str]) -> Any:
    """A runtime whose Redis has a marker up, judgements waiting on it, a blocked host and a
    shadow-mode triage decision, with hostile text in a target, an item and an explanation."""
    from dispatchq.queue.retrigger import window_for

    Path(dq_env["DISPATCHQ_CONFIG"]).write_text(
        'kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n'
    )
    rt = make_runtime()
    store = rt.store
    line = keys.session_line()
    entries = [
        NewRecord(
            id=f"page{i:04d}",
            content_key=f"ck-page-{i}",
            force="0",
            line=line,
            input=json.dumps(
                {"kind": "ask", "target": f"o/r#{i}", "item": EVIL if i == 0 else f"comment {i}"}
            ),
            tier="session",
            effect="local",
            host="",
            job="",
            group="",
        )
        for i in range(WAITING)
    ]
    store.create_many(entries)
    store.create_many(
        [
            entries[0]._replace(
                id="evil-target", content_key="ck-evil", input=json.dumps({"kind": "ask", "target": EVIL})
            )
        ]
    )
    window_for(rt).close(datetime.now(UTC) + timedelta(hours=3), reason=f"reserved for a demo {EVIL}")
    WindowStore(rt.redis).block("build-07", f"claude: command not found {EVIL}")

    triage = TriageStorage(rt.redis)
    event = {"event": "issue_comment.created", "target": "o/r#7", "item": EVIL, "context": {}, "state": None}
    triage.save_decision(
        "d" * 16,
        event=event,
        config_hash="c",
        answers={},
        unanswered={},
        over_budget=[],
        answers_from="provider",
        now=time.time(),
    )
    entry = {
        "rule": "needs-repro",
        "action": {"type": "label", "op": "add", "name": "needs-repro"},
        "reason": "shadow_mode",
        "explanation": f"shadow mode: not applied {EVIL}",
        "confidence": 0.93,
        "threshold": 0.9,
        "margin": 0.03,
    }
    triage.save_decision_result("d" * 16, {"suppressed": [entry]})
    triage.push_run(
        {
            "time": time.time(),
            "decision_id": "d" * 16,
            "event": "issue_comment.created",
            "target": "o/r#7",
            "mode": "shadow",
            "requests": 1,
            "counts": {"shadow_mode": 1},
        },
        200,
    )
    return rt


@pytest.fixture
def served(populated: Any) -> Iterator[str]:
    """The three route lists in one Starlette app, served by uvicorn on 127.0.0.1."""
    import uvicorn
    from starlette.applications import Starlette

    from dispatchq.serve import metrics, page, status

    def get_runtime() -> Any:
        return populated

    app = Starlette(
        routes=[*status.routes(get_runtime), *metrics.routes(get_runtime), *page.routes(get_runtime)]
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, what="uvicorn to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, dict(response.headers), response.read()


def test_status_route_is_status_json(served: str, populated: Any) -> None:
    from dispatchq.workers.status import collect_status

    code, headers, body = get(f"{served}/status")
    assert code == 200 and headers["content-type"].startswith("application/json")
    data = json.loads(body)
    expected = json.loads(json.dumps(collect_status(populated), default=str))
    volatile = {"now", "redis_used_memory", "worker_details", "scheduler"}
    assert {k: v for k, v in data.items() if k not in volatile} == {
        k: v for k, v in expected.items() if k not in volatile
    }
    assert data["waiting_by_class"]["window"] == WAITING + 1
    assert data["marker"]["up"] is True


def test_metrics_route_exports_the_window_the_queues_and_the_counters(served: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    code, headers, body = get(f"{served}/metrics")
    assert code == 200 and headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert samples[("dispatchq_window_closed", (("scope", "general"),))] == 1.0
    assert samples[("dispatchq_window_lifts_at_seconds", (("scope", "general"),))] > time.time() + 3600
    assert samples[("dispatchq_waiting", (("reason_class", "window"),))] == WAITING + 1
    assert samples[("dispatchq_waiting", (("reason_class", "host_blocked"),))] == 0
    assert samples[("dispatchq_judgements", (("status", "waiting"), ("tier", "session")))] == WAITING + 1
    assert samples[("dispatchq_workers", (("tier", "session"),))] == 0
    assert samples[("dispatchq_host_blocked", (("host", "build-07"),))] == 1
    assert samples[("dispatchq_triage_outcomes_total", (("row", "shadow_mode"),))] == 1
    for name in (
        "dispatchq_sessions_spawned_total",
        "dispatchq_sessions_refused_at_spawn_total",
        "dispatchq_sessions_avoided_total",
        "dispatchq_typed_requests_total",
    ):
        assert samples[(name, ())] == 0


def chromium_or_skip() -> str:
    chromium = shutil.which("chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        chromium = None
    if chromium is None:
        reason = (
            "SKIPPED LOUDLY: the status page test needs Debian's `chromium` and Playwright for Python "
            "(`apt-get install -y --no-install-recommends chromium`; `python3 ops/dev.py test` installs it)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason.replace("SKIPPED LOUDLY", "CI=true"))
        pytest.skip(reason)
    return chromium


def test_the_page_in_headless_chromium(served: str, tmp_path: Path) -> None:
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    dialogs: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(served + "/")
            page.wait_for_selector("#scopes .countdown")

            # The scope: reserved by an operator, the lift in local time, a live countdown.
            row = page.locator("#scopes tbody tr").first
            assert row.locator("td").nth(0).inner_text() == "general"
            assert row.locator("td").nth(1).inner_text().lower() == "reserved"
            first = page.locator("#scopes .countdown").first.inner_text()
            assert first.startswith(("2h", "3h"))
            page.wait_for_function(
                "t => document.querySelector('#scopes .countdown').textContent !== t",
                arg=first,
                timeout=15_000,
            )
            assert page.locator("#scopes .countdown").first.inner_text() != first

            # The tables: tiers, what waits and why, a sample, the latest, blocked hosts, triage.
            tiers = page.locator("#tiers tbody tr")
            assert tiers.count() == 3
            session = page.locator("#tiers tbody tr", has_text="session")
            assert session.locator("td").nth(4).inner_text() == str(WAITING + 1)
            classes = page.locator("#waiting-classes tbody").inner_text()
            assert "window" in classes and str(WAITING + 1) in classes
            assert "usage window closed until" in page.locator("#waiting-reasons").inner_text()
            assert page.locator("#waiting-sample tbody tr").count() == 10
            assert page.locator("#latest tbody tr").count() == 10
            assert "build-07" in page.locator("#hosts").inner_text()
            suppressed = page.locator("#suppressed tbody tr").first.inner_text()
            assert "needs-repro" in suppressed and "shadow_mode" in suppressed and "0.93" in suppressed

            # Hostile text is shown as text: present verbatim, never a script, no dialog.
            for table in ("#latest", "#hosts", "#suppressed", "#scopes"):
                assert EVIL in page.locator(table).inner_text(), table
                assert page.locator(f"{table} script").count() == 0
            assert dialogs == []
            shot = tmp_path / "status-page.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            print(f"screenshot: {shot}")
        finally:
            browser.close()


def test_the_page_forbids_inline_script_and_other_origins(served: str) -> None:
    code, headers, body = get(f"{served}/")
    assert code == 200 and b"static/page.js" in body
    policy = headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert headers["x-content-type-options"] == "nosniff"
    assert b"http://" not in body and b"https://" not in body  # no external asset
    code, _, script = get(f"{served}/static/page.js")
    assert code == 200 and b"innerHTML" not in script
