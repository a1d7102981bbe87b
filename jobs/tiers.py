"""RQ job entry points. Thin on purpose: the work is in `dispatchq`.

Workers reach these through `dispatchq.queue.entrypoints` (a fixed table of these names,
loaded from this file), never by importing the name read from Redis.
"""

from __future__ import annotations

from typing import Any

from dispatchq.process.wiring import get_runtime, session_hooks

__all__ = [
    "code",
    "on_job_failure",
    "retrigger",
    "session",
    "triage",
    "triage_deliveries",
    "typed",
]


def code(ids: list[str]) -> int:
    from dispatchq.tiers.code import process_batch

    return process_batch(get_runtime(), ids)


def typed(ids: list[str]) -> int:
    from rq import get_current_job

    from dispatchq.tiers.typed import process_batch

    job = get_current_job()  # which job carries `ids`: a sibling may have moved some elsewhere
    return process_batch(get_runtime(), ids, job_id=job.id if job is not None else None)


def session(jid: str, slot: str, probes: list[str] | None = None) -> str:
    from dispatchq.tiers.session import run_claimed

    return run_claimed(get_runtime(), jid, slot, probes, hooks=session_hooks())


def retrigger(scope: str, lifts_at: float) -> str:
    from dispatchq.queue.retrigger import retrigger as fire

    return fire(get_runtime(), scope, lifts_at)


def on_job_failure(job: Any, connection: Any, exc_type: Any, exc_value: Any, traceback: Any) -> None:
    """RQ calls this when a job fails or its worker died; RQ retries it if it can.

    Only when RQ has no retries left do the job's unfinished judgements fail, each
    with the reason, visibly: a judgement is never silently dropped.
    """
    from dispatchq.workers.run import job_failed

    job_failed(get_runtime(), job, exc_type, exc_value)


def triage(event: dict[str, Any], mode: str | None = None) -> dict[str, Any]:
    """`dispatchq triage --enqueue`: runs on the typed queue."""
    from dispatchq.tiers.typed import run_triage

    return run_triage(get_runtime(), event, mode)


def triage_deliveries(delivery_ids: list[str]) -> list[dict[str, Any]]:
    """`POST /webhooks/github`: the deliveries one accept call took, triaged on the typed queue."""
    from rq import get_current_job

    from dispatchq.tiers.typed import run_deliveries

    job = get_current_job()
    return run_deliveries(get_runtime(), delivery_ids, job.id if job is not None else "")
