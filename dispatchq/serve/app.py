"""The ASGI application: routes, the gate in front of them, and Redis outages answered 503.

    app = create_app(runtime)                     # what `dispatchq serve` runs
    app = create_app(runtime, extra_routes=[...]) # more routes, behind the same gate

Everything in front of the routes is middleware, not a decorator per route, so routes added
later are covered the same. Outermost of all, around Starlette's own error page,
`wire.OnTheWire` (the security headers on a 500 too). Then: the access log (`guard.AccessLog`), the
security headers on every answer, the Host check (DNS rebinding), cross-site writes refused
(Origin, Sec-Fetch-Site), the bearer token or login cookie (`auth`), the media types a write
route reads, then Redis outages. Each refusal is answered before anything touches Redis.

Redis going away is weather (`dispatchq.storage.outage`): a request that meets it is
answered 503 with the reason, the process stays up, and one background thread waits
for Redis the way workers do (restarting the embedded server when it is gone), saying
"unreachable" once and "back" once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatchq.runtime import Runtime
from dispatchq.serve import actions, history, judgements, metrics, page, status, webhooks
from dispatchq.serve.auth import (
    BearerAuth,
    FailureThrottle,
    cookie_secure,
    login_form_route,
    login_route,
    logout_route,
    signature_hook,
)
from dispatchq.serve.context import ServeContext
from dispatchq.serve.guard import (
    AccessLog,
    CrossSiteWrites,
    HostCheck,
    MediaTypes,
    SecurityHeaders,
    send_json,
    trusted_networks,
)
from dispatchq.serve.wire import OnTheWire
from dispatchq.storage.outage import (
    is_outage,
    out_of_memory_message,
    outage_reason,
)

__all__ = ["create_app"]

log = logging.getLogger("dispatchq.serve")


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
            await send_json(send, 503, {"error": reason}, [(b"retry-after", b"5")])


class _Served(Starlette):
    """Starlette with `OnTheWire` around its whole stack: its `ServerErrorMiddleware`, which
    answers an exception with a 500 page, sits outside every middleware `add_middleware` adds."""

    def build_middleware_stack(self) -> ASGIApp:
        return OnTheWire(super().build_middleware_stack())


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
    proxies = trusted_networks(settings.serve_trusted_proxies)
    # Each kind of wrong credential on its own count per peer (`auth.FailureThrottle`).
    throttles = {kind: FailureThrottle(context.logins, kind) for kind in ("login", "bearer", "signature")}
    secure = cookie_secure(settings, settings.serve_host)
    batcher = webhooks.DeliveryBatcher(context.deliveries, context.deliveries_job)
    routes: list[BaseRoute] = [
        *webhooks.routes(context, batcher, signature_hook(throttles["signature"], proxies)),
        *judgements.routes(context),
        *status.routes(lambda: runtime),
        *metrics.routes(lambda: runtime),
        *page.routes(lambda: runtime),
        *page.judgement_routes(context),
        *history.routes(lambda: runtime),
        *actions.routes(context, proxies),
        Route(
            "/login",
            login_route(context.api_token, throttles["login"], proxies, logins=context.logins, secure=secure),
            methods=["POST"],
            name="login",
        ),
        Route(
            "/logout",
            logout_route(context.api_token, logins=context.logins, secure=secure),
            methods=["POST"],
            name="logout",
        ),
        Route("/login", login_form_route(context.api_token), methods=["GET"], name="login-form"),
        *extra_routes,
    ]
    app = _Served(routes=routes)
    app.state.context = context
    # Added innermost first: each add_middleware wraps what was added before it.
    app.add_middleware(RedisOutage, context=context)
    app.add_middleware(MediaTypes)
    app.add_middleware(
        BearerAuth,
        token=context.api_token,
        logins=context.logins,
        throttle=throttles["bearer"],
        trusted=proxies,
    )
    app.add_middleware(CrossSiteWrites)
    app.add_middleware(HostCheck, allowed=settings.serve_allowed_hosts)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(AccessLog, mode=settings.serve_access_log, trusted=proxies)
    return app
