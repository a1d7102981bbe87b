"""A pool of a Claude Code credential and a Codex one: real `dispatchq worker session` processes,
the fake `claude` and the fake `codex exec --json` (tests/support/fake_codex.py).

A kind that allows both backends is answered by whichever has room; a kind that names none runs
on the pool's first credential's backend only; a Codex limit, stated only in words and read in
the host's zone, closes that Codex credential's window until the stated minute while the Claude
credential keeps answering. The Codex session gets its own prompt, its login as `auth.json` in
its own `CODEX_HOME`, and no credential variable at all.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from dispatchq.pools.credentials import qualify
from dispatchq.pools.spend import spend_periods
from dispatchq.window.limits import GENERAL_SCOPE
from dispatchq.window.pooling import usage_of
from tests.support.helpers import REPO
from tests.support.pool_config import PRICED_CODEX_KIND, secret_file, write_pool
from tests.support.session import Harness

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")

FAKE_CODEX = REPO / "tests" / "support" / "fake_codex.py"
CODEX_COMMAND = f"{sys.executable} {FAKE_CODEX}"
PLAN_LOGIN = "auth:plan-b"


def _claude_and_codex(harness: Harness) -> None:
    team = secret_file(harness, "team-a", "tok-A")
    login = secret_file(
        harness, "codex-b.json", json.dumps({"account": "plan-b", "tokens": {"access_token": "x"}})
    )
    write_pool(
        harness,
        f"""
        team-a:
          token_file: {team}
        codex-b:
          backend: codex
          auth_file: {login}
        """,
        kinds_extra="""
          both:
            session:
              prompt: "Answer {{ target }}"
              backends: [claude, codex]
              prompts:
                codex: "Codex, answer {{ target }}"
        """,
    )


def test_a_kind_for_both_backends_runs_on_codex_when_claude_is_closed(harness: Harness) -> None:
    _claude_and_codex(harness)
    record = harness.tmp / "codex-runs.jsonl"
    harness.plan({"credential": PLAN_LOGIN, "answer": "yes from codex", "record": str(record)})
    closed = harness.cli("window", "close", "--until", "2h", "--credential", "team-a", "--reason", "test")
    assert closed.returncode == 0, closed.stderr
    harness.workers(1, DISPATCHQ_CODEX_COMMAND=CODEX_COMMAND)

    both = harness.enqueue("both", "first")
    plain = harness.enqueue("ask", "plain")
    harness.wait(lambda: harness.statuses([both]) == ["answered"], "the both-kind answered on codex")
    assert harness.record(both).value == "yes from codex"
    assert harness.spawns_on(PLAN_LOGIN) == 1 and harness.spawns_on("tok-A") == 0
    # A kind naming no backend runs on the pool's first credential's (claude's) only: it waits.
    harness.wait(lambda: harness.statuses([plain]) == ["waiting"], "the plain kind waiting for team-a")
    assert harness.spawns_stay(1) == 1
    why = harness.record(plain).reason or ""
    assert "team-a closed until" in why, why

    (run,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert run["prompt"].startswith("Codex, answer ") and "\nfirst\n" in run["prompt"]  # framed target
    assert run["argv"][:2] == ["exec", "--json"] and run["argv"][-1] == "-"
    assert run["files"] == ["auth.json"]
    secret_shaped = {"OPENAI_API_KEY", "CODEX_API_KEY", "CODEX_AUTH_JSON", "CLAUDE_CODE_OAUTH_TOKEN"}
    assert not secret_shaped & set(run["env"])


def test_a_codex_limit_closes_only_that_credential_at_the_stated_minute(harness: Harness) -> None:
    _claude_and_codex(harness)
    # Codex states the minute in the host's zone (UTC here): the lift is that minute.
    resets = (int(time.time()) // 60 + 90) * 60
    harness.plan({"credential": PLAN_LOGIN, "scenario": "limit", "resets_at": resets})
    closed = harness.cli("window", "close", "--until", "2s", "--credential", "team-a", "--reason", "test")
    assert closed.returncode == 0, closed.stderr
    harness.scheduler()
    harness.workers(1, DISPATCHQ_CODEX_COMMAND=CODEX_COMMAND)

    first = harness.enqueue("both", "first")
    scope = qualify("codex-b", GENERAL_SCOPE)
    harness.wait(lambda: harness.marker(scope) is not None, "codex-b's window closed by its limit")
    marker = harness.marker(scope)
    assert marker is not None and marker.closed() and int(marker.lifts_at) == resets
    harness.wait(
        lambda: harness.statuses([first]) == ["answered"], "the judgement answered on team-a", timeout=30
    )

    more = [harness.enqueue("both", f"more-{i}") for i in range(3)]
    harness.wait(lambda: harness.all_status(more, "answered"), "the rest answered on team-a")
    assert harness.spawns_on(PLAN_LOGIN) == 1  # the limit cost one spawn, then none until the lift
    assert harness.spawns_on("tok-A") == 4
    assert (scope, float(resets)) in harness.retriggers()


def test_a_metered_codex_run_is_charged_its_tokens_at_the_operators_price(harness: Harness) -> None:
    key = secret_file(harness, "openai", "sk-metered-0123456789abcdef")
    write_pool(
        harness,
        f"""
        api:
          backend: codex
          api_key_file: {key}
          spend_cap: {{day: 5.0}}
        """,
        kinds_extra=PRICED_CODEX_KIND,
    )
    harness.plan({"credential": "sk-metered-0123456789abcdef", "answer": "priced"})
    # The fake reports 2100 input tokens (1800 cached) and 40 output tokens.
    harness.workers(
        1, DISPATCHQ_CODEX_COMMAND=CODEX_COMMAND, DISPATCHQ_CODEX_PRICES='{"house-model": [10, 1, 100]}'
    )
    jid = harness.enqueue("priced", "one")
    harness.wait(lambda: harness.statuses([jid]) == ["answered"], "the metered judgement answered")
    day, _ = harness.rt.storage.pool.spent("api", spend_periods(time.time(), harness.rt.settings.timezone))
    assert day == pytest.approx((300 * 10 + 1800 * 1 + 40 * 100) / 1_000_000)
    (entry,) = [e for e in harness.record(jid).trail if e.outcome == "answered"]
    assert entry.cost_usd == pytest.approx(day)


def test_the_app_servers_windows_win_over_a_limit_in_words(harness: Harness) -> None:
    _claude_and_codex(harness)
    # The words state no time; the app-server's reading says the 5-hour window is full until then.
    resets = int(time.time()) + 5400
    reading = harness.tmp / "rate-limits.json"
    full = {"usedPercent": 100, "windowDurationMins": 300, "resetsAt": resets}
    reading.write_text(json.dumps({"rateLimits": {"limitId": "codex", "primary": full}}))
    served = harness.tmp / "app-server.log"
    harness.plan({"credential": PLAN_LOGIN, "scenario": "limit_later"})
    closed = harness.cli("window", "close", "--until", "2s", "--credential", "team-a", "--reason", "test")
    assert closed.returncode == 0, closed.stderr
    harness.workers(
        1,
        DISPATCHQ_CODEX_COMMAND=CODEX_COMMAND,
        FAKE_CLAUDE_RATE_LIMITS=str(reading),
        FAKE_CLAUDE_APPSERVER_LOG=str(served),
    )
    first = harness.enqueue("both", "first")
    scope = qualify("codex-b", GENERAL_SCOPE)
    harness.wait(lambda: harness.marker(scope) is not None, "codex-b's window closed")
    marker = harness.marker(scope)
    assert marker is not None and int(marker.lifts_at) == resets
    assert marker.kind == "five_hour"
    # Asked once, with the session's own login.
    assert served.read_text().split()[1:] == ["rateLimits", PLAN_LOGIN]
    # The reading's windows are kept as the credential's use, for status and pacing.
    used = {u.window: u.utilization for u in usage_of(harness.rt.storage.usage.read(), "codex-b")}
    assert used == {"five_hour": 1.0}
    harness.wait(lambda: harness.statuses([first]) == ["answered"], "the judgement answered on team-a")


def test_a_login_the_session_renewed_is_carried_back_and_another_accounts_is_not(harness: Harness) -> None:
    given = {"account": "plan-c", "tokens": {"account_id": "acct-c", "refresh_token": "rt-1"}}
    login = secret_file(harness, "codex-c.json", json.dumps(given))
    write_pool(
        harness,
        f"""
        codex-c:
          backend: codex
          auth_file: {login}
        """,
        kinds_extra="""
          onlycodex:
            session:
              prompt: "Answer {{ target }}"
              backends: [codex]
        """,
    )
    renewed = {"tokens": {"refresh_token": "rt-2"}, "last_refresh": "2026-12-05T12:00:00+00:00"}
    # A login of another account left in CODEX_HOME (what a hostile session could write there).
    swapped = {"tokens": {"account_id": "acct-evil", "refresh_token": "rt-evil"}}
    harness.plan({"answer": "one", "renew": renewed}, {"answer": "two", "renew": swapped})
    harness.workers(1, DISPATCHQ_CODEX_COMMAND=CODEX_COMMAND)

    first = harness.enqueue("onlycodex", "first")
    harness.wait(lambda: harness.statuses([first]) == ["answered"], "the first answered")
    carried = json.loads(login.read_text())
    assert carried["tokens"] == {"account_id": "acct-c", "refresh_token": "rt-2"}
    assert carried["last_refresh"] == renewed["last_refresh"]
    assert login.stat().st_mode & 0o777 == 0o600

    second = harness.enqueue("onlycodex", "second")
    harness.wait(lambda: harness.statuses([second]) == ["answered"], "the second answered")
    assert json.loads(login.read_text()) == carried  # the other account's login stayed behind


def test_a_host_without_the_codex_command_answers_on_claude_and_stays_unblocked(harness: Harness) -> None:
    team = secret_file(harness, "team-a", "tok-A")
    login = secret_file(harness, "codex-b.json", json.dumps({"account": "plan-b", "tokens": {}}))
    # Codex is preferred (order 0 before 1): a host that tried it would find no command.
    write_pool(
        harness,
        f"""
        team-a:
          token_file: {team}
          order: 1
        codex-b:
          backend: codex
          auth_file: {login}
          order: 0
        """,
        kinds_extra="""
          both:
            session:
              prompt: "Answer {{ target }}"
              backends: [claude, codex]
          onlycodex:
            session:
              prompt: "Answer {{ target }}"
              backends: [codex]
        """,
    )
    harness.plan({"answer": "from claude"}, {"answer": "from claude"})
    harness.workers(1, DISPATCHQ_CODEX_COMMAND=str(harness.tmp / "no-such-codex"))

    both = harness.enqueue("both", "routed")
    codex_only = harness.enqueue("onlycodex", "waits")
    plain = harness.enqueue("ask", "plain")
    harness.wait(lambda: harness.statuses([both, plain]) == ["answered"] * 2, "both answered on claude")
    assert harness.spawns_on("tok-A") == 2
    harness.wait(lambda: harness.statuses([codex_only]) == ["waiting"], "the codex-only kind waiting")
    why = harness.record(codex_only).reason or ""
    assert "codex sessions cannot start on host" in why and "not found on PATH" in why, why
    assert harness.rt.window.store.blocked_reason(harness.rt.settings.host) is None  # the host runs on
