"""The triage part of `dispatchq status`: recent runs' counts, read from storage alone.

Operators run `status` in loops, so this must not pull in the engine (the CEL parser,
githubkit through the executors): it needs only the run lines and the needs-triage count
that `TriageStorage` already keeps. `dispatchq.triage.engine` re-exports both names, so
code that imported them from there keeps working.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dispatchq.storage.triage import TriageStorage

__all__ = ["outcome_counts", "status_section"]


def outcome_counts(runs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Totals by reason code over runs (what `dispatchq status` shows for triage)."""
    total: Counter[str] = Counter()
    for run in runs:
        total.update(run.get("counts", {}))
    return dict(total)


def status_section(storage: TriageStorage, *, last: int = 20) -> dict[str, Any]:
    """The triage part of `dispatchq status --json`: the last runs' counts by outcome."""
    runs = storage.recent_runs(last)
    return {
        "runs": len(runs),
        "last_run": runs[0]["time"] if runs else None,
        "counts": outcome_counts(runs),
        "needs_triage": storage.needs_triage_count(),
    }
