"""Checks the tests name in configs (`tests.support.checks:noop`), importable wherever they run.

Not the example checks (`examples/checks.py`, loaded from the examples' own folder), and
not in the `jobs` package, which is dispatchq's RQ entry points only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NOT_CALLABLE", "noop"]

#: Something a check may not name: it is not callable.
NOT_CALLABLE = ("poetry.lock",)


def noop(judgement: Any) -> Any:
    """Answers at once with the target."""
    return judgement.target
