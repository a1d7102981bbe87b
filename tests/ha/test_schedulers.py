"""Two schedulers on one Redis, one of them cut off and healed: every due job moves once.

rq-scheduler's own lock has no owner and its move is a push then a ZREM, so a scheduler
that lists the due jobs, is cut off, outlives its lock and comes back pushes each job a
second time (another scheduler moved them meanwhile) and deletes the other's lock. These
tests put scheduler A behind a stall proxy and count, in the queue itself, how many times
each job was pushed. Counts, never times.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from dispatchq.core.entrypoints import TYPED_JOB
from dispatchq.queue.entrypoints import DispatchqQueue
from dispatchq.queue.scheduler import TICK, DispatchqScheduler
from dispatchq.storage import keys
from tests.support.helpers import wait_for
from tests.support.netns import LoopbackRedis
from tests.support.stallproxy import StallProxy

pytestmark = pytest.mark.slow

TYPED = keys.queue_name("typed")


def _scheduler(connection: redis.Redis, cls: type[DispatchqScheduler] = DispatchqScheduler) -> Any:
    return cls(queue_name=keys.CONTROL_QUEUE, connection=connection, interval=TICK)


def _schedule(
    scheduler: DispatchqScheduler, n: int, *, start: float = -5.0, spread: float = 0.0
) -> list[str]:
    """`n` typed retries, due from `start` seconds from now, `spread` seconds apart."""
    now = datetime.now(UTC)
    return [
        scheduler.enqueue_at(
            now + timedelta(seconds=start + i * spread),
            TYPED_JOB,
            [f"j{i}"],
            queue_name=TYPED,
            job_result_ttl=0,
        ).id
        for i in range(n)
    ]


def _pushed(client: redis.Redis) -> list[str]:
    members = client.lrange(DispatchqQueue(TYPED, connection=client).key, 0, -1)
    return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)


def test_a_scheduler_cut_off_after_listing_moves_nothing_the_other_moved(
    scheduler_server: LoopbackRedis,
) -> None:
    direct = scheduler_server.client()
    with StallProxy(("127.0.0.1", scheduler_server.port), name="A") as proxy:
        # No socket timeout: A waits out the stall, as a client behind RQ's 70 s timeout would.
        a_conn = scheduler_server.client(proxy.port)
        listed = threading.Event()

        class CutAfterListing(DispatchqScheduler):
            def enqueue_job(self, job: Any) -> bool:
                if not listed.is_set():
                    proxy.stall()  # A has its list of due jobs; now it is cut off
                    listed.set()
                return super().enqueue_job(job)

        a = _scheduler(a_conn, CutAfterListing)
        b = _scheduler(direct)
        ids = _schedule(b, 20)
        assert a.acquire_lock()
        moved_by_a: list[Any] = []

        def run_a() -> None:
            try:
                moved_by_a.extend(a.enqueue_jobs())
            finally:
                a.remove_lock()

        thread = threading.Thread(target=run_a)
        thread.start()
        assert listed.wait(30)
        # A's lease runs out while it is cut off (what its 11 s would do, without the wait).
        direct.delete(b.scheduler_lock_key)
        assert b.acquire_lock()
        moved_by_b = b.enqueue_jobs()
        proxy.heal()
        thread.join(60)
        assert not thread.is_alive()
        a_conn.close()
        assert _pushed(direct) == sorted(ids)  # each job pushed exactly once
        assert len(moved_by_a) + len(moved_by_b) == len(ids)
        assert len(moved_by_b) >= len(ids) - 1  # A was cut off before its first move landed
        assert direct.zcard(b.scheduled_jobs_key) == 0
        # A's release came after B took the lock: B's lock is still there, B's token in it.
        assert direct.get(b.scheduler_lock_key) == b.holder.encode()
        b.remove_lock()
    direct.close()


def test_a_scheduler_whose_lock_lapsed_leaves_a_due_job_to_the_holder(
    scheduler_server: LoopbackRedis,
) -> None:
    direct = scheduler_server.client()
    a, b = _scheduler(scheduler_server.client()), _scheduler(direct)
    (job_id,) = _schedule(b, 1)
    job = next(iter(a.get_jobs()))
    assert a.acquire_lock()
    direct.delete(a.scheduler_lock_key)  # A's lease ran out
    assert b.acquire_lock()
    assert not a.acquire_lock()  # B's token is in the lock: A cannot take it back
    a._lock_acquired = True  # A still believes it holds the lock it took before
    assert a.enqueue_job(job) is False
    assert direct.zscore(b.scheduled_jobs_key, job_id) is not None  # still scheduled
    a.remove_lock()
    assert direct.get(b.scheduler_lock_key) == b.holder.encode()
    assert [j.id for j in b.enqueue_jobs()] == [job_id]
    assert b.enqueue_job(job) is False  # a second move of the same job does nothing
    b.remove_lock()
    assert _pushed(direct) == [job_id]
    a.connection.close()
    direct.close()


def _start_scheduler(dq_env: dict[str, str], url: str) -> subprocess.Popen[bytes]:
    env = {**dq_env, "DISPATCHQ_REDIS_URL": url}
    quiet = subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-m", "dispatchq.cli", "scheduler"], env=env, stdin=quiet, stdout=quiet, stderr=quiet
    )


def test_two_scheduler_processes_one_stalling_and_healing_move_each_due_job_once(
    scheduler_server: LoopbackRedis, dq_env: dict[str, str]
) -> None:
    direct = scheduler_server.client()
    b_view = _scheduler(direct)
    ids = _schedule(b_view, 30, start=1.0, spread=0.2)  # due over the next seven seconds
    with StallProxy(("127.0.0.1", scheduler_server.port), name="A") as proxy:
        procs = [
            _start_scheduler(dq_env, scheduler_server.url(proxy.port)),
            _start_scheduler(dq_env, scheduler_server.url()),
        ]
        try:
            for _ in range(4):  # A flaps: cut off, back, cut off, back
                time.sleep(1.0)
                proxy.stall()
                time.sleep(1.5)
                proxy.heal()
            wait_for(
                lambda: direct.zcard(b_view.scheduled_jobs_key) == 0, timeout=60, what="every due job moved"
            )
            time.sleep(2 * TICK)  # anything A still had in flight lands now, or never
            assert _pushed(direct) == sorted(ids)
            assert [p.poll() for p in procs] == [None, None]  # neither scheduler exited
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
    direct.close()
