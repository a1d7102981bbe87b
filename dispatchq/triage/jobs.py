"""Triage's RQ jobs: an event from `dispatchq triage --enqueue`, a batch of webhook deliveries.

Both run on the typed queue (a typed worker asks, resolves and runs the executor), but
this room sits below the tiers and below the queue: it takes what it needs as arguments.
`jobs/tiers.py` hands the rules engine its `ask` (the typed tier's provider through
`dispatchq.tiers.typed.tier.provider_ask`) and its storages; the queue comes from the
dispatcher (`runtime.dispatcher`), named here only by the one method
used, so that neither the tiers nor RQ are imported from the rules engine's room.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from dispatchq.core.entrypoints import DELIVERIES_JOB, TRIAGE_JOB
from dispatchq.errors import DeliveriesFailed
from dispatchq.storage.prepared import JobTemplate, PreparedJob
from dispatchq.storage.serve import ServeStorage
from dispatchq.storage.triage import TriageStorage
from dispatchq.triage.engine import Ask, TriageStore, budget_for, triage
from dispatchq.triage.executors import build_executor
from dispatchq.triage.rules import Event, Mode, TriageConfig

if TYPE_CHECKING:
    from dispatchq.settings import Settings

__all__ = [
    "Queues",
    "TriageOne",
    "deliveries_template",
    "enqueue_triage",
    "prepare_deliveries",
    "run_deliveries",
    "run_triage",
]

TriageOne = Callable[[dict[str, Any]], dict[str, Any]]
"""Triage one event (an envelope) and return the result's JSON: `run_triage` with its parts bound."""


class Queues(Protocol):
    """The dispatcher's queues (`dispatchq.queue.dispatch.Dispatcher`), by the one method used.

    The queue it returns is RQ's; it is `Any` here because naming RQ's `Queue` would be an
    import of RQ from the rules engine's room, which the import contracts forbid.
    """

    def queue(self, tier: str, host: str | None = None) -> Any: ...


def enqueue_triage(queues: Queues, settings: Settings, event: dict[str, Any], mode: str | None) -> str:
    """Put an event on the typed queue: a typed worker asks, resolves and runs the executor."""
    job = queues.queue("typed").enqueue_call(
        TRIAGE_JOB,
        args=(event, mode),
        timeout=settings.typed_job_timeout,
        result_ttl=settings.result_ttl,
        failure_ttl=settings.result_ttl,
        description=f"dispatchq triage {event.get('event')} {event.get('target')}",
    )
    return str(job.id)


def deliveries_template(queues: Queues, settings: Settings) -> JobTemplate:
    """The RQ job of a batch of webhook deliveries, as a template (`dispatchq serve` makes one
    job per accept call from it, and saves it in that call)."""
    return JobTemplate(
        queues.queue("typed"),
        DELIVERIES_JOB,
        timeout=settings.typed_job_timeout,
        result_ttl=settings.result_ttl,
        failure_ttl=settings.result_ttl,
    )


def prepare_deliveries(template: JobTemplate, delivery_ids: Sequence[str]) -> PreparedJob:
    """The job that triages these deliveries' events (`run_deliveries`), unwritten."""
    unique = list(dict.fromkeys(delivery_ids))  # a redelivery riding with its first copy is named once
    return template.prepare((unique,), f"dispatchq triage {len(unique)} webhook deliveries")


def run_deliveries(
    deliveries: ServeStorage, delivery_ids: Sequence[str], job_id: str, triage_one: TriageOne
) -> list[dict[str, Any]]:
    """A typed worker's side of `POST /webhooks/github`: triage each delivery this job accepted.

    A delivery whose record names another job is a redelivery that arrived in this
    job's batch: its first copy's job triages it, so it is skipped here. One event
    failing does not stop the others; the job then fails naming each, so nothing is
    dropped without a trace (`triage_one` is called per delivery, inside that guard, so
    a part it builds failing fails that delivery, not the job before it starts).
    """
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    for delivery_id in dict.fromkeys(delivery_ids):  # a copy in the same batch is the same delivery
        record = deliveries.delivery(delivery_id)
        if record is None or record.get("job") != job_id:
            why = "its record expired" if record is None else "a redelivery, triaged by its first job"
            results.append({"delivery": delivery_id, "skipped": why})
            continue
        try:
            results.append({"delivery": delivery_id, **triage_one(record["envelope"])})
        except Exception as error:
            failures.append(f"{delivery_id}: {type(error).__name__}: {error}")
    if failures:
        raise DeliveriesFailed(
            f"{len(failures)} of {len(delivery_ids)} deliveries failed: " + "; ".join(failures)
        )
    return results


def run_triage(
    event_data: dict[str, Any],
    mode: str | None,
    *,
    config: TriageConfig | None,
    storage: TriageStorage,
    settings: Settings,
    ask: Ask,
) -> dict[str, Any]:
    """The typed worker's side of `triage --enqueue`: one batched request, the table, the executor.

    Triage has no confidence band of its own and never escalates to a session: the
    table's gates are the band. Its budget is the one model the CLI uses too:
    `triage.budget` and DISPATCHQ_TRIAGE_HOURLY_BUDGET, rolling windows kept in Redis.
    """
    if config is None:
        raise RuntimeError("the config has no triage section")
    event = Event.from_json(event_data)
    executor = build_executor(
        config.executor,
        storage,
        github_token=settings.github_token,
        github_api_url=settings.github_api_url,
        repositories=config.repositories,
    )
    try:
        result = triage(
            event,
            config,
            ask=ask,
            store=TriageStore(storage),
            executor=executor,
            budget=budget_for(storage, config, settings.triage_hourly_budget),
            mode_override=cast("Mode | None", mode),  # the CLI offered only MODES
        )
    finally:
        executor.close()
    return result.to_json()
