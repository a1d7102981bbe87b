"""A lint tier added to the tier table for the tier-table tests."""

from __future__ import annotations

from collections.abc import Sequence

from dispatchq.core.kinds import Kind
from dispatchq.process.wiring import get_runtime
from dispatchq.queue.dispatch import Moves

__all__ = ["LINT", "lint", "serves"]


LINT = "lint"


def serves(kind: Kind) -> bool:
    return kind.name.startswith("lint-")


def lint(ids: Sequence[str]) -> int:
    """The throw-away tier's module and entry point in one: answer `lint-yes`, pass the rest up."""
    runtime = get_runtime()
    claimed = runtime.storage.records.claim(list(ids), LINT)
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
