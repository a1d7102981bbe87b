"""Request bodies read with a limit: refused by Content-Length, or counted while streaming."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

__all__ = ["MAX_BODY", "BodyTooLarge", "read_limited", "read_limited_asgi"]

#: GitHub caps webhook payloads at 25 MB; so does every route here.
MAX_BODY = 25 * 1024 * 1024


class BodyTooLarge(Exception):
    """The body is over the limit (said by its Content-Length, or found while reading it)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over {limit // (1024 * 1024)} MB")
        self.limit = limit


async def read_limited(request: Request, limit: int = MAX_BODY) -> bytes:
    """The whole body, or BodyTooLarge as soon as it is known to exceed `limit`.

    A declared Content-Length over the limit is refused before one byte is read; a body
    that lies about its length (or is chunked) is counted as it streams in, and reading
    stops at the first chunk past the limit.
    """
    return await read_limited_asgi(request.headers, request.receive, limit)


async def read_limited_asgi(headers: Mapping[str, str], receive: Receive, limit: int = MAX_BODY) -> bytes:
    """`read_limited` for a plain ASGI app: `headers` lower-cased, `receive` the ASGI callable."""
    declared = headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise BodyTooLarge(limit)
        except ValueError:
            pass  # the server refuses a malformed length itself
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect  # as `Request.stream` raises it
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
