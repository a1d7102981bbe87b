"""The ASGI application: routes, bearer-token auth, and Redis outages answered 503.

    app = create_app(runtime)                     # what `dispatchq serve` runs
    app = create_app(runtime, extra_routes=[...]) # more routes, behind the same auth

Auth is middleware, not a decorator per route: with `DISPATCHQ_API_TOKEN` set, every
request needs `Authorization: Bearer <token>` except `/healthz` (a load balancer's probe)
and `/webhooks/github` (GitHub signs instead). Routes added later are covered the same.

Redis going away is weather (`dispatchq.storage.outage`): a request that meets it is
answered 503 with the reason, the process stays up, and one background thread waits
for Redis the way workers do (restarting the embedded server when it is gone), saying
"unreachable" once and "back" once.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import urllib.parse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatchq.runtime import Runtime
from dispatchq.serve import judgements, metrics, page, status, webhooks
from dispatchq.serve.context import ServeContext
from dispatchq.storage.outage import (
    is_outage,
    out_of_memory_message,
    outage_reason,
)

if TYPE_CHECKING:
    pass

__all__ = ["OPEN_PATHS", "READ_METHODS", "TOKEN_COOKIE", "create_app", "is_loopback"]

log = logging.getLogger("dispatchq.serve")

#: The routes that answer without the bearer token.
OPEN_PATHS = frozenset({"/healthz", "/webhooks/github", "/login"})

#: The cookie `/login` sets so a browser can show the page when a token is configured.
#: It is accepted for reading only (GET/HEAD): every write still needs the Bearer header,
#: so a page elsewhere cannot make a logged-in browser enqueue anything.
TOKEN_COOKIE = "dispatchq_token"  # noqa: S105 (a cookie name, not a password)
READ_METHODS = frozenset({"GET", "HEAD"})

LOGIN_FORM = """<!doctype html><meta charset="utf-8"><title>dispatchq</title>
<form method="post" action="/login" style="font: 16px system-ui; margin: 4em auto; max-width: 24em">
<p>This dispatchq needs its API token (<code>DISPATCHQ_API_TOKEN</code>) to show the page.</p>
<p><input type="password" name="token" autofocus required style="width: 100%"></p>
<p><button type="submit">Show the page</button></p></form>
"""


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (`127.0.0.1`, `::1`, `localhost`)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


async def _send_json(send: Send, status: int, data: Any, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
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


class BearerAuth:
    """Every route but OPEN_PATHS needs `Authorization: Bearer <token>` (when a token is set)."""

    def __init__(self, app: ASGIApp, *, token: str | None) -> None:
        self.app = app
        self._token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._token is None or scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        scheme, _, credential = given.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), self._token):
            await self.app(scope, receive, send)
            return
        if scope.get("method") in READ_METHODS and self._cookie_matches(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["path"] == "/" and scope.get("method") in READ_METHODS:
            await HTMLResponse(LOGIN_FORM, status_code=401)(scope, receive, send)
            return
        await _send_json(
            send,
            401,
            {"error": "this route needs Authorization: Bearer <DISPATCHQ_API_TOKEN>"},
            [(b"www-authenticate", b'Bearer realm="dispatchq"')],
        )

    def _cookie_matches(self, scope: Scope) -> bool:
        assert self._token is not None
        for name, value in scope.get("headers", ()):
            if name != b"cookie":
                continue
            for part in value.split(b";"):
                key, _, given = part.strip().partition(b"=")
                if key == TOKEN_COOKIE.encode() and hmac.compare_digest(given, self._token):
                    return True
        return False


def _login(context: ServeContext) -> Any:
    """`POST /login` (a form with `token`): the read-only cookie for the page, then `/`."""

    async def login(request: Request) -> Response:
        if context.api_token is None:
            return RedirectResponse("/", status_code=303)
        body = b""
        async for chunk in request.stream():  # a form with one field: 4 KB is plenty
            body += chunk
            if len(body) > 4096:
                return HTMLResponse(LOGIN_FORM, status_code=413)
        fields = urllib.parse.parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
        given = (fields.get("token") or [""])[0].strip().encode()
        if not hmac.compare_digest(given, context.api_token.encode()):
            return HTMLResponse(LOGIN_FORM, status_code=401)
        answer = RedirectResponse("/", status_code=303)
        answer.set_cookie(TOKEN_COOKIE, context.api_token, httponly=True, samesite="strict", path="/")
        return answer

    return login


class RedisOutage:
    """A request that meets a Redis outage (or a full Redis) is answered 503, never a crash."""

    def __init__(self, app: ASGIApp, *, context: ServeContext) -> None:
        self.app = app
        self.context = context

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as error:
            full = out_of_memory_message(error)
            if full is None and not is_outage(error):
                raise
            if full is None:
                self.context.redis_away(error)
            if started:
                return  # the answer was on its way; nothing better can be said now
            reason = full or f"Redis is unreachable ({outage_reason(error)}); try again shortly"
            await _send_json(send, 503, {"error": reason}, [(b"retry-after", b"5")])


def create_app(runtime: Runtime, *, extra_routes: Sequence[BaseRoute] = ()) -> Starlette:
    """The application `dispatchq serve` runs, over one process's runtime."""
    settings = runtime.settings
    context = ServeContext(
        runtime,
        webhook_secret=(
            settings.github_webhook_secret.get_secret_value() if settings.github_webhook_secret else None
        ),
        api_token=settings.api_token.get_secret_value() if settings.api_token else None,
    )
    routes: list[BaseRoute] = [
        *webhooks.routes(context, webhooks.DeliveryBatcher(context.deliveries, context.deliveries_job)),
        *judgements.routes(context),
        *status.routes(lambda: runtime),
        *metrics.routes(lambda: runtime),
        *page.routes(lambda: runtime),
        Route("/login", _login(context), methods=["POST"], name="login"),
        *extra_routes,
    ]
    app = Starlette(routes=routes)
    app.state.context = context
    # Outermost first: auth answers before anything touches Redis.
    app.add_middleware(RedisOutage, context=context)
    app.add_middleware(BearerAuth, token=context.api_token)
    return app
