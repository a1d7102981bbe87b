"""The spool replayed: an answer lands if its claim is still the holder's, else it is a late answer
on the trail (once); a usage limit is raised whatever the claim. Replaying twice is harmless."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dispatchq.launcher.spawn import LaunchResult
from dispatchq.storage import keys
from dispatchq.tiers.lease import LATE_ANSWER, Holding, replay_spool, spool_of, take_over
from dispatchq.window.face import Window
from tests.support.fake_claude import assistant, rate_limit_event, result_event
from tests.support.leases import claimed


def stream(*events: dict[str, Any]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def answered_run(sid: str = "sess-1", text: str = "yes") -> LaunchResult:
    return LaunchResult(
        argv=("claude",),
        returncode=0,
        stdout=stream(assistant(sid, "m", text, None), result_event(sid, False, text, None, "completed")),
    )


def limited_run(resets_at: int, sid: str = "sess-1") -> LaunchResult:
    message = "You've hit your session limit"
    return LaunchResult(
        argv=("claude",),
        returncode=1,
        stdout=stream(
            rate_limit_event(sid, "rejected", resets_at, "five_hour"),
            assistant(sid, "<synthetic>", message, "rate_limit"),
            result_event(sid, True, message, "429", "api_error"),
        ),
    )


def spool_answer(window: Window, jid: str, token: str, value: Any = "yes") -> None:
    hold = Holding(window, jid, "host-a:slot", [], token, bound=False)
    meta = {"session_id": "sess-1", "turns": 1, "cost_usd": 0.01}
    assert hold.spool("answer", answered_run(), time.time(), value=value, meta=meta, session_id="sess-1")
    hold.close()


def test_a_spooled_answer_whose_claim_still_holds_is_applied_and_a_second_replay_adds_nothing(
    window: Window,
) -> None:
    token = claimed(window.records, "j1")
    spool_answer(window, "j1", token)
    assert len(spool_of(window.settings.data_dir)) == 1
    assert replay_spool(window) == 1
    record = window.records.get("j1")
    assert record is not None and record.status == "answered" and record.value == "yes"
    assert getattr(record, "settled_by", None) == token
    assert len(spool_of(window.settings.data_dir)) == 0

    # A crash between applying and removing the file: the same entry is replayed again.
    spool_answer(window, "j1", token)
    assert replay_spool(window) == 1
    record = window.records.get("j1")
    assert record is not None and record.status == "answered"
    assert [e.outcome for e in record.trail] == ["answered"]  # no late answer for its own answer


def test_a_spooled_answer_whose_claim_is_gone_is_a_late_answer_on_the_trail_once(window: Window) -> None:
    store = window.records
    store.claim_lease = 0.2
    token = claimed(store, "j1")
    window.store.set_running("j1", {"host": "host-b", "claim": token})
    spool_answer(window, "j1", token, value="late-yes")
    deadline = time.monotonic() + 10
    while store.lease_alive("j1") and time.monotonic() < deadline:
        time.sleep(0.05)
    record = store.get("j1")
    assert record is not None
    assert take_over(window, record, token, None, []) == "taken"
    assert replay_spool(window) == 1
    spool_answer(window, "j1", token, value="late-yes")  # replayed twice
    assert replay_spool(window) == 1
    record = store.get("j1")
    assert record is not None and record.status == "queued" and record.value is None
    late = [e for e in record.trail if LATE_ANSWER in e.why]
    assert len(late) == 1 and "sess-1" in late[0].why
    assert getattr(late[0], "value", None) == "late-yes"
    assert len(spool_of(window.settings.data_dir)) == 0


def test_a_spooled_limit_is_raised_whatever_the_claim(window: Window) -> None:
    store = window.records
    resets = int(time.time()) + 3600
    gone = claimed(store, "j1")
    store.redis.hset(keys.record("j1"), "claim", "-lost:" + gone)  # taken over meanwhile
    hold = Holding(window, "j1", "host-a:slot", [], gone, bound=False)
    assert hold.spool("limit", limited_run(resets), time.time(), model=None, session_id="sess-1")
    hold.close()
    assert replay_spool(window) == 1
    marker = window.get("general")
    assert marker is not None and marker.closed()
    assert int(marker.lifts_at) == resets
    record = store.get("j1")
    assert record is not None and record.status == "running"  # not its claim: only the marker moved


def test_a_spooled_limit_of_a_judgement_still_held_puts_it_back_to_resume(window: Window) -> None:
    store = window.records
    resets = int(time.time()) + 1800
    token = claimed(store, "j1")
    hold = Holding(window, "j1", "host-a:slot", [], token, bound=False)
    assert hold.spool(
        "limit", limited_run(resets, sid="sess-9"), time.time(), model=None, session_id="sess-9"
    )
    hold.close()
    assert replay_spool(window) == 1
    assert replay_spool(window) == 0  # nothing left
    record = store.get("j1")
    assert record is not None and record.status == "waiting"
    assert getattr(record, "resume_session", None) == "sess-9"
    marker = window.get("general")
    assert marker is not None and int(marker.lifts_at) == resets


def test_a_session_worker_replays_its_hosts_spool_when_it_starts(
    make_runtime: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatchq.workers.base import build_worker
    from dispatchq.workers.session import SessionWorker

    monkeypatch.setenv("CLAUDE_CODE_OAUTH_TOKEN", "test-session-credential")
    runtime = make_runtime(DISPATCHQ_HOST="host-a", DISPATCHQ_DATA_DIR=str(tmp_path / "data"))
    window = runtime.window
    token = claimed(window.records, "j1")
    spool_answer(window, "j1", token, value="from-the-spool")
    worker = build_worker(SessionWorker, runtime, "session")
    worker.work(burst=True, logging_level="WARNING", with_scheduler=False)
    record = window.records.get("j1")
    assert record is not None and record.status == "answered" and record.value == "from-the-spool"
    assert len(spool_of(window.settings.data_dir)) == 0
