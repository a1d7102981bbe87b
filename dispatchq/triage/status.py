"""The triage part of `dispatchq status`: recent runs' counts, read from storage alone.

Operators run `status` in loops, so this must not pull in the engine (the CEL parser,
githubkit through the executors): it needs only the run lines, their decisions and the
needs-triage count that `TriageStorage` already keeps. `dispatchq.triage.engine` re-exports
`outcome_counts` and `status_section`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from dispatchq.core.status import Suppressed, TriagePart

if TYPE_CHECKING:
    from dispatchq.storage.triage import TriageStorage

__all__ = ["outcome_counts", "status_section", "suppressed"]


def outcome_counts(runs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Totals by reason code over runs (what `dispatchq status` shows for triage)."""
    total: Counter[str] = Counter()
    for run in runs:
        total.update(run.get("counts", {}))
    return dict(total)


def status_section(
    storage: TriageStorage, *, outcomes_total: Mapping[str, int] | None = None, last: int = 20
) -> TriagePart:
    """The triage part of `dispatchq status`: the last runs' counts by outcome, what shadow mode
    suppressed, and `outcomes_total` (the store's monotonic counter, passed in by the caller)."""
    runs = storage.recent_runs(last)
    return TriagePart(
        runs=len(runs),
        last_run=runs[0]["time"] if runs else None,
        counts=outcome_counts(runs),
        needs_triage=storage.needs_triage_count(),
        outcomes_total=dict(outcomes_total or {}),
        suppressed=suppressed(storage),
    )


def suppressed(storage: TriageStorage, runs: int = 20, decisions: int = 5) -> list[Suppressed]:
    """What the last shadow-mode decisions suppressed: rule, reason and the numbers compared."""
    out: list[Suppressed] = []
    shadow = [r for r in storage.recent_runs(runs) if r.get("mode") == "shadow" and r.get("decision_id")]
    for run in shadow[:decisions]:
        decision = storage.decision(run["decision_id"]) or {}
        result = decision.get("result") or {}
        for entry in result.get("suppressed") or []:
            out.append(
                Suppressed(
                    decision_id=run["decision_id"],
                    event=run.get("event"),
                    target=run.get("target"),
                    time=run.get("time"),
                    rule=entry.get("rule"),
                    action=entry.get("action"),
                    reason=entry.get("reason"),
                    explanation=entry.get("explanation"),
                    confidence=entry.get("confidence"),
                    threshold=entry.get("threshold"),
                    margin=entry.get("margin"),
                )
            )
    return out
