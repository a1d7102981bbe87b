"""`dispatchq config`: check the config file without starting anything, print its JSON Schema."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from dispatchq.cli import print_json, settings

__all__ = ["check", "config", "schema"]


@click.group()
def config() -> None:
    """The config file: check it, or print its JSON Schema for editors.

    \b
    dispatchq config check [FILE]     validate, one line per mistake (exit 2), no Redis
    dispatchq config schema > dispatchq.schema.json
    Then the file's first line `# yaml-language-server: $schema=dispatchq.schema.json`
    lets an editor with the YAML language server complete and check it.
    """


@config.command()
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--json", "as_json", is_flag=True, help="Print {file, ok, problems, kinds, credentials} as JSON."
)
@click.option(
    "--no-import",
    is_flag=True,
    help="Do not import the kinds' checks (module:function): only their spelling is checked.",
)
@click.option(
    "--no-files",
    is_flag=True,
    help="Do not read the credentials' files: check the file away from the machine that holds them.",
)
def check(file: Path | None, as_json: bool, no_import: bool, no_files: bool) -> None:
    """Validate FILE (default: the file the settings load) without starting anything.

    Every mistake is one line, `FILE: path.to.key: what is wrong`, and the exit status
    is 2; a valid file prints one OK line and exits 0. Needs no Redis. The kinds'
    checks are imported, as a worker would, unless --no-import; each credential's file
    must exist, be readable and hold something, unless --no-files (its content is never
    printed).
    """
    from dispatchq.config import credential_file_problems, load_config
    from dispatchq.errors import ConfigError
    from dispatchq.process.wiring import builtin_kinds

    path = file if file is not None else settings().config
    try:
        loaded = load_config(path, builtin=builtin_kinds(), import_checks=not no_import)
        problems = (
            [] if no_files or loaded.credentials is None else credential_file_problems(loaded.credentials)
        )
    except ConfigError as error:
        problems = list(error.problems)
    if problems:
        problems = [line if line.startswith(f"{path}") else f"{path}: {line}" for line in problems]
        if as_json:
            print_json({"file": str(path), "ok": False, "problems": problems, "kinds": [], "credentials": []})
        else:
            for line in problems:
                click.echo(line, err=True)
        sys.exit(2)
    names = sorted(loaded.kinds)
    credentials = loaded.credentials.names if loaded.credentials is not None else []
    if as_json:
        print_json(
            {"file": str(path), "ok": True, "problems": [], "kinds": names, "credentials": credentials}
        )
        return
    triage = ", triage rules" if loaded.triage is not None else ""
    count = f"{len(names)} kind{'' if len(names) == 1 else 's'}"
    pool = f", {len(credentials)} credential{'' if len(credentials) == 1 else 's'}" if credentials else ""
    click.echo(f"{path}: OK ({count}{triage}{pool})")


@config.command()
def schema() -> None:
    """Print the config file's JSON Schema (for editors: see docs/configuration.md)."""
    from dispatchq.config import config_schema

    click.echo(json.dumps(config_schema(), indent=2))
