"""`POST /webhooks/github`: GitHub's webhook contract, onto the typed queue.

In this order, so nothing unverified is ever parsed or stored:

1. no secret configured: 503 (and `serve` said so at start);
2. a body over `DISPATCHQ_SERVE_MAX_BODY` (5 MB; 25 MB at most): 413, refused by its
   Content-Length or while it streams in (`dispatchq.serve.body`, which also times it);
3. `X-Hub-Signature-256` (ASCII, else 400) checked against the secret in constant time, over
   the chunks as they stream in, past 64 KB spooled to disk (`dispatchq.serve.stream`):
   missing or wrong, 401 and nothing recorded or kept, or 429 with Retry-After once the
   sender's address has sent a handful of wrong ones (`auth.FailureThrottle`, asked only
   after the check failed, so a right signature from that address still passes);
4. `X-GitHub-Event` and `X-GitHub-Delivery` read;
5. the payload's nesting measured on its bytes (`jsonbody.nests_deeper`; past MAX_DEPTH,
   422), then parsed; a `ping` is answered 200, any other event mapped
   (`dispatchq.triage.github`, pure) to a triage event, its state narrowed by the
   triggered rules' `state:` lists;
6. the delivery accepted in Redis in one atomic step (`storage.serve.ACCEPT`): a
   redelivery (the same id, or the same body's sha256 under a new id: a captured delivery
   replayed) answers 200 with the first ids and makes no second decision; a first
   delivery is recorded with its event, a triage job naming it is saved and queued for
   a typed worker (`triage.jobs.run_deliveries`), and it is answered 202.

Deliveries that arrive while one accept call is in flight wait for the next, which takes
them all and makes one job of them (`DeliveryBatcher`): one Redis round trip and one RQ
job per batch, with no timer, so a lone delivery is never delayed and a burst costs few
calls. A 202 is sent only after the call that queued its job has returned.

Why this shape: on the 2-core machine a Redis round trip costs 100-170 us of CPU in
redis-py, more than mapping a payload, and the first version (five round trips a
delivery, in a thread each) accepted 0.14x of what a bare signature-checking Starlette
endpoint does; `bench/webhooks.py` measures it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson
from githubkit.webhooks import verify
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from dispatchq.errors import UserError
from dispatchq.serve.body import BodyTooLarge
from dispatchq.serve.jsonbody import BadJSON, nests_deeper, parse, trouble
from dispatchq.serve.stream import Spool, Unsigned, receive_signed
from dispatchq.storage.serve import DELIVERY_ID, AsyncDeliveries, Delivery
from dispatchq.triage.github import event_name, map_delivery, state_paths
from dispatchq.triage.jobs import prepare_deliveries
from dispatchq.triage.rules import Event, TriageConfig, decision_key

if TYPE_CHECKING:
    from dispatchq.serve.context import ServeContext
    from dispatchq.storage.prepared import JobTemplate

__all__ = [
    "MAX_BATCH",
    "MAX_DEPTH",
    "DeliveryBatcher",
    "GitHubWebhook",
    "answer_delivery",
    "prepare_delivery",
    "routes",
]

#: The most deliveries one accept call takes (a bound on one Lua call's time in Redis).
MAX_BATCH = 64
_EVENT_HEADER = "x-github-event"
#: The only headers the route reads (ASGI gives them lower-cased, as bytes).
_HEADERS = {
    name.encode(): name
    for name in (
        "content-length",
        "content-type",
        "x-hub-signature-256",
        "x-github-event",
        "x-github-delivery",
    )
}
_EVENT_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
#: Told the request whose signature failed; answers how long its sender waits (`auth.signature_hook`).
ForgedHook = Callable[[Scope], Awaitable[int]]


#: How deep a delivery may nest (its payload, and the envelope kept from it). GitHub's
#: payloads nest at most 7 deep; the records' encoder stops at 255, orjson's parser at 1,024
#: and Python's recursion near 1,000: deeper is refused 422, before it is parsed.
MAX_DEPTH = 64


class _TooDeep(Exception):
    pass


def _has_float(value: Any, depth: int = 0) -> bool:
    """True if a float is inside `value`; `_TooDeep` past MAX_DEPTH (one walk for both: it is hot)."""
    kind = type(value)
    if kind is dict:
        value = value.values()
    elif kind is not list:
        return kind is float
    if depth >= MAX_DEPTH:
        raise _TooDeep
    found = False
    for item in value:  # a loop, not any(): this runs on every delivery
        kind = type(item)
        if kind is float or ((kind is dict or kind is list) and _has_float(item, depth + 1)):
            found = True  # the walk goes on: depth is checked everywhere
    return found


_TOO_DEEP = f"the delivery's kept state nests more than {MAX_DEPTH} deep"


def prepare_delivery(
    context: ServeContext, event: str, delivery: str, payload: dict[str, Any], body: bytes | None = None
) -> Delivery | tuple[int, dict[str, Any]]:
    """Map a verified delivery to its triage event and job, or (HTTP status, answer) if it cannot be.

    `payload` is orjson's parse of `body` (a third of `json`'s time), which reads an
    integer past 64 bits as a float. Only the mapped envelope is kept, so only a float
    there matters: then the exact parse (`json`, integers whole) is mapped instead. The
    walk that looks for a float also bounds the envelope's depth, so a payload nested
    900 deep is a 422 naming the depth, never a RecursionError.
    """
    runtime = context.runtime
    config = runtime.config.triage
    if not isinstance(config, TriageConfig):
        return 503, {"error": "the config has no triage section: a delivery has nothing to be triaged by"}
    name = event_name(event, payload)
    paths = state_paths(config, name)
    envelope = map_delivery(event, payload, state_paths=paths)
    try:
        if body is not None and _has_float(envelope):
            envelope = map_delivery(event, parse(body, what="the payload"), state_paths=paths)
            found = trouble(envelope, depth=MAX_DEPTH)  # what the exact parse kept, named
            if found is not None:
                return 422, {"error": f"the delivery's kept state {found}"}
        parsed = Event.from_json(envelope)
    except BadJSON as bad:
        return bad.status, {"error": str(bad)}
    except (_TooDeep, RecursionError):
        return 422, {"error": _TOO_DEEP}
    except UserError as error:
        return 422, {"error": f"the delivery does not map to a triage event: {error}"}
    record = {
        "delivery": delivery,
        "decision_id": decision_key(parsed, config),
        "event": parsed.event,
        "target": parsed.target,
        "envelope": parsed.to_json(),  # what the typed worker triages (`run_deliveries`)
    }
    return Delivery(delivery, record, hashlib.sha256(body).hexdigest() if body is not None else "")


class DeliveryBatcher:
    """Group commit for webhook deliveries: whoever arrives during a call rides the next one.

    Runs on the server's one event loop, so its list needs no lock. A failed call (Redis
    away, or full) fails every delivery it carried; each request then answers 503 by the
    app's outage middleware, and GitHub's redelivery is a first delivery again, because
    nothing of a failed call was written.
    """

    def __init__(self, deliveries: AsyncDeliveries, job: JobTemplate, *, max_batch: int = MAX_BATCH) -> None:
        self._deliveries = deliveries
        self._job = job
        self._max_batch = max_batch
        self._waiting: list[tuple[Delivery, asyncio.Future[dict[str, Any] | None]]] = []
        self._running = False
        self._task: asyncio.Task[None] | None = None  # held so the loop cannot drop it
        self.calls = 0  # how many accept calls were made (batches), for tests and the bench

    async def accept(self, delivery: Delivery) -> dict[str, Any] | None:
        """None once the delivery is queued; else the record of its first delivery."""
        future: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
        self._waiting.append((delivery, future))
        if not self._running:
            self._running = True
            self._task = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch = self._waiting[: self._max_batch]
                del self._waiting[: self._max_batch]
                self.calls += 1
                try:
                    taken = [delivery for delivery, _ in batch]
                    job = prepare_deliveries(self._job, [delivery.id for delivery in taken])
                    replies = await self._deliveries.accept(taken, job)
                except Exception as error:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for (_, future), reply in zip(batch, replies, strict=True):
                    if not future.done():  # a request whose client went away was cancelled
                        future.set_result(reply)
        finally:
            self._running = False


def _scalar(value: Any) -> str | int | None:
    """A ping's field echoed back only as what GitHub sends there: text or a whole number."""
    if type(value) is str:
        return value[:1000]
    return value if type(value) is int else None


_NO_SECRET = "no webhook secret is configured (DISPATCHQ_GITHUB_WEBHOOK_SECRET): every delivery is refused"  # noqa: S105 (a message, not a password)


async def answer_delivery(
    context: ServeContext, batcher: DeliveryBatcher, secret: str, headers: Mapping[str, str], body: bytes
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, answer) for one POST: verified first, then read, mapped and accepted."""
    signature = headers.get("x-hub-signature-256", "")
    if not signature.isascii():  # hmac's compare refuses non-ASCII text: a TypeError, not a 401
        return 400, {"error": "X-Hub-Signature-256 is not ASCII (it is sha256= and 64 hex digits)"}
    if not signature.startswith("sha256=") or not verify(secret, body, signature):
        return 401, {"error": "X-Hub-Signature-256 is missing or does not match the webhook secret"}
    event = headers.get(_EVENT_HEADER, "")
    delivery = headers.get("x-github-delivery", "")
    if not event or not set(event) <= _EVENT_NAME_CHARS or len(event) > 100:
        return 400, {"error": "X-GitHub-Event: missing or not an event name"}
    if not DELIVERY_ID.match(delivery):
        return 400, {"error": "X-GitHub-Delivery: missing or not a delivery id"}
    media = headers.get("content-type", "").split(";")[0].strip().lower()
    if media and media != "application/json":
        return 415, {"error": "set the webhook's content type to application/json"}
    if nests_deeper(body, MAX_DEPTH):  # verified, measured, then parsed
        return 422, {"error": f"the payload nests more than {MAX_DEPTH} deep"}
    try:
        payload = orjson.loads(body)  # exact where it matters: see `prepare_delivery`
    except orjson.JSONDecodeError as error:  # a ValueError; bad UTF-8 is one too
        return 400, {"error": f"the payload is not JSON ({error})"}
    if not isinstance(payload, dict):
        return 400, {"error": "the payload is not a JSON object"}
    if event == "ping":
        return 200, {
            "ping": "pong",
            "delivery": delivery,
            "hook_id": _scalar(payload.get("hook_id")),
            "zen": _scalar(payload.get("zen")),
        }
    prepared = prepare_delivery(context, event, delivery, payload, body)
    if isinstance(prepared, tuple):
        return prepared
    decision = prepared.record["decision_id"]
    earlier = await batcher.accept(prepared)
    if earlier is not None:
        answer = {
            "delivery": delivery,
            "decision_id": earlier.get("decision_id", decision),
            "redelivery": True,
        }
        first = earlier.get("delivery")
        if first and first != delivery:  # the same body under another id: a replay
            answer["replay_of"] = first
        return 200, answer
    return 202, {"delivery": delivery, "decision_id": decision}


class GitHubWebhook:
    """The route as a plain ASGI app: no Request, no Response object, one dict of headers.

    The busiest route, and the one whose every request does real work: Starlette's
    per-request objects cost about as much as mapping the payload (measured in
    `bench/webhooks.py`). Auth and outage middleware still wrap it like every route.

    A client gone mid-body raises `ClientDisconnect` out of here on purpose: `body.Bounds`,
    outermost, tells it from its own refusals (a late or oversized body, already answered)
    and notes a real one in one line.
    """

    def __init__(
        self, context: ServeContext, batcher: DeliveryBatcher, on_forged: ForgedHook | None = None
    ) -> None:
        self._context = context
        self._batcher = batcher
        self._spool = Spool(context.runtime.settings.serve_spool)
        self._on_forged = on_forged

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            wanted = _HEADERS.get(name)
            if wanted is not None and wanted not in headers:  # the first of a repeated header wins
                headers[wanted] = value.decode("latin-1")
        secret = self._context.webhook_secret
        if not secret:  # said before reading what will be refused anyway
            status, answer = 503, {"error": _NO_SECRET}
        else:
            try:  # verified as it streams (`dispatchq.serve.stream`): memory stays small
                body = await receive_signed(
                    headers,
                    receive,
                    secret=secret,
                    limit=self._context.runtime.settings.serve_max_body,
                    spool=self._spool,
                )
            except BodyTooLarge as error:
                status, answer = 413, {"error": str(error)}
            except Unsigned as error:
                status, answer = error.status, {"error": str(error)}
            else:
                status, answer = await answer_delivery(self._context, self._batcher, secret, headers, body)
        extra: list[tuple[bytes, bytes]] = []
        if status == 401 and self._on_forged is not None:  # checked first: the right one always passes
            wait = await self._on_forged(scope)
            if wait:
                status, extra = 429, [(b"retry-after", str(wait).encode())]
                answer = {"error": f"too many wrong signatures from this address; try again in {wait} s"}
        data = orjson.dumps(answer)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})


def routes(
    context: ServeContext, batcher: DeliveryBatcher, on_forged: ForgedHook | None = None
) -> list[BaseRoute]:
    """The route; `on_forged` is asked after a signature failed how long its sender waits (0: a 401)."""
    return [Route("/webhooks/github", GitHubWebhook(context, batcher, on_forged), methods=["POST"])]
