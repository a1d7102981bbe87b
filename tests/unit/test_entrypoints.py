"""The table of RQ entry points: each name is dispatchq's own function, nothing else resolves."""

from __future__ import annotations

import inspect
import re

import pytest

from dispatchq.core.entrypoints import CALLBACKS, FAILURE_CALLBACK, JOB_FUNCTIONS, TIER_JOB, TIER_OF_JOB
from dispatchq.core.tiers import TIERS
from dispatchq.queue.entrypoints import ENTRY_MODULE_FILE, RefusedEntryPoint, resolve


@pytest.mark.parametrize("name", sorted(JOB_FUNCTIONS))
def test_every_job_name_is_a_function_of_dispatchqs_own_jobs_tiers(name: str) -> None:
    fn = resolve("job", name)
    assert inspect.getsourcefile(fn) == str(ENTRY_MODULE_FILE)
    assert name == f"jobs.tiers.{fn.__name__}"  # the names jobs already in Redis carry


def test_the_failure_callback_resolves_only_as_a_failure_callback() -> None:
    assert resolve("on_failure", FAILURE_CALLBACK).__name__ == "on_job_failure"
    for role in ("job", "on_success", "on_stopped"):
        with pytest.raises(RefusedEntryPoint, match=re.escape(f"refused {role} {FAILURE_CALLBACK!r}")):
            resolve(role, FAILURE_CALLBACK)


@pytest.mark.parametrize("name", ["os.system", "jobs.tiers.nope", "jobs.tiers", "builtins.eval", "", None, 3])
def test_anything_else_is_refused_by_name(name: object) -> None:
    with pytest.raises(RefusedEntryPoint) as caught:
        resolve("job", name)
    assert f"refused job {name!r}" in str(caught.value) and caught.value.name == name


def test_a_tier_job_as_a_callback_is_refused() -> None:
    with pytest.raises(RefusedEntryPoint, match=re.escape(f"allowed: {FAILURE_CALLBACK}")):
        resolve("on_failure", TIER_JOB["code"])
    assert set(CALLBACKS) == {"on_failure", "on_success", "on_stopped"}


def test_every_tier_has_its_job_and_back() -> None:
    assert set(TIER_JOB) == set(TIERS)
    assert {TIER_OF_JOB[name] for name in TIER_JOB.values()} == set(TIERS)
