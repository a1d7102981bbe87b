"""Git helpers and the findings report the checks and record tests start from."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["RECORD_REPORT", "git", "record_git"]


def git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=root,
        capture_output=True,
        check=True,
    )
    return done.stdout.decode()


def record_git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=root,
        capture_output=True,
        check=True,
    )
    return done.stdout.decode()


# --- rule 14 and rule 12 against a store -----------------------------------------------------------------
RECORD_REPORT = """# Review

### [MEDIUM] F-1: first
**Location:** `docs/a.md:2`
**Fix:** needs-decision
**Problem:** one

### [MEDIUM] F-2: second
**Location:** `docs/a.md:1`
**Fix:** needs-decision
**Problem:** two

### [LOW] F-3: third
**Location:** `docs/b.md:1`
**Fix:** needs-decision
**Problem:** three
"""
