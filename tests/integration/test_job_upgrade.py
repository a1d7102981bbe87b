"""The upgrade from the previous release's pickled RQ jobs: rewritten as JSON, or refused.

The store is written the way the previous release wrote it: its dispatcher enqueued with
RQ's own `Queue` (pickle), its scheduler with rq-scheduler's own classes. A current worker
process then starts against it and the jobs run; a pickled job that needs a global to be
decoded (a `__reduce__` calling `os.system`) fails with the one line, unrun.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rq import Queue
from rq.job import JobStatus
from rq_scheduler import Scheduler

import dispatchq.queue.dispatch as dispatch_module
from dispatchq.client import Client
from dispatchq.core.entrypoints import CODE_JOB, DELIVERIES_JOB, RETRIGGER_JOB
from dispatchq.queue.entrypoints import DispatchqJob, RefusedEntryPoint
from dispatchq.queue.upgrade import NeedsGlobal, no_globals_loads, upgrade_jobs
from dispatchq.storage import keys
from tests.conftest import calls_of, counting_check, run_cli, write_config


class Evil:
    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.canary}",))


def stored_data(redis_client: Any, job_id: str) -> bytes:
    return bytes(zlib.decompress(redis_client.hget(f"rq:job:{job_id}", "data")))


@pytest.fixture
def previous_release(
    tmp_path: Path, make_runtime: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """A store the previous release wrote: judgements enqueued through its dispatcher (RQ's own
    pickling `Queue`), a typed job with a result, a retrigger rq-scheduler holds, and one
    poisoned job. Returns what the test needs to find them."""
    check, calls = counting_check(tmp_path, answer="'answered'")
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  k:\n    check: {check}\n")
    rt = make_runtime(DISPATCHQ_RESULT_TTL="600")
    canary = tmp_path / "canary"
    with monkeypatch.context() as patch:
        patch.setattr(dispatch_module, "DispatchqQueue", Queue)  # the previous release's line
        results = Client(runtime=rt).enqueue_many(
            [{"kind": "k", "target": "old-1"}, {"kind": "k", "target": "old-2"}]
        )
    record = rt.store.get_many([results[0].id])[0]
    assert record is not None and record.job
    typed = Queue(keys.queue_name("typed"), connection=redis_client)
    deliveries = typed.enqueue_call(DELIVERIES_JOB, args=(["gone"],), result_ttl=600, failure_ttl=600)
    poisoned = typed.enqueue_call(DELIVERIES_JOB, args=(Evil(canary),), failure_ttl=600)
    old_scheduler = Scheduler(queue_name=keys.CONTROL_QUEUE, connection=redis_client, interval=1)
    retrigger = old_scheduler.enqueue_at(
        datetime.now(UTC) - timedelta(seconds=5),
        RETRIGGER_JOB,
        "general",
        time.time() - 5,
        queue_name=keys.CONTROL_QUEUE,
        timeout=60,
        job_result_ttl=600,
    )
    jobs = {
        "code": record.job,
        "deliveries": deliveries.id,
        "poisoned": poisoned.id,
        "retrigger": retrigger.id,
    }
    for job_id in jobs.values():
        assert stored_data(redis_client, job_id)[:1] == b"\x80"  # pickled, as it was
    return {"rt": rt, "ids": [r.id for r in results], "calls": calls, "canary": canary, "jobs": jobs}


def test_a_current_worker_upgrades_the_previous_releases_jobs_and_runs_them(
    previous_release: dict[str, Any], redis_client: Any, dq_env: dict[str, str]
) -> None:
    jobs = previous_release["jobs"]
    done = run_cli(["worker", "code", "--burst"], dq_env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr

    rt = previous_release["rt"]
    got = rt.store.get_many(previous_release["ids"])
    assert [(r.status, r.value) for r in got if r is not None] == [("answered", "answered")] * 2
    assert sorted(calls_of(previous_release["calls"])) == ["old-1", "old-2"]
    assert redis_client.exists(keys.JOBS_UPGRADED)
    assert stored_data(redis_client, jobs["deliveries"]).startswith(b'["jobs.tiers.triage_deliveries",null,')

    # The poisoned one was never unpickled: refused at its first global, out of its queue.
    poisoned = DispatchqJob.fetch(jobs["poisoned"], connection=redis_client)
    assert poisoned.get_status() == JobStatus.FAILED
    result = poisoned.latest_result()
    assert result is not None and result.exc_string == str(RefusedEntryPoint("global", "posix.system"))
    assert "refused pickled job needing global 'posix.system'" in done.stderr  # and logged
    assert jobs["poisoned"].encode() not in redis_client.lrange(f"rq:queue:{keys.queue_name('typed')}", 0, -1)
    assert not previous_release["canary"].exists()

    typed = run_cli(["worker", "typed", "--burst"], dq_env)
    scheduler = run_cli(["scheduler", "--burst"], dq_env)
    assert typed.returncode == 0 and scheduler.returncode == 0, typed.stderr + scheduler.stderr
    deliveries = DispatchqJob.fetch(jobs["deliveries"], connection=redis_client)
    assert deliveries.get_status() == JobStatus.FINISHED
    assert deliveries.return_value() == [{"delivery": "gone", "skipped": "its record expired"}]
    retrigger = DispatchqJob.fetch(jobs["retrigger"], connection=redis_client)
    assert retrigger.get_status() == JobStatus.FINISHED  # moved by the current scheduler, and run
    assert not previous_release["canary"].exists()


def test_the_upgrade_is_idempotent_and_safe_with_several_processes_at_once(
    previous_release: dict[str, Any], redis_server: Any, redis_client: Any
) -> None:
    outcomes: list[Any] = []

    def one_pass() -> None:
        client = redis_server.client()
        try:
            outcomes.append(upgrade_jobs(client))
        finally:
            client.close()

    threads = [threading.Thread(target=one_pass) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == 3
    # Three jobs to rewrite (the code job, the deliveries job, the retrigger), one to refuse:
    # however the passes interleaved, each was rewritten once and refused once.
    assert sum(o.rewritten for o in outcomes) == 3
    assert sum(o.refused for o in outcomes) == 1
    again = upgrade_jobs(redis_client)
    assert (again.rewritten, again.refused) == (0, 0)
    jobs = previous_release["jobs"]
    assert stored_data(redis_client, jobs["code"]).startswith(f'["{CODE_JOB}",null,[['.encode())
    assert not previous_release["canary"].exists()


def test_the_unpickler_admits_no_global() -> None:
    plain = ("jobs.tiers.code", None, (["a", "b"],), {"probes": ["general"], "n": 1.5})
    assert no_globals_loads(pickle.dumps(plain, protocol=pickle.HIGHEST_PROTOCOL)) == plain
    with pytest.raises(NeedsGlobal) as caught:
        no_globals_loads(pickle.dumps(Evil(Path("/nonexistent/canary"))))
    assert caught.value.name == "posix.system"
    with pytest.raises(NeedsGlobal):
        no_globals_loads(pickle.dumps({"when": datetime.now(UTC)}))  # a class is a global too
