"""The dispatch: every decided finding to a `findings-fixer` judgement, one per attempt.

Tamper evidence is read first, before anything a changed line says is used. Each judgement
is bound to the host and checkout holding the report; what must be true at the moment of
the spawn, and the verification and grading right after the session, run inside the job
(`dispatchq.findings.run.fixer`). Here the gate waits for the jobs and folds each outcome
into the summary: another attempt, a second sweep, or done.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dispatchq.core.judgement import canonical_json, sha256_hex
from dispatchq.findings.evidence.pins import block_hash
from dispatchq.findings.grammar.report import Finding
from dispatchq.findings.run.context import GateContext
from dispatchq.findings.run.fixer import AttemptState, attempt_key, decision_key
from dispatchq.findings.run.sessions import enqueue
from dispatchq.findings.run.settle import settle
from dispatchq.findings.texts.returns import FIXER

__all__ = ["dispatch_decided", "fixer_judgement", "tamper_first"]


def dispatch_decided(ctx: GateContext, only: Iterable[str] | None = None) -> list[str]:
    """Dispatch every decided finding, one fixer judgement per attempt; returns the ids
    set aside (a pin mismatch nobody can explain) for a second sweep."""
    wanted = list(only) if only is not None else None
    aside: list[str] = []
    pending = [f.id for f in ctx.decided(wanted)]
    retry: set[str] = set()  # a job that ended with no outcome is run again, once, afresh
    for _wave in range(4):
        todo = _untampered(ctx, pending, aside, retry)
        if not todo:
            break
        ctx.out(f"dispatching {len(todo)} decided finding(s), one at a time per repository")
        jobs = [fixer_judgement(ctx, f) for f in todo]
        ids = [enqueue(ctx, [job], force=f.id in retry)[0] for (job, _), f in zip(jobs, todo, strict=True)]
        why = settle(ctx.runtime, ids, on_wait=ctx.out)
        pending = []
        for (_, attempt), finding, jid in zip(jobs, todo, ids, strict=True):
            again = _outcome(ctx, finding, attempt, jid, why, retry)
            if again == "set-aside":
                aside.append(finding.id)
            elif again == "again":
                pending.append(finding.id)
    ctx.finish()
    return aside


def _untampered(ctx: GateContext, pending: list[str], aside: list[str], retry: set[str]) -> list[Finding]:
    """The pending findings still decided, tamper evidence read first: a set-aside one goes
    to `aside`, and one to verify again to `retry`."""
    findings = {f.id: f for f in ctx.decided(pending)}
    todo = []
    for fid in pending:
        if fid not in findings:
            continue
        verdict = tamper_first(ctx, findings[fid])
        if verdict == "set-aside":
            aside.append(fid)
            continue
        if verdict == "re-verify":
            retry.add(fid)  # the cached outcome is not replayed: the job verifies again
        todo.append(findings[fid])
    return todo


def _outcome(
    ctx: GateContext, finding: Finding, attempt: int, jid: str, why: str | None, retry: set[str]
) -> str | None:
    """One fixer job's outcome folded into the summary; "again" when the finding is run again
    (a broken job, once, afresh; or a new attempt), "set-aside" for a second sweep."""
    judgement = ctx.runtime.storage.records.get(jid)
    key = attempt_key(ctx.repo, ctx.record.ref(finding.id), decision_key(finding), attempt)
    state = AttemptState(ctx.runtime, key).load()
    result = state.get("outcome") if state.get("phase") == "done" else None
    finished = judgement is not None and judgement.finished
    broken = not isinstance(result, dict) or result.get("outcome") == "error"
    if broken and finished and finding.id not in retry:
        retry.add(finding.id)
        return "again"
    if not isinstance(result, dict):
        if finished:
            status = judgement.status if judgement else "gone"
            ctx.summary.failed.append(
                (finding.id, f"attempt {attempt}: the fixer job ended without an outcome ({status})")
            )
        else:
            reason = (judgement.reason if judgement else None) or why or "not started"
            ctx.summary.waiting.append((finding.id, f"dispatch waits: {reason}"))
        return None
    return ctx.summary.account(finding.id, attempt, result)


def tamper_first(ctx: GateContext, finding: Finding) -> str | None:
    """Tamper evidence before anything a changed line says is used (a plan, a pin, a cached
    outcome). A deleted Status line only: reported, and the tree verified again
    ("re-verify"). Any other change: reported with its diff, and the finding set aside
    with nothing run ("set-aside")."""
    tamper = ctx.record.tamper(finding)
    if not tamper:
        return None
    why = "; ".join(t.message for t in tamper)
    ctx.summary.add_unique("tampered", (finding.id, why))
    if all(t.status_gone for t in tamper):
        return "re-verify"
    ctx.record.supersede(finding.id)
    ctx.summary.set_aside.append((finding.id, f"tamper evidence, nothing ran: {why}"))
    return "set-aside"


def fixer_judgement(ctx: GateContext, finding: Finding) -> tuple[dict[str, Any], int]:
    """The fixer judgement for the finding's next attempt, and that attempt's number. Its
    key names the repository, the finding, the decision, the attempt and the block."""
    decision = finding.decision()
    assert decision is not None
    attempt = len(decision.attempts) + 1
    block = block_hash(finding)
    ref = ctx.record.ref(finding.id)
    which = decision_key(finding)
    identity = [FIXER, ctx.repo, ref, which, attempt, block]
    state = {
        "report": str(ctx.report),
        "root": str(ctx.root),
        "finding": finding.id,
        "attempt": attempt,
        "block": block,
        "decision": which,
        "status_at_start": ctx.status_at_start.get(finding.id),
    }
    judgement = {
        "kind": FIXER,
        "target": ref,
        "item": f"attempt {attempt} block {block}",
        "context": {"checkout": str(ctx.root)},
        "state": state,
        "key": "gate:" + sha256_hex(canonical_json(identity)),
    }
    return judgement, attempt
