"""The fault suite: the formation's processes ride out Redis going away, and nothing is lost.

Each case runs real `dispatchq worker` / `dispatchq scheduler` processes against a
`redis-server` of its own (its own data dir and socket, never the session's shared one),
does something unkind to Redis, and asserts the three things an operator cares about:
no process of the formation exited, every acknowledged judgement is answered exactly once
(one `answered` step in its trail), and nothing is left stuck.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatchq.storage.connection import EmbeddedRedis
from dispatchq.storage.store import Store
from tests.conftest import pid_alive, run_cli, wait_for, write_check_module, write_config

pytestmark = pytest.mark.slow


class Formation:
    """The long-running processes of one case; each must still be running at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dispatchq.cli", *argv], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.procs[name] = proc
        return proc

    def output(self, name: str | None = None, *, tail: int | None = 4000) -> str:
        names = [name] if name else sorted(self.procs)
        return "\n".join(
            f"--- {n}\n" + (self.logs / f"{n}.log").read_text(errors="replace")[-(tail or 0) :] for n in names
        )

    def exited(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def wait_for(self, predicate: Any, timeout: float, what: str) -> None:
        try:
            wait_for(predicate, timeout=timeout, what=what)
        except pytest.fail.Exception:
            pytest.fail(
                f"timed out after {timeout:g}s waiting for {what}; the formation said:\n{self.output()}"
            )

    def stop(self) -> dict[str, int]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = proc.wait()
        return codes


@pytest.fixture
def formation(tmp_path: Path) -> Iterator[Formation]:
    f = Formation(tmp_path)
    yield f
    f.stop()


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    """A redis-server of this case's own, with a short socket path under /tmp."""
    data = Path(tempfile.mkdtemp(prefix="dq-fault-"))
    server = EmbeddedRedis(data / "redis")
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        pid = server.pid()
        if pid is not None and pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(data, ignore_errors=True)


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
    dq_env: dict[str, str], tmp_path: Path, own_redis: EmbeddedRedis, formation: Formation
) -> None:
    env = {**dq_env, "DISPATCHQ_DATA_DIR": str(own_redis.data_dir), "DISPATCHQ_BATCH_SIZE": "1"}
    _doubling_kind(tmp_path, delay=0.1)
    n = 30
    ids = _enqueue(env, n)
    time.sleep(1.5)  # appendfsync everysec: what was acknowledged a second ago is on disk
    worker = formation.start("code", ["worker", "code"], env)
    store = Store(own_redis.client())
    formation.wait_for(lambda: store.count("answered") >= 3, 60, "the batch to be under way")

    _kill_hard(own_redis)
    # The worker finds Redis gone, says so once, and restarts the embedded server itself.
    formation.wait_for(
        lambda: "Redis back after" in formation.output("code"), 60, "the worker to see Redis back"
    )
    store = Store(own_redis.client())
    formation.wait_for(lambda: store.count("answered") == n, 90, "every judgement answered")

    assert worker.poll() is None, formation.output()
    log = formation.output("code", tail=None)
    assert log.count("Redis unreachable at") == 1
    _answered_once(store, ids)
    assert [r.value for r in store.get_many(ids) if r is not None] == [i * 2 for i in range(n)]
    assert formation.stop() == {"code": 0}  # a requested stop is the one clean exit


def test_a_worker_started_before_its_redis_waits_for_it(
    dq_env: dict[str, str], tmp_path: Path, own_redis: EmbeddedRedis, formation: Formation
) -> None:
    # An external server (a URL): dispatchq must wait for it, never start it.
    url = f"unix://{own_redis.socket_path}"
    env = {**dq_env, "DISPATCHQ_REDIS_URL": url}
    _doubling_kind(tmp_path)
    worker = formation.start("code", ["worker", "code"], env)
    formation.wait_for(lambda: "Redis unreachable at" in formation.output("code"), 30, "the worker to wait")
    time.sleep(1.0)
    assert worker.poll() is None, formation.output()

    own_redis.ensure_running()
    ids = _enqueue(env, 5)
    store = Store(own_redis.client())
    formation.wait_for(lambda: store.count("answered") == 5, 60, "the judgements answered")
    assert "Redis back after" in formation.output("code")
    _answered_once(store, ids)
    assert formation.stop() == {"code": 0}


def test_a_stop_request_while_waiting_for_redis_exits_0(
    dq_env: dict[str, str], tmp_path: Path, own_redis: EmbeddedRedis, formation: Formation
) -> None:
    env = {**dq_env, "DISPATCHQ_REDIS_URL": f"unix://{own_redis.socket_path}"}
    _doubling_kind(tmp_path)
    formation.start("typed", ["worker", "typed"], env)
    formation.start("scheduler", ["scheduler"], env)
    formation.wait_for(
        lambda: formation.output().count("Redis unreachable at") == 2, 30, "both processes to wait for Redis"
    )
    assert formation.stop() == {"typed": 0, "scheduler": 0}


def test_the_scheduler_and_a_typed_worker_ride_out_a_graceful_restart(
    dq_env: dict[str, str], tmp_path: Path, own_redis: EmbeddedRedis, formation: Formation
) -> None:
    url = f"unix://{own_redis.socket_path}"
    env = {**dq_env, "DISPATCHQ_REDIS_URL": url}
    own_redis.ensure_running()
    _doubling_kind(tmp_path)
    formation.start("scheduler", ["scheduler"], env)
    formation.start("typed", ["worker", "typed"], env)
    client = own_redis.client()
    formation.wait_for(
        lambda: client.exists("dispatchq:scheduler:heartbeat") == 1, 30, "the scheduler's beat"
    )

    own_redis.stop()  # SHUTDOWN, AOF flushed
    formation.wait_for(
        lambda: formation.output().count("Redis unreachable at") >= 2, 60, "both to notice Redis gone"
    )
    own_redis.ensure_running()
    formation.wait_for(lambda: formation.output().count("Redis back after") >= 2, 60, "both to see it back")
    client = own_redis.client()
    client.delete("dispatchq:scheduler:heartbeat")
    formation.wait_for(
        lambda: client.exists("dispatchq:scheduler:heartbeat") == 1, 30, "the scheduler beating"
    )
    assert formation.exited() == {}, formation.output()
    assert formation.stop() == {"scheduler": 0, "typed": 0}
