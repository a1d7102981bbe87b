"""Fail fast, tell the truth: a misconfigured session host says so, and nothing is charged for it.

Real worker processes and real files: a session command that is not installed is a WARNING at
start and a `status` warning; a credential file deleted while the worker runs blocks the host
with the reason (the judgement waits uncharged, no spawn, no death), and once it is back the
judgement is answered. The warnings' rules are tested as a pure function first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatchq.core.status import Status
from dispatchq.settings import load_settings
from dispatchq.storage.histograms import read_histograms
from dispatchq.storage.store import Store
from dispatchq.tiers.confine import credential_problem, spawn_refusal
from dispatchq.tiers.preflight import COMMAND_HINT, resolve_session_command
from dispatchq.workers.warnings import collect_warnings as collect_typed
from tests.support.helpers import run_cli, wait_for, write_config
from tests.support.truth import Procs

FAKE_CLAUDE = Path(__file__).resolve().parents[1] / "support" / "fake_claude.py"
FAKE_ARGS = "-p --output-format stream-json --verbose"
SESSION_CONFIG = 'kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n'
HOST = "truth-host"


# --- the warnings, from status's data ------------------------------------------------------------
def collect_warnings(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The warnings for a part of `status`'s document, as the document carries them."""
    return [w.model_dump() for w in collect_typed(Status.model_validate(data))]


def _ids(data: dict[str, Any]) -> list[str]:
    return [w["id"] for w in collect_warnings(data)]


def test_a_healthy_status_has_no_warnings() -> None:
    data = {
        "queues": {"code": 3, "typed": 0, "session": 1},
        "workers": {"code": 1, "typed": 0, "session": 1},
        "scheduler": {"alive": True},
        "typed": {"keyless": False},
        "worker_details": [{"tier": "session", "host": "a", "session_command_found": True, "sandbox": "on"}],
        "sessions": {"blocked": {}},
    }
    assert collect_warnings(data) == []


def test_each_fact_that_stops_work_is_one_warning_with_a_hint() -> None:
    data = {
        "queues": {"code": 0, "typed": 2, "session": 1},
        "workers": {"code": 0, "typed": 0, "session": 2},
        "scheduler": {"alive": False},
        "typed": {"keyless": True},
        "worker_details": [
            {"tier": "session", "host": "b", "session_command_found": False, "sandbox": "off"},
            {"tier": "session", "host": "b", "session_command_found": False, "sandbox": "off"},
            {"tier": "code", "host": "b", "session_command_found": False},  # a code worker spawns none
        ],
        "sessions": {"blocked": {"b": "session command 'claude' not found"}},
    }
    got = collect_warnings(data)
    assert [w["id"] for w in got] == [
        "queued_no_worker:typed",
        "scheduler_down",
        "host_blocked:b",
        "session_command_missing:b",
        "unconfined:b",
        "keyless",
    ]
    assert all(set(w) == {"id", "text", "hint"} and w["text"] and w["hint"] for w in got)
    assert "dispatchq worker typed" in got[0]["hint"]
    assert "not found" in got[2]["text"] and "window open --host b" in got[2]["hint"]
    assert got[3]["hint"] == COMMAND_HINT


def test_a_session_line_without_a_session_worker_is_named() -> None:
    data = {"queues": {"session": 4}, "workers": {}, "scheduler": {"alive": True}}
    (warning,) = collect_warnings(data)
    assert warning["id"] == "queued_no_worker:session"
    assert "dispatchq worker session" in warning["hint"]


# --- the session command and the credential, resolved -------------------------------------------
def test_the_session_command_resolves_on_path_or_as_a_path(tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "claude"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    env = {"PATH": str(tool.parent)}
    found = resolve_session_command(load_settings({}, session_command="claude -p"), env)
    assert found.found and found.path == str(tool) and found.problem is None
    by_path = resolve_session_command(load_settings({}, session_command=f"{tool} -p"), {"PATH": "/nowhere"})
    assert by_path.found
    missing = resolve_session_command(load_settings({}, session_command="claude -p"), {"PATH": "/nowhere"})
    assert not missing.found
    assert missing.problem is not None and "'claude'" in missing.problem
    assert "npm install -g @anthropic-ai/claude-code" in missing.problem


def test_a_credential_file_that_went_missing_is_a_refusal_not_an_exception(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    settings = load_settings({}, session_sandbox="off")
    env = {"CLAUDE_CODE_OAUTH_TOKEN_FILE": str(token), "PATH": "/usr/bin"}
    assert credential_problem(settings, env) is None
    assert spawn_refusal(settings, env) is None
    token.unlink()
    problem = spawn_refusal(settings, env)
    assert problem is not None
    assert "CLAUDE_CODE_OAUTH_TOKEN_FILE" in problem and "does not exist" in problem
    assert "claude setup-token" in problem
    token.write_text("")
    assert "is empty" in (credential_problem(settings, env) or "")


def _session_env(dq_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    plan = tmp_path / "plan.json"
    plan.write_text("[]")
    write_config(tmp_path / "dispatchq.yaml", SESSION_CONFIG)
    return {
        **dq_env,
        "DISPATCHQ_HOST": HOST,
        "DISPATCHQ_SESSION_COMMAND": f"{sys.executable} {FAKE_CLAUDE} {FAKE_ARGS}",
        "FAKE_CLAUDE_SPAWN_LOG": str(tmp_path / "spawns.log"),
        "FAKE_CLAUDE_PLAN": str(plan),
    }


def _status(env: dict[str, str]) -> dict[str, Any]:
    done = run_cli(["status", "--json"], env)
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def _enqueue(env: dict[str, str], target: str) -> str:
    done = run_cli(["enqueue", "-"], env, input=json.dumps({"kind": "ask", "target": target}) + "\n")
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\t")[1].strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")
def test_a_missing_session_command_is_a_warning_at_start_and_on_status(
    dq_env: dict[str, str], tmp_path: Path, procs: Procs
) -> None:
    env = {**_session_env(dq_env, tmp_path), "DISPATCHQ_SESSION_COMMAND": "no-such-claude-here -p"}
    worker = procs.start("session", ["worker", "session"], env)
    wait_for(lambda: "no-such-claude-here" in procs.log("session"), timeout=60, what="the start-up warning")
    line = next(x for x in procs.log("session").splitlines() if "no-such-claude-here" in x)
    assert "WARNING" in line and "npm install -g @anthropic-ai/claude-code" in line, line
    assert "DISPATCHQ_SESSION_COMMAND" in line

    def warned() -> dict[str, Any] | None:
        data = _status(env)
        return data if any(w["id"] == f"session_command_missing:{HOST}" for w in data["warnings"]) else None

    data = wait_for(warned, timeout=60, what="the warning on status")
    (warning,) = [w for w in data["warnings"] if w["id"] == f"session_command_missing:{HOST}"]
    assert warning["hint"] == COMMAND_HINT

    def shown_on_top() -> bool:
        # The worker's facts count while its heartbeat is fresh: asked again until it is.
        shown = run_cli(["status"], env)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        top = lines[: next(i for i, x in enumerate(lines) if x.startswith("redis"))]  # before the rest
        return any("cannot find its session command" in x and COMMAND_HINT in x for x in top)

    wait_for(shown_on_top, timeout=60, what="the warning at the top of `dispatchq status`")
    assert worker.poll() is None, procs.log("session")  # a warning, not an exit


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")
def test_a_credential_file_deleted_while_the_worker_runs_blocks_the_host_uncharged(
    dq_env: dict[str, str], tmp_path: Path, procs: Procs, redis_client: Any
) -> None:
    token = tmp_path / "session-token"
    token.write_text("test-session-credential\n")
    env = _session_env(dq_env, tmp_path)
    del env["CLAUDE_CODE_OAUTH_TOKEN"]
    env["CLAUDE_CODE_OAUTH_TOKEN_FILE"] = str(token)
    store = Store(redis_client)
    worker = procs.start("session", ["worker", "session"], env)
    first = _enqueue(env, "before")
    wait_for(lambda: store.statuses([first]) == ["answered"], timeout=90, what="the first judgement answered")
    # Observed by the worker process itself, read here from Redis (storage/histograms.py).
    histograms = read_histograms(redis_client)
    assert histograms["session_duration"][""].buckets[-1] == ("+Inf", 1.0)
    assert histograms["queue_time"]["session"].buckets[-1] == ("+Inf", 1.0)

    token.unlink()  # the credential goes missing while the worker runs
    jid = _enqueue(env, "after")

    def waiting() -> Any:
        record = store.get(jid)
        return record if record is not None and record.status == "waiting" else None

    record = wait_for(waiting, timeout=90, what="the judgement waiting on the blocked host")
    assert "does not exist" in (record.reason or ""), record.reason
    assert record.attempts == 0 and getattr(record, "deaths", 0) == 0  # uncharged, not a death
    spawns = (tmp_path / "spawns.log").read_text().splitlines()
    assert len(spawns) == 1  # only the first judgement's session: nothing spawned without it
    data = _status(env)
    assert HOST in data["sessions"]["blocked"]
    assert "CLAUDE_CODE_OAUTH_TOKEN_FILE" in data["sessions"]["blocked"][HOST]
    assert f"host_blocked:{HOST}" in [w["id"] for w in data["warnings"]]
    assert worker.poll() is None, procs.log("session")
    assert "Traceback" not in procs.log("session"), procs.log("session")

    token.write_text("test-session-credential\n")  # put back: the block clears, the judgement runs
    opened = run_cli(["window", "open", "--host", HOST], env)
    assert opened.returncode == 0, opened.stderr
    wait_for(lambda: store.statuses([jid]) == ["answered"], timeout=90, what="the judgement answered")
    assert worker.poll() is None, procs.log("session")
