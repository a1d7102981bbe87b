"""`dispatchq init`: a starter config where dispatchq will look for it.

A newcomer's first `dispatchq worker` otherwise stops on "config file not found". The file
goes where the config lookup finds it without a variable (`$XDG_CONFIG_HOME/dispatchq/`),
or to `DISPATCHQ_CONFIG` when that is set, or with `--here` into the current directory
(then the line to export is printed: dispatchq never reads a config from the cwd by
itself). An existing file is never overwritten without --force.
"""

from __future__ import annotations

from pathlib import Path

import click

from dispatchq.errors import UserError

__all__ = ["init"]

STARTER = Path(__file__).resolve().parent.parent / "examples" / "starter.yaml"


@click.command()
@click.option("--here", is_flag=True, help="Write ./dispatchq.yaml and print the export line for it.")
@click.option("--force", is_flag=True, help="Replace a config file that exists already.")
def init(here: bool, force: bool) -> None:
    """Write a starter dispatchq.yaml where dispatchq looks for it (never over an existing one)."""
    from dispatchq.settings import default_config_path, parent_environment

    named = parent_environment().get("DISPATCHQ_CONFIG")
    if here:
        target = Path.cwd() / "dispatchq.yaml"
    elif named:
        target = Path(named).expanduser()
    else:
        target = default_config_path()
    if target.exists() and not force:
        raise UserError(f"{target} exists already; --force replaces it")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(STARTER.read_text(encoding="utf-8"), encoding="utf-8")
    except OSError as error:
        raise UserError(f"cannot write {target}: {error.strerror or error}") from error
    click.echo(f"wrote {target}")
    if here:
        click.echo(
            f"export DISPATCHQ_CONFIG={target}   # dispatchq never reads a config from the cwd by itself"
        )
    elif not named:
        click.echo(
            "dispatchq finds it there without DISPATCHQ_CONFIG; `dispatchq settings` shows which file is used"
        )
