"""A confined session's only way out: a proxy to the API host, reached through one unix socket.

A sandboxed session has a private network namespace with nothing in it but its own loopback,
so it cannot reach a TCP Redis on 127.0.0.1, `dispatchq serve`, another local stand-in or an
abstract unix socket of the host. Claude Code still has to reach the Messages API: it honours
`HTTPS_PROXY`/`HTTP_PROXY`, so inside the sandbox a tiny relay (see `sandbox.SHIM`) listens
on the sandbox's own `127.0.0.1:EGRESS_PORT` and hands each connection, byte for byte, to this
proxy's unix socket, which is the one file of the host bound into the sandbox.

This side answers exactly two request shapes, and only for a destination on its allow-list
(the API host from `ANTHROPIC_BASE_URL`, else `api.anthropic.com:443`, plus
`DISPATCHQ_SESSION_EGRESS`):

- `CONNECT host:port` (HTTPS): `200`, then the tunnel;
- an absolute-form request, `POST http://host:port/path HTTP/1.1` (what the CLI sends for an
  `http://` base URL such as a loopback stand-in): the request line is rewritten to
  origin-form, `Connection: close` is forced so every request gets a fresh, checked
  connection, and the bytes are relayed.

Anything else is answered `403` (a destination not allowed) or `400`, and logged once with
the destination, never the payload. Nothing here parses or keeps the traffic beyond the head
of the first request.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["DEFAULT_API", "EGRESS_PORT", "EgressProxy", "allowed_destinations", "parse_destination"]

log = logging.getLogger(__name__)

#: The port the in-sandbox relay listens on (its own loopback: no other process shares it).
EGRESS_PORT = 3128
DEFAULT_API = ("api.anthropic.com", 443)
_HEAD_LIMIT = 64 * 1024
_CONNECT_TIMEOUT = 30.0
_CHUNK = 65536


def parse_destination(text: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) as a destination; ValueError naming what is wrong."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port")
    return host.strip("[]").lower(), int(port)


def allowed_destinations(environ: Mapping[str, str], extra: Iterable[str] = ()) -> frozenset[tuple[str, int]]:
    """The API host the session's `ANTHROPIC_BASE_URL` names (default `api.anthropic.com:443`) and `extra`."""
    found = {DEFAULT_API}
    base = environ.get("ANTHROPIC_BASE_URL")
    if base:
        parts = urlsplit(base)
        if parts.hostname:
            found = {(parts.hostname.lower(), parts.port or (80 if parts.scheme == "http" else 443))}
    found.update(parse_destination(item) for item in extra if item.strip())
    return frozenset(found)


class EgressProxy:
    """One spawn's proxy: a unix socket in a private 0700 folder, closed when the spawn ends."""

    def __init__(self, allowed: frozenset[tuple[str, int]]) -> None:
        self.allowed = allowed
        self.folder = Path(tempfile.mkdtemp(prefix="dispatchq-egress-"))  # 0700, ours
        self.path = self.folder / "egress.sock"
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.path))
        self._server.listen(64)
        self._closed = threading.Event()
        self._refused: set[str] = set()
        self._thread = threading.Thread(target=self._accept, name="dispatchq-egress", daemon=True)
        self._thread.start()

    def __enter__(self) -> EgressProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._thread.join(timeout=5)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(conn,), name="dispatchq-egress-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                head = _read_head(conn)
                if head is None:
                    return
                upstream, first = self._open(conn, head)
            except OSError:
                return
            if upstream is None:
                return
            with upstream:
                if first:
                    upstream.sendall(first)
                _relay(conn, upstream)

    def _open(self, conn: socket.socket, head: bytes) -> tuple[socket.socket | None, bytes]:
        """The checked upstream connection and what to send it first (None: refused, answered)."""
        line, _, rest = head.partition(b"\r\n")
        parts = line.decode("latin-1").split(" ")
        if len(parts) != 3:
            conn.sendall(_status(400, "Bad Request"))
            return None, b""
        method, target, version = parts
        if method == "CONNECT":
            try:
                destination = parse_destination(target)
            except ValueError:
                conn.sendall(_status(400, "Bad Request"))
                return None, b""
            upstream = self._connect(conn, destination)
            if upstream is not None:
                conn.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            return upstream, b""
        url = urlsplit(target)
        if url.scheme != "http" or not url.hostname:
            conn.sendall(_status(400, "Bad Request"))
            return None, b""
        upstream = self._connect(conn, (url.hostname.lower(), url.port or 80))
        if upstream is None:
            return None, b""
        path = url.path or "/"
        if url.query:
            path += f"?{url.query}"
        return upstream, f"{method} {path} {version}\r\n".encode("latin-1") + _close_headers(rest)

    def _connect(self, conn: socket.socket, destination: tuple[str, int]) -> socket.socket | None:
        if destination not in self.allowed:
            where = f"{destination[0]}:{destination[1]}"
            if where not in self._refused:
                self._refused.add(where)
                log.warning("a session asked its proxy for %s, which is not an allowed destination", where)
            conn.sendall(_status(403, "Forbidden"))
            return None
        try:
            return socket.create_connection(destination, timeout=_CONNECT_TIMEOUT)
        except OSError:
            conn.sendall(_status(502, "Bad Gateway"))
            return None


def _status(code: int, reason: str) -> bytes:
    return f"HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()


def _read_head(conn: socket.socket) -> bytes | None:
    """Bytes up to and including the first request's blank line, plus whatever came with them."""
    data = b""
    conn.settimeout(_CONNECT_TIMEOUT)
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(_CHUNK)
        if not chunk or len(data) > _HEAD_LIMIT:
            return None
        data += chunk
    conn.settimeout(None)
    return data


def _close_headers(rest: bytes) -> bytes:
    """The request's headers (and any body bytes after them) with `Connection: close` forced."""
    headers, sep, body = rest.partition(b"\r\n\r\n")
    kept = [
        line
        for line in headers.split(b"\r\n")
        if line and not line.lower().startswith((b"connection:", b"proxy-connection:", b"keep-alive:"))
    ]
    kept.append(b"Connection: close")
    return b"\r\n".join(kept) + b"\r\n\r\n" + (body if sep else b"")


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Both directions until either side closes; a half-close is passed on."""
    a.settimeout(None)
    b.settimeout(None)

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=pump, args=(b, a), daemon=True)
    other.start()
    pump(a, b)
    other.join()
