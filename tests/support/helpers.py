"""Helpers every layer's tests share: the repository root, running the real CLI, waiting for a
condition, writing a config or a check module, git, and whether a process is alive."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dispatchq.storage.connection import process_alive

__all__ = [
    "REPO",
    "blocking_check",
    "calls_of",
    "counting_check",
    "git",
    "pid_alive",
    "run_cli",
    "tree_snapshot",
    "wait_for",
    "write_check_module",
    "write_config",
]


REPO = Path(__file__).resolve().parents[2]


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


def tree_snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` (outside .git) with its bytes: compare before/after for byte-identity."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for init to reap it counts as exited)."""
    return process_alive(pid)


def scheduler_in_process(rt: Any, **kwargs: Any) -> None:
    """`run_scheduler(rt, **kwargs)` in the test's own process, its SIGINT/SIGTERM handlers put
    back after (the scheduler's loop installs its own for the run)."""
    from dispatchq.queue.scheduler import run_scheduler

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        run_scheduler(rt, **kwargs)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
