"""What goes on the wire, whoever wrote it: the security headers on every answer, and the
status the access log names.

`guard.SecurityHeaders` covers what the routes and the middleware inside it answer. Four
writers sit outside it, and each answered without the headers:

- Starlette's own 500 page (`ServerErrorMiddleware` wraps every user middleware): the
  application `app.create_app` builds wraps its whole stack in `OnTheWire`;
- the bounds' 413 and 408 (`body.Bounds`, which `dispatchq serve` runs around the
  application): `dispatchq serve` runs `OnTheWire` around `Bounds`;
- uvicorn's 503 past `DISPATCHQ_SERVE_CONCURRENCY` and h11's 400 for a request it cannot
  read, both written by the protocol with no ASGI middleware in between: `secured_protocol`
  adds the headers there;
- the header deadline's 408 (`body.bounded_protocol`), written raw: it adds `header_lines()`.

`OnTheWire` also records the status of the answer in the request's scope state
(`WIRE_STATUS`), so the access log (`guard.AccessLog`, inside) names what the client got:
a body refused 413 by `Bounds` while the route was reading it is logged 413, not as the
exception the route then saw.
"""

from __future__ import annotations

from collections.abc import Iterable

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from dispatchq.serve.page import SECURITY_HEADERS

__all__ = ["SECURITY", "WIRE_STATUS", "OnTheWire", "header_lines", "secured_protocol", "with_security"]

#: The page's security headers as ASGI gives headers: lower-cased names, bytes.
SECURITY: tuple[tuple[bytes, bytes], ...] = tuple(
    (name.lower().encode(), value.encode()) for name, value in SECURITY_HEADERS.items()
)
#: The key in the scope's `state` under which `OnTheWire` keeps the status that went out.
WIRE_STATUS = "dispatchq.wire_status"


def with_security(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` and each security header they do not set themselves (a route's own CSP stays)."""
    given = list(headers)
    present = {name.lower() for name, _ in given}
    return given + [item for item in SECURITY if item[0] not in present]


def header_lines() -> bytes:
    """The security headers as raw HTTP/1.1 header lines, for an answer written by hand."""
    return b"".join(b"%s: %s\r\n" % item for item in SECURITY)


class OnTheWire:
    """The security headers on every answer that passes, and its status noted for the access log.

    The first answer to start is the one on the wire (`Bounds` drops what the application
    says after its own refusal), so the status is noted once and never overwritten.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = with_security(message.get("headers", ()))
                state.setdefault(WIRE_STATUS, message["status"])
            await send(message)

        await self.app(scope, receive, sending)


def secured_protocol(base: type[H11Protocol]) -> type[H11Protocol]:
    """`base` (uvicorn's h11 protocol, or one built on it) with the security headers on the
    answers the protocol writes itself: the 503 past the concurrency limit, h11's 400."""

    class Secured(base):  # type: ignore[valid-type,misc]
        def handle_events(self) -> None:
            limit = self.limit_concurrency
            if limit is None or (len(self.connections) < limit and len(self.tasks) < limit):
                super().handle_events()
                return
            # Past the limit uvicorn answers a request with its own 503 app, whose only headers
            # besides its own are the server's defaults, read when the request is met: they
            # carry the security headers for the length of this call (one thread, one loop).
            state = self.server_state
            defaults = state.default_headers
            state.default_headers = with_security(defaults)
            try:
                super().handle_events()
            finally:
                state.default_headers = defaults

        def send_400_response(self, msg: str) -> None:
            plain = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
            headers = with_security(plain)
            for event in (
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                h11.Data(data=msg.encode("ascii", "replace")),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    Secured.__name__ = Secured.__qualname__ = f"Secured{base.__name__}"
    return Secured
