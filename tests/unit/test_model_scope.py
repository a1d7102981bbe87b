"""Which sessions a model's own limit pauses, decided without a server.

A model-scoped marker (`model:opus`, the Opus weekly limit) pauses every kind whose session
runs that model, however the kind names it, and every kind on the account's default model
(the default may be that very model); a kind that names another model runs on. Admission
routes on it (`states_for` and `route`: the judgement waits, or has a credential) and the
spawn re-check reads it (`blocking`); on a pool, the marker of one credential pauses only
that credential.
"""

from __future__ import annotations

import time

import pytest

from dispatchq.pools.credentials import Credential, Pool
from dispatchq.pools.routing import route
from dispatchq.window.marker import Marker, blocking, scope_pausing
from dispatchq.window.pooling import states_for

NOW = time.time()

PAUSED = [None, "opus", "claude-opus-4-5", "Claude-OPUS-4"]
RUNS_ON = ["sonnet", "claude-sonnet-4-5", "haiku"]


def closed(scope: str) -> Marker:
    return Marker(
        scope=scope,
        lifts_at=NOW + 3600,
        state="closed",
        kind="seven_day_opus",
        message="You've hit your Opus limit",
        session="s-1",
        set_at=NOW,
        stated="t",
        refusals=1,
        source="session",
    )


def usable(pool: Pool, markers: list[Marker], model: str | None) -> set[str]:
    """The credentials admission may spawn a session of `model` on, with `markers` up."""
    states = states_for(pool, markers, model, stored={}, usage={}, kind_estimate=None, now=NOW)
    return {c.name for c in route(states, priority=None, kind="k", now=NOW).usable}


ONE = Pool.of_one("CLAUDE_CODE_OAUTH_TOKEN", 1)


@pytest.mark.parametrize("model", PAUSED)
def test_a_model_limit_pauses_that_model_and_the_default_model(model: str | None) -> None:
    opus = closed("model:opus")
    assert blocking([opus], model, NOW) == [opus]
    assert usable(ONE, [opus], model) == set()


@pytest.mark.parametrize("model", RUNS_ON)
def test_a_model_limit_does_not_pause_a_kind_on_another_model(model: str) -> None:
    opus = closed("model:opus")
    assert blocking([opus], model, NOW) == []
    assert usable(ONE, [opus], model) == {"default"}


@pytest.mark.parametrize("model", [*PAUSED, *RUNS_ON])
def test_the_general_limit_pauses_every_model(model: str | None) -> None:
    general = closed("general")
    assert blocking([general], model, NOW) == [general]
    assert usable(ONE, [general], model) == set()


def test_a_lifted_model_marker_pauses_nothing_any_more() -> None:
    lifted = Marker(**{**closed("model:opus").__dict__, "lifts_at": NOW - 1})
    assert blocking([lifted], None, NOW) == [] and blocking([lifted], "opus", NOW) == []
    assert usable(ONE, [lifted], None) == {"default"}


def test_on_a_pool_a_credentials_model_limit_pauses_only_that_credential() -> None:
    pool = Pool((Credential("a", variable="TOKEN_A"), Credential("b", variable="TOKEN_B")))
    b_opus = closed("b/model:opus")
    assert usable(pool, [b_opus], None) == {"a"}  # the default model: not on b
    assert usable(pool, [b_opus], "claude-opus-4-5") == {"a"}
    assert usable(pool, [b_opus], "sonnet") == {"a", "b"}


def test_a_limit_named_its_own_way_closes_the_kinds_model_so_it_pauses_the_kind_that_hit_it() -> None:
    scope = scope_pausing("model:fable", "claude-opus-4-5")
    assert scope == "model:claude-opus-4-5"
    assert usable(ONE, [closed(scope)], "claude-opus-4-5") == set()
    assert usable(ONE, [closed(scope)], None) == set()  # the default model is paused by it too
    assert usable(ONE, [closed(scope)], "sonnet") == {"default"}
