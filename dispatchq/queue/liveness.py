"""Is the RQ job behind a `running` judgement still alive, lost, or orphaned by its worker?

dispatchq's records say `running` from the moment a worker claims them; RQ keeps the job.
The two can part ways: a write refused under `maxmemory` can leave a job that says
`queued` while sitting in no queue and no registry, and a worker killed mid-job leaves a
`started` job whose worker is gone until RQ's maintenance notices the missed heartbeat.
This module tells the cases apart from RQ's own data, so reconciliation heals the first
(nobody will ever run it) and `status` names the second (RQ will retry it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import redis
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.worker import Worker

__all__ = ["JobLiveness", "job_liveness", "live_rq_workers"]

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
        job = Job.fetch(job_id, connection=client)
    except NoSuchJobError:
        return JobLiveness("lost", "its job no longer exists")
    status = job.get_status(refresh=False)
    if status == JobStatus.QUEUED:
        queue = Queue(job.origin, connection=client)
        if client.lpos(queue.key, job_id) is None:
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
