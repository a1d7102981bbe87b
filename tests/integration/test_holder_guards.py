"""The last guards of a session's holder, each in the one situation it exists for.

- Admission checks the markers, but a session starts a moment later: another host may have
  seen a limit meanwhile. The window is checked again right before the spawn, so that
  judgement spawns nothing and waits, at the front of its line, uncharged.
- A holder that lost its claim (cut off past its lease; another host took the judgement and
  runs it) may still come back with an answer. Its write carries its old claim and is
  refused, whether made live or replayed from its spool: the record stays the new holder's.

Real Redis, the real admission and run (`tiers.session`), the fake `claude` as the session.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dispatchq.client import Client
from dispatchq.storage import keys
from dispatchq.storage.spool import SpoolEntry
from dispatchq.tiers.lease import LATE_ANSWER, answer, replay_spool, spool_of, sweep_lapsed
from dispatchq.tiers.session import Admission, admit, run_claimed
from dispatchq.window.face import Window
from dispatchq.window.limits import GENERAL_SCOPE, LimitSignal
from tests.support.leases import plan, spawns


def _admitted(window: Window, host: str) -> tuple[Admission, str]:
    """What a session worker on `host` is handed by admission: the admission and its claim."""
    admitted = admit(window, host, f"{host}-worker", lambda kind: None)
    assert isinstance(admitted, Admission), admitted
    claim = window.records.claim_of(admitted.jid)
    assert claim
    return admitted, claim


def _wait_until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_limit_seen_elsewhere_between_admission_and_spawn_spawns_nothing_and_the_judgement_waits(
    session_window: tuple[Any, Window], tmp_path: Path
) -> None:
    runtime, window = session_window
    plan(tmp_path, {"answer": "forty-two"}, {"answer": "forty-two"})
    jid = Client(runtime=runtime).enqueue("ask", "q")
    admitted, claim = _admitted(window, "host-a")

    # Another host's session hits the limit after this admission, before this spawn.
    lifts = datetime.now(UTC) + timedelta(hours=1)
    message = "You've hit your session limit (seen on host-b)"
    signal = LimitSignal(lifts_at=lifts, kind="five_hour", scope=GENERAL_SCOPE, message=message)
    window.report_limit([signal], session="host-b-session")

    result = run_claimed(runtime, jid, admitted.slot, admitted.probes, claim=claim)

    assert result == "paused"
    assert spawns(tmp_path) == 0
    record = window.records.get(jid)
    assert record is not None
    assert (record.status, record.attempts, getattr(record, "deaths", 0)) == ("waiting", 0, 0)
    assert record.reason == message
    assert window.records.line_ids(keys.session_line()) == [jid]  # back in its line, not lost
    assert jid not in window.store.running()

    # Once the window opens the same judgement is admitted again and answered, by one session.
    window.open(who="test")
    again, claim = _admitted(window, "host-a")
    assert again.jid == jid
    assert run_claimed(runtime, jid, again.slot, again.probes, claim=claim) == "answered"
    record = window.records.get(jid)
    assert record is not None and (record.status, record.value) == ("answered", "forty-two")
    assert spawns(tmp_path) == 1


def test_a_holder_whose_claim_another_host_took_cannot_write_its_answer_live_or_replayed(
    session_window: tuple[Any, Window], host_b: Window
) -> None:
    runtime, host_a = session_window
    jid = Client(runtime=runtime).enqueue("ask", "q")
    held, old_claim = _admitted(host_a, "host-a")
    host_a.store.set_running(jid, {"host": "host-a", "pid": 1, "claim": old_claim, "session_id": "sess-a"})
    seen_by_a = host_a.records.get(jid)
    assert seen_by_a is not None and seen_by_a.status == "running"

    # host-a is cut off and renews nothing: its lease lapses, host-b takes the judgement and runs it.
    _wait_until(lambda: not host_b.records.lease_alive(jid), "host-a's lease to lapse")
    host_b.release(held.slot, held.probes)  # what its slot's own (longer) lease does in time
    assert sweep_lapsed(host_b) == 1
    _, new_claim = _admitted(host_b, "host-b")
    assert new_claim != old_claim
    before = host_b.records.get(jid)
    assert before is not None and before.status == "running"

    # host-a is back, its session finished: its answer, written live with its old claim, is refused.
    meta = {"session_id": "sess-a", "turns": 1, "cost_usd": 0.01}
    assert answer(host_a, seen_by_a, "stale", meta, old_claim) is False
    after = host_b.records.get(jid)
    assert after is not None
    assert (after.status, after.value, getattr(after, "claim", None)) == ("running", None, new_claim)
    assert after.trail == before.trail

    # ... and the same answer, kept in host-a's spool while Redis was away, is only a late note.
    body = {"token": old_claim, "value": "stale", "meta": meta, "session_id": "sess-a", "host": "host-a"}
    spool_of(host_a.settings.data_dir).put(SpoolEntry(claim=old_claim, kind="answer", jid=jid, body=body))
    assert replay_spool(host_a) == 1
    after = host_b.records.get(jid)
    assert after is not None
    assert (after.status, after.value, getattr(after, "claim", None)) == ("running", None, new_claim)
    assert [e.outcome for e in after.trail] == [*(e.outcome for e in before.trail), "late"]
    assert LATE_ANSWER in after.trail[-1].why

    # The holder that does hold the claim writes its answer.
    assert answer(host_b, after, "fresh", meta, new_claim) is True
    done = host_b.records.get(jid)
    assert done is not None and (done.status, done.value) == ("answered", "fresh")
