"""The bearer token, the browser's login cookies, `POST /login` and `/logout`, the throttle.

With `DISPATCHQ_API_TOKEN` set, every request needs `Authorization: Bearer <token>` except
OPEN_PATHS; a browser cannot send that header, so `/` offers a form and `/login` sets a
cookie that opens GET/HEAD only (a page elsewhere cannot make a logged-in browser write).

The cookie is `<expires>.<login>.<HMAC-SHA256(token, expires, login)>`, never the token: a
cookie read off a disk or a proxy's log opens the page until it expires or is revoked, and
cannot be turned into the write token. `login` is a random id made for each login (two logins
in one second differ) and kept in Redis (`dispatchq.storage.logins`): a request with a cookie
is let in only while its login is on record there, so `POST /logout` (this login) and
`dispatchq serve revoke-logins` (every login) end it on every server of the same store, at
once. It is HttpOnly, SameSite=Strict, and `Secure` as `cookie_secure` decides from the
settings (the URL browsers are given), never from the request's Host header, which a proxy
may rewrite to 127.0.0.1. The server checks its expiry itself (`Max-Age` is only the
browser's word).

Wrong credentials are throttled per peer (`guard.peer_address`), each kind on its own count
(`FailureThrottle`: a login form's token, a Bearer token, a webhook's signature):
FAILURE_ATTEMPTS in FAILURE_WINDOW seconds, then 429 with Retry-After. The credential is
checked first and the throttle asked only when it is wrong, so the right one always passes,
even from a throttled peer (GitHub's hook addresses are shared with anyone who points a hook
here; behind a proxy without TRUSTED_PROXIES every client is one peer).

The page acts too (window open/close, retry, cancel, unblock a host: `serve.actions`), so
`/login` also sets a write cookie, `<expires>.<login>.<HMAC-SHA256(token, "write" label,
expires, login)>`, ended with its login, that lasts WRITE_COOKIE_MAX_AGE only (a browser
left open cannot act all day). It opens the action routes (ACTION_PREFIX) and nothing else,
and only for a request whose `Origin` is this server (a browser always sends it on a `fetch`
POST; a request without it is a tool's, which has the bearer token) carrying WRITE_HEADER,
which a form cannot send and another origin's script cannot add without a CORS preflight this
server never grants. `page.js` sends the header; it never sees either cookie (HttpOnly) nor
the token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import math
import re
import secrets
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from dispatchq.serve.guard import (
    READ_METHODS,
    Networks,
    cross_site_reason,
    header,
    is_loopback,
    peer_address,
    send_json,
)
from dispatchq.storage.outage import is_outage, outage_reason

if TYPE_CHECKING:
    from dispatchq.settings import Settings
    from dispatchq.storage.logins import AsyncLogins

__all__ = [
    "ACTION_PREFIX",
    "COOKIE_MAX_AGE",
    "FAILURE_ATTEMPTS",
    "FAILURE_WINDOW",
    "LOGIN_FORM",
    "OPEN_PATHS",
    "TOKEN_COOKIE",
    "WRITE_COOKIE",
    "WRITE_COOKIE_MAX_AGE",
    "WRITE_HEADER",
    "BearerAuth",
    "FailureThrottle",
    "cookie_login",
    "cookie_secure",
    "cookie_value",
    "login_form_route",
    "login_route",
    "logout_route",
    "signature_hook",
    "throttled_answer",
    "write_cookie_login",
    "write_cookie_value",
]

log = logging.getLogger("dispatchq.serve")

#: The routes that answer without the bearer token.
#: `/logout` ends only the login whose signed cookie it is given, so it needs nothing more.
OPEN_PATHS = frozenset({"/healthz", "/webhooks/github", "/login", "/logout"})
TOKEN_COOKIE = "dispatchq_token"  # noqa: S105 (a cookie name, not a password)
#: How long a login lasts: a working day, after which the form is shown again.
COOKIE_MAX_AGE = 12 * 3600
#: Wrong credentials of one kind a peer may present in FAILURE_WINDOW seconds before 429.
FAILURE_ATTEMPTS = 5
FAILURE_WINDOW = 60.0
#: Throttled peers each process remembers at most (a flood of addresses must not grow it unbounded).
_MAX_PEERS = 10_000
_COOKIE_CONTEXT = b"dispatchq read-only page cookie v2:"
#: What a login id looks like (`secrets.token_urlsafe(16)`): nothing a cookie's dots could split.
_LOGIN_ID = re.compile(rb"[A-Za-z0-9_-]{16,64}")
WRITE_COOKIE = "dispatchq_write"
#: How long the page may act after a login: a quarter of an hour, then the form again.
WRITE_COOKIE_MAX_AGE = 15 * 60
_WRITE_CONTEXT = b"dispatchq write page cookie v2:"
#: The routes the write cookie opens (the page's actions); every other write needs the token.
ACTION_PREFIX = "/actions/"
#: The header a write with the write cookie must carry: a form cannot send it.
WRITE_HEADER = "X-Dispatchq-Write"
#: The login form's own policy: the page's forbids every form, this one posts to `/login`.
_FORM_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    )
}

# The referrer meta: under the headers' `no-referrer` Chromium sends `Origin: null` with the
# form's POST, which the cross-site rule refuses; same-origin gives this server's own Origin.
LOGIN_FORM = """<!doctype html><meta charset="utf-8"><title>dispatchq</title>
<meta name="referrer" content="same-origin">
<form method="post" action="/login" style="font: 16px system-ui; margin: 4em auto; max-width: 24em">
<p>This dispatchq needs its API token (<code>DISPATCHQ_API_TOKEN</code>) to show the page.</p>
<p><input type="password" name="token" autofocus required style="width: 100%"></p>
<p><button type="submit">Show the page</button></p></form>
"""


def _mac(token: bytes, expires: int, login: bytes, context: bytes = _COOKIE_CONTEXT) -> str:
    return hmac.new(token, context + str(expires).encode() + b"." + login, hashlib.sha256).hexdigest()


def _form(status: int) -> HTMLResponse:
    return HTMLResponse(LOGIN_FORM, status_code=status, headers=_FORM_HEADERS)


def cookie_value(token: bytes, login: str, now: float) -> str:
    """The read cookie for login `login` at `now`: its expiry, its id, and an HMAC over both keyed
    by the token."""
    expires = int(now) + COOKIE_MAX_AGE
    return f"{expires}.{login}.{_mac(token, expires, login.encode())}"


def write_cookie_value(token: bytes, login: str, now: float) -> str:
    """The write cookie for login `login` at `now`: a short expiry and an HMAC over the write label."""
    expires = int(now) + WRITE_COOKIE_MAX_AGE
    return f"{expires}.{login}.{_mac(token, expires, login.encode(), _WRITE_CONTEXT)}"


def _signed_login(token: bytes, given: bytes, context: bytes) -> tuple[int, str] | None:
    """(expiry, login id) of a cookie value this token signed for `context` (quoted or not:
    browsers and proxies differ), or None."""
    parts = given.strip().strip(b'"').split(b".")
    if len(parts) != 3:
        return None
    expires_text, login, mac = parts
    if not expires_text.isdigit() or len(expires_text) > 12 or not _LOGIN_ID.fullmatch(login):
        return None
    expires = int(expires_text)
    if not hmac.compare_digest(mac, _mac(token, expires, login, context).encode()):
        return None
    return expires, login.decode()


def cookie_login(token: bytes, given: bytes, now: float, context: bytes = _COOKIE_CONTEXT) -> str | None:
    """The login id of a read cookie that is signed and not expired (Redis says if it is revoked)."""
    signed = _signed_login(token, given, context)
    return signed[1] if signed is not None and signed[0] > now else None


def write_cookie_login(token: bytes, given: bytes, now: float) -> str | None:
    """The login id of a live write cookie (a read cookie, signed for another label, is none)."""
    return cookie_login(token, given, now, _WRITE_CONTEXT)


def cookie_secure(settings: Settings, host: str) -> bool:
    """Whether the login cookies are `Secure`: by DISPATCHQ_SERVE_PUBLIC_URL's scheme when it is
    set; else unless `serve` is reached only by this machine's loopback names over plain http
    (a loopback `host`, no DISPATCHQ_SERVE_ALLOWED_HOSTS, no DISPATCHQ_SERVE_TRUSTED_PROXIES).

    Never from a request's Host header or scheme: a proxy that terminates TLS may forward
    `Host: 127.0.0.1` over plain http, and a browser told https must not get a cookie it
    would send over http.
    """
    if settings.serve_public_url is not None:
        return urllib.parse.urlsplit(settings.serve_public_url).scheme == "https"
    return not (is_loopback(host) and not settings.serve_allowed_hosts and not settings.serve_trusted_proxies)


def _cookies(scope: Scope, name: bytes) -> list[bytes]:
    """Every value the request's Cookie headers give `name`."""
    found = []
    for key, value in scope.get("headers", ()):
        if key != b"cookie":
            continue
        for part in value.split(b";"):
            cookie, _, given = part.strip().partition(b"=")
            if cookie == name:
                found.append(given)
    return found


def _throttle_key(peer: str) -> str:
    """What one peer's failures are counted under: its address, or an IPv6 peer's /64 (whoever
    holds one address of a /64 usually holds them all)."""
    try:
        ip = ipaddress.ip_address(peer)
    except ValueError:
        return peer[:100]
    if ip.version == 6 and ip.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class FailureThrottle:
    """Wrong credentials of one kind per peer: FAILURE_ATTEMPTS in FAILURE_WINDOW seconds, then
    429 with Retry-After for each further wrong one until the peer stops for a window.

    Only failures are counted and only failures are refused: a caller checks the credential
    first and calls `failed` only when it is wrong. What stops a guesser is the credential's
    length (32 characters at least, ~190 bits: `guard.refuse_at_start`); the throttle makes a
    flood of wrong ones a cheap, visible 429 that tells a client to back off, without ever
    costing the right credential its answer.

    The count is in Redis (`storage.logins`), shared by every `serve` process of the store, so
    a balancer's round robin does not multiply the allowance. A peer found throttled is
    remembered here until its wait ends, so a flood costs Redis one call per window, not one
    per request. A Redis outage counts nothing: the wrong credential is still refused.
    """

    def __init__(
        self,
        logins: AsyncLogins,
        kind: str,
        *,
        attempts: int = FAILURE_ATTEMPTS,
        window: float = FAILURE_WINDOW,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kind = kind
        self.attempts = attempts
        self.window = window
        self._logins = logins
        self._clock = clock
        self._until: dict[str, float] = {}
        self._uncounted = False  # an outage has been said

    async def failed(self, peer: str) -> int:
        """Count one wrong credential from `peer`: 0 to answer it as usual, else the seconds it waits."""
        key = _throttle_key(peer)
        now = self._clock()
        until = self._until.get(key)
        if until is not None and until > now:
            return math.ceil(until - now)
        try:
            wait = await self._logins.failed(self.kind, key, allowed=self.attempts, window=self.window)
        except Exception as error:
            if not is_outage(error):
                raise
            if not self._uncounted:  # once an outage, not once a request of a flood
                log.warning(
                    "wrong %s from %s not counted, nor any until Redis answers: %s",
                    self.kind,
                    peer,
                    outage_reason(error),
                )
            self._uncounted = True
            return 0
        self._uncounted = False
        if not wait:
            self._until.pop(key, None)
            return 0
        if key not in self._until and len(self._until) >= _MAX_PEERS:
            self._forget(now)
        self._until[key] = now + wait
        return math.ceil(wait)

    def _forget(self, now: float) -> None:
        """Drop the peers whose wait is over; if none is, the half that ends first."""
        done = [key for key, until in self._until.items() if until <= now]
        if not done:
            done = sorted(self._until, key=self._until.__getitem__)[: len(self._until) // 2 or 1]
        for key in done:
            del self._until[key]


def throttled_answer(kind: str, peer: str, wait: int) -> tuple[dict[str, str], list[tuple[bytes, bytes]]]:
    """The 429's JSON and headers for a throttled peer."""
    return (
        {"error": f"too many wrong {kind} from {peer}; try again in {wait} s"},
        [(b"retry-after", str(wait).encode())],
    )


def signature_hook(throttle: FailureThrottle, trusted: Networks) -> Callable[[Scope], Awaitable[int]]:
    """What the webhook route calls after a signature failed: the peer's wait (0: answer 401)."""

    async def forged(scope: Scope) -> int:
        return await throttle.failed(peer_address(scope, trusted))

    return forged


class BearerAuth:
    """Every route but OPEN_PATHS needs `Authorization: Bearer <token>` (when a token is set);
    the login cookie stands in for it on GET and HEAD, the write cookie on the page's actions
    (same Origin and WRITE_HEADER: see the module), each while its login is on record in Redis.
    A wrong Bearer token counts against the peer (`FailureThrottle`); another scheme never matches,
    so it is refused without being counted."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        logins: AsyncLogins | None = None,
        throttle: FailureThrottle | None = None,
        trusted: Networks = (),
    ) -> None:
        self.app = app
        self._token = token.encode() if token else None
        self._logins = logins
        self._throttle = throttle
        self._trusted = trusted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._token is None or scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        scheme, _, credential = (header(scope, b"authorization") or b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), self._token):
            await self.app(scope, receive, send)
            return
        try:
            if scope.get("method") in READ_METHODS and await self._cookie_matches(scope):
                await self.app(scope, receive, send)
                return
            refused = await self._write_refusal(scope)
        except Exception as error:
            if not is_outage(error):
                raise
            reason = f"Redis is unreachable ({outage_reason(error)}): a login cannot be checked; try again"
            await send_json(send, 503, {"error": reason}, [(b"retry-after", b"5")])
            return
        if refused is None:
            await self.app(scope, receive, send)
            return
        if refused:
            await send_json(send, 403, {"error": refused})
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        if scheme.lower() == b"bearer" and self._throttle is not None:  # a guess (another scheme is none)
            peer = peer_address(scope, self._trusted)
            wait = await self._throttle.failed(peer)
            if wait:
                answer, headers = throttled_answer("Bearer tokens", peer, wait)
                await send_json(send, 429, answer, headers)
                return
        if scope["path"] == "/" and scope.get("method") in READ_METHODS:
            await _form(401)(scope, receive, send)
            return
        await send_json(
            send,
            401,
            {"error": "this route needs Authorization: Bearer <DISPATCHQ_API_TOKEN>"},
            [(b"www-authenticate", b'Bearer realm="dispatchq"')],
        )

    async def _live(self, login: str | None, now: float) -> bool:
        """A signed, unexpired cookie's login is let in while Redis still holds it."""
        if login is None:
            return False
        return self._logins is None or await self._logins.live(login, now)

    async def _cookie_matches(self, scope: Scope) -> bool:
        assert self._token is not None
        now = time.time()
        for given in _cookies(scope, TOKEN_COOKIE.encode()):
            if await self._live(cookie_login(self._token, given, now), now):
                return True
        return False

    async def _write_refusal(self, scope: Scope) -> str | None:
        """None: a live write cookie opens this action; "": no write cookie (401 follows);
        else why a request with one is refused (403)."""
        assert self._token is not None
        if scope.get("method") in READ_METHODS or not scope["path"].startswith(ACTION_PREFIX):
            return ""
        now = time.time()
        for given in _cookies(scope, WRITE_COOKIE.encode()):
            if await self._live(write_cookie_login(self._token, given, now), now):
                break
        else:
            return ""
        if header(scope, b"origin") is None or cross_site_reason(scope) is not None:
            return "a write with the page's login cookie needs this server's own Origin"
        if header(scope, WRITE_HEADER.lower().encode()) != b"1":
            return (
                f"a write with the page's login cookie needs the header {WRITE_HEADER}: 1 (the page sends it)"
            )
        return None


def login_route(
    token: str | None,
    throttle: FailureThrottle,
    trusted: Networks,
    *,
    logins: AsyncLogins,
    secure: bool,
    clock: Callable[[], float] = time.time,
) -> Any:
    """`POST /login` (a form with `token`): a new login, its two cookies, then `/`."""

    async def login(request: Request) -> Response:
        if token is None:
            return RedirectResponse("/", status_code=303)
        body = b""
        async for chunk in request.stream():  # a form with one field: 4 KB is plenty
            body += chunk
            if len(body) > 4096:
                return _form(413)
        try:
            fields = urllib.parse.parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
        except ValueError:  # more fields than the form has
            return _form(400)
        given = (fields.get("token") or [""])[0].strip().encode()
        if not hmac.compare_digest(given, token.encode()):
            peer = peer_address(request.scope, trusted)
            wait = await throttle.failed(peer)
            if wait:
                return PlainTextResponse(
                    f"too many failed logins from {peer}; try again in {wait} s",
                    status_code=429,
                    headers={"Retry-After": str(wait)},
                )
            return _form(401)
        answer = RedirectResponse("/", status_code=303)
        now = clock()
        login_id = secrets.token_urlsafe(16)
        await logins.start(login_id, now + COOKIE_MAX_AGE, now)
        for name, value, max_age in (
            (WRITE_COOKIE, write_cookie_value(token.encode(), login_id, now), WRITE_COOKIE_MAX_AGE),
            (TOKEN_COOKIE, cookie_value(token.encode(), login_id, now), COOKIE_MAX_AGE),
        ):
            answer.set_cookie(
                name, value, max_age=max_age, httponly=True, samesite="strict", path="/", secure=secure
            )
        return answer

    return login


def logout_route(token: str | None, *, logins: AsyncLogins, secure: bool) -> Any:
    """`POST /logout`: end the login the request's cookies name, on every server, then `/`.

    Open (OPEN_PATHS): it ends only a login whose cookie this token signed, expired or not, so
    without one it ends nothing. A page on another site cannot send it (`CrossSiteWrites`, and
    SameSite=Strict keeps the cookies off such a request anyway).
    """

    async def logout(request: Request) -> Response:
        ended = 0
        if token is not None:
            for name, context in ((TOKEN_COOKIE, _COOKIE_CONTEXT), (WRITE_COOKIE, _WRITE_CONTEXT)):
                for given in _cookies(request.scope, name.encode()):
                    signed = _signed_login(token.encode(), given, context)
                    if signed is not None and await logins.end(signed[1]):
                        ended += 1
        answer = RedirectResponse("/", status_code=303, headers={"X-Dispatchq-Logins-Ended": str(ended)})
        for name in (WRITE_COOKIE, TOKEN_COOKIE):
            answer.delete_cookie(name, path="/", secure=secure, httponly=True, samesite="strict")
        return answer

    return logout


def login_form_route(token: str | None) -> Any:
    """`GET /login`: the form again (the page links here when its write cookie has expired)."""

    async def form(request: Request) -> Response:
        if token is None:
            return RedirectResponse("/", status_code=303)
        return _form(200)

    return form
