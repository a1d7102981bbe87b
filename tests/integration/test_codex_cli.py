"""The session tier against the real OpenAI Codex CLI (each supported release, from npm) and a
stand-in OpenAI API, in a pool beside the real Claude Code CLI.

`tests/support/fake_codex.py` prints what we believe `codex exec --json` prints; here the real
CLI (`@openai/codex`, each release of `dispatchq.launcher.codex_releases.RELEASES`, installed
by `python3 ops/dev.py test` under `.cache/codex/<version>/`) is `DISPATCHQ_CODEX_COMMAND`, with
a ChatGPT plan's login, and `dispatchq/testing/openai.py` answers it on 127.0.0.1: a streamed
answer, the service's 429 `usage_limit_reached` body and `x-codex-*` headers while the window is
full, the usage reading `codex app-server` asks for, and an open window after the reset.
What Codex prints is its own, so what is asserted is how dispatchq reads the real thing.

Every case runs on every release (the `real_codex` fixture's parameter, ids `cx0.169.0`, ...).
Where npm cannot be had a release's cases are skipped with the reason; under `CI=true` the
module fails instead.
"""

from __future__ import annotations

import time

import pytest

from dispatchq.pools.credentials import qualify
from dispatchq.pools.spend import spend_periods
from dispatchq.testing.openai import ACCOUNT_ID
from dispatchq.window.limits import GENERAL_SCOPE
from tests.support.pool_config import PRICED_CODEX_KIND, write_pool
from tests.support.real_client import refuse_a_missing_cli_under_ci, skip_unless_ready
from tests.support.real_codex import CodexHarness, refuse_a_missing_codex_under_ci

refuse_a_missing_codex_under_ci()
refuse_a_missing_cli_under_ci()  # the pool's case runs the newest Claude Code beside Codex

pytestmark = [pytest.mark.slow]

CODEX_KINDS = """
  both:
    session:
      prompt: "Answer {{ target }}"
      backends: [codex, claude]
      prompts:
        codex: "Codex, answer {{ target }}"
"""


def _codex_pool(real: CodexHarness, *, claude: bool = False, concurrency: int = 1) -> str:
    """A pool whose first credential is a ChatGPT plan on Codex (so a kind naming no backend
    runs on Codex), with a Claude Code subscription after it when `claude`; the plan's token."""
    login, token = real.plan_login("codex-plus.json")
    credentials = f"codex-plus:\n  backend: codex\n  auth_file: {login}\n  concurrency: {concurrency}\n"
    if claude:
        team = real.tmp / "secrets" / "team-a"
        team.write_text("tok-A\n")
        team.chmod(0o600)
        credentials += f"team-a:\n  token_file: {team}\n"
    write_pool(real, credentials, kinds_extra=CODEX_KINDS if claude else "")
    return token


# --- an answer ------------------------------------------------------------------------------------
def test_the_real_codex_answers_a_judgement_on_a_plan_login(real_codex: CodexHarness) -> None:
    real = real_codex
    token = _codex_pool(real)
    real.openai.answer("forty-two")
    jid = real.enqueue("ask", "the question")
    done = real.cli("worker", "session", "--burst")
    assert done.returncode == 0, done.stdout + done.stderr
    record = real.record(jid)
    assert record.status == "answered", (record.reason, done.stderr[-3000:], real.openai.paths())
    assert record.value == "forty-two"  # the final agent message
    assert real.spawns() == 1
    (sent,) = real.codex_runs()
    # The plan's login, as the session's own auth.json gave it: its token and its account.
    assert sent.credential == token
    assert sent.headers.get("chatgpt-account-id") == ACCOUNT_ID
    assert "the question" in str(sent.body)
    # Its WebSocket first, refused once with 426, then the answer over HTTPS at once: one
    # handshake, no reconnects (a session that could not set up TLS sends none at all).
    handshakes = [s for s in real.openai.seen if s.websocket]
    assert len(handshakes) == 1, real.openai.paths()
    assert real.claude_runs() == 0
    real.figure(f"codex {real.codex_version}: answer", 1, spawns=1)


# --- a usage limit: one spawn, none until the stated reset, one probe, then the answers -----------
@pytest.mark.parametrize("where", ["https", "websocket"])
def test_a_real_codex_limit_closes_its_window_at_the_reset_then_one_probe(
    real_codex: CodexHarness, where: str
) -> None:
    """`where` the service refuses: the HTTPS request (Codex words the limit, to the minute) or
    the WebSocket handshake (0.171.0 says only "exceeded retry limit, last status: 429")."""
    real = real_codex
    token = _codex_pool(real, concurrency=2)  # two slots, two workers: the probe must still go alone
    resets = int(time.time()) + 10
    # The 429 and a full 5-hour window until `resets`, open after.
    real.openai.close_until(resets, on_websocket=where == "websocket")
    # Each answer takes 2 s: a second session started before the probe's answer was in would show.
    real.openai.answer("after the reset", delay=2.0)
    first = real.enqueue("ask", "q0")
    real.scheduler()
    real.workers(2)
    scope = qualify("codex-plus", GENERAL_SCOPE)
    real.wait(lambda: real.marker(scope) is not None, "codex-plus's window to close", timeout=60)
    marker = real.marker(scope)
    assert marker is not None
    # Codex's words give the minute at best ("try again at 12:09 PM."); the app-server's
    # reading, asked after them with the session's login, gives the instant and the window.
    assert int(marker.lifts_at) == resets, (marker, real.openai.paths())
    assert marker.stated == f"resetsAt={resets}"
    assert marker.kind == "five_hour"
    if where == "https":
        assert "usage limit" in marker.message, marker.message
    assert real.openai.usage_requests, real.openai.paths()
    ids = [first, *(real.enqueue("ask", f"q{i}") for i in range(1, 3))]
    real.wait(
        lambda: real.all_status(ids, "waiting") or time.time() >= resets,
        "every judgement to wait behind the marker",
        timeout=30,
    )
    until_lift = real.spawns()
    assert until_lift == 1
    if time.time() < resets - 2:
        assert real.spawns_stay(1, period=1.5) == 1  # nothing is spawned while it is closed
    real.wait(lambda: real.all_status(ids, "answered"), "the reset, one probe, then the rest", timeout=60)
    # The one spawn's refusals, all before the reset: its POST, or its two handshakes (Codex
    # opens a prewarm socket and the turn's, and stops at the 429 without falling back).
    refused = real.openai.refused
    assert all(r.at < resets for r in refused), [r.at - resets for r in refused]
    assert [r.websocket for r in refused] == ([True, True] if where == "websocket" else [False])
    runs = real.codex_runs(token)
    after = [r for r in runs if r.at >= resets]
    assert len(after) == len(runs) - (where == "https") == len(ids), [r.at - resets for r in runs]
    assert real.spawns() == 1 + len(ids)
    # The probe alone first: no other session on the credential until its answer was in.
    assert after[1].at >= real.openai.answered_at[0], [r.at for r in after]
    assert [real.record(jid).value for jid in ids] == ["after the reset"] * len(ids)
    for jid in ids:
        assert real.record(jid).attempts == 0
    assert real.marker(scope) is None
    real.figure(
        f"codex {real.codex_version}: usage limit (five_hour) on {where}, 2 slots and 2 workers",
        len(ids),
        until_lift=until_lift,
        while_closed=0,
        total=real.spawns(),
    )


# --- a pool: Codex closed, the Claude credential answers what allows both --------------------------
def test_while_codex_is_closed_the_claude_credential_answers_what_allows_both(
    real_codex: CodexHarness,
) -> None:
    real = real_codex
    skip_unless_ready(real.version)
    token = _codex_pool(real, claude=True)
    resets = int(time.time()) + 3600
    real.openai.close_until(resets)
    real.api.answer("claude answers")
    first = real.enqueue("both", "first")  # Codex is the pool's first: it is tried there first
    real.workers(1)
    real.wait(
        lambda: real.all_status([first], "answered"), "the first judgement answered on team-a", timeout=60
    )
    scope = qualify("codex-plus", GENERAL_SCOPE)
    marker = real.marker(scope)
    assert marker is not None and marker.closed() and int(marker.lifts_at) == resets
    assert real.marker(qualify("team-a", GENERAL_SCOPE)) is None
    assert real.record(first).value == "claude answers"
    assert any("refused at spawn" in step.why for step in real.record(first).trail)

    more = [real.enqueue("both", f"more-{i}") for i in range(2)]
    only_codex = real.enqueue("ask", "codex only")  # no backends named: the pool's first's, Codex
    real.wait(lambda: real.all_status(more, "answered"), "the rest answered on team-a", timeout=60)
    real.wait(lambda: real.all_status([only_codex], "waiting"), "the Codex-only judgement waiting")
    assert len(real.codex_runs(token)) == 1  # the limit cost one spawn, then none on it
    assert real.claude_runs() == 1 + len(more)
    assert real.spawns() == 1 + 1 + len(more)
    why = real.record(only_codex).reason or ""
    assert "codex-plus closed until" in why, why
    real.figure(
        f"codex {real.codex_version}: a pool, Codex limited, Claude answers both-kinds",
        1 + len(more),
        on_codex=1,
        total=real.spawns(),
    )


# --- a metered key: charged the tokens the real CLI reported -------------------------------------
def test_a_metered_codex_key_is_charged_the_tokens_the_real_cli_reported(real_codex: CodexHarness) -> None:
    real = real_codex
    key = real.tmp / "secrets" / "openai"
    key.parent.mkdir(exist_ok=True)
    key.write_text("sk-metered-0123456789abcdef\n")
    key.chmod(0o600)
    write_pool(
        real,
        f"api:\n  backend: codex\n  api_key_file: {key}\n  spend_cap: {{day: 5.0}}\n",
        kinds_extra=PRICED_CODEX_KIND,
    )
    real.openai.answer("priced")
    jid = real.enqueue("priced", "one")
    # The stand-in reports 2100 input tokens (1800 of them cached) and 40 output tokens.
    done = real.cli("worker", "session", "--burst", DISPATCHQ_CODEX_PRICES='{"house-model": [10, 1, 100]}')
    assert done.returncode == 0, done.stderr[-3000:]
    record = real.record(jid)
    assert record.status == "answered" and record.value == "priced", record.reason
    # The key reached the service as Codex's bearer (it reads CODEX_API_KEY, never OPENAI_API_KEY).
    (sent,) = real.codex_runs()
    assert sent.credential == "sk-metered-0123456789abcdef", sorted(sent.headers)
    assert isinstance(sent.body, dict) and sent.body.get("model") == "house-model"
    assert "chatgpt-account-id" not in sent.headers
    day, _ = real.rt.storage.pool.spent("api", spend_periods(time.time(), real.rt.settings.timezone))
    assert day == pytest.approx((300 * 10 + 1800 * 1 + 40 * 100) / 1_000_000)
