"""The flags every git child gets, so repository or user config cannot turn a read into a run.

Its own module, free of I/O, because two rooms build git argv lists: the runner
(`dispatchq.git.runner`) and the decision record's read-only plan checks
(`dispatchq.findings.grammar.plans`), which are pure and may not import the runner.
"""

from __future__ import annotations

__all__ = ["GIT_HARDENING"]

GIT_HARDENING = (
    "--no-pager",
    "--no-optional-locks",
    "-c", "core.fsmonitor=false",
    "-c", "core.hooksPath=/dev/null",
    "-c", "log.showSignature=false",
    "-c", "color.ui=false",
    "-c", "core.pager=cat",
)  # fmt: skip
