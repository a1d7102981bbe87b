"""Hosts cut off from Redis mid-session: leases, not guesses (issue 21's partition cases).

Two hosts, A and B, each a real `dispatchq worker session` process with its own
`DISPATCHQ_HOST`, data dir and link to one Redis (a redis-server of the test's own on
loopback). A link is a stall proxy (`tests/support/stallproxy.py`: a silent partition, every
socket kept open) and, for the shared-line case, also a network namespace whose veth goes
dark (`tests/support/netns.py`). The session command is the fake claude, an 8 s session, with
`DISPATCHQ_SESSION_LEASE=6`.

What is asserted is counted: spawns per host (each fake appends its pid to its host's spawn
log), the most sessions alive at once (sampled from those pids), whether a session finished
or was ended (the fake's record), the record's answer, trail and `deaths`, the marker. The
waits are bounded; no duration is asserted.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dispatchq.window.limits import GENERAL_SCOPE
from tests.support.helpers import pid_alive
from tests.support.netns import LoopbackRedis, Namespaces, require_netns
from tests.support.partition import (
    LEASE,
    SESSION,
    SESSION_COMMAND,
    Cluster,
)
from tests.support.stallproxy import LOOPBACK, StallProxy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux"),
]

# Holds a session's whole output back until `<gate>/open` exists: what the session says (a
# limit) then reaches its worker only after the test has cut the host off.
GATE = r"""
import os, subprocess, sys, time
gate, command = sys.argv[1], sys.argv[2:]
done = subprocess.run(command, input=sys.stdin.buffer.read(), stdout=subprocess.PIPE)
limit = time.monotonic() + 120
while not os.path.exists(os.path.join(gate, "open")) and time.monotonic() < limit:
    time.sleep(0.02)
sys.stdout.buffer.write(done.stdout)
sys.stdout.flush()
sys.exit(done.returncode)
"""


def _a_runs_it(cluster: Cluster, *, checkout: Path | None = None) -> str:
    """Host A's worker takes one judgement and its session starts; then B's worker joins."""
    cluster.add_host("A")
    cluster.add_host("B")
    cluster.worker("A")
    jid = cluster.enqueue("partition", checkout)
    cluster.wait(lambda: cluster.spawns("A"), "host A to spawn the session")
    cluster.worker("B")
    return jid


def test_a_cut_shorter_than_the_lease_costs_nothing(cluster: Cluster) -> None:
    jid = _a_runs_it(cluster)
    a = cluster.links["A"]
    a.cut()
    time.sleep(2.0)  # the cut: 2 s, shorter than the 6 s lease
    a.heal()
    cluster.wait(lambda: cluster.answered(jid), "the judgement answered", timeout=60)
    assert cluster.facts(jid) == {
        "spawns": {"A": 1, "B": 0},  # one spawn, no takeover
        "most alive at once": 1,
        "A's session ran to its end": True,
        "status": "answered",
        "answer": "from A",
        "answers on the trail": 1,
        "lost contact on the trail": False,
        "deaths": 0,
    }, cluster.explain(jid)


def test_a_cut_longer_than_the_lease_moves_shared_work_once_and_never_runs_it_twice(
    any_cluster: Cluster,
) -> None:
    cluster = any_cluster
    jid = _a_runs_it(cluster)
    a = cluster.links["A"]
    a.cut()
    (first,) = cluster.spawns("A")
    # A cannot renew: it ends its own session before its lease runs out.
    cluster.wait(lambda: not pid_alive(first), "host A's session to end", timeout=LEASE + 10)
    cluster.wait(lambda: cluster.spawns("B"), "host B to take the judgement over", timeout=60)
    a.heal()
    cluster.wait(lambda: cluster.answered(jid), "the judgement answered", timeout=60)
    assert cluster.facts(jid) == {
        "spawns": {"A": 1, "B": 1},  # B ran it once
        "most alive at once": 1,  # never two sessions of it at once
        "A's session ran to its end": False,  # A ended it
        "status": "answered",
        "answer": "from B",
        "answers on the trail": 1,
        "lost contact on the trail": True,
        "deaths": 0,
    }, cluster.explain(jid)


def test_a_cut_longer_than_the_lease_on_host_bound_work_keeps_a_s_spooled_answer(
    cluster: Cluster, tmp_path: Path
) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    jid = _a_runs_it(cluster, checkout=checkout)
    a = cluster.links["A"]
    cut_at = time.monotonic()
    a.cut()
    (first,) = cluster.spawns("A")
    # Host-bound work never self-fences: the session runs to its end while A is cut off.
    cluster.wait(lambda: not pid_alive(first), "host A's session to end", timeout=SESSION + 20)
    time.sleep(max(0.0, cut_at + LEASE + 3 - time.monotonic()))  # the cut outlasts the lease
    a.heal()
    cluster.wait(lambda: cluster.answered(jid), "the judgement answered", timeout=60)
    facts = cluster.facts(jid)
    del facts["lost contact on the trail"]  # a host-bound holder may say so; it never moved
    assert facts == {
        "spawns": {"A": 1, "B": 0},  # one spawn
        "most alive at once": 1,
        "A's session ran to its end": True,
        "status": "answered",
        "answer": "from A",  # A's spooled answer, kept
        "answers on the trail": 1,
        "deaths": 0,
    }, cluster.explain(jid)


def test_a_limit_seen_while_cut_off_reaches_the_marker_and_others_spawn_at_most_once_meanwhile(
    cluster: Cluster, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    script = tmp_path / "gate.py"
    script.write_text(GATE)
    resets_at = int(time.time()) + 3600
    cluster.add_host(
        "A",
        DISPATCHQ_SESSION_COMMAND=f"{sys.executable} {script} {gate} {SESSION_COMMAND}",
        FAKE_CLAUDE_SCENARIO="limit_event",
        FAKE_CLAUDE_RESETS_AT=str(resets_at),
        FAKE_CLAUDE_SLEEP="0",
    )
    cluster.add_host("B")
    cluster.worker("A")
    first = cluster.enqueue("first")
    cluster.wait(lambda: cluster.spawns("A"), "host A to spawn the session")
    cluster.worker("B")
    others = [cluster.enqueue(f"other-{i}") for i in range(3)]
    a = cluster.links["A"]
    cut_at = time.monotonic()
    a.cut()
    (gate / "open").touch()  # the session says "limit" now, to a host that cannot tell Redis
    time.sleep(max(0.0, cut_at + LEASE + 4 - time.monotonic()))  # room for B to spawn meanwhile
    a.heal()
    window = cluster.rt.window
    up = cluster.wait(lambda: window.get(GENERAL_SCOPE), "the limit A saw in the marker", timeout=60)
    assert int(up.lifts_at) == resets_at
    assert datetime.fromtimestamp(up.lifts_at, UTC) > datetime.now(UTC)
    spawned = cluster.spawns_stay()
    seen = {
        "A spawned": spawned["A"],
        "B spawned at most once": spawned["B"] <= 1,  # into the closed window
        # A's session ends at once (the limit), so a sampler may never see it alive: the rule is
        # only that two never are.
        "never two alive at once": cluster.max_live <= 1,
        "deaths of A's judgement": cluster.deaths(first),
        "failed": [jid for jid in [first, *others] if cluster.record(jid).status == "failed"],
    }
    assert seen == {
        "A spawned": 1,
        "B spawned at most once": True,
        "never two alive at once": True,
        "deaths of A's judgement": 0,
        "failed": [],
    }, cluster.explain(first)


def test_the_stall_proxy_holds_both_ways_keeps_sockets_open_and_resets(
    partition_server: LoopbackRedis,
) -> None:
    """The harness itself: a stalled proxy moves no byte and closes nothing; heal delivers what
    was sent meanwhile; reset is seen by the client as a reset."""
    direct = partition_server.client()
    with StallProxy((LOOPBACK, partition_server.port), name="probe") as proxy:
        client = partition_server.client(proxy.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
        assert client.ping()
        assert proxy.connections() == 1
        proxy.stall()
        moved = proxy.forwarded
        with pytest.raises(redis.TimeoutError):
            client.set("sent-during-the-stall", "1")
        assert proxy.forwarded == moved
        assert direct.get("sent-during-the-stall") is None
        proxy.heal()
        wait_for_value = time.monotonic() + 10
        while direct.get("sent-during-the-stall") is None and time.monotonic() < wait_for_value:
            time.sleep(0.05)
        assert direct.get("sent-during-the-stall") == b"1"  # delivered late, as TCP would
        # A raw socket: redis-py would quietly reconnect a pooled connection that was reset.
        with socket.create_connection((LOOPBACK, proxy.port), timeout=10) as raw:
            raw.sendall(f"AUTH {partition_server.password}\r\nPING\r\n".encode())
            seen = b""
            while b"PONG" not in seen:
                seen += raw.recv(100)
            assert proxy.reset() >= 1
            with pytest.raises(ConnectionResetError):
                raw.recv(100)
        client.close()
    direct.close()


def test_namespace_hosts_are_cut_by_their_link_and_cleaned_up(partition_server: LoopbackRedis) -> None:
    require_netns()
    probe = "import redis, sys; print(redis.Redis.from_url(sys.argv[1], socket_timeout=2).ping())"
    with Namespaces(partition_server.port) as namespaces:
        host = namespaces.add("probe")
        argv = [sys.executable, "-c", probe, host.redis_url(partition_server.password)]
        ok = host.popen(argv, {"PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE)
        assert ok.communicate(timeout=30)[0].strip() == b"True"
        host.cut()
        cut = host.popen(argv, {"PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = cut.communicate(timeout=30)
        assert cut.returncode != 0 and b"Timeout" in err
        host.heal()
        again = host.popen(argv, {"PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE)
        assert again.communicate(timeout=30)[0].strip() == b"True"
        name = host.netns
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    assert name not in listed
