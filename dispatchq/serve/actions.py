"""The page's actions as write routes: the window closed or opened, a retry, a cancel, a host unblocked.

    POST /actions/window/close  {"until": "2h30m" | ISO 8601 instant, "reason": str, "force": bool}
    POST /actions/window/open   {}
    POST /actions/hosts/unblock {"host": str}
    POST /actions/judgements/{id}/retry   {}
    POST /actions/judgements/{id}/cancel  {}

Each calls what the CLI command calls (`rt.window.close/open`, `unblock_host`, the
dispatcher's `retry`/`cancel`), with its rules: a close never shortens a longer marker
without `force` (as `dispatchq window close`), a write command asks Redis for room first
(`require_room`), and the window's audit names who acted (`serve <peer>`, where the CLI
names the user). The answer is JSON: `{"ok": true, ...}`, or a 4xx whose `error` says what
was wrong. `guard.AccessLog` writes the line every write gets. The bearer token or the
page's write cookie (`auth`) opens these routes; with no token, the Host and Origin rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from dispatchq.core.until import LONGEST_CLOSE, TooFar, duration, within_reach
from dispatchq.errors import UserError
from dispatchq.serve.body import BodyTooLarge, read_limited
from dispatchq.serve.guard import Networks, peer_address
from dispatchq.serve.jsonbody import BadJSON, read_json
from dispatchq.storage.serve import JUDGEMENT_PREFIX
from dispatchq.tiers.session import unblock_host
from dispatchq.window.messages import GENERAL_SCOPE

if TYPE_CHECKING:
    from dispatchq.serve.context import ServeContext

__all__ = ["LONGEST_CLOSE", "ActionError", "parse_until", "routes"]

#: An action's body is a handful of fields.
_MAX_BODY = 16 * 1024
#: ... and nests no deeper than this: a field is text, a flag or nothing.
_MAX_DEPTH = 4
#: The furthest a close may reach: a year (a usage limit lifts within a week; an operator's
#: reservation past a year is a typo, and past year 9999 Python's datetime cannot say it).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class ActionError(Exception):
    """A request the action refuses: its HTTP status and the one line that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_until(text: object, now: datetime) -> datetime:
    """`2h30m` (from now) or an ISO 8601 instant with its offset (the page sends its local
    time with the offset; a time without one would be read in the server's zone, a guess)."""
    if not isinstance(text, str) or not text.strip():
        raise ActionError(400, '"until" is required: a duration (2h30m) or an ISO 8601 instant')
    text = text.strip()
    try:
        span = duration(text)
    except TooFar as error:
        raise ActionError(400, f'"until": {error}') from None
    if span is not None:
        return now + span
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if when.tzinfo is None:
            raise ActionError(
                400, f'"until": {text[:60]!r} has no UTC offset (give e.g. 2026-12-02T18:00+01:00)'
            )
        when = when.astimezone(UTC)  # 9999-12-31T23:00-05:00 is past the last year datetime has
    except (ValueError, OverflowError):
        raise ActionError(
            400, f'"until": {text[:60]!r} is not a duration (2h30m) or an ISO 8601 instant'
        ) from None
    try:
        return within_reach(text, when, now)
    except TooFar as error:
        raise ActionError(400, f'"until": {error}') from None


def _room(context: ServeContext) -> None:
    """`require_room`, as the CLI asks before a command's first write: a full Redis is 503."""
    try:
        context.runtime.storage.server.require_room()
    except UserError as error:
        raise ActionError(503, str(error)) from None


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def close_window(context: ServeContext, fields: dict[str, Any], who: str) -> dict[str, Any]:
    """`dispatchq window close --until --reason [--force]`, refusing to shorten without force."""
    rt = context.runtime
    now = datetime.now(UTC)
    when = parse_until(fields.get("until"), now)
    if when <= now:
        raise ActionError(400, f'"until": {when.isoformat()} is in the past')
    reason = fields.get("reason") or ""
    if not isinstance(reason, str) or len(reason) > 500 or _CONTROL.search(reason):
        raise ActionError(400, '"reason" must be one line of text of at most 500 characters')
    face = rt.window
    current = face.get(GENERAL_SCOPE)
    if current is not None and current.lifts_at > when.timestamp() and fields.get("force") is not True:
        raise ActionError(
            409,
            f"the window is already closed until {_utc(current.lifts_at)} "
            f"({current.message or current.kind}); "
            'send "force": true to replace it with the earlier time',
        )
    _room(context)
    marker = face.close(when, reason=reason or "closed by an operator", who=who)
    return {"ok": True, "closed_until_epoch": marker.lifts_at, "closed_until": _utc(marker.lifts_at)}


def open_window(context: ServeContext, fields: dict[str, Any], who: str) -> dict[str, Any]:
    """`dispatchq window open`: every marker removed, what waited on them released."""
    _room(context)
    return {"ok": True, "opened": context.runtime.window.open(who=who)}


def unblock(context: ServeContext, fields: dict[str, Any], who: str) -> dict[str, Any]:
    """`dispatchq window open --host NAME`: a host's block cleared, what it held released."""
    host = fields.get("host")
    if not isinstance(host, str) or not _HOST.fullmatch(host):
        raise ActionError(400, '"host" must be a host name (letters, digits, ".", "_", "-")')
    _room(context)
    cleared = unblock_host(context.runtime.window, host)
    return {"ok": True, "host": host, "was_blocked": cleared}


def _judgement(context: ServeContext, prefix: str) -> str:
    """The one id `prefix` names (as `dispatchq retry ID` reads a unique prefix)."""
    if not JUDGEMENT_PREFIX.match(prefix):
        raise ActionError(400, "give a judgement id, or a unique prefix of at least 8 of its characters")
    found = context.storage.ids_with_prefix(prefix, limit=5)
    if not found:
        raise ActionError(404, f"no judgement {prefix} (unknown id, or its record expired)")
    if len(found) > 1:
        raise ActionError(409, f"{prefix} is the start of more than one judgement id")
    return found[0]


def retry(context: ServeContext, jid: str) -> dict[str, Any]:
    """`dispatchq retry ID`: judged again from the kind's first tier, the trail kept."""
    _room(context)
    full = _judgement(context, jid)
    context.runtime.dispatcher.retry(full)
    return {"ok": True, "id": full, "requeued": True}


def cancel(context: ServeContext, jid: str) -> dict[str, Any]:
    """`dispatchq cancel ID`: a judgement not yet finished is not spawned or answered."""
    full = _judgement(context, jid)
    if not context.runtime.dispatcher.cancel(full):
        raise ActionError(409, f"judgement {full} has already finished")
    return {"ok": True, "id": full, "cancelled": True}


async def _fields(request: Request) -> dict[str, Any]:
    try:
        body = await read_limited(request, _MAX_BODY)
    except BodyTooLarge:
        raise ActionError(413, f"an action's body is at most {_MAX_BODY // 1024} KB") from None
    if not body.strip():
        return {}
    try:
        fields = read_json(body, depth=_MAX_DEPTH)
    except BadJSON as bad:
        hint = " (send an object, or nothing)" if bad.status == 400 else ""
        raise ActionError(bad.status, f"{bad}{hint}") from None
    if not isinstance(fields, dict):
        raise ActionError(400, "the body must be a JSON object")
    return fields


def routes(context: ServeContext, trusted: Networks) -> list[BaseRoute]:
    """The action routes; `trusted` are the proxies whose X-Forwarded-For names the peer."""

    def window_action(act: Callable[[ServeContext, dict[str, Any], str], dict[str, Any]]) -> Any:
        async def endpoint(request: Request) -> JSONResponse:
            async def run() -> dict[str, Any]:
                fields = await _fields(request)
                who = f"serve {peer_address(request.scope, trusted)}"
                return await run_in_threadpool(act, context, fields, who)

            return await _answer(run)

        return endpoint

    def judgement_action(act: Callable[[ServeContext, str], dict[str, Any]]) -> Any:
        async def endpoint(request: Request) -> JSONResponse:
            async def run() -> dict[str, Any]:
                await _fields(request)  # an empty body or {}: anything else is said, not ignored
                return await run_in_threadpool(act, context, request.path_params["jid"])

            return await _answer(run)

        return endpoint

    return [
        Route("/actions/window/close", window_action(close_window), methods=["POST"]),
        Route("/actions/window/open", window_action(open_window), methods=["POST"]),
        Route("/actions/hosts/unblock", window_action(unblock), methods=["POST"]),
        Route("/actions/judgements/{jid}/retry", judgement_action(retry), methods=["POST"]),
        Route("/actions/judgements/{jid}/cancel", judgement_action(cancel), methods=["POST"]),
    ]


async def _answer(run: Callable[[], Any]) -> JSONResponse:
    """The action's JSON, or its refusal as a 4xx with the reason (a UserError is the CLI's
    one-line refusal: 404 for a judgement gone since, 409 for one in the wrong state)."""
    try:
        return JSONResponse(await run())
    except ActionError as error:
        return JSONResponse({"error": str(error)}, status_code=error.status)
    except UserError as error:
        text = str(error)
        return JSONResponse({"error": text}, status_code=404 if text.startswith("no judgement") else 409)
