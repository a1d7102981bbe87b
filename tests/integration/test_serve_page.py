"""The status page, `/status` and `/metrics` over real HTTP, and the page in headless Chromium.

The routes are served by uvicorn on 127.0.0.1 from a small Starlette app made of the three
route lists (`dispatchq serve` wires the same lists into its app). The browser is Debian's
`chromium`, driven by Playwright for Python (never `playwright install`: it would download
a browser build from outside the package registries).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from dispatchq.storage.window import WindowStore
from tests.support.helpers import wait_for
from tests.support.page import CHROMIUM_ARGS, EVIL, PAGE_TOKEN, WAITING, chromium_or_skip
from tests.support.serve import request


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, dict(response.headers), response.read()


def test_status_route_is_status_json(page_served: str, page_populated: Any) -> None:
    from dispatchq.workers.status import collect_status

    code, headers, body = get(f"{page_served}/status")
    assert code == 200 and headers["content-type"].startswith("application/json")
    data = json.loads(body)
    expected = json.loads(json.dumps(collect_status(page_populated).as_json()))
    volatile = {"now", "redis_used_memory", "worker_details", "scheduler"}
    assert {k: v for k, v in data.items() if k not in volatile} == {
        k: v for k, v in expected.items() if k not in volatile
    }
    assert data["waiting_by_class"]["window"] == WAITING + 1
    assert data["marker"]["up"] is True


def test_metrics_route_exports_the_window_the_queues_and_the_counters(page_served: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    code, headers, body = get(f"{page_served}/metrics")
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


def test_the_page_in_headless_chromium(page_served: str, tmp_path: Path) -> None:
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    dialogs: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(page_served + "/")
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
            # The pool (the environment's one credential) and the backlog's drain, no rate measured yet.
            pool = page.locator("#pool tbody tr")
            assert pool.count() == 1 and pool.first.locator("td").nth(0).inner_text() == "default"
            assert page.locator("#backlog").inner_text() == (
                f"Session backlog: {WAITING + 1} waiting: no estimate yet (no session rate measured)"
            )
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


def test_the_page_forbids_inline_script_and_other_origins(page_served: str) -> None:
    code, headers, body = get(f"{page_served}/")
    assert code == 200 and b"static/page.js" in body
    policy = headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert headers["x-content-type-options"] == "nosniff"
    assert b"http://" not in body and b"https://" not in body  # no external asset
    code, _, script = get(f"{page_served}/static/page.js")
    assert code == 200 and b"innerHTML" not in script


# --- the page as a place to act from (a real `dispatchq serve` with a token) ------------------

WARNING = {"id": "scheduler-down", "text": f"scheduler down {EVIL}", "hint": "start it: dispatchq scheduler"}


def row_of(page: Any, table: str, jid: str) -> Any:
    return page.locator(f"#{table} tbody tr", has=page.locator(f'a.jid[title="{jid}"]'))


def acted(page: Any, text: str, ok: bool = True) -> str:
    """Wait for the action's outcome line to say `text`; return it."""
    selector = "#action-result.ok" if ok else "#action-result.bad"
    page.wait_for_function(
        "([s, t]) => (document.querySelector(s) || {}).textContent?.includes(t)", arg=[selector, text]
    )
    return str(page.locator("#action-result").inner_text())


def with_warnings(route: Any) -> None:
    """`/status` as the server answered it, with one red fact added (the `truth` branch's list)."""
    response = route.fetch()
    data = response.json()
    data["warnings"] = [WARNING]
    route.fulfill(response=response, json=data)


def test_the_page_acts_in_chromium(page_acting: Any, page_populated: Any, tmp_path: Path) -> None:
    chromium = chromium_or_skip()
    import hashlib
    import hmac

    from playwright.sync_api import sync_playwright

    from dispatchq.tiers.session_logs import session_log_path

    base = f"http://127.0.0.1:{page_acting.port}"
    store = page_populated.storage.records
    dialogs: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 2200})
            page = context.new_page()
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.route("**/status", with_warnings)
            # The login form, submitted in the browser (its own CSP lets it post to /login).
            page.goto(base + "/")
            page.fill("input[name=token]", PAGE_TOKEN)
            page.on("pageerror", lambda e: dialogs.append(f"page error: {e}"))
            page.click("button[type=submit]")
            page.wait_for_selector("#scopes .countdown")
            page.wait_for_selector("#history svg")

            # The write cookie: HttpOnly (the script sees no cookie), Strict, a "write" HMAC, 15 min.
            assert page.evaluate("document.cookie") == ""
            cookies = {c["name"]: c for c in context.cookies()}
            write = cookies["dispatchq_write"]
            assert write["httpOnly"] and write["sameSite"] == "Strict"
            assert PAGE_TOKEN not in write["value"] and PAGE_TOKEN not in json.dumps(list(cookies.values()))
            expires_text, login_id, mac = write["value"].split(".")
            label = f"dispatchq write page cookie v2:{expires_text}.{login_id}".encode()
            assert hmac.compare_digest(mac, hmac.new(PAGE_TOKEN.encode(), label, hashlib.sha256).hexdigest())
            assert 14 * 60 <= int(expires_text) - time.time() <= 15 * 60
            assert abs(write["expires"] - int(expires_text)) <= 2

            # The header: the full summary, red facts with their hint, the favicon, one date format.
            summary = page.locator("#summary").inner_text()
            for part in (
                "answered by code",
                "answered by typed",
                "answered by session",
                "failed",
                "needs-triage",
                "cancelled",
                f"waiting {WAITING + 1}",
            ):
                assert part in summary, (part, summary)
            fact = page.locator("#warnings li").first
            assert EVIL in fact.inner_text() and "start it: dispatchq scheduler" in fact.inner_text()
            assert fact.evaluate("n => getComputedStyle(n).color") == "rgb(180, 35, 24)"
            assert page.locator("#warnings script").count() == 0
            icon = page.locator("link[rel=icon]").get_attribute("href") or ""
            assert icon.startswith("data:image/svg+xml")
            stamp = page.locator("#latest time.stamp").first
            assert (stamp.get_attribute("title") or "").endswith("Z (UTC)")

            # The history: answered bars, closed-window bands, and the 18 unsampled minutes as a gap.
            assert page.locator("#history rect.answered-code").count() >= 20
            assert page.locator("#history rect.closed").count() >= 4
            gaps = page.locator("#history rect.gap")
            titles = [gaps.nth(i).locator("title").text_content() or "" for i in range(gaps.count())]
            assert any("no samples" in t for t in titles), titles
            widths = [float(gaps.nth(i).get_attribute("width") or 0) for i in range(gaps.count())]
            assert any(10 <= w <= 14 for w in widths), widths  # 18 min of 1440 on a 1000-wide axis

            # Retry and cancel from the latest judgements.
            first, second = (page.locator("#latest a.jid").nth(i).get_attribute("title") for i in (0, 1))
            assert first and second
            row_of(page, "latest", first).locator("button", has_text="cancel").click()
            acted(page, f"cancelled {first}")
            assert store.get(first).status == "cancelled"
            row_of(page, "latest", second).locator("button", has_text="retry").click()
            acted(page, f"re-queued {second}")
            assert any(t.why == "retry requested" for t in store.get(second).trail)

            # Unblock the host.
            page.locator("#hosts tbody tr", has_text="build-07").locator("button").click()
            acted(page, "host build-07: sessions unblocked")
            assert not WindowStore(page_populated.redis).blocked_reason("build-07")

            # Window close: a shorter closure is refused without force, then forced; then opened.
            page.fill("#close-until", "1h")
            page.fill("#close-reason", "lunch")
            page.click("#close-window")
            assert "already closed until" in acted(page, "refused (409)", ok=False)
            assert page_populated.window.get("general").lifts_at > time.time() + 2 * 3600
            page.check("#close-force")
            page.click("#close-window")
            acted(page, "window closed until")
            assert 3500 < page_populated.window.get("general").lifts_at - time.time() <= 3600
            page.click("#open-window")
            acted(page, "opened: general")
            assert page_populated.window.get("general") is None
            page.wait_for_function(
                "() => document.querySelector('#audit').textContent.includes('serve 127.0.0.1')"
            )

            # Without the custom header the write cookie writes nothing.
            refused = page.evaluate(
                """async () => (await fetch("actions/window/close", {method: "POST",
                    headers: {"Content-Type": "application/json"}, body: '{"until": "2h"}'})).status"""
            )
            assert refused == 403 and page_populated.window.get("general") is None

            # A page on another site (localhost is another site than 127.0.0.1) cannot write.
            other = context.new_page()
            other.goto(f"http://localhost:{page_acting.port}/login")
            other.evaluate(
                f"""async () => {{ try {{ await fetch("{base}/actions/window/close", {{method: "POST",
                    mode: "no-cors", credentials: "include", headers: {{"Content-Type": "text/plain"}},
                    body: '{{"until": "2h"}}'}}); }} catch (e) {{}} }}"""
            )
            wait_for(
                lambda: " POST /actions/window/close 403" in page_acting.output, what="the refusal logged"
            )
            assert page_populated.window.get("general") is None
            other.close()

            # A judgement's page: its record, trail and session log, linked from the id.
            log = session_log_path(page_populated.settings.data_dir, second)
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(f"claude: something failed {EVIL}\n")
            page.wait_for_selector(f'#latest a.jid[title="{second}"]')
            shot = tmp_path / "page-actions.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot: {shot}")
            page.locator(f'#latest a.jid[title="{second}"]').first.click()
            page.wait_for_selector("#session-log:not([hidden])")
            assert page.url.endswith(f"/judgement/{second}")
            assert EVIL in page.locator("#session-log").inner_text()
            assert "retry requested" in page.locator("#trail").inner_text()
            assert second in page.locator("#record").inner_text()
            assert page.locator("#judgement-actions button").count() >= 1
            judgement_shot = tmp_path / "judgement-page.png"
            page.screenshot(path=str(judgement_shot), full_page=True)
            print(f"screenshot: {judgement_shot}")
            assert shot.stat().st_size > 10_000 and dialogs == []

            # Log out: the form again, and the login's cookie opens nothing any more, anywhere.
            read = cookies["dispatchq_token"]["value"]
            jar = {"Cookie": f"dispatchq_token={read}"}
            assert request(page_acting.port, "GET", "/status", headers=jar).status == 200
            page.goto(base + "/")
            page.click("#logout")
            page.wait_for_selector("input[name=token]")
            assert request(page_acting.port, "GET", "/status", headers=jar).status == 401
        finally:
            browser.close()
