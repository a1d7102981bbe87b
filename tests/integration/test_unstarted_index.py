"""The oldest-waiting index (`storage.unstarted`) stays exact, and `/metrics` reads its ages from it.

Each test compares the index with the records (the truth: every queued or waiting record's
tier and enqueue time) after the moves a judgement makes: enqueue, claim, wait, admission
from a line, escalation, answer, fail, cancel, requeue, retry, a tier change; through the
dispatcher and the window; and after an upgrade from a store written before the index, where
the bounded scan answers until the backfill marks the store.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dispatchq.core.tiers import TIERS
from dispatchq.queue.upgrade import backfill_unstarted_index, ensure_upgraded
from dispatchq.serve.metrics import StoreCollector
from dispatchq.storage import histograms, keys, unstarted
from dispatchq.storage.store import NewRecord, Store
from tests.support.helpers import write_check_module
from tests.support.store import clock, enqueue_at, new_record
from tests.support.unstarted import assert_index_exact, unstarted_truth

NOW = 2_000_000_000.0  # the instant ages are read at: fixed, so every figure is exact


def entry(jid: str, *, tier: str = "session", line: str = "") -> NewRecord:
    return new_record(jid, tier=tier, line=line)


def expected_ages(store: Store) -> dict[str, float]:
    ages = unstarted_truth(store).items()
    return {t: NOW - min(ids.values()) if ids else 0.0 for t, ids in ages if t in TIERS}


def assert_exact(store: Store) -> None:
    """The index holds exactly the unstarted records, and the ages it gives are theirs."""
    assert_index_exact(store)
    assert unstarted.oldest_waiting(store.redis, NOW) == expected_ages(store)


def test_the_index_follows_every_move_of_a_record(
    counted_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = counted_store
    line = keys.session_line()
    enqueue_at(store, monkeypatch, NOW - 500, [entry("s0", line=line), entry("c0", tier="code")])
    enqueue_at(store, monkeypatch, NOW - 400, [entry(f"s{i}", line=line) for i in (1, 2, 3)])
    enqueue_at(store, monkeypatch, NOW - 300, [entry("c1", tier="code"), entry("t0", tier="typed")])
    assert store.redis.get(keys.UNSTARTED_INDEXED) is not None  # a fresh store: marked at its first change
    assert_exact(store)
    assert unstarted.oldest_waiting(store.redis, NOW) == {"code": 500.0, "typed": 300.0, "session": 500.0}

    # Waiting keeps a judgement in its tier's index; a new reason changes nothing there.
    for jid in ("s0", "s1"):
        assert store.transition(jid, "waiting", expect=["queued"], fields={"reason": "window closed"})
    store.set_fields("s1", reason="all 2 session slot(s) busy")
    assert_exact(store)

    # Started: claimed by a tier (from queued and from waiting), admitted from a line.
    assert [c.id for c in store.claim(["c0"], "code")] == ["c0"]
    assert [c.id for c in store.claim(["s1"], "session")] == ["s1"]
    member = next(m.decode() for m in store.redis.zrange(line, 0, -1) if m.decode().endswith(":s0"))
    assert store.claim_from_line(line, member, "s0")
    assert_exact(store)
    assert unstarted.oldest_waiting(store.redis, NOW)["session"] == 400.0
    assert unstarted.oldest_waiting(store.redis, NOW)["code"] == 300.0

    # Requeued from running (a refused spawn, a dead job): back in the index at its enqueue time.
    assert store.transition("s0", "waiting", expect=["running"], fields={"reason": "window closed"})
    assert store.transition("c0", "queued", expect=["running"])
    assert_exact(store)
    assert unstarted.oldest_waiting(store.redis, NOW) == {"code": 500.0, "typed": 300.0, "session": 500.0}

    # Escalated: out of the tier it left, into the one it joins, in one move.
    assert store.transition("c1", "queued", expect=["queued"], fields={"tier": "typed"})
    assert store.set_fields("s2", tier="typed")  # a tier change while unstarted
    assert_exact(store)
    assert set(unstarted.indexed(store.redis, "typed")) == {"t0", "c1", "s2"}

    # Finished every way: answered, failed, cancelled, needs-triage.
    assert store.transition("s1", "answered", expect=["running"], fields={"tier": "session", "value": True})
    assert store.transition("s0", "failed", fields={"reason": "session failed: boom"})
    assert store.transition("c0", "cancelled", fields={"reason": "cancelled by request"})
    assert store.transition("t0", "needs-triage", fields={"tier": "needs-triage", "reason": "no tier"})
    assert_exact(store)
    assert unstarted.oldest_waiting(store.redis, NOW) == {"code": 0.0, "typed": 400.0, "session": 400.0}

    # Retried after failing: unstarted again, at its first enqueue time.
    store.set_fields("s0", tier="session")
    assert store.transition("s0", "queued", expect=["failed"], delete=["reason"])
    assert_exact(store)
    assert unstarted.oldest_waiting(store.redis, NOW)["session"] == 500.0


def test_the_dispatcher_and_the_window_keep_the_index_and_metrics_read_it(
    make_runtime: Any, dq_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatchq.client import Client

    config = Path(dq_env["DISPATCHQ_CONFIG"])
    module = write_check_module(
        config.parent, "def noop(j):\n    return j.target\n"
    )  # its own name in-process
    config.write_text(
        'kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n'
        f"  noop:\n    check: {module}:noop\n"
    )
    rt = make_runtime()
    store = rt.storage.records
    client = Client(runtime=rt)
    with clock(monkeypatch, NOW - 900):
        first = client.enqueue("ask", "o/r#0")
    with clock(monkeypatch, NOW - 600):
        later = [client.enqueue("ask", f"o/r#{i}") for i in (1, 2)]
        code = client.enqueue("noop", "o/r#c")
    assert_exact(store)

    rt.window.close(datetime.now(UTC) + timedelta(hours=2), reason="reserved for a demo")
    assert {r.status for r in store.get_many([first, *later]) if r} == {"waiting"}
    assert_exact(store)
    assert unstarted.oldest_waiting(store.redis, NOW)["session"] == 900.0

    assert rt.dispatcher.cancel(first)
    assert_exact(store)
    assert unstarted.oldest_waiting(store.redis, NOW)["session"] == 600.0
    rt.dispatcher.retry(first)  # cancelled -> queued again, at its own enqueue time
    assert_exact(store)
    assert unstarted.oldest_waiting(store.redis, NOW)["session"] == 900.0

    assert [c.id for c in store.claim([code], "code")] == [code]
    assert_exact(store)
    assert rt.dispatcher.requeue([code], "its job is gone") == 1  # reconciliation's put-back
    assert_exact(store)
    assert unstarted.oldest_waiting(store.redis, NOW)["code"] == 600.0

    # `/metrics`: the family carries the index's ages (read at the scrape's own clock), not a
    # scan's: a scan allowed one record could not see both tiers.
    monkeypatch.setattr(histograms, "OLDEST_SCAN_LIMIT", 1)
    with clock(monkeypatch, NOW):  # the scrape's clock
        families = {f.name: f for f in StoreCollector(lambda: rt).collect()}
    ages = {s.labels["tier"]: s.value for s in families["dispatchq_oldest_waiting_age_seconds"].samples}
    assert ages == {"code": 600.0, "typed": 0.0, "session": 900.0}


def test_a_store_written_before_the_index_is_counted_by_the_scan_until_backfilled(
    counted_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = counted_store
    line = keys.session_line()
    enqueue_at(store, monkeypatch, NOW - 700, [entry("old0", line=line), entry("oldc", tier="code")])
    enqueue_at(store, monkeypatch, NOW - 650, [entry("old1", line=line)])
    assert store.transition("old1", "waiting", expect=["queued"], fields={"reason": "window closed"})
    # As a store of the release before the index: its records, no index and no mark.
    store.redis.delete(keys.UNSTARTED_INDEXED, *(keys.unstarted_index(t) for t in TIERS))

    # New writes keep the index for what they touch, but do not mark it: the old records are not in it.
    enqueue_at(store, monkeypatch, NOW - 100, [entry("new0", line=line), entry("newc", tier="code")])
    assert store.redis.get(keys.UNSTARTED_INDEXED) is None
    assert set(unstarted.indexed(store.redis, "session")) == {"new0"}
    assert [c.id for c in store.claim(["old0"], "session")] == ["old0"]  # started before the backfill
    scan = histograms.oldest_waiting(store.redis, NOW)
    assert scan == {"code": 700.0, "typed": 0.0, "session": 650.0}
    assert unstarted.oldest_waiting(store.redis, NOW) == scan  # the bounded scan answers meanwhile

    ensure_upgraded(store.redis)  # what a worker and the scheduler run before their first job
    assert store.redis.get(keys.UNSTARTED_INDEXED) == b"2"  # old1 and oldc: new0 and newc were there
    assert_exact(store)
    assert unstarted.oldest_waiting(store.redis, NOW) == {"code": 700.0, "typed": 0.0, "session": 650.0}
    assert backfill_unstarted_index(store.redis) is None  # once per store


def test_a_stale_head_is_dropped_at_the_read_within_its_bound(
    counted_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry whose record moved without the index (a process of an older release) is not an age."""
    store = counted_store
    enqueue_at(store, monkeypatch, NOW - 800, [entry(f"gone{i}", tier="code") for i in range(3)])
    enqueue_at(store, monkeypatch, NOW - 200, [entry("live", tier="code")])
    for i in range(3):  # answered behind the index's back: the record says so, the index does not
        store.redis.hset(keys.record(f"gone{i}"), "status", "answered")
    monkeypatch.setattr(unstarted, "STALE_PER_READ", 2)
    # Past the bound the next head answers unchecked: an age too old, never one too young.
    assert unstarted.oldest_waiting(store.redis, NOW)["code"] == 800.0
    assert set(unstarted.indexed(store.redis, "code")) == {"gone2", "live"}
    assert unstarted.oldest_waiting(store.redis, NOW)["code"] == 200.0
    assert set(unstarted.indexed(store.redis, "code")) == {"live"}


@pytest.mark.parametrize("old_status", ["queued", "waiting"])
def test_a_store_with_only_queued_or_only_waiting_records_is_not_taken_for_a_fresh_one(
    counted_store: Store, monkeypatch: pytest.MonkeyPatch, old_status: str
) -> None:
    store = counted_store
    enqueue_at(store, monkeypatch, NOW - 300, [entry("old", line=keys.session_line())])
    if old_status == "waiting":
        assert store.transition("old", "waiting", expect=["queued"], fields={"reason": "window closed"})
    store.redis.delete(keys.UNSTARTED_INDEXED, *(keys.unstarted_index(t) for t in TIERS))

    enqueue_at(store, monkeypatch, NOW - 10, [entry("new", tier="code")])
    assert store.redis.get(keys.UNSTARTED_INDEXED) is None  # the old record is not in the index yet
    assert unstarted.oldest_waiting(store.redis, NOW) == {"code": 10.0, "typed": 0.0, "session": 300.0}


def test_a_large_batch_is_indexed_whole(counted_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """One enqueue call of more records than one ZADD takes (500 a call), over two tiers."""
    store = counted_store
    batch = [entry(f"b{i}", tier="code" if i % 3 else "typed") for i in range(1_501)]
    enqueue_at(store, monkeypatch, NOW - 60, batch)
    assert len(unstarted.indexed(store.redis, "code")) == 1_000
    assert len(unstarted.indexed(store.redis, "typed")) == 501
    assert_exact(store)


def test_a_metrics_scrape_runs_the_same_commands_with_400_waiting_as_with_40(
    make_runtime: Any,
    counted_store: Store,  # the live counts built: no rebuild in the first scrape
) -> None:
    """Every figure of `/metrics` from counts and indexes: the server's own command counts for
    one scrape do not grow with the backlog (the scan the index replaced read each record)."""
    rt = make_runtime()
    store = rt.storage.records
    line = keys.session_line()

    def wait(first: int, last: int) -> None:
        store.create_many([entry(f"s{i}", line=line) for i in range(first, last)])
        store.create_many([entry(f"c{i}", tier="code") for i in range(first, last)])
        for i in range(first, last):
            store.transition(f"s{i}", "waiting", fields={"reason": "window closed"})

    def scrape() -> tuple[dict[str, int], dict[str, float]]:
        rt.redis.config_resetstat()
        families = {f.name: f for f in StoreCollector(lambda: rt).collect()}
        stats = rt.redis.info("commandstats")
        calls = {name: int(stat["calls"]) for name, stat in stats.items() if name != "cmdstat_info"}
        ages = families["dispatchq_oldest_waiting_age_seconds"].samples
        return calls, {s.labels["tier"]: s.value for s in ages}

    wait(0, 40)
    few, _ = scrape()
    wait(40, 400)
    many, ages = scrape()
    assert many == few, {k: (few.get(k), n) for k, n in many.items() if few.get(k) != n}
    assert set(ages) == set(TIERS)
