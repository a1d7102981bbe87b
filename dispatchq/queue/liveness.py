"""Is the RQ job behind a `running` judgement still alive, lost, or orphaned by its worker?

dispatchq's records say `running` from the moment a worker claims them; RQ keeps the job.
The two can part ways: a write refused under `maxmemory` can leave a job that says
`queued` while sitting in no queue and no registry, and a worker killed mid-job leaves a
`started` job whose worker is gone until RQ's maintenance notices the missed heartbeat.
This module tells the cases apart from RQ's own data, so reconciliation heals the first
(nobody will ever run it) and `status` names the second (RQ will retry it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Literal

import redis
from rq.exceptions import NoSuchJobError
from rq.job import JobStatus
from rq.queue import Queue
from rq.registry import StartedJobRegistry
from rq.worker import Worker

from dispatchq.queue.entrypoints import DispatchqJob, DispatchqQueue, refusal_of
from dispatchq.queue.serializer import JSONSerializer
from dispatchq.storage import rqstate
from dispatchq.storage.connection import process_alive

__all__ = [
    "JobLiveness",
    "SessionHolder",
    "abandon_now",
    "job_liveness",
    "live_rq_workers",
    "session_holders",
]

State = Literal["alive", "lost", "orphaned"]


@dataclass(frozen=True)
class JobLiveness:
    """`alive`: queued in its queue, scheduled, or run by a live worker. `lost`: no queue,
    no registry and no worker will ever run it. `orphaned`: started by a worker that died
    (RQ's maintenance retries it once the heartbeat expires)."""

    state: State
    why: str
    worker: str | None = None
    #: The job's last heartbeat (epoch), when it was started.
    heartbeat: float | None = None


def live_rq_workers(client: redis.Redis) -> set[str]:
    """Names of RQ workers whose registration has not expired (a dead one's expires)."""
    return {w.name for w in Worker.all(connection=client)}


def job_liveness(client: redis.Redis, job_id: str | None, *, workers: set[str] | None = None) -> JobLiveness:
    """What became of `job_id` (the RQ job a `running` record names)."""
    if not job_id:
        return JobLiveness("lost", "the record names no job")
    try:
        job = DispatchqJob.fetch(job_id, connection=client)
    except NoSuchJobError:
        return JobLiveness("lost", "its job no longer exists")
    status = job.get_status(refresh=False)
    if status == JobStatus.QUEUED:
        queue = DispatchqQueue(job.origin, connection=client)
        if not rqstate.in_list(client, queue.key, job_id):
            return JobLiveness("lost", "its job says queued but is in no queue")
        return JobLiveness("alive", "queued")
    if status in (JobStatus.SCHEDULED, JobStatus.DEFERRED):
        return JobLiveness("alive", str(status))
    if status == JobStatus.STARTED:
        names = live_rq_workers(client) if workers is None else workers
        beat = job.last_heartbeat.timestamp() if job.last_heartbeat is not None else None
        if job.worker_name and job.worker_name not in names:
            return JobLiveness("orphaned", "its worker died", job.worker_name, beat)
        return JobLiveness("alive", "started", job.worker_name, beat)
    # finished, failed, stopped, canceled: the job ended but the record was never told.
    return JobLiveness("lost", f"its job ended ({status}) without answering")


# --- the session jobs a waiting caller depends on ------------------------------------------
@dataclass(frozen=True)
class SessionHolder:
    """The started RQ job behind a `running` session judgement, as a waiting caller names it.

    `expires`: when RQ's own cleanup will find it abandoned if its worker is gone (the
    started registry's score: the job's last heartbeat plus the grace). `dead`: its worker
    ran on this host, that process is gone, and its own heartbeat stopped (so a same-named
    host in another PID namespace is never taken for dead): nobody will ever renew it.
    """

    jid: str
    job_id: str
    entry: str
    queue: str
    slot: str | None
    worker: str | None
    host: str | None
    pid: int | None
    expires: float
    dead: bool


def session_holders(
    client: redis.Redis,
    queues: Iterable[Queue],
    *,
    host: str,
    stale_after: float,
    jids: Collection[str] | None = None,
) -> list[SessionHolder]:
    """The started session jobs of `queues` (those running one of `jids`, when given): each
    runs one judgement (its first argument) holding one session slot (its second)."""
    out = []
    for queue in queues:
        registry = _started(queue.name, client)
        for entry, score in rqstate.started_entries(client, registry.key):
            job_id = registry.parse_job_id(entry)
            try:
                job = DispatchqJob.fetch(job_id, connection=client)
            except NoSuchJobError:
                continue
            if refusal_of(job) is not None:  # not one of ours: a worker fails it, never runs it
                continue
            if not job.args or (jids is not None and str(job.args[0]) not in jids):
                continue
            info = rqstate.worker_info(client, job.worker_name) if job.worker_name else {}
            pid = info.get("pid") if isinstance(info.get("pid"), int) else None
            beat = info.get("heartbeat")
            stale = isinstance(beat, int | float) and time.time() - beat > stale_after
            mine = info.get("host") == host and stale
            dead = mine and pid is not None and pid != os.getpid() and not process_alive(pid)
            slot = str(job.args[1]) if len(job.args) > 1 else None
            holder = SessionHolder(
                str(job.args[0]), job_id, entry, queue.name, slot, job.worker_name, info.get("host"), pid,
                float(score), dead,
            )  # fmt: skip
            out.append(holder)
    return out


def _started(queue: str, client: redis.Redis) -> StartedJobRegistry:
    # dispatchq's job class and JSON: the registry fetches jobs (and runs an abandoned one's
    # failure callback) with what it is given, not with what the worker runs.
    return StartedJobRegistry(queue, connection=client, job_class=DispatchqJob, serializer=JSONSerializer)


def abandon_now(client: redis.Redis, holder: SessionHolder) -> None:
    """Hand a job whose worker is known dead to RQ's own abandoned-job handling now, instead of
    when its heartbeat lapses: the started entry is marked expired and the registry cleaned (the
    failure callback puts the judgement back in line and frees its session slot)."""
    registry = _started(holder.queue, client)
    rqstate.expire_started_entry(client, registry.key, holder.entry)
    registry.cleanup()
