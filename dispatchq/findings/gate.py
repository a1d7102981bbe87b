"""The decision gate: findings through analysis, a person's sweep, fixing sessions, grading.

The stages of `shared/seeds/decision-gate.txt`, with dispatchq as the orchestrator:

0. **Location pre-check** (code): a usable Location passes; a person supplies the others at
   the terminal, in batches of at most 4, validated by the same rule (one re-ask), written
   into the report at once in the extended form.
1. **Analysis** (session tier, read-only `findings-analyst`): one analyst per finding, in
   announced batches of at most 8. The block travels framed with a fresh nonce; a return
   that breaks the contract degrades, visibly, to a restatement of the Remediation by the
   read-only `findings-restater`, which a person confirms.
2. **The sweep** (a person at a terminal, and nobody else): `[A] [B] [skip] [reject]` plus
   `other…`, the reject evidence gate, approvals of out-of-boundary checks in the same turn,
   and each decision written as made, with its plan (after the plan-rejection test) and its
   pin. With no interactive terminal the stage aborts before anything is spent.
3. **Dispatch** (session tier, `findings-fixer`, which may edit): one judgement per attempt,
   bound to the host and checkout holding the report. Everything that must be true at the
   moment of the spawn runs *inside the job*, in the session tier's hooks: the repository
   lock (sequential per repository across workers), the job's own state (a dispatch with an
   unknown outcome is verified before anything else), tamper evidence, the pin comparison
   with the attribution rule, the before-observation, the dispatch copy, and the `Dispatch:`
   marker, written after the window check and rewritten back when the spawn is refused.
3.5/4. **Verification and grading** (code, right after the session, still inside the job):
   the persisted plan inside the execution boundary plus approved checks, the after-
   observation, the dispatch log, the four cases, retirement.

How sessions run: every session is a session-tier judgement. The `findings` commands
enqueue them and run the session tier in-process, in burst, until their judgements are
done (as `dispatchq run` does), so a gate works with or without the Procfile's workers: a
running `dispatchq worker session` may take the same judgements, and the command simply
waits for them. A closed usage window stops the waiting; the judgements stay in line and
a later run (or a worker, after the lift) picks them up.

Around this orchestrator: `kinds` (the three session kinds and the hooks the session tier
calls), `fixer` (one fixer attempt inside its job: stages 3 to 4), `terminal` (where a
person answers) and `settle` (waiting for the judgements in this process).
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatchq.client import Client
from dispatchq.core.judgement import canonical_json, sha256_hex
from dispatchq.errors import Aborted, ContractError, GitUnavailable, TamperError, UserError
from dispatchq.findings.boundary import Approvals, plan_rejection, run_check
from dispatchq.findings.contract import (
    ANALYST,
    ANALYST_BATCH,
    FIXER,
    LOCATION_BATCH,
    RESTATER,
    Alternative,
    Proposal,
    Summary,
    announce_analysis,
    batches,
    display,
    indent,
    options_line,
    parse_analysis,
    parse_choice,
    parse_restatement,
    render_details,
    render_evidence,
    render_header,
    render_proposal,
    render_refused,
    render_retired,
    render_source,
    supported,
    sweep_options,
    who_tag,
)
from dispatchq.findings.fixer import AttemptState, attempt_key, decision_key, iso_now
from dispatchq.findings.lines import RETIRED, STATUS, Decision
from dispatchq.findings.pins import (
    block_hash,
    check_location,
    hash_paths,
    repo_id,
)
from dispatchq.findings.plans import Check
from dispatchq.findings.prompts import foreign_tokens, reviewer_text, session_state
from dispatchq.findings.record import DecisionRecord, RecordStore, report_lock_dir, stalled_resolutions
from dispatchq.findings.report import Finding
from dispatchq.findings.settle import settle
from dispatchq.findings.terminal import Terminal

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime

__all__ = [
    "Analysis",
    "Gate",
    "Unrestated",
]


def _user() -> str:
    """Who answers at this terminal (recorded on the Decision line as its provenance)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "user"


# --- the orchestrator -----------------------------------------------------------------------
@dataclass(frozen=True)
class Unrestated:
    """Why the restater gave no usable restatement, and whose fault that is.

    `person`: the restater says the person's words cannot be restated self-containedly, so
    the person is asked once more. Otherwise the session broke its contract (or could not
    run): that costs the person nothing, and `retry` says whether asking it again can help.
    """

    why: str
    person: bool = False
    retry: bool = True


@dataclass
class Analysis:
    """Stage 1's result for one finding: a proposal, or a visible reason there is none."""

    proposal: Proposal | None
    note: str | None = None


@dataclass
class Gate:
    """One findings report in one checkout, run by dispatchq as the orchestrator."""

    runtime: Runtime
    report: Path
    root: Path
    terminal: Terminal | None = None
    out: Callable[[str], None] = print
    summary: Summary = field(default_factory=Summary)

    def __post_init__(self) -> None:
        self.report = Path(os.path.realpath(self.report))
        self.root = Path(os.path.realpath(self.root))
        self.record = DecisionRecord(
            self.report,
            self.root,
            RecordStore(self.runtime.redis, self.root),
            lock_dir=report_lock_dir(self.runtime.settings.data_dir),
        )
        self.repo = repo_id(self.root)
        self.today = dt.date.today()
        self.who = who_tag(_user())
        parsed = self.record.read()
        if parsed.problems:
            where = "; ".join(f"line {p.line}: {p.message}" for p in parsed.problems)
            raise UserError(f"{self.report}: the report does not parse: {where}")
        self.status_at_start = {f.id: f.value(STATUS) for f in parsed.findings}
        self.client = Client(runtime=self.runtime)

    # --- selection ---------------------------------------------------------------------------
    def undecided(self, only: Iterable[str] | None = None) -> list[Finding]:
        """needs-decision findings without a live decision or a terminal status."""
        wanted = set(only) if only is not None else None
        return [
            f
            for f in self.record.read().findings
            if f.needs_decision
            and not f.terminal
            and f.value("Decision") is None
            and (wanted is None or f.id in wanted)
        ]

    def decided(self, only: Iterable[str] | None = None) -> list[Finding]:
        wanted = set(only) if only is not None else None
        return [
            f
            for f in self.record.read().findings
            if f.value("Decision") is not None and not f.terminal and (wanted is None or f.id in wanted)
        ]

    # --- the whole gate ----------------------------------------------------------------------
    def run(self) -> Summary:
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

    def finish(self) -> None:
        for finding in self.record.read().findings:
            both = stalled_resolutions(finding)
            if both:
                self.summary.add_unique("stalled", (finding.id, both))

    # --- stages 0-2 --------------------------------------------------------------------------
    def decide(self, only: Iterable[str] | None = None, *, second_pass: bool = False) -> bool:
        """Stages 0-2 over the findings that still lack a decision. False when aborted."""
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
            located = self.stage0(rest)
            analyses = self.stage1([f for f in rest if f.id in located], located)
            self.stage2([f for f in todo if f.id in analyses or f in stalled], analyses)
        except Aborted as why:
            self.summary.aborted = f"{why}: the sweep stopped; nothing more was written"
            self.summary.undecided = len(self.undecided(only))
            return False
        return True

    def stage0(self, findings: Sequence[Finding]) -> dict[str, str]:
        """Location pre-check: usable locations pass; a person supplies the others."""
        assert self.terminal is not None
        located: dict[str, str] = {}
        missing = []
        for finding in findings:
            check = check_location(self.root, finding.value("Location"))
            if check.usable and check.span:
                located[finding.id] = check.span  # a range is told whole to the analyst
            else:
                missing.append((finding, check.why or "no location"))
        groups = batches(missing, LOCATION_BATCH)
        for number, group in enumerate(groups, 1):
            self.out(
                f"{len(missing)} finding(s) have no usable location; batch {number} of {len(groups)} "
                f"(at most {LOCATION_BATCH} questions):"
            )
            for finding, why in group:
                target = self.ask_location(finding, why)
                if target is None:
                    self.summary.failed.append(
                        (finding.id, "no usable location (declined); offered again next run")
                    )
                    continue
                try:
                    self.record.write_location(finding.id, target)
                except TamperError as error:
                    self.summary.tampered.append((finding.id, str(error)))
                    continue
                located[finding.id] = target
        return located

    def ask_location(self, finding: Finding, why: str) -> str | None:
        assert self.terminal is not None
        self.terminal.say(
            f"{finding.id} [{display(finding.severity)}] {display(finding.title)}: location-less ({why})"
        )
        for attempt in (1, 2):
            answer = self.terminal.ask(f"{finding.id} location path:line (empty to decline)> ").strip()
            if not answer:
                return None
            check = check_location(self.root, answer)
            if check.usable and check.target:
                return check.target
            if attempt == 1:
                self.terminal.say(
                    f"not usable ({check.why}): give path:line of an existing file inside the repository"
                )
        return None

    def own_retired(self, finding: Finding) -> set[str]:
        """The `Decision-retired` values dispatchq's store holds for this finding: the only
        retired decisions that are dispatchq's own (any other is the author's text)."""
        assert self.record.store is not None
        written = self.record.store.written(self.record.ref(finding.id)) or []
        return {value for name, value in written if name == RETIRED}

    def stage1(self, findings: Sequence[Finding], located: dict[str, str]) -> dict[str, Analysis]:
        """One analyst per finding, in announced batches of at most 8."""
        analyses: dict[str, Analysis] = {}
        asked: list[tuple[Finding, dict[str, Any]]] = []
        for finding in findings:
            own = self.own_retired(finding)
            text = reviewer_text(finding, own)
            forged = foreign_tokens(text)
            if forged:
                note = (
                    "no proposal: the reviewer-authored text carries a delimiter of another invocation "
                    f"({display(forged[0])}); nothing was derived from it"
                )
                analyses[finding.id] = Analysis(None, note)
                continue
            asked.append((finding, session_state(finding, located[finding.id], own)))
        if not asked:
            return analyses
        self.out(announce_analysis(len(asked)))
        groups = batches(asked, ANALYST_BATCH)
        degraded: list[tuple[Finding, dict[str, Any], str]] = []
        for number, group in enumerate(groups, 1):
            self.out(f"batch {number} of {len(groups)}: " + ", ".join(f.id for f, _ in group))
            ids = self.enqueue([self.question(ANALYST, f, state) for f, state in group])
            why = settle(self.runtime, ids, on_wait=self.out)
            for (finding, state), jid in zip(group, ids, strict=True):
                judgement = self.runtime.store.get(jid)
                if judgement is None or not judgement.finished:
                    reason = why or "not finished"
                    self.summary.waiting.append((finding.id, f"analysis waits: {reason}"))
                    continue
                if judgement.status != "answered":
                    degraded.append(
                        (finding, state, f"the analyst failed ({judgement.reason or 'no reason'})")
                    )
                    continue
                try:
                    proposal = parse_analysis(judgement.value)
                    target = check_location(self.root, proposal.target)
                    if not target.usable:
                        raise ContractError(f"target {proposal.target} is not usable ({target.why})")
                except ContractError as error:
                    degraded.append((finding, state, f"the analyst's return is unusable: {error}"))
                    continue
                analyses[finding.id] = Analysis(proposal)
        for finding, state, why in degraded:
            analyses[finding.id] = self.degrade(finding, state, why)
        return analyses

    def degrade(self, finding: Finding, state: dict[str, Any], why: str) -> Analysis:
        """The degraded path: the Remediation restated (never verbatim), confirmed at the sweep."""
        note = f"code analysis unavailable: {why}"
        remediation = str(state.get("remediation") or "")
        if not remediation.strip():
            return Analysis(None, note + "; the block names no Remediation to restate")
        self.out(f"{finding.id}: {why}; restating its Remediation")
        result = self.restate(finding, state, mode="remediation")
        if isinstance(result, Unrestated):
            return Analysis(None, f"{note}; the Remediation could not be restated ({result.why})")
        proposal = Proposal(
            target=str(state.get("location")),
            alternatives=result,
            a_alone=len(result) == 1,
            a_alone_reason="the Remediation names one fix" if len(result) == 1 else "",
            degraded=True,
        )
        return Analysis(proposal, note)

    # --- sessions as judgements --------------------------------------------------------------
    def question(self, kind: str, finding: Finding, state: dict[str, Any], salt: str = "") -> dict[str, Any]:
        """A read-only question about a finding, as a judgement. Its key names the finding,
        the block as it stands, its location, its history and the target file's content:
        asking again about an unchanged finding reuses the answer (no session spent), and any
        change asks afresh."""
        ref = self.record.ref(finding.id)
        location = str(state.get("location"))
        path = location.rsplit(":", 1)[0]
        try:
            blob = hash_paths(self.root, [path]).get(path, "?")
        except GitUnavailable:
            blob = "?"
        identity = [kind, self.repo, ref, block_hash(finding), location, state.get("retired"), blob, salt]
        digest = sha256_hex(canonical_json(identity))
        return {
            "kind": kind,
            "target": ref,
            "item": f"{kind.removeprefix('findings-')} of block {block_hash(finding)[:16]}",
            "context": {"checkout": str(self.root)},
            "state": state,
            "key": f"gate:{digest}",
        }

    def enqueue(self, judgements: Sequence[dict[str, Any]], *, force: bool = False) -> list[str]:
        results = self.client.enqueue_many(list(judgements), force=force)
        ids = []
        for r in results:
            if not r.ok or r.id is None:
                raise UserError(f"cannot enqueue a gate judgement: {r.error}")
            ids.append(r.id)
        return ids

    def restate(
        self, finding: Finding, state: dict[str, Any], *, mode: str, answer: str = "", again: bool = False
    ) -> tuple[Alternative, ...] | Unrestated:
        """Ask the restater; the alternatives it returns, or why there are none (and whose
        fault that is). `again` asks a fresh session rather than reusing the last answer."""
        asked = {**state, "mode": mode, "answer": answer}
        if foreign_tokens(answer):
            return Unrestated("the answer carries a delimiter of another invocation", person=True)
        salt = f"{mode}\0{answer}" + ("\0again" if again else "")
        (jid,) = self.enqueue([self.question(RESTATER, finding, asked, salt=salt)])
        why = settle(self.runtime, [jid], on_wait=self.out)
        judgement = self.runtime.store.get(jid)
        if judgement is None or not judgement.finished:
            return Unrestated(f"the restater waits: {why}", retry=False)
        if judgement.status != "answered":
            return Unrestated(f"the restater failed ({judgement.reason or 'no reason'})")
        value = judgement.value
        if isinstance(value, dict) and value.get("unrestatable"):
            return Unrestated(f"cannot be restated self-containedly: {value['unrestatable']}", person=True)
        try:
            return parse_restatement(value, mode=mode, remediation=str(state.get("remediation", "")))
        except ContractError as error:
            return Unrestated(f"the restater's return is unusable: {error}")

    # --- stage 2: the sweep ------------------------------------------------------------------
    def stage2(self, findings: Sequence[Finding], analyses: dict[str, Analysis]) -> None:
        total = len(findings)
        for position, finding in enumerate(findings, 1):
            finding = self.record.read().finding(finding.id)
            try:
                self.sweep_one(finding, analyses.get(finding.id), position, total)
            except TamperError as error:
                self.summary.tampered.append((finding.id, str(error)))

    def sweep_one(self, finding: Finding, analysis: Analysis | None, position: int, total: int) -> None:
        assert self.terminal is not None
        t = self.terminal
        stalled = stalled_resolutions(finding)
        proposal = analysis.proposal if analysis else None
        t.say(*render_header(finding, position, total))
        t.say(*render_source(finding))
        if stalled:
            t.say("stalled — no progress: two decisions were tried and retired:")
            t.say(*(f"  - {display(r)}" for r in stalled))
            options = ["skip", "reject"]
            verified = False
            prefill = None
        else:
            if analysis is not None and analysis.note:
                t.say(display(analysis.note))
            if proposal is None or proposal.degraded:
                # No analysis stands between the person and the block: show it as written,
                # set off from dispatchq's own lines (and untrusted, like every block).
                head = "no proposal" if proposal is None else "not analysed"
                t.say(f"The finding as written ({head}; the block author's text):")
                t.say(*indent(reviewer_text(finding, self.own_retired(finding)), "    | "))
            if proposal is not None:
                t.say(*render_proposal(proposal))
            t.say(*render_retired(finding, self.own_retired(finding)))
            offered, verified, prefill, rows = self.evidence_gate(proposal)
            if proposal is not None and proposal.candidate is not None:
                t.say(f"Rejection candidate: {display(proposal.candidate.reason)}")
                if rows:
                    t.say("Evidence re-run by dispatchq (read-only):", *render_evidence(rows))
                if not offered:
                    t.say("reject is withheld: the recorded evidence no longer holds")
                elif not verified:
                    t.say("no re-runnable evidence: a rejection would be marked unverified")
            labels = [a.label for a in proposal.alternatives] if proposal else []
            options = sweep_options(labels, reject=offered)
        while True:
            choice = parse_choice(t.ask(f"{finding.id} decision {options_line(options)}> "), options)
            if choice is None:
                t.say(f"choose one of {options_line(options)}" + ("" if stalled else ", or d for details"))
                continue
            if choice == "details":
                if proposal is not None:
                    t.say(*render_details(proposal))
                else:
                    t.say("no analysis to show")
                continue
            if choice == "skip":
                self.summary.skipped.append(finding.id)
                return
            if choice == "reject":
                if self.reject(finding, prefill=prefill, verified=verified):
                    return
                continue
            if choice == "other":
                if self.other(finding, proposal):
                    return
                continue
            assert proposal is not None
            alt = proposal.alternative(choice)
            assert alt is not None
            if proposal.degraded:
                t.say(f"restated from the Remediation: {display(alt.resolution)}")
                if not t.yes(f"{finding.id} use this restatement? [y/n]> "):
                    continue
            if self.decide_alternative(finding, alt, proposal.target):
                return

    def evidence_gate(self, proposal: Proposal | None) -> tuple[bool, bool, str | None, list[Any]]:
        """(reject offered, rejection verified, prefilled reason, rows to render).

        A candidate's cited in-boundary checks are re-run: supported → reject offered and
        prefilled; any diverging → withheld (a refused citation beside it changes nothing);
        otherwise a citation the boundary refuses → the no-candidate path (reject offered,
        unverified). The re-run persists nothing.
        """
        if proposal is None or proposal.candidate is None or not proposal.candidate.citations:
            return True, False, None, []
        rows: list[Any] = []
        refused = False
        every = True
        for citation in proposal.candidate.citations:
            if citation.check is None:
                rows.append((citation, None, None))
                refused = True
                continue
            result = run_check(citation.check, self.root)
            if not result.ran:
                rows.append((citation, None, None))
                refused = True
                continue
            ok = supported(citation.recorded, result.output, ran=result.ran, error=result.error)
            fresh = result.output + (f"[error: {result.error}]\n" if result.error else "")
            rows.append((citation, fresh, ok))
            every = every and ok
        if not every:
            return False, False, None, rows  # a divergence withholds reject, whatever else was cited
        if refused:
            return True, False, None, rows
        return True, True, proposal.candidate.reason, rows

    def reject(self, finding: Finding, *, prefill: str | None, verified: bool) -> bool:
        assert self.terminal is not None
        t = self.terminal
        reason = ""
        for attempt in (1, 2):
            if prefill:
                answer = t.ask(f'{finding.id} reject reason [Enter keeps "{display(prefill)}"]> ').strip()
                reason = answer or prefill
            else:
                reason = t.ask(f"{finding.id} reject reason (one line, required)> ").strip()
            if reason:
                break
            if attempt == 1:
                t.say("a rejection is terminal and needs a stated reason; once more")
        if not reason:
            t.say("no reason given: back to the options")
            return False
        self.record.reject(finding.id, " ".join(reason.split()), self.today)
        self.summary.rejected.append(finding.id)
        if not verified:
            self.summary.unverified.append((finding.id, "rejected with no supported evidence"))
        return True

    def other(self, finding: Finding, proposal: Proposal | None) -> bool:
        """`other…`: the person's words, restated self-containedly and confirmed; one re-ask."""
        assert self.terminal is not None
        t = self.terminal
        t.say(
            "dispatchq has your answer restated as a self-contained resolution and derives its "
            "checks now; approval for any check outside the read-only boundary is asked here, "
            "never later."
        )
        location = check_location(self.root, finding.value("Location"))
        target = proposal.target if proposal and proposal.target else (location.span or "")
        state = session_state(finding, target, self.own_retired(finding))
        asked = 0
        again = False  # the restater's own second chance, which costs the person nothing
        answer: str | None = None
        while True:
            if answer is None:
                if asked == 2:
                    break
                asked += 1
                answer = t.ask(f"{finding.id} your resolution> ").strip()
                if not answer:
                    return False
            t.say("restating…")
            result = self.restate(finding, state, mode="other", answer=answer, again=again)
            if isinstance(result, Unrestated) and not result.person:
                # The session broke its contract (or could not run): not the person's answer,
                # so their one re-ask is not spent on it.
                if result.retry and not again:
                    again = True
                    t.say(
                        f"the restater's return could not be used ({display(result.why)}): the "
                        "session's error, not your answer; asking a fresh restater once more"
                    )
                    continue
                t.say(
                    f"the restater's return could not be used ({display(result.why)}): the session's "
                    "error, not your answer; back to the options, nothing was written"
                )
                return False
            if not isinstance(result, Unrestated):
                alt = result[0]
                t.say(f"restated: {display(alt.resolution)}")
                if alt.plan:
                    t.say("derived checks:", *(f"    {display(c.text)}" for c in alt.plan))
                t.say(*render_refused(alt, "restater"))
                if t.yes(f"{finding.id} use this restatement? [y/n]> "):
                    return self.decide_alternative(finding, alt, target or None)
                why = "not confirmed"
            else:
                why = result.why
            if asked == 1:
                t.say(
                    f"could not use it ({display(why)}). Name every file and line the resolution "
                    "touches, and refer back neither to the Remediation nor to the other alternative."
                )
            answer = None
        t.say("back to the options; nothing was written")
        return False

    def decide_alternative(self, finding: Finding, alt: Alternative, target: str | None) -> bool:
        """Write the decision as made: plan (after the plan-rejection test), approvals, pin."""
        assert self.terminal is not None
        t = self.terminal
        plan: list[Check] | None = list(alt.plan) or None
        if plan:
            test = plan_rejection(plan, self.root, absent_text_only=alt.absent_text_only)
            if test.refused:
                n = len(test.refused)
                t.say(
                    f"{n} check{'s' if n != 1 else ''} of this plan {'are' if n != 1 else 'is'} refused "
                    "by the execution boundary and cannot run, now or after the fix:",
                    *(f"    ! {display(f'{r.check.text} ({r.why_not_run})')}" for r in test.refused),
                )
            if test.rejected:
                t.say(
                    f"the verification plan is treated as no plan ({test.why}): it cannot tell a fix "
                    "from no fix, so the fix will be graded `dispatched, unverified` unless it fails"
                )
                plan = None
        approved: list[Check] = []
        outside = [c for c in plan or [] if not c.inside_boundary]
        if outside:
            t.say(
                f"{len(outside)} check(s) of this plan run outside the read-only boundary. After the fix "
                "dispatchq would run exactly:"
            )
            t.say(*(f"    {json.dumps(list(c.args))}" for c in outside))
            t.say(
                "Declining costs: each counts as a check that cannot run; with nothing else run the "
                "attempt is graded `dispatched, unverified`, it still counts toward the two-attempt "
                "retirement, and two such runs retire the decision."
            )
            if t.yes(f"{finding.id} approve running them after the fix? [y/n]> "):
                approved = outside
        location = check_location(self.root, finding.value("Location"))
        new_target = check_location(self.root, target) if target else None
        # The Location line carries the start-line form: a range (even one equal to the
        # Target) is rewritten to it, the reviewer's original kept in the `(was: …)` tail.
        if new_target is not None and new_target.usable and new_target.target != location.token:
            self.record.write_location(finding.id, new_target.target or "")
            location = new_target
        label = alt.label if alt.label in ("A", "B") else "other"
        decision = Decision(label, alt.resolution, self.who, self.today)
        pinned = self.record.write_decision(
            finding.id,
            decision,
            plan=plan,
            roles=dict(alt.roles),
            target=location.path if location.usable else None,
        )
        if approved and plan:
            approvals = Approvals(self.runtime.redis, self.repo, self.record.ref(finding.id))
            for check in approved:
                approvals.approve(plan, check.args, who=self.who, at=iso_now())
        self.summary.decided.append(finding.id)
        if pinned.pin is None:
            self.summary.unpinned.append((finding.id, pinned.why_unpinned or "no pin"))
        for path, why in pinned.unpinnable:
            self.summary.unpinnable.append((finding.id, path, why))
        t.say(f"{finding.id}: decided {label} — written to the report")
        return True

    # --- stages 3-4 --------------------------------------------------------------------------
    def dispatch(self, only: Iterable[str] | None = None) -> list[str]:
        """Dispatch every decided finding, one fixer judgement per attempt; returns the ids
        set aside (a pin mismatch nobody can explain) for a second sweep."""
        wanted = list(only) if only is not None else None
        aside: list[str] = []
        pending = [f.id for f in self.decided(wanted)]
        retry: set[str] = set()  # a job that ended with no outcome is run again, once, afresh
        for _wave in range(4):
            findings = {f.id: f for f in self.decided(pending)}
            todo = []
            for fid in pending:
                if fid not in findings:
                    continue
                verdict = self.tamper_first(findings[fid])
                if verdict == "set-aside":
                    aside.append(fid)
                    continue
                if verdict == "re-verify":
                    retry.add(fid)  # the cached outcome is not replayed: the job verifies again
                todo.append(findings[fid])
            if not todo:
                break
            self.out(f"dispatching {len(todo)} decided finding(s), one at a time per repository")
            jobs = [self.fixer_judgement(f) for f in todo]
            ids = [
                self.enqueue([job], force=f.id in retry)[0] for (job, _), f in zip(jobs, todo, strict=True)
            ]
            why = settle(self.runtime, ids, on_wait=self.out)
            pending = []
            for (_, attempt), finding, jid in zip(jobs, todo, ids, strict=True):
                judgement = self.runtime.store.get(jid)
                key = attempt_key(self.repo, self.record.ref(finding.id), decision_key(finding), attempt)
                state = AttemptState(self.runtime, key).load()
                result = state.get("outcome") if state.get("phase") == "done" else None
                finished = judgement is not None and judgement.finished
                broken = not isinstance(result, dict) or result.get("outcome") == "error"
                if broken and finished and finding.id not in retry:
                    retry.add(finding.id)
                    pending.append(finding.id)
                    continue
                if not isinstance(result, dict):
                    if finished:
                        status = judgement.status if judgement else "gone"
                        self.summary.failed.append(
                            (
                                finding.id,
                                f"attempt {attempt}: the fixer job ended without an outcome ({status})",
                            )
                        )
                    else:
                        reason = (judgement.reason if judgement else None) or why or "not started"
                        self.summary.waiting.append((finding.id, f"dispatch waits: {reason}"))
                    continue
                again = self.summary.account(finding.id, attempt, result)
                if again == "set-aside":
                    aside.append(finding.id)
                elif again == "again":
                    pending.append(finding.id)
        self.finish()
        return aside

    def tamper_first(self, finding: Finding) -> str | None:
        """Tamper evidence before anything a changed line says is used (a plan, a pin, a cached
        outcome). A deleted Status line only: reported, and the tree verified again
        ("re-verify"). Any other change: reported with its diff, and the finding set aside
        with nothing run ("set-aside")."""
        tamper = self.record.tamper(finding)
        if not tamper:
            return None
        why = "; ".join(t.message for t in tamper)
        self.summary.add_unique("tampered", (finding.id, why))
        if all(t.status_gone for t in tamper):
            return "re-verify"
        self.record.supersede(finding.id)
        self.summary.set_aside.append((finding.id, f"tamper evidence, nothing ran: {why}"))
        return "set-aside"

    def fixer_judgement(self, finding: Finding) -> tuple[dict[str, Any], int]:
        decision = finding.decision()
        assert decision is not None
        attempt = len(decision.attempts) + 1
        block = block_hash(finding)
        ref = self.record.ref(finding.id)
        which = decision_key(finding)
        identity = [FIXER, self.repo, ref, which, attempt, block]
        state = {
            "report": str(self.report),
            "root": str(self.root),
            "finding": finding.id,
            "attempt": attempt,
            "block": block,
            "decision": which,
            "status_at_start": self.status_at_start.get(finding.id),
        }
        judgement = {
            "kind": FIXER,
            "target": ref,
            "item": f"attempt {attempt} block {block}",
            "context": {"checkout": str(self.root)},
            "state": state,
            "key": "gate:" + sha256_hex(canonical_json(identity)),
        }
        return judgement, attempt
