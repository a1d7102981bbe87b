"""The supported Claude Code range, the start-up version check, and the forced `--settings`."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from dispatchq.errors import SettingsError
from dispatchq.launcher import releases
from dispatchq.launcher.environment import SESSION_FORCED, session_argv
from dispatchq.launcher.releases import (
    NEWEST,
    OLDEST,
    RELEASES,
    check_claude_code,
    parse_version,
    supported,
    warn_if_unsupported,
)


def test_the_list_is_oldest_first_and_every_entry_a_version() -> None:
    keys = [parse_version(v) for v in RELEASES]
    assert None not in keys and keys == sorted(keys)  # type: ignore[type-var]
    assert (RELEASES[0], RELEASES[-1]) == (OLDEST, NEWEST)


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        (OLDEST, True),
        (NEWEST, True),
        ("2.1.250", True),
        ("2.1.196", False),
        ("2.1.333", False),
        ("2.2.0", False),
    ],
)
def test_supported_is_the_closed_range(version: str, ok: bool) -> None:
    assert supported(version) is ok


def _fake_claude(tmp_path: Path, printed: str, code: int = 0) -> str:
    """A program named `claude` that prints what a release's `--version` would."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "claude"
    script.write_text(f"#!/bin/sh\necho '{printed}'\nexit {code}\n")
    script.chmod(0o755)
    return str(script)


def test_a_release_outside_the_range_warns_once_naming_it_and_the_range(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    claude = _fake_claude(tmp_path, "2.1.400 (Claude Code)")
    environ = {"PATH": os.defpath}
    with caplog.at_level(logging.WARNING, logger="dispatchq.session"):
        first = warn_if_unsupported(f"{claude} -p --output-format stream-json", environ)
        warn_if_unsupported(f"{claude} -p --output-format stream-json", environ)
    assert first is not None and first.version == "2.1.400" and not first.supported
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "2.1.400" in warnings[0] and f"{OLDEST} to {NEWEST}" in warnings[0]
    assert first.fact() == {
        "version": "2.1.400",
        "supported": False,
        "supported_range": f"{OLDEST} to {NEWEST}",
        "problem": warnings[0],
    }


def test_a_supported_release_is_quiet_and_another_command_is_not_asked(tmp_path: Path) -> None:
    claude = _fake_claude(tmp_path, f"{NEWEST} (Claude Code)")
    check = check_claude_code(claude, {"PATH": os.defpath})
    assert check is not None and check.supported and check.problem is None
    assert check_claude_code("python3 -m dispatchq.testing.stand_in_session -p", {"PATH": os.defpath}) is None


def test_a_cli_whose_version_cannot_be_read_says_so(tmp_path: Path) -> None:
    claude = _fake_claude(tmp_path, "segfault", code=3)
    check = check_claude_code(claude, {"PATH": os.defpath})
    assert check is not None and not check.supported
    assert check.problem is not None and "cannot tell which Claude Code" in check.problem
    assert "exit 3" in check.problem


def test_the_version_check_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "claude"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    monkeypatch.setattr(releases, "VERSION_TIMEOUT", 0.5)
    check = check_claude_code(str(script), {"PATH": os.defpath})
    assert check is not None and check.problem is not None and "did not answer" in check.problem


def _forced(argv: list[str]) -> dict[str, object]:
    assert argv[-2] == "--settings"
    parsed = json.loads(argv[-1])
    assert isinstance(parsed, dict)
    return parsed


def test_claude_gets_the_forced_values_as_settings_and_other_commands_are_untouched() -> None:
    argv = session_argv(["/opt/cc/bin/claude", "-p", "--output-format", "stream-json"])
    assert argv[:4] == ["/opt/cc/bin/claude", "-p", "--output-format", "stream-json"]
    assert _forced(argv) == {"env": dict(SESSION_FORCED)}
    assert SESSION_FORCED["CLAUDE_CODE_RETRY_WATCHDOG"] == "0"
    other = ["python3", "-m", "dispatchq.testing.stand_in_session", "-p"]
    assert session_argv(other) == other


def test_an_operators_own_settings_are_merged_with_ours_winning(tmp_path: Path) -> None:
    theirs = {"model": "x", "env": {"FOO": "1", "CLAUDE_CODE_RETRY_WATCHDOG": "1"}}
    inline = session_argv(["claude", "-p", "--settings", json.dumps(theirs), "--verbose"])
    assert inline.count("--settings") == 1 and "--verbose" in inline
    merged = _forced(inline)
    assert merged["model"] == "x"
    assert merged["env"] == {"FOO": "1", **SESSION_FORCED}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(theirs))
    assert _forced(session_argv(["claude", f"--settings={path}"]))["env"] == {"FOO": "1", **SESSION_FORCED}


@pytest.mark.parametrize("value", ["/nonexistent/settings.json", "[1]", "{not json"])
def test_an_unreadable_operator_settings_is_a_one_line_error(value: str) -> None:
    with pytest.raises(SettingsError, match="session --settings"):
        session_argv(["claude", "--settings", value])
