"""The session tier against the real Claude Code CLI (pinned, from npm) and a stand-in Messages API.

`tests/fake_claude.py` prints what we believe Claude Code prints; here the real CLI
(`@anthropic-ai/claude-code`, installed by `python3 ops/dev.py test` under `.cache/claude-code`)
is the session command, exactly as a user configures it, and `tests/fakes/anthropic_api.py`
answers its API calls on 127.0.0.1. What the CLI then prints (events, result text, stderr) is
the CLI's own, so what is asserted is how dispatchq reads the real thing: one spawn for a
limit hit and none until the lift, no marker for a throttle, a paid answer kept.

Where npm cannot be had the layer is skipped with the reason; under `CI=true` it fails instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatchq import keys
from dispatchq.processes import set_runtime
from dispatchq.window.limits import GENERAL_SCOPE
from tests.conftest import REPO
from tests.fakes.anthropic_api import FakeAnthropicAPI, Reply
from tests.integration.test_session_tier import Harness, iso_epoch

CLAUDE = REPO / ".cache" / "claude-code" / "node_modules" / ".bin" / "claude"
VERSION = "2.1.197"


def _claude_ready() -> str | None:
    """None when the pinned CLI runs here, else why not."""
    if not sys.platform.startswith("linux"):
        return "the real-client layer runs on Linux"
    if not CLAUDE.exists():
        return f"the real Claude Code CLI is not at {CLAUDE} (`python3 ops/dev.py test` installs it with npm)"
    done = subprocess.run([str(CLAUDE), "--version"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0 or VERSION not in done.stdout:
        printed = done.stdout.strip() or done.stderr.strip()[-200:]
        return f"{CLAUDE} --version printed {printed!r} (want {VERSION})"
    return None


_WHY_NOT = _claude_ready()
if _WHY_NOT is not None and os.environ.get("CI") == "true":
    raise RuntimeError(f"CI=true and the real-client layer cannot run: {_WHY_NOT}")
pytestmark = pytest.mark.skipif(
    _WHY_NOT is not None, reason=f"REAL CLAUDE CODE CLI TESTS SKIPPED: {_WHY_NOT}"
)

COMMAND = f"{CLAUDE} -p --output-format stream-json --verbose"
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None,
    reason="bubblewrap is not installed here (ops/dev.py installs it with apt-get)",
)


class RealHarness(Harness):
    """The session tier's harness with the real CLI as the session command."""

    def __init__(self, env: dict[str, str], tmp: Path, client: Any, api: FakeAnthropicAPI) -> None:
        super().__init__(env, tmp, client)
        home = tmp / "home"
        home.mkdir()
        self.api = api
        self.env.update(
            DISPATCHQ_SESSION_COMMAND=COMMAND,
            ANTHROPIC_BASE_URL=api.url,
            CLAUDE_CODE_OAUTH_TOKEN="stand-in-token",
            DISABLE_TELEMETRY="1",
            DISABLE_ERROR_REPORTING="1",
            DISABLE_AUTOUPDATER="1",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            CLAUDE_CODE_MAX_RETRIES="1",
            HOME=str(home),
            TZ="UTC",
        )

    def spawns(self) -> int:
        """Sessions dispatchq spawned (its own counter: the CLI is not ours to instrument)."""
        return int(self.redis.get(keys.STATS_SESSIONS_SPAWNED) or 0)

    def figure(self, case: str, judgements: int, **counts: int) -> None:
        """For bench/sessions.py: one line of spawn counts per case, when it asks for them."""
        path = os.environ.get("BENCH_SPAWN_FIGURES")
        if path:
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps({"case": case, "judgements": judgements, **counts}) + "\n")


@pytest.fixture
def real(dq_env: dict[str, str], redis_client: Any, tmp_path: Path) -> Iterator[RealHarness]:
    with FakeAnthropicAPI() as api:
        h = RealHarness(dq_env, tmp_path, redis_client, api)
        try:
            yield h
        finally:
            h.close()
            set_runtime(None)


def path_without_bwrap(tmp: Path, path: str) -> str:
    """A PATH with every command of `path` but `bwrap` (symlinks in one folder)."""
    folder = tmp / "no-bwrap-bin"
    folder.mkdir()
    for directory in path.split(os.pathsep):
        if not directory or not Path(directory).is_dir():
            continue
        for entry in Path(directory).iterdir():
            target = folder / entry.name
            if entry.name != "bwrap" and not target.exists():
                target.symlink_to(entry)
    return str(folder)


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


@needs_bwrap
def test_with_bwrap_usable_sessions_get_the_subprocess_scrub_and_still_answer(real: RealHarness) -> None:
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
    done = real.cli("worker", "session", "--burst", PATH=path)
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
    ids = [real.enqueue("ask", f"q{i}") for i in range(3)]
    real.workers(1)
    real.wait(lambda: real.marker() is not None, "the marker to go up", timeout=60)
    marker = real.marker()
    assert marker is not None
    assert marker.stated == f"resetsAt={resets}"  # the instant the CLI reported
    assert marker.lifts_at >= resets  # (a loaded host may spawn after it: then it lifts at once)
    assert marker.kind == "five_hour"
    assert "session limit" in marker.message
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
    assert real.spawns() == 4
    assert len(real.api.message_requests) == 4
    real.figure("usage limit (five_hour)", 3, until_lift=closed, while_closed=0, total=real.spawns())
    assert real.marker(GENERAL_SCOPE) is None
    for jid in ids:
        assert real.record(jid).attempts == 0


# --- a transient throttle: no marker --------------------------------------------------------------
def test_a_real_transient_429_puts_up_no_marker(real: RealHarness) -> None:
    real.api.push(Reply.error(429, "rate_limit_error", "Rate limited"))
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
@needs_bwrap
def test_a_cli_that_refuses_to_start_shows_its_error_line_and_logs_the_rest(real: RealHarness) -> None:
    # Scrubbing is on (bwrap works for the worker) but the session's own PATH has no bwrap: the
    # real CLI exits 1 with ~5 KB of minified source, the message, stack frames and its banner.
    real.env["DISPATCHQ_SESSION_COMMAND"] = f"/usr/bin/env PATH=/nonexistent {COMMAND}"
    jid = real.enqueue("ask", "q")
    done = real.cli("worker", "session", "--burst", DISPATCHQ_SESSION_SUBPROCESS_SCRUB="on")
    assert done.returncode == 0, done.stderr
    record = real.record(jid)
    assert record.reason is not None
    assert "error: bubblewrap is required for subprocess env scrubbing" in record.reason, record.reason
    assert " at " not in record.reason.split("isolation", 1)[0][-40:]
    assert "Bun v" not in record.reason and "$bunfs" not in record.reason and "|" not in record.reason
    shown = json.loads(real.cli("result", jid, "--json").stdout)
    log = Path(shown["session_log"])
    text = log.read_text()
    assert "error: bubblewrap is required" in text and "$bunfs" in text and "Bun v" in text
    assert len(text) > 3000


# --- host-wide failures: one spawn, then none until cleared ---------------------------------------
@pytest.mark.parametrize(
    ("setup", "why"),
    [
        pytest.param({"CLAUDE_CODE_OAUTH_TOKEN": ""}, "Not logged in", id="not-logged-in"),
        pytest.param(
            {"reply": Reply.error(401, "authentication_error", "Invalid bearer token")}, "401", id="401"
        ),
        pytest.param(
            {"reply": Reply.error(403, "permission_error", "OAuth token has been revoked.")},
            "does not have access",
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
    reply = setup.pop("reply", None)
    if reply is not None:
        real.api.default = reply
    real.env.update(setup)
    ids = [real.enqueue("ask", f"q{i}") for i in range(3)]
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
    assert real.spawns() == 4
    real.figure(f"host-wide: {why}", 3, until_cleared=blocked_after, total=real.spawns())


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
    real.rt.store.set_fields(jid, resume_session="0f0e5c0e-8a0b-4c9e-9d51-2f6f0c4c1a11")
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
    fables = [real.enqueue("fable", f"f{i}") for i in range(3)]
    other = real.enqueue("sonnet", "s")
    for _ in range(2):  # a second burst: still nothing spawned for the paused model
        done = real.cli("worker", "session", "--burst")
        assert done.returncode == 0, done.stderr
    assert real.spawns() == 2
    marker = real.marker("model:fable")
    assert marker is not None and marker.closed() and marker.lifts_at == resets
    assert real.marker() is None  # the general window stays open
    assert real.all_status(fables, "waiting")
    assert real.record(other).status == "answered"
    real.figure("model's own weekly limit (Fable)", 3, until_lift=real.spawns() - 1, while_closed=0)


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
