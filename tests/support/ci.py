"""A test that cannot run on this machine: a loud skip on a developer's, a failure under `CI=true`.

CI is where the security tests must run: a skip there would pass a build whose sandbox, scrub or
non-dumpable flag nobody checked. So every "cannot run here" of such a test goes through
`cannot_run`, which names the reason either way.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

__all__ = ["cannot_run", "on_ci", "require_bwrap"]


def on_ci() -> bool:
    """Is this a CI run (`CI=true`, as CI services set it)?"""
    return os.environ.get("CI") == "true"


def cannot_run(reason: str) -> NoReturn:
    """Fail under `CI=true`, skip loudly elsewhere; `reason` says what is missing and how to get it."""
    if on_ci():
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(f"SKIPPED LOUDLY: {reason}")


def require_bwrap() -> None:
    """The test needs bubblewrap on PATH."""
    if shutil.which("bwrap") is None:
        cannot_run("bubblewrap is not installed here (ops/dev.py installs it with apt-get)")
