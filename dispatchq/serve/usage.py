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

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from dispatchq.core.status import Status

__all__ = ["usage_families"]


def usage_families(status: Status) -> Iterator[Metric]:
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
    for row in status.window_usage:
        if row.utilization is not None:
            used.add_metric([row.scope], row.utilization)
        if row.resets_at_epoch is not None:
            resets.add_metric([row.scope], row.resets_at_epoch)
        if row.reported_at_epoch is not None:
            reported.add_metric([row.scope], row.reported_at_epoch)
    expires = GaugeMetricFamily(
        "dispatchq_credential_expires_at_timestamp_seconds",
        "When a host's stored Claude login ends, as its sessions reported it (Unix time)",
        labels=["host"],
    )
    for cred in status.credentials:
        if cred.expires_at_epoch is not None:
            expires.add_metric([cred.host], cred.expires_at_epoch)
    yield from (used, resets, reported, expires)
