"""Reconciliation's pass reads candidates, not whole records: `Store.stale` and what it feeds.

The pass runs every recovery interval in one process of the formation; with a backlog of
thousands of queued judgements it must ask RQ once per job, and still find the one record
whose job was lost among them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from dispatchq.client import Client
from dispatchq.process.wiring import drain
from dispatchq.queue.scheduler import reconcile
from dispatchq.storage.store import NewRecord, Store
from tests.support.helpers import write_check_module, write_config


def _entry(jid: str, tier: str) -> NewRecord:
    fields = {
        "id": jid,
        "content_key": f"ck-{jid}",
        "force": "0",
        "line": "",
        "input": json.dumps({"kind": "k", "target": "t"}),
        "tier": tier,
        "effect": "local",
    }
    return NewRecord(**{name: fields.get(name, "") for name in NewRecord._fields})


def test_stale_gives_one_record_per_job_then_every_record_of_the_jobs_asked_for(store: Store) -> None:
    ids = [f"r{i:04d}" for i in range(2500)]  # more than one SSCAN chunk
    assert store.create_many([_entry(jid, "code") for jid in ids]) is not None
    for i, jid in enumerate(ids):
        store.set_fields(jid, job=f"job{i // 50}" if i < 2400 else "")  # 48 jobs; 100 without
    store.create_many([_entry("sess", "session"), _entry("typed1", "typed")])
    store.set_fields("typed1", job="jobT")
    later = time.time() + 60

    firsts = store.stale("queued", ("code", "typed"), later)
    jobs = [job for _, job in firsts if job]
    assert sorted(jobs) == sorted({f"job{i}" for i in range(48)} | {"jobT"})  # each job once
    assert sorted(jid for jid, job in firsts if not job) == ids[2400:]  # every record without a job
    assert "sess" not in {jid for jid, _ in firsts}  # another tier

    of_jobs = store.stale("queued", ("code", "typed"), later, jobs=["job3", ""])
    assert sorted(jid for jid, _ in of_jobs) == sorted(ids[150:200] + ids[2400:])
    assert store.stale("queued", ("code", "typed"), later, jobs=[]) == []
    # Updated after the instant: not a candidate yet.
    assert store.stale("queued", ("code", "typed"), time.time() - 60) == []


def test_reconcile_finds_the_one_lost_job_among_a_backlog_and_leaves_the_rest(
    make_runtime: Any, redis_client: Any, tmp_path: Path
) -> None:
    module = write_check_module(tmp_path, "def check(judgement):\n    return judgement.state['n']\n")
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  echo:\n    check: {module}:check\n")
    rt = make_runtime(DISPATCHQ_BATCH_SIZE="10")
    results = Client(runtime=rt).enqueue_many(
        [{"kind": "echo", "target": f"t{i}", "state": {"n": i}} for i in range(300)]
    )
    ids = [str(r.id) for r in results]
    records = rt.storage.records.get_many(ids)
    lost_job = records[123].job  # type: ignore[union-attr]
    carried = [r.id for r in records if r is not None and r.job == lost_job]
    assert len(carried) == 10
    # An operator deletes one job's RQ hash by hand: its records say queued, nothing runs them.
    redis_client.delete(f"rq:job:{lost_job}")

    assert reconcile(rt, min_age=0) == 10
    assert {r.job for r in rt.storage.records.get_many(carried)}.isdisjoint({lost_job})  # new jobs
    assert reconcile(rt, min_age=0) == 0  # the rest were waiting in their queue all along
    drain(rt, sessions=False)
    assert rt.storage.records.statuses(ids) == ["answered"] * 300
    assert [r.value for r in rt.storage.records.get_many(ids) if r is not None] == list(range(300))
