"""Fencing: every holder write carries the claim admission wrote; a stale claim writes nothing."""

from __future__ import annotations

import logging
import time

import pytest

from dispatchq.core.judgement import TrailEntry
from dispatchq.storage import keys
from dispatchq.storage.store import LEGACY_CLAIM, Store, lease_key
from dispatchq.storage.window import WindowStore
from tests.support.leases import in_line

LINE = keys.session_line()


def admit(store: Store, jid: str) -> str:
    token = store.claim_from_line(LINE, in_line(store, jid, line=LINE), jid)
    assert token
    return token


def test_a_claim_is_written_with_its_lease_in_the_same_step(store: Store) -> None:
    store.claim_lease = 7.0
    token = admit(store, "j1")
    record = store.get("j1")
    assert record is not None and record.status == "running"
    assert getattr(record, "claim", None) == token == store.claim_of("j1")
    assert store.redis.get(lease_key("j1")).decode() == token
    assert 5000 < store.redis.pttl(lease_key("j1")) <= 7000
    again = store.claim_from_line(LINE, "000000000000001:j1", "j1")  # no longer in the line
    assert again == "" and store.claim_of("j1") == token


def test_the_holders_claim_moves_the_record_and_a_stale_one_is_refused_once_logged(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    token = admit(store, "j1")
    with caplog.at_level(logging.WARNING, logger="dispatchq.store"):
        assert store.transition("j1", "answered", expect=["running"], claim="someone-else") is False
        assert store.transition("j1", "failed", expect=["running"], claim="someone-else") is False
        assert store.set_fields("j1", claim="someone-else", session_id="s-stale") is False
    assert [r.message for r in caplog.records].count(
        "refused the move to answered of j1: the writer's claim is gone (another holder has it now)"
    ) == 1
    assert len(caplog.records) == 1  # said once per judgement and claim, whatever it tried
    record = store.get("j1")
    assert record is not None and record.status == "running" and not hasattr(record, "session_id")
    assert store.set_fields("j1", claim=token, session_id="s-mine") is True
    assert store.transition("j1", "answered", expect=["running"], fields={"value": 1}, claim=token) is True
    record = store.get("j1")
    assert record is not None and record.status == "answered" and record.value == 1
    assert getattr(record, "session_id", None) == "s-mine"


def test_a_stale_holders_put_back_leaves_the_record_running_and_in_no_line(store: Store) -> None:
    admit(store, "j1")
    moved = WindowStore(store.redis).requeue_front(
        store,
        "j1",
        "queued",
        trail=TrailEntry(tier="session", outcome="requeued", why="stale"),
        fields={},
        line=LINE,
        priority=None,
        claim="someone-else",
    )
    assert moved is False
    record = store.get("j1")
    assert record is not None and record.status == "running" and record.trail == []
    assert store.line_ids(LINE) == []


def test_a_record_in_flight_at_upgrade_takes_one_legacy_transition(store: Store) -> None:
    """A record claimed by the previous release has no claim: its token-less holder may settle it once."""
    in_line(store, "old", line=LINE)
    # What the previous release's LINE_CLAIM left: running, no claim, no lease.
    store.redis.zrem(LINE, *store.redis.zrange(LINE, 0, -1))
    store.redis.hset(keys.record("old"), mapping={"status": "running", "claimed": repr(time.time())})
    store.redis.smove(keys.status_index("queued"), keys.status_index("running"), "old")
    assert store.claim_of("old") is None and not store.lease_alive("old")
    stranger = store.transition("old", "running", expect=["running"], claim="a-new-token")
    assert stranger is False  # a token that is not its claim
    assert store.transition("old", "running", expect=["running"], claim=LEGACY_CLAIM) is True
    assert store.transition("old", "answered", expect=["running"], claim=LEGACY_CLAIM) is False  # once only
    assert store.transition("old", "answered", expect=["running"]) is True  # a non-holder's move: unchecked


def test_a_takeover_waits_for_the_lease_and_then_fences_the_old_holder(store: Store) -> None:
    store.claim_lease = 0.3
    token = admit(store, "j1")
    assert store.take_over("j1", token) == -1  # its lease lives: nobody takes it
    assert store.renew_claim("j1", token, 0.3) is True
    deadline = time.monotonic() + 10
    while store.lease_alive("j1") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.take_over("j1", "not-the-claim") == 0
    assert store.take_over("j1", token) == 1
    assert store.take_over("j1", token) == 0  # exactly one taker
    assert store.renew_claim("j1", token, 5) is False  # the old holder learns it lost the claim
    assert not store.lease_alive("j1")
    assert store.transition("j1", "answered", expect=["running"], claim=token) is False
