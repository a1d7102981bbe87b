"""`ops/dev.py` installs exactly the releases dispatchq lists, read without importing dispatchq.

It runs before anything is installed, so it reads Claude Code's `RELEASES` with `runpy` and
Codex's from the text of `dispatchq/launcher/codex_releases.py` (that module imports dispatchq).
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

from dispatchq.launcher import codex_releases, releases
from tests.support.helpers import REPO


def _dev() -> dict[str, Any]:
    return runpy.run_path(str(REPO / "ops" / "dev.py"))


def test_dev_installs_every_supported_codex_and_claude_code_release() -> None:
    dev = _dev()
    assert dev["CODEX_RELEASES"] == codex_releases.RELEASES
    assert dev["CLAUDE_CODE_RELEASES"] == releases.RELEASES
    codex = dev["CODEX"]
    assert codex.package == "@openai/codex"
    assert codex.prefix("0.171.0") == REPO / ".cache" / "codex" / "0.171.0"


def test_the_release_list_is_read_from_a_tuple_written_over_several_lines(tmp_path: Path) -> None:
    module = tmp_path / "listed.py"
    module.write_text('X = 1\nRELEASES: tuple[str, ...] = (\n    "0.169.0",  # oldest\n    "0.171.0",\n)\n')
    assert _dev()["releases_in"](module) == ("0.169.0", "0.171.0")
