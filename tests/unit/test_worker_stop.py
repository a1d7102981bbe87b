"""A stop signal that lands before RQ put its handlers in still stops the worker.

The supervise loop's handler holds the signals while a round builds its worker (and, on the
session tier, replays the spool): a SIGTERM then sets only the loop's stop. RQ's loop must
see it when it starts, or it blocks in its dequeue and the process outlives its stop.
"""

from __future__ import annotations

import signal
import threading
import time
from types import SimpleNamespace

import fakeredis
import pytest

from dispatchq.queue.entrypoints import DispatchqQueue
from dispatchq.queue.serializer import JSONSerializer
from dispatchq.supervise import Done
from dispatchq.workers.base import DispatchqWorker
from dispatchq.workers.run import _WorkerBody


def _worker(client: fakeredis.FakeRedis) -> DispatchqWorker:
    queue = DispatchqQueue("dq-test-typed", connection=client)
    return DispatchqWorker([queue], connection=client, serializer=JSONSerializer)


@pytest.mark.usefixtures("kept_signal_handlers")
def test_a_stop_set_before_rqs_handlers_went_in_stops_rqs_loop(fake_client: fakeredis.FakeRedis) -> None:
    worker = _worker(fake_client)
    worker.outer_stop = threading.Event()
    worker.outer_stop.set()
    worker._install_signal_handlers()
    assert worker.stopping
    assert worker._stop_requested  # RQ's loop breaks on it before its first dequeue
    assert signal.getsignal(signal.SIGTERM) == worker.request_stop  # RQ's own, for a later one


@pytest.mark.usefixtures("kept_signal_handlers")
def test_without_a_stop_rqs_handlers_go_in_and_nothing_is_stopped(fake_client: fakeredis.FakeRedis) -> None:
    worker = _worker(fake_client)
    worker.outer_stop = threading.Event()
    worker._install_signal_handlers()
    assert not worker.stopping
    assert not worker._stop_requested


def test_a_round_that_starts_after_the_stop_builds_no_worker() -> None:
    stop = threading.Event()
    stop.set()
    body = _WorkerBody(runtime=None, tier="typed", burst=False, level="INFO", stop=stop)  # type: ignore[arg-type]
    assert body.round() == Done()  # a runtime of None: building a worker would raise
    assert body.worker is None
    assert body.stopped()


def test_no_heartbeat_lands_once_the_jobs_success_is_being_written(
    fake_client: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A late beat (a partition's) re-creates the execution's hash without `created_at` after
    # the cleanup and before RQ deletes the job: RQ then raises, and a job that returned is
    # filed as failed (for a session: its worker "died"). The beats stop before the cleanup.
    from rq.worker import SimpleWorker

    from dispatchq.workers import base

    worker = _worker(fake_client)
    worker.job_monitoring_interval = 0.005  # type: ignore[assignment]
    writing = threading.Event()
    late: list[str] = []

    def beat(job: object, execution: object) -> None:
        if writing.is_set():
            late.append("beat")

    def cleanup(client: object, job_id: str, *, keep: str = "") -> int:
        writing.set()
        time.sleep(0.2)  # forty beat intervals: a beat still running would land here
        return 0

    monkeypatch.setattr(worker, "maintain_heartbeats", beat)
    monkeypatch.setattr(worker, "prepare_execution", lambda job: SimpleNamespace(id="e-1"))
    monkeypatch.setattr(base, "forget_dead_executions", cleanup)
    monkeypatch.setattr(SimpleWorker, "handle_job_success", lambda *args, **kwargs: None)

    def perform(job: object, queue: object, execution: object) -> None:
        time.sleep(0.05)  # the job runs: beats meanwhile are fine
        worker.handle_job_success(job, queue, None, execution)  # type: ignore[arg-type]

    monkeypatch.setattr(worker, "perform_job", perform)
    worker.execute_job(SimpleNamespace(id="j-1"), None)  # type: ignore[arg-type]
    assert writing.is_set()
    assert late == []
