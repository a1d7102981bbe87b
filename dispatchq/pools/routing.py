"""Which credentials a judgement may use now, best first, and why each other one may not.

`route` is a pure judgement over what the window read (each credential's closed markers,
slots, spend and the usage its sessions last reported): the window then takes a slot on the
first usable credential in one storage script, and a judgement with none waits, its reason
naming every credential it may use (`waiting_reason`).

The order follows the proxies that pool accounts (better-ccflare's "session drain
soonest", TeamClaude's routing): free quota before paid money (subscription before
metered), then a credential running ahead of its window's pace yields, then the operator's
`order`, then the credential whose weekly window resets soonest (use what expires), then
the least used, then the pool's own order. A usage report is trusted only while it can
still be true (TeamClaude #46, #167: a stale 0.98 paced an account forever).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Literal
from zoneinfo import ZoneInfo

from dispatchq.core.priority import PRIORITIES, at_least
from dispatchq.pools.credentials import Credential
from dispatchq.pools.spend import cap_lifts_at, cap_refusal

__all__ = [
    "PACING_MARGIN",
    "RESERVED",
    "WINDOW_SECONDS",
    "Closure",
    "CredentialState",
    "Refusal",
    "RefusalCause",
    "Route",
    "WindowUse",
    "ahead_of_pace",
    "elapsed_share",
    "fresh",
    "lift_time",
    "route",
    "utilisation",
    "waiting_reason",
    "weekly_reset",
    "window_seconds",
]

#: How far (a share of the window) a credential's utilisation may run ahead of the window's
#: elapsed share before it yields to a peer that is not ahead: ten points lets a burst at
#: the start of a window through and still spreads a steady load over the pool.
PACING_MARGIN: float = 0.10

_HOUR = 3600.0
_WEEK = 7 * 24 * _HOUR
#: The length of each window a session reports, by its name. Every `seven_day*` window
#: (a model's own, the overage-included one) is a week, named or not (`window_seconds`).
WINDOW_SECONDS: Mapping[str, float] = MappingProxyType(
    {
        "five_hour": 5 * _HOUR,
        "seven_day": _WEEK,
        "seven_day_opus": _WEEK,
        "seven_day_sonnet": _WEEK,
        "seven_day_haiku": _WEEK,
        "seven_day_fable": _WEEK,
        "seven_day_overage_included": _WEEK,
    }
)
_WEEKLY_PREFIX = "seven_day"
#: The closure kind of the share of a window kept for people.
RESERVED = "reserved"
_URGENT = "urgent"
_UTC = "UTC"
#: Float noise in `share + margin` (0.8 + 0.1) must not make a credential exactly at the
#: margin yield.
_EPSILON = 1e-9
_NONE: Mapping[str, str] = MappingProxyType({})

RefusalCause = Literal["serves", "blocked", "closed", "cap", "busy"]


@dataclass(frozen=True)
class WindowUse:
    """What sessions last said of one window of one credential."""

    window: str  # "five_hour", "seven_day", "seven_day_opus", "seven_day_overage_included", ...
    utilization: float | None  # 0..1 (may pass 1)
    resets_at: float | None  # epoch seconds
    reported_at: float | None = None  # None: the caller vouches it is current


@dataclass(frozen=True)
class Closure:
    """A closed marker on the credential that applies to this judgement's model."""

    kind: str  # the marker's LimitKind ("five_hour", "seven_day", "reserved", "operator", ...)
    lifts_at: float


@dataclass(frozen=True)
class CredentialState:
    """One credential and what the window knows of it now."""

    credential: Credential
    closures: tuple[Closure, ...] = ()
    slots_used: int = 0
    spent_day: float = 0.0
    spent_month: float = 0.0
    estimate: float = 0.0  # what one session is expected to cost on it (0 for subscription)
    blocked: str | None = None  # why it is blocked everywhere (an authentication failure), else None
    usage: tuple[WindowUse, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """Why one credential may not take this judgement now.

    `cause` sorts the refusals: `serves` (the credential is not this judgement's to use),
    `blocked`, `closed` (a marker; `limit` is its kind and `until` its lift), `cap`
    (`until`: the next day or month), `busy` (its slots are taken: `hard` is False, the
    judgement is queued, not waiting for a window).
    """

    credential: str
    why: str
    until: float | None = None  # when it may open by itself (a lift), None when unknown
    hard: bool = True  # False for a busy slot (the judgement is not 'waiting' for a window, just queued)
    cause: RefusalCause = "closed"
    limit: str | None = None  # the kind of the closure that lifts last (cause `closed`)


@dataclass(frozen=True)
class Route:
    """The credentials a judgement may use now, best first, and every other one with why."""

    usable: tuple[Credential, ...]  # best first
    refusals: tuple[Refusal, ...]  # every other credential of the pool, each with why

    @property
    def waits(self) -> bool:
        """No usable credential."""
        return not self.usable

    @property
    def eligible(self) -> tuple[Refusal, ...]:
        """The refusals of credentials the judgement may use (its `serves` allows it)."""
        return tuple(r for r in self.refusals if r.cause != "serves")

    @property
    def waiting(self) -> bool:
        """No usable credential and none it may use is merely busy: it waits for a window (or a
        cap, or an operator), not for a slot."""
        return self.waits and all(r.hard for r in self.eligible)

    @property
    def opens_at(self) -> float | None:
        """For a judgement that waits, the earliest instant one of the credentials it may use opens
        by itself (a lift, the next day or month of a cap), if any is known; None when one is
        usable now."""
        if not self.waits:
            return None
        known = [r.until for r in self.eligible if r.hard and r.until is not None]
        return min(known) if known else None


# --- usage and pacing ----------------------------------------------------------------------
def window_seconds(window: str) -> float | None:
    """How long a window is, or None for one whose length is not known."""
    if window in WINDOW_SECONDS:
        return WINDOW_SECONDS[window]
    return _WEEK if window.startswith(_WEEKLY_PREFIX) else None


def fresh(use: WindowUse, now: float) -> bool:
    """Does the report still say something of its window at `now`?

    Not when its window has reset since (`resets_at` passed), nor when it is older than the
    window is long (its window certainly reset since, whatever it said), nor when the
    window's length is unknown (its age cannot be judged).
    """
    length = window_seconds(use.window)
    if length is None:
        return False
    if use.resets_at is not None and use.resets_at <= now:
        return False
    return use.reported_at is None or now - use.reported_at <= length


def elapsed_share(use: WindowUse, now: float) -> float | None:
    """How much of the window has passed at `now` (0..1), or None when the report says nothing."""
    length = window_seconds(use.window)
    if length is None or use.resets_at is None or not fresh(use, now):
        return None
    start = use.resets_at - length
    return min(1.0, max(0.0, (now - start) / length))


def ahead_of_pace(use: WindowUse, now: float, margin: float = PACING_MARGIN) -> bool:
    """Has the credential used more of this window than its elapsed share, by more than `margin`?"""
    share = elapsed_share(use, now)
    used = use.utilization
    if share is None or used is None or not math.isfinite(used):
        return False
    return used > share + margin + _EPSILON


def utilisation(usage: Sequence[WindowUse], now: float) -> float:
    """The highest utilisation among the fresh reports; 0 with none.

    A credential no session has reported on counts as unused: it is most likely the one with
    room, and its first session reports what it really has (and sessions do not pile onto
    the one account whose numbers are known).
    """
    used = [u.utilization for u in usage if u.utilization is not None and fresh(u, now)]
    return max((u for u in used if math.isfinite(u)), default=0.0)


def weekly_reset(usage: Sequence[WindowUse], now: float) -> float | None:
    """The soonest reset among the fresh reports of weekly (`seven_day*`) windows, if any."""
    resets = [
        u.resets_at
        for u in usage
        if u.window.startswith(_WEEKLY_PREFIX) and u.resets_at is not None and fresh(u, now)
    ]
    return min(resets) if resets else None


# --- refusals ------------------------------------------------------------------------------
def lift_time(at: float, timezone: str = _UTC) -> str:
    """`2026-12-05 15:00 UTC`: an instant as waiting reasons show it, in `timezone`
    (its abbreviation, `CET`, for any other zone)."""
    return datetime.fromtimestamp(at, ZoneInfo(timezone)).strftime("%Y-%m-%d %H:%M %Z")


def _closed_text(until: float, limit: str, timezone: str) -> str:
    return f"closed until {lift_time(until, timezone)} ({limit})"


def _serves_refusal(
    credential: Credential, priority: str | None, kind: str, backends: Sequence[str] = ()
) -> Refusal | None:
    if backends and credential.backend not in backends:
        return Refusal(
            credential.name, f"runs {credential.backend}, not {' or '.join(backends)}", cause="serves"
        )
    serves = credential.serves
    if not at_least(priority, serves.priority):
        classes = [p for p in PRIORITIES if at_least(p, serves.priority)]
        return Refusal(credential.name, f"kept for {' and '.join(classes)} judgements", cause="serves")
    if serves.kinds is not None and kind not in serves.kinds:
        return Refusal(credential.name, f"not for kind {kind}", cause="serves")
    return None


def _closure_refusal(
    state: CredentialState, priority: str | None, now: float, timezone: str
) -> Refusal | None:
    # The share of a window kept for people may take urgent automation on a credential that says so.
    bypass = state.credential.reserve_urgent and priority == _URGENT
    closed = [c for c in state.closures if c.lifts_at > now and not (bypass and c.kind == RESERVED)]
    if not closed:
        return None
    last = max(closed, key=lambda c: c.lifts_at)
    return Refusal(
        state.credential.name,
        _closed_text(last.lifts_at, last.kind, timezone),
        until=last.lifts_at,
        cause="closed",
        limit=last.kind,
    )


def _cap_refusal(state: CredentialState, now: float, timezone: str) -> Refusal | None:
    credential = state.credential
    if not credential.metered:
        return None
    cap = credential.spend_cap
    why = cap_refusal(cap, state.spent_day, state.spent_month, state.estimate)
    if why is None:
        return None
    until = cap_lifts_at(cap, state.spent_day, state.spent_month, state.estimate, now=now, timezone=timezone)
    return Refusal(credential.name, why, until=until, cause="cap")


def _refusal(
    state: CredentialState,
    priority: str | None,
    kind: str,
    now: float,
    timezone: str,
    backends: Sequence[str] = (),
    unrunnable: Mapping[str, str] = _NONE,
) -> Refusal | None:
    """Why `state`'s credential may not take the judgement, the weightiest reason first."""
    credential = state.credential
    if (refused := _serves_refusal(credential, priority, kind, backends)) is not None:
        return refused
    if (cannot := unrunnable.get(credential.backend)) is not None:
        return Refusal(credential.name, cannot, cause="blocked")
    if state.blocked is not None:
        return Refusal(credential.name, f"blocked: {state.blocked}", cause="blocked")
    if (refused := _closure_refusal(state, priority, now, timezone)) is not None:
        return refused
    if (refused := _cap_refusal(state, now, timezone)) is not None:
        return refused
    if state.slots_used >= credential.concurrency:
        why = f"all {credential.concurrency} session slot(s) busy"
        return Refusal(credential.name, why, hard=False, cause="busy")
    return None


# --- the route -----------------------------------------------------------------------------
def _rank(
    state: CredentialState, index: int, now: float, margin: float
) -> tuple[int, int, int, float, float, int]:
    credential = state.credential
    paced = credential.pacing and any(ahead_of_pace(u, now, margin) for u in state.usage)
    reset = weekly_reset(state.usage, now)
    return (
        1 if credential.metered else 0,
        1 if paced else 0,
        credential.order,
        reset if reset is not None else math.inf,
        utilisation(state.usage, now),
        index,
    )


def route(
    states: Sequence[CredentialState],
    *,
    priority: str | None,
    kind: str,
    now: float,
    timezone: str = _UTC,
    margin: float = PACING_MARGIN,
    backends: Sequence[str] = (),
    unrunnable: Mapping[str, str] = _NONE,
) -> Route:
    """The credentials among `states` (the pool, in its order) a judgement may use now, best first.

    A credential is refused when its backend is not one of the kind's `backends` (none named:
    the backend of the pool's first credential only); when its `serves` does not allow the
    judgement's priority or kind; when it is blocked, or its backend cannot run where this is
    routed (`unrunnable`: backend name -> why, say its command is missing on this host); when
    a closure on it has not lifted at `now` (a `reserved` one does not hold an `urgent`
    judgement back on a credential with `reserve_urgent`); when it is metered and its cap has
    no room for its estimate (or it has no cap); when all its slots are busy.
    Subscription credentials are never refused for spend.
    """
    usable: list[tuple[tuple[int, int, int, float, float, int], Credential]] = []
    refusals: list[Refusal] = []
    allowed = tuple(backends) or ((states[0].credential.backend,) if states else ())
    for index, state in enumerate(states):
        refused = _refusal(state, priority, kind, now, timezone, allowed, unrunnable)
        if refused is None:
            usable.append((_rank(state, index, now, margin), state.credential))
        else:
            refusals.append(refused)
    usable.sort(key=lambda pair: pair[0])
    return Route(tuple(c for _, c in usable), tuple(refusals))


def _reason_of(refusal: Refusal, timezone: str) -> str:
    if refusal.cause == "closed" and refusal.until is not None and refusal.limit is not None:
        return f"{refusal.credential} {_closed_text(refusal.until, refusal.limit, timezone)}"
    return f"{refusal.credential}: {refusal.why}"


def waiting_reason(route: Route, *, single: bool, timezone: str = _UTC) -> str:
    """Why a judgement with no usable credential waits: every credential it may use, with why.

    It always begins `usage window`: the window releases the waiting judgements whose reason
    does, and `status` counts them as waiting for a window. With one credential in the pool
    (`single`) a closure reads as it always has, `usage window closed until 2026-12-05 15:00
    UTC (five_hour)`; with several, each credential is named: `usage window: team-max closed
    until 2026-12-05 15:00 UTC (five_hour); api-overflow: today's $20.00 cap reached`. The
    credentials its `serves` rules out are named only when there is no other.
    """
    named = route.eligible or route.refusals
    if not named:
        return "usage window: no credential in the pool"
    if single and len(named) == 1:
        only = named[0]
        if only.cause == "closed" and only.until is not None and only.limit is not None:
            return f"usage window {_closed_text(only.until, only.limit, timezone)}"
        return f"usage window: {only.why}"
    return "usage window: " + "; ".join(_reason_of(r, timezone) for r in named)
