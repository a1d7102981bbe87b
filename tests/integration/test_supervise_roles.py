"""Every long-running role runs in the one supervise loop: asked to stop, it stops, exit 0.

A tier's worker, the scheduler and serve, each a real process on the real embedded Redis:
SIGTERM ends the round (RQ's warm shutdown, uvicorn's graceful one), then the role's last
step (the scheduler's heartbeat goes), then the process exits 0.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rq import Worker

from dispatchq.storage import keys
from tests.support.helpers import wait_for, write_config
from tests.support.serve import Server

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")


def _start(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "dispatchq.cli", *args], env=env, stdout=handle, stderr=subprocess.STDOUT
        )


def _stopped(proc: subprocess.Popen[bytes], log: Path) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"did not stop on SIGTERM:\n{log.read_text(errors='replace')[-3000:]}")


def test_a_worker_asked_to_stop_stops_with_exit_0(
    dq_env: dict[str, str], tmp_path: Path, redis_client: Any
) -> None:
    log = tmp_path / "worker.log"
    proc = _start(dq_env, log, "worker", "code")
    try:
        wait_for(lambda: Worker.all(connection=redis_client), timeout=60, what="the code worker registered")
    finally:
        code = _stopped(proc, log)
    said = log.read_text(errors="replace")
    assert code == 0, said
    assert "Traceback" not in said
    assert not Worker.all(connection=redis_client), said  # RQ's warm shutdown unregistered it


def test_the_scheduler_asked_to_stop_drops_its_heartbeat_and_exits_0(
    dq_env: dict[str, str], tmp_path: Path, redis_client: Any
) -> None:
    log = tmp_path / "scheduler.log"
    proc = _start(dq_env, log, "scheduler")
    try:
        wait_for(lambda: redis_client.exists(keys.SCHEDULER_HEARTBEAT), timeout=60, what="the heartbeat")
    finally:
        code = _stopped(proc, log)
    said = log.read_text(errors="replace")
    assert code == 0, said
    assert "Traceback" not in said
    assert not redis_client.exists(keys.SCHEDULER_HEARTBEAT), said  # the role's last step ran


def test_serve_asked_to_stop_shuts_down_gracefully_and_exits_0(
    dq_env: dict[str, str], tmp_path: Path, redis_client: Any
) -> None:
    write_config(tmp_path / "dispatchq.yaml", "kinds: {}\n")
    server = Server(dq_env, tmp_path)
    with server:
        pass  # it answered /healthz; leaving stops it with SIGTERM
    assert server.process is not None
    assert server.process.returncode == 0, server.output
    assert "Traceback" not in server.output
