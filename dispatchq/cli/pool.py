"""`dispatchq credentials`: the pool of credentials sessions may use, as configured and as it stands."""

from __future__ import annotations

from typing import Any

import click

from dispatchq.cli import print_json, runtime
from dispatchq.pools.credentials import Credential

__all__ = ["credentials", "credentials_document"]


def _config_row(credential: Credential) -> dict[str, Any]:
    """What the operator configured: where the secret is read from, never the secret itself."""
    cap = credential.spend_cap
    serves = credential.serves
    return {
        "name": credential.name,
        "backend": credential.backend,
        "billing": credential.billing,
        "variable": credential.variable,
        "file": credential.file,
        "concurrency": credential.concurrency,
        "order": credential.order,
        "serves": {
            "priority": serves.priority,
            "kinds": list(serves.kinds) if serves.kinds is not None else None,
        },
        "spend_cap": {"day": cap.day, "month": cap.month} if cap is not None else None,
        "pacing": credential.pacing,
        "reserve_urgent": credential.reserve_urgent,
    }


def credentials_document(rt: Any) -> dict[str, Any]:
    """The pool, one entry per credential in its order: configuration and live state together."""
    status = rt.window.status()
    live = {row.name: row for row in status.pool.credentials}
    rows = []
    for credential in rt.pool():
        row = _config_row(credential)
        now = live.get(credential.name)
        if now is not None:
            row.update(
                state=now.state,
                why=now.why,
                running=now.running,
                spend={"day": now.spend.day, "month": now.spend.month},
            )
        rows.append(row)
    return {"credentials": rows}


@click.command(name="credentials")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: one object per credential.")
def credentials(as_json: bool) -> None:
    """The credentials sessions may use: state, caps and spend, in the order routing prefers.

    One row per credential of the config file's `credentials:` section (with none, the
    environment's one, named `default`): its backend, billing (`subscription` or `metered`),
    the file its secret is read from (the path only: a secret is never printed), its
    concurrency, order and `serves` rule, its spend caps, its state now (open, closed,
    probing, blocked, spent or busy, and why) and what it spent today and this month.
    """
    document = credentials_document(runtime())
    if as_json:
        print_json(document)
        return
    for row in document["credentials"]:
        for line in _text(row):
            click.echo(line)


def _text(row: dict[str, Any]) -> list[str]:
    """One credential as two plain lines (a path is never wrapped, so it can be copied)."""
    serves = row["serves"]
    who = ", ".join(
        part
        for part in (
            f"{serves['priority']} and above" if serves["priority"] else "",
            f"kinds {', '.join(serves['kinds'])}" if serves["kinds"] is not None else "",
        )
        if part
    )
    cap = row["spend_cap"] or {}
    caps = " / ".join(f"${value:,.2f} a {period}" for period, value in cap.items() if value is not None)
    spend = row.get("spend") or {}
    source = row["file"] or f"${row['variable']} (the environment)"
    return [
        f"{row['name']} ({row['backend']}, {row['billing']}): {row.get('state', '?')}"
        + (f" ({row['why']})" if row.get("why") and row.get("why") != row.get("state") else ""),
        f"  file {source} as {row['variable']} · {row.get('running', 0)} running of {row['concurrency']}"
        f" · order {row['order']} · serves {who or 'every judgement'} · cap {caps or 'none'}"
        f" · spend ${spend.get('day', 0.0):,.2f} today, ${spend.get('month', 0.0):,.2f} this month",
    ]
