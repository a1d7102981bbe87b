"""The decision gate: findings through analysis, a person's sweep, fixing sessions, grading.

The stages of `shared/seeds/decision-gate.txt`, with dispatchq as the orchestrator:

1. **Location pre-check** (code; `locate`): a usable Location passes; a person supplies
   the others at the terminal, in batches of at most 4, validated by the same rule (one
   re-ask), written into the report at once in the extended form.
2. **Analysis** (session tier, read-only `findings-analyst`; `analysis`): one analyst per
   finding, in announced batches of at most 8. The block travels framed with a fresh nonce;
   a return that breaks the contract degrades, visibly, to a restatement of the Remediation
   by the read-only `findings-restater`, which a person confirms.
3. **The sweep** (a person at a terminal, and nobody else; `sweep`, `decision`): `[A] [B]
   [skip] [reject]` plus `other…`, the reject evidence gate, approvals of out-of-boundary
   checks in the same turn, and each decision written as made, with its plan (after the
   plan-rejection test) and its pin. With no interactive terminal the stage aborts before
   anything is spent.
4. **Dispatch** (session tier, `findings-fixer`, which may edit; `dispatch`): one judgement
   per attempt, bound to the host and checkout holding the report. Everything that must be
   true at the moment of the spawn runs *inside the job*, in the session tier's hooks: the
   repository lock (sequential per repository across workers), the job's own state (a
   dispatch with an unknown outcome is verified before anything else), tamper evidence, the
   pin comparison with the attribution rule, the before-observation, the dispatch copy, and
   the `Dispatch:` marker, written after the window check and rewritten back when the spawn
   is refused.
5. **Verification and grading** (code, right after the session, still inside the job):
   the persisted plan inside the execution boundary plus approved checks, the after-
   observation, the dispatch log, the four cases, retirement.

How sessions run: every session is a session-tier judgement. The `findings` commands
enqueue them and run the session tier in-process, in burst, until their judgements are
done (as `dispatchq run` does), so a gate works with or without the Procfile's workers: a
running `dispatchq worker session` may take the same judgements, and the command simply
waits for them. A closed usage window stops the waiting; the judgements stay in line and
a later run (or a worker, after the lift) picks them up.

Each stage is its own module, a function of the `GateContext` (`context`) every stage
reads and writes; `Gate` is that context plus the order of the stages. Around them:
`sessions` (the read-only questions as judgements, and the restater), `kinds` (the three
session kinds and the hooks the session tier calls), `fixer` (one fixer attempt inside its
job: dispatch to grading), `terminal` (where a person answers) and `settle` (waiting for
the judgements in this process).
"""

from __future__ import annotations

from collections.abc import Iterable

from dispatchq.errors import Aborted
from dispatchq.findings.evidence.record import stalled_resolutions
from dispatchq.findings.run.analysis import analyse
from dispatchq.findings.run.context import GateContext
from dispatchq.findings.run.dispatch import dispatch_decided
from dispatchq.findings.run.locate import locate
from dispatchq.findings.run.sweep import sweep
from dispatchq.findings.texts.summary import Summary

__all__ = ["Gate"]


class Gate(GateContext):
    """One findings report in one checkout, run by dispatchq as the orchestrator."""

    def run(self) -> Summary:
        """The whole gate: decide, dispatch, and one second pass over what was set aside."""
        if not self.decide():
            return self.summary
        aside = self.dispatch()
        if aside and self.terminal is not None:
            self.out(f"second pass: {len(aside)} finding(s) set aside are analysed and swept again")
            if self.decide(only=aside, second_pass=True):
                again = self.dispatch(only=aside)
                for fid in again:
                    self.summary.notes.append(f"{fid} set aside again: left for the next run")
        self.finish()
        return self.summary

    def decide(self, only: Iterable[str] | None = None, *, second_pass: bool = False) -> bool:
        """Locations, analysis and the sweep over the findings that still lack a decision.
        False when aborted (no terminal, or the person stopped)."""
        todo = self.undecided(only)
        if not todo:
            return True
        if self.terminal is None:
            self.summary.aborted = (
                "no interactive terminal: answers come only from a person at a terminal; "
                "nothing more was written"
            )
            self.summary.undecided = len(todo)
            return False
        for finding in todo:  # a Decision line deleted by hand: the person decides again
            if self.record.withdraw_deleted(finding) is not None:
                self.out(f"{finding.id}: its Decision line was deleted by hand: that decision is retired")
                self.summary.notes.append(f"{finding.id}: re-decided (its Decision line was deleted by hand)")
        todo = self.undecided(only)
        replayed = len(self.decided())
        extra = (
            f"; {replayed} decided earlier are replayed, not asked again"
            if replayed and not second_pass
            else ""
        )
        self.out(f"{len(todo)} finding(s) need a decision{extra}")
        try:
            stalled = [f for f in todo if stalled_resolutions(f)]
            rest = [f for f in todo if not stalled_resolutions(f)]
            located = locate(self, rest)
            analyses = analyse(self, [f for f in rest if f.id in located], located)
            sweep(self, [f for f in todo if f.id in analyses or f in stalled], analyses)
        except Aborted as why:
            self.summary.aborted = f"{why}: the sweep stopped; nothing more was written"
            self.summary.undecided = len(self.undecided(only))
            return False
        return True

    def dispatch(self, only: Iterable[str] | None = None) -> list[str]:
        """Dispatch, verification and grading of every decided finding; the ids set aside
        for a second sweep."""
        return dispatch_decided(self, only)
