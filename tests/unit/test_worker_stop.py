"""A stop signal that lands before RQ put its handlers in still stops the worker.

The supervise loop's handler holds the signals while a round builds its worker (and, on the
session tier, replays the spool): a SIGTERM then sets only the loop's stop. RQ's loop must
see it when it starts, or it blocks in its dequeue and the process outlives its stop.
"""

from __future__ import annotations

import signal
import threading

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
