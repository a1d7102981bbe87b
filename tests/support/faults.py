"""The fault tests' formation: the long-running processes of one case, each of which must still
be running at the end."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import wait_for

__all__ = ["Formation"]


class Formation:
    """The long-running processes of one case; each must still be running at the end."""

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

    def output(self, name: str | None = None, *, tail: int | None = 4000) -> str:
        names = [name] if name else sorted(self.procs)
        return "\n".join(
            f"--- {n}\n" + (self.logs / f"{n}.log").read_text(errors="replace")[-(tail or 0) :] for n in names
        )

    def exited(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def wait_for(self, predicate: Any, timeout: float, what: str) -> None:
        try:
            wait_for(predicate, timeout=timeout, what=what)
        except pytest.fail.Exception:
            pytest.fail(
                f"timed out after {timeout:g}s waiting for {what}; the formation said:\n{self.output()}"
            )

    def stop(self) -> dict[str, int]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(timeout=60)  # a loaded machine; a lost stop is unit-tested
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = proc.wait()
        return codes
