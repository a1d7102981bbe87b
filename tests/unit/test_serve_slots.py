"""Who a per-client cap counts (`dispatchq.serve.slots.peer_key`) and how many slots the reserved
routes keep (`reserved_slots`): an IPv6 client cannot take a fresh address per connection."""

from __future__ import annotations

import pytest

from dispatchq.serve.slots import peer_key, reserved_slots


def test_an_ipv6_client_is_its_64_and_an_ipv4_client_its_address() -> None:
    one = peer_key("2001:db8:1:2:aaaa::1")
    assert one == peer_key("2001:db8:1:2:ffff:ffff:ffff:ffff") == "2001:db8:1:2::/64"
    assert peer_key("2001:db8:1:3::1") != one  # the next /64 is another client
    assert peer_key("203.0.113.7") == "203.0.113.7" != peer_key("203.0.113.8")
    assert peer_key("::ffff:203.0.113.7") == "203.0.113.7"  # IPv4 written as IPv6 is one client
    assert peer_key("-") == "-"  # no address (a Unix socket): one key, never an error


@pytest.mark.parametrize(
    ("concurrency", "share", "kept"),
    [(256, 0.125, 32), (8, 0.125, 1), (10, 0.5, 5), (8, 0.0, 0), (9, 0.01, 1)],
)
def test_the_reserved_share_is_rounded_up_and_never_takes_every_slot(
    concurrency: int, share: float, kept: int
) -> None:
    assert reserved_slots(concurrency, share) == kept
    assert reserved_slots(concurrency, share) < concurrency
