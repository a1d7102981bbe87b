"""`dispatchq run`'s table keeps ids whole at 100 columns and names only answering tiers."""

from __future__ import annotations

import io

from rich.console import Console

from dispatchq.cli.producer import _table
from dispatchq.core.judgement import Record


def _record(n: int, **fields: object) -> Record:
    base: dict[str, object] = {
        "id": f"{n:02d}3f9c1e7a2b4d6e8f0a1b2c3d4e5f6a7b",
        "kind": "comment-actionable",
        "target": "acme/a-rather-long-repository-name#12345",
        "status": "answered",
        "tier": "typed",
        "value": {"actionable": True, "severity": "this week"},
        "confidence": 0.9312,
        "reason": "inside the local band (0.6): a long enough reason to need folding somewhere",
    }
    base.update(fields)
    return Record.model_validate(base)


def _render(records: list[Record], width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(_table(records))
    return out.getvalue()


def test_ids_stay_whole_at_100_columns() -> None:
    records = [_record(n) for n in range(3)]
    text = _render(records, 100)
    assert all(len(line) <= 100 for line in text.splitlines())
    for r in records:
        assert r.id[:12] in text  # unbroken on one line


def test_needs_triage_is_a_status_not_a_tier() -> None:
    text = _render([_record(1, status="needs-triage", tier="needs-triage", value=None, confidence=None)], 100)
    row = next(line for line in text.splitlines() if "needs-triage" in line)
    assert row.count("needs-triage") == 1
