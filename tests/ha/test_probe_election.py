"""A probe session that outlives a fixed election of `probe_grace * 2 + 30` s keeps it.

Hosts A and B, real `dispatchq worker session` processes behind stall proxies to one Redis
(`tests/support/partition.py`), two session slots. A window's marker has just lifted, so A's
first session is the probe; its output is held back behind a gate (`tests/support/gated.py`),
so it never shows the window open. A is then cut off for longer than a fixed election of
`DISPATCHQ_PROBE_GRACE * 2 + 30` s would last, but shorter than its session's lease less its
margin: A's session rightly runs on, and B, with a judgement waiting in the same scope, must not
elect itself a second probe meanwhile. What is asserted is counted (spawns per host); the waits are
bounded and no duration is asserted.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dispatchq.window.face import Window
from dispatchq.window.limits import GENERAL_SCOPE
from tests.support.gated import gated_command
from tests.support.partition import SESSION_COMMAND, Cluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux"),
]

GRACE = 10  # DISPATCHQ_PROBE_GRACE: the old election lasted GRACE * 2 + 30 = 50 s
LEASE = 90  # DISPATCHQ_SESSION_LEASE: its holder fences itself only after 90 - 22.5 s cut off
CUT = GRACE * 2 + 30 + 6  # past the old election, well inside the lease less its margin


def lifted(window: Window) -> bool:
    marker = window.get(GENERAL_SCOPE)
    return marker is not None and not marker.closed()


def test_a_probe_cut_off_past_the_old_fixed_election_keeps_it_and_no_second_probe_starts(
    cluster: Cluster, tmp_path: Path
) -> None:
    gate, command = gated_command(tmp_path, SESSION_COMMAND)
    common = {
        "DISPATCHQ_SESSION_LEASE": str(LEASE),
        "DISPATCHQ_PROBE_GRACE": str(GRACE),
        "DISPATCHQ_SESSION_CONCURRENCY": "2",
        "FAKE_CLAUDE_SLEEP": "600",
    }
    cluster.add_host("A", DISPATCHQ_SESSION_COMMAND=command, **common)
    cluster.add_host("B", **common)
    window = cluster.rt.window
    window.close(datetime.now(UTC) + timedelta(seconds=1), reason="a limit", who="test")
    cluster.wait(lambda: lifted(window), "the marker's lift to pass")
    probe = cluster.enqueue("probe")
    cluster.worker("A")
    cluster.wait(lambda: cluster.spawns("A"), "host A to spawn the probe session")
    a = cluster.links["A"]
    a.cut()  # before its grace could show the window open
    other = cluster.enqueue("other")
    cluster.worker("B")
    ends = time.monotonic() + CUT
    while time.monotonic() < ends:
        assert not cluster.spawns("B"), f"B started a second probe\n{cluster.explain(other)}"
        time.sleep(0.2)
    a.heal()
    seen = {
        "spawns": cluster.spawns_stay(),
        "probe still running": cluster.record(probe).status,
        "other not started": cluster.record(other).status in ("queued", "waiting"),
    }
    assert seen == {
        "spawns": {"A": 1, "B": 0},
        "probe still running": "running",
        "other not started": True,
    }, cluster.explain(probe)
    (gate / "open").touch()
