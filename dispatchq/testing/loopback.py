"""What every loopback stand-in for a vendor's API shares: the server on a free port, the
record of a request, and a handler that reads a JSON body quietly.

The stand-ins (`anthropic`, `openai`) differ in what they answer; how they listen, what they
keep of a request and how they read its body is the same, and is here once.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["LoopbackServer", "QuietHandler", "SeenRequest"]


@dataclass(frozen=True)
class SeenRequest:
    """One request a stand-in received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float = 0.0  # time.time() when it arrived

    @property
    def bearer(self) -> str | None:
        """The `Authorization: Bearer` token it was sent with, else None."""
        value = self.headers.get("authorization", "")
        return value[len("bearer ") :].strip() if value.lower().startswith("bearer ") else None


class QuietHandler(BaseHTTPRequestHandler):
    """A handler that logs nothing and reads a body as JSON (its text when it is not JSON)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def decoded(self, raw: bytes) -> bytes:
        """The body as sent before any `content-encoding` this stand-in understands."""
        return raw

    def _body(self) -> Any:
        length = int(self.headers.get("content-length") or 0)
        raw = self.decoded(self.rfile.read(length) if length else b"")
        with contextlib.suppress(ValueError):
            return json.loads(raw) if raw else None
        return raw.decode("utf-8", "replace")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A CLI that hangs up mid-request (it exits once it has its answer) is no error here."""


class LoopbackServer:
    """A context manager serving `handler_class` (a subclass of it with `api` set to this
    object) on a free loopback port, from a daemon thread."""

    def __init__(self, handler_class: type[BaseHTTPRequestHandler]) -> None:
        self._handler_class = handler_class
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        handler = type("Handler", (self._handler_class,), {"api": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
