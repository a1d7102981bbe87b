"""`GET /`: the status page, a person's view of `status` that updates itself.

Static HTML, CSS and JS shipped with the package (`dispatchq/serve/static/`, no external
asset: the page works on a closed network). The script fetches `/status` every few
seconds and builds the DOM with `textContent` only, so text from issues, comments and
payloads is shown as text, never run; the Content-Security-Policy forbids inline script
and any other origin besides, should a page ever try.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime

__all__ = ["SECURITY_HEADERS", "STATIC", "routes"]

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
