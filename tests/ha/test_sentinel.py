"""dispatchq on a Sentinel-managed Redis: a failover under load, and the start-time refusals.

Real `dispatchq worker code` processes and the real CLI run against
`redis+sentinel://…` (tests/ha/conftest.py's topology). The primary is SIGKILLed while
the workers are busy: afterwards every acknowledged judgement is answered exactly once,
no dispatchq process exited, and clients made before and after follow the new primary.
Counts are asserted, never times.

Asynchronous replication can lose a write the primary acknowledged a moment before it
died, so an enqueue on Sentinel is acknowledged only once a replica has it (`WAIT`,
`DISPATCHQ_REDIS_WAIT_MS`): the primary is killed mid-enqueue, and every id the CLI printed
must still be there. With its only replica promoted, the new primary has no replica, and
enqueues are refused (not acknowledged) until the old primary is restarted and the
sentinels make it the new primary's replica, as an operator's supervisor would.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from dispatchq.settings import load_settings
from dispatchq.storage.connection import connect, connect_async
from dispatchq.storage.store import Store
from tests.conftest import run_cli, wait_for, write_check_module, write_config
from tests.ha.conftest import LOOPBACK, PRIMARY_PASSWORD, SENTINEL_PASSWORD, SERVICE, Topology, restart

pytestmark = pytest.mark.slow


def _env(dq_env: dict[str, str], topology: Topology, **extra: str) -> dict[str, str]:
    return {
        **dq_env,
        "DISPATCHQ_REDIS_URL": topology.url,
        "DISPATCHQ_REDIS_SENTINEL_PASSWORD": SENTINEL_PASSWORD,
        "DISPATCHQ_BATCH_SIZE": "1",
        **extra,
    }


def _doubling_kind(tmp_path: Path) -> None:
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


def _enqueue(env: dict[str, str], start: int, n: int) -> tuple[list[str], int]:
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
            ids, code = _enqueue(self.env, n, 5)
            n += 5
            with self.lock:
                self.acknowledged += ids
                self.batches += code == 0
                self.refused += code != 0

    def pause(self) -> None:
        self.running.clear()
        wait_for(self.idle.is_set, timeout=60, what="the producer to finish its batch")


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


def _start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dispatchq.cli", "worker", "code"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _logs(tmp_path: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp_path.glob("*.log"))
    )


def _async_primary_port(settings: Any) -> int:
    async def ask() -> int:
        client = connect_async(settings)
        try:
            await client.set("dq-ha-async", "1")
            info = await client.info("server")
            return int(info["tcp_port"])
        finally:
            await client.aclose()

    return asyncio.run(ask())


def test_a_sigkill_of_the_primary_under_load_loses_no_acknowledged_judgement(
    topology: Topology, dq_env: dict[str, str], tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    env = _env(dq_env, topology)
    settings = load_settings(env)
    _doubling_kind(tmp_path)
    before = connect(settings)  # a long-lived client, made before the failover
    assert int(before.info("server")["tcp_port"]) == topology.primary.port
    assert _async_primary_port(settings) == topology.primary.port
    for i in range(2):
        workers.append(_start_worker(env, tmp_path / f"worker-{i}.log"))
    producer = Producer(env)
    producer.start()
    try:
        store = Store(before)
        wait_for(lambda: store.count("answered") >= 10, timeout=60, what="the load to be under way")
        topology.primary.proc.kill()  # type: ignore[union-attr]  # mid-enqueue: no pause
        topology.primary.proc.wait(timeout=10)  # type: ignore[union-attr]
        wait_for(
            lambda: topology.primary_port() == topology.replica.port,
            timeout=60,
            what=f"the sentinels to promote the replica:\n{topology.logs()}",
        )
        restart(topology.primary)  # it rejoins as the new primary's replica: enqueues are acknowledged again
        batches = producer.batches
        wait_for(
            lambda: producer.batches >= batches + 3,
            timeout=90,
            what=f"enqueues on the new primary:\n{topology.logs()}",
        )
    finally:
        producer.stopping.set()
        producer.join(timeout=120)

    # The client made before the kill follows the new primary, as does a new one, sync and async.
    wait_for(lambda: _writes(before), timeout=30, what="the old client to write again")
    assert int(before.info("server")["tcp_port"]) == topology.replica.port
    after = connect(settings)
    assert int(after.info("server")["tcp_port"]) == topology.replica.port
    assert _async_primary_port(settings) == topology.replica.port

    acknowledged = producer.acknowledged
    assert len(acknowledged) >= 20
    store = Store(after)
    try:
        wait_for(
            lambda: store.statuses(acknowledged) == ["answered"] * len(acknowledged),
            timeout=120,
            what="every acknowledged judgement answered",
        )
    except pytest.fail.Exception:
        pytest.fail(f"not every acknowledged judgement was answered; the workers said:\n{_logs(tmp_path)}")
    for record in store.get_many(acknowledged):
        assert record is not None
        assert [t.outcome for t in record.trail].count("answered") == 1, record.id
    assert [w.poll() for w in workers] == [None, None], _logs(tmp_path)
    before.close()
    after.close()


def _writes(client: redis.Redis) -> bool:
    try:
        return bool(client.set("dq-ha-probe", "1"))
    except redis.RedisError:
        return False


# --- at start: one line, exit 2, never a wait ----------------------------------------------------


def _worker_refuses(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cli(["worker", "code"], env, timeout=60)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"DISPATCHQ_REDIS_SENTINEL_PASSWORD": "not-it"}, "DISPATCHQ_REDIS_SENTINEL_PASSWORD"),
        ({"DISPATCHQ_REDIS_SENTINEL_PASSWORD": ""}, "DISPATCHQ_REDIS_SENTINEL_PASSWORD"),
        ({"service": "no-such-service"}, "monitors a service named 'no-such-service'"),
        ({"primary_password": "not-it"}, "refused the login: wrong or missing password"),
        ({"plain": "sentinel"}, "is a Redis Sentinel, not a Redis server"),
    ],
    ids=["wrong-sentinel-password", "no-sentinel-password", "unknown-service", "wrong-password", "plain-url"],
)
def test_a_misconfigured_sentinel_url_is_refused_at_start_in_one_line(
    shared_topology: Topology, dq_env: dict[str, str], tmp_path: Path, change: dict[str, str], says: str
) -> None:
    write_config(tmp_path / "dispatchq.yaml", "kinds: {}\n")
    env = _env(dq_env, shared_topology)
    url = shared_topology.url
    if "service" in change:
        url = url.replace(f"/{SERVICE}", f"/{change['service']}")
    if "primary_password" in change:
        url = url.replace(PRIMARY_PASSWORD, change["primary_password"])
    if "plain" in change:
        url = f"redis://:{SENTINEL_PASSWORD}@{LOOPBACK}:{shared_topology.sentinels[0].port}/0"
    env["DISPATCHQ_REDIS_URL"] = url
    env.update({k: v for k, v in change.items() if k.startswith("DISPATCHQ_")})
    if env.get("DISPATCHQ_REDIS_SENTINEL_PASSWORD") == "":
        del env["DISPATCHQ_REDIS_SENTINEL_PASSWORD"]

    done = _worker_refuses(env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert says in lines[0]
    assert "Traceback" not in done.stderr
    for secret in (PRIMARY_PASSWORD, SENTINEL_PASSWORD, "not-it"):
        assert secret not in done.stderr


# --- redis/redis-py#4292: a blocking read cut short must not leave its reply behind ------------------


class _Interrupted(Exception):
    pass


def _interrupted_blpop(client: redis.Redis) -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(_Interrupted):
            client.blpop(["dq-ha-nothing"], timeout=2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_command_after_an_interrupted_blocking_read_gets_its_own_reply(
    shared_topology: Topology, dq_env: dict[str, str]
) -> None:
    client = connect(load_settings(_env(dq_env, shared_topology)))
    _interrupted_blpop(client)
    # Unfixed, the connection goes back to the pool with BLPOP's reply (nil, in 2 s) to come,
    # and ECHO reads it as its own.
    try:
        assert client.echo("mine") == b"mine"
    finally:
        client.close()


def test_redis_py_still_needs_the_stale_reply_fix(shared_topology: Topology) -> None:
    """When this fails, redis-py ships the fix: drop `_DisconnectingConnection` in storage/sentinel.py."""
    manager = redis.sentinel.Sentinel(
        [(LOOPBACK, s.port) for s in shared_topology.sentinels],
        sentinel_kwargs={"password": SENTINEL_PASSWORD},
    )
    client = manager.master_for(SERVICE, password=PRIMARY_PASSWORD)
    try:
        _interrupted_blpop(client)
        assert client.echo("mine") is None  # BLPOP's timed-out reply, read as ECHO's
    finally:
        client.close()
        manager.close()
