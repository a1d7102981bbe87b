"""The names of dispatchq's RQ entry points: the fixed table a worker resolves from.

RQ stores a job's function and callbacks in Redis by dotted name. These are the only names
a dispatchq job may carry (`dispatchq.queue.entrypoints` resolves them to dispatchq's own
callables and refuses anything else). They are plain data, low in the layers, so the
dispatcher, the scheduler, the workers and the rules engine's job bodies all name their jobs
from here. A tier's job name comes from its row in the tier table, so a new tier's entry
point is in this table as soon as its row is.
"""

from __future__ import annotations

from collections.abc import Mapping

from dispatchq.core.tiers import TABLE

__all__ = [
    "CALLBACKS",
    "CODE_JOB",
    "DELIVERIES_JOB",
    "FAILURE_CALLBACK",
    "JOB_FUNCTIONS",
    "RETRIGGER_JOB",
    "SESSION_JOB",
    "TIER_JOB",
    "TIER_OF_JOB",
    "TRIAGE_JOB",
    "TYPED_JOB",
]

#: The job of each tier's batches (from the tier table), and back: a job of any other
#: function (the retrigger, triage) carries no tier's judgements to put back.
TIER_JOB: Mapping[str, str] = {row.name: row.entry_point for row in TABLE}
TIER_OF_JOB: Mapping[str, str] = {name: tier for tier, name in TIER_JOB.items()}

# The names RQ jobs already in users' Redis carry: they never change.
CODE_JOB = TIER_JOB["code"]
TYPED_JOB = TIER_JOB["typed"]
SESSION_JOB = TIER_JOB["session"]
RETRIGGER_JOB = "jobs.tiers.retrigger"
TRIAGE_JOB = "jobs.tiers.triage"
DELIVERIES_JOB = "jobs.tiers.triage_deliveries"
FAILURE_CALLBACK = "jobs.tiers.on_job_failure"

#: Every name a job's function may carry -> the attribute of `jobs/tiers.py` it runs.
JOB_FUNCTIONS: Mapping[str, str] = {
    name: name.rsplit(".", 1)[1] for name in (*TIER_JOB.values(), RETRIGGER_JOB, TRIAGE_JOB, DELIVERIES_JOB)
}
#: Every name each kind of callback may carry. dispatchq sets only failure callbacks, so a
#: success or stopped callback is refused whatever it names.
CALLBACKS: Mapping[str, Mapping[str, str]] = {
    "on_failure": {FAILURE_CALLBACK: "on_job_failure"},
    "on_success": {},
    "on_stopped": {},
}
