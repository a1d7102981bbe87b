"""The location pre-check, before anything is analysed: every finding gets a usable Location.

A usable Location passes; a person supplies the others at the terminal, in batches of at
most `LOCATION_BATCH`, validated by the same rule (one re-ask), and each is written into the
report at once in the extended form. A declined one is offered again next run.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatchq.errors import TamperError
from dispatchq.findings.evidence.pins import check_location
from dispatchq.findings.grammar.report import Finding
from dispatchq.findings.run.context import GateContext
from dispatchq.findings.texts.screens import LOCATION_BATCH, batches, display

__all__ = ["ask_location", "locate"]


def locate(ctx: GateContext, findings: Sequence[Finding]) -> dict[str, str]:
    """Each finding's id to the span told to its analyst, for those with a usable location."""
    located: dict[str, str] = {}
    missing = []
    for finding in findings:
        check = check_location(ctx.root, finding.value("Location"))
        if check.usable and check.span:
            located[finding.id] = check.span  # a range is told whole to the analyst
        else:
            missing.append((finding, check.why or "no location"))
    groups = batches(missing, LOCATION_BATCH)
    for number, group in enumerate(groups, 1):
        ctx.out(
            f"{len(missing)} finding(s) have no usable location; batch {number} of {len(groups)} "
            f"(at most {LOCATION_BATCH} questions):"
        )
        for finding, why in group:
            target = ask_location(ctx, finding, why)
            if target is None:
                ctx.summary.failed.append(
                    (finding.id, "no usable location (declined); offered again next run")
                )
                continue
            try:
                ctx.record.write_location(finding.id, target)
            except TamperError as error:
                ctx.summary.tampered.append((finding.id, str(error)))
                continue
            located[finding.id] = target
    return located


def ask_location(ctx: GateContext, finding: Finding, why: str) -> str | None:
    """The person's path:line for a location-less finding, or None when they decline."""
    t = ctx.person
    t.say(f"{finding.id} [{display(finding.severity)}] {display(finding.title)}: location-less ({why})")
    for attempt in (1, 2):
        answer = t.ask(f"{finding.id} location path:line (empty to decline)> ").strip()
        if not answer:
            return None
        check = check_location(ctx.root, answer)
        if check.usable and check.target:
            return check.target
        if attempt == 1:
            t.say(f"not usable ({check.why}): give path:line of an existing file inside the repository")
    return None
