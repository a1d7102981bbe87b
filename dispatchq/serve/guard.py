"""What `dispatchq serve` refuses before a route runs, what it adds to every answer, what it logs.

Why each piece (with no token, the default on loopback, any web page a developer opens could
write through their browser):

- `HostCheck`: a DNS-rebinding page reaches 127.0.0.1 under its own name, and its `Host`
  header says that name. Starlette's `TrustedHostMiddleware` answers 400 to any Host but the
  loopback names and `DISPATCHQ_SERVE_ALLOWED_HOSTS`. `/healthz` is left out: it tells
  nothing, and a load balancer probes by address.
- `CrossSiteWrites`: a page cannot forge `Origin` or `Sec-Fetch-Site`, so a write whose Origin
  is not this server, or that the browser marks `cross-site`, is 403 whatever the auth mode.
  The webhook route keeps its own rule (the signature): GitHub sends neither header.
- `MediaTypes`: a form can send only urlencoded, multipart and `text/plain` bodies without a
  CORS preflight (which this server never grants), so write routes that take JSON only are
  out of a form's reach even in a browser that sends no Origin. 415 names what is taken.
- `SecurityHeaders`: the page's headers on every answer, so no route (a static file, an
  error, the login form) can be framed, sniffed or cached.
- `AccessLog`: one line per write (who, what, the status, how many judgements went in), with
  the peer taken from `X-Forwarded-For` only when the connection is a configured proxy.
- `refuse_at_start`: the settings `serve` will not run with, as one line (exit 2).
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatchq.errors import UserError
from dispatchq.serve.judgements import NDJSON
from dispatchq.serve.page import SECURITY_HEADERS
from dispatchq.serve.wire import WIRE_STATUS
from dispatchq.settings import Settings

__all__ = [
    "FORM_TYPE",
    "JSON_TYPES",
    "JUDGEMENTS_STATE",
    "LOOPBACK_NAMES",
    "MIN_TOKEN_LENGTH",
    "READ_METHODS",
    "AccessLog",
    "CrossSiteWrites",
    "HostCheck",
    "MediaTypes",
    "Networks",
    "SecurityHeaders",
    "cross_site_reason",
    "header",
    "is_loopback",
    "peer_address",
    "refuse_at_start",
    "send_json",
    "split_host",
    "trusted_networks",
]

access_log = logging.getLogger("dispatchq.serve.access")

#: The Host names that always reach this server (a browser on this machine, a local probe).
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
#: What `POST /judgements` and every other JSON write route reads; `/login` takes its form.
JSON_TYPES = ("application/json", *NDJSON)
FORM_TYPE = "application/x-www-form-urlencoded"
#: Routes whose own rule replaces the Origin and media-type checks (GitHub signs its body).
SIGNED_PATHS = frozenset({"/webhooks/github"})
READ_METHODS = frozenset({"GET", "HEAD"})
#: Methods a browser sends without a write's consequences (OPTIONS: a preflight, never granted).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: A base64 or hex token (or webhook secret) this long cannot be guessed: not through a throttled
#: login, nor by signing deliveries, nor over the wire.
MIN_TOKEN_LENGTH = 32
#: The key in the ASGI scope's `state` where a route says how many judgements a request added.
JUDGEMENTS_STATE = "judgements"
_DEFAULT_PORTS = {"http": 80, "https": 443}

Networks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (`127.0.0.1`, `::1`, `localhost`)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_at_start(settings: Settings, host: str) -> None:
    """Raise the one-line UserError `serve` exits 2 with, for settings it must not run with."""
    token = settings.api_token.get_secret_value() if settings.api_token else None
    if token is None and not is_loopback(host):
        raise UserError(
            f"--host {host}: not a loopback address and DISPATCHQ_API_TOKEN is not set; "
            "set a token (or DISPATCHQ_API_TOKEN_FILE) to listen beyond this machine"
        )
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise UserError(
            f"DISPATCHQ_API_TOKEN is {len(token)} characters; at least {MIN_TOKEN_LENGTH} are needed "
            "(python3 -c 'import secrets; print(secrets.token_urlsafe(32))' makes one)"
        )
    secret = settings.github_webhook_secret.get_secret_value() if settings.github_webhook_secret else None
    if secret is not None and len(secret) < MIN_TOKEN_LENGTH:
        raise UserError(
            f"DISPATCHQ_GITHUB_WEBHOOK_SECRET is {len(secret)} characters; at least {MIN_TOKEN_LENGTH} are "
            "needed (python3 -c 'import secrets; print(secrets.token_urlsafe(32))' makes one: give GitHub "
            "the same in the webhook's settings)"
        )
    if not is_loopback(host) and not settings.serve_allowed_hosts:
        raise UserError(
            f"--host {host}: not a loopback address and DISPATCHQ_SERVE_ALLOWED_HOSTS is not set; "
            "name the Host clients use (behind a proxy, the public name GitHub is given)"
        )


def trusted_networks(entries: Iterable[str]) -> Networks:
    """`DISPATCHQ_SERVE_TRUSTED_PROXIES` (validated by the settings) as networks."""
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def header(scope: Scope, name: bytes) -> bytes | None:
    """The last value of one header (ASGI gives names lower-cased), or None."""
    found = None
    for key, value in scope.get("headers", ()):
        if key == name:
            found = value
    return found


def peer_address(scope: Scope, trusted: Networks) -> str:
    """Who sent the request: the connection's address, or behind a trusted proxy the address
    that proxy saw (X-Forwarded-For's last hop: the entries before it are the client's word)."""
    client = scope.get("client")
    peer = str(client[0]) if client else "-"
    if not trusted or not _within(peer, trusted):
        return peer
    forwarded = header(scope, b"x-forwarded-for")
    if not forwarded:
        return peer
    last = forwarded.rsplit(b",", 1)[-1].strip().decode("latin-1")
    return last if _within(last, ()) is not None else peer  # garbled: the proxy is who we know


def _within(address: str, networks: Networks) -> bool | None:
    """Whether `address` is in one of `networks`; None when it is not an IP address at all."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    return any(ip in network for network in networks)


async def send_json(send: Send, status: int, data: Any, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """A JSON answer from plain ASGI middleware (no Request or Response object to build)."""
    body = json.dumps(data, ensure_ascii=False).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class SecurityHeaders:
    """The page's security headers on every answer, unless the route set its own value (the
    answers written outside this middleware get them from `wire`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def adding(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {name.lower() for name, _ in headers}
                headers.extend(item for item in self._headers if item[0] not in present)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, adding)


class HostCheck:
    """Starlette's TrustedHostMiddleware over every route but `/healthz` (see the module)."""

    def __init__(self, app: ASGIApp, *, allowed: Sequence[str]) -> None:
        self.app = app
        self.checked = TrustedHostMiddleware(
            app, allowed_hosts=[*LOOPBACK_NAMES, *allowed], www_redirect=False
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/healthz":
            await self.app(scope, receive, send)
            return
        await self.checked(scope, receive, send)


def split_host(value: str, scheme: str = "") -> tuple[str, int | None]:
    """A Host header (`example.com:8484`, `[::1]:8484`, `example.com`) as (its name without
    brackets, lower-cased; its port, or the scheme's default, or None)."""
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = value.partition(":")
    try:
        return name.lower(), int(port) if port else _DEFAULT_PORTS.get(scheme)
    except ValueError:
        return name.lower(), None


def cross_site_reason(scope: Scope) -> str | None:
    """Why a browser sent this write from another site's page, or None when it did not.

    A request with neither header is a tool's (curl, a script): auth and media type decide.
    """
    if header(scope, b"sec-fetch-site") == b"cross-site":
        return "a write from another site's page is refused (Sec-Fetch-Site: cross-site)"
    origin = header(scope, b"origin")
    if origin is None:
        return None
    shown = origin.decode("latin-1")
    try:
        parts = urlsplit(shown)
        given = ((parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(parts.scheme))
    except ValueError:
        given = None
    host = (header(scope, b"host") or b"").decode("latin-1")
    if given is None or not given[0] or given != split_host(host, parts.scheme):
        return f"a write from another origin is refused (Origin: {shown[:200]}, this server: {host[:200]})"
    return None


class CrossSiteWrites:
    """403 for a write a browser sent from another site's page, whatever the auth mode."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] not in SAFE_METHODS
            and scope["path"] not in SIGNED_PATHS
        ):
            reason = cross_site_reason(scope)
            if reason is not None:
                await send_json(send, 403, {"error": reason})
                return
        await self.app(scope, receive, send)


class MediaTypes:
    """415 for a write whose Content-Type its route does not read (JSON, or `/login`'s form).

    A JSON route takes a body with no Content-Type at all, as before (a script's request):
    a page can send one too (`fetch` with a typeless Blob), but a browser that does sends
    `Origin` with it, and `CrossSiteWrites` has refused it already.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS or scope["path"] in SIGNED_PATHS:
            await self.app(scope, receive, send)
            return
        accepted = (FORM_TYPE,) if scope["path"] == "/login" else JSON_TYPES
        declared = header(scope, b"content-type")
        given = (declared or b"").decode("latin-1").split(";")[0].strip().lower()
        if given in accepted or (declared is None and accepted is JSON_TYPES):
            await self.app(scope, receive, send)
            return
        await send_json(
            send,
            415,
            {
                "error": f"{scope['method']} {scope['path'][:200]} takes Content-Type "
                f"{' or '.join(accepted)}, not {given[:100] or '(none)'}",
                "accepted": list(accepted),
            },
        )


_ACCESS = "access %s %s %s %s%s"


def _printable(text: str) -> str:
    """A path as one log line shows it: a percent-decoded newline must not start a forged line."""
    text = text[:300]
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


class AccessLog:
    """One INFO line per write (`mode="writes"`), per request (`"all"`), or none (`"off"`).

    `access peer METHOD /path status [judgements=N]`: N is what the route put in the scope's state
    under JUDGEMENTS_STATE (`POST /judgements`: the lines that went in). The status is what went
    on the wire (`wire.OnTheWire` notes it, around everything that may answer): a 413 the bounds
    sent while the route read its body is 413; an exception nothing answered is the 500
    Starlette sends; a client gone before any answer is `-`.
    """

    def __init__(self, app: ASGIApp, *, mode: str, trusted: Networks) -> None:
        self.app = app
        self.mode = mode
        self.trusted = trusted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or self.mode == "off"
            or (self.mode == "writes" and scope["method"] in READ_METHODS)
        ):
            await self.app(scope, receive, send)
            return
        status = 0
        state = scope.setdefault("state", {})

        async def tracking(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except BaseException as error:
            if not isinstance(error, ClientDisconnect):
                status = status or 500
            raise
        finally:
            status = state.get(WIRE_STATUS, status)
            if access_log.isEnabledFor(logging.INFO):
                count = state.get(JUDGEMENTS_STATE)
                args = (
                    peer_address(scope, self.trusted),
                    scope["method"],
                    _printable(scope["path"]),
                    status or "-",
                    "" if count is None else f" judgements={count}",
                )
                # Made here, not by `log.info`: its caller lookup walks the stack on every
                # webhook delivery, a third of the line's cost, for a file and line no
                # formatter here shows.
                record = access_log.makeRecord(
                    access_log.name, logging.INFO, __file__, 0, _ACCESS, args, None
                )
                access_log.handle(record)
