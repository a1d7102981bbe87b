"""The unit layer: no server, no subprocess (fakeredis is allowed).

Enforced rather than hoped for: a unit test that starts a process fails here, so the
layer stays fast and a test that needs the real thing moves to `tests/integration/`.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from dispatchq.launcher import sandbox


@pytest.fixture(autouse=True)
def no_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("unit tests start no process: move this test to tests/integration/")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


@pytest.fixture(autouse=True)
def no_bwrap_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """`bwrap --ro-bind / / true` is a process: a unit test's worker (heartbeat facts) must not
    run it on a host that has bubblewrap. The real check is tested in tests/integration/."""
    monkeypatch.setattr(sandbox, "bwrap_check", lambda path_var: "bwrap not checked in the unit layer")
