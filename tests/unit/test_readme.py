"""The README contract: two commands on top, every setting documented, CI runs the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

from dispatchq.settings import Settings, env_name

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _top_commands() -> list[str]:
    block = re.search(r"```sh\n(.*?)```", README, re.DOTALL)
    assert block is not None, "the README must open with a shell block"
    assert README.index(block.group(0)) < README.index("## "), "the commands come before any section"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_commands() -> None:
    commands = _top_commands()
    assert len(commands) == 2
    assert all(command.startswith("python3 ") for command in commands), "they need nothing but python3"


def test_ci_runs_the_readmes_test_command() -> None:
    test_command = _top_commands()[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(rf"^exec {re.escape(test_command)}$", ci, re.MULTILINE), ci


def test_every_setting_is_documented_with_its_variable() -> None:
    rows = {line.split("|")[1].strip() for line in README.splitlines() if line.startswith("| `")}
    missing = [env_name(name) for name in Settings.model_fields if f"`{env_name(name)}`" not in rows]
    assert missing == []


def test_every_procfile_process_is_a_real_command() -> None:
    from dispatchq.cli import COMMANDS

    for line in (ROOT / "Procfile").read_text().splitlines():
        _name, command = line.split(":", 1)
        argv = command.split()
        assert argv[0] == "dispatchq", line
        assert argv[1] in COMMANDS, line
