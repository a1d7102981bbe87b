"""The window's usage for people: what `status`, `/status`, the page and `/metrics` show (pure).

Sessions report each window's utilisation and reset (`unifiedWindows`, `allowed_warning`); the
store keeps the latest per window (`dispatchq.storage.usage`). Here those reports become rows
with their age (a figure an hour old says less than one a minute old), and a host whose
stored login ends within `CREDENTIAL_WARNING` becomes a WARNING: a stored claude.ai login has
a hard end, and every session of that host stops on that day.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from dispatchq.core.status import CredentialRow, Status, UsageRow

__all__ = ["CREDENTIAL_WARNING", "credential_rows", "usage_lines", "usage_rows"]

CREDENTIAL_WARNING = timedelta(days=7)


def _iso(epoch: object) -> str | None:
    if isinstance(epoch, bool) or not isinstance(epoch, int | float) or not math.isfinite(epoch):
        return None
    return datetime.fromtimestamp(float(epoch), UTC).isoformat()


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def usage_rows(stored: Mapping[str, Mapping[str, Any]], now: float) -> list[UsageRow]:
    """One row per window, by name: utilisation (0..1), reset, and how old the report is."""
    rows = []
    for window in sorted(stored):
        entry = stored[window]
        reported = _number(entry.get("reported_at"))
        rows.append(
            UsageRow(
                scope=window,
                utilization=_number(entry.get("utilization")),
                resets_at=_iso(entry.get("resets_at")),
                resets_at_epoch=_number(entry.get("resets_at")),
                status=entry.get("status"),
                reported_at=_iso(reported),
                reported_at_epoch=reported,
                age_seconds=max(0, math.floor(now - reported)) if reported is not None else None,
                session=entry.get("session") or None,
                host=entry.get("host") or None,
            )
        )
    return rows


def credential_rows(stored: Mapping[str, Mapping[str, Any]], now: float) -> list[CredentialRow]:
    """Per host, when its stored login ends; `warning` set when that is within `CREDENTIAL_WARNING`."""
    rows = []
    for host in sorted(stored):
        expires = _number(stored[host].get("expires_at"))
        if expires is None:
            continue
        left = expires - now
        warning = None
        if left <= CREDENTIAL_WARNING.total_seconds():
            when = datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%d %H:%M UTC")
            ends = "ended" if left <= 0 else f"ends in {left / 86400:.1f} days"
            warning = (
                f"the stored Claude login on host {host} {ends} ({when}): sign in there again "
                "(`claude auth login`), or give its sessions a token from `claude setup-token`"
            )
        rows.append(
            CredentialRow(
                host=host,
                expires_at=_iso(expires),
                expires_at_epoch=expires,
                expires_in_seconds=math.floor(left),
                reported_at=_iso(stored[host].get("reported_at")),
                warning=warning,
            )
        )
    return rows


def _age(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return "?"
    s = int(seconds)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def usage_lines(status: Status) -> list[str]:
    """What `dispatchq status` prints of the usage and the logins (plain text, no markup)."""
    lines = []
    for row in status.window_usage:
        used = row.utilization
        share = f"{used:.0%} used" if used is not None else "use not reported"
        resets = f", resets {row.resets_at}" if row.resets_at else ""
        lines.append(
            f"window usage [{row.scope}]: {share}{resets} "
            f"(reported {_age(row.age_seconds)} ago by session {row.session or '-'})"
        )
    lines += [f"WARNING: {cred.warning}" for cred in status.credentials if cred.warning]
    return lines
