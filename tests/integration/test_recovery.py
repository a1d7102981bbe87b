"""Nothing is lost: a worker killed mid-job, a Redis server restarted mid-batch.

Slow: these wait on real heartbeats (`dq_env` shortens them to a few seconds). They run
real `dispatchq worker code` processes (not burst) and poll the records with deadlines.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from dispatchq.client import Client
from dispatchq.process.wiring import drain
from dispatchq.storage.connection import EmbeddedRedis
from dispatchq.storage.store import Store
from tests.support.helpers import (
    blocking_check,
    counting_check,
    run_cli,
    wait_for,
    write_check_module,
    write_config,
)
from tests.support.recovery import Workers

pytestmark = pytest.mark.slow


def enqueue_lines(env: dict[str, str], judgements: list[dict[str, Any]]) -> list[str]:
    done = run_cli(["enqueue", "-"], env, input="\n".join(json.dumps(j) for j in judgements) + "\n")
    assert done.returncode == 0, done.stderr
    return [line.split("\t")[1] for line in done.stdout.splitlines()]


def test_a_worker_killed_mid_job_loses_no_judgement(
    dq_env: dict[str, str], tmp_path: Path, redis_client: Any, recovery_workers: Workers
) -> None:
    check, first_call, calls = blocking_check(tmp_path, answer='"answered " + judgement.target')
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  slow:\n    check: {check}\n")
    store = Store(redis_client)
    ids = enqueue_lines(dq_env, [{"kind": "slow", "target": f"t{i}"} for i in range(3)])

    doomed = recovery_workers.start(dq_env)
    wait_for(first_call.exists, timeout=60, what="the first job to start running")
    assert [r.status for r in store.get_many(ids)] == ["running"] * 3
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=10)

    # A fresh worker, started at once (before the dead one's heartbeat has lapsed), notices the
    # abandoned job at its next recovery round and runs it again.
    recovery_workers.start(dq_env)
    recovery_workers.wait_for(
        lambda: all(s == "answered" for s in store.statuses(ids)), 90, "every judgement answered"
    )
    records = store.get_many(ids)
    assert [r.value for r in records] == ["answered t0", "answered t1", "answered t2"]
    assert all(r.tier == "code" for r in records)
    assert calls.read_text().splitlines()[0] == "t0"  # the first attempt died holding t0


def test_a_graceful_redis_restart_mid_batch_loses_no_judgement(
    dq_env: dict[str, str], tmp_path: Path, restart_redis: EmbeddedRedis, recovery_workers: Workers
) -> None:
    env = {**dq_env, "DISPATCHQ_DATA_DIR": str(restart_redis.data_dir), "DISPATCHQ_BATCH_SIZE": "1"}
    module = write_check_module(
        tmp_path,
        """
        import time

        def check(judgement):
            time.sleep(0.1)
            return judgement.state["n"] * 2
        """,
    )
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  double:\n    check: {module}:check\n")
    n = 40
    ids = enqueue_lines(env, [{"kind": "double", "target": f"t{i}", "state": {"n": i}} for i in range(n)])
    assert len(set(ids)) == n

    recovery_workers.start(env)
    store = Store(restart_redis.client())
    wait_for(lambda: store.count("answered") >= 3, timeout=60, what="the batch to be under way")
    assert store.count("answered") < n  # mid-batch

    assert restart_redis.stop()  # SHUTDOWN: the AOF is flushed
    assert not restart_redis.is_running()
    # The worker notices (one line), and brings the embedded server back itself.
    recovery_workers.wait_for(
        lambda: (
            "Redis unreachable at" in recovery_workers.output()
            or recovery_workers.procs[0].poll() is not None
        ),
        30,
        "the worker to notice that Redis is gone",
    )
    restart_redis.ensure_running()
    store = Store(restart_redis.client())

    assert sorted(store.ids()) == sorted(ids)  # every record survived the restart
    assert all(s is not None for s in store.statuses(ids))

    recovery_workers.wait_for(
        lambda: all(s == "answered" for s in store.statuses(ids)), 120, "every judgement answered"
    )
    assert [r.value for r in store.get_many(ids)] == [i * 2 for i in range(n)]
    assert recovery_workers.procs[0].poll() is None, recovery_workers.output()  # it rode the restart out


def test_a_poison_judgement_fails_alone_and_its_batch_mates_are_answered(
    dq_env: dict[str, str], tmp_path: Path, redis_client: Any, recovery_workers: Workers
) -> None:
    """Failures are per judgement: a check that kills its worker every time fails only itself."""
    env = {**dq_env, "DISPATCHQ_JOB_RETRIES": "0"}
    module = write_check_module(
        tmp_path,
        """
        import os, signal

        def check(judgement):
            if judgement.target == "killer":
                os.kill(os.getpid(), signal.SIGKILL)  # takes its worker down, every time
            return "fine"
        """,
    )
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  deadly:\n    check: {module}:check\n")
    store = Store(redis_client)
    ids = enqueue_lines(env, [{"kind": "deadly", "target": t} for t in ("before", "killer", "after")])

    def settled() -> bool:
        if all(s in ("answered", "failed") for s in store.statuses(ids)):
            return True
        if all(p.poll() is not None for p in recovery_workers.procs):
            recovery_workers.start(env)  # the next worker's maintenance finds what the dead one left
        return False

    recovery_workers.start(env)
    recovery_workers.wait_for(settled, 120, "every judgement to settle")
    before, killer, after = store.get_many(ids)
    assert before is not None and after is not None and killer is not None
    assert (before.status, before.value, after.status, after.value) == (
        "answered",
        "fine",
        "answered",
        "fine",
    )
    assert killer.status == "failed"
    assert killer.reason is not None and "worker gave up on the job" in killer.reason
    assert "AbandonedJobError" in killer.reason
    assert killer.trail[-1].outcome == "failed"
    assert any(step.outcome == "requeued" and "retried alone" in step.why for step in before.trail)


def test_a_judgement_that_kills_its_worker_every_time_fails_after_job_retries_deaths(
    dq_env: dict[str, str], tmp_path: Path, redis_client: Any, recovery_workers: Workers
) -> None:
    """Deaths are counted on the record, so a judgement cannot take workers down forever."""
    env = {**dq_env, "DISPATCHQ_JOB_RETRIES": "2"}
    module = write_check_module(
        tmp_path,
        """
        import os, signal

        def check(judgement):
            os.kill(os.getpid(), signal.SIGKILL)
        """,
    )
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  deadly:\n    check: {module}:check\n")
    store = Store(redis_client)
    [jid] = enqueue_lines(env, [{"kind": "deadly", "target": "killer"}])

    def settled() -> bool:
        if store.statuses([jid]) == ["failed"]:
            return True
        if all(p.poll() is not None for p in recovery_workers.procs):
            recovery_workers.start(env)
        return False

    recovery_workers.start(env)
    recovery_workers.wait_for(settled, 150, "the judgement to fail")
    record = store.get(jid)
    assert record is not None
    assert getattr(record, "deaths", 0) == 3  # the first run and two retries
    assert record.reason is not None and "its worker died 3 times" in record.reason
    assert record.trail[-1].outcome == "failed"


def test_reconciliation_never_requeues_a_judgement_answered_since_it_was_read(
    tmp_path: Path, make_runtime: Any
) -> None:
    """Reconcile reads "queued, its job is gone"; if the record was answered (and its
    result_ttl=0 job deleted) in between, putting it back would answer it twice."""
    check, _ = counting_check(tmp_path)
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  plain:\n    check: {check}\n")
    rt = make_runtime()
    [result] = Client(runtime=rt).enqueue_many([{"kind": "plain", "target": "t", "state": {"answer": 1}}])
    record = rt.storage.records.get(result.id)
    assert record is not None and record.status == "queued"
    seen = {record.id: ("queued", getattr(record, "job", None))}
    drain(rt, sessions=False)  # answered, its job deleted: what reconcile sees as "no job" a moment later
    assert rt.storage.records.get(record.id).status == "answered"

    assert rt.dispatcher.requeue([record.id], "its job was lost; re-enqueued", seen=seen) == 0
    after = rt.storage.records.get(record.id)
    assert after is not None and after.status == "answered"
    assert [t.outcome for t in after.trail].count("answered") == 1
    assert rt.dispatcher.requeue([record.id], "retry requested") == 1  # as read now: it goes back
