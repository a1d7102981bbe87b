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
from pathlib import Path
from typing import Any

import pytest
import redis

from dispatchq.settings import load_settings
from dispatchq.storage.connection import connect, connect_async
from dispatchq.storage.store import Store
from dispatchq.testing.sentinel import (
    LOOPBACK,
    PRIMARY_PASSWORD,
    SENTINEL_PASSWORD,
    SERVICE,
    Producer,
    Topology,
    restart,
)
from tests.ha.conftest import (
    doubling_kind,
    ha_env,
    start_worker,
    worker_logs,
)
from tests.support.helpers import run_cli, wait_for, write_config

pytestmark = pytest.mark.slow


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
    env = ha_env(dq_env, topology)
    settings = load_settings(env)
    doubling_kind(tmp_path)
    before = connect(settings)  # a long-lived client, made before the failover
    assert int(before.info("server")["tcp_port"]) == topology.primary.port
    assert _async_primary_port(settings) == topology.primary.port
    for i in range(2):
        workers.append(start_worker(env, tmp_path / f"worker-{i}.log"))
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
        restart(
            topology.primary, topology.replica.port
        )  # it rejoins as the new primary's replica: enqueues are acknowledged again
        batches = producer.batches
        wait_for(
            lambda: producer.batches >= batches + 3,
            timeout=90,
            what=f"enqueues on the new primary:\n{topology.logs()}",
        )
    finally:
        producer.stopping.set()
        producer.join(timeout=120)

    # The client made before the kill follows the primary the sentinels name, as does a new one,
    # sync and async. Which node that is, is theirs to say: on a loaded machine they may move it
    # again (the restarted node has the data), and a sentinel that has not yet heard of the move
    # may name the old node for a moment, whose reads then answer until its writes refuse.
    wait_for(lambda: _writes(before), timeout=30, what="the old client to write again")
    wait_for(
        lambda: _on_primary(before, topology),
        timeout=30,
        what=f"the old client on the primary:\n{topology.logs()}",
    )
    after = connect(settings)
    assert _on_primary(after, topology)
    assert _async_primary_port(settings) == topology.primary_port()

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
        pytest.fail(
            f"not every acknowledged judgement was answered; the workers said:\n{worker_logs(tmp_path)}"
        )
    for record in store.get_many(acknowledged):
        assert record is not None
        assert [t.outcome for t in record.trail].count("answered") == 1, record.id
    assert [w.poll() for w in workers] == [None, None], worker_logs(tmp_path)
    before.close()
    after.close()


def _on_primary(client: redis.Redis, topology: Topology) -> bool:
    """Does `client` answer from the node the sentinels name as the primary now?"""
    try:
        return int(client.info("server")["tcp_port"]) == topology.primary_port()
    except redis.RedisError:
        return False


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
    env = ha_env(dq_env, shared_topology)
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
    client = connect(load_settings(ha_env(dq_env, shared_topology)))
    _interrupted_blpop(client)
    # Unfixed, the connection goes back to the pool with BLPOP's reply (nil, in 2 s) to come,
    # and ECHO reads it as its own.
    try:
        assert client.echo("mine") == b"mine"
    finally:
        client.close()


def test_redis_py_reads_a_stale_reply_before_its_fix_and_its_own_after(shared_topology: Topology) -> None:
    """redis-py 8.2 reads the right reply (redis/redis-py#4292 fixed); an older one, which
    `redis>=5.0` still allows, reads BLPOP's. When the floor passes 8.2, drop
    `_DisconnectingConnection` in storage/sentinel.py and this test with it."""
    manager = redis.sentinel.Sentinel(
        [(LOOPBACK, s.port) for s in shared_topology.sentinels],
        sentinel_kwargs={"password": SENTINEL_PASSWORD},
    )
    client = manager.master_for(SERVICE, password=PRIMARY_PASSWORD)
    fixed = tuple(int(part) for part in redis.__version__.split(".")[:2]) >= (8, 2)
    try:
        _interrupted_blpop(client)
        # Unfixed: BLPOP's timed-out reply (nil), read as ECHO's.
        assert client.echo("mine") == (b"mine" if fixed else None), redis.__version__
    finally:
        client.close()
        manager.close()


# --- acknowledged means replicated ------------------------------------------------------------------


def test_an_enqueue_no_replica_confirms_is_not_acknowledged_and_a_resend_is_safe(
    shared_topology: Topology, dq_env: dict[str, str], tmp_path: Path
) -> None:
    env = ha_env(dq_env, shared_topology, DISPATCHQ_REDIS_WAIT_MS="300")
    doubling_kind(tmp_path)
    lines = "".join(
        json.dumps({"kind": "double", "target": f"w{i}", "state": {"n": i}}) + "\n" for i in range(3)
    )
    replica = shared_topology.replica.proc
    assert replica is not None
    replica.send_signal(signal.SIGSTOP)  # alive, but acknowledging nothing
    try:
        refused = run_cli(["enqueue", "-"], env, input=lines)
    finally:
        replica.send_signal(signal.SIGCONT)
    assert refused.returncode != 0
    assert "\t" not in refused.stdout  # no id acknowledged
    assert "NOREPLICAS" in refused.stderr and "DISPATCHQ_REDIS_WAIT_MS" in refused.stderr
    assert "Traceback" not in refused.stderr

    primary = shared_topology.client(shared_topology.primary)
    try:
        wait_for(lambda: primary.execute_command("WAIT", 1, 1000) == 1, timeout=30, what="the replica again")
        resent = run_cli(["enqueue", "-"], env, input=lines)
        assert resent.returncode == 0, resent.stderr
        ids = [line.split("\t")[1] for line in resent.stdout.splitlines()]
        assert len(ids) == 3
        client = connect(load_settings(env))
        records = Store(client).get_many(ids)
        client.close()
        # Acknowledged now; a copy the refused enqueue left behind is recognised, not written twice.
        assert all(r is not None for r in records)
        assert len({r.id for r in records if r is not None}) == 3
    finally:
        primary.close()
