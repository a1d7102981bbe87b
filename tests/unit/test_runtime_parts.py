"""A runtime makes each of its parts once: the storage gateway, the window, the dispatcher, the scheduler."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from dispatchq.queue.dispatch import Dispatcher
from dispatchq.queue.parts import QUEUE_PARTS
from dispatchq.queue.scheduler import DispatchqScheduler
from dispatchq.runtime import QueueParts, Runtime
from dispatchq.settings import load_settings
from dispatchq.storage.gateway import AREAS, Storage


def _runtime(tmp_path: Path, parts: QueueParts | None = QUEUE_PARTS) -> Runtime:
    settings = load_settings(
        {"DISPATCHQ_DATA_DIR": str(tmp_path), "DISPATCHQ_CONFIG": str(tmp_path / "none.yaml")}
    )
    return Runtime(settings=settings, redis=fakeredis.FakeRedis(), queue_parts=parts)


def test_each_part_is_made_once_and_kept(tmp_path: Path) -> None:
    rt = _runtime(tmp_path)
    assert isinstance(rt.storage, Storage) and rt.storage is rt.storage
    assert rt.storage.records is rt.storage.records
    assert rt.window is rt.window and rt.window.store is rt.storage.window
    assert isinstance(rt.dispatcher, Dispatcher) and rt.dispatcher is rt.dispatcher
    assert isinstance(rt.scheduler, DispatchqScheduler) and rt.scheduler is rt.scheduler
    assert rt.dispatcher.store is rt.storage.records  # the dispatcher asks the same gateway


def test_every_area_is_made_once(tmp_path: Path) -> None:
    storage = _runtime(tmp_path).storage
    for area in AREAS:
        assert getattr(storage, area) is getattr(storage, area), area


def test_threads_asking_first_at_once_share_one_dispatcher(tmp_path: Path) -> None:
    made: list[object] = []

    def dispatcher(runtime: Runtime) -> Any:
        made.append(object())
        return made[-1]

    rt = _runtime(
        tmp_path, QueueParts(dispatcher=dispatcher, scheduler=lambda r: None, reschedule=lambda r, s: None)
    )  # type: ignore[arg-type,return-value]
    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(rt.dispatcher)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1 and all(s is made[0] for s in seen)


def test_the_window_reschedules_through_the_parts_it_was_given(tmp_path: Path) -> None:
    asked: list[tuple[Runtime, str]] = []
    parts = QueueParts(
        dispatcher=QUEUE_PARTS.dispatcher,
        scheduler=QUEUE_PARTS.scheduler,
        reschedule=lambda runtime, scope: asked.append((runtime, scope)) or "job-1",  # type: ignore[func-returns-value]
    )
    rt = _runtime(tmp_path, parts)
    assert rt.window._reschedule("general") == "job-1"
    assert asked == [(rt, "general")]


def test_a_runtime_built_without_queue_parts_says_how_to_build_one(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, None)
    assert rt.storage.records is rt.storage.records  # storage needs no queue part
    with pytest.raises(RuntimeError, match="QUEUE_PARTS"):
        rt.dispatcher  # noqa: B018
    with pytest.raises(RuntimeError, match="cannot make a scheduler"):
        rt.scheduler  # noqa: B018
