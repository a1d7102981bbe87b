"""A lapsed judgement whose holder was on another host waits a bounded time for that host's replay.

Only the holder's host can read its spool. So after the lease lapses, another host leaves the
judgement to that holder for the spool wait more: a holder back in time lands its answer under
its own claim (the session paid once); one that stays away is taken over once the wait is over
(never dropped). The holder's own host does not wait: it replays its spool before it sweeps.
Two runtimes share the test's Redis: host-a holds, host-b sweeps.
"""

from __future__ import annotations

import json
import os
import time

from dispatchq.launcher.spawn import LaunchResult
from dispatchq.storage import keys
from dispatchq.tiers.lease import LOST_CONTACT, Holding, replay_spool, sweep_lapsed
from dispatchq.window.face import Window
from tests.support.fake_claude import assistant, result_event
from tests.support.helpers import wait_for
from tests.support.leases import claimed

CLAIMED = 1.0  # the claim's first lease, seconds (the holder's own lease and wait: `spool_wait_hosts`)


def held_by_a(a: Window, jid: str, *, pid: int = 1) -> tuple[str, Holding]:
    """host-a claims `jid`, shows itself running it, and holds it for its replay (as `start` does)."""
    token = claimed(a.records, jid, lease=CLAIMED)
    a.store.set_running(jid, {"host": "host-a", "pid": pid, "claim": token, "session_id": "sess-a"})
    hold = Holding(a, jid, "host-a:slot", [], token, bound=False)
    hold.hold_for_replay()
    return token, hold


def spool_answer(hold: Holding, text: str) -> None:
    events = (assistant("sess-a", "m", text, None), result_event("sess-a", False, text, None, "completed"))
    run = LaunchResult(argv=("claude",), returncode=0, stdout="".join(json.dumps(e) + "\n" for e in events))
    meta = {"session_id": "sess-a", "turns": 1, "cost_usd": 0.01}
    assert hold.spool("answer", run, time.time(), value=text, meta=meta, session_id="sess-a")


def test_a_holder_back_within_the_wait_lands_its_spooled_answer_and_nobody_asks_again(
    spool_wait_hosts: tuple[Window, Window],
) -> None:
    a, b = spool_wait_hosts
    token, hold = held_by_a(a, "j1")
    spool_answer(hold, "from A")  # its session finished while it was cut off
    hold.window.records.disconnect()  # cut off: it renews no more, frees nothing
    wait_for(lambda: not b.records.lease_alive("j1"), what="the lease to lapse")
    assert sweep_lapsed(b) == 0  # left to host-a's replay
    record = b.records.get("j1")
    assert record is not None and record.status == "running" and getattr(record, "claim", None) == token
    assert record.trail == []

    assert replay_spool(a) == 1  # host-a is back
    assert sweep_lapsed(b) == 0
    record = b.records.get("j1")
    assert record is not None and record.status == "answered" and record.value == "from A"
    assert [e.outcome for e in record.trail] == ["answered"]


def test_a_holder_that_stays_away_is_taken_over_once_the_wait_is_over(
    spool_wait_hosts: tuple[Window, Window],
) -> None:
    a, b = spool_wait_hosts
    token, hold = held_by_a(a, "j1")
    hold.window.records.disconnect()  # cut off: it renews no more, frees nothing
    wait_for(lambda: not b.records.lease_alive("j1"), what="the lease to lapse")
    assert sweep_lapsed(b) == 0
    wait_for(lambda: sweep_lapsed(b) == 1, what="the spool wait to be over")  # bounded: never dropped
    record = b.records.get("j1")
    assert record is not None and record.status == "queued"
    assert LOST_CONTACT in record.trail[-1].why and "host-a" in record.trail[-1].why
    assert getattr(record, "claim", None) != token


def test_the_holders_own_host_takes_back_what_it_left_unsettled_without_the_wait(
    spool_wait_hosts: tuple[Window, Window],
) -> None:
    a, _ = spool_wait_hosts
    token, hold = held_by_a(a, "j1", pid=os.getpid())  # its own job ended, spooling nothing
    hold.window.records.disconnect()  # cut off: it renews no more, frees nothing
    wait_for(lambda: not a.records.lease_alive("j1"), what="the lease to lapse")
    assert sweep_lapsed(a) == 1  # its replay ran first: nothing to wait for
    record = a.records.get("j1")
    assert record is not None and record.status == "queued" and getattr(record, "claim", None) != token


def test_each_renewal_of_the_holder_keeps_the_judgement_for_its_replay(
    spool_wait_hosts: tuple[Window, Window],
) -> None:
    a, b = spool_wait_hosts
    token, hold = held_by_a(a, "j1")
    a.records.redis.delete(keys.replay_wait("j1"))  # what its first hold gave is spent
    hold.renew_once()  # a renewal, as its thread makes them while the session runs
    hold.window.records.disconnect()  # then it is cut off
    wait_for(lambda: not b.records.lease_alive("j1"), what="the renewed lease to lapse")
    assert sweep_lapsed(b) == 0
    record = b.records.get("j1")
    assert record is not None and record.status == "running" and getattr(record, "claim", None) == token
