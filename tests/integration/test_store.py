"""dispatchq's own records, on a real Redis: every change one script, indexes always agreeing.

These drive `Store` directly (no RQ, no config): creation and idempotency, claims,
transitions with their expectations, the result TTL, the trail, counters and prune.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatchq.core.judgement import FINISHED, STATUSES, TrailEntry
from dispatchq.storage import keys
from dispatchq.storage.store import NewRecord, Store

TTL = 1234


@pytest.fixture
def store(redis_client: Any) -> Store:
    return Store(redis_client, result_ttl=TTL)


def entry(jid: str, ckey: str, *, force: bool = False, tier: str = "code", line: str = "") -> NewRecord:
    fields = {
        "id": jid,
        "content_key": ckey,
        "force": "1" if force else "0",
        "line": line,
        "input": json.dumps({"kind": "k", "target": "t"}),
        "tier": tier,
        "effect": "local",
    }
    return NewRecord(**{name: fields.get(name, "") for name in NewRecord._fields})


def create(store: Store, jid: str, ckey: str, *, force: bool = False, tier: str = "code") -> tuple[str, bool]:
    result = store.create_many([entry(jid, ckey, force=force, tier=tier)])
    assert result is not None
    return result[0]


def index_of(store: Store, jid: str) -> list[str]:
    """Every status index the id is in: exactly one, always."""
    return [s for s in STATUSES if jid in store.ids(s)]


# --- creation and idempotency -------------------------------------------------------------------


def test_create_writes_record_and_indexes(store: Store, redis_client: Any) -> None:
    assert create(store, "a", "ck-a") == ("a", True)
    record = store.get("a")
    assert record is not None
    assert (record.status, record.tier, record.kind, record.target) == ("queued", "code", "k", "t")
    assert record.content_key == "ck-a" and record.trail == []
    assert index_of(store, "a") == ["queued"]
    assert store.ids() == ["a"]
    assert redis_client.get(keys.idempotency("ck-a")) == b"a"
    assert redis_client.ttl(keys.record("a")) == -1  # unfinished: never expires


def test_duplicate_returns_the_live_id_and_creates_nothing(store: Store, redis_client: Any) -> None:
    create(store, "a", "same")
    assert create(store, "b", "same") == ("a", False)
    assert store.get("b") is None
    assert store.ids() == ["a"]


def test_duplicates_within_one_batch(store: Store) -> None:
    result = store.create_many([entry("a", "same"), entry("b", "same"), entry("c", "other")])
    assert result == [("a", True), ("a", False), ("c", True)]


@pytest.mark.parametrize("status", ["queued", "running", "waiting", "answered", "needs-triage"])
def test_a_live_or_answered_judgement_blocks_its_key(store: Store, status: str) -> None:
    create(store, "a", "same")
    store.transition("a", status, expect=["queued"])
    assert create(store, "b", "same") == ("a", False)


@pytest.mark.parametrize("status", ["failed", "cancelled"])
def test_a_failed_or_cancelled_judgement_frees_its_key(store: Store, redis_client: Any, status: str) -> None:
    create(store, "a", "same")
    store.transition("a", status)
    assert create(store, "b", "same") == ("b", True)
    assert redis_client.get(keys.idempotency("same")) == b"b"
    # The new live judgement's key must not inherit the old one's expiry.
    assert redis_client.ttl(keys.idempotency("same")) == -1


def test_force_creates_a_new_judgement_even_when_one_is_live(store: Store) -> None:
    create(store, "a", "same")
    assert create(store, "b", "same", force=True) == ("b", True)
    assert create(store, "c", "same") == ("b", False)
    assert store.get("a") is not None  # the old one is untouched


def test_an_expired_record_frees_its_key(store: Store, redis_client: Any) -> None:
    create(store, "a", "same")
    redis_client.delete(keys.record("a"))
    assert create(store, "b", "same") == ("b", True)


# --- claims ---------------------------------------------------------------------------------------


def test_claim_takes_only_claimable_records_of_the_tier(store: Store) -> None:
    create(store, "a", "1")
    create(store, "b", "2", tier="typed")
    create(store, "c", "3")
    store.transition("c", "cancelled")
    claimed = store.claim(["a", "b", "c", "missing"], "code")
    assert [c.id for c in claimed] == ["a"]
    assert claimed[0].input == {"kind": "k", "target": "t"} and claimed[0].was == "queued"
    assert index_of(store, "a") == ["running"]
    assert index_of(store, "b") == ["queued"] and index_of(store, "c") == ["cancelled"]


def test_a_running_record_is_claimed_again_by_a_retried_job(store: Store) -> None:
    create(store, "a", "1")
    assert store.claim(["a"], "code")[0].was == "queued"
    again = store.claim(["a"], "code")  # the worker that held it died; RQ retries the job
    assert [c.was for c in again] == ["running"]
    assert index_of(store, "a") == ["running"]


def test_a_finished_record_is_never_claimed(store: Store) -> None:
    create(store, "a", "1")
    store.claim(["a"], "code")
    store.transition("a", "answered", expect=["running"], fields={"tier": "code", "value": 1})
    assert store.claim(["a"], "code") == []
    assert store.get("a").value == 1  # type: ignore[union-attr]


# --- transitions ------------------------------------------------------------------------------------


def test_transition_respects_expect(store: Store) -> None:
    create(store, "a", "1")
    assert store.transition("a", "answered", expect=["running"]) is False
    assert store.get("a").status == "queued"  # type: ignore[union-attr]
    assert store.transition("a", "running", expect=["queued"]) is True
    assert store.transition("missing", "running") is False


def test_default_expect_never_reopens_a_finished_record(store: Store) -> None:
    create(store, "a", "1")
    store.transition("a", "cancelled")
    assert store.transition("a", "answered") is False  # e.g. a late worker commit
    assert store.get("a").status == "cancelled"  # type: ignore[union-attr]


@pytest.mark.parametrize("status", sorted(FINISHED))
def test_finished_records_get_the_result_ttl(store: Store, redis_client: Any, status: str) -> None:
    create(store, "a", "ck")
    store.transition("a", status)
    assert 0 < redis_client.ttl(keys.record("a")) <= TTL
    assert 0 < redis_client.ttl(keys.idempotency("ck")) <= TTL


@pytest.mark.parametrize("status", ["running", "waiting"])
def test_unfinished_records_never_expire(store: Store, redis_client: Any, status: str) -> None:
    create(store, "a", "ck")
    store.transition("a", status)
    assert redis_client.ttl(keys.record("a")) == -1


def test_requeued_finished_record_loses_its_ttl(store: Store, redis_client: Any) -> None:
    create(store, "a", "ck")
    store.transition("a", "answered")
    assert redis_client.ttl(keys.record("a")) > 0
    store.transition("a", "queued", expect=["answered"])  # `retry`
    assert redis_client.ttl(keys.record("a")) == -1
    assert redis_client.ttl(keys.idempotency("ck")) == -1


def test_status_index_follows_every_move(store: Store) -> None:
    create(store, "a", "1")
    for status in ("running", "waiting", "running", "needs-triage"):
        store.transition("a", status, expect=[])
        assert index_of(store, "a") == [status]
        assert store.count(status) == 1


def test_fields_are_set_and_deleted(store: Store) -> None:
    create(store, "a", "1")
    store.transition("a", "running", fields={"value": {"x": [1, 2]}, "confidence": 0.75, "reason": "r"})
    record = store.get("a")
    assert record is not None and (record.value, record.confidence, record.reason) == (
        {"x": [1, 2]},
        0.75,
        "r",
    )
    store.transition("a", "queued", delete=["value", "confidence", "reason"])
    record = store.get("a")
    assert record is not None and (record.value, record.confidence, record.reason) == (None, None, None)


def test_false_and_zero_answers_survive_the_round_trip(store: Store) -> None:
    for jid, value in (("f", False), ("z", 0), ("e", ""), ("l", [])):
        create(store, jid, jid)
        store.transition(jid, "answered", fields={"tier": "code", "value": value})
        record = store.get(jid)
        assert record is not None and record.value == value and type(record.value) is type(value)


def test_answered_counter_counts_per_tier(store: Store) -> None:
    for jid, tier in (("a", "code"), ("b", "code"), ("c", "typed")):
        create(store, jid, jid)
        store.transition(jid, "answered", fields={"tier": tier, "value": 1})
    create(store, "d", "d")
    store.transition("d", "failed", fields={"tier": "code"})
    assert store.answered_counts() == {"code": 2, "typed": 1, "session": 0}


# --- the trail ------------------------------------------------------------------------------------


def test_trail_entries_append_in_order(store: Store) -> None:
    create(store, "a", "1")
    store.transition("a", "running", trail=TrailEntry(tier="code", outcome="moved-up", why="cannot tell"))
    store.transition("a", "answered", trail=TrailEntry(tier="typed", outcome="answered", why="0.9 >= 0.6"))
    trail = store.get("a").trail  # type: ignore[union-attr]
    assert [(t.tier, t.outcome, t.why) for t in trail] == [
        ("code", "moved-up", "cannot tell"),
        ("typed", "answered", "0.9 >= 0.6"),
    ]


def test_trail_entries_keep_their_exact_json(store: Store) -> None:
    """Extras on a trail entry come back as they went in: lists stay lists, numbers keep their digits."""
    create(store, "a", "1")
    first = TrailEntry(
        tier="code",
        outcome="moved-up",
        why="verify failed",
        at=1712345678.123456,
        commands=[],
        numbers={"confidences": {}, "ids": [12345678901234567]},
        note=None,
    )
    store.transition("a", "running", trail=first)
    store.transition("a", "running", trail=TrailEntry(tier="typed", outcome="moved-up", why="keyless"))
    trail = store.get("a").trail  # type: ignore[union-attr]
    assert trail[0].model_dump() == first.model_dump()
    assert trail[0].commands == []  # type: ignore[attr-defined]
    assert trail[0].numbers == {"confidences": {}, "ids": [12345678901234567]}  # type: ignore[attr-defined]
    assert trail[0].at == 1712345678.123456
    assert trail[1].tier == "typed"


def test_trail_survives_unicode_and_quotes(store: Store) -> None:
    create(store, "a", "1")
    why = 'exit 1: "quoted", back\\slash, ünïcode ✓, ]}, newline\nend'
    store.transition("a", "running", trail=TrailEntry(tier="code", outcome="moved-up", why=why))
    store.transition("a", "running", trail=TrailEntry(tier="code", outcome="moved-up", why=why))
    assert [t.why for t in store.get("a").trail] == [why, why]  # type: ignore[union-attr]


# --- session lines ----------------------------------------------------------------------------------


def test_session_line_membership_follows_the_status(store: Store) -> None:
    line = keys.session_line()
    store.create_many(
        [entry("a", "1", tier="session", line=line), entry("b", "2", tier="session", line=line)]
    )
    assert store.line_ids(line) == ["a", "b"]  # FIFO at equal priority
    store.transition("a", "waiting")
    assert store.line_ids(line) == ["a", "b"]  # still waits its turn
    store.transition("a", "running")
    assert store.line_ids(line) == ["b"]
    store.transition("b", "cancelled")
    assert store.line_ids(line) == []


def test_line_orders_by_priority_then_fifo(store: Store) -> None:
    line = keys.session_line("host-1")
    for jid in ("a", "b", "c"):
        create(store, jid, jid, tier="session")
    store.add_to_line("a", line, 1.0)
    store.add_to_line("b", line, 3.0)
    store.add_to_line("c", line, 1.0)
    assert store.line_ids(line) == ["b", "a", "c"]
    store.add_to_line("c", line, 1.0, front=True)
    assert store.line_ids(line) == ["b", "c", "a"]


# --- prune ------------------------------------------------------------------------------------------


def test_prune_drops_only_index_entries_of_expired_records(store: Store, redis_client: Any) -> None:
    create(store, "gone", "1")
    create(store, "kept", "2")
    store.transition("gone", "answered", fields={"tier": "code"})
    redis_client.delete(keys.record("gone"))  # what the TTL does
    assert store.prune() == 1
    assert store.ids() == ["kept"]
    assert index_of(store, "gone") == []
    assert index_of(store, "kept") == ["queued"]
    assert store.prune() == 0


def test_worker_deaths_are_counted_atomically_on_the_record_and_a_retry_starts_again(store: Store) -> None:
    create(store, "j1", "k1")
    assert store.get("j1") is not None and not hasattr(store.get("j1"), "deaths")  # none yet: no field
    assert [store.add_death("j1") for _ in range(3)] == [1, 2, 3]
    assert getattr(store.get("j1"), "deaths", None) == 3
    store.forget_deaths("j1")
    assert store.add_death("j1") == 1


def test_one_process_at_a_time_takes_the_reconcile_turn(store: Store) -> None:
    assert store.take_reconcile_turn("worker-a", ttl=30)
    assert not store.take_reconcile_turn("worker-b", ttl=30)  # a's turn until it expires
    store.redis.delete(keys.RECONCILE_TURN)
    assert store.take_reconcile_turn("worker-b", ttl=30)


def test_a_server_at_maxmemory_is_seen_refusing_writes_until_it_has_room(store: Store) -> None:
    assert store.accepts_writes()
    used = int(store.redis.info("memory")["used_memory"])
    store.redis.config_set("maxmemory", str(max(1, used // 2)))
    try:
        assert not store.accepts_writes()
    finally:
        store.redis.config_set("maxmemory", "0")
    assert store.accepts_writes()


def test_a_watched_record_reads_as_it_is_now(store: Store) -> None:
    create(store, "j1", "k1")
    with store.redis.pipeline(transaction=True) as pipe:
        assert Store.watch_record(pipe, "j1") == ("queued", None)
        assert Store.watch_record(pipe, "nope") == (None, None)
