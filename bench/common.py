"""What every benchmark shares: the run's Redis server and environment (`Bench`), and how a
whole process is timed. Imported by `run.py` and by each benchmark module; imports none of them,
so the benchmarks form no import circle."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dispatchq.storage.connection import EmbeddedRedis  # noqa: E402

__all__ = [
    "PY",
    "ROOT",
    "Bench",
    "free_port",
    "github_signature",
    "stop_server",
    "timed_clients",
    "write_jsonl",
]

PY = sys.executable


class Bench:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.server = EmbeddedRedis(workdir / "redis")
        self.server.ensure_running()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCHQ_", "TYPESAFE_"))}
        self.env.update(
            DISPATCHQ_DATA_DIR=str(self.server.data_dir),
            DISPATCHQ_CONFIG=str(workdir / "dispatchq.yaml"),
            DISPATCHQ_CHECKOUT_ROOTS=str(workdir),
            PYTHONPATH=str(ROOT),
        )
        self.redis = self.server.client()

    def close(self) -> None:
        self.server.stop()

    def bare_env(self) -> dict[str, str]:
        """The environment of a bare-RQ process: this bench's server as BENCH_REDIS_URL."""
        return {**self.env, "BENCH_REDIS_URL": self.server.url()}

    def config(self, text: str) -> None:
        (self.workdir / "dispatchq.yaml").write_text(text)

    def timed(
        self, argv: list[str], *, stdin: Path | None = None, env: dict[str, str] | None = None
    ) -> float:
        """Wall time of one whole process (start-up included)."""
        started = time.perf_counter()
        with open(stdin or os.devnull, "rb") as handle:
            done = subprocess.run(
                argv,
                stdin=handle,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env or self.env,
                cwd=ROOT,
            )
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv[:4])} failed: {done.stderr.decode()[-2000:]}")
        return elapsed

    def dispatchq(self, *args: str) -> list[str]:
        return [PY, "-m", "dispatchq.cli", *args]


def timed_clients(client: Callable[[int], None], count: int) -> float:
    """Run `client(k)` for k in 0..count-1, each on a thread of its own: seconds until all end."""
    threads = [threading.Thread(target=client, args=(k,)) for k in range(count)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def write_jsonl(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def free_port() -> int:
    """A loopback port nobody listens on now, for a server the bench starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def github_signature(secret: str, body: bytes) -> str:
    """`X-Hub-Signature-256` for `body`, as GitHub signs a delivery."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def stop_server(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """SIGTERM, then SIGKILL past `timeout`: a server the bench started never outlives it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
