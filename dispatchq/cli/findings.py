"""`dispatchq findings`: inspect a findings report's decision record (read only).

    dispatchq findings check REPORT [--repo DIR] [--json]
    dispatchq findings pin REPORT FINDING-ID [--repo DIR] [--json]

`check` says, per finding, what the report holds, whether its location is usable (and
why not), its decision state and every grammar violation with its line number; it
exits 1 when there is any violation, so it can gate a CI step. `pin` computes the
`**Decision-pin:**` line the live decision would get now, and never writes it.

Neither command writes anything, to the report or to the store. The stages that do
(`run`, `sweep`, `dispatch`) are added to this same group.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from dispatchq.record import (
    check_location,
    compute_pin,
    finding_state,
    git_toplevel,
    inspect_finding,
    specs_for,
)
from dispatchq.report import LOCATION, read_report

_REPORT = click.argument("report", type=click.Path(path_type=Path, dir_okay=True))
_REPO = click.option(
    "--repo",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Repository root (default: the git toplevel of the current directory).",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def repository(repo: Path | None) -> Path:
    """The repository the report's paths are relative to, resolved physically."""
    return git_toplevel(repo if repo is not None else Path.cwd())


@click.group("findings")
def findings() -> None:
    """Findings reports and the decisions recorded in them."""


@findings.command("check")
@_REPORT
@_REPO
@_JSON
def check(report: Path, repo: Path | None, as_json: bool) -> None:
    """Validate REPORT: fields, location, decision state and violations per finding."""
    root = repository(repo)
    parsed = read_report(report)
    inspections = [inspect_finding(f, root) for f in parsed.findings]
    problems = list(parsed.problems)
    failing = bool(problems) or any(i.violations for i in inspections)
    if as_json:
        payload = {
            "report": str(report),
            "repo": str(root),
            "problems": [p.to_json() for p in problems],
            "findings": [i.to_json() for i in inspections],
        }
        click.echo(json.dumps(payload, indent=2, ensure_ascii=False))
    else:
        for problem in problems:
            click.echo(f"{report}:{problem.line}: {problem.message}")
        for item in inspections:
            f = item.finding
            need = "needs-decision" if f.needs_decision else "auto"
            click.echo(f"{f.id}  [{f.severity}]  line {f.number}  {need}  state: {item.state}")
            click.echo(f"  title: {f.title}")
            loc = item.location
            if loc.usable:
                click.echo(f"  location: {loc.target} (usable)")
            else:
                shown = f" {loc.token!r}" if loc.token is not None else ""
                click.echo(f"  location-less ({loc.why}){shown}")
            names = ", ".join(f"{x.name} ({x.number})" for x in f.fields) or "none"
            click.echo(f"  fields: {names}")
            for violation in item.violations:
                click.echo(f"  {report}:{violation.line}: {violation.message}")
        total = sum(len(i.violations) for i in inspections) + len(problems)
        click.echo(f"{len(inspections)} finding(s), {total} violation(s)")
    if failing:
        sys.exit(1)


@findings.command("pin")
@_REPORT
@click.argument("finding_id", metavar="FINDING-ID")
@_REPO
@_JSON
def pin(report: Path, finding_id: str, repo: Path | None, as_json: bool) -> None:
    """Compute (never write) the Decision-pin line for FINDING-ID's live decision."""
    root = repository(repo)
    finding = read_report(report).finding(finding_id)
    result = compute_pin(finding, specs_for(finding, root), root)
    recorded = finding.value("Decision-pin")
    current = result.pin.format() if result.pin else None
    if as_json:
        payload = {
            "id": finding.id,
            "state": finding_state(finding),
            "target": check_location(root, finding.value(LOCATION)).target,
            **result.to_json(),
            "line": result.line,
            "recorded": recorded,
            "matches": None if recorded is None or current is None else recorded == current,
        }
        click.echo(json.dumps(payload, indent=2, ensure_ascii=False))
        return
    if result.line is None:
        click.echo(f"{finding.id}: unpinned ({result.why_unpinned})", err=True)
        sys.exit(1)
    click.echo(result.line)
    for path, why in result.unpinnable:
        click.echo(f"unpinnable: {path}: {why}", err=True)
    if recorded is None:
        click.echo("no pin recorded", err=True)
    elif recorded == current:
        click.echo("the recorded pin matches", err=True)
    else:
        click.echo("the recorded pin differs", err=True)


def register(main: click.Group) -> None:
    main.add_command(findings)
