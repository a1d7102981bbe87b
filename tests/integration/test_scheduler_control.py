"""The scheduler runs its control queue in process, as part of its tick and not as an RQ worker.

RQ's worker listens for commands in a thread polling every 60 s, and redis-py's
`PubSubWorkerThread.stop` joins it unbounded: a control job was followed, now and then, by a
minute in which the scheduler neither beat nor moved a due retrigger (a closed window stayed
closed past its lift). That race cannot be shown on demand, so the first test checks its
precondition: the control run starts no such thread. RQ's worker also took the process's
SIGTERM for the run, and the scheduler went on ticking until killed.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from redis.client import PubSub

from dispatchq.core.entrypoints import RETRIGGER_JOB
from dispatchq.queue.entrypoints import DispatchqJob, DispatchqQueue
from dispatchq.storage import keys
from dispatchq.window.face import Window
from dispatchq.window.limits import GENERAL_SCOPE
from tests.support.helpers import scheduler_in_process


def test_the_control_run_starts_no_command_thread(
    code_queue: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = code_queue[0]
    threads: list[PubSub] = []
    real = PubSub.run_in_thread

    def counted(self: PubSub, *args: Any, **kwargs: Any) -> Any:
        threads.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(PubSub, "run_in_thread", counted)
    control = DispatchqQueue(keys.CONTROL_QUEUE, connection=redis_client)
    job = control.enqueue(RETRIGGER_JOB, GENERAL_SCOPE, time.time(), result_ttl=600)
    scheduler_in_process(rt, burst=True)

    ran = DispatchqJob.fetch(job.id, connection=redis_client)
    assert ran.is_finished and ran.return_value() == "no marker"
    assert threads == []


def test_a_stop_during_a_control_job_stops_the_scheduler_after_the_tick(
    code_queue: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = code_queue[0]
    control = DispatchqQueue(keys.CONTROL_QUEUE, connection=redis_client)
    job = control.enqueue(RETRIGGER_JOB, GENERAL_SCOPE, time.time(), result_ttl=600)
    real_lift = Window.lift

    def lift_then_terminated(self: Window, scope: str) -> str:
        os.kill(os.getpid(), signal.SIGTERM)  # what `kill <scheduler>` does while the job runs
        return real_lift(self, scope)

    monkeypatch.setattr(Window, "lift", lift_then_terminated)
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) > 50:  # ten seconds of ticks: the stop was lost
            raise AssertionError("the scheduler went on ticking after SIGTERM")

    scheduler_in_process(rt, sleep=sleep)

    assert DispatchqJob.fetch(job.id, connection=redis_client).is_finished  # the job in hand ran out
    assert pauses == []  # no tick after the one the stop came in
