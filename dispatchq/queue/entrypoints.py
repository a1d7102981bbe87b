"""The fixed table of dispatchq's RQ entry points, and the job class that honours it.

RQ stores a job's function and callbacks in Redis by dotted name and, left to itself,
imports whatever name it reads. dispatchq's names live in a top-level `jobs` package
(`jobs.tiers.code`, ...: the names jobs already in users' Redis carry), and a user's
project with its own `jobs/` folder on `sys.path` would have RQ import *that* instead:
every job then fails with a traceback from someone else's code. So a dispatchq worker
never imports a name it read from Redis. `DispatchqJob` looks each name up in this
table, which maps it to dispatchq's own callable, loaded from the file inside the
installed package (never found through `sys.path`); any other name is refused, by name,
before anything of the job runs.

The names themselves are data, kept in `dispatchq.core.entrypoints` (derived from the tier
table), so every room names its jobs from there rather than keeping its own string; this
module is the part that resolves them, and the only one that loads `jobs/tiers.py`.

Resolving names is not enough while the job's data is pickled: unpickling it runs whatever
its author wrote before any name is looked at. So `DispatchqJob` reads and writes its data,
`meta` and results as strict JSON (`dispatchq.queue.serializer`) whatever serializer a
caller passes, and `DispatchqQueue`, the one queue class every site builds, vets each job
as it is dequeued (`refusal_of`: JSON of the job's shape, a function and callbacks from the
table, no webhooks) and fails a refused one on the spot with its one line (`refuse`),
before RQ resolves, imports or runs anything of it; the worker then takes the next job.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rq.exceptions import DeserializationError
from rq.job import Job
from rq.job_lifecycle import record_job_failure
from rq.queue import Queue
from rq.timeouts import UnixSignalDeathPenalty

from dispatchq.core import entrypoints as entry_names
from dispatchq.queue.serializer import JSONSerializer
from dispatchq.storage import rqstate

if TYPE_CHECKING:
    from redis import Redis
    from rq.timeouts import BaseDeathPenalty

__all__ = [
    "ENTRY_MODULE_FILE",
    "DispatchqJob",
    "DispatchqQueue",
    "RefusedData",
    "RefusedEntryPoint",
    "entry_module",
    "refusal_of",
    "refuse",
    "resolve",
]

log = logging.getLogger("dispatchq.queue.entrypoints")

#: dispatchq's own `jobs/tiers.py`: beside the `dispatchq` package, wherever it is installed.
ENTRY_MODULE_FILE = Path(__file__).resolve().parents[2] / "jobs" / "tiers.py"
#: Where the module is kept when `jobs` in `sys.modules` is somebody else's package.
_PRIVATE_NAME = "dispatchq.queue.entrypoints.jobs_tiers"
_LOAD = threading.Lock()


class RefusedEntryPoint(LookupError):
    """A job or callback names something outside dispatchq's table: it is not imported.

    Its message is the one line a refused job fails with. `role` is `job`, a callback's
    (`on_failure`, `on_success`, `on_stopped`), `webhook` (dispatchq's jobs carry none),
    `data` (not dispatchq's JSON: `RefusedData`) or `global` (a pickled job of the previous
    release that needs a global to be decoded; see `dispatchq.queue.upgrade`).
    """

    def __init__(self, role: str, name: object) -> None:
        self.role = role
        self.name = name
        super().__init__(_message(role, name))


class RefusedData(RefusedEntryPoint, DeserializationError):
    """A job whose data is not dispatchq's JSON (pickled, foreign, another shape): never decoded
    any further. Also RQ's `DeserializationError`, which RQ's own code paths already expect."""

    def __init__(self, name: object) -> None:
        super().__init__("data", name)


def _message(role: str, name: object) -> str:
    if role == "data":
        return (
            f"refused job data ({name}): not dispatchq's JSON; "
            "a dispatchq worker never unpickles what it reads from Redis"
        )
    if role == "global":
        return (
            f"refused pickled job needing global {name!r}: dispatchq's own jobs need none; "
            "it was not unpickled and will not run"
        )
    if role == "webhook":
        return f"refused webhook {name!r}: dispatchq's jobs carry none; a worker calls no URL read from Redis"
    table = entry_names.JOB_FUNCTIONS if role == "job" else entry_names.CALLBACKS.get(role, {})
    known = ", ".join(sorted(table)) or "none"
    return (
        f"refused {role} {name!r}: not one of dispatchq's entry points (allowed: {known}); "
        "a dispatchq worker never imports a name read from Redis"
    )


def _is_ours(module: ModuleType | None) -> bool:
    found = getattr(module, "__file__", None)
    return found is not None and Path(found).resolve() == ENTRY_MODULE_FILE


def entry_module() -> ModuleType:
    """dispatchq's `jobs/tiers.py`, loaded from its file, never found through `sys.path`.

    `jobs.tiers` already imported from this very file is used as it is (one copy of it per
    process). Otherwise it is loaded under a private name, so that a user's own `jobs`
    package keeps its name for the user's own modules.
    """
    with _LOAD:
        for name in ("jobs.tiers", _PRIVATE_NAME):
            module = sys.modules.get(name)
            if _is_ours(module):
                assert module is not None
                return module
        spec = importlib.util.spec_from_file_location(_PRIVATE_NAME, ENTRY_MODULE_FILE)
        if spec is None or spec.loader is None:
            raise ImportError(f"dispatchq's entry points are missing: {ENTRY_MODULE_FILE}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[_PRIVATE_NAME] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[_PRIVATE_NAME]
            raise
        return module


def resolve(role: str, name: object) -> Callable[..., Any]:
    """dispatchq's callable for `name` as a job's function (`role="job"`) or as a callback
    (`"on_failure"`, `"on_success"`, `"on_stopped"`); `RefusedEntryPoint` for anything else."""
    table = entry_names.JOB_FUNCTIONS if role == "job" else entry_names.CALLBACKS.get(role, {})
    attr = table.get(name) if isinstance(name, str) else None
    if attr is None:
        raise RefusedEntryPoint(role, name)
    fn: Callable[..., Any] = getattr(entry_module(), attr)
    return fn


def _kind_of(data: bytes) -> str:
    """What a refused job's data looks like, for its one line (never decoded to find out)."""
    if data[:1] == b"\x80":
        return "pickle"
    return "not a JSON job"


class DispatchqJob(Job):
    """An RQ job whose data is strict JSON, and whose function and callbacks come from the
    table, never from an import.

    The serializer is fixed, whatever a caller (RQ itself, rq-scheduler, a registry) passes:
    a job of this class never unpickles its data, `meta` or results. Its data must be the
    JSON of RQ's `(function name, None, args, kwargs)`; anything else is `RefusedData`.

    `perform` resolves every name the job carries before anything runs, so a job with a
    refused callback does not run its (allowed) function first and fail afterwards.
    """

    def __init__(
        self, id: str | None = None, connection: Redis | None = None, serializer: Any = None
    ) -> None:
        super().__init__(id, connection=connection, serializer=JSONSerializer)

    def _deserialize_data(self) -> None:
        data = self.data
        try:
            loaded = self.serializer.loads(data)
        except Exception:
            raise RefusedData(_kind_of(data)) from None
        if not (
            isinstance(loaded, list)
            and len(loaded) == 4
            and isinstance(loaded[0], str)
            and loaded[1] is None
            and isinstance(loaded[2], list)
            and isinstance(loaded[3], dict)
        ):
            raise RefusedData("JSON, but not a job's (function, None, args, kwargs)")
        self._func_name, self._instance = loaded[0], None
        self._args, self._kwargs = tuple(loaded[2]), loaded[3]

    @property
    def func(self) -> Callable[..., Any] | None:
        name = self.func_name
        if name is None:
            return None
        if self.instance is not None:  # a method of an object: never one of ours
            raise RefusedEntryPoint("job", name)
        return resolve("job", name)

    @property
    def success_callback(self) -> Any:
        return self._callback("on_success", self._success_callback_name)

    @property
    def failure_callback(self) -> Any:
        return self._callback("on_failure", self._failure_callback_name)

    @property
    def stopped_callback(self) -> Any:
        return self._callback("on_stopped", self._stopped_callback_name)

    def _callback(self, role: str, name: str | None) -> Callable[..., Any] | None:
        return resolve(role, name) if name else None

    def perform(self) -> Any:
        refused = refusal_of(self)
        if refused is not None:  # a job that did not come through `DispatchqQueue.dequeue_any`
            raise refused
        return super().perform()


def refusal_of(job: Job) -> RefusedEntryPoint | None:
    """Why `job` must not run, or None: checked from its hash alone, nothing imported or called.

    Its data must be dispatchq's JSON, its function and each callback a name of the table,
    and it may carry no webhook (RQ would call the URL when the job ends).
    """
    if not isinstance(job, DispatchqJob):  # read with another serializer: not decoded here
        return RefusedData("not read as a dispatchq job")
    try:
        name = job.func_name
        if name not in entry_names.JOB_FUNCTIONS:
            return RefusedEntryPoint("job", name)
        callbacks = (
            ("on_success", job._success_callback_name),
            ("on_failure", job._failure_callback_name),
            ("on_stopped", job._stopped_callback_name),
        )
        for role, callback in callbacks:
            if callback and callback not in entry_names.CALLBACKS[role]:
                return RefusedEntryPoint(role, callback)
        if job.webhooks:
            return RefusedEntryPoint("webhook", job.webhooks[0].url)
    except RefusedEntryPoint as refused:
        return refused
    return None


def refuse(job: Job, refused: RefusedEntryPoint, *, queue: Queue | None = None) -> None:
    """Fail `job` with the one line and take it out of `queue` (and the list a worker moves a
    job to while taking it), so it never runs and is never retried; log the line once."""
    if queue is not None and not job.origin:
        job.origin = queue.name
    with rqstate.batch(job.connection) as pipe:
        if queue is not None:
            rqstate.drop_from_lists(pipe, [queue.key, queue.intermediate_queue_key], job.id)
        record_job_failure(job, str(refused), pipe)
    log.warning("job %s (queue %s) refused: %s", job.id, job.origin or "?", refused)


class DispatchqQueue(Queue):
    """The one RQ queue class of dispatchq: `DispatchqJob`s only, JSON only, each job vetted as
    it is dequeued.

    Built at every site that makes a queue (the dispatcher, workers, the scheduler, registries
    go through their queue) and handed to rq-scheduler as its `queue_class`, so a job the
    scheduler moves is one of these too. A refused job fails with its one line and the
    dequeue goes on to the next job: the worker never sees it.
    """

    job_class = DispatchqJob

    def __init__(
        self,
        name: str = "default",
        connection: Redis | None = None,
        default_timeout: int | None = None,
        is_async: bool = True,
        job_class: Any = None,
        serializer: Any = None,
        death_penalty_class: type[BaseDeathPenalty] | None = UnixSignalDeathPenalty,
        **kwargs: Any,
    ) -> None:
        # Whatever a caller (RQ, rq-scheduler, a registry) passes: dispatchq's job class, JSON.
        super().__init__(
            name,
            connection=connection,
            default_timeout=default_timeout,
            is_async=is_async,
            job_class=DispatchqJob,
            serializer=JSONSerializer,
            death_penalty_class=death_penalty_class,
            **kwargs,
        )

    @classmethod
    def dequeue_any(
        cls,
        queues: Iterable[Queue],
        timeout: int | None,
        connection: Redis,
        job_class: type[Job] | None = None,
        serializer: Any = None,
        death_penalty_class: type[BaseDeathPenalty] | None = None,
    ) -> tuple[Job, Queue] | None:
        queues = list(queues)
        while True:
            found = super().dequeue_any(
                queues,
                timeout,
                connection,
                job_class=DispatchqJob,
                serializer=JSONSerializer,
                death_penalty_class=death_penalty_class,
            )
            if found is None:
                return None
            job, queue = found
            refused = refusal_of(job)
            if refused is None:
                return job, queue
            refuse(job, refused, queue=queue)
