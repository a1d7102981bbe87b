"""The library's comments and docstrings say what the code does and why, never how it got there.

Issue numbers and change history belong to `git log`; in the source they go stale the day
they are written and send a reader to a tracker instead of the code. A reference to another
project's tracker (`anthropics/claude-code #89993`) is evidence about the outside world and
stays.
"""

from __future__ import annotations

import re
from pathlib import Path

import dispatchq

ROOT = Path(dispatchq.__file__).resolve().parent.parent
SOURCES = sorted(
    p
    for folder in ("dispatchq", "jobs")
    for p in (ROOT / folder).rglob("*.py")
    if "__pycache__" not in p.parts
)

HISTORY = re.compile(
    r"\b(issues? #?\d+|task \"[\w-]+\"|appended for|before this change|used to be|"
    r"structure round)\b",
    re.IGNORECASE,
)


def history_lines(text: str) -> list[str]:
    return [f"{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)]


def test_the_pattern_catches_history_and_spares_other_projects_threads() -> None:
    assert history_lines("x = 1  # acknowledged means replicated (issue 21)")
    assert history_lines('"""The rule (Issue #20, the allowlist)."""')
    assert history_lines("# Appended for the host breaker.")
    assert history_lines("A tier used to be spelled out wherever it mattered")
    assert not history_lines("# people ask for it: anthropics/claude-code #89993")
    assert not history_lines("# a judgement no longer in the config fails")


def test_no_issue_numbers_or_change_history_in_the_library() -> None:
    found = {}
    for path in SOURCES:
        if lines := history_lines(path.read_text(encoding="utf-8")):
            found[str(path.relative_to(ROOT))] = lines
    assert not found, f"history belongs to git log, not the source: {found}"
