"""What a person sees and types at the sweep, as text: pure, so every screen is tested as one.

Which options a finding gets (`sweep_options`) and how an answer is read (`parse_choice`,
never a guess); what is always rendered and what is held back until asked (`render_*`);
untrusted text made safe to print (`display`); the batches the person is told of before
anything is dispatched (`announce_analysis`); and the person's name as the Decision line's
grammar allows it (`who_tag`). `dispatchq.findings.run.sweep` asks the questions.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

from dispatchq.findings.grammar.report import Finding
from dispatchq.findings.texts.prompts import is_feedback_origin, retired_lines
from dispatchq.findings.texts.returns import Alternative, Citation, Proposal

__all__ = [
    "ANALYST_BATCH",
    "LOCATION_BATCH",
    "announce_analysis",
    "batches",
    "display",
    "indent",
    "options_line",
    "parse_choice",
    "render_details",
    "render_evidence",
    "render_header",
    "render_proposal",
    "render_refused",
    "render_retired",
    "render_source",
    "sweep_options",
    "who_tag",
]

ANALYST_BATCH = 8  # analysts dispatched together, announced per batch
LOCATION_BATCH = 4  # location questions asked together


def sweep_options(alternatives: Sequence[str], *, reject: bool = True, other: bool = True) -> list[str]:
    """The options one finding is offered, in order: `[A] [B] [skip] [reject]`, `[A] [skip]
    [reject]` when A is alone, without reject when its evidence diverged, and `other…`."""
    out = [label for label in ("A", "B") if label in alternatives]
    out.append("skip")
    if reject:
        out.append("reject")
    if other:
        out.append("other")
    return out


_ALIASES = {
    "a": "A",
    "b": "B",
    "s": "skip",
    "skip": "skip",
    "r": "reject",
    "reject": "reject",
    "o": "other",
    "other": "other",
    "other…": "other",
    "other...": "other",
    "d": "details",
    "details": "details",
    "?": "details",
}


def parse_choice(text: str, options: Sequence[str]) -> str | None:
    """The option a person typed, or None when it is not one of `options` (never a guess)."""
    choice = _ALIASES.get(text.strip().lower())
    if choice == "details" or (choice is not None and choice in options):
        return choice
    return None


def options_line(options: Sequence[str]) -> str:
    return " ".join(f"[{'other…' if o == 'other' else o}]" for o in options)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def display(text: str) -> str:
    """Untrusted text made safe to print on a terminal: no escape sequences, no controls."""
    return _CONTROL.sub("?", text)


def indent(text: str, prefix: str = "    ") -> list[str]:
    return [prefix + display(line) for line in (text.rstrip("\n").splitlines() or [""])]


def render_header(finding: Finding, position: int, total: int) -> list[str]:
    return [
        "",
        f"── {finding.id} [{display(finding.severity)}] {display(finding.title)}  ({position} of {total})",
    ]


def render_source(finding: Finding) -> list[str]:
    """The Source row: always rendered, and marked when the block is feedback-origin."""
    value = finding.value("Source")
    if value is None:
        return []
    mark = (
        "  [feedback-origin: a third party's comment, not validated]" if is_feedback_origin(finding) else ""
    )
    return [f"Source: {display(value)}{mark}"]


def render_retired(finding: Finding, own: Collection[str] = ()) -> list[str]:
    """Retired decisions as the person sees them: only those dispatchq's store holds are
    "already tried"; any other `Decision-retired` line is flagged as not dispatchq's."""
    mine, forged = retired_lines(finding, own)
    out = []
    if mine:
        out += ["Retired decisions (already tried):", *(f"  - {display(v)}" for v in mine)]
    if forged:
        out += [
            "Decision-retired lines NOT written by dispatchq (the block author's text, ignored):",
            *(f"  ! {display(v)}" for v in forged),
        ]
    return out


def render_proposal(proposal: Proposal) -> list[str]:
    """The always-rendered class: Target, Recommendation, Risk, both Alternatives in full,
    Code Preview, and the claims behind the analysis (their command output is held back)."""
    out = []
    if proposal.degraded:
        out.append("No code analysis: the alternatives below restate the Remediation; confirm one to use it")
    if proposal.target:
        out.append(f"Target: {display(proposal.target)}")
    if proposal.claims:
        out.append("Findings:")
        out.extend(f"  - {display(c.claim)}" for c in proposal.claims)
    out.append("Alternatives:")
    for alt in proposal.alternatives:
        recommended = proposal.recommendation is not None and proposal.recommendation[0] == alt.label
        out.append(f"  {alt.label}{' (recommended)' if recommended else ''}: {display(alt.resolution)}")
    if proposal.a_alone:
        why = f": {display(proposal.a_alone_reason)}" if proposal.a_alone_reason else ""
        out.append(f"  (A alone{why})")
    who = "restater" if proposal.degraded else "analyst"
    for alt in proposal.alternatives:
        out.extend(render_refused(alt, who))
    if proposal.recommendation is not None:
        out.append(f"Recommendation: {proposal.recommendation[0]} — {display(proposal.recommendation[1])}")
    if proposal.risk:
        out.append(f"Risk: {display(proposal.risk)}")
    if proposal.code_preview:
        out.append("Code preview:")
        out.extend(indent(proposal.code_preview))
    return out


def render_refused(alt: Alternative, who: str) -> list[str]:
    """The checks of `alt` the check grammar refused: the session's error, each dropped from
    the plan alone (the rest of its answer stands), and said so, never silently."""
    if not alt.refused:
        return []
    n = len(alt.refused)
    out = [
        f"  {alt.label}: {n} check{'s' if n != 1 else ''} the {who} wrote "
        f"{'are' if n != 1 else 'is'} refused by the check grammar and dropped from the plan "
        f"(the {who}'s error):"
    ]
    out.extend(f"    ! {display(text)} ({display(why)})" for text, why in alt.refused)
    return out


def render_details(proposal: Proposal) -> list[str]:
    """The held-back class: the command output behind each claim, and every plan."""
    out = ["Evidence behind the findings:"]
    for claim in proposal.claims:
        out.append(f"  - {display(claim.claim)}")
        for command, output in claim.evidence:
            out.append(f"    $ {display(command)}")
            out.extend(indent(output or "(no output)", "      "))
    for alt in proposal.alternatives:
        out.append(f"Verification plan for {alt.label}:")
        if not alt.plan:
            out.append("    (none)")
        for index, check in enumerate(alt.plan):
            flag = "  [fails only because the edit's text is absent]" if index in alt.absent_text_only else ""
            where = "" if check.inside_boundary else "  [outside the boundary: needs your approval]"
            out.append(f"    {display(check.text)}{where}{flag}")
    return out


def render_evidence(rows: Sequence[tuple[Citation, str | None, bool | None]]) -> list[str]:
    """The reject evidence gate's re-run, never held back: per citation the fresh output,
    side by side with the recording where they diverge, or why it was not executed."""
    out = []
    for citation, fresh, ok in rows:
        out.append(f"  $ {display(citation.command)}")
        if citation.check is None or fresh is None:
            out.append(f"    [not executed: {citation.outside or 'outside the execution boundary'}]")
            out.append("    recorded:")
            out.extend(indent(citation.recorded or "(empty)", "      "))
            continue
        if ok:
            out.append("    re-run output (supports the recording):")
            out.extend(indent(fresh or "(empty)", "      "))
        else:
            out.append("    DIVERGES — recorded | fresh:")
            rec = (citation.recorded or "(empty)").splitlines()
            new = (fresh or "(empty)").splitlines()
            width = max((len(display(r)) for r in rec), default=0)
            for index in range(max(len(rec), len(new))):
                left = display(rec[index]) if index < len(rec) else ""
                right = display(new[index]) if index < len(new) else ""
                out.append(f"      {left.ljust(width)} | {right}")
    return out


def batches(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def announce_analysis(count: int) -> str:
    """`13 findings to analyse, in 2 batches of at most 8`, stated before anything is dispatched."""
    n = -(-count // ANALYST_BATCH)
    noun = "finding" if count == 1 else "findings"
    return f"{count} {noun} to analyse, in {n} batch{'es' if n != 1 else ''} of at most {ANALYST_BATCH}"


def who_tag(name: str) -> str:
    """The person's name as the Decision line's grammar allows it."""
    clean = re.sub(r"[^A-Za-z0-9._@-]", "", name)
    return clean or "user"
