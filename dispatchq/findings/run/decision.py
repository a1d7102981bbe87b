"""A person's decision written as made: a chosen alternative, or a rejection with its reason.

A chosen alternative is written with its plan (after the plan-rejection test), the
approvals of its out-of-boundary checks (asked in the same turn, never later) and its pin;
a rejection is terminal and needs a stated reason.
"""

from __future__ import annotations

import json

from dispatchq.findings.evidence.boundary import Approvals, plan_rejection
from dispatchq.findings.evidence.pins import check_location
from dispatchq.findings.grammar.lines import Decision
from dispatchq.findings.grammar.plans import Check
from dispatchq.findings.grammar.report import Finding
from dispatchq.findings.run.context import GateContext
from dispatchq.findings.run.fixer import iso_now
from dispatchq.findings.texts.returns import Alternative
from dispatchq.findings.texts.screens import display

__all__ = ["reject", "write_decision"]


def reject(ctx: GateContext, finding: Finding, *, prefill: str | None, verified: bool) -> bool:
    """Reject with the person's reason (one re-ask); False, back to the options, without one."""
    t = ctx.person
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
    ctx.record.reject(finding.id, " ".join(reason.split()), ctx.today)
    ctx.summary.rejected.append(finding.id)
    if not verified:
        ctx.summary.unverified.append((finding.id, "rejected with no supported evidence"))
    return True


def write_decision(ctx: GateContext, finding: Finding, alt: Alternative, target: str | None) -> bool:
    """Write the decision as made: plan (after the plan-rejection test), approvals, pin."""
    t = ctx.person
    plan = _tested_plan(ctx, alt)
    approved = _approved(ctx, finding, plan)
    location = check_location(ctx.root, finding.value("Location"))
    new_target = check_location(ctx.root, target) if target else None
    # The Location line carries the start-line form: a range (even one equal to the
    # Target) is rewritten to it, the reviewer's original kept in the `(was: …)` tail.
    if new_target is not None and new_target.usable and new_target.target != location.token:
        ctx.record.write_location(finding.id, new_target.target or "")
        location = new_target
    label = alt.label if alt.label in ("A", "B") else "other"
    decision = Decision(label, alt.resolution, ctx.who, ctx.today)
    pinned = ctx.record.write_decision(
        finding.id,
        decision,
        plan=plan,
        roles=dict(alt.roles),
        target=location.path if location.usable else None,
    )
    if approved and plan:
        approvals = Approvals(ctx.runtime.storage.findings, ctx.repo, ctx.record.ref(finding.id))
        for check in approved:
            approvals.approve(plan, check.args, who=ctx.who, at=iso_now())
    ctx.summary.decided.append(finding.id)
    if pinned.pin is None:
        ctx.summary.unpinned.append((finding.id, pinned.why_unpinned or "no pin"))
    for path, why in pinned.unpinnable:
        ctx.summary.unpinnable.append((finding.id, path, why))
    t.say(f"{finding.id}: decided {label} — written to the report")
    return True


def _tested_plan(ctx: GateContext, alt: Alternative) -> list[Check] | None:
    """The plan to persist: `alt`'s, or None when the plan-rejection test says it cannot tell
    a fix from no fix; the checks the boundary refuses are said either way."""
    t = ctx.person
    plan: list[Check] | None = list(alt.plan) or None
    if not plan:
        return plan
    test = plan_rejection(plan, ctx.root, absent_text_only=alt.absent_text_only)
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
        return None
    return plan


def _approved(ctx: GateContext, finding: Finding, plan: list[Check] | None) -> list[Check]:
    """The plan's out-of-boundary checks the person approves now, with what declining costs."""
    t = ctx.person
    outside = [c for c in plan or [] if not c.inside_boundary]
    if not outside:
        return []
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
        return outside
    return []
