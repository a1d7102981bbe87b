"""The oldest-waiting index's truth: what it must hold, read from the records themselves."""

from __future__ import annotations

from dispatchq.core.tiers import TIERS
from dispatchq.storage import keys, unstarted
from dispatchq.storage.store import Store

__all__ = ["assert_index_exact", "unstarted_truth"]


def unstarted_truth(store: Store) -> dict[str, dict[str, float]]:
    """Every queued or waiting record, per tier: id -> enqueue time, read from the records."""
    out: dict[str, dict[str, float]] = {tier: {} for tier in TIERS}
    for status in ("queued", "waiting"):
        for jid in store.ids(status):
            tier, created = (v.decode() for v in store.redis.hmget(keys.record(jid), "tier", "created"))
            out.setdefault(tier, {})[jid] = float(created)
    return out


def assert_index_exact(store: Store) -> None:
    """Each tier's index holds exactly its queued and waiting records, at their enqueue times."""
    want = unstarted_truth(store)
    for tier in TIERS:
        assert unstarted.indexed(store.redis, tier) == want[tier], tier
