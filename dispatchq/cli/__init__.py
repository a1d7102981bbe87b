"""The `dispatchq` command line.

Each command group lives in its own module and is registered on `main` below. User
mistakes raise `dispatchq.errors.UserError`; `main` turns them into one line on stderr
and exit status 2, never a traceback.
"""

from __future__ import annotations

import sys

import click

from dispatchq.errors import UserError


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
