"""What the window knows of each credential, shaped for the pure routing (`dispatchq.pools.routing`).

The window's markers, the usage sessions reported and the pool's stored slots and spend are
read once per admission; this module turns them into one `CredentialState` per credential
for a judgement's model, and names a slot after its credential so that whoever holds only
the slot (a job's arguments, a lapsed lease) can give it back to the right credential.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dispatchq.pools.credentials import DEFAULT_CREDENTIAL, Credential, Pool, credential_of, unqualified
from dispatchq.pools.routing import Closure, CredentialState, WindowUse
from dispatchq.pools.spend import estimate_for
from dispatchq.window.marker import Marker, applies

__all__ = ["credential_markers", "slot_credential", "slot_name", "states_for", "usage_of"]

#: Separates a slot's holder from its credential (`host.123.session:ab12cd34#team-max`).
_SLOT_MARK = "#"


def slot_name(holder: str, token: str, credential: str) -> str:
    """A slot's name: the `default` credential's keeps the form a store written before pools used."""
    base = f"{holder}:{token}"
    return base if credential == DEFAULT_CREDENTIAL else f"{base}{_SLOT_MARK}{credential}"


def slot_credential(slot: str) -> str:
    """Whose slot this is."""
    _, mark, name = slot.rpartition(_SLOT_MARK)
    return name if mark and name else DEFAULT_CREDENTIAL


def credential_markers(markers: Iterable[Marker], credential: str, model: str | None) -> list[Marker]:
    """The markers of `credential` that pause a session on `model` (closed or being probed)."""
    return [m for m in markers if credential_of(m.scope) == credential and applies(m.scope, model)]


def usage_of(stored: Mapping[str, Mapping[str, Any]], credential: str) -> tuple[WindowUse, ...]:
    """What sessions last reported of each of `credential`'s windows (fields `<cred>/<window>`)."""
    out = []
    for field, value in stored.items():
        if credential_of(field) != credential:
            continue
        out.append(
            WindowUse(
                window=unqualified(field),
                utilization=_number(value.get("utilization")),
                resets_at=_number(value.get("resets_at")),
                reported_at=_number(value.get("reported_at")),
            )
        )
    return tuple(out)


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value)) if value is not None else None
    except ValueError:
        return None


def states_for(
    pool: Pool,
    markers: Sequence[Marker],
    model: str | None,
    *,
    stored: Mapping[str, Any],
    usage: Mapping[str, Mapping[str, Any]],
    kind_estimate: float | None,
    now: float,
) -> list[CredentialState]:
    """One state per credential of the pool, for a judgement whose session runs `model`.

    `stored` maps a credential to its `StoredPoolState` (slots, spend, recent costs, block);
    a credential it does not name (the single `default`, whose slots the admission script
    checks itself) reads as idle.
    """
    out = []
    for credential in pool:
        held = stored.get(credential.name)
        closures = tuple(
            Closure(kind=m.kind, lifts_at=m.lifts_at)
            for m in credential_markers(markers, credential.name, model)
            if m.closed(now)
        )
        out.append(
            CredentialState(
                credential=credential,
                closures=closures,
                slots_used=held.slots_used if held is not None else 0,
                spent_day=held.spent_day if held is not None else 0.0,
                spent_month=held.spent_month if held is not None else 0.0,
                estimate=_estimate(credential, kind_estimate, held.recent if held is not None else ()),
                blocked=held.blocked if held is not None else None,
                usage=usage_of(usage, credential.name),
            )
        )
    return out


def _estimate(credential: Credential, kind_estimate: float | None, recent: Sequence[float]) -> float:
    """What admission reserves: a metered session's expected cost; a subscription's nothing."""
    return estimate_for(kind_estimate, recent) if credential.metered else 0.0
