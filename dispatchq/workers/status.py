"""What `dispatchq status` shows, gathered as one typed `Status` (its `--json` form is `as_json()`).

It lives in `workers/` because counting workers means asking RQ (`Worker.all`), and only
`queue/`, `workers/` and `storage/` may import RQ; the CLI only renders what this returns.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from dispatchq.core.judgement import STATUSES
from dispatchq.core.status import Brief, SchedulerPart, Status, TypedPart, WorkerFacts
from dispatchq.core.tiers import TIERS, automatic_tiers, batch_tiers, row
from dispatchq.queue.liveness import job_liveness
from dispatchq.queue.retrigger import scheduled_retriggers
from dispatchq.queue.scheduler import scheduler_alive
from dispatchq.storage.history import series
from dispatchq.triage.status import status_section as triage_section
from dispatchq.workers.warnings import collect_warnings

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime

__all__ = ["LATEST_SHOWN", "WAITING_REASONS_SHOWN", "collect_status"]

#: How many distinct waiting reasons `status` lists (counted exactly), and latest judgements.
WAITING_REASONS_SHOWN = 20
LATEST_SHOWN = 10


def collect_status(rt: Runtime) -> Status:
    """Everything `dispatchq status` shows, as one typed `Status` (`dispatchq.core.status`)."""
    dispatcher = rt.dispatcher
    store = rt.storage.records
    depths: dict[str, int] = {}
    for tier in TIERS:
        if row(tier).admission == "queue":
            depths[tier] = sum(q.count for q in dispatcher.queues_for(tier))
        else:
            depths[tier] = store.line_depth([store.line_of(rt.settings.host), store.line_of()])
    # Workers as they describe themselves, alive by their own recent heartbeat: a killed
    # worker stops counting within a heartbeat, not when RQ's registration expires.
    ttl = rt.settings.heartbeat_interval + rt.settings.heartbeat_grace
    details = [WorkerFacts.model_validate(w) for w in store.live_workers(ttl=ttl)]
    per_tier = Counter(w.tier for w in details)
    workers = {tier: per_tier[tier] for tier in TIERS}
    counts: dict[str, int] = {s: store.count(s) for s in STATUSES}
    # Counts, never the waiting records themselves: constant time however many wait.
    live = store.live_counts()
    waiting, distinct = store.waiting_reasons(WAITING_REASONS_SHOWN)
    answered = store.answered_counts()
    window = rt.window.status()
    # The session backlog from the live counts (constant time), not by reading the lines.
    session = live.by_tier.get("session") or {}
    backlog = rt.window.backlog(
        session.get("queued", 0) + session.get("waiting", 0),
        series(rt.storage.history.read(time.time())),
        window.pool.credentials,
    )
    retriggers = scheduled_retriggers(rt)
    server = rt.storage.server.facts()
    counters = store.counters()  # monotonic: what `/metrics` exports as *_total
    status = Status(
        now=time.time(),  # the server's clock: the page counts down from it, not the browser's
        redis=rt.settings.describe_redis(),
        redis_version=server.redis_version,
        redis_appendfsync=server.redis_appendfsync,
        redis_used_memory=server.redis_used_memory,
        redis_maxmemory=server.redis_maxmemory,
        redis_hash_value_limit=server.redis_hash_value_limit,
        redis_unreadable=server.redis_unreadable,
        queues=depths,
        workers=workers,
        worker_details=sorted(details, key=lambda w: (w.tier or "", w.host or "", w.name or "")),
        judgements=counts,
        answered=answered,
        sessions_avoided=sum(answered[t] for t in automatic_tiers()),
        waiting=waiting,
        waiting_reasons_distinct=distinct,
        waiting_by_class=live.waiting,
        waiting_sample=[_brief(b) for b in store.waiting_sample()],
        judgements_by_tier=live.by_tier,
        latest=[_brief(b) for b in store.latest(LATEST_SHOWN)],
        scheduler=SchedulerPart(alive=scheduler_alive(rt), scheduled_jobs=rt.scheduler.count()),
        typed=_typed_status(rt, details),
        judgements_orphaned=_orphaned(rt, details),
        marker=window.marker,
        markers=window.markers,
        window_usage=window.window_usage,
        credentials=window.credentials,
        retrigger=retriggers[0].at if retriggers else None,
        retriggers=retriggers,
        sessions=window.sessions,
        window_audit=window.window_audit,
        pool=window.pool,
        backlog=backlog,
        counters=counters,
        triage=triage_section(rt.storage.triage, outcomes_total=counters.triage_outcomes),
    )
    if live.rebuilt is not None:
        status.waiting_counts_rebuilt = live.rebuilt
    status.warnings = collect_warnings(status)  # the red facts at the top (workers/warnings.py)
    return status


def _brief(brief: Brief) -> Brief:
    """A judgement as `status` lists it: what, where, why; never its whole input."""
    return brief.model_copy(update={"item": _short(brief.item), "value": _short(brief.value)})


def _short(value: Any, limit: int = 300) -> Any:
    """A value as it is when small, else its JSON cut to `limit` characters."""
    if value is None or isinstance(value, bool | int | float):
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _typed_status(rt: Runtime, details: list[WorkerFacts]) -> TypedPart:
    """Keyless when the typed workers are: they are the tier, not the operator's shell.

    With typed workers running, their own report decides (all keyless: keyless). With none
    running, a typed worker's recent word that it ran without a key decides.
    """
    host = rt.storage.records.typed_keyless_host()
    typed = [w for w in details if w.tier == "typed"]
    keyless = all(w.keyless for w in typed) if typed else host is not None
    return TypedPart(keyless=keyless, keyless_worker_host=host)


def _orphaned(rt: Runtime, details: list[WorkerFacts]) -> int:
    """`running` judgements whose worker died (RQ retries them once the heartbeat expires).

    A job carries a batch of judgements (200 by default), so each job is asked about once per
    call, not once per judgement it carries.
    """
    store = rt.storage.records
    running = [r for r in store.get_many(store.ids("running")) if r is not None and r.tier in batch_tiers()]
    if not running:
        return 0
    workers = {str(w.name) for w in details}
    jobs = Counter(getattr(r, "job", None) for r in running)
    return sum(
        n for job, n in jobs.items() if job_liveness(rt.redis, job, workers=workers).state == "orphaned"
    )
