"""`GET /metrics`: Prometheus exposition, read from Redis at scrape time.

A custom collector (no metric is kept in this process: several `serve` processes, or one
restarted, report the same numbers). Gauges come from `status`'s own data, so the page,
`status --json` and `/metrics` never disagree; counters and histograms from the store's
counters (every process adds to them in Redis). Names follow the exposition rules: a unit
suffix (`_seconds`, `_bytes`, `_usd`), `_timestamp_seconds` for an instant, `_ratio` for a
share, `_total` for a counter, `_info` for facts; a `tier` label only ever holds a tier of
the table (`dispatchq.core.tiers`), a `credential` label a name of the pool. Every family is
listed in `docs/metrics.md`.

The names this replaced stay for one release as duplicates whose HELP says
"deprecated: use X" (`DEPRECATED`), so dashboards can move at their own pace.
`dispatchq_serve_refused_total{reason}` (`concurrency`, `header_timeout`, `body_timeout`,
`body_too_large`) is this process's refusals by a bound (`RefusalCollector`), the one
metric kept in the process rather than Redis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from dispatchq.core.judgement import FINISHED, STATUSES
from dispatchq.core.tiers import TIERS, automatic_tiers
from dispatchq.core.waiting import WAIT_CLASSES
from dispatchq.serve.body import REASONS, REFUSALS
from dispatchq.serve.usage import usage_families
from dispatchq.workers.status import collect_status

if TYPE_CHECKING:
    from dispatchq.core.status import Counters, Status
    from dispatchq.runtime import Runtime

__all__ = ["DEPRECATED", "RefusalCollector", "StoreCollector", "build_version", "metric_families", "routes"]

#: Old family name -> the family to use instead (as exposed, `_total` included).
DEPRECATED: dict[str, str] = {
    "dispatchq_window_lifts_at_seconds": "dispatchq_window_lifts_at_timestamp_seconds",
    "dispatchq_window_utilization": "dispatchq_window_utilization_ratio",
    "dispatchq_judgements": "dispatchq_judgements_unfinished and dispatchq_judgements_by_status",
    "dispatchq_answered_total": 'dispatchq_judgements_finished_total{status="answered"}',
    "dispatchq_triage_outcomes_total": "dispatchq_triage_actions_total",
}


def _deprecated(name: str) -> str:
    return f"deprecated: use {DEPRECATED[name]}"


def build_version() -> str:
    """The installed distribution's version (what `dispatchq_build_info` says)."""
    try:
        return version("dispatchq")
    except PackageNotFoundError:
        return "unknown"


def metric_families(
    status: Status,
    *,
    oldest_waiting: Mapping[str, float] | None = None,
    histograms: Mapping[str, Any] | None = None,
    version: str | None = None,
) -> Iterator[Metric]:
    """Every metric, from `status` and its counters (pure: tested as a function).

    What the collector reads for metrics alone comes beside it: `oldest_waiting` (tier ->
    seconds), `histograms` (`storage.histograms.read_histograms`), `version`.
    """
    info = InfoMetricFamily("dispatchq_build", "The dispatchq version serving these metrics")
    info.add_metric([], {"version": version or build_version()})
    yield info
    yield from _window_families(status)
    yield from usage_families(status)  # the window's use as sessions reported it (serve/usage.py)
    yield from _pool_families(status)
    yield from _judgement_families(status, oldest_waiting or {})
    yield from _worker_families(status)
    yield from _counter_families(status.counters)
    yield from _histogram_families(histograms or {})


def _window_families(status: Status) -> Iterator[Metric]:
    closed = GaugeMetricFamily(
        "dispatchq_window_closed", "1 while the scope's usage window is closed", labels=["scope"]
    )
    lifts = GaugeMetricFamily(
        "dispatchq_window_lifts_at_timestamp_seconds",
        "When the scope's closed-window marker lifts (Unix time)",
        labels=["scope"],
    )
    old_lifts = GaugeMetricFamily(
        "dispatchq_window_lifts_at_seconds",
        _deprecated("dispatchq_window_lifts_at_seconds"),
        labels=["scope"],
    )
    old_used = GaugeMetricFamily(
        "dispatchq_window_utilization", _deprecated("dispatchq_window_utilization"), labels=["scope"]
    )
    for m in status.markers:
        closed.add_metric([m.scope], 1.0 if m.up else 0.0)
        if m.lifts_at_epoch is not None:
            lifts.add_metric([m.scope], m.lifts_at_epoch)
            old_lifts.add_metric([m.scope], m.lifts_at_epoch)
        if m.utilization is not None:
            old_used.add_metric([m.scope], m.utilization)
    if not any(m.scope == "general" for m in status.markers):
        closed.add_metric(["general"], 0.0)
    yield from (closed, lifts, old_lifts, old_used)


#: The credential states in which it takes sessions (`dispatchq_credential_open` is 1).
_TAKING = ("open", "busy", "probing")


def _pool_families(status: Status) -> Iterator[Metric]:
    """Per credential of the pool (`status.pool`), and the session backlog's estimated drain."""
    label = ["credential"]
    opened = GaugeMetricFamily(
        "dispatchq_credential_open",
        "1 while the credential takes sessions (open, busy or probing); 0 closed, spent or blocked",
        labels=label,
    )
    running = GaugeMetricFamily(
        "dispatchq_credential_sessions_running", "Sessions running on the credential", labels=label
    )
    spend = GaugeMetricFamily(
        "dispatchq_credential_spend_usd",
        "USD the credential spent today (period=day) and this month (period=month)",
        labels=["credential", "period"],
    )
    cap = GaugeMetricFamily(
        "dispatchq_credential_spend_cap_usd",
        "The credential's spend cap per day and per month (USD); absent where it has none",
        labels=["credential", "period"],
    )
    used = GaugeMetricFamily(
        "dispatchq_credential_window_utilization_ratio",
        "Share of the credential's window used, as its sessions last reported it (0..1)",
        labels=["credential", "window"],
    )
    for c in status.pool.credentials:
        opened.add_metric([c.name], 1.0 if c.state in _TAKING else 0.0)
        running.add_metric([c.name], float(c.running))
        spend.add_metric([c.name, "day"], c.spend.day)
        spend.add_metric([c.name, "month"], c.spend.month)
        for period, limit in (("day", c.spend.cap_day), ("month", c.spend.cap_month)):
            if limit is not None:
                cap.add_metric([c.name, period], limit)
        for w in c.windows:
            if w.utilization is not None:
                used.add_metric([c.name, w.window], w.utilization)
    yield from (opened, running, spend, cap, used)
    backlog = status.backlog
    yield GaugeMetricFamily(
        "dispatchq_session_backlog",
        "Session judgements queued or waiting in the lines",
        value=float(backlog.waiting),
    )
    drain = GaugeMetricFamily(
        "dispatchq_session_drain_seconds",
        "Estimated seconds until the session backlog is answered at today's rate (absent: no estimate)",
    )
    if backlog.drain_seconds is not None:
        drain.add_metric([], backlog.drain_seconds)
    yield drain


def _judgement_families(view: Status, ages: Mapping[str, float]) -> Iterator[Metric]:
    by_tier = view.judgements_by_tier
    counts = view.judgements
    unfinished = GaugeMetricFamily(
        "dispatchq_judgements_unfinished",
        "Unfinished judgements per tier and status (queued, running, waiting)",
        labels=["tier", "status"],
    )
    old = GaugeMetricFamily(
        "dispatchq_judgements", _deprecated("dispatchq_judgements"), labels=["tier", "status"]
    )
    for tier in TIERS:
        for status in (s for s in STATUSES if s not in FINISHED):
            n = float((by_tier.get(tier) or {}).get(status, 0))
            unfinished.add_metric([tier, status], n)
            old.add_metric([tier, status], n)
    by_status = GaugeMetricFamily(
        "dispatchq_judgements_by_status",
        "Judgements now in a status, all tiers (finished ones until their records expire)",
        labels=["status"],
    )
    for status in STATUSES:
        by_status.add_metric([status], float(counts.get(status, 0)))
        if status in FINISHED:
            old.add_metric(["all", status], float(counts.get(status, 0)))
    oldest = GaugeMetricFamily(
        "dispatchq_oldest_waiting_age_seconds",
        "Age of the oldest judgement queued or waiting for a tier (0: none)",
        labels=["tier"],
    )
    for tier in TIERS:
        oldest.add_metric([tier], float(ages.get(tier, 0.0)))
    waiting = GaugeMetricFamily(
        "dispatchq_waiting", "Waiting judgements by class of reason", labels=["reason_class"]
    )
    for cls in WAIT_CLASSES:
        waiting.add_metric([cls], float(view.waiting_by_class.get(cls, 0)))
    yield from (unfinished, by_status, old, oldest, waiting)


def _worker_families(status: Status) -> Iterator[Metric]:
    yield _per_tier("dispatchq_workers", "Live workers per tier (by their own heartbeat)", status.workers)
    yield _per_tier("dispatchq_queue_depth", "Judgements queued for a tier", status.queues)
    blocked = GaugeMetricFamily(
        "dispatchq_host_blocked",
        "1 for a host whose sessions are blocked by a host-wide failure",
        labels=["host"],
    )
    for host in status.sessions.blocked:
        blocked.add_metric([host], 1.0)
    yield blocked
    yield GaugeMetricFamily(
        "dispatchq_scheduler_alive",
        "1 while the scheduler's heartbeat is fresh",
        value=1.0 if status.scheduler.alive else 0.0,
    )
    warning = GaugeMetricFamily(
        "dispatchq_warning",
        "1 per warning status shows at its top (workers/warnings.py: its id names the fact)",
        labels=["id"],
    )
    for w in status.warnings:
        warning.add_metric([w.id], 1.0)
    yield warning


def _counter_families(counters: Counters) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "dispatchq_sessions_spawned", "Sessions started", value=float(counters.sessions_spawned)
    )
    yield CounterMetricFamily(
        "dispatchq_sessions_refused_at_spawn",
        "Sessions refused at spawn by a closed window (no cost)",
        value=float(counters.sessions_refused),
    )
    answered = counters.answered
    yield CounterMetricFamily(
        "dispatchq_sessions_avoided",
        "Judgements answered below the session tier (code or typed)",
        value=float(sum(answered.get(tier, 0) for tier in automatic_tiers())),
    )
    old_answered = CounterMetricFamily(
        "dispatchq_answered", _deprecated("dispatchq_answered_total"), labels=["tier"]
    )
    for tier in TIERS:
        old_answered.add_metric([tier], float(answered.get(tier, 0)))
    yield old_answered
    yield CounterMetricFamily(
        "dispatchq_typed_requests",
        "Typed-tier provider requests made",
        value=float(counters.typed_requests),
    )
    actions = CounterMetricFamily(
        "dispatchq_triage_actions", "Triage planned actions by their reason code", labels=["reason"]
    )
    old_triage = CounterMetricFamily(
        "dispatchq_triage_outcomes", _deprecated("dispatchq_triage_outcomes_total"), labels=["row"]
    )
    for reason, n in sorted(counters.triage_outcomes.items()):
        actions.add_metric([reason], float(n))
        old_triage.add_metric([reason], float(n))
    yield from (actions, old_triage)
    yield from _finished_families(counters.finished)


def _finished_families(finished: Mapping[str, int]) -> Iterator[Metric]:
    """Finished per tier; a judgement that finished outside every tier (escalated to a person:
    needs-triage, or cancelled before a tier took it) is counted per status alone."""
    tiered = CounterMetricFamily(
        "dispatchq_judgements_finished",
        "Judgements that reached a finished status, per tier (answered: the tier that answered)",
        labels=["tier", "status"],
    )
    untiered: dict[str, float] = {}
    for name, n in sorted(finished.items()):
        tier, _, status = name.rpartition(":")
        if tier in TIERS:
            tiered.add_metric([tier, status], float(n))
        else:
            untiered[status] = untiered.get(status, 0.0) + float(n)
    outside = CounterMetricFamily(
        "dispatchq_judgements_finished_untiered",
        "Judgements that reached a finished status outside every tier (e.g. needs-triage)",
        labels=["status"],
    )
    for status, total in sorted(untiered.items()):
        outside.add_metric([status], total)
    yield from (tiered, outside)


_HISTOGRAM_DOCS = {
    "queue_time": (
        "dispatchq_queue_time_seconds",
        "Seconds from enqueue until the answering tier's worker took the judgement, per tier",
        "tier",
    ),
    "session_duration": ("dispatchq_session_duration_seconds", "Seconds a session ran, per spawn", None),
}


def _histogram_families(histograms: Mapping[str, Any]) -> Iterator[Metric]:
    for key, (name, doc, label) in _HISTOGRAM_DOCS.items():
        family = HistogramMetricFamily(name, doc, labels=[label] if label else None)
        for value, h in sorted((histograms.get(key) or {}).items()):
            if label and value not in TIERS:
                continue  # a tier outside the table: never a label value
            family.add_metric([value] if label else [], buckets=h.buckets, sum_value=h.sum)
        yield family


def _per_tier(name: str, doc: str, values: Mapping[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["tier"])
    for tier in TIERS:
        family.add_metric([tier], float(values.get(tier, 0)))
    return family


class StoreCollector(Collector):
    """Reads Redis at every scrape (through `status` and the store's counters)."""

    def __init__(self, get_runtime: Callable[[], Runtime]) -> None:
        self.get_runtime = get_runtime

    def describe(self) -> Iterable[Metric]:
        return []  # nothing read at registration: Redis is read at scrape time only

    def collect(self) -> Iterable[Metric]:
        rt = self.get_runtime()
        status = collect_status(rt)
        ages, histograms = rt.storage.histograms.oldest_waiting(), rt.storage.histograms.read()
        return list(metric_families(status, oldest_waiting=ages, histograms=histograms))


class RefusalCollector(Collector):
    """This process's bound refusals (`dispatchq.serve.body.REFUSALS`): not in Redis.

    Counted where Redis is not at hand (uvicorn's protocol, before any route) and per
    process, so each `serve` is scraped for its own; a restart starts them at 0, which
    Prometheus reads as a counter reset.
    """

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        refused = CounterMetricFamily(
            "dispatchq_serve_refused",
            "Requests this serve process refused by a bound (503, 408 or 413)",
            labels=["reason"],
        )
        for reason in REASONS:
            refused.add_metric([reason], float(REFUSALS[reason]))
        return [refused]


def routes(get_runtime: Callable[[], Runtime]) -> list[BaseRoute]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(get_runtime))
    registry.register(RefusalCollector())

    async def metrics(request: Request) -> Response:
        body = await run_in_threadpool(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST, headers={"Cache-Control": "no-store"})

    return [Route("/metrics", metrics, methods=["GET"], name="metrics")]
