"""`GET /status`: the JSON of `dispatchq status --json`, from the same function.

Collected in a worker thread (the store's client is synchronous), in constant time however
many judgements wait: `collect_status` reads counters and a bounded sample, not records.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from dispatchq.workers.status import collect_status

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime

__all__ = ["routes", "status_json"]


def status_json(runtime: Runtime) -> bytes:
    """`status --json`'s document, encoded as the CLI encodes it (compact)."""
    return json.dumps(collect_status(runtime).as_json(), ensure_ascii=False).encode()


def routes(get_runtime: Callable[[], Runtime]) -> list[BaseRoute]:
    async def status(request: Request) -> Response:
        body = await run_in_threadpool(status_json, get_runtime())
        return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})

    return [Route("/status", status, methods=["GET"], name="status")]
