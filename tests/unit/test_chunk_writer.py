"""`ChunkWriter`: chunks built in the caller's thread, sent one at a time and in order on the
writer's, and nothing sent after a chunk that failed (no Redis: `build` and `send` are stand-ins)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from dispatchq.queue.writer import ChunkWriter


class Recorder:
    """A `build` and a `send` that note which thread ran them and what they were given."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.fail_on = fail_on
        self.built: list[tuple[list[int], int]] = []  # (chunk, thread id)
        self.sent: list[tuple[list[int], int]] = []
        self._in_flight = 0
        self.most_in_flight = 0
        self._lock = threading.Lock()

    def build(self, chunk: Sequence[int]) -> list[int]:
        self.built.append((list(chunk), threading.get_ident()))
        return list(chunk)

    def send(self, chunk: list[int]) -> list[tuple[str, bool]]:
        with self._lock:
            self._in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self._in_flight)
        try:
            self.sent.append((chunk, threading.get_ident()))
            if self.fail_on is not None and chunk[0] == self.fail_on:
                raise ConnectionError("Redis went away")
            return [(f"id-{n}", n % 2 == 0) for n in chunk]
        finally:
            with self._lock:
                self._in_flight -= 1


def test_chunks_are_built_here_sent_there_in_order_and_the_last_in_the_callers_thread() -> None:
    rec = Recorder()
    writer = ChunkWriter(rec.build, rec.send)
    try:
        writer.put([1, 2])
        writer.put([3, 4])
        writer.finish([5])
    finally:
        writer.close()
    me = threading.get_ident()
    assert [chunk for chunk, _ in rec.built] == [[1, 2], [3, 4], [5]]
    assert {thread for _, thread in rec.built} == {me}  # the Python work stays with the caller
    assert [chunk for chunk, _ in rec.sent] == [[1, 2], [3, 4], [5]]
    assert [thread != me for _, thread in rec.sent] == [True, True, False]
    assert rec.most_in_flight == 1
    assert writer.written == [(f"id-{n}", n % 2 == 0) for n in range(1, 6)]
    assert writer.error is None


@pytest.mark.parametrize("last", ["put", "finish"])
def test_nothing_is_built_or_sent_after_a_chunk_that_failed(last: str) -> None:
    rec = Recorder(fail_on=3)
    writer = ChunkWriter(rec.build, rec.send)
    try:
        writer.put([1, 2])
        writer.put([3, 4])  # fails on the writer's thread
        writer.put([5, 6])  # learns of it here: neither built nor sent
        getattr(writer, last)([7])
    finally:
        writer.close()
    assert [chunk for chunk, _ in rec.sent] == [[1, 2], [3, 4]]
    assert [chunk for chunk, _ in rec.built] == [[1, 2], [3, 4]]
    assert writer.written == [("id-1", False), ("id-2", True)]
    assert isinstance(writer.error, ConnectionError)


def test_a_chunk_that_cannot_be_built_stops_the_rest_like_a_failed_send() -> None:
    rec = Recorder()

    def build(chunk: Sequence[int]) -> list[int]:
        if chunk[0] == 3:
            raise ValueError("cannot be made")
        return rec.build(chunk)

    writer = ChunkWriter(build, rec.send)
    try:
        writer.put([1])
        writer.put([3])
        writer.finish([4])
    finally:
        writer.close()
    assert [chunk for chunk, _ in rec.sent] == [[1]]
    assert writer.written == [("id-1", False)]
    assert isinstance(writer.error, ValueError)
