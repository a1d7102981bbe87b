"""`dispatchq --help` lists every command from a static table (tests/cli checks it imports none)."""

from __future__ import annotations

import re

import click

from dispatchq.cli import COMMANDS, SHORT_HELP, main


def test_the_static_table_names_every_command_and_only_those() -> None:
    assert set(SHORT_HELP) == set(COMMANDS)
    ctx = click.Context(main)
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None, name
        # The table's line is a summary of the command's own help: its first words agree.
        own = " ".join(re.findall(r"[\w']+", (command.help or "").lower()))
        first_words = " ".join(re.findall(r"[\w']+", SHORT_HELP[name].lower())[:3])
        assert first_words in own, (name, SHORT_HELP[name], own[:80])
