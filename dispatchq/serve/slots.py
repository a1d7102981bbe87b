"""Slots that a stranger cannot hold: what one client may take of `dispatchq serve`.

Without a login anyone who reaches the port can open connections, and uvicorn's own
`limit_concurrency` counts every open connection against the requests it serves: a few
hundred sockets that send nothing would make every answer a 503, `/healthz` and GitHub's
deliveries included (and GitHub does not redeliver a 503 by itself). So uvicorn's limit is
off, and two layers take its place:

- the connection (`slotted_protocol`, around `body.bounded_protocol`): at most
  `DISPATCHQ_SERVE_PEER_CONNECTIONS` open per client address, a connection past it closed as
  soon as it is made; a connection with no request begun is closed after
  `DISPATCHQ_SERVE_IDLE_TIMEOUT` (after it opens, or after its last answer), and a slow one's
  headers after `DISPATCHQ_SERVE_HEADER_TIMEOUT`; at `DISPATCHQ_SERVE_MAX_CONNECTIONS` in all,
  the connection that has waited longest with no request in flight is closed for the
  newcomer, so a crowd of idle sockets from many addresses cannot shut the door either;
- the request (`Slots`, outermost ASGI): at most `DISPATCHQ_SERVE_CONCURRENCY` in flight, of
  which a share (`DISPATCHQ_SERVE_RESERVED_SHARE`) only `/healthz` and `/webhooks/github` may
  use, and at most `DISPATCHQ_SERVE_PEER_REQUESTS` from one client; past either, 503 with
  `Retry-After`.

A client is its address; behind a trusted proxy (`DISPATCHQ_SERVE_TRUSTED_PROXIES`) a request
is its forwarded address (`guard.peer_address`), and the proxy's own connections are not
capped per address (they carry everyone). An IPv6 client is its /64, the block one host is
usually given, so it cannot take a fresh address per connection.

Every refusal is counted in `body.REFUSALS` (`/metrics`: `dispatchq_serve_refused_total`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
from collections import Counter
from typing import Any

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from dispatchq.serve.body import REFUSALS
from dispatchq.serve.guard import Networks, peer_address
from dispatchq.serve.page import SECURITY_HEADERS

__all__ = ["RESERVED_PATHS", "Slots", "peer_key", "reserved_slots", "slotted_protocol"]

#: The routes the reserved share is kept for: the probe that says the server is up, and the
#: deliveries GitHub does not send again by itself.
RESERVED_PATHS = frozenset({"/healthz", "/webhooks/github"})

_SETTING = {
    "concurrency": "DISPATCHQ_SERVE_CONCURRENCY",
    "peer_requests": "DISPATCHQ_SERVE_PEER_REQUESTS",
}


def peer_key(address: str) -> str:
    """What a per-client cap counts: an IPv4 address, or an IPv6 address's /64.

    An IPv4 address written as IPv6 (`::ffff:1.2.3.4`) is its IPv4 address; anything that is
    not an address (a Unix socket's `-`) is itself.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _trusted(address: str, trusted: Networks) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in trusted)


def reserved_slots(concurrency: int, share: float) -> int:
    """How many of `concurrency` only the reserved routes may use (at least one, if any share)."""
    return min(concurrency - 1, math.ceil(concurrency * share)) if share > 0 else 0


def _refusal(reason: str, error: str) -> tuple[dict[str, Any], dict[str, Any]]:
    body = json.dumps({"error": error}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1"),
        (b"connection", b"close"),  # its body is never read
        *((name.lower().encode(), value.encode()) for name, value in SECURITY_HEADERS.items()),
    ]
    return (
        {"type": "http.response.start", "status": 503, "headers": headers},
        {"type": "http.response.body", "body": body},
    )


class Slots:
    """The requests in flight, in all and per client, with a share kept for the reserved routes."""

    def __init__(
        self, app: ASGIApp, *, concurrency: int, reserved_share: float, per_peer: int, trusted: Networks
    ) -> None:
        self.app = app
        self.concurrency = concurrency
        self.general = concurrency - reserved_slots(concurrency, reserved_share)
        self.per_peer = per_peer
        self.trusted = trusted
        self.in_flight = 0
        self.peers: Counter[str] = Counter()

    def _refused(self, scope: Scope, peer: str) -> str | None:
        limit = self.concurrency if scope["path"] in RESERVED_PATHS else self.general
        if self.in_flight >= limit:
            return "concurrency"
        if self.peers[peer] >= self.per_peer:
            return "peer_requests"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        peer = peer_key(peer_address(scope, self.trusted))
        reason = self._refused(scope, peer)
        if reason is not None:
            REFUSALS[reason] += 1
            what = "requests in flight" if reason == "concurrency" else "requests in flight from one client"
            for message in _refusal(reason, f"too many {what} ({_SETTING[reason]}); try again shortly"):
                await send(message)
            return
        self.in_flight += 1
        self.peers[peer] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            self.peers[peer] -= 1
            if self.peers[peer] <= 0:
                del self.peers[peer]


class _Connections:
    """One server's open connections: per client, in all, and since when each has waited."""

    def __init__(self, *, per_peer: int, most: int, trusted: Networks) -> None:
        self.per_peer = per_peer
        self.most = most
        self.trusted = trusted
        self.peers: Counter[str] = Counter()
        self.waiting_since: dict[H11Protocol, float] = {}  # every open connection counted here

    def admit(self, conn: H11Protocol, now: float) -> str | None:
        """Count `conn` in and return its client's key, or raise `_Refused` (it is not counted)."""
        address = conn.client[0] if conn.client else None
        key = None
        if address is not None and not _trusted(address, self.trusted):
            key = peer_key(address)
            if self.peers[key] >= self.per_peer:
                raise _Refused("peer_connections")
        if len(self.waiting_since) >= self.most and not self._evict_one():
            raise _Refused("connections")
        if key is not None:
            self.peers[key] += 1
        self.waiting_since[conn] = now
        return key

    def release(self, conn: H11Protocol, key: str | None) -> None:
        self.waiting_since.pop(conn, None)
        if key is not None:
            self.peers[key] -= 1
            if self.peers[key] <= 0:
                del self.peers[key]

    def waits(self, conn: H11Protocol, now: float) -> None:
        """`conn` answered its request and waits for the next one from `now`."""
        if conn in self.waiting_since:
            self.waiting_since[conn] = now

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest with no request in flight, if any."""
        idle = [c for c in self.waiting_since if c.cycle is None or c.cycle.response_complete]
        if not idle:
            return False
        oldest = min(idle, key=self.waiting_since.__getitem__)
        REFUSALS["connections"] += 1
        del self.waiting_since[oldest]  # counted out now: its connection_lost comes later
        oldest.transport.close()
        return True


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def slotted_protocol(
    base: type[H11Protocol],
    *,
    idle_timeout: float,
    peer_connections: int,
    max_connections: int,
    trusted: Networks,
) -> type[H11Protocol]:
    """`base` (uvicorn's h11 protocol, with its header deadline) with the connection caps.

    The counts live in this closure: one server's connections, on its one event loop. The
    idle wait after an answer is uvicorn's keep-alive timer, set here to `idle_timeout`;
    the idle wait of a new connection is this protocol's own timer.
    """
    connections = _Connections(per_peer=peer_connections, most=max_connections, trusted=trusted)

    class Slotted(base):  # type: ignore[misc,valid-type]
        _peer: str | None = None
        _counted = False
        _idle_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.timeout_keep_alive = idle_timeout  # uvicorn types it int; call_later takes a float
            try:
                self._peer = connections.admit(self, self.loop.time())
            except _Refused as refused:
                REFUSALS[refused.reason] += 1
                transport.close()
                return
            self._counted = True
            self._idle_timer = self.loop.call_later(idle_timeout, self._idle_late)

        def data_received(self, data: bytes) -> None:
            self._stop_idle()
            super().data_received(data)

        def on_response_complete(self) -> None:
            connections.waits(self, self.loop.time())
            super().on_response_complete()

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing():
                REFUSALS["idle_timeout"] += 1
            super().timeout_keep_alive_handler()

        def _idle_late(self) -> None:
            self._idle_timer = None
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                REFUSALS["idle_timeout"] += 1
                self.transport.close()

        def _stop_idle(self) -> None:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_idle()
            if self._counted:
                connections.release(self, self._peer)
                self._counted = False
            super().connection_lost(exc)

    return Slotted
