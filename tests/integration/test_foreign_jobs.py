"""A worker runs only dispatchq's own jobs: what anyone else writes into a queue fails, unrun.

Whoever can write into Redis (a session that found the store, another local user) once had
a code or typed worker run `os.system` by pushing a job: RQ's jobs were pickled, and
unpickling is running code. Here pickled and JSON jobs naming `os.system` (as the function,
as each callback, inside a `__reduce__`, inside `meta`) are pushed onto every queue a
dispatchq process takes jobs from: the code queues, the typed queue, the scheduler's control
queue, and rq-scheduler's schedule. Real `dispatchq worker` and `dispatchq scheduler`
processes then run against the real Redis: a canary file proves nothing ran, a real
dispatchq job after the foreign ones still completes, and each foreign job failed with the
one line of its refusal.

The store is marked upgraded first, so the worker itself meets the pickles, as it would
meet one written after the upgrade (`test_job_upgrade.py` covers the upgrade's own pass).
The session tier has no RQ list a worker pops (its work waits in the window's line, and its
worker makes each session's job itself), so it has no queue to push onto.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rq import Callback, Queue
from rq.job import JobStatus
from rq_scheduler import Scheduler

from dispatchq.client import Client
from dispatchq.core.entrypoints import CODE_JOB, DELIVERIES_JOB, RETRIGGER_JOB
from dispatchq.queue.entrypoints import DispatchqJob, DispatchqQueue, RefusedData, RefusedEntryPoint
from dispatchq.storage import keys
from tests.support.helpers import calls_of, run_cli

ROLES = ("on_success", "on_failure", "on_stopped")
PICKLE = str(RefusedData("pickle"))


class Evil:
    """What unpickling builds by calling `os.system`: the classic poisoned job argument."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.canary}",))


def push_foreign(redis_client: Any, name: str, ours: str, canary: Path) -> dict[str, str]:
    """Foreign jobs on queue `name` (`ours`: a function of the table for the jobs that misuse
    only a callback): job id -> the one line it must fail with."""
    pickled = Queue(name, connection=redis_client)  # RQ's default serializer: pickle
    json_queue = DispatchqQueue(name, connection=redis_client)
    command = f"touch {canary}"
    want: dict[str, str] = {}

    def add(job: Any, line: str) -> None:
        want[job.id] = line

    ttl = {"failure_ttl": 600}
    add(pickled.enqueue_call("os.system", args=(command,), **ttl), PICKLE)
    add(pickled.enqueue_call(ours, args=(Evil(canary),), **ttl), PICKLE)
    add(pickled.enqueue_call(ours, args=(["x"],), meta={"m": Evil(canary)}, **ttl), PICKLE)
    add(
        json_queue.enqueue_call("os.system", args=(command,), **ttl),
        str(RefusedEntryPoint("job", "os.system")),
    )
    for role in ROLES:
        add(pickled.enqueue_call(ours, args=(["x"],), **{role: Callback("os.system")}, **ttl), PICKLE)
        add(
            json_queue.enqueue_call(
                ours, args=(["no-such-judgement"],), **{role: Callback("os.system")}, **ttl
            ),
            str(RefusedEntryPoint(role, "os.system")),
        )
    return want


def assert_refused(redis_client: Any, want: dict[str, str]) -> None:
    for job_id, line in want.items():
        job = DispatchqJob.fetch(job_id, connection=redis_client)
        assert job.get_status() == JobStatus.FAILED, job_id
        result = job.latest_result()
        assert result is not None and result.exc_string == line  # the one line, no traceback
        assert "\n" not in line
        assert job_id.encode() not in redis_client.lrange(f"rq:queue:{job.origin}", 0, -1)


def test_foreign_jobs_on_the_code_queues_fail_unrun_and_a_real_code_worker_goes_on(
    foreign_world: Any, redis_client: Any, dq_env: dict[str, str]
) -> None:
    rt, calls, canary = foreign_world
    want: dict[str, str] = {}
    for queue in rt.dispatcher.queues_for("code"):  # the host's queue and the shared one
        want.update(push_foreign(redis_client, queue.name, CODE_JOB, canary))
    after = Client(runtime=rt).enqueue_many([{"kind": "k", "target": "after-the-foreign-jobs"}])

    done = run_cli(["worker", "code", "--burst"], dq_env)

    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not canary.exists()  # nothing of any foreign job ran
    assert_refused(redis_client, want)
    (got,) = rt.storage.records.get_many([after[0].id])
    assert (got.status, got.value) == ("answered", "answered")  # the worker kept working
    assert calls_of(calls) == ["after-the-foreign-jobs"]


def test_foreign_jobs_on_the_typed_queue_fail_unrun_and_a_real_typed_worker_goes_on(
    foreign_world: Any, redis_client: Any, dq_env: dict[str, str]
) -> None:
    _, _, canary = foreign_world
    name = keys.queue_name("typed")
    want = push_foreign(redis_client, name, DELIVERIES_JOB, canary)
    real = DispatchqQueue(name, connection=redis_client).enqueue_call(
        DELIVERIES_JOB, args=(["no-such-delivery"],), result_ttl=600
    )

    done = run_cli(["worker", "typed", "--burst"], dq_env)

    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not canary.exists()
    assert_refused(redis_client, want)
    finished = DispatchqJob.fetch(real.id, connection=redis_client)
    assert finished.get_status() == JobStatus.FINISHED
    assert finished.return_value() == [{"delivery": "no-such-delivery", "skipped": "its record expired"}]


def test_foreign_jobs_on_the_control_queue_and_in_the_schedule_fail_unrun_and_the_scheduler_goes_on(
    foreign_world: Any, redis_client: Any, dq_env: dict[str, str]
) -> None:
    rt, _, canary = foreign_world
    want = push_foreign(redis_client, keys.CONTROL_QUEUE, RETRIGGER_JOB, canary)
    # Due jobs rq-scheduler moves: pickled (its own default job class) and JSON, onto a tier
    # queue and onto the control queue.
    past = datetime.now(UTC) - timedelta(seconds=5)
    plain = Scheduler(queue_name=keys.CONTROL_QUEUE, connection=redis_client)
    ours = rt.scheduler
    command = f"touch {canary}"
    for queue in (keys.queue_name("typed"), keys.CONTROL_QUEUE):
        want[plain.enqueue_at(past, "os.system", command, queue_name=queue).id] = PICKLE
        want[plain.enqueue_at(past, RETRIGGER_JOB, Evil(canary), 0.0, queue_name=queue).id] = PICKLE
        refused = ours.enqueue_at(past, "os.system", command, queue_name=queue)
        want[refused.id] = str(RefusedEntryPoint("job", "os.system"))
        for role in ("on_success", "on_failure"):  # what rq-scheduler lets a job carry
            job = ours.enqueue_at(
                past, RETRIGGER_JOB, "scope", 0.0, queue_name=queue, **{role: Callback("os.system")}
            )
            want[job.id] = str(RefusedEntryPoint(role, "os.system"))
    real_now = DispatchqQueue(keys.CONTROL_QUEUE, connection=redis_client).enqueue(
        RETRIGGER_JOB, "general", time.time() - 5, result_ttl=600
    )
    real_moved = ours.enqueue_at(
        past, RETRIGGER_JOB, "general", time.time() - 5, queue_name=keys.CONTROL_QUEUE, job_result_ttl=600
    )

    done = run_cli(["scheduler", "--burst"], dq_env)

    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not canary.exists()
    assert_refused(redis_client, want)
    assert redis_client.zcard("rq:scheduler:scheduled_jobs") == 0  # refused ones left the schedule
    for real in (real_now, real_moved):  # the control worker and the mover kept working
        assert DispatchqJob.fetch(real.id, connection=redis_client).get_status() == JobStatus.FINISHED
    assert redis_client.llen(f"rq:queue:{keys.queue_name('typed')}") == 0  # nothing foreign was moved
    assert redis_client.llen(f"rq:queue:{keys.CONTROL_QUEUE}") == 0
