"""The latency histograms' sums on the embedded redis-server (6.2, AOF on), through the real script.

A judgement's time in queue is observed by a Lua script in the transition that answers it;
its sum is an integer of microseconds there, and survives a restart that replays the
append-only file. The times are set on the records, so the expected sums are exact.
"""

from __future__ import annotations

import json

import pytest

from dispatchq.storage import keys
from dispatchq.storage.connection import EmbeddedRedis
from dispatchq.storage.histograms import (
    SUM_FIELD,
    Histogram,
    hist_key,
    micros,
    observe_session,
    read_histograms,
)
from dispatchq.storage.store import NewRecord, Store

WAITS = {"j0": 0.25, "j1": 1.5, "j2": 90.000001, "j3": 7200.0, "j4": 3 * 86400 + 0.5}


def _entry(jid: str) -> NewRecord:
    fields = {
        "id": jid,
        "content_key": f"ck-{jid}",
        "force": "0",
        "line": "",
        "input": json.dumps({"kind": "k", "target": f"t/{jid}"}),
        "tier": "code",
        "effect": "local",
    }
    return NewRecord(**{name: fields.get(name, "") for name in NewRecord._fields})


def test_queue_and_session_sums_are_exact_and_survive_a_restart_from_the_aof(
    restart_redis: EmbeddedRedis,
) -> None:
    client = restart_redis.client()
    assert client.config_get("appendonly")["appendonly"] == "yes"
    store = Store(client)
    store.create_many([_entry(jid) for jid in WAITS])
    assert len(store.claim(list(WAITS), "code")) == len(WAITS)
    for jid, wait in WAITS.items():  # enqueued at 1000 s, taken `wait` seconds later
        client.hset(keys.record(jid), mapping={"created": "1000.0", "claimed": repr(1000.0 + wait)})
    for jid in ("j0", "j1", "j2", "j3"):
        assert store.transition(jid, "answered", fields={"tier": "code", "value": "yes"})
    pipe = client.pipeline()
    store.transition("j4", "answered", fields={"tier": "code", "value": "yes"}, pipe=pipe)  # the pipe path
    pipe.execute()
    assert not store.transition("j0", "answered", fields={"tier": "code"})  # refused: not counted again
    for seconds in (12.345678, 0.000001):
        observe_session(client, seconds)

    def check(got: dict[str, dict[str, Histogram]], raw: dict[bytes, bytes]) -> None:
        queue = got["queue_time"]["code"]
        assert queue.sum == pytest.approx(sum(WAITS.values()), abs=1e-6)
        assert queue.buckets[-1] == ("+Inf", 5.0)
        assert int(raw[f"code|{SUM_FIELD}".encode()]) == sum(micros(w) for w in WAITS.values())
        assert b"code|sum" not in raw
        session = got["session_duration"][""]
        assert session.sum == pytest.approx(12.345679, abs=1e-9)

    check(read_histograms(client), client.hgetall(hist_key("queue_time")))
    client.close()

    assert restart_redis.stop()  # SHUTDOWN: the AOF is flushed
    restart_redis.ensure_running()
    again = restart_redis.client()
    check(read_histograms(again), again.hgetall(hist_key("queue_time")))
    assert again.ping()
    again.close()
