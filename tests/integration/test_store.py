"""dispatchq's own records, on a real Redis: every change one script, indexes always agreeing.

These drive `Store` directly (no RQ, no config): creation and idempotency, claims,
transitions with their expectations, the result TTL, the trail, counters and prune.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from dispatchq.core.judgement import FINISHED, STATUSES, TrailEntry
from dispatchq.storage import directory, keys, scripts
from dispatchq.storage.store import NewRecord, Store
from tests.support.store import TTL, new_record


def entry(jid: str, ckey: str, *, force: bool = False, tier: str = "code", line: str = "") -> NewRecord:
    return new_record(jid, tier=tier, ckey=ckey, line=line, force=force, target="t")


def create(store: Store, jid: str, ckey: str, *, force: bool = False, tier: str = "code") -> tuple[str, bool]:
    result = store.create_many([entry(jid, ckey, force=force, tier=tier)])
    assert result is not None
    return result[0]


def index_of(store: Store, jid: str) -> list[str]:
    """Every status index the id is in: exactly one, always."""
    return [s for s in STATUSES if jid in store.ids(s)]


# --- creation and idempotency -------------------------------------------------------------------


def test_create_writes_record_and_indexes(ttl_store: Store, redis_client: Any) -> None:
    assert create(ttl_store, "a", "ck-a") == ("a", True)
    record = ttl_store.get("a")
    assert record is not None
    assert (record.status, record.tier, record.kind, record.target) == ("queued", "code", "k", "t")
    assert record.content_key == "ck-a" and record.trail == []
    assert index_of(ttl_store, "a") == ["queued"]
    assert ttl_store.ids() == ["a"]
    assert redis_client.hget(*keys.live_key("ck-a")) == b"a"  # live: one field of a small hash
    assert redis_client.get(keys.idempotency("ck-a")) is None
    assert redis_client.ttl(keys.record("a")) == -1  # unfinished: never expires


def test_duplicate_returns_the_live_id_and_creates_nothing(ttl_store: Store, redis_client: Any) -> None:
    create(ttl_store, "a", "same")
    assert create(ttl_store, "b", "same") == ("a", False)
    assert ttl_store.get("b") is None
    assert ttl_store.ids() == ["a"]


def test_duplicates_within_one_batch(ttl_store: Store) -> None:
    result = ttl_store.create_many([entry("a", "same"), entry("b", "same"), entry("c", "other")])
    assert result == [("a", True), ("a", False), ("c", True)]


@pytest.mark.parametrize("status", ["queued", "running", "waiting", "answered", "needs-triage"])
def test_a_live_or_answered_judgement_blocks_its_key(ttl_store: Store, status: str) -> None:
    create(ttl_store, "a", "same")
    ttl_store.transition("a", status, expect=["queued"])
    assert create(ttl_store, "b", "same") == ("a", False)


@pytest.mark.parametrize("status", ["failed", "cancelled"])
def test_a_failed_or_cancelled_judgement_frees_its_key(
    ttl_store: Store, redis_client: Any, status: str
) -> None:
    create(ttl_store, "a", "same")
    ttl_store.transition("a", status)
    assert create(ttl_store, "b", "same") == ("b", True)
    assert redis_client.hget(*keys.live_key("same")) == b"b"
    # The new live judgement's key must not inherit the old one's expiry: the old one's expires.
    assert redis_client.ttl(keys.live_key("same")[0]) == -1
    assert redis_client.get(keys.idempotency("same")) == b"a"
    assert 0 < redis_client.ttl(keys.idempotency("same")) <= TTL


def test_content_keys_sharing_the_part_the_live_hash_holds_are_still_two_judgements(
    ttl_store: Store, redis_client: Any
) -> None:
    # The live hash is found by 24 characters of the key; the record's whole key decides.
    first, second = "c" * 24 + "1", "c" * 24 + "2"
    assert keys.live_key(first) == keys.live_key(second)
    create(ttl_store, "a", first)
    assert create(ttl_store, "b", second) == ("b", True)
    assert redis_client.hget(*keys.live_key(second)) == b"b"
    assert create(ttl_store, "c", second) == ("b", False)


def test_force_creates_a_new_judgement_even_when_one_is_live(ttl_store: Store) -> None:
    create(ttl_store, "a", "same")
    assert create(ttl_store, "b", "same", force=True) == ("b", True)
    assert create(ttl_store, "c", "same") == ("b", False)
    assert ttl_store.get("a") is not None  # the old one is untouched


def test_an_expired_record_frees_its_key(ttl_store: Store, redis_client: Any) -> None:
    create(ttl_store, "a", "same")
    redis_client.delete(keys.record("a"))
    assert create(ttl_store, "b", "same") == ("b", True)


# --- claims ---------------------------------------------------------------------------------------


def test_claim_takes_only_claimable_records_of_the_tier(ttl_store: Store) -> None:
    create(ttl_store, "a", "1")
    create(ttl_store, "b", "2", tier="typed")
    create(ttl_store, "c", "3")
    ttl_store.transition("c", "cancelled")
    claimed = ttl_store.claim(["a", "b", "c", "missing"], "code")
    assert [c.id for c in claimed] == ["a"]
    assert claimed[0].input == {"kind": "k", "target": "t"} and claimed[0].was == "queued"
    assert index_of(ttl_store, "a") == ["running"]
    assert index_of(ttl_store, "b") == ["queued"] and index_of(ttl_store, "c") == ["cancelled"]


def test_a_running_record_is_claimed_again_by_a_retried_job(ttl_store: Store) -> None:
    create(ttl_store, "a", "1")
    assert ttl_store.claim(["a"], "code")[0].was == "queued"
    again = ttl_store.claim(["a"], "code")  # the worker that held it died; RQ retries the job
    assert [c.was for c in again] == ["running"]
    assert index_of(ttl_store, "a") == ["running"]


def test_a_finished_record_is_never_claimed(ttl_store: Store) -> None:
    create(ttl_store, "a", "1")
    ttl_store.claim(["a"], "code")
    ttl_store.transition("a", "answered", expect=["running"], fields={"tier": "code", "value": 1})
    assert ttl_store.claim(["a"], "code") == []
    assert ttl_store.get("a").value == 1  # type: ignore[union-attr]


# --- transitions ------------------------------------------------------------------------------------


def test_transition_respects_expect(ttl_store: Store) -> None:
    create(ttl_store, "a", "1")
    assert ttl_store.transition("a", "answered", expect=["running"]) is False
    assert ttl_store.get("a").status == "queued"  # type: ignore[union-attr]
    assert ttl_store.transition("a", "running", expect=["queued"]) is True
    assert ttl_store.transition("missing", "running") is False


def test_default_expect_never_reopens_a_finished_record(ttl_store: Store) -> None:
    create(ttl_store, "a", "1")
    ttl_store.transition("a", "cancelled")
    assert ttl_store.transition("a", "answered") is False  # e.g. a late worker commit
    assert ttl_store.get("a").status == "cancelled"  # type: ignore[union-attr]


@pytest.mark.parametrize("status", sorted(FINISHED))
def test_finished_records_get_the_result_ttl(ttl_store: Store, redis_client: Any, status: str) -> None:
    create(ttl_store, "a", "ck")
    ttl_store.transition("a", status)
    assert 0 < redis_client.ttl(keys.record("a")) <= TTL
    assert 0 < redis_client.ttl(keys.idempotency("ck")) <= TTL  # moved out of the live hash
    assert redis_client.hget(*keys.live_key("ck")) is None


@pytest.mark.parametrize("status", ["running", "waiting"])
def test_unfinished_records_never_expire(ttl_store: Store, redis_client: Any, status: str) -> None:
    create(ttl_store, "a", "ck")
    ttl_store.transition("a", status)
    assert redis_client.ttl(keys.record("a")) == -1


def test_requeued_finished_record_loses_its_ttl(ttl_store: Store, redis_client: Any) -> None:
    create(ttl_store, "a", "ck")
    ttl_store.transition("a", "answered")
    assert redis_client.ttl(keys.record("a")) > 0
    ttl_store.transition("a", "queued", expect=["answered"])  # `retry`
    assert redis_client.ttl(keys.record("a")) == -1
    assert redis_client.hget(*keys.live_key("ck")) == b"a"  # live again: back in the hash
    assert not redis_client.exists(keys.idempotency("ck"))
    assert create(ttl_store, "b", "ck") == ("a", False)


def test_status_index_follows_every_move(ttl_store: Store) -> None:
    create(ttl_store, "a", "1")
    for status in ("running", "waiting", "running", "needs-triage"):
        ttl_store.transition("a", status, expect=[])
        assert index_of(ttl_store, "a") == [status]
        assert ttl_store.count(status) == 1


def test_fields_are_set_and_deleted(ttl_store: Store) -> None:
    create(ttl_store, "a", "1")
    ttl_store.transition("a", "running", fields={"value": {"x": [1, 2]}, "confidence": 0.75, "reason": "r"})
    record = ttl_store.get("a")
    assert record is not None and (record.value, record.confidence, record.reason) == (
        {"x": [1, 2]},
        0.75,
        "r",
    )
    ttl_store.transition("a", "queued", delete=["value", "confidence", "reason"])
    record = ttl_store.get("a")
    assert record is not None and (record.value, record.confidence, record.reason) == (None, None, None)


def test_false_and_zero_answers_survive_the_round_trip(ttl_store: Store) -> None:
    for jid, value in (("f", False), ("z", 0), ("e", ""), ("l", [])):
        create(ttl_store, jid, jid)
        ttl_store.transition(jid, "answered", fields={"tier": "code", "value": value})
        record = ttl_store.get(jid)
        assert record is not None and record.value == value and type(record.value) is type(value)


def test_answered_counter_counts_per_tier(ttl_store: Store) -> None:
    for jid, tier in (("a", "code"), ("b", "code"), ("c", "typed")):
        create(ttl_store, jid, jid)
        ttl_store.transition(jid, "answered", fields={"tier": tier, "value": 1})
    create(ttl_store, "d", "d")
    ttl_store.transition("d", "failed", fields={"tier": "code"})
    assert ttl_store.answered_counts() == {"code": 2, "typed": 1, "session": 0}


# --- the trail ------------------------------------------------------------------------------------


def test_trail_entries_append_in_order(ttl_store: Store) -> None:
    create(ttl_store, "a", "1")
    ttl_store.transition("a", "running", trail=TrailEntry(tier="code", outcome="moved-up", why="cannot tell"))
    ttl_store.transition(
        "a", "answered", trail=TrailEntry(tier="typed", outcome="answered", why="0.9 >= 0.6")
    )
    trail = ttl_store.get("a").trail  # type: ignore[union-attr]
    assert [(t.tier, t.outcome, t.why) for t in trail] == [
        ("code", "moved-up", "cannot tell"),
        ("typed", "answered", "0.9 >= 0.6"),
    ]


def test_trail_entries_keep_their_exact_json(ttl_store: Store) -> None:
    """Extras on a trail entry come back as they went in: lists stay lists, numbers keep their digits."""
    create(ttl_store, "a", "1")
    first = TrailEntry(
        tier="code",
        outcome="moved-up",
        why="verify failed",
        at=1712345678.123456,
        commands=[],
        numbers={"confidences": {}, "ids": [12345678901234567]},
        note=None,
    )
    ttl_store.transition("a", "running", trail=first)
    ttl_store.transition("a", "running", trail=TrailEntry(tier="typed", outcome="moved-up", why="keyless"))
    trail = ttl_store.get("a").trail  # type: ignore[union-attr]
    assert trail[0].model_dump() == first.model_dump()
    assert trail[0].commands == []  # type: ignore[attr-defined]
    assert trail[0].numbers == {"confidences": {}, "ids": [12345678901234567]}  # type: ignore[attr-defined]
    assert trail[0].at == 1712345678.123456
    assert trail[1].tier == "typed"


def test_trail_survives_unicode_and_quotes(ttl_store: Store) -> None:
    create(ttl_store, "a", "1")
    why = 'exit 1: "quoted", back\\slash, ünïcode ✓, ]}, newline\nend'
    ttl_store.transition("a", "running", trail=TrailEntry(tier="code", outcome="moved-up", why=why))
    ttl_store.transition("a", "running", trail=TrailEntry(tier="code", outcome="moved-up", why=why))
    assert [t.why for t in ttl_store.get("a").trail] == [why, why]  # type: ignore[union-attr]


# --- session lines ----------------------------------------------------------------------------------


def test_session_line_membership_follows_the_status(ttl_store: Store) -> None:
    line = keys.session_line()
    ttl_store.create_many(
        [entry("a", "1", tier="session", line=line), entry("b", "2", tier="session", line=line)]
    )
    assert ttl_store.line_ids(line) == ["a", "b"]  # FIFO at equal priority
    ttl_store.transition("a", "waiting")
    assert ttl_store.line_ids(line) == ["a", "b"]  # still waits its turn
    ttl_store.transition("a", "running")
    assert ttl_store.line_ids(line) == ["b"]
    ttl_store.transition("b", "cancelled")
    assert ttl_store.line_ids(line) == []


def test_line_orders_by_priority_then_fifo(ttl_store: Store) -> None:
    line = keys.session_line("host-1")
    for jid in ("a", "b", "c"):
        create(ttl_store, jid, jid, tier="session")
    ttl_store.add_to_line("a", line, 1.0)
    ttl_store.add_to_line("b", line, 3.0)
    ttl_store.add_to_line("c", line, 1.0)
    assert ttl_store.line_ids(line) == ["b", "a", "c"]
    ttl_store.add_to_line("c", line, 1.0, front=True)
    assert ttl_store.line_ids(line) == ["b", "c", "a"]


# --- prune ------------------------------------------------------------------------------------------


def test_prune_drops_only_index_entries_of_expired_records(ttl_store: Store, redis_client: Any) -> None:
    create(ttl_store, "gone", "1")
    create(ttl_store, "kept", "2")
    ttl_store.transition("gone", "answered", fields={"tier": "code"})
    redis_client.delete(keys.record("gone"))  # what the TTL does
    assert ttl_store.prune() == 0  # reads only what is due to have expired by now
    assert directory.prune(redis_client, now=time.time() + TTL + 1) == 1
    assert ttl_store.ids() == ["kept"]
    assert index_of(ttl_store, "gone") == []
    assert index_of(ttl_store, "kept") == ["queued"]
    assert not redis_client.zscore(keys.EXPIRING, "gone")
    assert ttl_store.prune(everything=True) == 0


def test_a_full_prune_also_drops_records_deleted_early(ttl_store: Store, redis_client: Any) -> None:
    create(ttl_store, "gone", "1")
    create(ttl_store, "kept", "2")
    redis_client.delete(keys.record("gone"))  # by hand, unfinished: never due to expire
    assert ttl_store.prune() == 0
    assert ttl_store.prune(everything=True) == 1
    assert ttl_store.ids() == ["kept"]


def test_worker_deaths_are_counted_atomically_on_the_record_and_a_retry_starts_again(
    ttl_store: Store,
) -> None:
    create(ttl_store, "j1", "k1")
    assert ttl_store.get("j1") is not None and not hasattr(
        ttl_store.get("j1"), "deaths"
    )  # none yet: no field
    assert [ttl_store.add_death("j1") for _ in range(3)] == [1, 2, 3]
    assert getattr(ttl_store.get("j1"), "deaths", None) == 3
    ttl_store.forget_deaths("j1")
    assert ttl_store.add_death("j1") == 1


def test_one_process_at_a_time_takes_the_reconcile_turn(ttl_store: Store) -> None:
    assert ttl_store.take_reconcile_turn("worker-a", ttl=30)
    assert not ttl_store.take_reconcile_turn("worker-b", ttl=30)  # a's turn until it expires
    ttl_store.redis.delete(keys.RECONCILE_TURN)
    assert ttl_store.take_reconcile_turn("worker-b", ttl=30)


def test_a_server_at_maxmemory_is_seen_refusing_writes_until_it_has_room(ttl_store: Store) -> None:
    assert ttl_store.accepts_writes()
    used = int(ttl_store.redis.info("memory")["used_memory"])
    ttl_store.redis.config_set("maxmemory", str(max(1, used // 2)))
    try:
        assert not ttl_store.accepts_writes()
    finally:
        ttl_store.redis.config_set("maxmemory", "0")
    assert ttl_store.accepts_writes()


def test_a_watched_record_reads_as_it_is_now(ttl_store: Store) -> None:
    create(ttl_store, "j1", "k1")
    with ttl_store.redis.pipeline(transaction=True) as pipe:
        assert Store.watch_record(pipe, "j1") == ("queued", None)
        assert Store.watch_record(pipe, "nope") == (None, None)


def test_reconciliations_scan_replies_one_record_per_job_not_every_record(
    ttl_store: Store, redis_client: Any
) -> None:
    # A backlog of a job's batch costs one reply, not one per record (the filter is in Lua:
    # the caller's own de-duplication would hide a reply that grew with the batch).
    for n in range(3):
        ttl_store.create_many([entry(f"b{n}", f"ck{n}")._replace(job="job-1")])
    ttl_store.create_many([entry("solo", "ck-solo")])
    scan = redis_client.register_script(scripts.STALE)
    before = repr(time.time() + 60)
    reply = scan(keys=[keys.status_index("queued")], args=["0", "queued", "code", before, "*"])
    pairs = list(zip(reply[1::2], reply[2::2], strict=True))
    assert sorted(job for _, job in pairs) == [b"", b"job-1"]
    every = scan(keys=[keys.status_index("queued")], args=["0", "queued", "code", before, ",job-1,"])
    assert sorted(every[1::2]) == [b"b0", b"b1", b"b2"]
