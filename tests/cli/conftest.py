"""The command-line layer's fixtures: each a configured environment for `dispatchq` as a user runs it.

Every fixture of the layer lives here, under a name no other layer uses
(tests/unit/test_fixture_layout.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import fakeredis
import pytest

import dispatchq.cli.triage as cli_triage
from dispatchq.storage.triage import TriageStorage
from tests.support.cli import FAKE, REPORT, Env, git
from tests.support.helpers import counting_check, write_config


@pytest.fixture
def run_env(dq_env: dict[str, str], tmp_path: Path, redis_client: Any) -> dict[str, str]:
    check, _calls = counting_check(tmp_path)
    write_config(
        tmp_path / "dispatchq.yaml",
        f"""
        kinds:
          lock:
            check: {check}
          ask:
            session:
              prompt: "Answer {{{{ target }}}}"
        """,
    )
    dq_env["DISPATCHQ_SESSION_COMMAND"] = f"{sys.executable} {FAKE} -p --output-format stream-json --verbose"
    return dq_env


@pytest.fixture
def speed_env(dq_env: dict[str, str], tmp_path: Path, redis_client: Any) -> dict[str, str]:
    """The test's Redis and a config with a code kind and a session kind (no triage section)."""
    write_config(
        tmp_path / "dispatchq.yaml",
        """
        kinds:
          ask:
            session:
              prompt: "Answer {{ target }}"
        """,
    )
    return dq_env


@pytest.fixture
def core_env(dq_env: dict[str, str], tmp_path: Path, redis_client: Any) -> dict[str, str]:
    """dq_env with a config of three kinds: a counting check, a typed kind, and a checkout kind."""
    check, calls = counting_check(tmp_path)
    write_config(
        tmp_path / "dispatchq.yaml",
        f"""
        kinds:
          lock:
            check: {check}
          label:
            questions:
              bug: {{type: noul, instructions: "Is this a bug report?"}}
            answer: bug
            escalate: needs-triage
        """,
    )
    dq_env["_CALLS"] = str(calls)  # not a dispatchq variable: where the check logs its calls
    return dq_env


@pytest.fixture
def findings_repo(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("cites scripts/tool.sh\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "init")
    evil = tmp_path / "root-evil"
    evil.mkdir()
    (evil / "secret.md").write_text("x\n")
    (root / "out").symlink_to(evil)
    (root / "review.md").write_text(REPORT)
    return root


@pytest.fixture
def triage_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    server = fakeredis.FakeServer()
    e = Env(tmp_path, server)
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "needs-repro.md").write_text("Please add the steps that reproduce this.\n")
    e.write_config()
    monkeypatch.setenv("DISPATCHQ_CONFIG", str(tmp_path / "dispatchq.yaml"))
    monkeypatch.setattr(cli_triage, "_storage", lambda: TriageStorage(e.redis()))
    return e
