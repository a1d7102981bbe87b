"""The `dispatchq` command line.

Each command group lives in its own module and is registered on `main` below. User
mistakes raise `dispatchq.errors.UserError`; `main` turns them into one line on stderr
and exit status 2, never a traceback.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from dispatchq.errors import UserError

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime
    from dispatchq.settings import Settings


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except UserError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(2)


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
    from dispatchq.runtime import Runtime, set_runtime

    ctx = click.get_current_context()
    root = ctx.find_root()
    settings()
    if "runtime" not in root.obj:
        rt = Runtime.build(root.obj["settings"])
        set_runtime(rt)
        root.obj["runtime"] = rt
    rt = root.obj["runtime"]
    if config:
        _ = rt.config  # validate now, so a bad file is reported before any work
    return rt


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _register() -> None:
    # Imported here so that `dispatchq --help` stays fast and a broken optional
    # module cannot stop the others from loading.
    import importlib

    for name in ("core", "ops", "triage", "findings"):
        try:
            module = importlib.import_module(f"dispatchq.cli.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"dispatchq.cli.{name}":
                raise
            continue
        module.register(main)


_register()
