"""Producer commands: enqueue, result, list, cancel, retry, prune, and `run` (the main job)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dispatchq.cli import console as make_console
from dispatchq.cli import print_json, runtime
from dispatchq.core.judgement import FINISHED, STATUSES, Record
from dispatchq.core.priority import PRIORITIES
from dispatchq.core.tiers import TIERS, automatic_tiers
from dispatchq.errors import UserError
from dispatchq.storage.outage import out_of_memory_message, outage_reason

if TYPE_CHECKING:
    # rich is imported where a table or a bar is drawn: `--json` runs in scripts' loops.
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

__all__ = [
    "MIN_ID_PREFIX",
    "TABLE_LIMIT",
    "cancel",
    "enqueue",
    "full_id",
    "list_",
    "prune",
    "result",
    "retry",
    "run",
]

TABLE_LIMIT = 200


def _short(value: Any, width: int = 60) -> str:
    import json

    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _cut_off(client: Any, first: int | None, count: int) -> None:
    """Redis failed part way: the ids above went in; say where to resume, then exit."""
    cause = client.interrupted
    full = out_of_memory_message(cause, client.runtime.redis)
    reason = full or f"Redis became unreachable: {outage_reason(cause)}"
    click.echo(
        f"error: {reason}; nothing was written from input line {first} on ({count} lines). "
        f"Re-send from line {first}: a judgement already in is recognised, not written twice.",
        err=True,
    )
    sys.exit(2 if full else 1)


@click.command()
@click.argument("source", required=False, metavar="[-]")
@click.option("--kind", "-k", help="The kind of judgement (declared in the config).")
@click.option("--target", "-t", help="What it is about, e.g. acme/app#12 or a path.")
@click.option("--item", "-i", help="Which part of the target, e.g. comment:99.")
@click.option("--state", "state_text", help="JSON the typed tier reads, or @file.")
@click.option("--context", "context_text", help="JSON object (context.checkout: a directory), or @file.")
@click.option("--key", help="Your own idempotency key, instead of the content key.")
@click.option(
    "--priority",
    type=click.Choice(PRIORITIES),
    help="Its class: the session line serves urgent, then normal, then background (default: the kind's).",
)
@click.option("--force", is_flag=True, help="Judge again even if the same judgement is live.")
@click.option("--json", "as_json", is_flag=True, help="With '-': print one JSON object per input line.")
def enqueue(
    source: str | None,
    kind: str | None,
    target: str | None,
    item: str | None,
    state_text: str | None,
    context_text: str | None,
    key: str | None,
    priority: str | None,
    force: bool,
    as_json: bool,
) -> None:
    """Enqueue one judgement (prints its id), or JSON Lines from stdin with '-'.

    \b
    dispatchq enqueue --kind comment-actionable --target acme/app#12 --state '{"body": "..."}'
    producer | dispatchq enqueue -        # prints LINE<TAB>ID per good line

    Enqueueing a judgement that is already live returns its id and does no work.
    A bad line is reported with its number and does not stop the others; the exit
    status is 1 if any line was refused.
    """
    from dispatchq.client import Client
    from dispatchq.queue.dispatch import parse_json_arg

    client = Client(runtime=runtime())
    if source is not None:
        if source != "-":
            raise UserError(f"unexpected argument {source!r} (use '-' to read JSON Lines from stdin)")
        if any(v is not None for v in (kind, target, item, state_text, context_text, key, priority)):
            raise UserError(
                "with '-', every judgement comes from stdin (a line's own `priority` field included); "
                "drop --kind/--target/... options"
            )
        results = client.enqueue_lines(sys.stdin.buffer, force=force)
        failed = 0
        out = []
        first_unwritten = next((r.index for r in results if r.unwritten), None)
        for r in results:
            if r.unwritten:
                continue  # said once below, not once per line
            if as_json:
                out.append(json.dumps({"line": r.index, "id": r.id, "created": r.created, "error": r.error}))
            elif r.ok:
                out.append(f"{r.index}\t{r.id}")
            if not r.ok:
                failed += 1
                if not as_json:
                    click.echo(f"line {r.index}: {r.error}", err=True)
        if out:
            sys.stdout.write("\n".join(out) + "\n")
        if client.interrupted is not None:
            _cut_off(client, first_unwritten, sum(1 for r in results if r.unwritten))
        if failed:
            click.echo(f"{failed} of {len(results)} lines refused", err=True)
            sys.exit(1)
        return
    if not kind or not target:
        raise UserError("give --kind and --target (or '-' to read JSON Lines from stdin)")
    state = parse_json_arg(state_text, "--state") if state_text is not None else None
    context = parse_json_arg(context_text, "--context") if context_text is not None else {}
    if not isinstance(context, dict):
        raise UserError("--context: must be a JSON object")
    jid = client.enqueue(
        kind, target, item=item, context=context, state=state, key=key, priority=priority, force=force
    )
    click.echo(jid)


@click.command()
@click.argument("jid", metavar="ID")
@click.option("--wait", type=float, default=None, help="Wait up to this many seconds for it to finish.")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON (the public contract).")
def result(jid: str, wait: float | None, as_json: bool) -> None:
    """Show a judgement's record: status, the tier that answered, the answer, the trail."""
    from dispatchq.client import Client
    from dispatchq.tiers.session_logs import session_log_path

    rt = runtime(config=False)
    record = Client(runtime=rt).result(full_id(rt, jid), wait=wait)
    if as_json:
        log = session_log_path(rt.settings.data_dir, record.id)
        print_json({**record.public(), "session_log": str(log) if log.is_file() else None})
        return
    console = make_console()
    console.print(
        f"[bold]{record.id}[/]  {record.kind}  {record.target}" + (f"  {record.item}" if record.item else "")
    )
    console.print(f"status: [bold]{record.status}[/]   tier: {record.tier or '-'}")
    if record.value is not None:
        console.print(f"answer: {_short(record.value, 200)}")
    if record.confidence is not None:
        console.print(f"confidence: {record.confidence:.4g}")
    if record.reason:
        console.print(f"reason: {record.reason}")
    for step in record.trail:
        console.print(f"  · {step.tier}: {step.outcome} — {step.why}")


@click.command(name="list")
@click.option("--status", type=click.Choice(STATUSES), help="Only judgements with this status.")
@click.option("--kind", help="Only judgements of this kind.")
@click.option("--limit", type=int, default=100, show_default=True, help="At most this many (newest first).")
@click.option("--json", "as_json", is_flag=True, help="One JSON array of records.")
def list_(status: str | None, kind: str | None, limit: int, as_json: bool) -> None:
    """List judgements, newest first."""
    rt = runtime(config=False)
    # Newest first; without a filter only the newest `limit` are read, not every record.
    if status is None:
        ids = rt.storage.records.newest(limit if kind is None else None)
    else:
        ids = rt.storage.records.ids(status)
    records = [
        r for r in rt.storage.records.get_many(ids) if r is not None and (kind is None or r.kind == kind)
    ]
    if status is not None:
        records.sort(key=lambda r: r.created_at or 0, reverse=True)
    records = records[:limit]
    if as_json:
        print_json([r.public() for r in records])
        return
    make_console().print(_table(records))


def _table(records: list[Record]) -> Table:
    """One row per judgement; ids, statuses and tiers never wrap (an operator copies the id).

    The free-text columns (target, answer, reason) fold instead, so the table fits 100
    columns. A judgement no tier answered (needs-triage, waiting, failed) shows no tier:
    `needs-triage` is where it ended, not who answered it.
    """
    from rich.table import Table

    table = Table(show_lines=False, pad_edge=False)
    table.add_column("id", no_wrap=True, min_width=12)
    table.add_column("kind", overflow="fold", max_width=20)
    table.add_column("target", overflow="fold", ratio=2)
    table.add_column("status", no_wrap=True)
    table.add_column("tier", no_wrap=True)
    table.add_column("answer", overflow="fold", ratio=2)
    table.add_column("conf", no_wrap=True, justify="right")
    table.add_column("reason", overflow="fold", ratio=3)
    for r in records:
        table.add_row(
            r.id[:12],
            r.kind,
            _short(r.target, 30),
            r.status,
            r.tier if r.status == "answered" and r.tier else "-",
            _short(r.value, 30) if r.value is not None else "",
            f"{r.confidence:.2f}" if r.confidence is not None else "",
            _short(r.reason or "", 50),
        )
    return table


@click.command()
@click.argument("jid", metavar="ID")
def cancel(jid: str) -> None:
    """Cancel a judgement that has not finished (it will not be spawned or answered)."""
    rt = runtime(config=False)
    jid = full_id(rt, jid)
    if rt.dispatcher.cancel(jid):
        click.echo(f"cancelled {jid}")
    else:
        raise UserError(f"judgement {jid} has already finished")


@click.command()
@click.argument("jid", metavar="ID")
def retry(jid: str) -> None:
    """Judge again on purpose, from the kind's first tier (the trail is kept)."""
    rt = runtime()
    rt.storage.server.require_room()  # under `maxmemory`: one line, exit 2, nothing written
    jid = full_id(rt, jid)
    rt.dispatcher.retry(jid)
    click.echo(f"re-queued {jid}")


@click.command()
def prune() -> None:
    """Drop index entries of records that have expired (DISPATCHQ_RESULT_TTL)."""
    click.echo(f"pruned {runtime(config=False).storage.records.prune(everything=True)} expired entries")


def _progress_thread(rt: Any, ids: list[str], progress: Progress, task: Any, stop: threading.Event) -> None:
    while not stop.wait(0.3):
        statuses = rt.storage.records.statuses(ids)
        done = sum(1 for s in statuses if s in FINISHED or s == "waiting")
        progress.update(task, completed=done)


@click.command()
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--force", is_flag=True, help="Judge again even judgements that are already live.")
@click.option(
    "--table/--no-table", default=None, help=f"Print every judgement (default: when at most {TABLE_LIMIT})."
)
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the records and summary as JSON.")
def run(file: Path, force: bool, table: bool | None, progress: bool | None, as_json: bool) -> None:
    """The main job: enqueue FILE (JSON Lines) and answer what can be answered now.

    Runs each tier's worker in this process until nothing more can be answered now,
    then prints every judgement (tier, answer, confidence, reason) and a summary per
    tier, including what is waiting and why.

    \b
    Exit status:
      0  every judgement answered, needs triage, was cancelled, or waits on a closed
         usage window (it lifts by itself)
      1  some are still queued (Redis went away), or some lines were refused
      2  a mistake in the command, a setting or the config file
      3  a judgement failed, or waits on a blocked host (a missing session command or
         credential, a host-wide failure): a person must act
    """
    from dispatchq.client import Client
    from dispatchq.launcher.environment import mark_non_dumpable
    from dispatchq.process.wiring import drain

    mark_non_dumpable()  # before the runtime reads its secrets: it runs every tier's worker
    rt = runtime()
    client = Client(runtime=rt)
    console = make_console(stderr=as_json)
    results = client.enqueue_file(file, force=force)
    refused = [r for r in results if not r.ok]
    for r in refused:
        click.echo(f"line {r.index}: {r.error}", err=True)
    ids = list(dict.fromkeys(r.id for r in results if r.id))
    show_progress = sys.stderr.isatty() if progress is None else progress
    started = time.monotonic()
    if show_progress and ids:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(
            TextColumn("[bold]judging"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        task = bar.add_task("judging", total=len(ids))
        stop = threading.Event()
        thread = threading.Thread(target=_progress_thread, args=(rt, ids, bar, task, stop), daemon=True)
        with bar:
            thread.start()
            try:
                report = drain(rt)
            finally:
                stop.set()
                thread.join()
            bar.update(
                task,
                completed=sum(1 for s in rt.storage.records.statuses(ids) if s in FINISHED or s == "waiting"),
            )
    else:
        report = drain(rt)
    elapsed = time.monotonic() - started
    records = [r for r in rt.storage.records.get_many(ids) if r is not None]
    summary = _summary(records, report, elapsed)
    if as_json:
        print_json(
            {
                "judgements": [r.public() for r in records],
                "summary": summary,
                "refused": [{"line": r.index, "error": r.error} for r in refused],
            }
        )
    else:
        if table or (table is None and len(records) <= TABLE_LIMIT):
            console.print(_table(records))
        elif table is None:
            console.print(f"({len(records)} judgements; --table prints them all)")
        _print_summary(console, summary)
    stranded = [r for r in records if r.status in ("queued", "running")]
    sys.exit(_exit_status(rt, records, stranded=bool(stranded or refused)))


def _exit_status(rt: Any, records: list[Record], *, stranded: bool) -> int:
    """3 where a person must act (a failure, a blocked host), 1 for stranded work, else 0.

    A closed window is not a reason to fail a script: it lifts by itself and the scheduler
    resumes the line. A blocked host never does, so a pipeline that treats exit 0 as "done
    or on its way" must hear about it.
    """
    if any(r.status == "failed" for r in records):
        return 3
    waiting = [r for r in records if r.status == "waiting"]
    if waiting:
        blocked = rt.window.store.blocked()
        if any((r.host or rt.settings.host) in blocked for r in waiting):
            return 3
    return 1 if stranded else 0


def _summary(records: list[Record], report: dict[str, Any], elapsed: float) -> dict[str, Any]:
    by_tier = Counter(r.tier for r in records if r.status == "answered")
    waiting = Counter(r.reason or "unknown" for r in records if r.status == "waiting")
    queued = Counter(f"{r.tier} tier" for r in records if r.status in ("queued", "running"))
    return {
        "total": len(records),
        "elapsed_seconds": round(elapsed, 3),
        "answered": {t: by_tier.get(t, 0) for t in TIERS},
        "needs_triage": sum(1 for r in records if r.status == "needs-triage"),
        "failed": sum(1 for r in records if r.status == "failed"),
        "cancelled": sum(1 for r in records if r.status == "cancelled"),
        "waiting": dict(waiting),
        "not_finished": dict(queued),
        "delayed_retries_left": report.get("delayed_retries_left", 0),
    }


def _print_summary(console: Console, s: dict[str, Any]) -> None:
    a = s["answered"]
    console.print(
        f"[bold]{s['total']}[/] judgements in {s['elapsed_seconds']:.1f}s: "
        f"code answered {a['code']}, typed answered {a['typed']}, session answered {a['session']}; "
        f"needs-triage {s['needs_triage']}, failed {s['failed']}"
    )
    avoided = sum(a[t] for t in automatic_tiers())
    console.print(f"sessions avoided: {avoided}")
    for reason, count in s["waiting"].items():
        console.print(f"{count} wait for a session: {reason}")
    for where, count in s["not_finished"].items():
        console.print(f"[yellow]{count} still queued at the {where}[/]")
    if s["delayed_retries_left"]:
        console.print(f"{s['delayed_retries_left']} typed-tier retries are scheduled beyond the wait horizon")


#: The shortest id prefix taken in place of a whole id (the run table prints 12 characters).
MIN_ID_PREFIX = 8


def full_id(rt: Any, jid: str) -> str:
    """The judgement id `jid` names: itself, or the one id it is a unique prefix of (8+ chars)."""
    wanted = jid.strip()
    if rt.storage.records.get(wanted) is not None or len(wanted) < MIN_ID_PREFIX:
        return wanted
    matches = rt.storage.records.with_prefix(wanted, limit=50)
    if len(matches) > 1:
        raise UserError(f"id prefix {wanted!r} is ambiguous: {len(matches)} judgements start with it")
    return matches[0] if matches else wanted
