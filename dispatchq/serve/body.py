"""What one request may cost `dispatchq serve`: its headers' time, its body's time and size.

Three bounds, each answered with a status that names it, never by holding a connection:

- headers: `bounded_protocol` is uvicorn's h11 protocol with a deadline (uvicorn has none)
  from the connection, or from the end of the previous answer, to the end of the headers;
  past it, 408 and the connection is closed;
- the body's time and size: `Bounds` wraps the whole application (`dispatchq serve` runs
  it outermost) and times the ASGI receive loop: the whole body must arrive within
  `DISPATCHQ_SERVE_BODY_TIMEOUT` (408) and within `DISPATCHQ_SERVE_MAX_BODY` bytes (413,
  by its Content-Length before a byte is read, or counted while it streams). A client
  that goes away mid-body is noted in one line, never a traceback;
- each route reads its body with `read_limited` too, so an application run without
  `Bounds` (in-process tests) keeps the size bound.

Refusals are counted here (`REFUSALS`, this process since it started) and shown by
`/metrics` as `dispatchq_serve_refused_total{reason}`, with the slots' refusals
(`dispatchq.serve.slots`: connections and requests per client and in all) among them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

import h11
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from dispatchq.serve.wire import header_lines

__all__ = [
    "HARD_MAX_BODY",
    "MAX_BODY",
    "REASONS",
    "REFUSALS",
    "BodyTooLarge",
    "Bounds",
    "bounded_protocol",
    "note_gone",
    "read_limited",
    "read_limited_asgi",
    "size_text",
]

log = logging.getLogger("dispatchq.serve")

#: GitHub caps webhook payloads at 25 MB: no setting may raise the cap past it.
HARD_MAX_BODY = 25 * 1024 * 1024
#: The default cap (`DISPATCHQ_SERVE_MAX_BODY`): GitHub's payloads are almost always < 1 MB.
MAX_BODY = 5 * 1024 * 1024

#: Requests refused by a bound, per reason (`REASONS`), in this process since it started.
REFUSALS: Counter[str] = Counter()
REASONS = (
    "concurrency",
    "header_timeout",
    "body_timeout",
    "body_too_large",
    "idle_timeout",
    "connections",
    "peer_connections",
    "peer_requests",
)


def size_text(size: int) -> str:
    """A byte count as people read it: `5 MB`, `256 KB`, `900 bytes`."""
    for unit, scale in (("MB", 1024 * 1024), ("KB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"


class BodyTooLarge(Exception):
    """The body is over the limit (said by its Content-Length, or found while reading it)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over {size_text(limit)} (DISPATCHQ_SERVE_MAX_BODY)")
        self.limit = limit


async def read_limited(request: Request, limit: int = MAX_BODY) -> bytes:
    """The whole body, or BodyTooLarge as soon as it is known to exceed `limit`.

    A declared Content-Length over the limit is refused before one byte is read; a body
    that lies about its length (or is chunked) is counted as it streams in, and reading
    stops at the first chunk past the limit.
    """
    return await read_limited_asgi(request.headers, request.receive, limit)


def _declared_over(headers: Mapping[str, str], limit: int) -> bool:
    declared = headers.get("content-length")
    if declared is None:
        return False
    try:
        return int(declared) > limit
    except ValueError:
        return False  # the server refuses a malformed length itself


async def read_limited_asgi(headers: Mapping[str, str], receive: Receive, limit: int = MAX_BODY) -> bytes:
    """`read_limited` for a plain ASGI app: `headers` lower-cased, `receive` the ASGI callable."""
    if _declared_over(headers, limit):
        REFUSALS["body_too_large"] += 1  # `Bounds` never sees this one: no byte is read
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect  # as `Request.stream` raises it
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:  # only without `Bounds` (or a smaller limit): it refuses such a chunk first
            REFUSALS["body_too_large"] += 1
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _answer(status: int, error: str) -> tuple[Message, Message]:
    body = json.dumps({"error": error}).encode()
    start: Message = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),  # the rest of the body is never read: the connection ends
        ],
    }
    return start, {"type": "http.response.body", "body": body}


class _Exchange:
    """One request's receive and send, bounded: the body's deadline and size, the answer once."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, *, timeout: float, limit: int) -> None:
        self._receive = receive
        self._send = send
        self._timeout = timeout
        self._limit = limit
        self._deadline: float | None = None
        self._size = 0
        self._body_done = scope.get("method") in ("GET", "HEAD")
        self.declared_over = _declared_over(
            {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k == b"content-length"},
            limit,
        )
        self.refused: str | None = None  # why this exchange was cut short, if it was
        self.started = False

    async def receive(self) -> Message:
        if self.refused is not None:
            return {"type": "http.disconnect"}
        if self._body_done:
            return await self._receive()  # after the body: only a disconnect is awaited, untimed
        if self.declared_over:
            return await self._refuse(
                "body_too_large", 413, f"the request body is over {size_text(self._limit)}"
            )
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + self._timeout
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            return await self._refuse(
                "body_timeout", 408, f"the request body did not arrive within {self._timeout:g} s"
            )
        if message["type"] == "http.request":
            self._size += len(message.get("body", b""))
            if self._size > self._limit:
                return await self._refuse(
                    "body_too_large", 413, f"the request body is over {size_text(self._limit)}"
                )
            self._body_done = not message.get("more_body", False)
        return message

    async def _refuse(self, reason: str, status: int, error: str) -> Message:
        """Answer for the application (unless it already began to) and tell it the client left."""
        self.refused = reason
        REFUSALS[reason] += 1
        if not self.started:
            self.started = True
            for message in _answer(status, f"{error} (DISPATCHQ_SERVE_{_SETTING[reason]})"):
                await self._send(message)
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.refused is not None:
            return  # the refusal was the answer; what the application says after it is dropped
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


_SETTING = {"body_timeout": "BODY_TIMEOUT", "body_too_large": "MAX_BODY"}


class Bounds:
    """The body's deadline and size cap around the whole application (see the module's text)."""

    def __init__(self, app: ASGIApp, *, body_timeout: float, max_body: int) -> None:
        self.app = app
        self._timeout = body_timeout
        self._limit = min(max_body, HARD_MAX_BODY)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = _Exchange(scope, receive, send, timeout=self._timeout, limit=self._limit)
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except ClientDisconnect:
            if exchange.refused is None:
                note_gone(scope)


def note_gone(scope: Scope) -> None:
    """One line for a client that went away mid-body: an everyday event, not an error."""
    log.info("%s %s: the client went away before its body was in", scope.get("method"), scope.get("path"))


def bounded_protocol(header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a header deadline; its concurrency refusals counted.

    uvicorn times only an idle keep-alive connection, so a client that sends one header
    byte at a time holds its connection for ever. Here the headers of each request must be
    complete within `header_timeout` of the connection, or of the first byte of a keep-alive
    connection's next request (an idle keep-alive connection is uvicorn's own timeout).
    """

    class BoundedH11(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            waiting = self.conn.their_state is h11.IDLE
            limit = self.limit_concurrency
            over = limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit)
            if waiting and self._header_timer is None:
                self._arm()  # the first bytes of a keep-alive connection's next request
            super().data_received(data)
            if waiting and self.conn.their_state is not h11.IDLE:  # this data completed the headers
                self._disarm()
                if over:
                    REFUSALS["concurrency"] += 1

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            REFUSALS["header_timeout"] += 1
            body = json.dumps(
                {
                    "error": f"the request headers did not arrive within {header_timeout:g} s "
                    "(DISPATCHQ_SERVE_HEADER_TIMEOUT)"
                }
            ).encode()
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n%s\r\n%s" % (len(body), header_lines(), body)
            )
            self.transport.close()

    return BoundedH11
