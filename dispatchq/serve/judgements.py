"""`POST /judgements`, `GET /judgements/{id}`, `GET /healthz`.

`POST /judgements` takes one JSON object, a JSON array of them, or JSON Lines
(`application/x-ndjson`; a body that is not one JSON value is read as JSON Lines too).
Every judgement goes through `Client.enqueue_lines`, the code path of `dispatchq enqueue
-`, so validation, idempotency and the per-line error texts are the same; an array's
element N is line N. The answer is one entry per input line:
`[{"line": N, "id": ..., "created": bool} | {"line": N, "error": ...}]` with status 200
when every line went in, 207 when some did, 422 when none did, and 503 (with the lines
that went in and where to resume) when Redis failed part way.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from dispatchq.client import Client
from dispatchq.serve.body import BodyTooLarge, read_limited
from dispatchq.storage.outage import is_outage, out_of_memory_message, outage_reason
from dispatchq.storage.serve import JUDGEMENT_PREFIX
from dispatchq.tiers.session import session_log_path

if TYPE_CHECKING:
    from dispatchq.serve.context import ServeContext

__all__ = ["enqueue_body", "lines_of", "routes"]

NDJSON = ("application/x-ndjson", "application/jsonl", "application/json-lines")


def lines_of(body: bytes, media_type: str) -> list[bytes]:
    """The body as JSON Lines, the way `enqueue -` reads stdin (array element N is line N)."""
    if media_type not in NDJSON:
        try:
            value = json.loads(body)
        except ValueError:
            value = None  # not one JSON value: JSON Lines sent without the media type
        else:
            if isinstance(value, list):
                return [json.dumps(item, ensure_ascii=False).encode() for item in value]
            return [body]
    return body.split(b"\n")


def enqueue_body(context: ServeContext, body: bytes, media_type: str, *, force: bool) -> tuple[int, Any]:
    """Enqueue a request body; (HTTP status, answer). Runs in a worker thread."""
    client = Client(runtime=context.runtime)
    results = client.enqueue_lines(lines_of(body, media_type), force=force)
    answer: list[dict[str, Any]] = []
    for r in results:
        if r.unwritten:
            continue
        if r.ok:
            answer.append({"line": r.index, "id": r.id, "created": r.created})
        else:
            answer.append({"line": r.index, "error": r.error})
    if client.interrupted is not None:
        cause = client.interrupted
        if is_outage(cause):
            context.redis_away(cause)
        first = next(r.index for r in results if r.unwritten)
        reason = out_of_memory_message(cause) or f"Redis became unreachable: {outage_reason(cause)}"
        return 503, {
            "error": f"{reason}; nothing was written from line {first} on. Re-send from line {first}: "
            "a judgement already in is recognised, not written twice.",
            "results": answer,
        }
    if not results:
        return 400, {"error": "the body has no judgement (an object, an array or JSON Lines)"}
    good = sum(1 for r in results if r.ok)
    status = 200 if good == len(results) else 207 if good else 422
    return status, answer


def record_for(context: ServeContext, prefix: str) -> tuple[int, Any]:
    if not JUDGEMENT_PREFIX.match(prefix):
        return 400, {"error": "give a judgement id, or a unique prefix of at least 8 of its characters"}
    found = context.storage.ids_with_prefix(prefix, limit=5)
    if not found:
        return 404, {"error": f"no judgement {prefix} (unknown id, or its record expired)"}
    if len(found) > 1:
        return 409, {"error": f"{prefix} is the start of more than one judgement id", "ids": found}
    record = context.runtime.store.get(found[0])
    if record is None:
        return 404, {"error": f"no judgement {prefix} (its record expired)"}
    log = session_log_path(context.runtime.settings.data_dir, record.id)
    return 200, {**record.public(), "session_log": str(log) if log.is_file() else None}


def routes(context: ServeContext) -> list[BaseRoute]:
    async def post_judgements(request: Request) -> JSONResponse:
        try:
            body = await read_limited(request)
        except BodyTooLarge as error:
            return JSONResponse({"error": str(error)}, status_code=413)
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        force = request.query_params.get("force", "").lower() in ("1", "true", "yes")
        status, answer = await run_in_threadpool(enqueue_body, context, body, media, force=force)
        entries = answer if isinstance(answer, list) else answer.get("results", ())
        request.state.judgements = sum("id" in entry for entry in entries)  # for guard.AccessLog
        return JSONResponse(answer, status_code=status)

    async def get_judgement(request: Request) -> JSONResponse:
        status, answer = await run_in_threadpool(record_for, context, request.path_params["jid"])
        return JSONResponse(answer, status_code=status)

    async def healthz(request: Request) -> JSONResponse:
        try:
            await run_in_threadpool(context.storage.ping)
        except Exception as error:
            if not is_outage(error):
                raise
            context.redis_away(error)
            return JSONResponse({"ok": False, "error": f"Redis is unreachable ({outage_reason(error)})"}, 503)
        return JSONResponse({"ok": True})

    return [
        Route("/judgements", post_judgements, methods=["POST"]),
        Route("/judgements/{jid}", get_judgement, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
