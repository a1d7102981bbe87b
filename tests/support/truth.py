"""Processes the truth tests start, reaped by their fixture."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["Procs"]


# --- real worker processes ------------------------------------------------------------------------
class Procs:
    """The long-running processes of one case, logged to files, stopped at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dispatchq.cli", *argv], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
