"""Chunks of judgements written on a thread of their own while the caller prepares the next.

A batch enqueue spends about as long in Python (parsing, validating, content keys) as
Redis spends running the chunk's script. Done one after the other, the two add up;
`ChunkWriter` lets them overlap: the caller hands over a chunk and goes on preparing the
next while this one is written. The thread waits on the socket for most of it, so the
GIL is free for the caller.

Nothing about what is written changes. Chunks go in one at a time and in order (a chunk
is handed to the thread only once the one before it has answered), each is still one
MULTI, and once a chunk fails no later chunk is written: the caller learns which ids went
in (`written`, in input order) and why the rest did not (`error`), exactly as
`Dispatcher.submit` reports it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

__all__ = ["ChunkWriter"]

T = TypeVar("T")
B = TypeVar("B")


class ChunkWriter(Generic[T, B]):
    """Writes chunks in order, one at a time, on one thread; `close` waits for the last.

    `build` makes a chunk's writes in the caller's thread (Python work, no I/O); `send` runs
    them on the writer's thread (mostly waiting on Redis). Keeping the Python on the caller's
    side keeps the two threads from queueing for the GIL behind each other.
    """

    def __init__(
        self, build: Callable[[Sequence[T]], B], send: Callable[[B], list[tuple[str, bool]]]
    ) -> None:
        self._build = build
        self._send = send
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dispatchq-enqueue")
        self._pending: Future[list[tuple[str, bool]]] | None = None
        #: (id, created) of every judgement written so far, in input order.
        self.written: list[tuple[str, bool]] = []
        #: Why a chunk was not written; no chunk after it is.
        self.error: BaseException | None = None

    def put(self, chunk: Sequence[T]) -> None:
        """Write `chunk` once the chunk before it has answered; returns without waiting for it."""
        self._settle()
        if self.error is None and chunk:
            try:
                built = self._build(chunk)
            except Exception as error:  # handed to the caller, which decides
                self.error = error
                return
            self._pending = self._executor.submit(self._send, built)

    def finish(self, chunk: Sequence[T]) -> None:
        """Write the last chunk in the caller's own thread, once the one before it has answered.

        An input of one chunk (a single judgement, a request body) never starts the thread.
        """
        self._settle()
        if self.error is None and chunk:
            try:
                self.written += self._send(self._build(chunk))
            except Exception as error:  # handed to the caller, which decides
                self.error = error

    def close(self) -> None:
        """Wait for the chunk in flight, then stop the thread (if one was started)."""
        try:
            self._settle()
        finally:
            self._executor.shutdown(wait=True)

    def _settle(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            self.written += pending.result()
        except Exception as error:  # handed to the caller, which decides
            self.error = error
