"""A process waiting for a writable primary follows a Sentinel failover instead of sleeping
out its back-off (`storage.failover`), on the real sentinels of tests/ha/conftest.py.

A wait whose back-off step is 600 s is put to sleep on a primary that refuses writes
(`min-replicas-to-write` above its replicas: NOREPLICAS). The sentinels then move the primary
(`SENTINEL FAILOVER`): the wait must end on the new primary, having slept far less than its
step, and say which primary it went to. And a wait that begins after the move, on a promoted
primary still refusing writes, must try it every second (the steps it announces), not sleep
600 s. What is counted is what the wait decided (its steps, the sleep it asked for, the
primary it returned), never a clock: the 30 s join is only there so a regression fails
instead of hanging.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis

from dispatchq.settings import Settings, load_settings
from dispatchq.storage.failover import PrimaryWatch, primary_watch
from dispatchq.storage.outage import Backoff, OutageLog, wait_for_redis
from dispatchq.testing.sentinel import LOOPBACK, SERVICE, Topology
from tests.ha.conftest import ha_env
from tests.support.helpers import wait_for

pytestmark = pytest.mark.slow

STEP = 600.0
LOG = "test.failover-watch"


class _Wait(threading.Thread):
    """`wait_for_redis` in a thread, with a 600 s back-off, recording the sleep it asks for."""

    def __init__(self, settings: Settings, watch: PrimaryWatch) -> None:
        super().__init__(daemon=True)
        self.settings = settings
        self.watch = watch
        self.stop = threading.Event()
        self.slept: list[float] = []
        self.steps: list[float] = []
        self.outage = OutageLog(
            settings.describe_redis(), logging.getLogger(LOG), backoff=Backoff(STEP, STEP)
        )
        step = self.outage.step

        def recorded(error: BaseException, ceiling: float | None = None) -> float:
            self.steps.append(step(error, ceiling))
            return self.steps[-1]

        self.outage.step = recorded  # type: ignore[method-assign]
        self.client: redis.Redis | None = None

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        time.sleep(seconds)

    def run(self) -> None:
        self.client = wait_for_redis(
            self.settings,
            log=logging.getLogger(LOG),
            stopping=self.stop.is_set,
            sleep=self.sleep,
            outage=self.outage,
            watch=self.watch,
        )

    def finish(self) -> redis.Redis:
        self.join(timeout=30)
        if self.is_alive():
            self.stop.set()
            self.join(timeout=10)
            pytest.fail(f"the wait was still asleep in its {STEP:g} s step (steps {self.steps})")
        assert self.client is not None
        return self.client


def _refuse_writes(topology: Topology, port: int, refuse: bool) -> None:
    node = topology.primary if topology.primary.port == port else topology.replica
    admin = topology.client(node)
    try:
        admin.config_set("min-replicas-to-write", 5 if refuse else 0)
    finally:
        admin.close()


def _fail_over(topology: Topology) -> None:
    sentinel = topology.client(topology.sentinels[0])
    try:
        assert sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)
    finally:
        sentinel.close()


def _served_by(client: redis.Redis) -> int:
    client.set("dq-test:failover-watch", "1")
    return int(client.connection_pool.get_master_address()[1])  # type: ignore[attr-defined]


def test_a_wait_asleep_in_its_back_off_goes_to_the_new_primary_when_the_sentinels_name_it(
    topology: Topology, dq_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_settings(ha_env(dq_env, topology))
    watch = primary_watch(settings)
    assert watch is not None
    watch.settle = 0  # no cap for a new primary: only the move may end the 600 s sleep
    _refuse_writes(topology, topology.primary.port, refuse=True)
    wait = _Wait(settings, watch)
    with caplog.at_level(logging.INFO, logger=LOG):
        wait.start()
        wait_for(lambda: wait.steps, timeout=30, what="the wait's first round to be refused")
        assert wait.steps == [STEP]
        _fail_over(topology)
        client = wait.finish()
    try:
        assert _served_by(client) == topology.replica.port
    finally:
        client.close()
    assert wait.steps == [STEP]  # one refused round, then the new primary took the probe
    assert sum(wait.slept) < STEP  # woken, not slept out
    moved = [r.getMessage() for r in caplog.records if "new primary" in r.getMessage()]
    assert moved == [f"Sentinel names a new primary at {LOOPBACK}:{topology.replica.port}: trying it now"]


def test_a_wait_that_begins_on_a_promoted_primary_refusing_writes_tries_it_every_second(
    topology: Topology, dq_env: dict[str, str]
) -> None:
    _fail_over(topology)
    wait_for(
        lambda: topology.primary_port() == topology.replica.port,
        timeout=30,
        what="the sentinels to name the promoted replica",
    )
    settings = load_settings(ha_env(dq_env, topology))
    watch = primary_watch(settings)
    assert watch is not None
    _refuse_writes(topology, topology.replica.port, refuse=True)  # as if waiting for its replica
    wait = _Wait(settings, watch)
    wait.start()
    wait_for(lambda: len(wait.steps) >= 2, timeout=30, what="two refused rounds")
    _refuse_writes(topology, topology.replica.port, refuse=False)
    client = wait.finish()
    try:
        assert _served_by(client) == topology.replica.port
    finally:
        client.close()
    # The sentinels saw this primary take the role seconds ago: steps of a second, not 600 s.
    assert wait.steps and max(wait.steps) == 1.0, wait.steps


def test_the_reconfig_script_makes_the_old_primary_a_replica_before_sentinel_would(
    guarded_topology: Topology,
) -> None:
    topology = guarded_topology
    events = [topology.client(node).pubsub() for node in topology.sentinels]
    for pubsub in events:
        pubsub.subscribe("+switch-master", "+convert-to-slave")
    seen: list[str] = []

    def heard(channel: str) -> bool:
        for pubsub in events:
            while (message := pubsub.get_message(timeout=0)) is not None:
                if message["type"] == "message":
                    seen.append(message["channel"].decode())
        return channel in seen

    def takes_a_write() -> bool:
        heard("+convert-to-slave")
        probe = topology.client(topology.replica)
        try:
            return bool(probe.set("dq-test:failover-watch", "1"))
        except redis.RedisError:  # still a replica, or a primary with no replica yet
            return False
        finally:
            probe.close()

    try:
        _fail_over(topology)
        wait_for(takes_a_write, timeout=60, what="the promoted replica to take a write")
        # Published before the script ran; its delivery to us may trail the write a moment.
        wait_for(lambda: heard("+switch-master"), timeout=30, what="the sentinels' +switch-master")
        old = topology.client(topology.primary)
        try:
            role = old.execute_command("ROLE")
        finally:
            old.close()
    finally:
        for pubsub in events:
            pubsub.close()
    assert role[0] == b"slave" and int(role[2]) == topology.replica.port
    assert "+convert-to-slave" not in seen, seen  # the script, not Sentinel's late conversion, did it
