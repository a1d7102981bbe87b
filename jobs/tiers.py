"""RQ job entry points. Thin on purpose: the work is in `dispatchq`.

Workers reach these through `dispatchq.queue.entrypoints` (a fixed table of these names,
loaded from this file), never by importing the name read from Redis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# `session_hooks` is also what the session worker's spool replay runs (`workers.session.replay_hooks`).
from dispatchq.process.wiring import get_runtime, session_hooks

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime

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

    from dispatchq.tiers.typed.tier import process_batch

    job = get_current_job()  # which job carries `ids`: a sibling may have moved some elsewhere
    return process_batch(get_runtime(), ids, job_id=job.id if job is not None else None)


def session(jid: str, slot: str, probes: list[str] | None = None, claim: str | None = None) -> str:
    from dispatchq.tiers.session import run_claimed

    return run_claimed(get_runtime(), jid, slot, probes, hooks=session_hooks(), claim=claim)


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
    return _triage_one(get_runtime(), mode)(event)


def triage_deliveries(delivery_ids: list[str]) -> list[dict[str, Any]]:
    """`POST /webhooks/github`: the deliveries one accept call took, triaged on the typed queue."""
    from rq import get_current_job

    from dispatchq.triage.jobs import run_deliveries

    runtime = get_runtime()
    job = get_current_job()
    job_id = job.id if job is not None else ""
    return run_deliveries(runtime.storage.serve, delivery_ids, job_id, _triage_one(runtime, None))


def _triage_one(runtime: Runtime, mode: str | None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The rules engine over this process's parts: the typed tier's provider as its `ask`.

    Built per event, when it is triaged, as the engine always read them: a config or
    key that cannot be read fails that event (one delivery of a batch), not the job.
    """
    from dispatchq.tiers.typed.tier import provider_ask, provider_for
    from dispatchq.triage.jobs import run_triage

    def triage_one(event: dict[str, Any]) -> dict[str, Any]:
        config = runtime.config.triage
        storage = runtime.storage.triage
        ask = provider_ask(provider_for(runtime))
        return run_triage(event, mode, config=config, storage=storage, settings=runtime.settings, ask=ask)

    return triage_one
