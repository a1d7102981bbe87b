"""The pool's spend scripts on a real Redis: a reservation becomes the reported cost, stays the
estimate when nothing was reported, and is given back when nothing ran."""

from __future__ import annotations

from typing import Any

import pytest

from dispatchq.storage.pools import PoolStore

PERIODS = ("2026-12-05", "2026-12")


def _admitted(store: PoolStore, slot: str, estimate: float = 0.5) -> None:
    verdict = store.admit(
        "api",
        slot,
        lease=30.0,
        limit=4,
        markers=[],
        estimate=estimate,
        caps=(1.0, None),
        periods=PERIODS,
    )
    assert verdict == "ok"


@pytest.mark.parametrize(
    ("cost", "ran", "charged"),
    [
        (0.2, True, 0.2),  # what the session reported
        (None, True, 0.5),  # it ran and said nothing: its estimate
        (None, False, 0.0),  # nothing was spawned: all of it back
        (0.2, False, 0.0),
    ],
)
def test_a_settled_reservation_charges_what_ran(
    redis_client: Any, cost: float | None, ran: bool, charged: float
) -> None:
    store = PoolStore(redis_client)
    _admitted(store, "host:slot-1")
    assert store.settle("host:slot-1", cost, ran=ran)
    assert not store.settle("host:slot-1", 9.0)  # only the first settle moves the spend
    assert store.spent("api", PERIODS) == (pytest.approx(charged), pytest.approx(charged))


def test_a_reservation_given_back_makes_room_under_the_cap(redis_client: Any) -> None:
    store = PoolStore(redis_client)
    _admitted(store, "host:slot-1")
    _admitted(store, "host:slot-2")
    refused = store.admit(
        "api", "host:slot-3", lease=30.0, limit=4, markers=[], estimate=0.5, caps=(1.0, None), periods=PERIODS
    )
    assert refused == "day"
    store.settle("host:slot-2", None, ran=False)
    _admitted(store, "host:slot-3")
