"""The `dispatchq` command line.

Each command group lives in its own module and is registered on `main` below. User
mistakes raise `dispatchq.errors.UserError`; `main` turns them into one line on stderr
and exit status 2, never a traceback.

Operators run `dispatchq status` in loops and `--help` whenever they forget a word, so this
module imports nothing heavy: a command's module (and with it redis, pydantic, the rules
engine) is imported only when that command runs, and `--help` lists the commands from the
static table below instead of importing every module for its one-line help
(`tests/unit/test_cli_table.py` keeps the table equal to the commands' own help).
"""

from __future__ import annotations

import gc
import importlib
import json
import sys
from typing import TYPE_CHECKING, Any

import click

from dispatchq.errors import UserError

if TYPE_CHECKING:
    from rich.console import Console

    from dispatchq.runtime import Runtime
    from dispatchq.settings import Settings

__all__ = [
    "COMMANDS",
    "SHORT_HELP",
    "console",
    "main",
    "print_json",
    "runtime",
    "settings",
]


#: Command name -> the module that defines it. Modules are imported only when their
#: command runs, so `dispatchq enqueue` does not pay for the rules engine's parser.
COMMANDS = {
    "enqueue": "producer",
    "result": "producer",
    "list": "producer",
    "cancel": "producer",
    "retry": "producer",
    "prune": "producer",
    "run": "producer",
    "worker": "ops",
    "scheduler": "ops",
    "status": "ops",
    "window": "ops",
    "credentials": "pool",
    "redis": "ops",
    "settings": "ops",
    "config": "config",
    "triage": "triage",
    "findings": "findings",
    "serve": "serve",
    "init": "init",
    # Wires the shipped test doubles (the top layer), so it is named in full and imported
    # only when it runs: nothing in the CLI depends on it.
    "demo": "dispatchq.testing.demo",
}


#: Command name -> its one-line help as `--help` lists it (the command's own
#: `short_help`, which a unit test compares), so listing the commands imports none of them.
SHORT_HELP = {
    "cancel": "Cancel a judgement that has not finished.",
    "credentials": "The credentials sessions may use: state, caps and spend.",
    "config": "The config file: check it, or print its JSON Schema for editors.",
    "demo": "Run the shipped example judgements through every tier, with stand-ins.",
    "enqueue": "Enqueue one judgement, or JSON Lines from stdin.",
    "findings": "Findings reports and the decisions recorded in them.",
    "init": "Write a starter dispatchq.yaml where dispatchq looks for it.",
    "list": "List judgements, newest first.",
    "prune": "Drop index entries of records that have expired.",
    "redis": "The embedded Redis server (start, stop, status).",
    "result": "Show a judgement's record.",
    "retry": "Judge again on purpose, from the kind's first tier.",
    "run": "The main job: enqueue FILE (JSON Lines) and answer what can be answered.",
    "scheduler": "Run rq-scheduler's loop and the control queue (retriggers).",
    "serve": "Serve webhooks, judgements and health over HTTP until stopped.",
    "settings": "Every setting, its environment variable and current value.",
    "status": "The ops view: Redis, queues and workers per tier, the window.",
    "triage": "Resolve an event's planned actions to applied, suggested or suppressed.",
    "window": "Reserve the shared usage window for people, or open it again.",
    "worker": "Run one tier's worker (the Procfile runs one per tier).",
}


class _Group(click.Group):
    def main(self, *args: Any, **kwargs: Any) -> Any:
        _hold_collector()
        try:
            return super().main(*args, **kwargs)
        finally:
            _collect_again()

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SHORT_HELP.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module_name = COMMANDS.get(name)
        if module_name is None:
            return None
        full = module_name if "." in module_name else f"dispatchq.cli.{module_name}"
        module = importlib.import_module(full)
        _collect_again()
        for value in vars(module).values():
            if isinstance(value, click.Command) and value.name == name:
                return value
        return None

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except UserError as error:
            for line in str(error).splitlines() or [""]:  # several config mistakes: one line each
                click.echo(f"error: {line}", err=True)
            sys.exit(2)
        except Exception as error:
            from dispatchq.storage.outage import is_outage, out_of_memory_message, outage_reason

            # Redis refusing a write under `maxmemory` (noeviction) is a refusal, not a bug:
            # one line, exit 2; Redis going away mid-command is one line too, exit 1.
            root = ctx.find_root()
            rt = root.obj.get("runtime") if isinstance(root.obj, dict) else None
            full = out_of_memory_message(error, rt.redis if rt is not None else None)
            if full is not None:
                click.echo(f"error: {full}", err=True)
                sys.exit(2)
            if is_outage(error):
                click.echo(
                    f"error: Redis became unreachable during the command: {outage_reason(error)}", err=True
                )
                sys.exit(1)
            raise


class _Collector:
    """The cyclic collector held off while a process starts.

    Start-up makes about a hundred thousand objects that live as long as the process
    (modules, classes, pydantic's validators), and the collector walks them again and again
    while they are made: a fifth of `dispatchq status`'s or `enqueue`'s start. It is held
    from the first `main` until the command's module is imported (`get_command`), then turned
    back on with what exists so far frozen out of its walks (`gc.freeze`), which keeps a
    batch's collections short as well. Once per process, and only when the collector was on:
    a caller that runs `main` again in process, or keeps the collector off itself, is left be.
    """

    held = False
    done = False


def _hold_collector() -> None:
    if not _Collector.done and gc.isenabled():
        _Collector.done = _Collector.held = True
        gc.disable()


def _collect_again() -> None:
    if _Collector.held:
        _Collector.held = False
        gc.freeze()
        gc.enable()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=None, package_name="dispatchq", message="dispatchq %(version)s")
def main() -> None:
    """dispatchq: answer each judgement at the cheapest tier that can (code, typed, session).

    \b
    Exit codes:
      0  done (a closed usage window that lifts by itself and needs-triage count as done)
      1  Redis became unreachable during the command
      2  a mistake in the command, a setting or the config file (one line says which)
      3  `dispatchq run`: a judgement failed, or waits on a blocked host or a missing command
    """


def settings() -> Settings:
    """This process's settings, built once (an invalid variable is a one-line error)."""
    from dispatchq.settings import load_settings

    ctx = click.get_current_context()
    root = ctx.find_root()
    if not isinstance(root.obj, dict):
        root.obj = {}
    if "settings" not in root.obj:
        root.obj["settings"] = load_settings()
    return root.obj["settings"]


def runtime(*, config: bool = True) -> Runtime:
    """Settings, Redis and (unless `config=False`) the validated config, for one command."""
    from dispatchq.process.wiring import build_runtime, set_runtime

    ctx = click.get_current_context()
    root = ctx.find_root()
    settings()
    if "runtime" not in root.obj:
        rt = build_runtime(root.obj["settings"])
        set_runtime(rt)
        root.obj["runtime"] = rt
    rt = root.obj["runtime"]
    if config:
        _ = rt.config  # validate now, so a bad file is reported before any work
    return rt


def console(*, stderr: bool = False) -> Console:
    """A rich console; wide when output is not a terminal, so piped tables stay readable."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
