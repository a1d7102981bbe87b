"""The gate's sessions as judgements: a read-only question, its enqueueing, the restater.

Every session is a session-tier judgement. The gate enqueues it and runs the session tier
in-process until it is done (`settle`), so a gate works with or without the Procfile's
workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dispatchq.core.judgement import canonical_json, sha256_hex
from dispatchq.errors import ContractError, GitUnavailable, UserError
from dispatchq.findings.evidence.pins import block_hash, hash_paths
from dispatchq.findings.grammar.report import Finding
from dispatchq.findings.run.context import GateContext
from dispatchq.findings.run.settle import settle
from dispatchq.findings.texts.prompts import foreign_tokens
from dispatchq.findings.texts.returns import RESTATER, Alternative, parse_restatement

__all__ = ["Unrestated", "enqueue", "question", "restate"]


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


def question(
    ctx: GateContext, kind: str, finding: Finding, state: dict[str, Any], salt: str = ""
) -> dict[str, Any]:
    """A read-only question about a finding, as a judgement. Its key names the finding,
    the block as it stands, its location, its history and the target file's content:
    asking again about an unchanged finding reuses the answer (no session spent), and any
    change asks afresh."""
    ref = ctx.record.ref(finding.id)
    location = str(state.get("location"))
    path = location.rsplit(":", 1)[0]
    try:
        blob = hash_paths(ctx.root, [path]).get(path, "?")
    except GitUnavailable:
        blob = "?"
    identity = [kind, ctx.repo, ref, block_hash(finding), location, state.get("retired"), blob, salt]
    digest = sha256_hex(canonical_json(identity))
    return {
        "kind": kind,
        "target": ref,
        "item": f"{kind.removeprefix('findings-')} of block {block_hash(finding)[:16]}",
        "context": {"checkout": str(ctx.root)},
        "state": state,
        "key": f"gate:{digest}",
    }


def enqueue(ctx: GateContext, judgements: Sequence[dict[str, Any]], *, force: bool = False) -> list[str]:
    results = ctx.client.enqueue_many(list(judgements), force=force)
    ids = []
    for r in results:
        if not r.ok or r.id is None:
            raise UserError(f"cannot enqueue a gate judgement: {r.error}")
        ids.append(r.id)
    return ids


def restate(
    ctx: GateContext,
    finding: Finding,
    state: dict[str, Any],
    *,
    mode: str,
    answer: str = "",
    again: bool = False,
) -> tuple[Alternative, ...] | Unrestated:
    """Ask the restater; the alternatives it returns, or why there are none (and whose
    fault that is). `again` asks a fresh session rather than reusing the last answer."""
    asked = {**state, "mode": mode, "answer": answer}
    if foreign_tokens(answer):
        return Unrestated("the answer carries a delimiter of another invocation", person=True)
    salt = f"{mode}\0{answer}" + ("\0again" if again else "")
    (jid,) = enqueue(ctx, [question(ctx, RESTATER, finding, asked, salt=salt)])
    why = settle(ctx.runtime, [jid], on_wait=ctx.out)
    judgement = ctx.runtime.storage.records.get(jid)
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
