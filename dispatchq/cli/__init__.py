"""The `dispatchq` command line.

Each command group lives in its own module and is registered on `main` below. User
mistakes raise `dispatchq.errors.UserError`; `main` turns them into one line on stderr
and exit status 2, never a traceback.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import TYPE_CHECKING, Any

import click

from dispatchq.errors import UserError
from dispatchq.storage.outage import is_outage, out_of_memory_message, outage_reason

if TYPE_CHECKING:
    from rich.console import Console

    from dispatchq.runtime import Runtime
    from dispatchq.settings import Settings

__all__ = [
    "COMMANDS",
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
    "redis": "ops",
    "settings": "ops",
    "triage": "triage",
    "findings": "findings",
    "serve": "serve",
}


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module_name = COMMANDS.get(name)
        if module_name is None:
            return None
        module = importlib.import_module(f"dispatchq.cli.{module_name}")
        for value in vars(module).values():
            if isinstance(value, click.Command) and value.name == name:
                return value
        return None

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except UserError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(2)
        except Exception as error:
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


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """dispatchq: answer each judgement at the cheapest tier that can (code, typed, session)."""


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
