"""Helpers for the slot tests of `dispatchq serve`: clients from chosen loopback addresses.

Linux routes all of 127.0.0.0/8 to loopback, so binding a client to 127.0.0.2 makes a
second client address without any network set-up.
"""

from __future__ import annotations

import http.client
import re
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from tests.support.serve import Reply

__all__ = ["closed_by_server", "connect_from", "in_flight", "refused_from", "request_from"]


def connect_from(source: str, port: int, *, timeout: float = 30) -> socket.socket:
    """A TCP connection to the server on 127.0.0.1 from the loopback address `source`."""
    return socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))


def request_from(
    source: str,
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    *,
    timeout: float = 30,
) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(source, 0))
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        response = conn.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        conn.close()


def closed_by_server(sock: socket.socket) -> tuple[bytes, bool]:
    """Read until the server closes `sock` or its timeout passes: (what came, whether it closed)."""
    data = b""
    try:
        while True:
            got = sock.recv(65536)
            if not got:
                return data, True
            data += got
    except TimeoutError:
        return data, False
    except ConnectionResetError:
        return data, True


def refused_from(source: str, port: int, reason: str) -> float:
    """`dispatchq_serve_refused_total{reason}` as `/metrics` shows it to `source`."""
    text = request_from(source, port, "GET", "/metrics").body.decode()
    found = re.search(rf'^dispatchq_serve_refused_total{{reason="{reason}"}} (\S+)$', text, re.MULTILINE)
    assert found, text[-2000:]
    return float(found.group(1))


@contextmanager
def in_flight(source: str, port: int, count: int, forwarded: str = "") -> Iterator[list[socket.socket]]:
    """`count` POST /judgements from `source` whose bodies never finish: requests in flight."""
    head = (
        b"POST /judgements HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + (f"X-Forwarded-For: {forwarded}\r\n".encode() if forwarded else b"")
        + b"Content-Length: 1000\r\n\r\n["
    )
    held = [connect_from(source, port) for _ in range(count)]
    try:
        for sock in held:
            sock.sendall(head)
        yield held
    finally:
        for sock in held:
            sock.close()
