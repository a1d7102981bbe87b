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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from dispatchq.client import Client
from dispatchq.core.judgement import JudgementIn
from dispatchq.errors import TooManyRefused
from dispatchq.serve.body import BodyTooLarge, read_limited
from dispatchq.serve.jsonbody import BadJSON, parse, trouble
from dispatchq.storage.outage import is_outage, out_of_memory_message, outage_reason
from dispatchq.storage.serve import JUDGEMENT_PREFIX
from dispatchq.tiers.session_logs import session_log_path

if TYPE_CHECKING:
    from dispatchq.serve.context import ServeContext
    from dispatchq.settings import Settings

__all__ = ["MAX_DEPTH", "Refused", "Screened", "enqueue_body", "lines_of", "record_for", "routes"]

NDJSON = ("application/x-ndjson", "application/jsonl", "application/json-lines")
#: How deep one judgement may nest. Records are hashed by an encoder that stops at 255
#: levels and validated by code that recurses: deeper is refused per line, never a 500.
MAX_DEPTH = 64
_INT64 = (-(2**63), 2**64 - 1)  # what the records' encoder (orjson) can write


class Refused(Exception):
    """The whole request is refused by a bound (413, the message naming it): nothing is enqueued."""


@dataclass
class Screened:
    """A body as lines for `Client.enqueue_lines`, with what the screen refused itself.

    A line refused here is blanked in `lines` (`enqueue_lines` skips blank lines, so every
    other line keeps its number) and answered from `refused`. A line the screen validated
    is passed on as its `JudgementIn`; any other as its bytes, for `enqueue_lines` to refuse
    in `enqueue -`'s words.
    """

    lines: list[bytes | JudgementIn] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)


def _trouble(value: Any) -> str | None:
    """Why `value` cannot be a judgement's JSON, naming where (too deep, an integer past 64
    bits or too long to read, NaN, text with a lone surrogate), or None."""
    return trouble(value, depth=MAX_DEPTH, integers=_INT64, integers_are="past 64 bits")


def _parsed(values: list[tuple[int, bytes | None, Any]], settings: Settings) -> Screened:
    """Screen (line number, raw line or None, parsed value or _UNPARSED) for the bounds."""
    screened = Screened()
    bad = 0
    for number, raw, value in values:
        screened.lines.extend([b""] * (number - 1 - len(screened.lines)))  # blank lines keep their place
        error = "nests too deep to read" if value is _TOO_DEEP else None
        if value is _UNPARSED:
            bad += 1  # not JSON, or not UTF-8: `enqueue_lines` says which, as `enqueue -` does
        elif error is None:
            error = _trouble(value)
        if error is None and type(value) is dict:
            state = value.get("state")
            size = len(orjson.dumps(state)) if state is not None else 0
            if size > settings.serve_max_state:
                raise Refused(
                    f"line {number}: its state is {size} bytes, over DISPATCHQ_SERVE_MAX_STATE "
                    f"({settings.serve_max_state}); nothing was enqueued"
                )
            try:
                judgement = JudgementIn.model_validate(value)
            except ValidationError:
                bad += 1  # answered by `enqueue_lines`, in its words; counted here
            else:
                screened.lines.append(judgement)  # validated once: `enqueue_lines` takes it as is
                continue
        elif error is None and value is not _UNPARSED:
            bad += 1  # not an object: `enqueue_lines` says so
        if error is not None:
            bad += 1
            screened.refused.append({"line": number, "error": f"the judgement {error}"})
            screened.lines.append(b"")
        elif raw is not None:
            screened.lines.append(raw)
        else:
            screened.lines.append(json.dumps(value, ensure_ascii=False).encode())
    if bad > settings.serve_max_errors:
        raise _too_many_refused(bad, settings)
    return screened


def _too_many_refused(count: int, settings: Settings, *, counted: str = "") -> Refused:
    return Refused(
        f"{counted}{count} lines are refused, more than DISPATCHQ_SERVE_MAX_ERRORS "
        f"({settings.serve_max_errors}) in one request; nothing was enqueued"
    )


_UNPARSED = object()
_TOO_DEEP = object()


def _parse(raw: bytes) -> Any:
    try:
        return parse(raw)
    except BadJSON as bad:  # not JSON, or not UTF-8: `enqueue_lines` says which, as `enqueue -` does
        return _TOO_DEEP if bad.status == 422 else _UNPARSED


def _too_many(count: int, settings: Settings) -> Refused:
    return Refused(
        f"{count} judgements in one request, more than DISPATCHQ_SERVE_MAX_LINES "
        f"({settings.serve_max_lines}); nothing was enqueued: send them in parts"
    )


def lines_of(body: bytes, media_type: str, settings: Settings) -> Screened:
    """The body as JSON Lines, the way `enqueue -` reads stdin (array element N is line N), screened.

    `Refused` for more than DISPATCHQ_SERVE_MAX_LINES lines, a state over
    DISPATCHQ_SERVE_MAX_STATE or more than DISPATCHQ_SERVE_MAX_ERRORS refused lines; a line
    nested too deep or holding an integer past 64 bits is refused alone.
    """
    if media_type not in NDJSON:
        value = _parse(body)
        if type(value) is list:
            if len(value) > settings.serve_max_lines:
                raise _too_many(len(value), settings)
            return _parsed([(n, None, item) for n, item in enumerate(value, start=1)], settings)
        if value is not _UNPARSED:
            return _parsed([(1, body, value)], settings)
        # not one JSON value: JSON Lines sent without the media type
    raws = body.split(b"\n")
    count = sum(1 for raw in raws if raw.strip())
    if count > settings.serve_max_lines:
        raise _too_many(count, settings)
    return _parsed([(n, raw, _parse(raw)) for n, raw in enumerate(raws, start=1) if raw.strip()], settings)


def enqueue_body(context: ServeContext, body: bytes, media_type: str, *, force: bool) -> tuple[int, Any]:
    """Enqueue a request body; (HTTP status, answer). Runs in a worker thread."""
    try:
        screened = lines_of(body, media_type, context.runtime.settings)
    except Refused as refused:
        return 413, {"error": str(refused)}
    settings = context.runtime.settings
    client = Client(runtime=context.runtime)
    try:  # every refused line counts: an unknown kind, a bad checkout, as much as bad JSON
        results = client.enqueue_lines(
            screened.lines, force=force, max_errors=settings.serve_max_errors - len(screened.refused)
        )
    except TooManyRefused as refused:
        total = refused.refused + len(screened.refused)
        return 413, {"error": str(_too_many_refused(total, settings, counted="at least "))}
    answer: list[dict[str, Any]] = list(screened.refused)
    for r in results:
        if r.unwritten:
            continue
        if r.ok:
            answer.append({"line": r.index, "id": r.id, "created": r.created})
        else:
            answer.append({"line": r.index, "error": r.error})
    answer.sort(key=lambda entry: int(entry["line"]))
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
    if not answer:
        return 400, {"error": "the body has no judgement (an object, an array or JSON Lines)"}
    good = sum(1 for r in results if r.ok)
    status = 200 if good == len(answer) else 207 if good else 422
    return status, answer


def record_for(context: ServeContext, prefix: str) -> tuple[int, Any]:
    if not JUDGEMENT_PREFIX.match(prefix):
        return 400, {"error": "give a judgement id, or a unique prefix of at least 8 of its characters"}
    found = context.storage.ids_with_prefix(prefix, limit=5)
    if not found:
        return 404, {"error": f"no judgement {prefix} (unknown id, or its record expired)"}
    if len(found) > 1:
        return 409, {"error": f"{prefix} is the start of more than one judgement id", "ids": found}
    record = context.runtime.storage.records.get(found[0])
    if record is None:
        return 404, {"error": f"no judgement {prefix} (its record expired)"}
    log = session_log_path(context.runtime.settings.data_dir, record.id)
    return 200, {**record.public(), "session_log": str(log) if log.is_file() else None}


def routes(context: ServeContext) -> list[BaseRoute]:
    async def post_judgements(request: Request) -> JSONResponse:
        try:
            body = await read_limited(request, context.runtime.settings.serve_max_body)
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
