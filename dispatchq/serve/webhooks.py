"""`POST /webhooks/github`: GitHub's webhook contract, into the existing triage enqueue path.

In this order, so nothing unverified is ever parsed or stored:

1. no secret configured: 503 (and `serve` said so at start);
2. a body over 25 MB: 413, refused by its Content-Length or while it streams in;
3. `X-Hub-Signature-256` checked against the secret in constant time (githubkit's
   `webhooks.verify`): missing or wrong, 401 and nothing recorded;
4. `X-GitHub-Event` and `X-GitHub-Delivery` read; a `ping` is answered 200;
5. the payload parsed and mapped (`dispatchq.triage.github`, pure) to a triage event,
   its state narrowed by the triggered rules' `state:` lists;
6. the delivery id claimed in Redis: a redelivery answers 200 with the first ids and
   makes no second decision; a first delivery is enqueued for a typed worker
   (`enqueue_triage`, the path `triage --enqueue` takes) and answered 202.
"""

from __future__ import annotations

import json
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from githubkit.webhooks import verify
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from dispatchq.errors import UserError
from dispatchq.serve.body import BodyTooLarge, read_limited
from dispatchq.storage.serve import DELIVERY_ID
from dispatchq.tiers.typed import enqueue_triage
from dispatchq.triage.github import event_name, map_delivery, state_paths
from dispatchq.triage.rules import Event, TriageConfig, decision_key

if TYPE_CHECKING:
    from dispatchq.serve.app import ServeContext

__all__ = ["CLAIM_TTL", "accept_delivery", "routes"]

#: How long a claimed delivery waits for its enqueue before a redelivery may claim it again.
CLAIM_TTL = 60
_EVENT_HEADER = "x-github-event"
_EVENT_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def accept_delivery(
    context: ServeContext, event: str, delivery: str, payload: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """Map, claim, enqueue: (HTTP status, answer). Runs in a worker thread (Redis is sync)."""
    runtime = context.runtime
    config = runtime.config.triage
    if not isinstance(config, TriageConfig):
        return 503, {"error": "the config has no triage section: a delivery has nothing to be triaged by"}
    name = event_name(event, payload)
    envelope = map_delivery(event, payload, state_paths=state_paths(config, name))
    try:
        parsed = Event.from_json(envelope)
    except UserError as error:
        return 422, {"error": f"the delivery does not map to a triage event: {error}"}
    decision = decision_key(parsed, config)
    record = {"delivery": delivery, "decision_id": decision, "event": parsed.event, "target": parsed.target}
    earlier = context.storage.claim_delivery(delivery, record, CLAIM_TTL)
    if earlier is not None:
        return 200, {
            "delivery": delivery,
            "decision_id": earlier.get("decision_id", decision),
            "redelivery": True,
        }
    try:
        job = enqueue_triage(runtime, parsed.to_json(), None)
    except BaseException:
        with suppress(Exception):  # Redis may be the reason; the claim then expires by itself
            context.storage.release_delivery(delivery)
        raise
    context.storage.confirm_delivery(delivery, {**record, "job": job}, runtime.settings.result_ttl)
    return 202, {"delivery": delivery, "decision_id": decision}


def routes(context: ServeContext) -> list[BaseRoute]:
    async def github_webhook(request: Request) -> JSONResponse:
        secret = context.webhook_secret
        if not secret:
            return _error(
                503,
                "no webhook secret is configured (DISPATCHQ_GITHUB_WEBHOOK_SECRET): "
                "every delivery is refused",
            )
        try:
            body = await read_limited(request)
        except BodyTooLarge as error:
            return _error(413, str(error))
        signature = request.headers.get("x-hub-signature-256", "")
        if not signature.startswith("sha256=") or not verify(secret, body, signature):
            return _error(401, "X-Hub-Signature-256 is missing or does not match the webhook secret")
        event = request.headers.get(_EVENT_HEADER, "")
        delivery = request.headers.get("x-github-delivery", "")
        if not event or not set(event) <= _EVENT_NAME_CHARS or len(event) > 100:
            return _error(400, "X-GitHub-Event: missing or not an event name")
        if not DELIVERY_ID.match(delivery):
            return _error(400, "X-GitHub-Delivery: missing or not a delivery id")
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media and media != "application/json":
            return _error(415, "set the webhook's content type to application/json")
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as error:
            return _error(400, f"the payload is not JSON: {type(error).__name__}")
        if not isinstance(payload, dict):
            return _error(400, "the payload is not a JSON object")
        if event == "ping":
            return JSONResponse(
                {
                    "ping": "pong",
                    "delivery": delivery,
                    "hook_id": payload.get("hook_id"),
                    "zen": payload.get("zen"),
                }
            )
        status, answer = await run_in_threadpool(accept_delivery, context, event, delivery, payload)
        return JSONResponse(answer, status_code=status)

    return [Route("/webhooks/github", github_webhook, methods=["POST"])]
