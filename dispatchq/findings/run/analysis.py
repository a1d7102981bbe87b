"""The analysis: one read-only `findings-analyst` per finding, in announced batches.

The block travels framed with a fresh nonce; a block carrying another invocation's
delimiter is not asked about at all. A return that breaks the contract degrades, visibly,
to a restatement of the Remediation by the read-only `findings-restater`, which a person
confirms at the sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dispatchq.errors import ContractError
from dispatchq.findings.evidence.pins import check_location
from dispatchq.findings.grammar.report import Finding
from dispatchq.findings.run.context import GateContext
from dispatchq.findings.run.sessions import Unrestated, enqueue, question, restate
from dispatchq.findings.run.settle import settle
from dispatchq.findings.texts.prompts import foreign_tokens, reviewer_text, session_state
from dispatchq.findings.texts.returns import ANALYST, Proposal, parse_analysis
from dispatchq.findings.texts.screens import ANALYST_BATCH, announce_analysis, batches, display

__all__ = ["Analysis", "analyse", "degrade"]


@dataclass
class Analysis:
    """The analysis of one finding: a proposal, or a visible reason there is none."""

    proposal: Proposal | None
    note: str | None = None


def analyse(ctx: GateContext, findings: Sequence[Finding], located: dict[str, str]) -> dict[str, Analysis]:
    """One analyst per finding, in announced batches of at most `ANALYST_BATCH`; a finding
    whose analysis still waits (a closed window) has no entry and is noted as waiting."""
    analyses: dict[str, Analysis] = {}
    asked: list[tuple[Finding, dict[str, Any]]] = []
    for finding in findings:
        own = ctx.own_retired(finding)
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
    ctx.out(announce_analysis(len(asked)))
    groups = batches(asked, ANALYST_BATCH)
    degraded: list[tuple[Finding, dict[str, Any], str]] = []
    for number, group in enumerate(groups, 1):
        ctx.out(f"batch {number} of {len(groups)}: " + ", ".join(f.id for f, _ in group))
        ids = enqueue(ctx, [question(ctx, ANALYST, f, state) for f, state in group])
        why = settle(ctx.runtime, ids, on_wait=ctx.out)
        for (finding, state), jid in zip(group, ids, strict=True):
            result = _read_analysis(ctx, finding, jid, why)
            if isinstance(result, Analysis):
                analyses[finding.id] = result
            elif result is not None:
                degraded.append((finding, state, result))
    for finding, state, reason in degraded:
        analyses[finding.id] = degrade(ctx, finding, state, reason)
    return analyses


def _read_analysis(ctx: GateContext, finding: Finding, jid: str, why: str | None) -> Analysis | str | None:
    """One analyst's judgement read back: its analysis; why it degrades (a string); or None
    when it has not finished (noted as waiting)."""
    judgement = ctx.runtime.storage.records.get(jid)
    if judgement is None or not judgement.finished:
        reason = why or "not finished"
        ctx.summary.waiting.append((finding.id, f"analysis waits: {reason}"))
        return None
    if judgement.status != "answered":
        return f"the analyst failed ({judgement.reason or 'no reason'})"
    try:
        proposal = parse_analysis(judgement.value)
        target = check_location(ctx.root, proposal.target)
        if not target.usable:
            raise ContractError(f"target {proposal.target} is not usable ({target.why})")
    except ContractError as error:
        return f"the analyst's return is unusable: {error}"
    return Analysis(proposal)


def degrade(ctx: GateContext, finding: Finding, state: dict[str, Any], why: str) -> Analysis:
    """The degraded path: the Remediation restated (never verbatim), confirmed at the sweep."""
    note = f"code analysis unavailable: {why}"
    remediation = str(state.get("remediation") or "")
    if not remediation.strip():
        return Analysis(None, note + "; the block names no Remediation to restate")
    ctx.out(f"{finding.id}: {why}; restating its Remediation")
    result = restate(ctx, finding, state, mode="remediation")
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
