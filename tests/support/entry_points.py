"""A user project with its own `jobs` package, for the entry-point tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.helpers import write_config

__all__ = ["user_project"]


def user_project(root: Path, mark: Path) -> None:
    """A project with its own `jobs/` package beside its config: checks in `jobs.mychecks`,
    and a `jobs/tiers.py` that marks and raises when imported."""
    package = root / "jobs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tiers.py").write_text(
        f"import pathlib\npathlib.Path({str(mark)!r}).write_text('imported')\n"
        'raise RuntimeError("the user\'s own jobs.tiers was imported")\n'
    )
    (package / "mychecks.py").write_text(
        textwrap.dedent(
            """
            def is_lockfile(judgement):
                files = (judgement.state or {}).get("conflicts", [])
                if files and all(f.endswith(".lock") for f in files):
                    return {"value": "user-says-rebuild", "reason": "the user's own check"}
                return None
            """
        )
    )
    write_config(
        root / "dispatchq.yaml",
        """
        kinds:
          lock:
            check: jobs.mychecks:is_lockfile
            escalate: needs-triage
        """,
    )
