"""Example code-tier checks used by `examples/dispatchq.yaml` and the benchmark.

The config beside this file names them `checks:lockfile_only`: a config's folder is on
`sys.path` (last, so it never shadows an installed package). They live here, not in the
`jobs` package, because `jobs` is dispatchq's RQ entry points and nothing else.

A check receives the judgement and returns an answer, or None for "cannot tell"
(the judgement then moves up the ladder).
"""

from __future__ import annotations

from typing import Any

from dispatchq.core.judgement import Judgement

__all__ = [
    "LOCKFILES",
    "lockfile_only",
    "noop",
]

LOCKFILES = ("poetry.lock", "package-lock.json", "yarn.lock", "uv.lock", "Cargo.lock", "pnpm-lock.yaml")


def lockfile_only(judgement: Judgement) -> Any:
    """Is this merge conflict only in lockfiles? The file list says so; no model needed.

    state: {"conflicts": ["poetry.lock", ...]}. A conflict touching only lockfiles is
    rebuilt rather than merged; one touching anything else is merged by hand, and the
    file list says that just as surely (naming the first file that is not a lockfile).
    Only a missing or empty file list is "cannot tell".
    """
    state = judgement.state if isinstance(judgement.state, dict) else {}
    conflicts = state.get("conflicts")
    if not isinstance(conflicts, list) or not conflicts:
        return None
    if all(str(path).rsplit("/", 1)[-1] in LOCKFILES for path in conflicts):
        return {"value": "rebuild-lockfile", "reason": "only lockfiles conflict"}
    other = next(str(p) for p in conflicts if str(p).rsplit("/", 1)[-1] not in LOCKFILES)
    return {"value": "merge-by-hand", "reason": f"{other} is not a lockfile"}


def noop(judgement: Judgement) -> Any:
    """Answers immediately with the target: used by the throughput benchmark."""
    return judgement.target
