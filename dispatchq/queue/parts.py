"""The queue room's parts of a runtime: how its dispatcher and scheduler are made.

Whoever builds a `Runtime` hands it `QUEUE_PARTS` (`dispatchq.process.wiring` for every
command and role; `dispatchq.Client` for a producer), and the runtime makes each part
once, on first use (`runtime.dispatcher`, `runtime.scheduler`, and the window's
retrigger). The makers import their modules when called: RQ and rq-scheduler load only
in a process that asks for a part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatchq.runtime import QueueParts

if TYPE_CHECKING:
    from dispatchq.queue.dispatch import Dispatcher
    from dispatchq.queue.scheduler import DispatchqScheduler
    from dispatchq.runtime import Runtime

__all__ = ["QUEUE_PARTS", "make_dispatcher", "make_scheduler", "reschedule"]


def make_dispatcher(runtime: Runtime) -> Dispatcher:
    from dispatchq.queue.dispatch import Dispatcher  # noqa: PLC0415 (lazy: RQ)

    return Dispatcher(settings=runtime.settings, storage=runtime.storage, config=lambda: runtime.config)


def make_scheduler(runtime: Runtime) -> DispatchqScheduler:
    from dispatchq.queue.entrypoints import DispatchqJob, DispatchqQueue  # noqa: PLC0415
    from dispatchq.queue.scheduler import TICK, DispatchqScheduler  # noqa: PLC0415 (lazy: rq-scheduler)

    return DispatchqScheduler(
        queue_name=runtime.storage.jobs.control_queue(),
        connection=runtime.redis,
        interval=TICK,
        job_class=DispatchqJob,
        queue_class=DispatchqQueue,
    )


def reschedule(runtime: Runtime, scope: str) -> str | None:
    """The window's `reschedule`: the scope's one retrigger, at its marker's lift."""
    from dispatchq.queue.retrigger import schedule_retrigger  # noqa: PLC0415 (lazy: rq-scheduler)

    return schedule_retrigger(runtime, runtime.window, scope)


QUEUE_PARTS = QueueParts(dispatcher=make_dispatcher, scheduler=make_scheduler, reschedule=reschedule)
