"""The HA partition tests' cluster: Redis, Sentinel and worker processes joined by cuttable links."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatchq.client import Client
from dispatchq.core.judgement import Record
from dispatchq.process.wiring import set_runtime
from dispatchq.queue.parts import QUEUE_PARTS
from dispatchq.runtime import Runtime
from dispatchq.settings import load_settings
from dispatchq.storage import keys
from tests.support.helpers import REPO, pid_alive
from tests.support.netns import Host, LoopbackRedis, Namespaces, require_netns
from tests.support.stallproxy import LOOPBACK, StallProxy

__all__ = ["CONFIG", "FAKE", "LEASE", "SESSION", "SESSION_COMMAND", "Cluster", "Link", "start_cluster"]


LEASE = 6


SESSION = 8


FAKE = REPO / "tests" / "support" / "fake_claude.py"


SESSION_COMMAND = f"{sys.executable} {FAKE} -p --output-format stream-json --verbose"


CONFIG = """
kinds:
  ask:
    session:
      prompt: "Answer {{ target }}"
"""


class Link:
    """How one host reaches Redis, and the cut: a stall proxy, or a namespace's veth."""

    def __init__(self, name: str, server: LoopbackRedis, proxy: StallProxy | None, host: Host | None) -> None:
        self.name = name
        self.proxy = proxy
        self.host = host
        if host is not None:
            self.url = host.redis_url(server.password)
        else:
            assert proxy is not None
            self.url = server.url(proxy.port)

    def cut(self) -> None:
        if self.host is not None:
            self.host.cut()
        else:
            assert self.proxy is not None
            self.proxy.stall()

    def heal(self) -> None:
        if self.host is not None:
            self.host.heal()
        else:
            assert self.proxy is not None
            self.proxy.heal()

    def popen(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            if self.host is not None:
                return self.host.popen(argv, env, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)
            return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)


class Cluster:
    """One test's hosts, their workers, a producer on host A, and what the sessions did."""

    def __init__(self, kind: str, server: LoopbackRedis, dq_env: dict[str, str], tmp: Path) -> None:
        self.kind = kind
        self.server = server
        self.tmp = tmp
        self.stack = contextlib.ExitStack()
        self.namespaces = self.stack.enter_context(Namespaces(server.port)) if kind == "netns" else None
        (tmp / "dispatchq.yaml").write_text(textwrap.dedent(CONFIG))
        self.base = {
            **dq_env,
            "DISPATCHQ_SESSION_COMMAND": SESSION_COMMAND,
            "DISPATCHQ_SESSION_LEASE": str(LEASE),
            "DISPATCHQ_SESSION_CONCURRENCY": "1",
            "DISPATCHQ_TIMEZONE": "UTC",
            "FAKE_CLAUDE_SLEEP": str(SESSION),
        }
        self.redis = server.client()
        env = {**self.base, "DISPATCHQ_REDIS_URL": server.url(), "DISPATCHQ_HOST": "A"}
        self.rt = Runtime(settings=load_settings(env), redis=self.redis, queue_parts=QUEUE_PARTS)
        self.links: dict[str, Link] = {}
        self.envs: dict[str, dict[str, str]] = {}
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.max_live = 0
        self._watching = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)

    # --- hosts and processes ------------------------------------------------------------------
    def add_host(self, name: str, **env: str) -> Link:
        if self.namespaces is not None:
            link = Link(name, self.server, None, self.namespaces.add(name))
        else:
            proxy = self.stack.enter_context(StallProxy((LOOPBACK, self.server.port), name=name))
            link = Link(name, self.server, proxy, None)
        data = self.tmp / f"data-{name}"
        data.mkdir()
        self.links[name] = link
        self.envs[name] = {
            **self.base,
            "DISPATCHQ_REDIS_URL": link.url,
            "DISPATCHQ_HOST": name,
            "DISPATCHQ_DATA_DIR": str(data),
            "FAKE_CLAUDE_SPAWN_LOG": str(self.tmp / f"spawns-{name}.log"),
            "FAKE_CLAUDE_RECORD": str(self.tmp / f"session-{name}.json"),
            "FAKE_CLAUDE_ANSWER": f"from {name}",
            **env,
        }
        return link

    def worker(self, name: str) -> subprocess.Popen[bytes]:
        log = self.tmp / f"worker-{name}-{len(self.procs)}.log"
        argv = [sys.executable, "-m", "dispatchq.cli", "worker", "session"]
        proc = self.links[name].popen(argv, self.envs[name], log)
        self.procs.append((proc, log))
        self.wait(lambda: self.heartbeat_of(name), f"host {name}'s session worker to register")
        if not self._watcher.is_alive():
            self._watcher.start()
        return proc

    def heartbeat_of(self, name: str) -> bool:
        ttl = self.rt.settings.heartbeat_interval + self.rt.settings.heartbeat_grace
        return any(w.get("host") == name for w in self.rt.storage.records.live_workers(ttl=ttl))

    def close(self) -> None:
        self._watching.set()
        for link in self.links.values():
            with contextlib.suppress(Exception):
                link.heal()  # a worker stops cleanly only if it can reach Redis
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for name in self.links:
            for pid in self.spawns(name):
                if pid_alive(pid):  # a session its worker left behind: ours, by pid
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        if self._watcher.is_alive():
            self._watcher.join(timeout=5)
        self.stack.close()
        self.redis.close()

    def logs(self) -> str:
        parts = []
        for proc, log in self.procs:
            text = log.read_text(errors="replace") if log.exists() else ""
            parts.append(f"--- {log.name} (pid {proc.pid}, rc {proc.poll()}):\n{text[-4000:]}")
        return "\n".join(parts)

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                pytest.fail(f"timed out after {timeout:g}s waiting for {what}\n{self.logs()}")
            time.sleep(0.05)

    # --- what the sessions did -------------------------------------------------------------------
    def spawns(self, name: str) -> list[int]:
        log = self.tmp / f"spawns-{name}.log"
        return [int(line.split()[0]) for line in log.read_text().splitlines()] if log.exists() else []

    def live(self) -> int:
        return sum(1 for name in self.links for pid in self.spawns(name) if pid_alive(pid))

    def _watch(self) -> None:
        while not self._watching.wait(0.05):
            self.max_live = max(self.max_live, self.live())

    def session_finished(self, name: str) -> bool:
        """Did host `name`'s (last) session run to its end, rather than being ended?"""
        path = self.tmp / f"session-{name}.json"
        return bool(json.loads(path.read_text()).get("finished")) if path.exists() else False

    def spawns_stay(self, period: float = 3.0) -> dict[str, int]:
        """Watch for `period` seconds; the spawn count per host (the caller asserts it)."""
        before = {name: len(self.spawns(name)) for name in self.links}
        deadline = time.monotonic() + period
        while time.monotonic() < deadline:
            if {name: len(self.spawns(name)) for name in self.links} != before:
                break
            time.sleep(0.05)
        return {name: len(self.spawns(name)) for name in self.links}

    # --- judgements -----------------------------------------------------------------------------
    def enqueue(self, target: str, checkout: Path | None = None) -> str:
        context = {"checkout": str(checkout)} if checkout is not None else None
        return Client(runtime=self.rt).enqueue("ask", target, context=context)

    def record(self, jid: str) -> Record:
        record = self.rt.storage.records.get(jid)
        assert record is not None, f"judgement {jid} has no record"
        return record

    def answered(self, jid: str) -> bool:
        return self.record(jid).status == "answered"

    def trail_text(self, jid: str) -> str:
        record = self.record(jid)
        return "\n".join([record.reason or "", *(f"{e.outcome}: {e.why}" for e in record.trail)])

    def answers_on_trail(self, jid: str) -> int:
        return sum(1 for e in self.record(jid).trail if e.outcome == "answered")

    def deaths(self, jid: str) -> int:
        return int(self.redis.hget(keys.record(jid), "deaths") or 0)

    def facts(self, jid: str) -> dict[str, Any]:
        """Everything a partition case asserts, at once: a failure shows every difference."""
        trail = self.trail_text(jid)
        return {
            "spawns": self.spawns_stay(),
            "most alive at once": self.max_live,
            "A's session ran to its end": self.session_finished("A"),
            "status": self.record(jid).status,
            "answer": self.record(jid).value,
            "answers on the trail": self.answers_on_trail(jid),
            "lost contact on the trail": "lost contact" in trail,
            "deaths": self.deaths(jid),
        }

    def explain(self, jid: str) -> str:
        return f"trail:\n{self.trail_text(jid)}\n{self.logs()}"


def start_cluster(
    kind: str, server: LoopbackRedis, dq_env: dict[str, str], tmp_path: Path
) -> Iterator[Cluster]:
    if kind == "netns":
        require_netns()
    made = Cluster(kind, server, dq_env, tmp_path)
    try:
        yield made
    finally:
        made.close()
        set_runtime(None)
