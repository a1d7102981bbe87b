"""The index by last update (`storage.stale`) follows every record, and a pass reads only the old.

Each test compares the index with the records (the truth: every record queued at a tier not
admitted through a line, at its `updated`) after the moves a judgement makes; then shows that
reconciliation's read returns the old queued records and reads no other record (a backlog of
fresh ones, or of session judgements however old, costs no record read), and that a store
written before the index is scanned until the backfill marks it.
"""

from __future__ import annotations

from typing import Any

import pytest

from dispatchq.client import Client
from dispatchq.core.tiers import batch_tiers
from dispatchq.queue.scheduler import reconcile
from dispatchq.queue.upgrade import backfill_stale_index, ensure_upgraded
from dispatchq.storage import keys, scripts, stale
from dispatchq.storage.store import NewRecord, Store
from tests.support.helpers import write_check_module, write_config
from tests.support.stale import assert_stale_index_exact, stale_truth
from tests.support.store import clock, enqueue_at, new_record

NOW = 2_000_000_000.0  # the pass's instant: fixed, so every score is exact
BEFORE = NOW - 60  # reconciliation's default age: updated before this is old


def entry(jid: str, *, tier: str = "", line: str = "", job: str = "") -> NewRecord:
    """A record at `tier` (a session one when it joins a `line`, else code)."""
    return new_record(jid, tier=tier or ("session" if line else "code"), line=line, job=job)


def at(monkeypatch: pytest.MonkeyPatch, when: float, move: Any) -> Any:
    """`move()` with the clock at `when` (the record's `updated`)."""
    with clock(monkeypatch, when):
        return move()


def test_the_index_follows_a_record_through_enqueue_claim_requeue_answer_and_prune(
    counted_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = counted_store
    line = keys.session_line()
    first = [entry("c0"), entry("t0", tier="typed"), entry("s0", line=line)]
    enqueue_at(store, monkeypatch, NOW - 500, first)
    enqueue_at(store, monkeypatch, NOW - 400, [entry("c1"), entry("c2"), entry("s1", line=line)])
    assert store.redis.get(keys.QUEUED_BY_UPDATE_INDEXED) is not None  # a fresh store: marked at once
    assert stale.indexed(store.redis) == {"c0": NOW - 500, "t0": NOW - 500, "c1": NOW - 400, "c2": NOW - 400}
    assert_stale_index_exact(store)

    # Claimed: out. Requeued (a dead job, reconciliation's put-back): in again, at the requeue.
    assert [c.id for c in at(monkeypatch, NOW - 300, lambda: store.claim(["c0"], "code"))] == ["c0"]
    assert "c0" not in stale.indexed(store.redis)
    assert at(monkeypatch, NOW - 200, lambda: store.transition("c0", "queued", expect=["running"]))
    assert stale.indexed(store.redis)["c0"] == NOW - 200
    assert_stale_index_exact(store)

    # Escalated to typed: still queued at a batch tier, at the escalation's time; to a session
    # line: out (the session backlog is never indexed).
    assert at(
        monkeypatch,
        NOW - 100,
        lambda: store.transition("c1", "queued", expect=["queued"], fields={"tier": "typed"}),
    )
    assert stale.indexed(store.redis)["c1"] == NOW - 100
    assert at(
        monkeypatch,
        NOW - 90,
        lambda: store.transition("c2", "queued", expect=["queued"], fields={"tier": "session"}),
    )
    store.add_to_line("c2", line, None)
    assert "c2" not in stale.indexed(store.redis)
    assert_stale_index_exact(store)

    # Answered (claimed then settled) and cancelled straight from queued: out.
    store.claim(["t0"], "typed")
    assert store.transition("t0", "answered", expect=["running"], fields={"tier": "typed", "value": True})
    assert store.transition("c1", "cancelled", fields={"reason": "cancelled by request"})
    assert set(stale.indexed(store.redis)) == {"c0"}
    assert_stale_index_exact(store)

    # A record deleted behind the index's back (its key gone): a full prune drops its entry.
    enqueue_at(store, monkeypatch, NOW - 50, [entry("gone")])
    store.redis.delete(keys.record("gone"))
    assert "gone" in stale.indexed(store.redis)
    assert store.prune(everything=True) >= 1
    assert set(stale.indexed(store.redis)) == {"c0"}


def test_a_pass_reads_the_old_records_only_not_the_fresh_backlog_nor_the_session_line(
    counted_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = counted_store
    line = keys.session_line()
    # Old: two code records of one job, one typed record without a job, 400 session judgements.
    enqueue_at(
        store,
        monkeypatch,
        NOW - 500,
        [entry("old-a", job="j1"), entry("old-b", job="j1"), entry("old-t", tier="typed")]
        + [entry(f"s{i}", tier="session", line=line) for i in range(400)],
    )
    # Fresh: a backlog of 1,500 code records (more than one chunk), enqueued within the minute.
    enqueue_at(store, monkeypatch, NOW - 10, [entry(f"f{i}", job=f"jf{i // 50}") for i in range(1_500)])

    firsts = stale.find(store.redis, "queued", batch_tiers(), BEFORE, "*")
    assert sorted(job for _, job in firsts.found) == ["", "j1"]  # one record per job
    assert {jid for jid, _ in firsts.found} <= {"old-a", "old-b", "old-t"}
    assert firsts.read == 3  # the three old batch records; no fresh one, no session judgement
    assert sorted(store.stale("queued", batch_tiers(), BEFORE, jobs=["j1"])) == [
        ("old-a", "j1"),
        ("old-b", "j1"),
    ]
    # The scan answers the same, having read the whole status set to do so.
    whole_set = store.redis.register_script(scripts.STALE)
    scanned = stale.scan(whole_set, "queued", batch_tiers(), BEFORE, "*").found
    assert sorted(job for _, job in scanned) == ["", "j1"]

    # A fresh backlog alone costs no record read at all.
    store.transition("old-a", "cancelled")
    store.transition("old-b", "cancelled")
    store.transition("old-t", "cancelled")
    nothing = stale.find(store.redis, "queued", batch_tiers(), BEFORE, "*")
    assert nothing.found == [] and nothing.read == 0
    # Every one of them, once old: read and found, one per job, across chunks.
    later = stale.find(store.redis, "queued", batch_tiers(), NOW, "*", chunk=400)
    assert sorted(job for _, job in later.found) == sorted({f"jf{i}" for i in range(30)})
    assert later.read == 1_500


def test_the_read_drops_an_entry_whose_record_moved_behind_its_back_and_finds_the_rest(
    counted_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record moved by a process of an older release (no index kept) is not a candidate: an
    answered one leaves the index, a fresh one moves to its real time, and paging by chunks of
    2 still finds every old record."""
    store = counted_store
    enqueue_at(store, monkeypatch, NOW - 500, [entry(f"o{i}") for i in range(7)])
    store.redis.hset(keys.record("o1"), "status", "answered")
    store.redis.hset(keys.record("o4"), "updated", repr(NOW - 5))

    found = stale.find(store.redis, "queued", ("code",), BEFORE, "*", chunk=2)
    assert sorted(jid for jid, _ in found.found) == ["o0", "o2", "o3", "o5", "o6"]
    assert "o1" not in stale.indexed(store.redis)
    assert stale.indexed(store.redis)["o4"] == NOW - 5
    again = stale.find(store.redis, "queued", ("code",), BEFORE, "*", chunk=2)
    assert again.read == 5  # o1 and o4 are not read again
    assert stale.find(store.redis, "queued", ("typed",), BEFORE, "*").found == []  # another tier


def test_a_store_written_before_the_index_is_scanned_until_backfilled(
    counted_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = counted_store
    line = keys.session_line()
    enqueue_at(store, monkeypatch, NOW - 700, [entry("oldc"), entry("olds", tier="session", line=line)])
    enqueue_at(store, monkeypatch, NOW - 650, [entry("oldt", tier="typed")])
    # As a store of the release before the index: its records, no index and no mark.
    store.redis.delete(keys.QUEUED_BY_UPDATE_INDEXED, keys.QUEUED_BY_UPDATE)

    # New writes keep the index for what they touch, but do not mark it: the old records are not in it.
    enqueue_at(store, monkeypatch, NOW - 10, [entry("new0")])
    assert store.redis.get(keys.QUEUED_BY_UPDATE_INDEXED) is None
    assert set(stale.indexed(store.redis)) == {"new0"}
    assert not stale.usable(store.redis, "queued", batch_tiers())
    # Meanwhile the pass scans, and still finds the old records the index does not hold.
    assert sorted(store.stale("queued", batch_tiers(), BEFORE)) == [("oldc", ""), ("oldt", "")]

    ensure_upgraded(store.redis)  # what a worker and the scheduler run before their first job
    assert store.redis.get(keys.QUEUED_BY_UPDATE_INDEXED) == b"2"  # oldc and oldt; new0 was there
    assert_stale_index_exact(store)
    assert stale.usable(store.redis, "queued", batch_tiers())
    assert sorted(store.stale("queued", batch_tiers(), BEFORE)) == [("oldc", ""), ("oldt", "")]
    assert backfill_stale_index(store.redis) is None  # once per store
    assert stale_truth(store) == {"oldc": NOW - 700, "oldt": NOW - 650, "new0": NOW - 10}


def test_the_index_is_used_only_for_queued_batch_tiers(counted_store: Store) -> None:
    """Another status or a line tier is asked of the scan, which knows every status and tier."""
    store = counted_store
    store.create_many([entry("c")])
    assert stale.usable(store.redis, "queued", ("code", "typed"))
    assert not stale.usable(store.redis, "running", ("code",))
    assert not stale.usable(store.redis, "queued", ("code", *stale.line_tiers()))


class _ClaimedBetweenCalls:
    """A client whose read script lets a worker claim records between its first and second call."""

    def __init__(self, store: Store, claimed: list[str]) -> None:
        self.store, self.claimed = store, claimed

    def register_script(self, text: str) -> Any:
        script = self.store.redis.register_script(text)
        calls = []

        def run(**kwargs: Any) -> Any:
            if len(calls) == 1:
                assert [c.id for c in self.store.claim(self.claimed, "code")] == self.claimed
            calls.append(kwargs)
            return script(**kwargs)

        return run


def test_a_pass_resumes_after_the_last_record_it_kept_when_records_it_read_leave_meanwhile(
    counted_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers take the oldest records while a pass pages through them: the next chunk starts
    after the last record the pass kept, where it stands now, not at a rank that has moved."""
    store = counted_store
    enqueue_at(store, monkeypatch, NOW - 500, [entry(f"o{i}") for i in range(6)])  # one score: o0..o5
    client: Any = _ClaimedBetweenCalls(store, ["o0"])
    found = stale.find(client, "queued", ("code",), BEFORE, "*", chunk=2)
    assert [jid for jid, _ in found.found] == ["o0", "o1", "o2", "o3", "o4", "o5"]


def test_reconcile_over_a_fresh_code_backlog_and_a_session_line_reads_no_record(
    make_runtime: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole pass, counted by the server itself: with 300 code judgements queued within the
    minute and 300 session judgements in their line, Redis reads no record (no HMGET, HGET or
    HGETALL); the status set's scan read each of the 600."""
    module = write_check_module(tmp_path, "def check(judgement):\n    return 1\n")
    write_config(
        tmp_path / "dispatchq.yaml",
        f"kinds:\n  one:\n    check: {module}:check\n"
        '  ask:\n    session:\n      prompt: "Answer {{ target }}"\n',
    )
    rt = make_runtime(DISPATCHQ_BATCH_SIZE="50")
    client = Client(runtime=rt)
    client.enqueue_many([{"kind": "one", "target": f"c{i}"} for i in range(300)])
    client.enqueue_many([{"kind": "ask", "target": f"s{i}"} for i in range(300)])
    assert rt.storage.records.line_depth([keys.session_line()]) == 300

    def record_reads() -> tuple[int, int]:
        rt.redis.config_resetstat()
        healed = reconcile(rt)  # the default age: everything here is fresh
        stats = rt.redis.info("commandstats")
        return healed, sum(
            int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hmget", "hget", "hgetall")
        )

    assert record_reads() == (0, 0)
    with monkeypatch.context() as patched:
        patched.setattr(stale, "usable", lambda *_: False)
        assert record_reads() == (0, 600)
