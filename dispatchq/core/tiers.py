"""The tiers as one table: every fact about a tier that the queue, the workers and status use.

Every fact that matters about a tier (which queue is shared, how many ids a job carries,
which timeout applies, which worker class runs it, what happens to a dead worker's
judgements, where the ladder goes next) is a column here, said once, so adding
a tier is one row, one module under `dispatchq/tiers/`, one entry point in `jobs/tiers.py`,
one Procfile line, the settings of its own and its tests; the rest of dispatchq reads the
row. `tests/unit/test_tier_table.py` holds the `Tier` literal to the table, and
`tests/integration/test_tier_table.py` runs a judgement through a throw-away row.

`needs-triage` is not a tier: it is where a judgement ends when no tier above can answer it
(a person decides). It is a `Rung` of the ladder, never a row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from dispatchq.core.kinds import Kind

__all__ = [
    "NEEDS_TRIAGE",
    "TABLE",
    "TIERS",
    "Admission",
    "Rung",
    "Tier",
    "TierRow",
    "automatic_tiers",
    "batch_tiers",
    "ladder",
    "rank",
    "row",
    "row_of",
]

Tier = Literal["code", "typed", "session"]
NEEDS_TRIAGE: Literal["needs-triage"] = "needs-triage"
#: Where the ladder can send a judgement: a tier, or a person.
Rung = Tier | Literal["needs-triage"]
#: How work reaches a tier's worker: RQ jobs carrying batches of ids straight on its queue,
#: or dispatchq's own line that the usage window admits from one judgement at a time.
Admission = Literal["queue", "line"]


def _never(kind: Kind) -> bool:
    return False


def _produces(kind: Kind) -> bool:
    """Produce-and-verify judgements run one per job: each may take minutes in a worktree."""
    return bool(kind.produce)


def _has_code(kind: Kind) -> bool:
    return kind.has_code


def _has_typed(kind: Kind) -> bool:
    return kind.has_typed


def _escalates_to_session(kind: Kind) -> bool:
    return kind.escalate == "session"


@dataclass(frozen=True)
class TierRow:
    """One tier's facts. Ordered by `rank`: a judgement only ever moves to a higher one."""

    name: str
    rank: int
    #: Whether the kind can be answered here at all: the ladder skips a tier that cannot.
    serves: Callable[[Kind], bool]
    #: `shared`: one queue every host's worker takes from; `per-host`: a host-bound queue
    #: (a judgement naming a checkout runs where the checkout is) in front of a shared one.
    queue: Literal["shared", "per-host"]
    admission: Admission
    #: The Settings field that bounds one RQ job of this tier, plus a margin in seconds.
    timeout: str
    timeout_margin: int = 0
    #: Jobs carry `DISPATCHQ_BATCH_SIZE` ids, or one each for a kind this says so of.
    one_per_job: Callable[[Kind], bool] = _never
    #: Judgements entering the tier are indexed by state, so one request answers a group.
    groups_by_state: bool = False
    #: Its jobs may be put off to a provider's advised time (rq-scheduler re-enqueues them),
    #: so a burst worker waits for the ones due within the horizon instead of stranding them.
    delayed_retries: bool = False
    #: Which worker class runs it: RQ's dequeue (`batch`), or the window's admission (`session`).
    worker: Literal["batch", "session"] = "batch"
    #: What a dead worker's job costs its judgements: the batch is retried (each alone once it
    #: keeps dying), or the one judgement goes back to the front of its line.
    take_back: Literal["retry-batch", "line-front"] = "retry-batch"
    #: Whether answering here spends the shared usage window (what `sessions avoided` counts).
    spends_window: bool = False

    @property
    def entry_point(self) -> str:
        """The RQ function name its jobs carry (`jobs/tiers.py`), stored in users' Redis."""
        return f"jobs.tiers.{self.name}"


#: The table. Cheapest first; ranks leave room, so a new tier is one more row between two.
TABLE: tuple[TierRow, ...] = (
    TierRow(
        "code",
        rank=0,
        serves=_has_code,
        queue="per-host",
        admission="queue",
        timeout="code_job_timeout",
        one_per_job=_produces,
    ),
    TierRow(
        "typed",
        rank=10,
        serves=_has_typed,
        queue="shared",
        admission="queue",
        timeout="typed_job_timeout",
        groups_by_state=True,
        delayed_retries=True,
    ),
    TierRow(
        "session",
        rank=20,
        serves=_escalates_to_session,
        queue="per-host",
        admission="line",
        # The session's own timeout, plus the time to account for what it did.
        timeout="session_timeout",
        timeout_margin=120,
        worker="session",
        take_back="line-front",
        spends_window=True,
    ),
)

#: The tiers, cheapest first: the one spelling of the ladder every room uses.
TIERS: tuple[str, ...] = tuple(r.name for r in TABLE)


def rank(rung: str) -> int:
    """A tier's rank, or the top for `needs-triage`: read from the table at call time."""
    if rung == NEEDS_TRIAGE:
        return max(r.rank for r in TABLE) + 1
    return row(rung).rank


def row_of(rung: str | None) -> TierRow | None:
    """The row of the tier a record names; None for `needs-triage` (a person, not a tier), no
    tier at all, or a name outside the table (a record written by another version)."""
    for candidate in TABLE:
        if candidate.name == rung:
            return candidate
    return None


def row(tier: str) -> TierRow:
    """The row of `tier`; a name outside the table is a programming error, said plainly."""
    for candidate in TABLE:
        if candidate.name == tier:
            return candidate
    raise KeyError(f"no tier named {tier!r} (the tiers are {', '.join(TIERS)})")


def ladder() -> tuple[TierRow, ...]:
    """The rows cheapest first (the table may be given in any order)."""
    return tuple(sorted(TABLE, key=lambda r: r.rank))


def batch_tiers() -> tuple[str, ...]:
    """The tiers whose RQ jobs carry batches of ids straight on a queue (not the window's line)."""
    return tuple(r.name for r in TABLE if r.admission == "queue")


def automatic_tiers() -> tuple[str, ...]:
    """The tiers that answer without spending the usage window (what `sessions avoided` counts)."""
    return tuple(r.name for r in TABLE if not r.spends_window)
