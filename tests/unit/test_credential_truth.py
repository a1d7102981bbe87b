"""What the docs say about a missing session credential is what the code does.

Sessions authenticate only with their one credential variable (or its `_FILE`): a session
worker without it refuses to start, and no stored login stands in for it. The row of
`docs/configuration.md` that names the variable says exactly that.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from dispatchq.errors import SettingsError
from dispatchq.pools.credentials import Pool
from dispatchq.runtime import Runtime
from dispatchq.settings import load_settings
from dispatchq.workers.session import check_session_host

CONFIGURATION = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _row(name: str) -> str:
    (row,) = [line for line in CONFIGURATION.read_text().splitlines() if line.startswith(f"| `{name}` |")]
    return row


def test_the_docs_say_a_session_worker_refuses_to_start_without_its_credential_and_run_waits() -> None:
    row = _row("CLAUDE_CODE_OAUTH_TOKEN")
    assert "a session worker refuses to start (exit 2" in row, row
    assert "`dispatchq run` answers what the code and typed tiers can" in row and "(exit 3)" in row, row
    assert "A stored login is never read" in row, row
    assert "uses the login stored" not in CONFIGURATION.read_text()


def test_a_session_worker_without_its_credential_refuses_to_start_with_the_hint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings({"DISPATCHQ_DATA_DIR": str(tmp_path)})
    pool = Pool.of_one(settings.session_credential_var, settings.session_concurrency)
    runtime = cast(Runtime, SimpleNamespace(settings=settings, pool=lambda: pool))
    with pytest.raises(SettingsError, match="CLAUDE_CODE_OAUTH_TOKEN is not set") as refused:
        check_session_host(runtime)
    assert "claude setup-token" in str(refused.value)
    assert "CLAUDE_CODE_OAUTH_TOKEN_FILE" in str(refused.value)
