"""A webhook body received and verified as it streams, held in memory only while it is small.

Whoever reaches the port can send a body up to `DISPATCHQ_SERVE_MAX_BODY` (25 MB at most)
before the signature says whether it is GitHub's; held whole in memory, a few hundred slow
senders would cost gigabytes. So `receive_signed` updates the HMAC-SHA256 over each chunk as
it arrives and keeps only the first `SPOOL_MEMORY` bytes in memory; past that, the body goes
to a file in a private folder (`Spool`, mode 0700, on disk by default: inside the data dir),
deleted as soon as the request is done with it, whatever its end. Memory is then bounded by
the requests in flight times a small buffer, not times the body cap.

Nothing is parsed here, and only a body whose signature matched (compared in constant time
once the last chunk is in) is returned, read back whole: then it is GitHub's.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from starlette.requests import ClientDisconnect
from starlette.types import Receive

from dispatchq.serve.body import REFUSALS, BodyTooLarge

__all__ = ["SPOOL_MEMORY", "STALE_AFTER", "Spool", "Unsigned", "receive_signed"]

#: The most of one body kept in memory while it streams; the rest goes to the spool.
SPOOL_MEMORY = 64 * 1024
#: A spooled file older than this was left by a process that died mid-request: removed.
STALE_AFTER = 3600.0

_NOT_ASCII = "X-Hub-Signature-256 is not ASCII (it is sha256= and 64 hex digits)"
_NO_MATCH = "X-Hub-Signature-256 is missing or does not match the webhook secret"


class Unsigned(Exception):
    """The body arrived but its signature is not the secret's: (HTTP status, the reason)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class Spool:
    """The private folder streamed bodies are written to; made (0700) when first needed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._ready = False

    def open(self) -> IO[bytes]:
        """A new file for one body, readable by this user only; the caller deletes it."""
        if not self._ready:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.folder, 0o700)  # a folder made before, or under another umask
            self._sweep()
            self._ready = True
        return tempfile.NamedTemporaryFile(  # closed and deleted by `receive_signed`
            mode="w+b", dir=self.folder, prefix="webhook-", suffix=".body", delete=False
        )

    def _sweep(self) -> None:
        """Remove what a process killed mid-request left: never a file still being written."""
        cutoff = time.time() - STALE_AFTER
        for path in self.folder.glob("webhook-*.body"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()


def _declared_over(headers: Mapping[str, str], limit: int) -> bool:
    try:
        return int(headers.get("content-length", "")) > limit
    except ValueError:
        return False  # none, or malformed: the server refuses a malformed length itself


def _check(headers: Mapping[str, str], digest: str) -> None:
    signature = headers.get("x-hub-signature-256", "")
    if not signature.isascii():
        raise Unsigned(400, _NOT_ASCII)
    if not hmac.compare_digest(f"sha256={digest}".encode(), signature.encode()):
        raise Unsigned(401, _NO_MATCH)


async def receive_signed(
    headers: Mapping[str, str], receive: Receive, *, secret: str, limit: int, spool: Spool
) -> bytes:
    """The whole body once its signature matched; else `Unsigned`, `BodyTooLarge` or
    `ClientDisconnect` (as `body.read_limited_asgi` raises them), and no file left behind.

    `headers` are lower-cased; the signature is read only after the last chunk, so an
    oversized body is a 413 whatever it claims to be.
    """
    if _declared_over(headers, limit):
        REFUSALS["body_too_large"] += 1  # `Bounds` never sees this one: no byte is read
        raise BodyTooLarge(limit)
    mac = hmac.new(secret.encode(), digestmod=hashlib.sha256)
    held = bytearray()
    spooled: IO[bytes] | None = None
    size = 0
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:  # only without `Bounds` (or a smaller limit): it refuses such a chunk first
                REFUSALS["body_too_large"] += 1
                raise BodyTooLarge(limit)
            mac.update(chunk)
            if spooled is None and len(held) + len(chunk) > SPOOL_MEMORY:
                spooled = spool.open()
                spooled.write(held)
                held = bytearray()
            if spooled is not None:
                spooled.write(chunk)  # into the page cache: microseconds, not worth a thread
            else:
                held += chunk
            if not message.get("more_body", False):
                break
        _check(headers, mac.hexdigest())
        if spooled is None:
            return bytes(held)
        spooled.seek(0)
        return spooled.read()
    finally:
        if spooled is not None:
            spooled.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(spooled.name)
