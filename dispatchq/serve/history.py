"""`GET /history`: the last 24 hours the scheduler sampled (`storage.history`), for the page's chart.

    {"now": epoch, "since": epoch, "samples": N, "series": [{"at", "gap", "closed", "answered:code", ...}]}

`series` is per-minute deltas; a minute no scheduler sampled is `{"at", "gap": true}`, and
the page draws it as a gap, never a zero. Read-scoped like `/status` (the token or the read
cookie); one XRANGE of at most 1440 entries, read in a worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from dispatchq.storage.history import HISTORY_SECONDS, series

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime

__all__ = ["history_document", "routes"]


def history_document(runtime: Runtime, now: float) -> dict[str, Any]:
    """The chart's data: the samples of the last 24 hours as per-minute deltas with gaps."""
    points = runtime.storage.history.read(now)
    return {
        "now": now,
        "since": now - HISTORY_SECONDS,
        "samples": len(points),
        "first_sample": points[0].at if points else None,
        "last_sample": points[-1].at if points else None,
        "series": series(points),
    }


def routes(get_runtime: Callable[[], Runtime]) -> list[BaseRoute]:
    async def history(request: Request) -> JSONResponse:
        document = await run_in_threadpool(history_document, get_runtime(), time.time())
        return JSONResponse(document, headers={"Cache-Control": "no-store"})

    return [Route("/history", history, methods=["GET"], name="history")]
