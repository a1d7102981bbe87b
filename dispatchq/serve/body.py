"""Request bodies read with a limit: refused by Content-Length, or counted while streaming."""

from __future__ import annotations

from starlette.requests import Request

__all__ = ["MAX_BODY", "BodyTooLarge", "read_limited"]

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
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise BodyTooLarge(limit)
        except ValueError:
            pass  # the server refuses a malformed length itself
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)
