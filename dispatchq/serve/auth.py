"""The bearer token, the browser's read-only login cookie, and `POST /login` with its throttle.

With `DISPATCHQ_API_TOKEN` set, every request needs `Authorization: Bearer <token>` except
OPEN_PATHS; a browser cannot send that header, so `/` offers a form and `/login` sets a
cookie that opens GET/HEAD only (a page elsewhere cannot make a logged-in browser write).

The cookie is `<expires>.<HMAC-SHA256(token, expires)>`, never the token: a cookie read off
a disk or a proxy's log opens the page until it expires and cannot be turned into the
write token. It is `Secure` unless the browser reached this server by a loopback name
(plain http there is this machine's own), HttpOnly, SameSite=Strict, and the server
checks its expiry itself (`Max-Age` is only the browser's word). Failed logins are counted
per peer (`guard.peer_address`): LOGIN_ATTEMPTS in LOGIN_WINDOW seconds, then 429 with
Retry-After until the oldest failure is out of the window, so a 32-character token cannot
be guessed through the form.

The page acts too (window open/close, retry, cancel, unblock a host: `serve.actions`), so
`/login` also sets a write cookie, `<expires>.<HMAC-SHA256(token, "write" label, expires)>`,
that lasts WRITE_COOKIE_MAX_AGE only (a browser left open cannot act all day). It opens the
action routes (ACTION_PREFIX) and nothing else, and only for a request whose `Origin` is this
server (a browser always sends it on a `fetch` POST; a request without it is a tool's, which
has the bearer token) carrying WRITE_HEADER, which a form cannot send and another origin's
script cannot add without a CORS preflight this server never grants. `page.js` sends the
header; it never sees either cookie (HttpOnly) nor the token.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from typing import Any

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
    split_host,
)

__all__ = [
    "ACTION_PREFIX",
    "COOKIE_MAX_AGE",
    "LOGIN_ATTEMPTS",
    "LOGIN_FORM",
    "LOGIN_WINDOW",
    "OPEN_PATHS",
    "TOKEN_COOKIE",
    "WRITE_COOKIE",
    "WRITE_COOKIE_MAX_AGE",
    "WRITE_HEADER",
    "BearerAuth",
    "LoginThrottle",
    "cookie_value",
    "login_form_route",
    "login_route",
    "read_cookie_valid",
    "write_cookie_valid",
    "write_cookie_value",
]

#: The routes that answer without the bearer token.
OPEN_PATHS = frozenset({"/healthz", "/webhooks/github", "/login"})
TOKEN_COOKIE = "dispatchq_token"  # noqa: S105 (a cookie name, not a password)
#: How long a login lasts: a working day, after which the form is shown again.
COOKIE_MAX_AGE = 12 * 3600
LOGIN_ATTEMPTS = 5
LOGIN_WINDOW = 60.0
#: Peers remembered by the throttle at most (a flood of addresses must not grow it unbounded).
_MAX_PEERS = 10_000
_COOKIE_CONTEXT = b"dispatchq read-only page cookie v1:"
WRITE_COOKIE = "dispatchq_write"
#: How long the page may act after a login: a quarter of an hour, then the form again.
WRITE_COOKIE_MAX_AGE = 15 * 60
_WRITE_CONTEXT = b"dispatchq write page cookie v1:"
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


def _mac(token: bytes, expires: int, context: bytes = _COOKIE_CONTEXT) -> str:
    return hmac.new(token, context + str(expires).encode(), hashlib.sha256).hexdigest()


def _form(status: int) -> HTMLResponse:
    return HTMLResponse(LOGIN_FORM, status_code=status, headers=_FORM_HEADERS)


def cookie_value(token: bytes, now: float) -> str:
    """The read cookie for a login at `now`: its expiry and an HMAC over it keyed by the token."""
    expires = int(now) + COOKIE_MAX_AGE
    return f"{expires}.{_mac(token, expires)}"


def write_cookie_value(token: bytes, now: float) -> str:
    """The write cookie for a login at `now`: a short expiry and an HMAC over the write label."""
    expires = int(now) + WRITE_COOKIE_MAX_AGE
    return f"{expires}.{_mac(token, expires, _WRITE_CONTEXT)}"


def read_cookie_valid(token: bytes, given: bytes, now: float, context: bytes = _COOKIE_CONTEXT) -> bool:
    """Whether a cookie value (quoted or not: browsers and proxies differ) is a live login."""
    expires_text, _, mac = given.strip().strip(b'"').partition(b".")
    if not expires_text.isdigit() or len(expires_text) > 12:
        return False
    expires = int(expires_text)
    if expires <= now:
        return False
    return hmac.compare_digest(mac, _mac(token, expires, context).encode())


def write_cookie_valid(token: bytes, given: bytes, now: float) -> bool:
    """Whether a write cookie value is live (a read cookie, signed for another label, is not)."""
    return read_cookie_valid(token, given, now, _WRITE_CONTEXT)


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


class BearerAuth:
    """Every route but OPEN_PATHS needs `Authorization: Bearer <token>` (when a token is set);
    the login cookie stands in for it on GET and HEAD, the write cookie on the page's actions
    (same Origin and WRITE_HEADER: see the module)."""

    def __init__(self, app: ASGIApp, *, token: str | None) -> None:
        self.app = app
        self._token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._token is None or scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        scheme, _, credential = (header(scope, b"authorization") or b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), self._token):
            await self.app(scope, receive, send)
            return
        if scope.get("method") in READ_METHODS and self._cookie_matches(scope):
            await self.app(scope, receive, send)
            return
        refused = self._write_refusal(scope)
        if refused is None:
            await self.app(scope, receive, send)
            return
        if refused:
            await send_json(send, 403, {"error": refused})
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
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

    def _cookie_matches(self, scope: Scope) -> bool:
        assert self._token is not None
        now = time.time()
        return any(
            read_cookie_valid(self._token, given, now) for given in _cookies(scope, TOKEN_COOKIE.encode())
        )

    def _write_refusal(self, scope: Scope) -> str | None:
        """None: a live write cookie opens this action; "": no write cookie (401 follows);
        else why a request with one is refused (403)."""
        assert self._token is not None
        if scope.get("method") in READ_METHODS or not scope["path"].startswith(ACTION_PREFIX):
            return ""
        now = time.time()
        if not any(
            write_cookie_valid(self._token, given, now) for given in _cookies(scope, WRITE_COOKIE.encode())
        ):
            return ""
        if header(scope, b"origin") is None or cross_site_reason(scope) is not None:
            return "a write with the page's login cookie needs this server's own Origin"
        if header(scope, WRITE_HEADER.lower().encode()) != b"1":
            return (
                f"a write with the page's login cookie needs the header {WRITE_HEADER}: 1 (the page sends it)"
            )
        return None


class LoginThrottle:
    """Failed logins per peer in a sliding window; `wait` says how long a throttled one waits."""

    def __init__(self, attempts: int = LOGIN_ATTEMPTS, window: float = LOGIN_WINDOW) -> None:
        self.attempts = attempts
        self.window = window
        self._failures: dict[str, deque[float]] = {}

    def wait(self, peer: str, now: float) -> int:
        """Seconds before `peer` may try again (0: now)."""
        failures = self._failures.get(peer)
        if failures is None:
            return 0
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if not failures:
            del self._failures[peer]
            return 0
        if len(failures) < self.attempts:
            return 0
        return max(1, int(failures[0] + self.window - now + 0.999))

    def failed(self, peer: str, now: float) -> None:
        if peer not in self._failures and len(self._failures) >= _MAX_PEERS:
            self._forget_stale(now)
        self._failures.setdefault(peer, deque(maxlen=self.attempts)).append(now)

    def succeeded(self, peer: str) -> None:
        self._failures.pop(peer, None)

    def _forget_stale(self, now: float) -> None:
        """Drop peers whose failures are all out of the window; if none are, the oldest half."""
        stale = [peer for peer, times in self._failures.items() if times[-1] <= now - self.window]
        if not stale:
            by_age = sorted(self._failures, key=lambda peer: self._failures[peer][-1])
            stale = by_age[: len(by_age) // 2 or 1]
        for peer in stale:
            del self._failures[peer]


def login_route(
    token: str | None, throttle: LoginThrottle, trusted: Networks, clock: Callable[[], float] = time.time
) -> Any:
    """`POST /login` (a form with `token`): the read-only cookie for the page, then `/`."""

    async def login(request: Request) -> Response:
        if token is None:
            return RedirectResponse("/", status_code=303)
        peer = peer_address(request.scope, trusted)
        wait = throttle.wait(peer, clock())
        if wait:
            return PlainTextResponse(
                f"too many failed logins from {peer}; try again in {wait} s",
                status_code=429,
                headers={"Retry-After": str(wait)},
            )
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
            throttle.failed(peer, clock())
            return _form(401)
        throttle.succeeded(peer)
        answer = RedirectResponse("/", status_code=303)
        host, _ = split_host(request.headers.get("host", ""))
        secure = request.url.scheme == "https" or not is_loopback(host)
        now = clock()
        for name, value, max_age in (
            (WRITE_COOKIE, write_cookie_value(token.encode(), now), WRITE_COOKIE_MAX_AGE),
            (TOKEN_COOKIE, cookie_value(token.encode(), now), COOKIE_MAX_AGE),
        ):
            answer.set_cookie(
                name, value, max_age=max_age, httponly=True, samesite="strict", path="/", secure=secure
            )
        return answer

    return login


def login_form_route(token: str | None) -> Any:
    """`GET /login`: the form again (the page links here when its write cookie has expired)."""

    async def form(request: Request) -> Response:
        if token is None:
            return RedirectResponse("/", status_code=303)
        return _form(200)

    return form
