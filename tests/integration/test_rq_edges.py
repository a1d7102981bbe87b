"""RQ's edges a killed worker leaves behind, worked around in `DispatchqWorker`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dispatchq.workers.base import DispatchqWorker, build_worker
from tests.support.helpers import wait_for, write_config


def test_a_cleaning_lock_left_by_a_killed_worker_holds_for_two_rounds_not_15_minutes(
    make_runtime: Any, redis_client: Any, tmp_path: Path
) -> None:
    write_config(tmp_path / "dispatchq.yaml", "kinds: {}\n")
    rt = make_runtime(DISPATCHQ_RECOVERY_INTERVAL="1")
    worker = build_worker(DispatchqWorker, rt, "code")
    keys = [q.registry_cleaning_key for q in worker.queues]
    for key in keys:
        redis_client.set(key, 1, ex=899)  # what RQ's lock is when its holder was SIGKILLed mid-clean

    worker.clean_registries()
    assert all(0 < redis_client.ttl(key) <= 2 for key in keys)  # cut down to two rounds
    wait_for(lambda: not any(redis_client.exists(key) for key in keys), timeout=10, what="the lock to lapse")
    before = time.time()
    worker.clean_registries()  # the next round takes the lock, cleans, and lets go
    assert worker.last_cleaned_at is not None and worker.last_cleaned_at.timestamp() >= before - 1
    assert not any(redis_client.exists(key) for key in keys)
