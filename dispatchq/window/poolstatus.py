"""The pool as people see it: each credential's state, windows, sessions and spend, and the backlog's
estimated drain (what `status`, `/status`, the page and `/metrics` show).

Everything here is a pure reading of what the window already stores (markers, the usage
sessions reported, the pool's slots, spend and blocks, the running sessions) and of the
scheduler's minute samples (`storage.history`); `Window.status` and `Window.backlog` hand it
those reads.

The drain estimate says only what was measured. Its rate is the session judgements answered
per hour over the sampled minutes of the last 24 hours in which the window was open (a
closed minute answers nothing by construction and would say nothing of the rate once it
opens); with fewer than `RATE_MIN_MINUTES` such minutes, or none answered in them, there is
no estimate. The drain starts now when some credential can take a session (open, busy or
being probed), else at the earliest instant one opens by itself (a lift, a cap's next day
or month); with every credential blocked it has no start and no estimate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from dispatchq.core.status import BacklogPart, PoolCredential, SpendPart, WindowReport
from dispatchq.pools.credentials import DEFAULT_CREDENTIAL, Credential, Pool
from dispatchq.pools.routing import lift_time
from dispatchq.pools.spend import cap_lifts_at, cap_refusal, estimate_for
from dispatchq.window.marker import Marker
from dispatchq.window.pooling import usage_of

__all__ = [
    "ANSWERED_SAMPLE",
    "CLOSED_SAMPLE",
    "RATE_MIN_MINUTES",
    "MinuteSample",
    "credential_line",
    "credential_rows",
    "drain_estimate",
    "drain_start",
    "measured_rate",
    "minutes_of",
    "pool_lines",
]

#: The fewest open sampled minutes a rate is measured over: a quarter of an hour says little,
#: fewer says nothing.
RATE_MIN_MINUTES = 15
#: The history sample's names (`storage.history`) of the session tier's answers and of a
#: minute sampled with the window closed.
ANSWERED_SAMPLE = "answered:session"
CLOSED_SAMPLE = "closed"

#: The states a credential may take a session in now (the drain starts now).
_TAKING = ("open", "busy", "probing")


@dataclass(frozen=True)
class MinuteSample:
    """One minute of the scheduler's history: its start, the session answers in it, whether the
    window was closed (the deltas `storage.history.series` computes)."""

    at: float
    answered: int
    closed: bool


# --- the credentials ------------------------------------------------------------------------
def _iso(epoch: float | None) -> str | None:
    if epoch is None or not math.isfinite(epoch):
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def _windows(stored_usage: Mapping[str, Mapping[str, Any]], name: str, now: float) -> list[WindowReport]:
    rows = []
    for use in sorted(usage_of(stored_usage, name), key=lambda u: u.window):
        age = None if use.reported_at is None else max(0, math.floor(now - use.reported_at))
        rows.append(
            WindowReport(
                window=use.window,
                utilization=use.utilization,
                resets_at=_iso(use.resets_at),
                reported_at=_iso(use.reported_at),
                age_seconds=age,
            )
        )
    return rows


def _state(
    credential: Credential,
    mine: Sequence[Marker],
    held: Any,
    running: int,
    now: float,
    timezone: str,
) -> tuple[str, str, float | None]:
    """(state, why, when it opens by itself) for one credential, the weightiest state first."""
    if held is not None and held.blocked:
        return "blocked", f"blocked: {held.blocked}", None
    closed = [m for m in mine if m.closed(now)]
    if closed:
        last = max(closed, key=lambda m: m.lifts_at)
        return "closed", f"closed until {lift_time(last.lifts_at, timezone)} ({last.kind})", last.lifts_at
    day = held.spent_day if held is not None else 0.0
    month = held.spent_month if held is not None else 0.0
    if credential.metered:
        estimate = estimate_for(None, held.recent if held is not None else ())
        refused = cap_refusal(credential.spend_cap, day, month, estimate)
        if refused is not None:
            until = cap_lifts_at(credential.spend_cap, day, month, estimate, now=now, timezone=timezone)
            return "spent", refused, until
    if mine:
        first = min(mine, key=lambda m: m.lifts_at)
        return (
            "probing",
            f"lifted at {lift_time(first.lifts_at, timezone)}: one probe session goes first",
            None,
        )
    used = max(running, held.slots_used if held is not None else 0)
    if used >= credential.concurrency:
        return "busy", f"all {credential.concurrency} session slot(s) busy", None
    return "open", "open", None


def credential_rows(
    pool: Pool,
    markers: Sequence[Marker],
    *,
    stored: Mapping[str, Any],
    usage: Mapping[str, Mapping[str, Any]],
    running: Iterable[str | None],
    now: float,
    timezone: str,
) -> list[PoolCredential]:
    """One row per credential of `pool`, in its order.

    `stored` maps a credential to its `StoredPoolState`; `usage` is the stored usage hash;
    `running` names the credential of each running session (None: a session written before
    pools, the `default` credential's).
    """
    counts: dict[str, int] = {}
    for name in running:
        key = name or DEFAULT_CREDENTIAL
        counts[key] = counts.get(key, 0) + 1
    rows = []
    for credential in pool:
        name = credential.name
        held = stored.get(name)
        mine = [m for m in markers if m.credential == name]
        state, why, until = _state(credential, mine, held, counts.get(name, 0), now, timezone)
        cap = credential.spend_cap
        rows.append(
            PoolCredential(
                name=name,
                backend=credential.backend,
                billing=credential.billing,
                state=state,  # type: ignore[arg-type]
                why=why,
                concurrency=credential.concurrency,
                running=counts.get(name, 0),
                lifts_at=_iso(until),
                lifts_at_epoch=until,
                windows=_windows(usage, name, now),
                markers=[m.public(timezone) for m in mine],
                spend=SpendPart(
                    day=held.spent_day if held is not None else 0.0,
                    month=held.spent_month if held is not None else 0.0,
                    cap_day=cap.day if cap is not None else None,
                    cap_month=cap.month if cap is not None else None,
                ),
            )
        )
    return rows


# --- the backlog ----------------------------------------------------------------------------
def minutes_of(rows: Iterable[Mapping[str, Any]]) -> list[MinuteSample]:
    """The minutes of `storage.history.series` (per-minute deltas); a gap is no sample."""
    return [
        MinuteSample(
            at=float(r["at"]), answered=int(r.get(ANSWERED_SAMPLE) or 0), closed=bool(r.get(CLOSED_SAMPLE))
        )
        for r in rows
        if not r.get("gap")
    ]


def measured_rate(minutes: Sequence[MinuteSample]) -> tuple[float | None, float]:
    """(session judgements answered per hour over the open minutes, how many hours that is).

    None when fewer than `RATE_MIN_MINUTES` open minutes were sampled or none answered: no
    rate was measured.
    """
    open_minutes = [m for m in minutes if not m.closed]
    hours = len(open_minutes) / 60
    answered = sum(max(0, m.answered) for m in open_minutes)
    if len(open_minutes) < RATE_MIN_MINUTES or answered <= 0:
        return None, hours
    return answered / hours, hours


def drain_start(credentials: Sequence[PoolCredential], now: float) -> float | None:
    """When the backlog starts draining: now when some credential takes sessions, else the
    earliest instant one opens by itself; None when none will (all blocked, no cap lift)."""
    if any(c.state in _TAKING for c in credentials):
        return now
    opens = [c.lifts_at_epoch for c in credentials if c.lifts_at_epoch is not None]
    return max(now, min(opens)) if opens else None


def _clock(at: float, now: float, timezone: str) -> str:
    """`19:40` today in `timezone`, `Dec 06 19:40` on another day."""
    zone = ZoneInfo(timezone)
    local = datetime.fromtimestamp(at, zone)
    same_day = local.date() == datetime.fromtimestamp(now, zone).date()
    return local.strftime("%H:%M") if same_day else local.strftime("%b %d %H:%M")


def drain_estimate(
    waiting: int,
    rate_per_hour: float | None,
    starts_at: float | None,
    *,
    now: float,
    timezone: str,
    rate_hours: float = 0.0,
) -> BacklogPart:
    """When `waiting` judgements are answered at `rate_per_hour`, starting at `starts_at`.

    `drain_at = starts_at + waiting / rate_per_hour` hours. No estimate (and a text that
    says why) when nothing waits, when no rate was measured, or when no credential will open.
    """
    at: float | None = None
    if waiting <= 0:
        text = "nothing waiting"
    elif rate_per_hour is None or rate_per_hour <= 0 or not math.isfinite(rate_per_hour):
        text = f"{waiting} waiting: no estimate yet (no session rate measured)"
    elif starts_at is None:
        text = f"{waiting} waiting: no estimate (no credential opens by itself)"
    else:
        at = starts_at + waiting / rate_per_hour * 3600
        text = f"{waiting} waiting: ~{_clock(at, now, timezone)} at today's rate"
    # Every field is set, null when it does not apply: the document always holds each one.
    return BacklogPart(
        waiting=waiting,
        rate_per_hour=rate_per_hour,
        rate_hours=round(rate_hours, 2),
        starts_at=_iso(starts_at),
        drain_at=_iso(at),
        drain_at_epoch=at,
        drain_seconds=0.0 if waiting <= 0 else (max(0.0, at - now) if at is not None else None),
        drain_text=text,
    )


# --- what `dispatchq status` prints -----------------------------------------------------------
def _ago(seconds: int | None) -> str:
    if seconds is None:
        return "age unknown"
    if seconds < 120:
        return f"{seconds} s ago"
    return f"{seconds // 60} min ago" if seconds < 7200 else f"{seconds // 3600} h ago"


def _short_time(iso: str | None, now: float, timezone: str) -> str:
    if iso is None:
        return "?"
    return _clock(datetime.fromisoformat(iso).timestamp(), now, timezone)


def credential_line(row: PoolCredential, *, now: float, timezone: str) -> str:
    """`team-max: closed until 15:00 (five_hour) · 2 running of 2 · five_hour 83% (resets 15:00,
    4 min ago) · spend today $3.10`: one credential as `status` prints it (plain text)."""
    state = row.why or row.state
    lifts = row.lifts_at_epoch
    if row.state == "closed" and lifts is not None:
        # The marker that lifts last closes it (`_state`): its kind names the limit.
        kind = next((m.kind for m in row.markers if m.lifts_at_epoch == lifts and m.kind), None)
        state = f"closed until {_clock(lifts, now, timezone)}" + (f" ({kind})" if kind else "")
    parts = [f"{row.name}: {state}", f"{row.running} running of {row.concurrency}"]
    for w in row.windows:
        used = f"{w.utilization:.0%}" if w.utilization is not None else "use not reported"
        parts.append(
            f"{w.window} {used} (resets {_short_time(w.resets_at, now, timezone)}, {_ago(w.age_seconds)})"
        )
    spend = row.spend
    if row.billing == "metered" or spend.day or spend.month:
        day = f"spend today ${spend.day:,.2f}" + (f" of ${spend.cap_day:,.2f}" if spend.cap_day else "")
        month = f"this month ${spend.month:,.2f}" + (
            f" of ${spend.cap_month:,.2f}" if spend.cap_month else ""
        )
        parts.append(f"{day}, {month}")
    return " · ".join(parts)


def pool_lines(
    credentials: Sequence[PoolCredential], backlog: BacklogPart, *, now: float, timezone: str
) -> list[str]:
    """What `dispatchq status` prints of the pool: a line per credential when there is more than
    one or any is metered (one subscription credential reads as the markers always did), then
    the backlog."""
    lines = []
    if len(credentials) > 1 or any(c.billing == "metered" for c in credentials):
        lines += [f"credential {credential_line(c, now=now, timezone=timezone)}" for c in credentials]
    lines.append(f"session backlog: {backlog.drain_text}")
    return lines
