"""Worker processes for the recovery tests, started and reaped by their fixture."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import wait_for

__all__ = ["Workers"]


class Workers:
    """Worker processes a test starts; every one still running is stopped afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = tmp_path

    def start(self, env: dict[str, str], tier: str = "code") -> subprocess.Popen[bytes]:
        log = open(self.logs / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "dispatchq.cli", "worker", tier],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def output(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-3000:] for p in sorted(self.logs.glob("worker-*.log"))
        )

    def wait_for(self, predicate: Any, timeout: float, what: str) -> None:
        """`wait_for`, failing with the workers' logs."""
        try:
            wait_for(predicate, timeout=timeout, what=what)
        except pytest.fail.Exception:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}; workers said:\n{self.output()}")

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                print("worker did not stop on SIGTERM:", proc.args, self.output())
                proc.kill()
                proc.wait()
