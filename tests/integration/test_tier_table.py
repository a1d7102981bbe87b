"""A new tier is one row plus its module: a throw-away tier added through the table alone.

The row sits between code and typed. Nothing else in dispatchq is told about it: the ladder
routes to it, the dispatcher queues its batch jobs, a real RQ worker (in-process, burst) runs
its entry point on real Redis, and what it cannot answer moves on up the ladder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import jobs.tiers
from dispatchq.client import Client
from dispatchq.core import entrypoints as entry_names
from dispatchq.core import tiers
from dispatchq.core.kinds import Kind
from dispatchq.core.ladder import entry_tier, next_tier
from dispatchq.process.wiring import get_runtime, set_runtime
from dispatchq.queue.dispatch import Moves
from dispatchq.workers.run import drain
from tests.conftest import write_config

LINT = "lint"


def _serves(kind: Kind) -> bool:
    return kind.name.startswith("lint-")


def lint(ids: Sequence[str]) -> int:
    """The throw-away tier's module and entry point in one: answer `lint-yes`, pass the rest up."""
    runtime = get_runtime()
    claimed = runtime.store.claim(list(ids), LINT)
    moves = Moves()
    for c in claimed:
        kind = runtime.config.kind(c.input["kind"])
        if c.input["state"].get("clean"):
            moves.answer(c.id, LINT, "clean", "the linter says so")
        else:
            state = c.input["state"]
            moves.move_up(c.id, kind, LINT, "the linter cannot tell", host=None, fields={}, state=state)
    runtime.dispatcher.commit(moves)
    return len(claimed)


@pytest.fixture
def lint_tier(monkeypatch: pytest.MonkeyPatch) -> tiers.TierRow:
    code = tiers.row("code")
    row = dataclasses.replace(code, name=LINT, rank=5, serves=_serves, queue="shared")
    monkeypatch.setattr(tiers, "TABLE", (*tiers.TABLE, row))
    # Its one entry point: a function in jobs/tiers.py, named in the fixed table the workers
    # resolve from (derived from the rows when the module loads, so a test adds it by hand).
    monkeypatch.setattr(jobs.tiers, LINT, lint, raising=False)
    monkeypatch.setattr(entry_names, "JOB_FUNCTIONS", {**entry_names.JOB_FUNCTIONS, row.entry_point: LINT})
    return row


def test_a_throw_away_tier_answers_through_the_table(
    lint_tier: tiers.TierRow, make_runtime: Callable[..., Any], dq_env: dict[str, str]
) -> None:
    write_config(
        Path(dq_env["DISPATCHQ_CONFIG"]),
        "kinds:\n  lint-me:\n    escalate: needs-triage\n",
    )
    runtime = make_runtime()
    set_runtime(runtime)
    kind = runtime.config.kind("lint-me")
    assert entry_tier(kind) == LINT and next_tier(kind, LINT) == tiers.NEEDS_TRIAGE
    client = Client(runtime=runtime)
    clean = client.enqueue("lint-me", target="a", state={"clean": True})
    dirty = client.enqueue("lint-me", target="b", state={"clean": False})
    assert runtime.store.get(clean).tier == LINT  # type: ignore[union-attr]
    assert sum(q.count for q in runtime.dispatcher.queues_for(LINT)) == 2  # a job per submit

    drain(runtime, tiers=("code", LINT, "typed"))

    answered, passed_up = runtime.store.get(clean), runtime.store.get(dirty)
    assert answered is not None and (answered.status, answered.value) == ("answered", "clean")
    assert passed_up is not None and passed_up.status == "needs-triage"
    assert [t.tier for t in passed_up.trail][-1] == LINT
