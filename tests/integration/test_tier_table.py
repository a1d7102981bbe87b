"""A new tier is one row plus its module: a throw-away tier added through the table alone.

The row sits between code and typed. Nothing else in dispatchq is told about it: the ladder
routes to it, the dispatcher queues its batch jobs, a real RQ worker (in-process, burst) runs
its entry point on real Redis, and what it cannot answer moves on up the ladder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dispatchq.client import Client
from dispatchq.core import tiers
from dispatchq.core.ladder import entry_tier, next_tier
from dispatchq.process.wiring import set_runtime
from dispatchq.workers.run import drain
from tests.support.helpers import write_config
from tests.support.tier_table import LINT


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
    assert runtime.storage.records.get(clean).tier == LINT  # type: ignore[union-attr]
    assert sum(q.count for q in runtime.dispatcher.queues_for(LINT)) == 2  # a job per submit

    drain(runtime, tiers=("code", LINT, "typed"))

    answered, passed_up = runtime.storage.records.get(clean), runtime.storage.records.get(dirty)
    assert answered is not None and (answered.status, answered.value) == ("answered", "clean")
    assert passed_up is not None and passed_up.status == "needs-triage"
    assert [t.tier for t in passed_up.trail][-1] == LINT
