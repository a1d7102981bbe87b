"""A replayed outcome runs the kind's after-session hooks as a live one does, once per answer.

The session command is the fake `claude` (one spawn per judgement); Redis going away at the
answer's write is a `TimeoutError` injected there, as in the lease tests. A crash between a
replay and the removal of its file is the same file put back and replayed again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from dispatchq.core.judgement import Record
from dispatchq.launcher.spawn import LaunchResult
from dispatchq.runtime import Runtime
from dispatchq.storage.store import Store
from dispatchq.tiers.hooks import SessionHooks
from dispatchq.tiers.lease import LOST_CONTACT, Holding, replay_spool, spool_of
from dispatchq.tiers.session import run_claimed
from dispatchq.window.face import Window
from dispatchq.window.limits import SessionOutcome
from tests.support.fake_claude import assistant, rate_limit_event, result_event
from tests.support.leases import claimed, plan, spawns


class Recording(SessionHooks):
    """The kind's hooks: each after-session call kept; `fail_first` raises an outage after the first."""

    def __init__(self, *, fail_first: bool = False) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.fail_first = fail_first

    def after_session(self, runtime: Runtime, record: Record, outcome: SessionOutcome, result: Any) -> None:
        self.calls.append((record.id, outcome.kind, outcome.text))
        if self.fail_first and len(self.calls) == 1:
            raise redis.ConnectionError("Connection closed by server.")  # Redis went away after it


def answered(sid: str, text: str) -> LaunchResult:
    events = (assistant(sid, "m", text, None), result_event(sid, False, text, None, "completed"))
    return LaunchResult(argv=("claude",), returncode=0, stdout="".join(json.dumps(e) + "\n" for e in events))


def spool_file(window: Window) -> tuple[Path, bytes]:
    (path,) = sorted(spool_of(window.settings.data_dir).folder.glob("*.json"))
    return path, path.read_bytes()


def test_a_spooled_answer_runs_its_kinds_hook_when_replayed_and_a_second_replay_runs_it_no_more(
    session_window: tuple[Any, Window], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, window = session_window
    plan(tmp_path, {"answer": "forty-two"})
    token = claimed(window.records, "j1")
    hooks = Recording()
    real = Store.transition

    def answer_lost(self: Store, jid: str, status: str, **kwargs: Any) -> bool | None:
        if status == "answered":
            raise redis.TimeoutError("Timeout reading from socket")
        return real(self, jid, status, **kwargs)

    monkeypatch.setattr(Store, "transition", answer_lost)
    result = run_claimed(runtime, "j1", "host-a:slot", [], claim=token, hooks={"ask": hooks})
    assert result == f"{LOST_CONTACT}: answer spooled"
    assert hooks.calls == []  # nothing landed: nothing to grade yet
    path, kept = spool_file(window)
    monkeypatch.setattr(Store, "transition", real)  # Redis is back

    assert replay_spool(window, runtime=runtime, hooks={"ask": hooks}) == 1
    record = window.records.get("j1")
    assert record is not None and record.status == "answered" and record.value == "forty-two"
    assert hooks.calls == [("j1", "answer", "forty-two")]

    path.write_bytes(kept)  # a crash between the replay and the removal of its file
    assert replay_spool(window, runtime=runtime, hooks={"ask": hooks}) == 1
    assert hooks.calls == [("j1", "answer", "forty-two")]
    assert len(spool_of(window.settings.data_dir)) == 0
    assert spawns(tmp_path) == 1


def test_a_replay_after_the_live_run_ran_the_hook_does_not_run_it_again(
    session_window: tuple[Any, Window], tmp_path: Path
) -> None:
    """The answer landed and the hook ran; Redis went away right after, so the run spooled it."""
    runtime, window = session_window
    plan(tmp_path, {"answer": "forty-two"})
    token = claimed(window.records, "j1")
    hooks = Recording(fail_first=True)
    result = run_claimed(runtime, "j1", "host-a:slot", [], claim=token, hooks={"ask": hooks})
    assert result == f"{LOST_CONTACT}: answer spooled"
    assert hooks.calls == [("j1", "answer", "forty-two")]
    assert len(spool_of(window.settings.data_dir)) == 1

    assert replay_spool(window, runtime=runtime, hooks={"ask": hooks}) == 1
    record = window.records.get("j1")
    assert record is not None and record.status == "answered" and record.value == "forty-two"
    assert [e.outcome for e in record.trail] == ["answered"]  # no late answer for its own answer
    assert hooks.calls == [("j1", "answer", "forty-two")]
    assert len(spool_of(window.settings.data_dir)) == 0


def test_a_replay_without_the_hooks_leaves_them_due_for_the_replay_that_has_them(
    session_window: tuple[Any, Window], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, window = session_window
    token = claimed(window.records, "j1")
    hold = Holding(window, "j1", "host-a:slot", [], token, bound=False)
    meta = {"session_id": "sess-1", "turns": 1, "cost_usd": 0.01}
    run = answered("sess-1", "yes")
    assert hold.spool("answer", run, time.time(), value="yes", meta=meta, session_id="sess-1")
    hold.close()
    path, kept = spool_file(window)
    assert replay_spool(window) == 1  # applied by a caller that runs no hooks
    hooks = Recording()
    path.write_bytes(kept)
    assert replay_spool(window, runtime=runtime, hooks={"ask": hooks}) == 1
    assert replay_spool(window, runtime=runtime, hooks={"ask": hooks}) == 0
    assert hooks.calls == [("j1", "answer", "yes")]


def test_a_replayed_limit_of_a_judgement_still_held_runs_the_hook_once(
    session_window: tuple[Any, Window],
) -> None:
    runtime, window = session_window
    token = claimed(window.records, "j1")
    resets = int(time.time()) + 1800
    message = "You've hit your session limit"
    run = LaunchResult(
        argv=("claude",),
        returncode=1,
        stdout="".join(
            json.dumps(e) + "\n"
            for e in (
                rate_limit_event("sess-9", "rejected", resets, "five_hour"),
                assistant("sess-9", "<synthetic>", message, "rate_limit"),
                result_event("sess-9", True, message, "429", "api_error"),
            )
        ),
    )
    hold = Holding(window, "j1", "host-a:slot", [], token, bound=False)
    assert hold.spool("limit", run, time.time(), model=None, session_id="sess-9")
    hold.close()
    path, kept = spool_file(window)
    hooks = Recording()
    assert replay_spool(window, runtime=runtime, hooks={"ask": hooks}) == 1
    record = window.records.get("j1")
    assert record is not None and record.status == "waiting"
    assert [(jid, kind) for jid, kind, _ in hooks.calls] == [("j1", "limit")]

    path.write_bytes(kept)  # replayed again: the marker is raised again, the hook is not run
    assert replay_spool(window, runtime=runtime, hooks={"ask": hooks}) == 1
    assert [(jid, kind) for jid, kind, _ in hooks.calls] == [("j1", "limit")]


def test_a_session_worker_replays_with_the_hooks_the_session_job_runs(
    make_runtime: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatchq.queue.entrypoints import entry_module
    from dispatchq.workers.base import build_worker
    from dispatchq.workers.session import SessionWorker

    hooks = Recording()
    monkeypatch.setattr(entry_module(), "session_hooks", lambda: {"ask": hooks})
    monkeypatch.setenv("CLAUDE_CODE_OAUTH_TOKEN", "test-session-credential")
    runtime = make_runtime(DISPATCHQ_HOST="host-a", DISPATCHQ_DATA_DIR=str(tmp_path / "data"))
    window = runtime.window
    token = claimed(window.records, "j1")
    hold = Holding(window, "j1", "host-a:slot", [], token, bound=False)
    run = answered("sess-1", "yes")
    assert hold.spool("answer", run, time.time(), value="yes", meta={}, session_id="sess-1")
    hold.close()
    worker = build_worker(SessionWorker, runtime, "session")
    worker.work(burst=True, logging_level="WARNING", with_scheduler=False)
    record = window.records.get("j1")
    assert record is not None and record.status == "answered" and record.value == "yes"
    assert hooks.calls == [("j1", "answer", "yes")]
