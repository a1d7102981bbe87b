"""A credential pool across hosts on one Redis: limits and money, where only Redis can arbitrate.

Hosts are real processes of their own (`DISPATCHQ_HOST`, data dir, and a stall proxy as their
link to Redis: `tests/support/partition.py`). The sessions are the fake `claude`, which logs the
credential it was given and takes plan steps meant for one credential.

What is asserted is counted: spawns per credential (from the fakes' logs), markers, the spool
on disk, admissions and the day's spend. Every wait is bounded; no duration is asserted.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import threading
import time
from pathlib import Path

import pytest

from dispatchq.client import Client
from dispatchq.pools.credentials import qualify
from dispatchq.pools.spend import spend_periods
from dispatchq.tiers.lease import spool_of
from dispatchq.window.limits import GENERAL_SCOPE
from tests.support.partition import SESSION_COMMAND, Cluster
from tests.support.pool_ha import (
    MAX_ROUNDS,
    pool_config,
    race_admissions,
    retriggers,
    sample_max,
    secret,
    spawns_on,
    tally,
)
from tests.support.session import GATE

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux"),
]


def test_a_limit_on_a_seen_by_a_host_cut_off_from_redis_closes_only_a_through_its_spool_and_b_answers(
    cluster: Cluster, tmp_path: Path
) -> None:
    a_file = secret(cluster, "team-a", "tok-A")
    b_file = secret(cluster, "team-b", "tok-B")
    pool_config(
        cluster,
        f"""
        team-a:
          token_file: {a_file}
          concurrency: 1
        team-b:
          token_file: {b_file}
          concurrency: 2
          order: 1
        """,
    )
    resets_at = int(time.time()) + 3600
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps([{"credential": "tok-A", "scenario": "limit_event", "resets_at": str(resets_at)}])
    )
    # Host 1's first session has its output held back until `gate/open`: the limit it reports
    # reaches its worker only once the test has cut host 1 off.
    gate = tmp_path / "gate"
    gate.mkdir()
    script = tmp_path / "gate.py"
    script.write_text(GATE)
    # A lease longer than the cut: host 1 still holds its judgement when it replays the limit,
    # so nothing is taken over meanwhile and the replay is what asks it again.
    fakes = {"FAKE_CLAUDE_PLAN": str(plan), "FAKE_CLAUDE_SLEEP": "0.2", "DISPATCHQ_SESSION_LEASE": "12"}
    cluster.add_host(
        "h1", DISPATCHQ_SESSION_COMMAND=f"{sys.executable} {script} {gate} {SESSION_COMMAND}", **fakes
    )
    cluster.add_host("h2", **fakes)
    cluster.worker("h1")
    first = cluster.enqueue("first")
    cluster.wait(lambda: spawns_on(cluster, "tok-A", "h1"), "host 1's session on credential A")
    cluster.worker("h2")

    link = cluster.links["h1"]
    cut_at = time.monotonic()
    link.cut()
    (gate / "open").touch()  # the session says "limit" now, to a host that cannot tell Redis
    during = [cluster.enqueue(f"during-{i}") for i in range(3)]
    spool = spool_of(Path(cluster.envs["h1"]["DISPATCHQ_DATA_DIR"]))
    cluster.wait(lambda: [e.kind for e in spool.entries()] == ["limit"], "host 1 to spool its limit")
    cluster.wait(lambda: all(cluster.answered(j) for j in during), "host 2 answering on B during the cut")
    window = cluster.rt.window
    a_scope = qualify("team-a", GENERAL_SCOPE)
    b_scope = qualify("team-b", GENERAL_SCOPE)
    while_cut = {
        "A's marker": window.get(a_scope),
        "answered on B by host 2": spawns_on(cluster, "tok-B", "h2"),
        "sessions on A": spawns_on(cluster, "tok-A"),
    }
    assert while_cut == {"A's marker": None, "answered on B by host 2": 3, "sessions on A": 1}, (
        cluster.explain(first)
    )

    cut_for = time.monotonic() - cut_at
    link.heal()
    up = cluster.wait(lambda: window.get(a_scope), "the limit host 1 spooled in A's marker", timeout=60)
    cluster.wait(lambda: not spool.entries(), "host 1's spool replayed and emptied")
    after = [cluster.enqueue(f"after-{i}") for i in range(4)]
    cluster.wait(
        lambda: all(cluster.answered(j) for j in [first, *after]), "every judgement answered on B", timeout=60
    )
    on_a = spawns_on(cluster, "tok-A")
    time.sleep(2.0)  # nothing may start on A meanwhile: its lift is an hour away
    seen = {
        "A closed until its reset": (up.closed(), int(up.lifts_at)),
        "general": window.get(GENERAL_SCOPE),
        "B's marker": window.get(b_scope),
        "sessions on A": (on_a, spawns_on(cluster, "tok-A")),
        "sessions on B": spawns_on(cluster, "tok-B"),
        "A's lift scheduled": (a_scope, resets_at) in retriggers(cluster),
        "failed": [j for j in [first, *during, *after] if cluster.record(j).status == "failed"],
        "deaths of the limited judgement": cluster.deaths(first),
        "its trail names the replayed limit": "while Redis was away (replayed)" in cluster.trail_text(first),
    }
    assert seen == {
        "A closed until its reset": (True, resets_at),
        "general": None,
        "B's marker": None,
        "sessions on A": (1, 1),
        "sessions on B": 3 + 4 + 1,  # the limited judgement too, asked again on B
        "A's lift scheduled": True,
        "failed": [],
        "deaths of the limited judgement": 0,
        "its trail names the replayed limit": True,
    }, f"cut for {cut_for:.1f}s\n{cluster.explain(first)}"


#: A metered credential's day cap, its kind's estimate and what each session reports. The cap
#: is a whole number of estimates and the cost close enough to the estimate that how many fit
#: does not depend on how admissions and settlements interleave (checked in the test).
CAP, ESTIMATE, COST = 3.0, 0.30, 0.29
HOSTS, THREADS = 2, 3


def test_two_hosts_racing_for_the_last_dollar_under_a_cap_never_both_take_it(cluster: Cluster) -> None:
    key = secret(cluster, "api", "key-M")
    pool_config(
        cluster,
        f"""
        api:
          api_key_file: {key}
          billing: metered
          spend_cap: {{day: {CAP}}}
          serves: {{priority: urgent}}
          concurrency: 64
        """,
        kinds_extra=f"""
          priced:
            session:
              prompt: "Answer {{{{ target }}}}"
              cost_estimate: {ESTIMATE}
        """,
    )
    fits = int(round(CAP * 1e6) // round(ESTIMATE * 1e6))
    # However settled the earlier sessions are, `fits` always have room and one more never has.
    assert (fits - 1) * COST + ESTIMATE <= CAP < fits * COST + ESTIMATE
    client = Client(runtime=cluster.rt)
    jids = [client.enqueue("priced", f"t-{i}", priority="urgent") for i in range(fits + 3 * HOSTS * THREADS)]

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(HOSTS * THREADS)
    per_round = context.Array("i", MAX_ROUNDS)
    outs = []
    procs = []
    for n in range(HOSTS):
        name = f"h{n + 1}"
        cluster.add_host(name)
        outs.append(cluster.tmp / f"race-{name}.json")
        env = cluster.envs[name]
        procs.append(
            context.Process(
                target=race_admissions, args=(env, THREADS, COST, barrier, per_round, str(outs[-1]))
            )
        )
    periods = spend_periods(time.time(), cluster.rt.settings.timezone)
    pool = cluster.rt.storage.pool
    stop = threading.Event()
    highest: list[float] = []
    watcher = threading.Thread(target=sample_max, args=(lambda: pool.spent("api", periods)[0], stop, highest))
    watcher.start()
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=90)
    finally:
        stop.set()
        watcher.join(timeout=10)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
    assert [proc.exitcode for proc in procs] == [0] * HOSTS
    race = tally(outs, list(per_round))
    admitted = [jid for jid, _ in race.admitted]
    day, month = pool.spent("api", periods)
    seen = {
        "errors": race.errors,
        "admitted": len(admitted),
        "each once": len(set(admitted)) == len(admitted),
        "on the metered credential": {cred for _, cred in race.admitted},
        "the day's spend": round(day, 6),
        "the month's spend": round(month, 6),
        "past the cap by at most one estimate at any time": highest[0] <= CAP + ESTIMATE,
        "raced over more than one round": race.rounds > 1,
    }
    assert seen == {
        "errors": [],
        "admitted": fits,
        "each once": True,
        "on the metered credential": {"api"},
        "the day's spend": round(fits * COST, 6),
        "the month's spend": round(fits * COST, 6),
        "past the cap by at most one estimate at any time": True,
        "raced over more than one round": True,
    }, (highest, race)
    left = [jid for jid in jids if jid not in admitted]
    statuses = cluster.rt.storage.records.statuses(left)
    assert set(statuses) <= {"queued", "waiting"}, statuses
    assert any("cap reached" in (cluster.record(jid).reason or "") for jid in left), [
        cluster.record(jid).reason for jid in left
    ]
