"""Operator commands: worker, scheduler, status, redis, settings."""

from __future__ import annotations

import contextlib
import re
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import click

from dispatchq.cli import console as make_console
from dispatchq.cli import print_json, runtime, settings
from dispatchq.core.tiers import TIERS
from dispatchq.core.until import TooFar, duration, within_reach
from dispatchq.errors import UserError
from dispatchq.storage.outage import is_outage, waiting_here
from dispatchq.window.poolstatus import pool_lines
from dispatchq.window.usage import usage_lines

if TYPE_CHECKING:
    # rich is imported where a table is drawn: `status --json` runs in scripts' loops.
    from rich.console import Console

    from dispatchq.core.status import Status, WaitingNote

__all__ = [
    "parse_until",
    "redis",
    "redis_status",
    "redis_stop",
    "scheduler",
    "settings_cmd",
    "status",
    "window",
    "window_close",
    "window_open",
    "worker",
]


@click.command()
@click.argument("tier", type=click.Choice(TIERS))
@click.option("--burst", is_flag=True, help="Stop when there is nothing left to do now.")
@click.option("--quiet", is_flag=True, help="Log warnings only.")
def worker(tier: str, burst: bool, quiet: bool) -> None:
    """Run one tier's worker (the Procfile runs one per tier).

    Code and session workers take host-bound work (judgements naming a checkout on
    this host, DISPATCHQ_HOST) and unbound work; typed workers take any.
    """
    from dispatchq.process.wiring import build_runtime_waiting, run_worker

    rt = build_runtime_waiting(settings(), role=tier)
    if rt is None:
        return  # asked to stop while waiting for Redis
    left = run_worker(rt, tier, burst=burst, quiet=quiet)
    if left:
        click.echo(
            f"{left} typed-tier retries are scheduled beyond DISPATCHQ_RETRY_HORIZON; they stay queued",
            err=True,
        )


@click.command()
@click.option("--burst", is_flag=True, help="Run one tick and exit.")
def scheduler(burst: bool) -> None:
    """Run rq-scheduler's loop and the control queue (retriggers), one tick per second."""
    from dispatchq.process.wiring import build_runtime_waiting, run_scheduler

    rt = build_runtime_waiting(settings(), role="scheduler")
    if rt is not None:
        run_scheduler(rt, burst=burst)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable status.")
@click.option(
    "--recount",
    is_flag=True,
    help="Rebuild the live counts from every unfinished record first (they are kept exact on every "
    "change; this is for after editing Redis by hand). Reads every record: slow with many.",
)
def status(as_json: bool, recount: bool) -> None:
    """The ops view: Redis in use, queues and workers per tier, answers per tier, the usage window.

    Counts come from counters kept with every change, so this answers in constant time
    however many judgements wait; it lists a sample of the waiting ones, not all.
    """
    status = _collect_status(recount)
    if status.waiting_counts_rebuilt:
        click.echo(
            f"the live counts were missing (a store from an older dispatchq): rebuilt once from "
            f"{status.waiting_counts_rebuilt} unfinished judgement(s)",
            err=True,
        )
    if as_json:
        print_json(status.as_json())
        return
    from rich.markup import escape

    console = make_console()
    for w in status.warnings:  # the red facts first (workers/warnings.py)
        console.print(f"[red]{escape(w.text)}[/]: {escape(w.hint)}", markup=True, highlight=False)
    _print_redis(console, status)
    _print_waiting_here(console, status.waiting_for_redis_here or [])
    from rich.table import Table

    table = Table("tier", "queued", "workers", "answered")
    for tier in TIERS:
        table.add_row(tier, str(status.queues[tier]), str(status.workers[tier]), str(status.answered[tier]))
    console.print(table)
    console.print(f"sessions avoided: [bold]{status.sessions_avoided}[/]")
    j = status.judgements
    console.print("judgements: " + ", ".join(f"{k} {v}" for k, v in j.items() if v))
    for reason, count in status.waiting.items():
        console.print(f"  {count} waiting: {reason}", markup=False)
    more = status.waiting_reasons_distinct - len(status.waiting)
    if more > 0:
        console.print(f"  … and {more} other waiting reason(s)")
    if j.get("waiting"):
        by_class = ", ".join(f"{k} {v}" for k, v in status.waiting_by_class.items() if v)
        console.print(f"  waiting by class: {by_class}", markup=False)
    if status.judgements_orphaned:
        console.print(
            f"  [yellow]{status.judgements_orphaned} running judgement(s) orphaned[/]: their worker died; "
            "RQ retries them once the heartbeat lapses (or `dispatchq retry ID` now)"
        )
    if status.typed.keyless:
        console.print(
            "typed tier: [yellow]keyless[/] (the typed workers run without TYPESAFE_API_KEY): "
            "typed judgements escalate"
        )
    sched = status.scheduler
    alive = "[green]alive[/]" if sched.alive else "[red]not running[/] (start `dispatchq scheduler`)"
    console.print(f"scheduler: {alive}; {sched.scheduled_jobs} scheduled jobs")
    _print_markers(console, status)
    for line in pool_lines(
        status.pool.credentials, status.backlog, now=status.now, timezone=settings().timezone
    ):  # per credential, and the backlog's estimated drain (window/poolstatus.py)
        console.print(line, markup=False, highlight=False)
    sessions = status.sessions
    console.print(
        f"sessions: {len(sessions.running)} running, {sessions.spawned} spawned, "
        f"{sessions.refused_at_spawn} refused at spawn"
    )
    t = status.triage
    if not t.runs:
        console.print("triage: no runs yet")
    else:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(t.counts.items())) or "nothing planned"
        when = datetime.fromtimestamp(t.last_run, UTC).strftime("%Y-%m-%d %H:%M UTC") if t.last_run else "-"
        console.print(
            f"triage: last {t.runs} runs ({counts}); last at {when}; "
            f"{t.needs_triage} events marked needs-triage"
        )


def _collect_status(recount: bool) -> Status:
    """What `status` shows; when Redis cannot be used, what this host's waiting processes say
    comes first (on stderr), then the command's own one-line refusal."""
    from dispatchq.workers.status import collect_status

    try:
        rt = runtime(config=False)
    except UserError:
        # This shell cannot use Redis either (a password rotated on the server, Redis away):
        # what this host's waiting processes say comes first, then the one-line refusal.
        with contextlib.suppress(UserError):
            _print_waiting_here(make_console(stderr=True), _notes(waiting_here(settings())))
        raise
    if recount:
        counted = rt.storage.records.recount()
        click.echo(f"recounted {counted} unfinished judgement(s)", err=True)
    try:
        status = collect_status(rt)
    except Exception as error:
        if is_outage(error):  # a demoted master refuses status's own upkeep writes: say why here
            _print_waiting_here(make_console(stderr=True), _notes(waiting_here(rt.settings)))
        raise
    # This host's processes waiting for Redis, from their notes under the data dir: one that
    # cannot log in or reach the server cannot say so in Redis.
    status.waiting_for_redis_here = _notes(waiting_here(rt.settings))
    return status


def _notes(found: list[dict[str, Any]]) -> list[WaitingNote]:
    """The notes as `status` carries them (`waiting_for_redis_here`)."""
    from dispatchq.core.status import WaitingNote

    return [WaitingNote.model_validate(n) for n in found]


def _print_redis(console: Console, status: Status) -> None:
    """The server line; what the Redis user may not read (INFO, CONFIG without `@dangerous`)
    is "unknown", and a second line says which commands were refused."""
    used, limit = status.redis_used_memory, status.redis_maxmemory
    memory = "memory unknown" if used is None else f"memory {_bytes(used)} of "
    if used is not None:
        memory += _bytes(limit) if limit else "no maxmemory" if limit is not None else "unknown"
    version = f"v{status.redis_version}" if status.redis_version else "version unknown"
    fsync = status.redis_appendfsync or "unknown"
    console.print(f"[bold]redis[/]: {status.redis} ({version}, appendfsync {fsync}, {memory})", markup=True)
    if status.redis_unreadable:
        console.print(
            f"  could not read: {', '.join(status.redis_unreadable)} (the Redis user may not run them: "
            "an ACL user without @dangerous; dispatchq does not need them)",
            markup=False,
        )


def _print_waiting_here(console: Console, notes: list[WaitingNote]) -> None:
    """One line per process of this host waiting for Redis, with the reason it gave."""
    for note in notes:
        since = max(0.0, time.time() - float(note.since or time.time()))
        console.print(
            f"waiting for Redis here: pid {note.pid} ({note.role}) since {since:.0f} s: "
            f"Redis {note.state} at {note.redis} ({note.reason})",
            markup=False,
        )


def _bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _print_markers(console: Console, status: Status) -> None:
    # What stops this machine's sessions comes first: a host block is not the account's window.
    for host, why in status.sessions.blocked.items():
        console.print(f"[red]host {host} blocked[/]: {why} (`dispatchq window open --host {host}` clears it)")
    for w in status.worker_details:
        if w.tier == "session" and w.subprocess_scrub == "off" and w.subprocess_scrub_warning:
            console.print(f"[yellow]session worker on {w.host}[/]: {w.subprocess_scrub_warning}")
        if w.tier == "session" and w.sandbox == "off":
            console.print(
                f"[yellow]session worker on {w.host}[/]: sessions run UNCONFINED "
                "(DISPATCHQ_SESSION_SANDBOX=off)"
            )
    if not status.markers:
        console.print("usage window: [green]open[/] (no marker)")
    for m in status.markers:
        if m.up:
            left = max(0, int((m.lifts_at_epoch or 0.0) - time.time()))
            countdown = f"{left // 3600}h{left % 3600 // 60:02d}m{left % 60:02d}s"
            console.print(
                f"usage window \\[{m.scope}]: [red]closed[/] until {m.lifts_at} "
                f"({m.lifts_at_local or ''}; in {countdown}) "
                f"kind {m.kind}: {m.message!r} (seen by {m.session or '-'})"
                + (f"; {m.utilization:.0%} of the window used" if m.utilization is not None else "")
            )
        else:
            console.print(f"usage window \\[{m.scope}]: {m.state or 'open'}")
    for line in usage_lines(status):  # each window's reported use, a login about to end (window/usage.py)
        console.print(line, markup=False, style="yellow" if line.startswith("WARNING") else None)
    if status.retrigger:
        console.print(f"retrigger scheduled at {status.retrigger}")
    for entry in status.window_audit:
        console.print(
            f"  {entry.at}: window [{entry.scope}] {entry.action} "
            f"by {entry.who} (lifts at {entry.lifts_at}): {entry.reason}",
            markup=False,
        )


@click.group()
def redis() -> None:
    """The embedded Redis server (used when DISPATCHQ_REDIS_URL is unset)."""


@redis.command(name="stop")
def redis_stop() -> None:
    """Stop the embedded server gracefully (its append-only file keeps every judgement)."""
    from dispatchq.storage.connection import embedded_for

    s = settings()
    if not s.embedded:
        raise click.UsageError("DISPATCHQ_REDIS_URL is set: dispatchq does not manage that server")
    stopped = embedded_for(s).stop()
    click.echo("stopped" if stopped else "not running")


@redis.command(name="status")
@click.option("--json", "as_json", is_flag=True)
def redis_status(as_json: bool) -> None:
    """Which server is in use, and whether the embedded one is running."""
    from dispatchq.storage.connection import embedded_for

    s = settings()
    data: dict[str, Any] = {"redis": s.describe_redis(), "embedded": s.embedded}
    if s.embedded:
        server = embedded_for(s)
        data.update(running=server.is_running(), socket=str(server.socket_path), pid=server.pid())
    if as_json:
        print_json(data)
    else:
        for k, v in data.items():
            click.echo(f"{k}: {v}")


@click.command(name="settings")
@click.option("--json", "as_json", is_flag=True)
def settings_cmd(as_json: bool) -> None:
    """Every setting, its environment variable and current value (secrets redacted), and
    the names of the variables a session started now would receive (never their values)."""
    s = settings()
    data = s.public()
    names = _session_names(s)
    config_file = {"path": str(s.config), "exists": s.config.is_file()}
    if as_json:
        print_json({**data, "session_environment": names, "config_file": config_file})
        return
    from rich.table import Table

    table = Table("variable", "value", "meaning")
    for name, entry in data.items():
        table.add_row(name, str(entry["value"]), entry["description"] or "")
    console = make_console()
    console.print(table)
    found = "found" if config_file["exists"] else "not found: no kinds (set DISPATCHQ_CONFIG)"
    console.print(f"config file: {config_file['path']} ({found})", markup=False)
    console.print("a session would get: " + (", ".join(names["passes"]) or "nothing"), markup=False)
    if names["allowed_but_withheld"]:
        withheld = ", ".join(names["allowed_but_withheld"])
        console.print(
            f"allowed but withheld (credential-shaped, denied or never passed): {withheld}", markup=False
        )


def _session_names(s: Any) -> dict[str, Any]:
    """What `session_environment` would pass from this process's environment, by name.

    The credential counts as present when its variable or its `_FILE` is set; the file is
    not read here (a settings listing must not fail, or print, on a secret). HOME and TMPDIR
    are the sandbox's own where it runs, and it adds CLAUDE_CONFIG_DIR.
    """
    from dispatchq.launcher.environment import session_env_names
    from dispatchq.settings import parent_environment

    environ = parent_environment()
    var = s.session_credential_var
    names = session_env_names(
        environ,
        deny=s.session_deny_env,
        allow=s.session_allow_env,
        credential_var=var,
        credential_present=bool(environ.get(var) or environ.get(f"{var}_FILE")),
    )
    passes = set(names["passes"]) | {"HOME", "CLAUDE_CONFIG_DIR"}  # per session, set by dispatchq
    if s.session_sandbox == "on":  # the sandbox's own /tmp and its egress proxy
        passes |= {"TMPDIR", "HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"}
        passes -= {"NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"}
    return {**names, "passes": sorted(passes), "credential": var, "sandbox": s.session_sandbox}


def parse_until(text: str, zone: str, now: datetime | None = None) -> datetime:
    """`2h30m`, `+90m`, `18:00` (next such time in DISPATCHQ_TIMEZONE) or an ISO 8601 instant."""
    now = now or datetime.now(UTC)
    text = text.strip()
    try:
        span = duration(text)
    except TooFar as error:
        raise UserError(f"--until: {error}") from None
    if span is not None:
        return now + span
    tz = ZoneInfo(zone)
    clock = re.match(r"^(\d{1,2}):(\d{2})$", text)
    if clock:
        hour, minute = int(clock.group(1)), int(clock.group(2))
        if hour > 23 or minute > 59:
            raise UserError(f"--until: {text!r} is not a time of day")
        local = now.astimezone(tz).replace(hour=hour, minute=minute, second=0, microsecond=0)
        if local <= now:
            local += timedelta(days=1)
        return local.astimezone(UTC)
    try:
        when = datetime.fromisoformat(text)
        if when.tzinfo is None:
            when = when.replace(tzinfo=tz)
        when = when.astimezone(UTC)  # 9999-12-31T23:00-05:00 is past the last year datetime has
    except (ValueError, OverflowError):
        raise UserError(f"--until: {text!r} is not a duration (2h30m), a time (18:00) or ISO 8601") from None
    try:
        return within_reach(text, when, now)
    except TooFar as error:
        raise UserError(f"--until: {error}") from None


@click.group()
def window() -> None:
    """Reserve the shared usage window for people, or open it again."""


@window.command(name="close")
@click.option("--until", "until", required=True, help="2h30m, 18:00 (DISPATCHQ_TIMEZONE) or ISO 8601.")
@click.option("--reason", default="", help="Why (shown in status and the audit).")
@click.option(
    "--force", is_flag=True, help="Replace a marker that lifts later (shorten a reservation or a limit)."
)
@click.option(
    "--credential",
    "credential",
    default=None,
    help="Close this credential's window only (see `dispatchq credentials`; default: `default`).",
)
def window_close(until: str, reason: str, force: bool, credential: str | None) -> None:
    """Close the window: no session starts until then (audited in status).

    A marker already up that lifts later (a longer reservation, or a usage limit a session
    saw) is kept unless --force: a second close must not silently shorten the first. With
    several credentials, --credential names whose window (the others keep answering).
    """
    from dispatchq.pools.credentials import qualify
    from dispatchq.window.limits import GENERAL_SCOPE

    rt = runtime(config=False)
    name = _credential_named(rt, credential)
    when = parse_until(until, rt.settings.timezone)
    if when <= datetime.now(UTC):
        raise UserError(f"--until: {when.isoformat()} is in the past")
    face = rt.window
    current = face.get(qualify(name, GENERAL_SCOPE))
    if current is not None and current.lifts_at > when.timestamp() and not force:
        longer = datetime.fromtimestamp(current.lifts_at, UTC)
        raise UserError(
            f"the window is already closed until {_both_times(longer, rt.settings.timezone)} "
            f"({current.message or current.kind}); --force replaces it with the earlier time"
        )
    # Several writes (old marker replaced, audit, retrigger, waiting judgements marked):
    # under `maxmemory` refuse before the first, or the old marker would go and no new one come.
    rt.storage.server.require_room()
    m = face.close(when, reason=reason or "closed by an operator", credential=name)
    lifts = datetime.fromtimestamp(m.lifts_at, UTC)
    whose = "" if credential is None else f" of {name}"
    click.echo(f"usage window{whose} closed until {_both_times(lifts, rt.settings.timezone)}")


def _credential_named(rt: Any, credential: str | None) -> str:
    """The credential an operator named (`default` when none), refused unless it is in the pool."""
    from dispatchq.pools.credentials import DEFAULT_CREDENTIAL

    pool = rt.pool()
    name = credential or DEFAULT_CREDENTIAL
    if credential is None and pool.single:
        return pool.names[0]
    if credential is None and name not in pool.names:
        raise UserError(
            f"--credential: the pool has several credentials; name one of {', '.join(pool.names)}"
        )
    if name not in pool.names:
        raise UserError(f"--credential: no credential named {name!r} (the pool: {', '.join(pool.names)})")
    return name


def _both_times(at: datetime, zone: str) -> str:
    """`2026-12-02 18:00 CET (17:00 UTC)`: the operator's clock first, UTC for the logs."""
    local = at.astimezone(ZoneInfo(zone))
    utc = at.astimezone(UTC)
    if local.utcoffset() == utc.utcoffset():
        return f"{utc:%Y-%m-%d %H:%M:%S} UTC"
    return f"{local:%Y-%m-%d %H:%M:%S %Z} ({utc:%H:%M:%S} UTC)"


@window.command(name="open")
@click.option(
    "--host",
    "host",
    is_flag=False,
    flag_value="",
    default=None,
    help="Clear this host's block after a host-wide failure instead (no NAME: DISPATCHQ_HOST).",
)
@click.option(
    "--credential",
    "credential",
    default=None,
    help="Open this credential's window only, and clear its block (a refused credential, once fixed).",
)
def window_open(host: str | None, credential: str | None) -> None:
    """Open the window now: markers removed, waiting sessions released (audited)."""

    rt = runtime(config=False)
    rt.storage.server.require_room()  # the marker's DEL is allowed under `maxmemory`, its audit is not
    if host is not None:
        from dispatchq.tiers.session import unblock_host

        name = host or rt.settings.host
        cleared = unblock_host(rt.window, name)
        click.echo(f"host {name}: sessions unblocked" if cleared else f"host {name} was not blocked")
        return
    whose = _credential_named(rt, credential) if credential is not None else None
    opened = rt.window.open(credential=whose)
    click.echo(f"opened: {', '.join(opened)}" if opened else "the window was already open")
