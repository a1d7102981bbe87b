"""Leases: another host takes a session judgement over only after its lease lapsed, uncharged,
and a holder renews on a thread that survives errors (and fences itself on the shared line)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from dispatchq.storage import keys
from dispatchq.storage.store import Store
from dispatchq.tiers.lease import LOST_CONTACT, Holding, replay_spool, spool_of, sweep_lapsed
from dispatchq.tiers.session import run_claimed, worker_died
from dispatchq.window.face import Window
from tests.support.leases import claimed, plan, spawns


def held_on(window: Window, jid: str, token: str, host: str, pid: int = 1) -> None:
    """What the holder on `host` shows of itself while its session runs."""
    window.store.set_running(jid, {"host": host, "pid": pid, "claim": token, "session_id": "sess-a"})
    window.records.set_fields(jid, claim=token, session_id="sess-a", resume_session="sess-a")


def wait_until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_another_host_takes_over_only_after_the_lease_lapsed_lost_contact_and_uncharged(
    host_b: Window,
) -> None:
    store = host_b.records
    store.claim_lease = 1.0
    token = claimed(store, "j1")
    held_on(host_b, "j1", token, "host-a")

    # RQ on host-b finds host-a's job abandoned (heartbeat lapsed) while the lease still lives.
    worker_died(host_b, "j1", "host-a:slot", [], token)
    record = store.get("j1")
    assert record is not None and record.status == "running" and record.trail == []
    assert sweep_lapsed(host_b) == 0

    wait_until(lambda: not store.lease_alive("j1"), "the lease to lapse")
    assert sweep_lapsed(host_b) == 1
    assert sweep_lapsed(host_b) == 0  # once
    record = store.get("j1")
    assert record is not None and record.status == "queued"
    assert LOST_CONTACT in record.trail[-1].why and "host-a" in record.trail[-1].why
    assert getattr(record, "deaths", 0) == 0  # not a death: a partition looks the same
    assert not getattr(record, "resume_session", None)  # the transcript stays on host-a
    assert store.line_ids(keys.session_line()) == ["j1"]
    assert "j1" not in host_b.store.running()

    # host-a comes back with its answer: refused, the record is not touched.
    assert store.transition("j1", "answered", expect=["running", "queued"], claim=token) is False
    worker_died(host_b, "j1", "host-a:slot", [], token)  # RQ's late verdict changes nothing either
    record = store.get("j1")
    assert record is not None and record.status == "queued" and len(record.trail) == 1

    # host-b runs it now; RQ's verdict on host-a's old job must not touch host-b's claim.
    member = next(m.decode() for m in store.redis.zrange(keys.session_line(), 0, -1))
    mine = store.claim_from_line(keys.session_line(), member, "j1")
    held_on(host_b, "j1", mine, "host-b", pid=os.getpid())
    worker_died(host_b, "j1", "host-a:slot", [], token)
    record = store.get("j1")
    assert record is not None and record.status == "running" and getattr(record, "claim", None) == mine
    assert getattr(record, "deaths", 0) == 0


def test_a_holder_seen_dead_on_this_very_host_is_a_death_whatever_its_lease(host_b: Window) -> None:
    store = host_b.records
    token = claimed(store, "j1")  # a lease of two minutes: it would outlive the dead worker
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    held_on(host_b, "j1", token, "host-b", pid=gone.pid)
    worker_died(host_b, "j1", "host-b:slot", [], token)
    record = store.get("j1")
    assert record is not None and record.status == "queued"
    assert getattr(record, "deaths", 0) == 1
    assert record.trail[-1].why == "its session worker died"
    assert getattr(record, "resume_session", None) == "sess-a"  # same host: it resumes


def test_a_job_failed_in_its_own_worker_is_a_death_there_too(host_b: Window) -> None:
    """RQ fails a job (a job timeout) in the worker that ran it: the job is over, unsettled."""
    store = host_b.records
    token = claimed(store, "j1")
    held_on(host_b, "j1", token, "host-b", pid=os.getpid())
    worker_died(host_b, "j1", "host-b:slot", [], token)
    record = store.get("j1")
    assert record is not None and record.status == "queued" and getattr(record, "deaths", 0) == 1


def test_host_bound_work_is_never_taken_over_by_another_host(host_b: Window) -> None:
    store = host_b.records
    store.claim_lease = 0.5
    token = claimed(store, "j1", host="host-a")
    held_on(host_b, "j1", token, "host-a")
    wait_until(lambda: not store.lease_alive("j1"), "the lease to lapse")
    assert sweep_lapsed(host_b) == 0
    worker_died(host_b, "j1", "host-a:slot", [], token)
    record = store.get("j1")
    assert record is not None and record.status == "running" and record.trail == []
    assert store.transition("j1", "answered", expect=["running"], claim=token) is True  # host-a's, when back


def test_a_judgement_claimed_before_tokens_existed_is_handled_as_before(host_b: Window) -> None:
    store = host_b.records
    token = claimed(store, "old")
    store.redis.hdel(keys.record("old"), "claim")  # as the previous release left it
    host_b.store.set_running("old", {"host": "host-a"})
    worker_died(host_b, "old", "host-a:slot", [], None)
    record = store.get("old")
    assert record is not None and record.status == "queued" and getattr(record, "deaths", 0) == 1
    assert token


class FlakyRenewals:
    """Stands in for the claim's renewal: raises like a cut-off Redis while `down`, counts calls."""

    def __init__(self, real: Callable[..., bool]) -> None:
        self.real = real
        self.down = True
        self.calls = 0
        self.after_heal = 0

    def __call__(self, *args: Any) -> bool:
        self.calls += 1
        if self.down:
            raise redis.ConnectionError("Redis is away")
        self.after_heal += 1
        return self.real(*args)


def holding(window: Window, jid: str, token: str, *, bound: bool) -> tuple[Holding, FlakyRenewals]:
    hold = Holding(window, jid, "host-b:slot", [], token, bound=bound)
    flaky = FlakyRenewals(hold.window.records.renew_claim)
    hold.window.records.renew_claim = flaky  # type: ignore[method-assign]
    return hold, flaky


def test_a_shared_line_holder_that_cannot_renew_ends_its_session_and_its_thread_lives_on(
    host_b: Window,
) -> None:
    token = claimed(host_b.records, "j1")
    hold, flaky = holding(host_b, "j1", token, bound=False)
    hold.start()
    try:
        wait_until(hold.cancel.is_set, "the holder to fence itself")
        assert hold.fenced is not None and LOST_CONTACT in hold.fenced
        flaky.down = False
        wait_until(lambda: flaky.after_heal >= 2, "renewals after the heal")  # the thread survived
        assert host_b.records.lease_alive("j1")
    finally:
        hold.close()


def test_a_host_bound_holder_runs_on_without_renewing(host_b: Window) -> None:
    token = claimed(host_b.records, "j1", host="host-b")
    hold, flaky = holding(host_b, "j1", token, bound=True)
    hold.start()
    try:
        # Renewals failing for well over the lease: a shared-line holder would have fenced itself.
        wait_until(lambda: flaky.calls * hold.interval > 2 * hold.lease, "renewals to fail for two leases")
        assert not hold.cancel.is_set() and hold.fenced is None
    finally:
        hold.close()


def test_a_session_whose_holder_cannot_renew_is_ended_uncharged_and_left_for_the_lease(
    session_window: tuple[Any, Window], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, window = session_window
    plan(tmp_path, {"sleep": "60"})  # would run a minute: the fence ends it long before
    token = claimed(window.records, "j1")

    def away(self: Store, jid: str, claim: str, lease: float) -> bool:
        raise redis.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(Store, "renew_claim", away)
    result = run_claimed(runtime, "j1", "host-a:slot", [], claim=token)
    assert result == LOST_CONTACT
    assert spawns(tmp_path) == 1
    record = window.records.get("j1")
    assert record is not None and record.status == "running"  # left as it was: the lease decides
    assert getattr(record, "claim", None) == token and record.attempts == 0 and record.trail == []
    assert len(spool_of(window.settings.data_dir)) == 0  # nothing seen worth keeping


def test_an_answer_that_cannot_be_written_is_spooled_and_lands_when_replayed(
    session_window: tuple[Any, Window], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, window = session_window
    plan(tmp_path, {"answer": "forty-two"})
    token = claimed(window.records, "j1")
    real = Store.transition

    def answer_lost(self: Store, jid: str, status: str, **kwargs: Any) -> bool | None:
        if status == "answered":
            raise redis.TimeoutError("Timeout reading from socket")
        return real(self, jid, status, **kwargs)

    monkeypatch.setattr(Store, "transition", answer_lost)
    assert run_claimed(runtime, "j1", "host-a:slot", [], claim=token) == f"{LOST_CONTACT}: answer spooled"
    record = window.records.get("j1")
    assert record is not None and record.status == "running"
    assert len(spool_of(window.settings.data_dir)) == 1
    monkeypatch.setattr(Store, "transition", real)  # Redis is back
    assert replay_spool(window) == 1
    record = window.records.get("j1")
    assert record is not None and record.status == "answered" and record.value == "forty-two"
    assert spawns(tmp_path) == 1


def test_host_bound_work_its_own_workers_job_left_unsettled_is_taken_back_by_the_sweep_uncharged(
    host_b: Window,
) -> None:
    """A host-bound run that ended cut off with nothing to spool (an error): once its lease lapsed,
    its own host asks again, uncharged, resuming the same session (the transcript is here)."""
    store = host_b.records
    store.claim_lease = 0.3
    token = claimed(store, "j1", host="host-b")
    held_on(host_b, "j1", token, "host-b", pid=os.getpid())
    wait_until(lambda: not store.lease_alive("j1"), "the lease to lapse")
    assert sweep_lapsed(host_b) == 1
    record = store.get("j1")
    assert record is not None and record.status == "queued" and getattr(record, "deaths", 0) == 0
    assert LOST_CONTACT in record.trail[-1].why
    assert getattr(record, "resume_session", None) == "sess-a"
    assert store.line_ids(keys.session_line("host-b")) == ["j1"]
