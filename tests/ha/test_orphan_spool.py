"""A host cut off after its session finished: its spooled answer is waited for, a bounded time.

Two hosts, A and B, each a real `dispatchq worker session` process behind a stall proxy to one
Redis (`tests/support/partition.py`, a 6 s lease). A's session is the fake claude behind a gate
(`tests/support/gated.py`): it finishes at once, and its answer reaches A's worker only after
the test has cut A off, so A keeps it in its spool. Only A can read that spool. B leaves the
judgement to A's own replay for `DISPATCHQ_SESSION_SPOOL_WAIT` past the lease; then it runs it
itself. What is asserted is counted (spawns per host, the record's answer and trail); the waits
are bounded and no duration is asserted.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.support.gated import gated_command
from tests.support.partition import LEASE, SESSION_COMMAND, Cluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux"),
]


def _a_finishes_cut_off(cluster: Cluster, tmp_path: Path, wait: int, **b_env: str) -> tuple[str, Path]:
    """A runs the judgement; A is cut off; its session's answer then reaches A, which spools it."""
    gate, command = gated_command(tmp_path, SESSION_COMMAND)
    cluster.add_host(
        "A", DISPATCHQ_SESSION_COMMAND=command, FAKE_CLAUDE_SLEEP="0", DISPATCHQ_SESSION_SPOOL_WAIT=str(wait)
    )
    cluster.add_host("B", **b_env)
    cluster.worker("A")
    jid = cluster.enqueue("orphan")
    cluster.wait(lambda: cluster.spawns("A"), "host A to spawn the session")
    cluster.worker("B")
    cluster.links["A"].cut()
    (gate / "open").touch()  # the answer reaches a worker that cannot write it
    spool = tmp_path / "data-A" / "spool"
    cluster.wait(lambda: list(spool.glob("*.answer.json")), "host A to spool its answer", timeout=LEASE + 30)
    return jid, spool


def late_answers(cluster: Cluster, jid: str) -> int:
    return sum(1 for e in cluster.record(jid).trail if e.outcome == "late")


def test_a_host_back_within_the_spool_wait_lands_its_answer_and_no_other_host_pays_for_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    jid, spool = _a_finishes_cut_off(cluster, tmp_path, wait=60)
    lapsed = time.monotonic() + LEASE + 4  # A's lease lapses meanwhile: B sweeps, and waits
    while time.monotonic() < lapsed:
        assert not cluster.spawns("B"), cluster.explain(jid)
        time.sleep(0.1)
    cluster.links["A"].heal()
    cluster.wait(lambda: cluster.answered(jid), "A's replay to answer the judgement", timeout=60)
    facts = cluster.facts(jid)
    # A's session ends at once, so a sampler may never see it alive: the rule is only that two never are.
    facts["never two alive at once"] = facts.pop("most alive at once") <= 1
    facts["late answers"] = late_answers(cluster, jid)
    facts["spool left"] = sorted(p.name for p in spool.glob("*.json"))
    assert facts == {
        "spawns": {"A": 1, "B": 0},  # paid once
        "never two alive at once": True,
        "A's session ran to its end": True,
        "status": "answered",
        "answer": "from A",  # A's spooled answer
        "answers on the trail": 1,
        "lost contact on the trail": False,
        "deaths": 0,
        "late answers": 0,
        "spool left": [],
    }, cluster.explain(jid)


def test_a_host_that_stays_away_past_the_wait_is_replaced_once_and_its_answer_is_late(
    cluster: Cluster, tmp_path: Path
) -> None:
    jid, spool = _a_finishes_cut_off(cluster, tmp_path, wait=2, FAKE_CLAUDE_SLEEP="1")
    cluster.wait(lambda: cluster.answered(jid), "B to answer it once the wait is over", timeout=90)
    cluster.links["A"].heal()  # back too late: its answer goes on the trail only
    cluster.wait(lambda: late_answers(cluster, jid) == 1, "A's replay of its late answer", timeout=60)
    cluster.wait(lambda: not list(spool.glob("*.json")), "A's spool to be empty", timeout=30)
    facts = cluster.facts(jid)
    facts["never two alive at once"] = facts.pop("most alive at once") <= 1
    facts["late answers"] = late_answers(cluster, jid)
    assert facts == {
        "spawns": {"A": 1, "B": 1},  # never dropped: B ran it, once
        "never two alive at once": True,
        "A's session ran to its end": True,
        "status": "answered",
        "answer": "from B",
        "answers on the trail": 1,
        "lost contact on the trail": True,
        "deaths": 0,
        "late answers": 1,
    }, cluster.explain(jid)
