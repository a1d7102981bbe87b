"""`GET /metrics`: Prometheus exposition, read from Redis at scrape time.

A custom collector (no metric is kept in this process: several `serve` processes, or one
restarted, report the same numbers). Gauges come from `status`'s own data, so the page,
`status --json` and `/metrics` never disagree; counters from the store's counters:

- per usage-window scope: `dispatchq_window_closed`, `dispatchq_window_lifts_at_seconds`,
  `dispatchq_window_utilization` (when the session reported it);
- `dispatchq_judgements{tier,status}`: unfinished judgements (queued, running, waiting) per
  tier; finished ones (kept until their records expire) with `tier="all"`, because a
  record's tier is not indexed once it is finished;
- `dispatchq_waiting{reason_class}` (`window`, `host_blocked`, `slot`, `lock`, `retry`,
  `other`: reasons are free text, labels are not), `dispatchq_workers{tier}`,
  `dispatchq_queue_depth{tier}`, `dispatchq_host_blocked{host}`;
- counters: `dispatchq_sessions_spawned_total`, `dispatchq_sessions_refused_at_spawn_total`,
  `dispatchq_sessions_avoided_total`, `dispatchq_answered_total{tier}`,
  `dispatchq_typed_requests_total`, `dispatchq_triage_outcomes_total{row}` (per resolution
  row: the reason code of each planned action), `dispatchq_judgements_finished_total{tier,status}`;
- `dispatchq_serve_refused_total{reason}` (`concurrency`, `header_timeout`, `body_timeout`,
  `body_too_large`): this process's refusals by a bound (`RefusalCollector`), the one
  metric kept in the process rather than Redis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from dispatchq.core.judgement import FINISHED, STATUSES
from dispatchq.core.tiers import TIERS
from dispatchq.core.waiting import WAIT_CLASSES
from dispatchq.serve.body import REASONS, REFUSALS
from dispatchq.serve.usage import usage_families
from dispatchq.workers.status import collect_status

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime

__all__ = ["RefusalCollector", "StoreCollector", "metric_families", "routes"]


def metric_families(data: dict[str, Any], counters: dict[str, Any]) -> Iterator[Metric]:
    """Every metric, from `status`'s data and the store's counters (pure: tested as a function)."""
    closed = GaugeMetricFamily(
        "dispatchq_window_closed", "1 while the scope's usage window is closed", labels=["scope"]
    )
    lifts = GaugeMetricFamily(
        "dispatchq_window_lifts_at_seconds", "When the scope's marker lifts (Unix time)", labels=["scope"]
    )
    used = GaugeMetricFamily(
        "dispatchq_window_utilization",
        "Share of the scope's window used, as last reported (0..1)",
        labels=["scope"],
    )
    for m in data.get("markers") or []:
        closed.add_metric([m["scope"]], 1.0 if m.get("up") else 0.0)
        if m.get("lifts_at_epoch") is not None:
            lifts.add_metric([m["scope"]], float(m["lifts_at_epoch"]))
        if m.get("utilization") is not None:
            used.add_metric([m["scope"]], float(m["utilization"]))
    if not any(m.get("scope") == "general" for m in data.get("markers") or []):
        closed.add_metric(["general"], 0.0)
    yield from (closed, lifts, used)
    yield from usage_families(data)  # the window's use as sessions reported it (serve/usage.py)

    judgements = GaugeMetricFamily(
        "dispatchq_judgements",
        "Judgements now in a status (unfinished: per tier; finished: tier=all, until their records expire)",
        labels=["tier", "status"],
    )
    by_tier: dict[str, dict[str, int]] = data.get("judgements_by_tier") or {}
    for tier in sorted(set(TIERS) | set(by_tier)):
        for status in STATUSES:
            if status not in FINISHED:
                judgements.add_metric([tier, status], float((by_tier.get(tier) or {}).get(status, 0)))
    for status in STATUSES:
        if status in FINISHED:
            judgements.add_metric(["all", status], float((data.get("judgements") or {}).get(status, 0)))
    yield judgements

    waiting = GaugeMetricFamily(
        "dispatchq_waiting", "Waiting judgements by class of reason", labels=["reason_class"]
    )
    for cls in WAIT_CLASSES:
        waiting.add_metric([cls], float((data.get("waiting_by_class") or {}).get(cls, 0)))
    yield waiting
    yield _per_tier(
        "dispatchq_workers", "Live workers per tier (by their own heartbeat)", data.get("workers")
    )
    yield _per_tier("dispatchq_queue_depth", "Judgements queued for a tier", data.get("queues"))

    blocked = GaugeMetricFamily(
        "dispatchq_host_blocked",
        "1 for a host whose sessions are blocked by a host-wide failure",
        labels=["host"],
    )
    for host in (data.get("sessions") or {}).get("blocked") or {}:
        blocked.add_metric([host], 1.0)
    yield blocked
    yield GaugeMetricFamily(
        "dispatchq_scheduler_alive",
        "1 while the scheduler's heartbeat is fresh",
        value=1.0 if _alive(data) else 0.0,
    )

    yield CounterMetricFamily(
        "dispatchq_sessions_spawned", "Sessions started", value=float(counters.get("sessions_spawned", 0))
    )
    yield CounterMetricFamily(
        "dispatchq_sessions_refused_at_spawn",
        "Sessions refused at spawn by a closed window (no cost)",
        value=float(counters.get("sessions_refused", 0)),
    )
    answered: dict[str, int] = counters.get("answered") or {}
    yield CounterMetricFamily(
        "dispatchq_sessions_avoided",
        "Judgements answered below the session tier (code or typed)",
        value=float(answered.get("code", 0) + answered.get("typed", 0)),
    )
    per_tier = CounterMetricFamily("dispatchq_answered", "Judgements answered per tier", labels=["tier"])
    for tier in TIERS:
        per_tier.add_metric([tier], float(answered.get(tier, 0)))
    yield per_tier
    yield CounterMetricFamily(
        "dispatchq_typed_requests",
        "Typed-tier provider requests made",
        value=float(counters.get("typed_requests", 0)),
    )
    triage = CounterMetricFamily(
        "dispatchq_triage_outcomes", "Triage planned actions by resolution row (reason code)", labels=["row"]
    )
    for row, n in sorted((counters.get("triage_outcomes") or {}).items()):
        triage.add_metric([row], float(n))
    yield triage
    finished = CounterMetricFamily(
        "dispatchq_judgements_finished",
        "Judgements that reached a finished status, per tier",
        labels=["tier", "status"],
    )
    for name, n in sorted((counters.get("finished") or {}).items()):
        tier, _, status = name.rpartition(":")
        finished.add_metric([tier, status], float(n))
    yield finished


def _per_tier(name: str, doc: str, values: dict[str, int] | None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["tier"])
    for tier in TIERS:
        family.add_metric([tier], float((values or {}).get(tier, 0)))
    return family


def _alive(data: dict[str, Any]) -> bool:
    return bool((data.get("scheduler") or {}).get("alive"))


class StoreCollector(Collector):
    """Reads Redis at every scrape (through `status` and the store's counters)."""

    def __init__(self, get_runtime: Callable[[], Runtime]) -> None:
        self.get_runtime = get_runtime

    def describe(self) -> Iterable[Metric]:
        return []  # nothing read at registration: Redis is read at scrape time only

    def collect(self) -> Iterable[Metric]:
        data = collect_status(self.get_runtime())
        return list(metric_families(data, data["counters"]))


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
