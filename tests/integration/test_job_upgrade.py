"""The upgrade from the previous release's pickled RQ jobs: rewritten as JSON, or refused.

The store is written the way the previous release wrote it: its dispatcher enqueued with
RQ's own `Queue` (pickle), its scheduler with rq-scheduler's own classes. A current worker
process then starts against it and the jobs run; a pickled job that needs a global to be
decoded (a `__reduce__` calling `os.system`) fails with the one line, unrun.
"""

from __future__ import annotations

import pickle
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rq.job import JobStatus

from dispatchq.core.entrypoints import CODE_JOB
from dispatchq.queue.entrypoints import DispatchqJob, RefusedEntryPoint
from dispatchq.queue.upgrade import NeedsGlobal, no_globals_loads, upgrade_jobs
from dispatchq.storage import keys
from tests.support.helpers import calls_of, run_cli
from tests.support.job_upgrade import Evil, stored_data


def test_a_current_worker_upgrades_the_previous_releases_jobs_and_runs_them(
    previous_release: dict[str, Any], redis_client: Any, dq_env: dict[str, str]
) -> None:
    jobs = previous_release["jobs"]
    done = run_cli(["worker", "code", "--burst"], dq_env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr

    rt = previous_release["rt"]
    got = rt.storage.records.get_many(previous_release["ids"])
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
