"""The index by last update's truth (`storage.stale`): what it must hold, read from the records."""

from __future__ import annotations

from dispatchq.storage import keys, stale
from dispatchq.storage.store import Store

__all__ = ["assert_stale_index_exact", "stale_truth"]


def stale_truth(store: Store) -> dict[str, float]:
    """Every record queued at a tier not admitted through a line: id -> its last update."""
    out: dict[str, float] = {}
    for jid in store.ids("queued"):
        tier, updated = (v.decode() for v in store.redis.hmget(keys.record(jid), "tier", "updated"))
        if tier not in stale.line_tiers():
            out[jid] = float(updated)
    return out


def assert_stale_index_exact(store: Store) -> None:
    """The index holds exactly the queued batch records, each at its `updated`."""
    assert stale.indexed(store.redis) == stale_truth(store)
