"""The fixtures every layer shares: a clean environment, the embedded Redis, `dq_env`, a
runtime factory. Each layer's own fixtures live in its conftest.py, the helpers the tests
share in tests/support/ (tests/unit/test_fixture_layout.py keeps it so)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatchq.storage.connection import EmbeddedRedis
from dispatchq.testing.typesafe import FakeTypeSafeAPI
from tests.support.helpers import (
    REPO,
    git,
)


@pytest.fixture(scope="session")
def data_home() -> Iterator[Path]:
    """This test process's own XDG_DATA_HOME, so the default data dir is never the user's.

    Without it a test that runs a command on the embedded default reads whatever server
    happens to be up in ~/.local/share/dispatchq (the demo's, another run's): its result
    then depends on the machine, not on the code.
    """
    home = Path(tempfile.mkdtemp(prefix="dq-data-home-"))
    try:
        yield home
    finally:
        default = home / "dispatchq"
        if (default / "redis.pid").exists():
            EmbeddedRedis(default).stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def clear_dispatchq_env(monkeypatch: pytest.MonkeyPatch, data_home: Path) -> None:
    """No test depends on the shell: every TYPESAFE_* and DISPATCHQ_* variable is unset,
    and the default data dir is this test process's own."""
    for name in list(os.environ):
        if name.startswith(("TYPESAFE_", "DISPATCHQ_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_DATA_HOME", str(data_home))


@pytest.fixture
def typesafe_api() -> Iterator[FakeTypeSafeAPI]:
    """A loopback fake of the TypeSafe API; point the SDK at `typesafe_api.url`. Sets nothing globally."""
    with FakeTypeSafeAPI() as api:
        yield api


# --- real Redis ----------------------------------------------------------------------------
# One embedded server per pytest-xdist worker (its own data dir), started once and
# flushed before each test that asks for it, so parallel workers never share keys.


@pytest.fixture(scope="session")
def redis_server(worker_id: str) -> Iterator[EmbeddedRedis]:
    """A real Redis server (the embedded default's binary) for this test process."""
    data = Path(tempfile.mkdtemp(prefix=f"dq-test-{worker_id}-"))
    server = EmbeddedRedis(data / "redis")
    server.ensure_running()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def redis_client(redis_server: EmbeddedRedis) -> Any:
    client = redis_server.client()
    client.flushall()
    return client


@pytest.fixture
def dq_env(redis_server: EmbeddedRedis, tmp_path: Path) -> dict[str, str]:
    """Environment for dispatchq processes in a test: the test's Redis, roots under tmp_path.

    Start from this for subprocesses (`subprocess.run(..., env=dq_env)`), and pass it to
    `dispatchq.settings.load_settings(dq_env)` in-process.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCHQ_", "TYPESAFE_"))}
    env.update(
        DISPATCHQ_DATA_DIR=str(redis_server.data_dir),
        DISPATCHQ_CHECKOUT_ROOTS=str(tmp_path),
        DISPATCHQ_CONFIG=str(tmp_path / "dispatchq.yaml"),
        DISPATCHQ_RECOVERY_INTERVAL="2",
        DISPATCHQ_HEARTBEAT_INTERVAL="1",
        DISPATCHQ_HEARTBEAT_GRACE="3",
        PYTHONPATH=str(REPO),
        # The fake session is driven by FAKE_CLAUDE_* variables and writes its reports into
        # tmp_path: it runs unconfined here. The sandbox has its own tests (test_sandbox.py,
        # test_look_around.py) and the real CLI runs confined (test_claude_cli.py).
        DISPATCHQ_SESSION_SANDBOX="off",
        DISPATCHQ_SESSION_ALLOW_ENV="FAKE_CLAUDE_*,PYTHONPATH",
        CLAUDE_CODE_OAUTH_TOKEN="test-session-credential",
        # Tests wait on RQ's own lines ("Listening on", "Warm shut down requested"), which a
        # default log leaves out as chatter (tests/unit/test_log_chatter.py checks that).
        DISPATCHQ_LOG_RQ="true",
    )
    return env


# --- helpers for the foundation's tests (settings, config, store, code tier, CLI, recovery) ------

from collections.abc import Callable  # noqa: E402


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    """A real git repository under tmp_path with one commit (README.md, src/app.py)."""
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "README.md").write_text("hello\n")
    (repo / "src" / "app.py").write_text("x = 1\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    return repo


@pytest.fixture
def make_runtime(dq_env: dict[str, str], redis_client: Any) -> Iterator[Callable[..., Any]]:
    """Build an in-process `Runtime` on the test's Redis: `make_runtime(DISPATCHQ_BATCH_SIZE="2")`.

    The config is read lazily from `dq_env`'s DISPATCHQ_CONFIG (tmp_path/dispatchq.yaml), so
    write it before the first enqueue. The process-wide runtime RQ jobs use is reset afterwards.
    """
    from dispatchq.findings.run.kinds import builtin_kinds
    from dispatchq.process.wiring import set_runtime
    from dispatchq.queue.parts import QUEUE_PARTS
    from dispatchq.runtime import Runtime
    from dispatchq.settings import load_settings

    def make(**env: str) -> Runtime:
        return Runtime(
            settings=load_settings({**dq_env, **env}),
            redis=redis_client,
            builtin=builtin_kinds(),
            queue_parts=QUEUE_PARTS,
        )

    yield make
    set_runtime(None)
