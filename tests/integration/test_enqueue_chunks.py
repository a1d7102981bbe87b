"""JSON Lines enqueued a chunk at a time, each chunk written while the next is prepared
(`Client.enqueue_lines` through `queue.writer.ChunkWriter`), on a real Redis.

The chunk is made two judgements long here, so a few lines span several chunks: line numbers,
per-line errors and duplicates across chunks come out as from one batch; a Redis failure part
way writes no later chunk and names every good line after it unwritten; re-sending the whole
input then writes each judgement once.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import redis

from dispatchq.errors import EnqueueInterrupted
from dispatchq.storage import directory, keys

LINES = [
    json.dumps({"kind": "lock", "target": "acme/app#1"}),
    "{not json",
    json.dumps({"kind": "lock", "target": "acme/app#2"}),
    json.dumps({"kind": "lock", "target": "acme/app#1"}),  # line 1 again, in the second chunk
    json.dumps({"kind": "no-such-kind", "target": "acme/app#3"}),
    "",
    json.dumps({"kind": "lock", "target": "acme/app#4"}),
    json.dumps({"kind": "lock", "target": "acme/app#5"}),
    json.dumps({"kind": "lock-then-typed", "target": "acme/app#6"}),
    json.dumps({"kind": "lock", "target": "acme/app#7", "priority": "urgent"}),
]


#: The thread each chunk was sent from, as `_failing_on` saw them (reset per test).
threads: list[int] = []


def _records(redis_client: Any) -> int:
    return sum(1 for _ in redis_client.scan_iter(match=keys.record("*")))


def _failing_on(
    rt: Any, monkeypatch: pytest.MonkeyPatch, call: int | None, error: BaseException | None = None
) -> list[int]:
    """Make the dispatcher's `call`-th chunk fail with `error` (None: none fails); returns the
    sizes of the chunks sent, as they are sent."""
    run = rt.dispatcher.run_chunk
    sizes: list[int] = []

    def failing(built: Any) -> list[tuple[str, bool]]:
        sizes.append(len(built.entries))
        threads.append(threading.get_ident())
        if len(sizes) == call and error is not None:
            raise error
        return list(run(built))

    threads.clear()
    monkeypatch.setattr(rt.dispatcher, "run_chunk", failing)
    return sizes


def test_chunks_keep_line_numbers_errors_and_duplicates_of_one_batch(
    setup: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, client, _ = setup
    monkeypatch.setattr("dispatchq.queue.dispatch.WRITE_CHUNK", 2)
    sizes = _failing_on(rt, monkeypatch, None)
    results = client.enqueue_lines(LINES)
    assert sizes == [2, 2, 2, 1]  # seven good lines (the duplicate rides in the second chunk)
    me = threading.get_ident()
    assert [t == me for t in threads] == [False, False, False, True]  # the last: no thread to wait for
    assert [r.index for r in results] == [1, 2, 3, 4, 5, 7, 8, 9, 10]
    by_line = {r.index: r for r in results}
    assert by_line[2].error is not None and by_line[2].error.startswith("not valid JSON")
    assert by_line[5].error is not None and "no-such-kind" in by_line[5].error
    assert by_line[4].id == by_line[1].id and not by_line[4].created  # recognised, not written twice
    created = [r for r in results if r.created]
    assert [r.index for r in created] == [1, 3, 7, 8, 9, 10]
    assert _records(redis_client) == 6
    assert client.interrupted is None


def test_a_redis_failure_part_way_writes_no_later_chunk_and_a_resend_writes_each_once(
    setup: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, client, _ = setup
    monkeypatch.setattr("dispatchq.queue.dispatch.WRITE_CHUNK", 2)
    sizes = _failing_on(rt, monkeypatch, 2, redis.ConnectionError("Connection refused"))
    results = client.enqueue_lines(LINES)
    assert sizes == [2, 2]  # the third chunk was never sent
    assert isinstance(client.interrupted, redis.ConnectionError)
    by_line = {r.index: r for r in results}
    assert by_line[1].created and by_line[3].created
    assert [n for n, r in by_line.items() if r.unwritten] == [4, 7, 8, 9, 10]
    assert all(by_line[n].id is None for n in (4, 7, 8, 9, 10))
    assert by_line[2].error is not None and not by_line[2].unwritten  # its own error, as before
    assert by_line[5].error is not None and not by_line[5].unwritten
    assert _records(redis_client) == 2  # only the first chunk's: nothing half-written

    monkeypatch.undo()
    again = {r.index: r for r in client.enqueue_lines(LINES)}
    assert (again[1].id, again[1].created) == (by_line[1].id, False)
    assert (again[3].id, again[3].created) == (by_line[3].id, False)
    assert [n for n, r in again.items() if r.created] == [7, 8, 9, 10]
    assert _records(redis_client) == 6


def test_a_failure_that_is_not_redis_weather_raises_with_what_went_in(
    setup: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, client, _ = setup
    monkeypatch.setattr("dispatchq.queue.dispatch.WRITE_CHUNK", 2)
    _failing_on(rt, monkeypatch, 2, RuntimeError("a bug, not an outage"))
    with pytest.raises(EnqueueInterrupted) as raised:
        client.enqueue_lines(LINES)
    assert [created for _, created in raised.value.written] == [True, True]
    assert isinstance(raised.value.cause, RuntimeError)
    assert _records(redis_client) == 2


def test_a_backlog_of_chunks_is_indexed_whole(setup: Any, redis_client: Any) -> None:
    """Past one chunk and past the script's 500 members per index command, every new id
    is in every index the script keeps."""
    _, client, _ = setup
    lines = [json.dumps({"kind": "lock", "target": f"acme/app#{n}"}) for n in range(1_100)]
    made = {r.id for r in client.enqueue_lines(lines) if r.created}
    assert len(made) == 1_100
    encoded = {jid.encode() for jid in made if jid}
    assert set(directory.all_ids(redis_client)) == made  # the id directory
    assert set(redis_client.lrange(keys.RECENT, 0, -1)) == encoded  # the newest, under its cap
    assert set(redis_client.smembers(keys.status_index("queued"))) == encoded
