"""Priority classes in the session line, on a real Redis: a higher class is admitted first, FIFO
within one, the typed tier's `order` score orders only within a class, and a line a store held
before classes existed keeps its order as `normal`."""

from __future__ import annotations

import json
from typing import Any

from dispatchq.client import Client
from dispatchq.core.judgement import TrailEntry
from dispatchq.queue.dispatch import Moves
from dispatchq.storage import keys
from dispatchq.storage.store import NewRecord, Store
from dispatchq.tiers.session import admit
from dispatchq.window.face import Admission
from tests.support.session import Harness


def admitted(harness: Harness) -> list[str]:
    """Admit in-process until the line is empty, freeing each slot at once: the admission order."""
    window = harness.rt.window
    order: list[str] = []
    while True:
        got = admit(window, harness.rt.settings.host, "test-holder", lambda _kind: None)
        if not isinstance(got, Admission):
            return order
        order.append(got.jid)
        window.release(got.slot, got.probes)


def test_admission_serves_urgent_then_normal_then_background_fifo_within_each(harness: Harness) -> None:
    client = Client(runtime=harness.rt)
    said = ["background", "normal", "urgent", "background", None, "urgent", "normal"]
    ids = [client.enqueue("ask", f"t{i}", priority=p) for i, p in enumerate(said)]
    background, normal, urgent, background2, unsaid, urgent2, normal2 = ids
    expected = [urgent, urgent2, normal, unsaid, normal2, background, background2]
    assert harness.line() == expected
    assert [harness.record(jid).urgency for jid in ids] == [p or "normal" for p in said]

    heads = harness.rt.storage.window.line_heads([keys.session_line()], 10)
    harness.rt.storage.window.describe(heads)
    assert [(e.jid, e.urgency) for e in heads] == [(jid, harness.record(jid).urgency) for jid in expected]

    assert admitted(harness) == expected
    assert harness.all_status(ids, "running")


def test_the_class_outranks_the_order_score_of_an_escalated_judgement(harness: Harness) -> None:
    """`Moves.move_up` knows only the id: the line takes the class from the record itself."""
    client = Client(runtime=harness.rt)
    plain = client.enqueue("ask", "plain")
    ranked = {}
    for target, priority, order in [("bg-high", "background", 9.0), ("urgent-low", "urgent", 1.0)]:
        jid = client.enqueue("ranked", target, priority=priority)
        assert harness.rt.storage.records.claim([jid], "typed")
        moves = Moves()
        moves.move_up(jid, harness.rt.config.kind("ranked"), "typed", "ordered", host=None, priority=order)
        harness.rt.dispatcher.commit(moves)
        ranked[target] = jid
    normal_high = harness.enqueue_ranked("normal-high", 5.0)
    assert harness.line() == [ranked["urgent-low"], normal_high, plain, ranked["bg-high"]]
    assert harness.record(ranked["bg-high"]).priority == 9.0


def test_a_requeue_at_the_front_stays_within_its_class(harness: Harness) -> None:
    client = Client(runtime=harness.rt)
    urgent = client.enqueue("ask", "urgent", priority="urgent")
    background = client.enqueue("ask", "background", priority="background")
    normal = client.enqueue("ask", "normal")
    assert admitted(harness)[:1] == [urgent]  # admits all three; put two back as a cut-off would
    window, records = harness.rt.storage.window, harness.rt.storage.records
    for jid in (background, normal):
        record = harness.record(jid)
        assert window.requeue_front(
            records,
            jid,
            "queued",
            trail=TrailEntry(tier="session", outcome="requeued", why="cut off"),
            fields={},
            line=records.line_of(None),
            priority=record.priority,
            urgency=record.urgency,
        )
    later = client.enqueue("ask", "later")
    # The background one went back "to the front", yet only of its own class.
    assert harness.line() == [normal, later, background]
    assert harness.rt.dispatcher.requeue([urgent], "asked again") == 1
    assert harness.line() == [urgent, normal, later, background]


def _old_record(store: Store, jid: str, line: str) -> None:
    """A record as a store held it before classes existed: no `urgency`, its line score 0."""
    fields = {
        "id": jid,
        "content_key": f"ck-{jid}",
        "force": "0",
        "line": line,
        "input": json.dumps({"kind": "ask", "target": jid}),
        "tier": "session",
        "effect": "local",
    }
    assert store.create_many([NewRecord(**{n: fields.get(n, "") for n in NewRecord._fields})])


def test_a_line_written_before_classes_existed_keeps_its_order_as_normal(
    ttl_store: Store, redis_client: Any
) -> None:
    line = keys.session_line()
    _old_record(ttl_store, "old-plain", line)
    _old_record(ttl_store, "old-ranked", "")
    # The ranked one as the old script placed it: score -order, the member `seq:id`.
    seq = int(redis_client.hget(keys.record("old-ranked"), "seq"))
    member = f"{seq:015d}:old-ranked"
    redis_client.zadd(line, {member: -3.0})
    redis_client.hset(keys.record("old-ranked"), mapping={"line": line, "lmember": member})
    assert redis_client.hget(keys.record("old-ranked"), "urgency") is None

    for jid, urgency, order in [
        ("bg", "background", 50.0),
        ("new-plain", "normal", 0.0),
        ("top", "urgent", 0.0),
    ]:
        _old_record(ttl_store, jid, "")
        redis_client.hset(keys.record(jid), "urgency", urgency)  # as a new enqueue writes it
        ttl_store.add_to_line(jid, line, order, urgency=urgency)
    assert ttl_store.line_ids(line) == ["top", "old-ranked", "old-plain", "new-plain", "bg"]

    # Put back at the front by a caller that does not say the class: the record's is used...
    ttl_store.add_to_line("bg", line, 50.0, front=True)
    assert ttl_store.line_ids(line)[-1] == "bg"
    # ...and a record without one is normal: ahead of its equals, behind a higher order score.
    ttl_store.add_to_line("new-plain", line, None, front=True)
    assert ttl_store.line_ids(line) == ["top", "old-ranked", "new-plain", "old-plain", "bg"]
    ttl_store.add_to_line("old-plain", line, None, front=True)
    assert ttl_store.line_ids(line) == ["top", "old-ranked", "old-plain", "new-plain", "bg"]
    assert redis_client.zscore(line, redis_client.hget(keys.record("old-plain"), "lmember")) == 0.0
    old = ttl_store.get("old-plain")
    assert old is not None and old.urgency == "normal"
