"""A waiting judgement's footprint: what its record holds, and how Redis is told to encode it.

At a million waiting judgements every field and every index entry is paid a million times
(bench/backlog.py measures the bytes). These pin what keeps a record small: the embedded
server's limit that keeps a record's hash in the compact encoding, the fields a record leaves
to their readers' defaults, and the line member derived rather than stored.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dispatchq.client import Client
from dispatchq.core.status import RECORD_VALUE_LIMIT
from dispatchq.settings import load_settings
from dispatchq.storage import keys
from dispatchq.storage.connection import connect

CONFIG = 'kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n'
COMPACT = (b"ziplist", b"listpack")


def _waiting(make_runtime: Any, dq_env: dict[str, str], n: int) -> tuple[Any, list[str]]:
    Path(dq_env["DISPATCHQ_CONFIG"]).write_text(CONFIG)
    rt = make_runtime()
    done = Client(runtime=rt).enqueue_many(
        [{"kind": "ask", "target": f"acme/app#{i}", "item": f"comment {i}"} for i in range(n)]
    )
    rt.window.close(datetime.now(UTC) + timedelta(hours=5), reason="test: closed")
    return rt, [d.id for d in done]


def test_a_waiting_record_is_compact_and_holds_only_what_its_readers_do_not_default(
    make_runtime: Any, dq_env: dict[str, str], redis_client: Any
) -> None:
    rt, ids = _waiting(make_runtime, dq_env, 3)
    for jid in ids:
        assert redis_client.object("encoding", keys.record(jid)) in COMPACT
        fields = {f.decode() for f in redis_client.hkeys(keys.record(jid))}
        assert not fields & {"job", "host", "effect", "lmember", "trail"}, fields
        assert set(json.loads(redis_client.hget(keys.record(jid), "in"))) == {"kind", "target", "item"}
    record = rt.storage.records.get(ids[0])
    assert record is not None and record.status == "waiting"
    defaults = (record.effect, record.trail, record.job, record.host, record.context)
    assert defaults == ("local", [], None, None, {})


def test_a_record_leaves_its_line_by_the_member_its_seq_and_id_make(
    make_runtime: Any, dq_env: dict[str, str], redis_client: Any
) -> None:
    rt, ids = _waiting(make_runtime, dq_env, 3)
    line = rt.storage.records.line_of(None)
    assert rt.storage.records.line_ids(line) == ids
    assert rt.storage.records.transition(ids[1], "cancelled", fields={"reason": "cancelled by test"})
    assert rt.storage.records.line_ids(line) == [ids[0], ids[2]]


def test_the_embedded_server_keeps_records_compact_even_when_started_without_the_limit(
    redis_client: Any, dq_env: dict[str, str]
) -> None:
    limit = redis_client.config_get("hash-max-ziplist-value")["hash-max-ziplist-value"]
    assert int(limit) == RECORD_VALUE_LIMIT  # in the config it is started with
    redis_client.config_set("hash-max-ziplist-value", "64")  # a server started by an older release
    connect(load_settings(dq_env))
    limit = redis_client.config_get("hash-max-ziplist-value")["hash-max-ziplist-value"]
    assert int(limit) == RECORD_VALUE_LIMIT
