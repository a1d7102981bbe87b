"""A fixer's answer replayed from the spool is graded only under the repository lock.

The job that took the lock is gone by then (its host's session worker replays the answer),
and so is its keeper: the lock lapses within its lease, and another fixer may hold the
repository when the replay comes. Grading then would take that fixer's edits for this one's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import uuid4

import pytest

from dispatchq.findings.run.fixer import FixerJob, RepoLock
from dispatchq.window.limits import SessionOutcome

REPO = "dq-test-replay-repo"


class _State:
    """An attempt's state as `after_session` reads and writes it."""

    def __init__(self, phase: str) -> None:
        self.fields: dict[str, Any] = {"phase": phase}
        self.saved: list[dict[str, Any]] = []

    def load(self) -> dict[str, Any]:
        return dict(self.fields)

    def save(self, **fields: Any) -> None:
        self.fields.update(fields)
        self.saved.append(fields)


def _replaying(runtime: Any, jid: str, graded: list[str]) -> FixerJob:
    """A fixer job as the replay builds it: its attempt dispatched, its lock not kept here."""
    job = object.__new__(FixerJob)
    job.lock = RepoLock(runtime, REPO, jid)
    job.state = _State("dispatched")  # type: ignore[assignment]
    job.log = lambda text: graded.append(f"log: {text}")  # type: ignore[method-assign,assignment,return-value]
    job._after = lambda own, outcome, result: graded.append("graded")  # type: ignore[method-assign]
    return job


def test_the_holders_lock_left_by_a_job_that_is_gone_is_held_again(make_runtime: Callable[..., Any]) -> None:
    runtime, jid = make_runtime(), uuid4().hex
    assert runtime.storage.findings.repo_lock(REPO, f"j:{jid}").take(30)  # the job's, kept nowhere
    assert RepoLock(runtime, REPO, jid).hold()
    assert not runtime.storage.findings.repo_lock(REPO, "j:J-other").take(30)


def test_another_fixers_lock_is_not_taken(make_runtime: Callable[..., Any]) -> None:
    runtime = make_runtime()
    assert runtime.storage.findings.repo_lock(REPO, "j:J-other").take(30)
    assert not RepoLock(runtime, REPO, uuid4().hex).hold()


def test_a_replayed_answer_is_not_graded_while_another_fixer_holds_the_repository(
    make_runtime: Callable[..., Any],
) -> None:
    runtime = make_runtime()
    other = runtime.storage.findings.repo_lock(REPO, "j:J-other")
    assert other.take(30)
    graded: list[str] = []
    job = _replaying(runtime, uuid4().hex, graded)
    job.after_session(SessionOutcome(kind="answer", text="done"), None)
    assert "graded" not in graded
    assert job.state.saved == [{"phase": "unknown"}]  # type: ignore[attr-defined]
    assert not runtime.storage.findings.repo_lock(REPO, "j:J-third").take(30)  # still the other's
    assert other.renew(30)


@pytest.mark.parametrize("taken_before", [True, False])
def test_a_replayed_answer_is_graded_under_the_lock_then_frees_it(
    make_runtime: Callable[..., Any], taken_before: bool
) -> None:
    runtime, jid = make_runtime(), uuid4().hex
    if taken_before:  # the job took it and died; its lease has not lapsed yet
        assert runtime.storage.findings.repo_lock(REPO, f"j:{jid}").take(30)
    graded: list[str] = []
    _replaying(runtime, jid, graded).after_session(SessionOutcome(kind="answer", text="done"), None)
    assert graded == ["graded"]
    assert runtime.storage.findings.repo_lock(REPO, "j:J-next").take(30)  # released after grading
