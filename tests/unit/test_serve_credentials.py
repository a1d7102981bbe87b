"""The login cookie's format, the `Secure` rule and the wrong-credential throttle, without a server.

The throttle's count lives in Redis (`storage.logins`, exercised in
tests/integration/test_serve_logins.py); here a stand-in store shows what the process adds:
the peer key, the memory of a throttled peer, and an outage that counts nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from dispatchq.serve.auth import (
    FailureThrottle,
    cookie_login,
    cookie_secure,
    cookie_value,
    write_cookie_login,
    write_cookie_value,
)
from dispatchq.settings import load_settings

TOKEN = b"unit-token-0123456789abcdefABCDEF"
LOGIN = "AbCdEfGh_ij-KLMNop0123"


def test_a_cookie_names_its_login_and_is_refused_when_tampered_expired_or_relabelled() -> None:
    value = cookie_value(TOKEN, LOGIN, 1000.0).encode()
    assert cookie_login(TOKEN, value, 1000.0) == LOGIN
    assert cookie_login(TOKEN, b'"' + value + b'"', 1000.0) == LOGIN  # quoted by a proxy
    assert cookie_login(TOKEN, value, 1000.0 + 12 * 3600) is None  # expired
    assert cookie_login(b"another-token-0123456789abcdefABCD", value, 1000.0) is None
    expires, login, mac = value.split(b".")
    assert cookie_login(TOKEN, b".".join([expires, b"X" + login[1:], mac]), 1000.0) is None
    assert cookie_login(TOKEN, b".".join([str(int(expires) + 60).encode(), login, mac]), 1000.0) is None
    assert cookie_login(TOKEN, expires + b"." + mac, 1000.0) is None  # no login id: the old format
    # A read cookie is no write cookie, and the other way round.
    assert write_cookie_login(TOKEN, value, 1000.0) is None
    write = write_cookie_value(TOKEN, LOGIN, 1000.0).encode()
    assert write_cookie_login(TOKEN, write, 1000.0) == LOGIN and cookie_login(TOKEN, write, 1000.0) is None


@pytest.mark.parametrize(
    ("env", "host", "secure"),
    [
        ({}, "127.0.0.1", False),
        ({}, "::1", False),
        ({}, "0.0.0.0", True),
        ({"DISPATCHQ_SERVE_ALLOWED_HOSTS": "dq.example.test"}, "127.0.0.1", True),
        ({"DISPATCHQ_SERVE_TRUSTED_PROXIES": "127.0.0.1"}, "127.0.0.1", True),
        ({"DISPATCHQ_SERVE_PUBLIC_URL": "https://dq.example.test"}, "127.0.0.1", True),
        ({"DISPATCHQ_SERVE_PUBLIC_URL": "http://dq.example.test"}, "0.0.0.0", False),
        ({"DISPATCHQ_SERVE_PUBLIC_URL": "http://127.0.0.1:8484"}, "127.0.0.1", False),
    ],
)
def test_secure_follows_the_public_url_or_whether_only_loopback_reaches_serve(
    env: dict[str, str], host: str, secure: bool
) -> None:
    assert cookie_secure(load_settings(env), host) is secure


class _Counts:
    """What `AsyncLogins.failed` does, in memory: a wait of `window` past `allowed` failures."""

    def __init__(self, *, down: bool = False) -> None:
        self.calls: list[str] = []
        self.counts: dict[str, int] = {}
        self.down = down

    async def failed(self, kind: str, peer: str, *, allowed: int, window: float) -> float:
        if self.down:
            raise redis.exceptions.ConnectionError("Connection refused")
        self.calls.append(peer)
        self.counts[peer] = self.counts.get(peer, 0) + 1
        return window if self.counts[peer] > allowed else 0


def _throttle(counts: _Counts, clock: list[float]) -> FailureThrottle:
    return FailureThrottle(counts, "bearer", attempts=3, window=60.0, clock=lambda: clock[0])  # type: ignore[arg-type]


def test_a_throttled_peer_is_remembered_until_its_wait_ends_so_a_flood_spares_redis() -> None:
    counts, clock = _Counts(), [100.0]
    throttle = _throttle(counts, clock)

    async def go() -> list[int]:
        waits = [await throttle.failed("192.0.2.1") for _ in range(50)]
        clock[0] += 30
        waits.append(await throttle.failed("192.0.2.1"))
        clock[0] += 31  # past the wait: asked again
        waits.append(await throttle.failed("192.0.2.1"))
        return waits

    waits = asyncio.run(go())
    assert waits[:3] == [0, 0, 0] and waits[3:50] == [60] * 47
    assert waits[50] == 30 and waits[51] == 60
    assert len(counts.calls) == 5  # three within the allowance, the first refused, one after the wait


def test_an_ipv6_peer_is_counted_by_its_64_and_an_ipv4_one_by_its_address() -> None:
    counts, clock = _Counts(), [0.0]
    throttle = _throttle(counts, clock)

    async def go() -> None:
        for n in range(4):
            await throttle.failed(f"2001:db8:1:2::{n + 1:x}")
        await throttle.failed("192.0.2.1")
        await throttle.failed("192.0.2.2")

    asyncio.run(go())
    assert counts.counts == {"2001:db8:1:2::/64": 4, "192.0.2.1": 1, "192.0.2.2": 1}


def test_a_redis_outage_counts_nothing_and_throttles_nobody(caplog: Any) -> None:
    counts = _Counts(down=True)
    throttle = _throttle(counts, [0.0])

    async def go() -> list[int]:
        return [await throttle.failed("192.0.2.1") for _ in range(10)]

    assert asyncio.run(go()) == [0] * 10
    assert caplog.text.count("not counted") == 1  # said once, not once a request
    counts.down = False
    asyncio.run(throttle.failed("192.0.2.1"))
    counts.down = True
    asyncio.run(throttle.failed("192.0.2.1"))
    assert caplog.text.count("not counted") == 2  # a new outage is said again
