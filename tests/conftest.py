"""Shared pytest fixtures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatchq.storage.connection import EmbeddedRedis, process_alive
from dispatchq.testing.typesafe import FakeTypeSafeAPI


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

REPO = Path(__file__).resolve().parent.parent


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


def run_cli(
    args: list[str],
    env: dict[str, str],
    *,
    input: str | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the real `dispatchq` CLI in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "dispatchq.cli", *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


# --- helpers for the foundation's tests (settings, config, store, code tier, CLI, recovery) ------

import textwrap  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable  # noqa: E402


def wait_for(
    predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what or predicate}")
        time.sleep(interval)


def write_check_module(directory: Path, body: str) -> str:
    """Write a check module with a unique name into `directory`; return `module` for `module:function`.

    Unique names matter in-process: `import_check` caches modules in `sys.modules`, so two
    tests writing `checks.py` into different directories would otherwise share the first one.
    """
    name = f"dqcheck_{uuid.uuid4().hex[:12]}"
    (directory / f"{name}.py").write_text(textwrap.dedent(body))
    return name


def counting_check(directory: Path, *, answer: str = "state.get('answer')") -> tuple[str, Path]:
    """A check that appends the judgement's target to a calls file, then answers `answer`.

    Returns ("module:check", calls file). `answer` is a Python expression over `state`.
    """
    calls = directory / f"calls-{uuid.uuid4().hex[:8]}.txt"
    module = write_check_module(
        directory,
        f"""
        def check(judgement):
            state = judgement.state if isinstance(judgement.state, dict) else {{}}
            with open({str(calls)!r}, "a") as handle:
                handle.write(judgement.target + "\\n")
            if state.get("raise"):
                raise RuntimeError("check exploded on " + judgement.target)
            return {answer}
        """,
    )
    return f"{module}:check", calls


def blocking_check(directory: Path, *, answer: str, then_sleep: float = 0.0) -> tuple[str, Path, Path]:
    """A check whose first call blocks (its worker is killed there) and every later call answers.

    Each call appends the target to a calls file; the first also writes a marker file, so a
    test can wait for it before killing the worker. `answer` is a Python expression over
    `judgement`; `then_sleep` delays every later call (a re-run that must outlive the dead
    execution's hash). Returns ("module:check", first-call marker, calls file).
    """
    first = directory / "first-call-started"
    calls = directory / "calls.txt"
    module = write_check_module(
        directory,
        f"""
        import pathlib, time

        def check(judgement):
            with open({str(calls)!r}, "a") as handle:
                handle.write(judgement.target + "\\n")
            marker = pathlib.Path({str(first)!r})
            if not marker.exists():
                marker.write_text("running")
                time.sleep(300)  # the worker is killed while it sits here
            time.sleep({then_sleep!r})
            return {answer}
        """,
    )
    return f"{module}:check", first, calls


def calls_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def write_config(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def git(repo: Path, *args: str) -> str:
    identity = ["-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "commit.gpgsign=false"]
    argv = ["git", "-C", str(repo), *identity, *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


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


def tree_snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` (outside .git) with its bytes: compare before/after for byte-identity."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


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


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for init to reap it counts as exited)."""
    return process_alive(pid)
