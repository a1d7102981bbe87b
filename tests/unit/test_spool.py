"""The local spool: an entry written is durable and readable, keyed by claim and outcome."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatchq.storage.spool import Spool, SpoolEntry, spool_dir


def test_an_entry_put_is_read_back_and_removed(tmp_path: Path) -> None:
    spool = Spool(spool_dir(tmp_path))
    assert spool.entries() == []  # no folder yet: nothing spooled
    path = spool.put(SpoolEntry(claim="c1", kind="answer", jid="j1", body={"value": {"label": "bug"}}))
    assert path == tmp_path / "spool" / "c1.answer.json"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    [entry] = spool.entries()
    assert (entry.claim, entry.kind, entry.jid, entry.body) == (
        "c1",
        "answer",
        "j1",
        {"value": {"label": "bug"}},
    )
    assert entry.written > 0
    spool.remove(entry)
    spool.remove(entry)  # twice: harmless (a replay cut off by a crash repeats its last step)
    assert spool.entries() == []
    assert list((tmp_path / "spool").iterdir()) == []  # no temporary file left behind


def test_the_same_claim_and_outcome_is_one_entry_and_another_outcome_is_another(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.put(SpoolEntry(claim="c1", kind="limit", jid="j1", body={"n": 1}, written=1.0))
    spool.put(SpoolEntry(claim="c1", kind="limit", jid="j1", body={"n": 2}, written=2.0))
    spool.put(SpoolEntry(claim="c1", kind="answer", jid="j1", body={}, written=3.0))
    entries = spool.entries()
    assert [(e.kind, e.body) for e in entries] == [("limit", {"n": 2}), ("answer", {})]  # oldest first
    assert len(spool) == 2


def test_a_torn_or_foreign_file_is_skipped_not_raised(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    (tmp_path / "c2.answer.json").write_text('{"claim": "c2", "ki')  # cut off mid-write
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "c3.answer.json").write_text('{"claim": "other", "kind": "answer", "jid": "j"}')  # misnamed
    spool.put(SpoolEntry(claim="c1", kind="answer", jid="j1"))
    assert [e.claim for e in spool.entries()] == ["c1"]


def test_a_name_that_could_leave_the_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a spool entry name"):
        Spool(tmp_path).put(SpoolEntry(claim="../x", kind="answer", jid="j1"))
    assert list(tmp_path.iterdir()) == []
