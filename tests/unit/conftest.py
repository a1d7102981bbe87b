"""The unit layer: no server, no subprocess (fakeredis is allowed).

Enforced rather than hoped for: a unit test that starts a process fails here, so the
layer stays fast and a test that needs the real thing moves to `tests/integration/`.

Every fixture of the layer lives here, under a name no other layer uses
(tests/unit/test_fixture_layout.py). The two that change the process for a whole test
(`no_proxy`, `isolated_cwd`) are not autouse: the files that need them say so in their
`pytestmark`.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import grimp
import pytest

from dispatchq.launcher.releases import RELEASES
from dispatchq.storage.triage import TriageStorage
from dispatchq.triage.engine import TriageStore
from dispatchq.triage.executors import GitHubExecutor, Ledger, RecordingExecutor
from tests.support.executors import TARGET, TOKEN
from tests.support.github_api import FakeGitHub


@pytest.fixture(autouse=True)
def no_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("unit tests start no process: move this test to tests/integration/")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


@pytest.fixture
def fresh_checks() -> Iterator[None]:
    """No `checks` module or config folder left by another test: `import_check` keeps
    both, so `checks` would otherwise be whichever folder's came first."""
    path = list(sys.path)
    sys.modules.pop("checks", None)
    yield
    sys.modules.pop("checks", None)
    sys.path[:] = path


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake is on loopback: no proxy from the shell may sit in between."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake_github() -> Iterator[FakeGitHub]:
    with FakeGitHub(TOKEN) as fake:
        fake.issue(TARGET)
        yield fake


@pytest.fixture
def fake_client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.fixture
def executor(fake_github: FakeGitHub, fake_client: fakeredis.FakeRedis) -> Iterator[GitHubExecutor]:
    ex = GitHubExecutor(TOKEN, fake_github.url, ledger=Ledger(TriageStorage(fake_client)), retry_backoff=0.01)
    yield ex
    ex.close()


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(params=RELEASES, ids=[f"cc{v}" for v in RELEASES])
def texts_release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def triage_store(fake_client: fakeredis.FakeRedis) -> TriageStore:
    return TriageStore(TriageStorage(fake_client))


@pytest.fixture
def recording_executor(fake_client: fakeredis.FakeRedis) -> RecordingExecutor:
    return RecordingExecutor(TriageStorage(fake_client))


@pytest.fixture
def isolated_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing is read from the working directory; a temporary one proves it stays so.
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("dispatchq", include_external_packages=True, exclude_type_checking_imports=False)


@pytest.fixture
def supervise_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A clock that moves only when the loop sleeps: the sleeps, in order."""
    slept: list[float] = []
    monkeypatch.setattr(time, "monotonic", lambda: sum(slept))
    return slept


@pytest.fixture
def kept_signal_handlers() -> Iterator[None]:
    """SIGTERM's and SIGINT's handlers as they were, after a test that installs a worker's."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)
