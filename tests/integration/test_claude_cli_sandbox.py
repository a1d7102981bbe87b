"""The real Claude Code CLI inside the session sandbox: it answers, it resumes, it scrubs its tools.

Each supported release of the CLI (the layer's `release` fixture, in
tests/integration/conftest.py, runs every case once per release; under `CI=true` a missing
CLI fails this module's import) runs as the session command of a
real `dispatchq worker session` with `DISPATCHQ_SESSION_SANDBOX=on`, against the loopback
Messages API stand-in, which a confined session reaches only through its proxy.

- it answers: the stand-in sees the one credential and the prompt;
- a SIGTERMed session is resumed: the first request is held, the worker is stopped, and the
  next worker's spawn (`--resume <id>`) sends the first prompt back as history, which the CLI
  can only do if it found its transcript in the per-judgement config folder;
- with `CLAUDE_CODE_SUBPROCESS_ENV_SCRUB=1` (`DISPATCHQ_SESSION_SUBPROCESS_SCRUB=on`) the
  CLI's own Bash tool runs `env` and the look-around probe, and what it prints (read from the
  tool_result the CLI sends back to the stand-in) holds no credential.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from dispatchq.launcher.releases import OLDEST
from dispatchq.testing.anthropic import Reply
from tests.support.helpers import REPO
from tests.support.real_client import RealHarness, refuse_a_missing_cli_under_ci

# Under CI=true a release that cannot run there fails this import; the `release` fixture
# skips, with the reason, a release that cannot run here otherwise.
pytestmark = [pytest.mark.slow]
refuse_a_missing_cli_under_ci()

PROBE = REPO / "tests" / "support" / "look_around.py"
TOOLED = """
  tooled:
    session:
      prompt: "Answer {{ target }}"
      args: ["--allowedTools", "Bash"]
"""


def test_the_real_cli_answers_inside_the_sandbox(confined: RealHarness) -> None:
    confined.api.answer("confined answer")
    jid = confined.enqueue("ask", "the confined question")
    done = confined.cli("worker", "session", "--burst")
    assert done.returncode == 0, done.stderr[-3000:]
    record = confined.record(jid)
    assert record.status == "answered", (record.reason, done.stderr[-3000:])
    assert record.value == "confined answer"
    assert "sandbox" not in (record.reason or "")
    sent = confined.api.message_requests
    assert len(sent) == 1, [s.path for s in confined.api.seen]
    assert sent[0].headers.get("authorization") == "Bearer stand-in-token"
    assert "the confined question" in json.dumps(sent[0].body)


def test_a_sigtermed_real_session_is_resumed_inside_the_sandbox(confined: RealHarness) -> None:
    gate = threading.Event()
    confined.api.push(Reply.held(gate, "too late"))
    confined.api.answer("resumed answer")
    jid = confined.enqueue("ask", "remember the marmot")
    try:
        (worker,) = confined.workers(1)
        confined.wait(lambda: confined.api.message_requests, "the first request to arrive", timeout=90)
        # A cold stop (the unit's stop, or a second SIGTERM) ends the session mid-request.
        worker.send_signal(signal.SIGTERM)
        confined.wait(lambda: _stopping(confined), "the worker to begin its warm stop", timeout=10)
        time.sleep(1.5)  # RQ ignores a second signal within 1 s of the first (a pool's duplicate)
        worker.send_signal(signal.SIGTERM)
        # Bounded, not timed: the whole suite on two cores has stalled a cold stop past a minute.
        assert worker.wait(timeout=150) is not None
        confined.wait(
            lambda: confined.record(jid).status in ("queued", "waiting"),
            "the judgement to go back",
            timeout=30,
        )
    finally:
        gate.set()
    resume = getattr(confined.record(jid), "resume_session", None)
    assert resume, (confined.record(jid).trail, confined.logs())
    done = confined.cli("worker", "session", "--burst")
    assert done.returncode == 0, done.stderr[-3000:]
    record = confined.record(jid)
    assert record.status == "answered", (record.reason, [s.why for s in record.trail], done.stderr[-3000:])
    assert record.value == "resumed answer"
    assert not any("starting a fresh session" in step.why for step in record.trail), record.trail
    second = confined.api.message_requests[-1]
    history = second.body.get("messages", []) if isinstance(second.body, dict) else []
    # The resumed session carries the first turn (read from its transcript) before the new one.
    assert len(history) >= 2 and "remember the marmot" in json.dumps(history[0]), history


def _stopping(real: RealHarness) -> bool:
    """The worker logged its warm stop (RQ says so), so a second SIGTERM is a cold one."""
    return any(
        "shut down" in log.read_text(errors="replace").lower() for _, log in real.procs if log.exists()
    )


def _tool_python(real: RealHarness) -> str:
    """A python the CLI's Bash tool can start inside the sandbox: the system's, else ours bound."""
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system:
        return system
    prefix = Path(sys.base_prefix)
    binds = [b for b in real.env.get("DISPATCHQ_SESSION_SANDBOX_BIND", "").split(",") if b]
    real.env["DISPATCHQ_SESSION_SANDBOX_BIND"] = ",".join([*binds, str(prefix)])
    return str(prefix / "bin" / "python3")


def test_the_real_clis_own_tool_subprocess_sees_no_credential_inside_the_sandbox(
    confined: RealHarness, request: pytest.FixtureRequest
) -> None:
    if confined.version != OLDEST:
        # Its tool sandbox mounts a fresh /proc, which dispatchq's sandbox refuses
        # (`bwrap: Can't mount proc on /newroot/proc: Operation not permitted`); the nested
        # check (`bwrap --ro-bind / / true`) does not try --proc, so scrub `on` still starts.
        request.node.add_marker(
            pytest.mark.xfail(reason=f"Claude Code {confined.version}: nested bwrap --proc", strict=True)
        )
    confined.add_kinds(TOOLED)
    probe_dir = confined.tmp / "probe"
    probe_dir.mkdir()
    shutil.copy2(PROBE, probe_dir / PROBE.name)
    confined.env["DISPATCHQ_SESSION_SANDBOX_BIND"] = str(probe_dir)
    python = _tool_python(confined)
    context = probe_dir / "context.json"
    context.write_text(json.dumps({"credential": "CLAUDE_CODE_OAUTH_TOKEN", "walk_seconds": 2}))
    command = f"env; echo ---PROBE---; {python} -I {probe_dir / PROBE.name} --plain --context-file {context}"
    confined.api.tool_call("Bash", {"command": command, "description": "look around"}, then="looked")
    jid = confined.enqueue("tooled", "look around")
    done = confined.cli("worker", "session", "--burst", DISPATCHQ_SESSION_SUBPROCESS_SCRUB="on")
    assert done.returncode == 0, done.stderr[-3000:]
    record = confined.record(jid)
    assert record.status == "answered", (record.reason, done.stderr[-3000:])
    assert record.value == "looked"
    results = [text for seen in confined.api.message_requests for text in seen.tool_results]
    assert len(results) == 1, results
    printed = results[0]
    env_part, _, probe_part = printed.partition("---PROBE---")
    assert "PATH=" in env_part, printed[:2000]  # the tool really ran `env`
    assert "CLAUDE_CODE_OAUTH_TOKEN" not in env_part and "stand-in-token" not in printed, printed[:4000]
    report = json.loads(probe_part.strip())
    assert report["info"]["environment"]["credential_present"] is False, report
    # The CLI's own tool sandbox gives its tools egress proxies (sockets in the private /tmp, a
    # loopback port): the probe counts them only if they relay a forbidden target.
    counts = report["counts"]
    assert counts == dict.fromkeys(counts, 0), json.dumps(report["findings"])[:4000]
    assert report["info"].get("restricted_proxies"), report["info"]
