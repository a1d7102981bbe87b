"""What the store tests share: the result TTL they set, a record to create, and a fixed clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from dispatchq.storage.store import NewRecord, Store

__all__ = ["TTL", "clock", "enqueue_at", "new_record"]


TTL = 1234


def new_record(
    jid: str,
    *,
    tier: str,
    ckey: str = "",
    line: str = "",
    job: str = "",
    force: bool = False,
    target: str = "",
) -> NewRecord:
    """A record as `create_many` takes it: content key `ck-<id>` unless given, kind `k`."""
    fields = {
        "id": jid,
        "content_key": ckey or f"ck-{jid}",
        "force": "1" if force else "0",
        "line": line,
        "input": json.dumps({"kind": "k", "target": target or f"t/{jid}"}),
        "tier": tier,
        "effect": "local",
        "job": job,
    }
    return NewRecord(**{name: fields.get(name, "") for name in NewRecord._fields})


@contextmanager
def clock(monkeypatch: pytest.MonkeyPatch, at: float) -> Iterator[None]:
    """The clock reads `at` inside the block (enqueue times and a read's instant set on purpose)."""
    with monkeypatch.context() as patched:
        patched.setattr("time.time", lambda: at)
        yield


def enqueue_at(store: Store, monkeypatch: pytest.MonkeyPatch, at: float, entries: list[NewRecord]) -> None:
    """Create `entries` as if at `at`; every one must be new."""
    with clock(monkeypatch, at):
        created = store.create_many(entries)
    assert created is not None and all(new for _, new in created)
