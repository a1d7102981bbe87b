"""`dispatchq findings`: inspect a findings report's decision record (read only).

    dispatchq findings check REPORT [--repo DIR] [--json]
    dispatchq findings pin REPORT FINDING-ID [--repo DIR] [--json]

`check` says, per finding, what the report holds, whether its location is usable (and
why not), its decision state and every grammar violation with its line number; it
exits 1 when there is any violation, so it can gate a CI step. `pin` computes the
`**Decision-pin:**` line the live decision would get now, and never writes it.

Neither command writes anything, to the report or to the store. The stages that do:

    dispatchq findings run REPORT [--repo DIR] [--json]       the whole gate, decisions to grades
    dispatchq findings sweep REPORT [--repo DIR] [--json]     locations, analysis and the sweep
    dispatchq findings dispatch REPORT [--repo DIR] [--json]  fixers and grading of decided findings

`sweep` and `run` take answers only from an interactive terminal: with none, they write
nothing more, say how many findings were left undecided and exit 3. `dispatch` asks nothing
and is safe to run unattended. Sessions are session-tier judgements run in this process
(in burst, like `dispatchq run`), or by a running `dispatchq worker session`; a closed usage
window leaves them waiting in line (exit 1) and a later run picks them up.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from dispatchq.findings.evidence.pins import check_location, compute_pin, git_toplevel, specs_for
from dispatchq.findings.evidence.record import finding_state, inspect_finding
from dispatchq.findings.grammar.lines import LOCATION
from dispatchq.findings.grammar.report import read_report

__all__ = [
    "check",
    "dispatch",
    "findings",
    "pin",
    "repository",
    "run",
    "sweep",
]

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


def _record(report: Path, root: Path) -> tuple[Any, str | None]:
    """The report's DecisionRecord with dispatchq's store, or why there is none: tamper
    evidence needs dispatchq's copy in Redis, which `check` reads but never starts."""
    from dispatchq.cli import settings
    from dispatchq.errors import RedisUnavailable, RedisUnreachable
    from dispatchq.findings.evidence.record import DecisionRecord, RecordStore
    from dispatchq.storage.connection import connect
    from dispatchq.storage.gateway import Storage

    try:
        client = connect(settings(), start=False)
    except (RedisUnavailable, RedisUnreachable) as error:
        return None, str(error)
    return DecisionRecord(report, root, RecordStore(Storage(client).findings, root)), None


@findings.command("check")
@_REPORT
@_REPO
@_JSON
def check(report: Path, repo: Path | None, as_json: bool) -> None:
    """Validate REPORT: fields, location, decision state and violations per finding."""
    root = repository(repo)
    parsed = read_report(report)
    record, why = _record(report, root)
    tamper = record.tamper if record is not None else None
    inspections = [inspect_finding(f, root, tamper=tamper) for f in parsed.findings]
    problems = list(parsed.problems)
    failing = bool(problems) or any(i.violations or i.tamper for i in inspections)
    if as_json:
        payload = {
            "report": str(report),
            "repo": str(root),
            "problems": [p.to_json() for p in problems],
            "findings": [i.to_json() for i in inspections],
            "tamper_evidence": why or "checked against dispatchq's copy",
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
            for t in item.tamper:
                click.echo(f"  {report}:{t.line}: tamper: {t.message}")
        total = sum(len(i.violations) for i in inspections) + len(problems)
        click.echo(f"{len(inspections)} finding(s), {total} violation(s)")
        if why:
            click.echo(f"tamper evidence not checked: {why}")
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


class _SaidByTheGate(logging.Filter):
    """RQ's line for a session job it found abandoned (`… Moved to FailedJobRegistry, due to
    AbandonedJobError …`) is not for the person at this terminal: the gate says in its own
    words which judgement that was and that it is back in line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "AbandonedJobError" not in record.getMessage()


def _quiet_logs(log_format: str) -> None:
    """This command's log lines go through dispatchq's one handler (warnings and worse, to
    stderr), without the RQ lines the gate reports itself."""
    from dispatchq.process import logs

    logs.configure("findings", log_format, level=logging.WARNING)
    registry = logging.getLogger("rq.registry")
    if not any(isinstance(f, _SaidByTheGate) for f in registry.filters):
        registry.addFilter(_SaidByTheGate())


def _gate(report: Path, repo: Path | None, as_json: bool, *, interactive: bool) -> Any:
    """A Gate on this report, with the session tier's built-in kinds and this terminal."""
    from dispatchq.cli import settings
    from dispatchq.config import load_config
    from dispatchq.errors import UserError
    from dispatchq.findings.run.gate import Gate
    from dispatchq.findings.run.kinds import builtin_kinds
    from dispatchq.findings.run.terminal import Terminal
    from dispatchq.launcher.environment import mark_non_dumpable
    from dispatchq.process.wiring import build_runtime, set_runtime

    root = repository(repo)
    read_report(report)  # a missing or unreadable report is a one-line error
    s = settings()
    # Checked first: every judgement names this checkout, and the dispatcher refuses one
    # outside the roots; finding out after the analysis was announced wastes the run.
    roots = [Path(os.path.realpath(r)) for r in s.checkout_roots]
    if not any(root == r or root.is_relative_to(r) for r in roots):
        shown = os.pathsep.join(str(r) for r in roots)
        raise UserError(
            f"{root} is outside DISPATCHQ_CHECKOUT_ROOTS ({shown}): the gate's sessions run only "
            "in a checkout under one of them. Add it, e.g. "
            f"DISPATCHQ_CHECKOUT_ROOTS={shown}{os.pathsep}{root}"
        )
    mark_non_dumpable()  # this process runs sessions: keep them out of its memory and environ
    _quiet_logs(s.log_format)
    rt = build_runtime(s, config=load_config(s.config, builtin=builtin_kinds(), required=False))
    set_runtime(rt)
    stream = sys.stderr if as_json else sys.stdout
    terminal = Terminal(sys.stdin, stream) if interactive and Terminal.interactive() else None

    def out(text: str) -> None:
        stream.write(text + "\n")
        stream.flush()

    return Gate(rt, report, root, terminal=terminal, out=out)


def _finish(gate: Any, as_json: bool) -> None:
    summary = gate.summary
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=2, ensure_ascii=False))
    else:
        for line in summary.lines():
            click.echo(line)
    if summary.aborted:
        sys.exit(3)
    if summary.waiting:
        sys.exit(1)


def _interrupted(gate: Any) -> None:
    gate.summary.aborted = "interrupted: nothing more was written; run again to resume"
    gate.summary.undecided = len(gate.undecided())


@findings.command("run")
@_REPORT
@_REPO
@_JSON
def run(report: Path, repo: Path | None, as_json: bool) -> None:
    """The whole gate on REPORT: location pre-check, analysis, the sweep, dispatch, grading.

    Answers come only from an interactive terminal. Decided findings are replayed, never
    asked again; a dispatch whose outcome is unknown is verified before anything else.
    """
    gate = _gate(report, repo, as_json, interactive=True)
    try:
        gate.run()
    except KeyboardInterrupt:
        _interrupted(gate)
    _finish(gate, as_json)


@findings.command("sweep")
@_REPORT
@_REPO
@_JSON
def sweep(report: Path, repo: Path | None, as_json: bool) -> None:
    """Locations, analysts and a person's decision per finding, on REPORT."""
    gate = _gate(report, repo, as_json, interactive=True)
    try:
        gate.decide()
        gate.finish()
    except KeyboardInterrupt:
        _interrupted(gate)
    _finish(gate, as_json)


@findings.command("dispatch")
@_REPORT
@_REPO
@_JSON
def dispatch(report: Path, repo: Path | None, as_json: bool) -> None:
    """Fixers, verification and grading of REPORT's decided findings (asks nothing)."""
    gate = _gate(report, repo, as_json, interactive=False)
    try:
        aside = gate.dispatch()
        for fid in aside:
            gate.summary.notes.append(f"{fid} was set aside: `dispatchq findings sweep` decides it again")
    except KeyboardInterrupt:
        _interrupted(gate)
    _finish(gate, as_json)
