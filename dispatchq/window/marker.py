"""The usage-window marker: a circuit breaker whose reopening time the service tells us.

One Redis hash per limit scope (`general`, or `model:<name>` for a model's own weekly
limit) records when the limit lifts (UTC), the message that said so, its kind and the
session that saw it. While a marker is *closed*, no session in its scope is spawned.

At the lift instant the marker is not simply deleted: the stated time can be wrong
(messages are rounded, some are stale), so the window goes to *probing*, exactly one
session (elected through Redis, across machines) runs first, and only when it shows
the window open is the marker removed and the rest released. If the probe is refused
again the marker goes back up with the new time: one wasted spawn, never N.

This module is the marker as a value and the rules over it (which scope pauses which
model, what a held-back judgement is told); reading and writing it is
`dispatchq.storage.window.WindowStore`'s, and acting on it is `dispatchq.window.face.Window`'s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from dispatchq.core.status import AuditEntry, MarkerView
from dispatchq.pools.credentials import credential_of, qualify, unqualified
from dispatchq.window.limits import GENERAL_SCOPE
from dispatchq.window.messages import LimitKind, limit_kind


class MarkerStore(Protocol):
    """What the marker rules read and write through (`dispatchq.storage.window.WindowStore`).

    A protocol, so this pure module names no storage class, not even in an annotation."""

    def marker_fields(self, scope: str) -> Mapping[str, Any]: ...

    def marker_keys(self) -> Iterable[str]: ...

    def forget_marker_key(self, marker_key: str) -> None: ...

    def scope_of(self, marker_key: str) -> str: ...

    def append_audit(self, entry: Mapping[str, Any], keep: int) -> None: ...


__all__ = [
    "AUDIT_LENGTH",
    "Marker",
    "MarkerStore",
    "all_markers",
    "applies",
    "audit",
    "blocking",
    "get",
    "marker_from_fields",
    "probing",
    "qualified_scope",
    "scope_pausing",
    "waiting_reason",
]

AUDIT_LENGTH = 200


@dataclass(frozen=True)
class Marker:
    scope: str
    lifts_at: float
    state: str  # "closed" until the lift instant; "probing" after it, until a probe shows it open
    kind: LimitKind
    message: str
    session: str | None
    set_at: float
    stated: str
    refusals: int
    source: str
    retrigger: str | None = None
    utilization: float | None = None  # the share of the window last reported used (a reserve marker)
    stated_at: float | None = None  # the instant `stated` names (the same reset, stated another way)

    @property
    def credential(self) -> str:
        """Whose window this marker closes (`default` for an unqualified scope)."""
        return credential_of(self.scope)

    def closed(self, now: float | None = None) -> bool:
        """True while no session in this scope may start."""
        return self.state == "closed" and (now if now is not None else time.time()) < self.lifts_at

    def public(self, timezone: str) -> MarkerView:
        """The marker as `status` shows it (`lifts_at_local` in `timezone`)."""
        lifts = datetime.fromtimestamp(self.lifts_at, UTC)
        return MarkerView(
            scope=self.scope,
            up=self.closed(),
            state="closed" if self.closed() else "probing",
            lifts_at=lifts.isoformat(),
            lifts_at_local=lifts.astimezone(ZoneInfo(timezone)).strftime("%Y-%m-%d %H:%M %Z"),
            lifts_at_epoch=self.lifts_at,
            countdown_seconds=max(0, math.ceil(self.lifts_at - time.time())),
            kind=self.kind,
            message=self.message,
            session=self.session,
            set_at=datetime.fromtimestamp(self.set_at, UTC).isoformat(),
            source=self.source,
            refusals=self.refusals,
            utilization=self.utilization,
        )


def marker_from_fields(scope: str, f: Mapping[str, str]) -> Marker | None:
    """The marker a scope's stored hash describes, or None when it has no lift time."""
    if "lifts_at" not in f:
        return None
    return Marker(
        scope=scope,
        lifts_at=float(f["lifts_at"] or 0),
        state=f.get("state") or "closed",
        kind=limit_kind(f.get("kind") or "unknown"),  # one an older version stored may be unknown
        message=f.get("message") or "",
        session=f.get("session") or None,
        set_at=float(f.get("set_at") or 0),
        stated=f.get("stated") or "unknown",
        refusals=int(f.get("refusals") or 0),
        source=f.get("source") or "session",
        retrigger=f.get("retrigger") or None,
        utilization=float(f["utilization"]) if f.get("utilization") else None,
        stated_at=float(f["stated_at"]) if f.get("stated_at") else None,
    )


def get(store: MarkerStore, scope: str) -> Marker | None:
    return marker_from_fields(scope, store.marker_fields(scope))


def all_markers(store: MarkerStore) -> list[Marker]:
    """Every marker that exists now; a scope whose hash is gone is forgotten on the way."""
    out = []
    for key in store.marker_keys():
        marker = get(store, store.scope_of(key))
        if marker is None:
            store.forget_marker_key(key)
        else:
            out.append(marker)
    return out


def applies(scope: str, model: str | None) -> bool:
    """Does a marker in `scope` pause a session running `model` (None = the account default)?

    The general limit pauses everything. A model's own limit (the Opus weekly limit)
    pauses every kind except one whose session explicitly names another model; a kind on
    the default model is paused by every model scope, since the default may be that model.
    """
    scope = unqualified(scope)  # a credential's `team-max/model:opus` pauses as `model:opus` does
    if scope == GENERAL_SCOPE or not scope.startswith("model:"):
        return True
    if model is None:
        return True
    limited = scope.removeprefix("model:").lower()
    return limited in model.lower()


def scope_pausing(scope: str, model: str | None) -> str:
    """The scope a limit reported by a session on `model` must close so that it pauses that session.

    A limit names its own scope (`model:fable` from `You've hit your Fable 5 limit`), and a
    kind names its model its own way (`claude-opus-4`): when the two do not meet, a marker in
    the named scope would never stop the kind that hit it (a spawn loop). Then the limit
    closes the kind's own model scope instead.
    """
    if applies(scope, model) or model is None:
        return scope
    return f"model:{model.lower()}"


def qualified_scope(credential: str, scope: str) -> str:
    """`scope` as one credential's marker scope (`default`'s keeps its bare name)."""
    return qualify(credential, scope)


def blocking(markers: Iterable[Marker], model: str | None, now: float | None = None) -> list[Marker]:
    """The markers that currently forbid a spawn for `model`."""
    return [m for m in markers if applies(m.scope, model) and m.closed(now)]


def probing(markers: Iterable[Marker], model: str | None, now: float | None = None) -> list[Marker]:
    """Lifted markers still waiting for a probe to show the window open."""
    return [m for m in markers if applies(m.scope, model) and not m.closed(now)]


def waiting_reason(marker: Marker) -> str:
    """The one wording every held-back judgement shows (status, `run`'s summary)."""
    when = datetime.fromtimestamp(marker.lifts_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"usage window closed until {when} ({marker.kind})"


def audit(store: MarkerStore, scope: str, action: str, marker: Marker, *, who: str, reason: str) -> None:
    """One line in the capped audit log: who closed or opened which scope, and why."""
    entry = AuditEntry(
        at=datetime.now(UTC).isoformat(),
        scope=scope,
        action=action,
        lifts_at=datetime.fromtimestamp(marker.lifts_at, UTC).isoformat(),
        who=who,
        reason=reason[:300],
    )
    store.append_audit(entry.model_dump(), AUDIT_LENGTH)
