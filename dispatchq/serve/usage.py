"""`/metrics` families for the window's usage as sessions reported it (a hook of `serve.metrics`).

Read from `status`'s own `window_usage` and `credentials` rows, so the page, `status --json` and
`/metrics` never disagree. Names follow the exposition rules (a unit suffix, `_ratio` for a
share, `_timestamp_seconds` for an instant):

- `dispatchq_window_utilization_ratio{scope}`: share of the window used (0..1), latest report;
- `dispatchq_window_resets_at_timestamp_seconds{scope}`: when the window resets (Unix time);
- `dispatchq_window_usage_reported_at_timestamp_seconds{scope}`: when that was reported (its age);
- `dispatchq_credential_expires_at_timestamp_seconds{host}`: when a host's stored login ends.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

__all__ = ["usage_families"]


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def usage_families(data: Mapping[str, Any]) -> Iterator[Metric]:
    """The usage gauges from `status`'s data (pure: tested as a function)."""
    used = GaugeMetricFamily(
        "dispatchq_window_utilization_ratio",
        "Share of the window used, as a session last reported it (0..1)",
        labels=["scope"],
    )
    resets = GaugeMetricFamily(
        "dispatchq_window_resets_at_timestamp_seconds",
        "When the window resets, as a session last reported it (Unix time)",
        labels=["scope"],
    )
    reported = GaugeMetricFamily(
        "dispatchq_window_usage_reported_at_timestamp_seconds",
        "When a session last reported the window's use (Unix time)",
        labels=["scope"],
    )
    for row in data.get("window_usage") or []:
        scope = str(row.get("scope"))
        if (share := _float(row.get("utilization"))) is not None:
            used.add_metric([scope], share)
        if (at := _float(row.get("resets_at_epoch"))) is not None:
            resets.add_metric([scope], at)
        if (at := _float(row.get("reported_at_epoch"))) is not None:
            reported.add_metric([scope], at)
    expires = GaugeMetricFamily(
        "dispatchq_credential_expires_at_timestamp_seconds",
        "When a host's stored Claude login ends, as its sessions reported it (Unix time)",
        labels=["host"],
    )
    for row in data.get("credentials") or []:
        if (at := _float(row.get("expires_at_epoch"))) is not None:
            expires.add_metric([str(row.get("host"))], at)
    yield from (used, resets, reported, expires)
