"""A webhook body verified as it streams (`dispatchq.serve.stream.receive_signed`): the HMAC over
the chunks decides, a large body goes through a private spool file that is gone afterwards
whatever the outcome, and a small one never touches the disk."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from dispatchq.serve.body import BodyTooLarge
from dispatchq.serve.stream import SPOOL_MEMORY, Spool, Unsigned, receive_signed

SECRET = "a-webhook-secret-of-thirty-two-chars!"


def _signature(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WatchedSpool(Spool):
    """A spool that remembers the files it handed out."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.opened: list[Path] = []

    def open(self) -> IO[bytes]:
        handle = super().open()
        self.opened.append(Path(handle.name))
        return handle


def _chunks(body: bytes, size: int = 16 * 1024) -> Iterator[dict[str, Any]]:
    for start in range(0, len(body), size):
        yield {
            "type": "http.request",
            "body": body[start : start + size],
            "more_body": start + size < len(body),
        }


def _receive(body: bytes) -> Any:
    messages = _chunks(body)

    async def receive() -> dict[str, Any]:
        return next(messages)

    return receive


def _run(body: bytes, signature: str, spool: Spool, limit: int = 10 * 1024 * 1024) -> bytes:
    headers = {"x-hub-signature-256": signature}
    return asyncio.run(receive_signed(headers, _receive(body), secret=SECRET, limit=limit, spool=spool))


def test_a_large_body_with_the_right_signature_is_returned_whole_and_its_file_removed(tmp_path: Path) -> None:
    spool = WatchedSpool(tmp_path / "spool")
    body = b'{"pad": "' + b"y" * (3 * SPOOL_MEMORY) + b'"}'
    assert _run(body, _signature(body), spool) == body
    assert len(spool.opened) == 1 and not spool.opened[0].exists()
    assert stat.S_IMODE((tmp_path / "spool").stat().st_mode) == 0o700


@pytest.mark.parametrize("size", [100, 3 * SPOOL_MEMORY])
def test_a_wrong_signature_is_401_and_leaves_no_file(tmp_path: Path, size: int) -> None:
    spool = WatchedSpool(tmp_path / "spool")
    body = b"z" * size
    with pytest.raises(Unsigned) as refused:
        _run(body, _signature(body, "another secret"), spool)
    assert refused.value.status == 401
    assert all(not path.exists() for path in spool.opened)
    assert len(spool.opened) == (1 if size > SPOOL_MEMORY else 0)  # a small body stays in memory


def test_a_body_changed_in_one_byte_does_not_verify(tmp_path: Path) -> None:
    body = b"q" * (2 * SPOOL_MEMORY)
    signature = _signature(body)
    with pytest.raises(Unsigned) as refused:
        _run(body[:-1] + b"r", signature, Spool(tmp_path / "spool"))
    assert refused.value.status == 401


def test_a_non_ascii_signature_is_400_and_an_oversized_body_is_refused_before_the_signature(
    tmp_path: Path,
) -> None:
    spool = WatchedSpool(tmp_path / "spool")
    with pytest.raises(Unsigned) as refused:
        _run(b"{}", "sha256=\u00e9", spool)
    assert refused.value.status == 400
    body = b"w" * (3 * SPOOL_MEMORY)
    with pytest.raises(BodyTooLarge):
        _run(body, _signature(body), spool, limit=2 * SPOOL_MEMORY)
    assert spool.opened and all(not path.exists() for path in spool.opened)


def test_a_stale_file_left_by_a_dead_process_is_swept_and_a_fresh_one_kept(tmp_path: Path) -> None:
    folder = tmp_path / "spool"
    folder.mkdir()
    stale, fresh = folder / "webhook-old.body", folder / "webhook-new.body"
    stale.write_bytes(b"old")
    fresh.write_bytes(b"new")
    os.utime(stale, (0, 0))
    body = b"v" * (2 * SPOOL_MEMORY)
    assert _run(body, _signature(body), Spool(folder)) == body
    assert not stale.exists() and fresh.exists()
