"""Real Redis servers and worker processes for the outage-weather tests."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import redis

from dispatchq.storage.connection import redis_server_binary
from tests.support.helpers import wait_for

__all__ = ["WeatherServer", "WeatherWorker"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class WeatherServer:
    """One `redis-server` on a loopback port, its config given on stdin (never on argv)."""

    def __init__(self, folder: Path, extra: str = "") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        config = f'port {self.port}\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {folder}\n{extra}'
        self.proc = subprocess.Popen(
            [redis_server_binary(), "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=folder,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(config.encode())
        self.proc.stdin.close()
        self.password = re.search(r"requirepass (\S+)", extra)
        self.admin = redis.Redis(port=self.port, password=self.password.group(1) if self.password else None)
        wait_for(self._answers, what=f"redis-server on port {self.port}")

    def _answers(self) -> bool:
        try:
            return bool(self.admin.ping())
        except redis.ConnectionError:
            return False

    def rejected_writes(self) -> dict[str, int]:
        """Per command, how many calls this server refused (READONLY, NOREPLICAS, …) since the
        last `CONFIG RESETSTAT`: what a worker spinning on a replica would drive up."""
        stats = self.admin.info("commandstats")
        return {
            name.removeprefix("cmdstat_"): int(values.get("rejected_calls", 0))
            for name, values in stats.items()
            if int(values.get("rejected_calls", 0))
        }

    def stop(self) -> None:
        self.admin.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class WeatherWorker:
    """A `dispatchq worker code` process whose combined output goes to a file."""

    def __init__(self, env: dict[str, str], log: Path, tier: str = "code") -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dispatchq.cli", "worker" if tier != "scheduler" else "scheduler"]
                + ([tier] if tier != "scheduler" else []),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
