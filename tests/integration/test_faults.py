"""The fault suite: the formation's processes ride out Redis going away, and nothing is lost.

Each case runs real `dispatchq worker` / `dispatchq scheduler` processes against a
`redis-server` of its own (its own data dir and socket, never the session's shared one),
does something unkind to Redis, and asserts the three things an operator cares about:
no process of the formation exited, every acknowledged judgement is answered exactly once
(one `answered` step in its trail), and nothing is left stuck.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rq import Queue

from dispatchq.storage import keys
from dispatchq.storage.connection import EmbeddedRedis
from dispatchq.storage.store import Store
from dispatchq.testing.typesafe import FakeTypeSafeAPI
from tests.support.faults import Formation
from tests.support.helpers import (
    blocking_check,
    pid_alive,
    run_cli,
    wait_for,
    write_check_module,
    write_config,
)

pytestmark = pytest.mark.slow


def _kill_hard(server: EmbeddedRedis) -> None:
    pid = server.pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), timeout=10, what="redis-server to die")


def _doubling_kind(tmp_path: Path, delay: float = 0.05) -> Path:
    calls = tmp_path / "calls.txt"
    module = write_check_module(
        tmp_path,
        f"""
        import time

        def check(judgement):
            with open({str(calls)!r}, "a") as handle:
                handle.write(judgement.target + "\\n")
            time.sleep({delay})
            return judgement.state["n"] * 2
        """,
    )
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  double:\n    check: {module}:check\n")
    return calls


def _enqueue(env: dict[str, str], n: int) -> list[str]:
    lines = "\n".join(json.dumps({"kind": "double", "target": f"t{i}", "state": {"n": i}}) for i in range(n))
    done = run_cli(["enqueue", "-"], env, input=lines + "\n")
    assert done.returncode == 0, done.stderr
    return [line.split("\t")[1] for line in done.stdout.splitlines()]


def _answered_once(store: Store, ids: list[str]) -> None:
    records = store.get_many(ids)
    assert all(r is not None for r in records), "a record was lost"
    assert [r.status for r in records if r is not None] == ["answered"] * len(ids)
    for record in records:
        assert record is not None
        steps = [t.outcome for t in record.trail]
        assert steps.count("answered") == 1, f"{record.id} answered {steps.count('answered')} times: {steps}"


def test_a_worker_rides_out_a_hard_kill_of_the_embedded_redis(
    dq_env: dict[str, str], tmp_path: Path, fault_redis: EmbeddedRedis, formation: Formation
) -> None:
    env = {**dq_env, "DISPATCHQ_DATA_DIR": str(fault_redis.data_dir), "DISPATCHQ_BATCH_SIZE": "1"}
    _doubling_kind(tmp_path, delay=0.1)
    n = 30
    ids = _enqueue(env, n)
    time.sleep(1.5)  # appendfsync everysec: what was acknowledged a second ago is on disk
    worker = formation.start("code", ["worker", "code"], env)
    store = Store(fault_redis.client())
    formation.wait_for(lambda: store.count("answered") >= 3, 60, "the batch to be under way")

    _kill_hard(fault_redis)
    # The worker finds Redis gone, says so once, and restarts the embedded server itself.
    formation.wait_for(
        lambda: "Redis back after" in formation.output("code"), 60, "the worker to see Redis back"
    )
    store = Store(fault_redis.client())
    formation.wait_for(lambda: store.count("answered") == n, 90, "every judgement answered")

    assert worker.poll() is None, formation.output()
    log = formation.output("code", tail=None)
    assert log.count("Redis unreachable at") == 1
    _answered_once(store, ids)
    assert [r.value for r in store.get_many(ids) if r is not None] == [i * 2 for i in range(n)]
    assert formation.stop() == {"code": 0}  # a requested stop is the one clean exit


def test_a_worker_started_before_its_redis_waits_for_it(
    dq_env: dict[str, str], tmp_path: Path, fault_redis: EmbeddedRedis, formation: Formation
) -> None:
    # An external server (a URL): dispatchq must wait for it, never start it.
    url = fault_redis.url()
    env = {**dq_env, "DISPATCHQ_REDIS_URL": url}
    _doubling_kind(tmp_path)
    worker = formation.start("code", ["worker", "code"], env)
    formation.wait_for(lambda: "Redis unreachable at" in formation.output("code"), 30, "the worker to wait")
    time.sleep(1.0)
    assert worker.poll() is None, formation.output()

    fault_redis.ensure_running()
    ids = _enqueue(env, 5)
    store = Store(fault_redis.client())
    formation.wait_for(lambda: store.count("answered") == 5, 60, "the judgements answered")
    assert "Redis back after" in formation.output("code")
    _answered_once(store, ids)
    assert formation.stop() == {"code": 0}


def test_a_stop_request_while_waiting_for_redis_exits_0(
    dq_env: dict[str, str], tmp_path: Path, fault_redis: EmbeddedRedis, formation: Formation
) -> None:
    env = {**dq_env, "DISPATCHQ_REDIS_URL": fault_redis.url()}
    _doubling_kind(tmp_path)
    formation.start("typed", ["worker", "typed"], env)
    formation.start("scheduler", ["scheduler"], env)
    formation.wait_for(
        lambda: formation.output().count("Redis unreachable at") == 2, 30, "both processes to wait for Redis"
    )
    assert formation.stop() == {"typed": 0, "scheduler": 0}


def test_the_scheduler_and_a_typed_worker_ride_out_a_graceful_restart(
    dq_env: dict[str, str], tmp_path: Path, fault_redis: EmbeddedRedis, formation: Formation
) -> None:
    url = fault_redis.url()
    env = {**dq_env, "DISPATCHQ_REDIS_URL": url}
    fault_redis.ensure_running()
    _doubling_kind(tmp_path)
    formation.start("scheduler", ["scheduler"], env)
    formation.start("typed", ["worker", "typed"], env)
    client = fault_redis.client()
    formation.wait_for(
        lambda: client.exists("dispatchq:scheduler:heartbeat") == 1, 30, "the scheduler's beat"
    )

    fault_redis.stop()  # SHUTDOWN, AOF flushed
    formation.wait_for(
        lambda: formation.output().count("Redis unreachable at") >= 2, 60, "both to notice Redis gone"
    )
    fault_redis.ensure_running()
    formation.wait_for(lambda: formation.output().count("Redis back after") >= 2, 60, "both to see it back")
    client = fault_redis.client()
    client.delete("dispatchq:scheduler:heartbeat")
    formation.wait_for(
        lambda: client.exists("dispatchq:scheduler:heartbeat") == 1, 30, "the scheduler beating"
    )
    assert formation.exited() == {}, formation.output()
    assert formation.stop() == {"scheduler": 0, "typed": 0}


def _failed_in_rq(client: Any) -> list[str]:
    """Every job id in any of RQ's failed registries (what `rq info` counts as failures)."""
    return [jid for q in Queue.all(connection=client) for jid in q.failed_job_registry.get_job_ids()]


def _blocking_kind(tmp_path: Path) -> tuple[Path, Path]:
    """A kind whose first call blocks (its worker is killed there); every later call answers.

    Later calls take 0.5 s: the re-run outlives the dead execution's hash (RQ's phantom failure).
    """
    check, first, calls = blocking_check(tmp_path, answer='judgement.state["n"] * 2', then_sleep=0.5)
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  double:\n    check: {check}\n")
    return first, calls


def test_a_code_worker_killed_mid_job_leaves_no_phantom_failure(
    dq_env: dict[str, str], tmp_path: Path, fault_redis: EmbeddedRedis, formation: Formation
) -> None:
    """RQ re-runs the abandoned job; its success must not land in RQ's failed registry.

    RQ 3.0 keeps a dead execution in the job's execution registry 60 s after its hash
    expired, and with `result_ttl=0` the success path tripped over it (`ValueError:
    Execution … not found in Redis`), filing an answered job as failed once its one retry
    was spent.
    """
    env = {**dq_env, "DISPATCHQ_REDIS_URL": fault_redis.url(), "DISPATCHQ_JOB_RETRIES": "1"}
    fault_redis.ensure_running()
    first, calls = _blocking_kind(tmp_path)
    ids = _enqueue(env, 3)
    doomed = formation.start("code-1", ["worker", "code"], env)
    formation.wait_for(first.exists, 60, "the first job to start running")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=10)
    del formation.procs["code-1"]  # killed on purpose; a supervisor starts the next one
    formation.start("code-2", ["worker", "code"], env)

    store = Store(fault_redis.client())
    formation.wait_for(lambda: store.count("answered") == 3, 90, "every judgement answered")
    _answered_once(store, ids)
    assert [r.value for r in store.get_many(ids) if r is not None] == [0, 2, 4]
    assert [getattr(r, "deaths", 0) for r in store.get_many(ids)] == [1, 1, 1]  # one job, one death
    assert calls.read_text().splitlines()[0] == "t0"
    # RQ's bookkeeping of the re-run settles after the records do: wait for the worker to go idle.
    client = fault_redis.client()
    formation.wait_for(
        lambda: all(q.count == 0 and q.started_job_registry.count == 0 for q in Queue.all(connection=client)),
        30,
        "RQ's queues and started registries to empty",
    )
    assert _failed_in_rq(client) == [], formation.output()
    assert "not found in Redis" not in formation.output(tail=None)
    assert formation.exited() == {}, formation.output()


def _nothing_stuck(store: Store) -> None:
    """After recovery no record is left `queued` or `running` (every one reached an end)."""
    assert store.ids("queued") == [] and store.ids("running") == [], (
        store.ids("queued"),
        store.ids("running"),
    )


def test_a_typed_worker_killed_mid_job_loses_no_judgement(
    dq_env: dict[str, str],
    tmp_path: Path,
    fault_redis: EmbeddedRedis,
    formation: Formation,
    typesafe_api: FakeTypeSafeAPI,
) -> None:
    key = "ts-fault-typed-0123456789abcdef"
    typesafe_api.api_key = key
    typesafe_api.slow(60, times=1)  # the first request hangs: the worker is killed while it waits
    env = {
        **dq_env,
        "DISPATCHQ_REDIS_URL": fault_redis.url(),
        "TYPESAFE_API_KEY": key,
        "TYPESAFE_BASE_URL": typesafe_api.url,
    }
    fault_redis.ensure_running()
    write_config(
        tmp_path / "dispatchq.yaml",
        """
        kinds:
          asks:
            questions:
              yes: {type: noul, instructions: "Does this comment ask for a change?"}
            answer: yes
            escalate: needs-triage
        """,
    )
    lines = "\n".join(
        json.dumps({"kind": "asks", "target": f"t{i}", "state": {"body": f"b{i}"}}) for i in range(3)
    )
    done = run_cli(["enqueue", "-"], env, input=lines + "\n")
    assert done.returncode == 0, done.stderr
    ids = [line.split("\t")[1] for line in done.stdout.splitlines()]

    doomed = formation.start("typed-1", ["worker", "typed"], env)
    formation.wait_for(lambda: typesafe_api.request_count >= 1, 60, "the first request to the provider")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=10)
    del formation.procs["typed-1"]
    formation.start("typed-2", ["worker", "typed"], env)

    store = Store(fault_redis.client())
    formation.wait_for(lambda: store.count("answered") == 3, 90, "every judgement answered")
    _answered_once(store, ids)
    records = [r for r in store.get_many(ids) if r is not None]
    assert [r.tier for r in records] == ["typed"] * 3
    assert all(getattr(r, "deaths", 0) == 1 for r in records)
    _nothing_stuck(store)
    client = fault_redis.client()
    formation.wait_for(
        lambda: all(q.started_job_registry.count == 0 for q in Queue.all(connection=client)),
        30,
        "RQ to settle",
    )
    assert _failed_in_rq(client) == [], formation.output()
    assert formation.exited() == {}, formation.output()


@pytest.mark.parametrize("fsync", ["everysec", "always"])
def test_a_hard_kill_of_redis_mid_load_loses_nothing_acknowledged(
    fsync: str, dq_env: dict[str, str], tmp_path: Path, fault_redis: EmbeddedRedis, formation: Formation
) -> None:
    """`everysec` may lose the last second before the kill; `always` loses nothing acknowledged."""
    env = {
        **dq_env,
        "DISPATCHQ_DATA_DIR": str(fault_redis.data_dir),
        "DISPATCHQ_BATCH_SIZE": "1",
        "DISPATCHQ_APPENDFSYNC": fsync,
    }
    _doubling_kind(tmp_path, delay=0.05)
    early = _enqueue(env, 30)
    time.sleep(1.5)  # everysec: what was acknowledged over a second ago is on disk
    formation.start("code", ["worker", "code"], env)
    store = Store(fault_redis.client())
    formation.wait_for(lambda: store.count("answered") >= 3, 60, "the load to be under way")
    late = [
        line.split("\t")[1]
        for line in run_cli(
            ["enqueue", "-"],
            env,
            input="\n".join(
                json.dumps({"kind": "double", "target": f"late{i}", "state": {"n": i}}) for i in range(30)
            )
            + "\n",
        ).stdout.splitlines()
    ]
    assert len(late) == 30
    _kill_hard(fault_redis)  # at once: the late ones were acknowledged within the last second

    formation.wait_for(
        lambda: "Redis back after" in formation.output("code"), 60, "the worker to see Redis back"
    )
    store = Store(fault_redis.client())
    acknowledged = early + late if fsync == "always" else early
    survivors = [jid for jid, r in zip(late, store.get_many(late), strict=True) if r is not None]
    formation.wait_for(
        lambda: store.statuses(acknowledged + survivors) == ["answered"] * len(acknowledged + survivors),
        120,
        "every acknowledged (and surviving) judgement answered",
    )
    _answered_once(store, acknowledged + survivors)
    _nothing_stuck(store)
    assert formation.exited() == {}, formation.output()


def test_out_of_memory_refuses_in_one_line_and_heals_once_memory_is_raised(
    dq_env: dict[str, str], tmp_path: Path, fault_redis: EmbeddedRedis, formation: Formation
) -> None:
    env = {**dq_env, "DISPATCHQ_REDIS_URL": fault_redis.url(), "DISPATCHQ_BATCH_SIZE": "1"}
    fault_redis.ensure_running()
    _doubling_kind(tmp_path, delay=0.1)
    ids = _enqueue(env, 30)
    formation.start("code", ["worker", "code"], env)
    formation.start("scheduler", ["scheduler"], env)
    client = fault_redis.client()
    store = Store(client)
    formation.wait_for(lambda: store.count("answered") >= 3, 60, "the load to be under way")

    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", str(max(1, used // 2)))  # reached: every write is refused now
    refused = run_cli(
        ["enqueue", "-"], env, input=json.dumps({"kind": "double", "target": "x", "state": {"n": 1}}) + "\n"
    )
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    message = refused.stderr.strip()
    assert "Traceback" not in message
    assert len(message.splitlines()) == 1, message
    # The CLI prefixes "error: " and adds where a producer resumes (the cut-off enqueue).
    assert "Redis is out of memory (maxmemory " in message, message
    assert ", policy noeviction): nothing was written" in message, message
    assert refused.stdout == ""
    assert sorted(store.ids()) == sorted(ids)  # nothing was written
    formation.wait_for(
        lambda: "out of memory" in formation.output().lower() or "OOM" in formation.output(),
        30,
        "the workers to meet the limit",
    )

    client.config_set("maxmemory", "0")  # raised
    formation.wait_for(lambda: store.count("answered") == 30, 120, "every acknowledged judgement answered")
    _answered_once(store, ids)
    _nothing_stuck(store)
    assert formation.exited() == {}, formation.output()


def test_the_retrigger_fires_after_the_scheduler_was_killed_while_the_marker_was_up(
    dq_env: dict[str, str], tmp_path: Path, fault_redis: EmbeddedRedis, formation: Formation
) -> None:
    env = {**dq_env, "DISPATCHQ_REDIS_URL": fault_redis.url()}
    fault_redis.ensure_running()
    write_config(tmp_path / "dispatchq.yaml", "kinds: {}\n")
    client = fault_redis.client()
    doomed = formation.start("scheduler-1", ["scheduler"], env)
    formation.wait_for(lambda: client.exists(keys.SCHEDULER_HEARTBEAT) == 1, 30, "the scheduler's beat")
    closed = run_cli(["window", "close", "--until", "4s", "--reason", "fault suite"], env)
    assert closed.returncode == 0, closed.stderr
    marker = keys.marker("general")
    assert client.hget(marker, "state") == b"closed"

    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=10)
    del formation.procs["scheduler-1"]
    lifts_at = float(client.hget(marker, "lifts_at") or 0)
    wait_for(lambda: time.time() > lifts_at + 1, timeout=30, what="the lift instant to pass unattended")
    assert client.hget(marker, "state") == b"closed"  # nobody fired it while the scheduler was dead

    formation.start("scheduler-2", ["scheduler"], env)
    formation.wait_for(lambda: client.hget(marker, "state") == b"probing", 60, "the retrigger to fire late")
    assert formation.exited() == {}, formation.output()


def test_status_tells_the_truth_about_a_dead_worker_and_its_orphaned_judgements(
    dq_env: dict[str, str], tmp_path: Path, fault_redis: EmbeddedRedis, formation: Formation
) -> None:
    """A killed worker stops being counted within its heartbeat; its running judgements keep
    their status, are counted as orphaned, and say so (with when RQ will run them again)."""
    env = {**dq_env, "DISPATCHQ_REDIS_URL": fault_redis.url()}
    fault_redis.ensure_running()
    first, _calls = _blocking_kind(tmp_path)
    ids = _enqueue(env, 3)
    doomed = formation.start("code-1", ["worker", "code"], env)
    formation.wait_for(first.exists, 60, "the first job to start running")

    def status() -> dict[str, Any]:
        done = run_cli(["status", "--json"], env)
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    alive = status()
    assert alive["workers"]["code"] == 1 and alive["judgements_orphaned"] == 0
    assert [w["tier"] for w in alive["worker_details"]] == ["code"]
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=10)
    del formation.procs["code-1"]

    # Within heartbeat interval + grace (1 s + 3 s here) the dead worker is no longer counted.
    formation.wait_for(lambda: status()["workers"]["code"] == 0, 30, "the dead worker to drop out")
    assert status()["judgements_orphaned"] == 3
    done = run_cli(["scheduler", "--burst"], env)  # one maintenance round: reconciliation
    assert done.returncode == 0, done.stderr
    store = Store(fault_redis.client())
    records = store.get_many(ids)
    assert [r.status for r in records if r is not None] == ["running"] * 3
    assert all((r.reason or "").startswith("orphaned: its worker died, retried at") for r in records if r)

    formation.start("code-2", ["worker", "code"], env)
    formation.wait_for(lambda: store.count("answered") == 3, 90, "every judgement answered")
    _answered_once(store, ids)


# --- the session tier: a worker's death is counted, a shutdown is not ------------------------
FAKE_CLAUDE = Path(__file__).resolve().parents[1] / "support" / "fake_claude.py"
FAKE_ARGS = "-p --output-format stream-json --verbose"
SESSION_CONFIG = 'kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n'


def _session_env(env: dict[str, str], tmp_path: Path, *steps: dict[str, Any]) -> dict[str, str]:
    """The fake `claude` as the session command, driven by a plan of `steps` (then: answer)."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(list(steps)))
    write_config(tmp_path / "dispatchq.yaml", SESSION_CONFIG)
    return {
        **env,
        "DISPATCHQ_SESSION_COMMAND": f"{sys.executable} {FAKE_CLAUDE} {FAKE_ARGS}",
        "DISPATCHQ_TIMEZONE": "UTC",
        "FAKE_CLAUDE_SPAWN_LOG": str(tmp_path / "spawns.log"),
        "FAKE_CLAUDE_PLAN": str(plan),
    }


def _spawns(tmp_path: Path, scenario: str | None = None) -> int:
    log = tmp_path / "spawns.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(1 for line in lines if scenario is None or line.split()[1] == scenario)


def _enqueue_sessions(env: dict[str, str], targets: list[str]) -> list[str]:
    lines = "\n".join(json.dumps({"kind": "ask", "target": t}) for t in targets)
    done = run_cli(["enqueue", "-"], env, input=lines + "\n")
    assert done.returncode == 0, done.stderr
    return [line.split("\t")[1] for line in done.stdout.splitlines()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")
def test_a_session_worker_killed_again_and_again_on_one_judgement_fails_it_after_job_retries_deaths(
    dq_env: dict[str, str], tmp_path: Path, fault_redis: EmbeddedRedis, formation: Formation
) -> None:
    """Deaths are counted on the session judgement's record too: it cannot block the line forever."""
    retries = 2
    hang = {"match": "doomed", "scenario": "hang"}
    env = _session_env(
        {
            **dq_env,
            "DISPATCHQ_REDIS_URL": fault_redis.url(),
            "DISPATCHQ_JOB_RETRIES": str(retries),
        },
        tmp_path,
        *[hang] * (retries + 2),  # one more than it may take: a spawn after the failure would show
    )
    fault_redis.ensure_running()
    doomed, *others = _enqueue_sessions(env, ["doomed", "next-1", "next-2"])
    store = Store(fault_redis.client())
    for kill in range(1, retries + 2):
        worker = formation.start(f"session-{kill}", ["worker", "session"], env)
        formation.wait_for(
            lambda kill=kill: _spawns(tmp_path, "hang") >= kill, 90, f"spawn {kill} of the doomed session"
        )
        assert _spawns(tmp_path) == kill  # it went back to the front each time: nothing else ran
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        del formation.procs[f"session-{kill}"]  # killed on purpose; a supervisor starts the next one
    formation.start("session-last", ["worker", "session"], env)

    formation.wait_for(
        lambda: store.statuses(others) == ["answered"] * 2, 120, "the rest of the line answered"
    )
    record = store.get(doomed)
    assert record is not None
    assert record.status == "failed", (record.status, record.reason)
    assert getattr(record, "deaths", 0) == retries + 1
    assert record.reason == f"its worker died {retries + 1} times"
    assert record.trail[-1].outcome == "failed"
    assert _spawns(tmp_path, "hang") == retries + 1  # no spawn loop
    _answered_once(store, others)
    _nothing_stuck(store)
    assert formation.exited() == {}, formation.output()


def _halted_session(
    dq_env: dict[str, str], tmp_path: Path, own_redis: EmbeddedRedis, formation: Formation
) -> tuple[str, str, Store, Any, dict[str, Any], dict[str, str]]:
    """Two session judgements on `own_redis`; the first ("halted") hangs in a session worker.

    Returns (halted, after, store, the worker, what the hanging session recorded of itself
    (pid, pgid), the env)."""
    seen = tmp_path / "halted.json"
    env = _session_env(
        {**dq_env, "DISPATCHQ_REDIS_URL": own_redis.url()},
        tmp_path,
        {"match": "halted", "scenario": "hang", "record": str(seen)},
    )
    own_redis.ensure_running()
    halted, after = _enqueue_sessions(env, ["halted", "after"])
    store = Store(own_redis.client())
    worker = formation.start("session-1", ["worker", "session"], env)
    formation.wait_for(seen.exists, 90, "the session to start")
    return halted, after, store, worker, json.loads(seen.read_text()), env


def _requeued_uncharged_then_answered(
    store: Store,
    formation: Formation,
    env: dict[str, str],
    halted: str,
    after: str,
    statuses: tuple[str, ...],
) -> None:
    """`halted` went back to the front uncharged as "stopped by a shutdown"; a new worker answers both."""
    record = store.get(halted)
    assert record is not None
    assert record.status in statuses, (record.status, record.reason, record.trail)
    assert record.reason == "stopped by a shutdown"
    assert record.attempts == 0 and getattr(record, "deaths", 0) == 0  # uncharged
    assert record.trail[-1].outcome == "requeued" and record.trail[-1].why == "stopped by a shutdown"
    assert store.line_ids(keys.session_line())[0] == halted  # at the front, before `after`

    formation.start("session-2", ["worker", "session"], env)
    formation.wait_for(
        lambda: store.statuses([halted, after]) == ["answered"] * 2, 90, "a new worker to answer both"
    )
    _answered_once(store, [halted, after])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")
def test_sigterm_to_a_session_worker_and_its_sessions_group_requeues_it_uncharged(
    dq_env: dict[str, str], tmp_path: Path, fault_redis: EmbeddedRedis, formation: Formation
) -> None:
    """A unit stop with systemd's `KillMode=control-group` signals both: not the session's fault."""
    halted, after, store, worker, seen, env = _halted_session(dq_env, tmp_path, fault_redis, formation)
    pgid = seen["pgid"]

    worker.send_signal(signal.SIGTERM)
    os.killpg(pgid, signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, formation.output()  # a requested stop: the one clean exit
    del formation.procs["session-1"]
    _requeued_uncharged_then_answered(store, formation, env, halted, after, ("queued", "waiting"))
    record = store.get(halted)
    assert record is not None and record.attempts == 0
    assert not any("session failed" in step.why for step in record.trail), record.trail
    assert _spawns(tmp_path) == 3  # the halted one twice, the other once
    _nothing_stuck(store)
    assert formation.exited() == {}, formation.output()


#: A session command that kills its own process group when asked about "suicidal", and
#: otherwise hands the prompt to the fake `claude`: a session whose SIGTERM is its own doing.
SELF_TERM = """
import os, signal, subprocess, sys
prompt = sys.stdin.read()
if "suicidal" in prompt:
    with open(os.environ["SELF_TERM_LOG"], "a") as handle:
        handle.write(f"{os.getpid()}\\n")
    os.killpg(0, signal.SIGTERM)
    signal.pause()
done = subprocess.run([sys.executable, FAKE, *sys.argv[1:]], input=prompt, text=True)
sys.exit(done.returncode)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")
def test_a_session_that_sigterms_its_own_group_is_failed_after_job_retries_spawns(
    dq_env: dict[str, str], tmp_path: Path, fault_redis: EmbeddedRedis, formation: Formation
) -> None:
    """Exit status alone cannot tell a shutdown from the session's own SIGTERM: the worker,
    never asked to stop, counts it, so the judgement fails instead of requeueing forever."""
    retries = 2
    script = tmp_path / "self_term.py"
    script.write_text(SELF_TERM.replace("FAKE", repr(str(FAKE_CLAUDE))))
    env = _session_env(
        {
            **dq_env,
            "DISPATCHQ_REDIS_URL": fault_redis.url(),
            "DISPATCHQ_JOB_RETRIES": str(retries),
        },
        tmp_path,
    )
    env["DISPATCHQ_SESSION_COMMAND"] = f"{sys.executable} {script} {FAKE_ARGS}"
    env["SELF_TERM_LOG"] = str(tmp_path / "self_term.log")
    env["DISPATCHQ_SESSION_ALLOW_ENV"] += ",SELF_TERM_LOG"  # the session's own setting
    fault_redis.ensure_running()
    suicidal, after = _enqueue_sessions(env, ["suicidal", "after"])
    store = Store(fault_redis.client())
    formation.start("session", ["worker", "session"], env)

    formation.wait_for(
        lambda: store.statuses([suicidal, after]) == ["failed", "answered"], 120, "both settled"
    )
    record = store.get(suicidal)
    assert record is not None
    assert record.reason == f"stopped by a shutdown {retries + 1} times"
    assert int(getattr(record, "shutdowns", 0)) == retries + 1
    assert getattr(record, "deaths", 0) == 0
    assert record.trail[-1].outcome == "failed"
    spawned = (tmp_path / "self_term.log").read_text().splitlines()
    assert len(spawned) == retries + 1  # bounded: no spawn after the failure
    _answered_once(store, [after])
    _nothing_stuck(store)
    assert formation.exited() == {}, formation.output()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")
def test_a_second_sigterm_while_a_session_runs_requeues_it_uncharged(
    dq_env: dict[str, str], tmp_path: Path, fault_redis: EmbeddedRedis, formation: Formation
) -> None:
    """RQ's cold shutdown (a second signal) raises inside the session's job: a shutdown, not a death."""
    halted, after, store, worker, seen, env = _halted_session(dq_env, tmp_path, fault_redis, formation)
    session_pid = seen["pid"]

    worker.send_signal(signal.SIGTERM)  # warm: the session goes on
    time.sleep(1.5)  # RQ ignores a second signal within 1 s of the first
    assert pid_alive(session_pid)
    worker.send_signal(signal.SIGTERM)  # cold
    worker.wait(timeout=60)
    del formation.procs["session-1"]
    wait_for(lambda: not pid_alive(session_pid), timeout=30, what="the session to be taken down")
    _requeued_uncharged_then_answered(store, formation, env, halted, after, ("queued",))
    _nothing_stuck(store)
    assert formation.exited() == {}, formation.output()
