"""A judgement whose session was cut off under one credential and goes on under another: what
its next run resumes, and what its trail says.

A backend whose transcripts live in the judgement's own config folder (`claude`) resumes the
same session under the new credential; one whose transcripts stay with the login starts fresh.
Either way the trail names both credentials; a run under the same credential says nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dispatchq.backends.claude import ClaudeBackend
from dispatchq.core.judgement import Record
from dispatchq.pools.credentials import Credential
from dispatchq.tiers.session import _Attempt

SID = "0f0e5c0e-8a0b-4c9e-9d51-2f6f0c4c1a11"


def attempt(on: str, *, before: str | None, resume: str | None, follows: bool = True) -> _Attempt:
    fields: dict[str, Any] = {"id": "j1", "kind": "ask", "target": "t", "status": "running"}
    if before is not None:
        fields["credential"] = before
    if resume is not None:
        fields["resume_session"] = resume
    backend = replace(ClaudeBackend(), resumes_across_credentials=follows)
    nothing: Any = None
    return _Attempt(nothing, nothing, Record(**fields), nothing, nothing, {}, Credential(name=on), backend)


@pytest.mark.parametrize(
    ("on", "before", "resume", "follows", "resumes", "says"),
    [
        ("team-b", "team-a", SID, True, SID, "resumed on team-b after a cut-off on team-a"),
        ("team-b", "team-a", SID, False, None, "started fresh on team-b after a cut-off on team-a"),
        ("team-a", "team-a", SID, False, SID, None),  # the same credential: its own transcript
        ("team-b", None, SID, True, SID, None),  # a run from before credentials were recorded
        ("team-b", "team-a", None, True, None, None),  # nothing to resume: a fresh judgement
    ],
)
def test_what_a_run_after_a_cut_off_resumes_and_says(
    on: str, before: str | None, resume: str | None, follows: bool, resumes: str | None, says: str | None
) -> None:
    run = attempt(on, before=before, resume=resume, follows=follows)
    assert run.resume == resumes
    assert run.moved == says
