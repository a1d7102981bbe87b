"""An RQ job built and serialised in memory, for a storage script to save and push.

`Queue.enqueue_call` costs two to four Redis round trips and about half a millisecond
of Python per job (dependencies, a pipeline for `rq:queues`, then the save). `dispatchq
serve` accepts a webhook delivery only if its delivery id is new, and the check and the
enqueue must be one atomic step, so neither can be RQ's: the job is made here with
RQ's own `Job.create` and `Job.to_dict` (what `Job.save` writes), and
`dispatchq.storage.serve` writes it in the same Lua call that claims the delivery, for
many deliveries at once.

What this must keep equal to RQ's `Queue._enqueue_async_job` (origin, enqueued_at,
status, the hash's fields, the push to the queue's list and the queue's entry in
`rq:queues`) is pinned by a test that enqueues the same call both ways and compares the
hashes field by field, so an RQ upgrade that changes them fails there first.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rq.job import JobStatus
from rq.queue import Queue
from rq.utils import now

__all__ = ["JobTemplate", "PreparedJob"]


@dataclass(frozen=True)
class PreparedJob:
    """Everything a script needs to save one job and queue it, with no Python RQ left to run."""

    id: str
    key: str  # rq:job:<id>: the hash
    queue_key: str  # rq:queue:<name>: the list a worker pops
    queues_key: str  # rq:queues: the set RQ's tools and workers list queues from
    fields: tuple[str | bytes, ...]  # HSET field, value, field, value, ... (values as bytes)


class JobTemplate:
    """`Job.create` once per process; every job after it is a copy with its own id, args, times.

    `Job.create` resolves the serializer (a runtime Protocol check), parses four
    timeouts and validates the function on every call: about a third of accepting a
    webhook. What differs from one triage job to the next is only what is set here, all
    through `Job`'s public attributes; the hash is then `to_dict()`, as `Job.save` writes.
    """

    def __init__(self, queue: Queue, func: str, *, timeout: int, result_ttl: int, failure_ttl: int) -> None:
        self._queue = queue
        # The queue's own job class and serializer (dispatchq's: strict JSON), so a webhook's
        # job is written exactly as `queue.enqueue_call` would write it.
        self._job = queue.job_class.create(
            func,
            args=(),
            connection=queue.connection,
            timeout=timeout,
            result_ttl=result_ttl,
            failure_ttl=failure_ttl,
            origin=queue.name,
            status=JobStatus.QUEUED,
            serializer=queue.serializer,
        )

    def prepare(self, args: Sequence[Any], description: str) -> PreparedJob:
        """`queue.enqueue_call(func, args=…, description=…)` up to, not including, its Redis writes."""
        job = copy.copy(self._job)  # shallow: the shared parts (meta, dependencies) are never written
        job.id = uuid.uuid4().hex
        job.args = tuple(args)
        job.description = description
        job.created_at = job.enqueued_at = now()
        fields: list[str | bytes] = []
        for name, value in job.to_dict().items():
            if value is None:  # as RQ's own unique enqueue does: HSET cannot store a None
                continue
            # As redis-py encodes: a str (`status` is a str Enum, whose str() would be
            # "JobStatus.QUEUED") by its text, bytes as they are, a number by str().
            if isinstance(value, str):
                value = value.encode()
            elif not isinstance(value, bytes):
                value = str(value).encode()
            fields += (name, value)
        key = job.key
        return PreparedJob(
            id=job.id,
            key=key.decode() if isinstance(key, bytes) else str(key),
            queue_key=self._queue.key,
            queues_key=self._queue.redis_queues_keys,
            fields=tuple(fields),
        )
