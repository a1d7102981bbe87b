"""The tier table is the one place a tier is described: everything else must agree with it."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from dispatchq.core import tiers
from dispatchq.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_the_tier_literal_names_exactly_the_rows() -> None:
    assert typing.get_args(tiers.Tier) == tiers.TIERS
    assert [r.name for r in tiers.TABLE] == [r.name for r in tiers.ladder()]  # cheapest first
    assert len({r.rank for r in tiers.TABLE}) == len(tiers.TABLE)


def test_needs_triage_is_a_rung_not_a_tier() -> None:
    assert tiers.NEEDS_TRIAGE not in tiers.TIERS
    assert tiers.NEEDS_TRIAGE in typing.get_args(typing.get_args(tiers.Rung)[-1])
    assert tiers.row_of(tiers.NEEDS_TRIAGE) is None
    assert tiers.row_of(None) is None and tiers.row_of("a-retired-tier") is None  # old records
    assert tiers.rank(tiers.NEEDS_TRIAGE) > max(r.rank for r in tiers.TABLE)
    with pytest.raises(KeyError, match="no tier named 'needs-triage'"):
        tiers.row(tiers.NEEDS_TRIAGE)


@pytest.mark.parametrize("row", tiers.TABLE, ids=lambda r: r.name)
def test_each_row_names_a_real_timeout_entry_point_and_procfile_line(row: tiers.TierRow) -> None:
    assert row.timeout in Settings.model_fields, f"{row.name}: no setting {row.timeout}"
    module = ast.parse((ROOT / "jobs" / "tiers.py").read_text())
    functions = {n.name for n in module.body if isinstance(n, ast.FunctionDef)}
    assert row.entry_point.removeprefix("jobs.tiers.") in functions
    procfile = (ROOT / "Procfile").read_text().splitlines()
    assert any(line.split(":", 1)[1].split() == ["dispatchq", "worker", row.name] for line in procfile)


def test_the_window_is_spent_only_where_the_line_admits() -> None:
    # A tier that spends the usage window must go through the window's admission (the line).
    for row in tiers.TABLE:
        if row.spends_window:
            assert row.admission == "line" and row.worker == "session"
    assert tiers.automatic_tiers() == ("code", "typed")
    assert tiers.batch_tiers() == ("code", "typed")
