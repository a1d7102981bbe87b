"""`dispatchq serve`: GitHub webhooks and other tools in over HTTP (Starlette under uvicorn)."""

from __future__ import annotations

import logging

import click

from dispatchq.cli import print_json, runtime, settings

__all__ = ["serve"]


@click.group(invoke_without_command=True)
@click.option("--host", default=None, help="Address to listen on [default: DISPATCHQ_SERVE_HOST, 127.0.0.1].")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port [default: 8484].")
@click.pass_context
def serve(ctx: click.Context, host: str | None, port: int | None) -> None:
    """Serve webhooks, judgements and health over HTTP until stopped.

    \b
    POST /webhooks/github    GitHub deliveries (X-Hub-Signature-256), triaged by a typed worker
    POST /judgements         one JSON object, an array, or JSON Lines: as `enqueue -`
    GET  /judgements/ID      a record, as `result --json` (a unique prefix of 8+ characters)
    GET  /healthz            200 when Redis answers

    With DISPATCHQ_API_TOKEN set, every route but /healthz and /webhooks/github needs
    `Authorization: Bearer <token>`; without it, only a loopback --host is allowed.
    Without DISPATCHQ_GITHUB_WEBHOOK_SECRET every delivery is refused (503). A Redis
    outage is answered 503 and waited out; the server keeps running.
    `dispatchq serve revoke-logins` ends every page login, on every server.
    """
    if ctx.invoked_subcommand is not None:
        return
    import uvicorn

    from dispatchq.launcher.environment import mark_non_dumpable
    from dispatchq.process.wiring import build_runtime_waiting
    from dispatchq.queue.upgrade import backfill_stale_index, backfill_unstarted_index, migrate_directory
    from dispatchq.serve.app import create_app
    from dispatchq.serve.body import Bounds, bounded_protocol
    from dispatchq.serve.guard import refuse_at_start, trusted_networks
    from dispatchq.serve.slots import Slots, slotted_protocol
    from dispatchq.serve.wire import OnTheWire, secured_protocol
    from dispatchq.supervise import Done, Role, supervise

    # First: serve holds the API token, the webhook secret and the Redis password, and a
    # session on this host must not read them from /proc/<pid>/environ.
    mark_non_dumpable()

    s = settings()
    host = host or s.serve_host
    port = port or s.serve_port
    refuse_at_start(s, host)  # one line, exit 2: no token or no allowed Host beyond loopback, a short secret
    s = s.model_copy(update={"serve_host": host})  # the address bound decides the cookie's Secure
    rt = build_runtime_waiting(s, role="serve")
    if rt is None:
        return  # asked to stop while waiting for Redis
    log = logging.getLogger("dispatchq.serve")
    if s.github_webhook_secret is None:
        log.warning(
            "DISPATCHQ_GITHUB_WEBHOOK_SECRET is not set: every delivery to /webhooks/github is refused (503)"
        )
    if rt.config.triage is None:
        log.warning("the config has no triage section: deliveries to /webhooks/github are refused (503)")
    if s.api_token is None:
        log.warning("DISPATCHQ_API_TOKEN is not set: routes are open to anyone on this machine")
    migrate_directory(rt.redis)  # ids of the indexes before the directory (once per store)
    backfill_unstarted_index(rt.redis)  # judgements queued before the oldest-waiting index (once)
    backfill_stale_index(rt.redis)  # judgements queued before the index by last update (once)
    app = create_app(rt)
    log.info("dispatchq serve listening on http://%s:%d", host if ":" not in host else f"[{host}]", port)

    # The bounds (`dispatchq.serve.body`): the body's deadline and size around every route,
    # the headers' deadline in the protocol. The slots (`dispatchq.serve.slots`): connections
    # per client and in all, the idle wait, and the requests in flight, in all (a share kept
    # for /healthz and webhooks) and per client; uvicorn's own limit, which counts idle
    # connections against requests, stays off. Every refusal is counted in /metrics, and
    # every answer, whoever writes it, carries the security headers (`dispatchq.serve.wire`).
    proxies = trusted_networks(s.serve_trusted_proxies)

    def listen() -> Done:
        uvicorn.run(
            OnTheWire(
                Slots(
                    Bounds(app, body_timeout=s.serve_body_timeout, max_body=s.serve_max_body),
                    concurrency=s.serve_concurrency,
                    reserved_share=s.serve_reserved_share,
                    per_peer=s.serve_peer_requests,
                    trusted=proxies,
                )
            ),
            http=slotted_protocol(
                secured_protocol(bounded_protocol(s.serve_header_timeout)),
                idle_timeout=s.serve_idle_timeout,
                peer_connections=s.serve_peer_connections,
                max_connections=s.serve_max_connections,
                trusted=proxies,
            ),
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            proxy_headers=False,  # X-Forwarded-For is read only from DISPATCHQ_SERVE_TRUSTED_PROXIES
            server_header=False,
            lifespan="off",
            timeout_graceful_shutdown=10,
        )
        return Done()

    # uvicorn takes SIGTERM and SIGINT while it serves, shuts down gracefully, then raises the
    # signal again to the loop's handler: the supervise loop's stop, and exit 0.
    supervise(rt, Role("dispatchq serve", listen), log=log)


@serve.command(name="revoke-logins")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable answer.")
def revoke_logins(as_json: bool) -> None:
    """End every page login (the browser cookies) on every server of this store, at once.

    Each login's id is kept in Redis and checked on every request, so no server needs a
    restart and the API token stays as it is; the next visit shows the login form.
    """
    import time

    rt = runtime(config=False)
    ended = rt.storage.serve.revoke_logins(time.time())
    if as_json:
        print_json({"revoked": ended})
        return
    click.echo(f"{ended} page login(s) ended; the next visit shows the login form")
