"""A forced failover under load, and a master demoted under running workers.

Forced (`SENTINEL FAILOVER`) with `min-replicas-to-write 1` on both data nodes: the primary
refuses writes the moment it has no replica (`NOREPLICAS`, waited out like any outage),
and an enqueue is acknowledged only once a replica has it (`WAIT`). Afterwards every
acknowledged judgement is answered exactly once, no dispatchq process exited, and none of
what the CLI acknowledged is lost.

Demoted (`REPLICAOF` on the primary a plain URL names, while workers run against it): the
server still answers PING and refuses every write (`READONLY`). The workers' wait probes
with a write, so it neither mistakes the replica for the primary back nor spins: the server's
own count of refused probe writes bounds the rounds, and the workers' logs the lines, per
back-off step. Counts, not times: the bound grows with however long the machine took.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from dispatchq.settings import load_settings
from dispatchq.storage.connection import connect
from dispatchq.storage.store import Store
from dispatchq.testing.sentinel import (
    LOOPBACK,
    PRIMARY_PASSWORD,
    SERVICE,
    Producer,
    Topology,
    plain_pair,
)
from tests.ha.conftest import (
    doubling_kind,
    ha_env,
    start_worker,
    worker_logs,
)
from tests.support.helpers import run_cli, wait_for

pytestmark = pytest.mark.slow


def _answered_once(store: Store, acknowledged: list[str], tmp_path: Path) -> None:
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
        assert record is not None  # not lost
        assert [t.outcome for t in record.trail].count("answered") == 1, record.id


def test_a_forced_failover_under_load_with_min_replicas_loses_no_acknowledged_judgement(
    guarded_topology: Topology, dq_env: dict[str, str], tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    topology = guarded_topology
    env = ha_env(dq_env, topology)
    doubling_kind(tmp_path)
    client = connect(load_settings(env))
    for i in range(2):
        workers.append(start_worker(env, tmp_path / f"worker-{i}.log"))
    producer = Producer(env)
    producer.start()
    try:
        store = Store(client)
        wait_for(lambda: store.count("answered") >= 10, timeout=60, what="the load to be under way")
        sentinel = topology.client(topology.sentinels[0])
        try:
            assert sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)
        finally:
            sentinel.close()
        wait_for(
            lambda: topology.primary_port() == topology.replica.port,
            timeout=60,
            what=f"the sentinels to promote the replica:\n{topology.logs()}",
        )
        batches = producer.batches
        wait_for(
            lambda: producer.batches >= batches + 3,
            timeout=90,
            what=f"acknowledged enqueues on the new primary:\n{topology.logs()}",
        )
    finally:
        producer.stopping.set()
        producer.join(timeout=120)

    acknowledged = producer.acknowledged
    assert len(acknowledged) >= 20
    _answered_once(Store(client), acknowledged, tmp_path)
    assert [w.poll() for w in workers] == [None, None], worker_logs(tmp_path)
    old = topology.client(topology.primary)
    try:
        assert old.info("replication")["role"] == "slave"  # the old primary follows the new one
    finally:
        old.close()
    client.close()


#: The wait's back-off (storage/outage.py's `Backoff`): 0.5 s, doubling, capped at 30 s.
def _steps_within(seconds: float) -> int:
    """How many back-off steps a wait can have begun within `seconds`."""
    steps, delay, spent = 0, 0.5, 0.0
    while spent <= seconds:
        steps += 1
        spent += delay
        delay = min(30.0, delay * 2)
    return steps


def _refused_probes(topology: Topology) -> int:
    """SETs the server refused: the wait's probe writes (nothing else an idle code worker does is a SET;
    the commands a worker's teardown meets READONLY on are SREM, HSET, DEL, EXPIRE, ZREM)."""
    probe = topology.client(topology.primary)
    try:
        stats = probe.info("commandstats")
    finally:
        probe.close()
    return int(stats.get("cmdstat_set", {}).get("rejected_calls", 0))


def _redis_lines(tmp_path: Path) -> int:
    return sum(
        1
        for log in tmp_path.glob("worker-*.log")
        for line in log.read_text(errors="replace").splitlines()
        if "Redis " in line
    )


def test_a_demoted_master_is_waited_on_without_a_hot_loop(
    dq_env: dict[str, str], tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    with plain_pair() as pair:
        url = f"redis://:{PRIMARY_PASSWORD}@{LOOPBACK}:{pair.primary.port}/0"
        env = {**dq_env, "DISPATCHQ_REDIS_URL": url, "DISPATCHQ_BATCH_SIZE": "1"}
        doubling_kind(tmp_path)
        for i in range(2):
            workers.append(start_worker(env, tmp_path / f"worker-{i}.log"))

        def enqueue(start: int) -> list[str]:
            lines = "".join(
                json.dumps({"kind": "double", "target": f"d{i}", "state": {"n": i}}) + "\n"
                for i in range(start, start + 3)
            )
            done = run_cli(["enqueue", "-"], env, input=lines)
            assert done.returncode == 0, done.stderr
            return [line.split("\t")[1] for line in done.stdout.splitlines()]

        client = connect(load_settings(env))
        store = Store(client)
        first = enqueue(0)
        wait_for(lambda: store.statuses(first) == ["answered"] * 3, timeout=60, what="the first judgements")
        lines_before = _redis_lines(tmp_path)
        refused_before = _refused_probes(pair)

        demoted = pair.client(pair.primary)
        try:
            began = time.monotonic()
            demoted.replicaof(LOOPBACK, pair.replica.port)
            time.sleep(10)  # the workers wait on the demoted master meanwhile
            rounds = _refused_probes(pair) - refused_before
            lines = _redis_lines(tmp_path) - lines_before
            steps = _steps_within(time.monotonic() - began)
            demoted.replicaof("NO", "ONE")
        finally:
            demoted.close()

        # Per worker (two of them): at most two rounds per back-off step; a hot loop is thousands.
        assert rounds >= 2, worker_logs(tmp_path)  # the workers did wait on the demotion
        assert rounds <= 2 * 2 * steps, (rounds, steps, worker_logs(tmp_path))
        assert lines <= 2 * 2 * steps, (lines, steps, worker_logs(tmp_path))

        # Promoted again (empty: it took the spare's data): the same workers carry on.
        client.close()
        client = connect(load_settings(env))
        store = Store(client)
        again = enqueue(10)
        wait_for(
            lambda: store.statuses(again) == ["answered"] * 3,
            timeout=90,
            what=f"judgements after the demotion ended:\n{worker_logs(tmp_path)}",
        )
        assert [w.poll() for w in workers] == [None, None], worker_logs(tmp_path)
        client.close()
