"""The probe's election lives as long as its session's lease, renewed with it, not a fixed formula.

A lifted marker elects one probe at admission; every other admission in its scope waits for the
probe's session to show the window open. An election of a fixed `probe_grace * 2 + 30` seconds,
whatever the session's lease, would let a second probe start under a holder whose renewals
stalled longer than that while its claim lived, and hold a dead holder's scope that long.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from dispatchq.storage import keys
from dispatchq.storage.store import NewRecord, Store
from dispatchq.tiers.lease import Holding
from dispatchq.tiers.session import Admission, Wait, admit
from dispatchq.window.face import Window
from dispatchq.window.limits import GENERAL_SCOPE


def waiting(store: Store, *jids: str) -> None:
    """Session judgements in the shared line, not claimed."""
    line = keys.session_line()
    entries = []
    for jid in jids:
        fields = {
            "id": jid,
            "content_key": f"ck-{jid}",
            "force": "0",
            "line": line,
            "input": json.dumps({"kind": "ask", "target": jid}),
            "tier": "session",
            "effect": "local",
        }
        entries.append(NewRecord(**{n: fields.get(n, "") for n in NewRecord._fields}))
    store.create_many(entries)


def lifted(window: Window) -> None:
    """The general window's marker, its lift just passed: the next admission elects the probe."""
    window.close(datetime.now(UTC) + timedelta(seconds=1), reason="a limit", who="test")
    deadline = time.monotonic() + 20
    while (marker := window.get(GENERAL_SCOPE)) is not None and marker.closed():
        assert time.monotonic() < deadline, "the marker's lift never passed"
        time.sleep(0.05)


def admitted(window: Window) -> Admission | Wait:
    return admit(window, window.settings.host, "worker-1", lambda kind: None)


def probe_ms(window: Window, scope: str) -> int:
    """What is left of the scope's probe election, in ms (-2: no probe elected)."""
    return int(window.records.redis.pttl(keys.probe(scope)))


def test_a_probe_whose_session_lease_outlasts_the_old_formula_keeps_the_election(
    make_runtime: Callable[..., Any],
) -> None:
    old_formula_ms = (1 * 2 + 30) * 1000  # probe_grace 1
    window = make_runtime(
        DISPATCHQ_SESSION_LEASE="600", DISPATCHQ_PROBE_GRACE="1", DISPATCHQ_SESSION_CONCURRENCY="2"
    ).window
    waiting(window.records, "j1", "j2")
    lifted(window)
    probe = admitted(window)
    assert isinstance(probe, Admission) and probe.jid == "j1" and len(probe.probes) == 1
    (scope,) = probe.probes
    assert probe_ms(window, scope) > old_formula_ms  # elected for the session's lease
    hold = Holding(window, probe.jid, probe.slot, probe.probes, window.records.claim_of("j1"), bound=False)
    try:
        hold.renew_once()  # the holder's renewal, as its thread does while the session runs
        assert probe_ms(window, scope) > old_formula_ms
        second = admitted(window)
        assert isinstance(second, Wait) and "probe" in second.why  # no second probe starts
    finally:
        hold.window.records.disconnect()  # not `close`: that would free the probe


def test_a_dead_probe_holders_election_lapses_with_its_lease_and_never_stretches_anothers(
    make_runtime: Callable[..., Any],
) -> None:
    window = make_runtime(
        DISPATCHQ_SESSION_LEASE="2", DISPATCHQ_PROBE_GRACE="20", DISPATCHQ_SESSION_CONCURRENCY="3"
    ).window  # the old formula: 70 s
    waiting(window.records, "j1", "j2")
    lifted(window)
    dead = admitted(window)  # its holder never renews: it died right after admission
    assert isinstance(dead, Admission) and dead.jid == "j1"
    (scope,) = dead.probes
    assert isinstance(admitted(window), Wait)
    deadline = time.monotonic() + 20
    while probe_ms(window, scope) != -2:
        assert time.monotonic() < deadline, "the dead holder's probe never lapsed"
        time.sleep(0.05)
    second = admitted(window)
    assert isinstance(second, Admission) and second.jid == "j2" and second.probes == [scope]
    # The dead holder's late renewal does not stretch the new probe's election.
    assert window.store.renew_probe(scope, 600, holder=dead.slot) is False
    assert 0 < probe_ms(window, scope) <= 2000
