"""The look-around probe's two contracts a Codex session adds, without starting a process.

What it prints when run as Codex must be what the `codex` backend reads as an answer whose text
is the report (else the Codex look-around tests would fail for a reason that says nothing about
the sandbox); and what it counts as its own in its `CODEX_HOME`: the login it was given, nothing
else holding a secret. The probe (tests/support/look_around.py) imports nothing of dispatchq.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dispatchq.backends.codex import CodexBackend
from tests.support import look_around
from tests.support.look_around_codex import API_KEY, NEIGHBOUR_LOGIN, PLAN_LOGIN, access_token

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
REPORT = json.dumps({"probe": "look_around", "counts": {"files": 0}})


@pytest.mark.parametrize("resume", [None, "0199a213-81c0-7800-8aa1-bbab2a035a53"])
def test_run_as_codex_it_prints_what_the_codex_backend_reads_as_an_answer(
    capsys: pytest.CaptureFixture[str], resume: str | None
) -> None:
    argv = CodexBackend().argv("python3 -I look_around.py", resume=resume)[3:]  # its own argv
    look_around.emit_codex(REPORT, argv)
    printed = capsys.readouterr().out
    outcome = CodexBackend().read_outcome(printed, now=NOW, default_tz="UTC", unknown_reset=60)
    assert outcome.kind == "answer" and outcome.text == REPORT
    assert outcome.session_id and (resume is None or outcome.session_id == resume)


def _probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **context: object) -> tuple[object, Path]:
    home = tmp_path / "codex-home"
    home.mkdir()
    monkeypatch.setattr(look_around.Probe, "_own_environ", staticmethod(lambda: {"CODEX_HOME": str(home)}))
    others = [API_KEY, access_token(NEIGHBOUR_LOGIN)]
    return look_around.Probe({"config_var": "CODEX_HOME", "other_credentials": others, **context}), home


def test_its_own_login_in_its_codex_home_is_its_credential_and_nothing_else_there_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe, home = _probe(tmp_path, monkeypatch, credential_file="auth.json", own_credential=PLAN_LOGIN)
    assert isinstance(probe, look_around.Probe)
    (home / "auth.json").write_text(PLAN_LOGIN + "\n")
    (home / "config.toml").write_text('openai_base_url = "http://127.0.0.1:9/v1"\n')
    # Another pool credential's value, in no secret shape: a finding by the value alone.
    (home / "stray.json").write_text(json.dumps({"t": access_token(NEIGHBOUR_LOGIN)}))
    (home / "token.txt").write_text("ghp_" + "a" * 36)  # secret-shaped
    outside = tmp_path / "notes.txt"
    outside.write_text("nothing secret\n")
    assert probe.own_config_file(str(home / "auth.json"))
    assert probe.own_config_file(str(home / "config.toml"))
    assert not probe.own_config_file(str(home / "stray.json"))
    assert not probe.own_config_file(str(home / "token.txt"))
    assert not probe.own_config_file(str(outside))  # outside its CODEX_HOME: the usual rules
    probe.look_at_environment()
    assert probe.info["environment"]["credential_present"] is True  # type: ignore[index]
    assert probe.info["environment"]["credential_is_own"] is True  # type: ignore[index]
    for login in (NEIGHBOUR_LOGIN, PLAN_LOGIN.replace("plan", "stranger")):  # not its own login
        (home / "auth.json").write_text(login)
        assert not probe.own_config_file(str(home / "auth.json"))


def test_a_login_in_a_key_sessions_codex_home_is_no_credential_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe, home = _probe(tmp_path, monkeypatch, credential="CODEX_API_KEY", own_credential=API_KEY)
    assert isinstance(probe, look_around.Probe)
    (home / "auth.json").write_text(PLAN_LOGIN)
    assert not probe.own_config_file(str(home / "auth.json"))
