"""`GET /`: the status page, a person's view of `status` that updates itself.

Static HTML, CSS and JS shipped with the package (`dispatchq/serve/static/`, no external
asset: the page works on a closed network). The script fetches `/status` every few
seconds and builds the DOM with `textContent` only, so text from issues, comments and
payloads is shown as text, never run; the Content-Security-Policy forbids inline script
and any other origin besides, should a page ever try.

`GET /judgement/{id}` is one judgement's page (`judgement.html`: its record, its trail and
its session log when one is kept), reading `GET /judgements/{id}` and
`GET /judgements/{id}/log` (the log's last LOG_TAIL bytes, as text: the session's stderr,
which `tiers.session_logs.write_session_log` keeps under the data directory).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from dispatchq.storage.serve import JUDGEMENT_PREFIX
from dispatchq.tiers.session_logs import session_log_path

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime
    from dispatchq.serve.context import ServeContext

__all__ = ["LOG_TAIL", "SECURITY_HEADERS", "STATIC", "judgement_routes", "routes", "session_log_tail"]

#: How much of a session log the judgement's page shows: its end, where the failure is.
LOG_TAIL = 256 * 1024

STATIC = Path(__file__).resolve().parent / "static"

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def routes(get_runtime: Callable[[], Runtime]) -> list[BaseRoute]:
    """The page and its assets; the page reads `/status` (from `dispatchq.serve.status`)."""

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=SECURITY_HEADERS)

    return [
        Route("/", page, methods=["GET"], name="page"),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]


def session_log_tail(context: ServeContext, prefix: str) -> tuple[int, str]:
    """(status, text): the end of a judgement's session log, or why there is none."""
    if not JUDGEMENT_PREFIX.match(prefix):
        return 400, "give a judgement id, or a unique prefix of at least 8 of its characters"
    found = context.storage.ids_with_prefix(prefix, limit=2)
    if len(found) != 1:
        return 404, f"no judgement {prefix}" if not found else f"{prefix} names more than one judgement"
    path = session_log_path(context.runtime.settings.data_dir, found[0])
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - LOG_TAIL))
            data = handle.read()
    except FileNotFoundError:
        return 404, f"judgement {found[0]} has no session log on this host"
    head = f"[... the first {size - LOG_TAIL} bytes are not shown ...]\n" if size > LOG_TAIL else ""
    return 200, head + data.decode("utf-8", "replace")


def judgement_routes(context: ServeContext) -> list[BaseRoute]:
    """One judgement's page and its session log (the record itself is `GET /judgements/{id}`)."""

    async def view(request: Request) -> Response:
        if not JUDGEMENT_PREFIX.match(request.path_params["jid"]):
            return JSONResponse({"error": "not a judgement id"}, status_code=400)
        return FileResponse(STATIC / "judgement.html", media_type="text/html", headers=SECURITY_HEADERS)

    async def log(request: Request) -> Response:
        status, text = await run_in_threadpool(session_log_tail, context, request.path_params["jid"])
        return PlainTextResponse(text, status_code=status, headers={"X-Content-Type-Options": "nosniff"})

    return [
        Route("/judgement/{jid}", view, methods=["GET"], name="judgement-page"),
        Route("/judgements/{jid}/log", log, methods=["GET"], name="session-log"),
    ]
