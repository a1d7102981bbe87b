"""A worker's teardown is bounded by its command channel's poll, not RQ's minute.

RQ's command-channel thread waits up to its poll for a message, and redis-py (8.2 on)
joins that thread when it is stopped: with RQ's 60 s poll, every worker's stop (a
SIGTERM, a burst run's end, `dispatchq run`) took up to a minute.
"""

from __future__ import annotations

import threading
from typing import Any

from dispatchq.queue.entrypoints import DispatchqQueue
from dispatchq.queue.serializer import JSONSerializer
from dispatchq.workers.base import DispatchqWorker


def test_a_worker_that_stops_right_after_it_subscribed_ends_in_seconds(redis_client: Any) -> None:
    # The burst run's case: the channel's thread has not yet read its subscription when the
    # teardown unsubscribes, so it waits its whole poll for a subscription that never comes.
    queue = DispatchqQueue("dq-test-teardown", connection=redis_client)
    worker = DispatchqWorker([queue], connection=redis_client, serializer=JSONSerializer)
    listeners: list[threading.Thread] = []

    def subscribe_then_stop() -> None:
        worker.subscribe()
        assert worker.pubsub_thread is not None
        listeners.append(worker.pubsub_thread)
        worker.unsubscribe()

    stopping = threading.Thread(target=subscribe_then_stop, daemon=True)
    stopping.start()
    stopping.join(timeout=15)  # a bound for a loaded machine; RQ's own poll is 60 s
    assert not stopping.is_alive(), "the teardown is still waiting on the command channel's poll"
    assert listeners and not listeners[0].is_alive()
