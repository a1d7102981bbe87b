"""`dispatchq triage`: evaluate an event now, lint the rules, replay history, apply a suggestion.

    dispatchq triage --event FILE [--answers FILE] [--mode M] [--json]
    dispatchq triage lint [--json]
    dispatchq triage replay [--since T] [--mode M] [--gate-auto X] [--json]
    dispatchq triage apply DECISION-ID [--rule R]... [--json]

With `--answers FILE` no provider is called: the file is the provider. Without it and
without a TypeSafe key, every question is asked and comes back empty, so every rule
that needed an answer is listed as `no_answers` (never an empty list).
"""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import click

from dispatchq.cli import runtime, settings
from dispatchq.errors import ConfigError, UserError
from dispatchq.storage.triage import TriageStorage
from dispatchq.tiers.typed.tier import provider_ask, provider_for
from dispatchq.triage.engine import (
    AnswersFrom,
    Ask,
    TriageStore,
    answers_file_ask,
    apply_suggested,
    budget_for,
    replay,
    triage,
)
from dispatchq.triage.executors import Executor, build_executor, capabilities
from dispatchq.triage.jobs import enqueue_triage
from dispatchq.triage.rules import MODES, Event, Mode, TriageConfig, decision_key
from dispatchq.triage.table import lint

__all__ = ["apply_command", "lint_command", "replay_command", "triage_command"]

# --- wiring: where the config, Redis, the executor's credentials and the provider come from.


def _load_triage_config() -> TriageConfig:
    """The validated `triage` section of DISPATCHQ_CONFIG."""
    config = runtime().config
    if config.triage is None:
        raise ConfigError(f"{config.path or 'config'}: triage: the section is missing")
    return cast(TriageConfig, config.triage)


def _storage() -> TriageStorage:
    return runtime(config=False).storage.triage


def _executor(config: TriageConfig, storage: TriageStorage) -> Executor:
    s = settings()
    return build_executor(
        config.executor,
        storage,
        github_token=s.github_token,
        github_api_url=s.github_api_url,
        repositories=config.repositories,
    )


def _provider_ask() -> Ask:
    """The typed tier's provider (keyless: every question asked, none answered, no request)."""
    return provider_ask(provider_for(runtime(config=False)))


# --- end of wiring -------------------------------------------------------------------------


def _read_json(path: Path, what: str) -> Any:
    """The file's JSON, or one line naming the file and what is wrong (a byte offset for bad UTF-8)."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise UserError(f"{what} {path}: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(
            f"{what} {path}: not UTF-8 (byte 0x{raw[error.start]:02x} at offset {error.start})"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"{what} {path}: not JSON ({error.msg} at line {error.lineno})") from None
    surrogate = _lone_surrogate(data)
    if surrogate is not None:
        raise UserError(f"{what} {path}: {surrogate}")
    return data


def _lone_surrogate(value: Any, where: str = "") -> str | None:
    """Where a lone surrogate (`"\\ud800"`, valid JSON but no text) sits, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as bad:
            return f"{where or 'the value'}: a lone surrogate \\u{ord(value[bad.start]):04x} is not text"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        at = f"{where}.{key}" if isinstance(key, str) else f"{where}[{key}]"
        found = _lone_surrogate(key, at) if isinstance(key, str) else None
        found = found or _lone_surrogate(item, at.lstrip("."))
        if found:
            return found
    return None


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _parse_since(text: str) -> float:
    """`2h`, `30m`, `7d` ago, or an ISO-8601 instant (UTC when it names no zone)."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if match:
        return time.time() - int(match[1]) * _UNITS[match[2]]
    try:
        instant = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UserError(
            f"--since: expected a duration such as 2h or an ISO-8601 time, got {text!r}"
        ) from None
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=UTC)
    return instant.timestamp()


@click.group("triage", invoke_without_command=True)
@click.option(
    "--event", "event_file", type=click.Path(dir_okay=False, path_type=Path), help="Event JSON file."
)
@click.option(
    "--answers",
    "answers_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Answers JSON file (question id -> the SDK's wire answer); replaces the provider.",
)
@click.option("--mode", type=click.Choice(MODES), help="Override triage.mode for this run.")
@click.option(
    "--enqueue",
    is_flag=True,
    help="Put the event on the typed queue; a typed worker asks, resolves and acts.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the decision as JSON.")
@click.pass_context
def triage_command(
    ctx: click.Context,
    event_file: Path | None,
    answers_file: Path | None,
    mode: str | None,
    enqueue: bool,
    as_json: bool,
) -> None:
    """Resolve an event's planned actions to applied, suggested and suppressed.

    \b
    dispatchq triage --event issue.json                 # evaluate now, print the three lists
    dispatchq triage --event issue.json --answers a.json   # offline: answers replace the provider
    dispatchq triage --event issue.json --enqueue       # let a typed worker do it
    """
    if ctx.invoked_subcommand is not None:
        if event_file or answers_file or mode or as_json or enqueue:
            raise click.UsageError(
                "--event, --answers, --mode, --enqueue and --json belong to `triage` itself, not a subcommand"
            )
        return
    if event_file is None:
        raise click.UsageError("give --event FILE, or a subcommand: lint, replay, apply")
    event = Event.from_json(_read_json(event_file, "event file"))
    config = _load_triage_config()
    if enqueue:
        if answers_file is not None:
            raise click.UsageError("--answers is for evaluating now; an enqueued event asks the provider")
        queues = runtime().dispatcher
        job_id = enqueue_triage(queues, settings(), _read_json(event_file, "event file"), mode)
        decision = decision_key(event, config)
        if as_json:
            _echo_json({"decision_id": decision, "job": job_id, "queued": True})
        else:
            click.echo(f"queued {decision} (job {job_id})")
        return
    answers_from: AnswersFrom = "provider" if answers_file is None else "file"
    if answers_file is not None:
        ask = answers_file_ask(_read_json(answers_file, "answers file"))
    else:
        ask = _provider_ask()
    storage = _storage()
    executor = _executor(config, storage)
    try:
        result = triage(
            event,
            config,
            ask=ask,
            store=TriageStore(storage),
            executor=executor,
            budget=budget_for(storage, config, settings().triage_hourly_budget),
            mode_override=cast(Mode | None, mode),
            answers_from=answers_from,
        )
    finally:
        executor.close()
    if as_json:
        _echo_json(result.to_json())
    else:
        click.echo(result.render(config))


@triage_command.command("lint")
@click.option("--json", "as_json", is_flag=True, help="Print problems as JSON.")
def lint_command(as_json: bool) -> None:
    """Report references that will fail at run time; exit 1 if there are any (for CI)."""
    config = _load_triage_config()
    # Only what the executor supports is consulted: no Redis, no network, no token needed.
    problems = lint(config, capabilities(config.executor), config.base_dir)
    if as_json:
        _echo_json([p.to_json() for p in problems])
    elif problems:
        for problem in problems:
            click.echo(f"{problem}  [{problem.reason}]")
    else:
        click.echo("triage: no problems found")
    if problems:
        sys.exit(1)


@triage_command.command("replay")
@click.option("--since", "since_text", help="Only events seen since: 2h, 7d, or an ISO-8601 time.")
@click.option("--mode", type=click.Choice(MODES), help="Resolve as if triage.mode were this.")
@click.option("--gate-auto", type=click.FloatRange(0.0, 1.0), help="Resolve as if gate.auto were this.")
@click.option(
    "--include-file-answers",
    is_flag=True,
    help="Also replay events decided over --answers files (left out by default: they are what-ifs).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the changes as JSON.")
def replay_command(
    since_text: str | None,
    mode: str | None,
    gate_auto: float | None,
    include_file_answers: bool,
    as_json: bool,
) -> None:
    """Re-resolve stored events over stored answers (no provider call); show what would change.

    Only answers the provider gave are used unless --include-file-answers; the summary
    says how many decisions came from which answers, and how many under an earlier config.
    """
    since = _parse_since(since_text) if since_text else None
    config = _load_triage_config()
    storage = _storage()
    executor = _executor(config, storage)
    try:
        report = replay(
            TriageStore(storage),
            config,
            executor=executor,
            since=since,
            mode=cast(Mode | None, mode),
            gate_auto=gate_auto,
            include_file_answers=include_file_answers,
        )
    finally:
        executor.close()
    if as_json:
        _echo_json(report.to_json())
        return
    click.echo(report.summary())
    for change in report.changes:
        click.echo("  " + change.render())


@triage_command.command("apply")
@click.argument("decision_id")
@click.option("--rule", "rules", multiple=True, help="Apply only this rule's suggestions (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
def apply_command(decision_id: str, rules: tuple[str, ...], as_json: bool) -> None:
    """Perform the suggested actions of a decision that a person accepted."""
    config = _load_triage_config()
    storage = _storage()
    executor = _executor(config, storage)
    try:
        done = apply_suggested(
            decision_id, config, store=TriageStore(storage), executor=executor, rules=rules
        )
    finally:
        executor.close()
    if as_json:
        _echo_json([e.to_json() for e in done])
    else:
        for entry in done:
            click.echo(f"{entry.action.text()}    [{entry.rule}] {entry.executed}")
    if any(not (e.executed or "").startswith(("performed", "unchanged", "already")) for e in done):
        sys.exit(1)
