"""The sweep: a person at a terminal, and nobody else, decides each finding.

`[A] [B] [skip] [reject]` plus `other…`; the reject evidence gate (a candidate's cited
commands re-run before reject is offered); the person's own resolution restated and
confirmed; and each decision written as made (`dispatchq.findings.run.decision`). The
screens themselves are text, in `dispatchq.findings.texts.screens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dispatchq.errors import TamperError
from dispatchq.findings.evidence.boundary import run_check
from dispatchq.findings.evidence.pins import check_location
from dispatchq.findings.evidence.record import stalled_resolutions
from dispatchq.findings.grammar.report import Finding
from dispatchq.findings.run.analysis import Analysis
from dispatchq.findings.run.context import GateContext
from dispatchq.findings.run.decision import reject, write_decision
from dispatchq.findings.run.sessions import Unrestated, restate
from dispatchq.findings.texts.prompts import reviewer_text, session_state
from dispatchq.findings.texts.returns import Proposal, supported
from dispatchq.findings.texts.screens import (
    display,
    indent,
    options_line,
    parse_choice,
    render_details,
    render_evidence,
    render_header,
    render_proposal,
    render_refused,
    render_retired,
    render_source,
    sweep_options,
)

__all__ = ["evidence_gate", "other", "sweep", "sweep_one"]


def sweep(ctx: GateContext, findings: Sequence[Finding], analyses: dict[str, Analysis]) -> None:
    """Each finding in turn, read afresh from the report; a finding whose lines someone else
    changed is reported as tampered and the sweep goes on."""
    total = len(findings)
    for position, finding in enumerate(findings, 1):
        finding = ctx.record.read().finding(finding.id)
        try:
            sweep_one(ctx, finding, analyses.get(finding.id), position, total)
        except TamperError as error:
            ctx.summary.tampered.append((finding.id, str(error)))


def sweep_one(
    ctx: GateContext, finding: Finding, analysis: Analysis | None, position: int, total: int
) -> None:
    """Show one finding and ask until the person has decided, skipped or rejected it."""
    t = ctx.person
    stalled = stalled_resolutions(finding)
    proposal = analysis.proposal if analysis else None
    t.say(*render_header(finding, position, total))
    t.say(*render_source(finding))
    if stalled:
        t.say("stalled — no progress: two decisions were tried and retired:")
        t.say(*(f"  - {display(r)}" for r in stalled))
        options, verified, prefill = ["skip", "reject"], False, None
    else:
        options, verified, prefill = _present(ctx, finding, analysis)
    _choose(ctx, finding, proposal, options, verified=verified, prefill=prefill, stalled=bool(stalled))


def _present(
    ctx: GateContext, finding: Finding, analysis: Analysis | None
) -> tuple[list[str], bool, str | None]:
    """Render a finding that is not stalled: the note, the block as written when nothing
    analysed it, the proposal, its retired decisions and the reject evidence gate's re-run.
    Returns (the options offered, whether a rejection is verified, the prefilled reason)."""
    t = ctx.person
    proposal = analysis.proposal if analysis else None
    if analysis is not None and analysis.note:
        t.say(display(analysis.note))
    if proposal is None or proposal.degraded:
        # No analysis stands between the person and the block: show it as written,
        # set off from dispatchq's own lines (and untrusted, like every block).
        head = "no proposal" if proposal is None else "not analysed"
        t.say(f"The finding as written ({head}; the block author's text):")
        t.say(*indent(reviewer_text(finding, ctx.own_retired(finding)), "    | "))
    if proposal is not None:
        t.say(*render_proposal(proposal))
    t.say(*render_retired(finding, ctx.own_retired(finding)))
    offered, verified, prefill, rows = evidence_gate(proposal, ctx.root)
    if proposal is not None and proposal.candidate is not None:
        t.say(f"Rejection candidate: {display(proposal.candidate.reason)}")
        if rows:
            t.say("Evidence re-run by dispatchq (read-only):", *render_evidence(rows))
        if not offered:
            t.say("reject is withheld: the recorded evidence no longer holds")
        elif not verified:
            t.say("no re-runnable evidence: a rejection would be marked unverified")
    labels = [a.label for a in proposal.alternatives] if proposal else []
    return sweep_options(labels, reject=offered), verified, prefill


def _choose(
    ctx: GateContext,
    finding: Finding,
    proposal: Proposal | None,
    options: list[str],
    *,
    verified: bool,
    prefill: str | None,
    stalled: bool,
) -> None:
    """Ask until an answer settles the finding; an answer that comes back (a reject with no
    reason, an unconfirmed restatement) returns to the options."""
    t = ctx.person
    while True:
        choice = parse_choice(t.ask(f"{finding.id} decision {options_line(options)}> "), options)
        if choice is None:
            t.say(f"choose one of {options_line(options)}" + ("" if stalled else ", or d for details"))
            continue
        if choice == "details":
            t.say(*(render_details(proposal) if proposal is not None else ["no analysis to show"]))
            continue
        if choice == "skip":
            ctx.summary.skipped.append(finding.id)
            return
        if choice == "reject":
            if reject(ctx, finding, prefill=prefill, verified=verified):
                return
            continue
        if choice == "other":
            if other(ctx, finding, proposal):
                return
            continue
        assert proposal is not None
        alt = proposal.alternative(choice)
        assert alt is not None
        if proposal.degraded:
            t.say(f"restated from the Remediation: {display(alt.resolution)}")
            if not t.yes(f"{finding.id} use this restatement? [y/n]> "):
                continue
        if write_decision(ctx, finding, alt, proposal.target):
            return


def evidence_gate(proposal: Proposal | None, root: Path) -> tuple[bool, bool, str | None, list[Any]]:
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
        result = run_check(citation.check, root)
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


def other(ctx: GateContext, finding: Finding, proposal: Proposal | None) -> bool:
    """`other…`: the person's words, restated self-containedly and confirmed; one re-ask."""
    t = ctx.person
    t.say(
        "dispatchq has your answer restated as a self-contained resolution and derives its "
        "checks now; approval for any check outside the read-only boundary is asked here, "
        "never later."
    )
    location = check_location(ctx.root, finding.value("Location"))
    target = proposal.target if proposal and proposal.target else (location.span or "")
    state = session_state(finding, target, ctx.own_retired(finding))
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
        result = restate(ctx, finding, state, mode="other", answer=answer, again=again)
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
                return write_decision(ctx, finding, alt, target or None)
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
