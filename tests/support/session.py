"""The session tier's harness: a real Redis, the fake `claude` and the CLI, shared by the
session, sandbox, look-around and real-client tests."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rq import Worker

from dispatchq.client import Client
from dispatchq.core.judgement import Record
from dispatchq.queue.dispatch import Moves
from dispatchq.queue.parts import QUEUE_PARTS
from dispatchq.runtime import Runtime
from dispatchq.settings import load_settings
from dispatchq.storage import keys
from dispatchq.window import marker
from dispatchq.window.limits import GENERAL_SCOPE
from tests.support.helpers import REPO, run_cli

__all__ = ["CONFIG", "FAKE", "FAKE_ARGS", "GATE", "NOBODY", "SESSION_COMMAND", "Harness", "iso_epoch"]


FAKE = REPO / "tests" / "support" / "fake_claude.py"


FAKE_ARGS = "-p --output-format stream-json --verbose"


# Through this interpreter, not the fake's shebang: a pyenv shim on PATH rewrites the environment.
SESSION_COMMAND = f"{sys.executable} {FAKE} {FAKE_ARGS}"


CONFIG = """
kinds:
  ask:
    session:
      prompt: "Answer {{ target }}"
  ranked:
    questions:
      urgency:
        type: score
        instructions: "How urgent is it?"
        criteria: [low, high]
    order: urgency
    session:
      prompt: "Answer {{ target }}"
  quiet:
    session:
      prompt: "Answer {{ target }}"
      args: ["--output-format", "json"]
  opus:
    session:
      prompt: "Answer {{ target }}"
      model: opus
  sonnet:
    session:
      prompt: "Answer {{ target }}"
      args: ["--model", "sonnet"]
"""


# A session command wrapper for probe tests: the first session it starts has its output held
# back until `<gate>/open` exists (so it shows nothing about the window until the test says so);
# every later session runs the fake untouched.
GATE = r"""
import os, subprocess, sys, time
gate, command = sys.argv[1], sys.argv[2:]
try:
    os.close(os.open(os.path.join(gate, "held"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
except FileExistsError:
    os.execv(command[0], command)
done = subprocess.run(command, input=sys.stdin.buffer.read(), stdout=subprocess.PIPE)
limit = time.monotonic() + 120
while not os.path.exists(os.path.join(gate, "open")) and time.monotonic() < limit:
    time.sleep(0.02)
sys.stdout.buffer.write(done.stdout)
sys.stdout.flush()
sys.exit(done.returncode)
"""


class Harness:
    """One test's dispatchq: its env, its processes, an in-process runtime on the same Redis."""

    def __init__(self, env: dict[str, str], tmp: Path, client: Any) -> None:
        self.tmp = tmp
        self.spawn_log = tmp / "spawns.log"
        self.plan_file = tmp / "plan.json"
        self.plan_file.write_text("[]")
        (tmp / "dispatchq.yaml").write_text(textwrap.dedent(CONFIG))
        self.env = dict(
            env,
            DISPATCHQ_SESSION_COMMAND=SESSION_COMMAND,
            DISPATCHQ_PROBE_GRACE="1",
            DISPATCHQ_TIMEZONE="UTC",
            FAKE_CLAUDE_SPAWN_LOG=str(self.spawn_log),
            FAKE_CLAUDE_PLAN=str(self.plan_file),
        )
        self.redis = client
        self.rt = Runtime(settings=load_settings(self.env), redis=client, queue_parts=QUEUE_PARTS)
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    # --- processes ---------------------------------------------------------------------------
    def start(self, *args: str, **env: str) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{args[0]}-{len(self.procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dispatchq.cli", *args],
                env={**self.env, **env},
                cwd=self.tmp,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append((proc, log))
        return proc

    def workers(self, count: int = 1, **env: str) -> list[subprocess.Popen[bytes]]:
        procs = [self.start("worker", "session", **env) for _ in range(count)]
        self.wait(lambda: self.session_workers() >= count, f"{count} session worker(s) to register")
        return procs

    def scheduler(self, *, wait: bool = True, **env: str) -> subprocess.Popen[bytes]:
        proc = self.start("scheduler", **env)
        if wait:
            self.wait(lambda: self.redis.exists(keys.SCHEDULER_HEARTBEAT), "the scheduler's heartbeat")
        return proc

    def session_workers(self) -> int:
        return sum(
            1
            for w in Worker.all(connection=self.redis)
            if any(name.startswith(keys.queue_name("session")) for name in w.queue_names())
        )

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.procs:
            self.stop(proc)

    def logs(self) -> str:
        parts = []
        for proc, log in self.procs:
            text = log.read_text(errors="replace") if log.exists() else ""
            parts.append(f"--- {log.name} (pid {proc.pid}, rc {proc.poll()}):\n{text[-3000:]}")
        return "\n".join(parts)

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                pytest.fail(f"timed out after {timeout:g}s waiting for {what}\n{self.logs()}")
            time.sleep(0.05)

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return run_cli(list(args), {**self.env, **env}, cwd=self.tmp)

    def status(self) -> dict[str, Any]:
        done = self.cli("status", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    # --- judgements ---------------------------------------------------------------------------
    def enqueue(self, kind: str, target: str) -> str:
        return Client(runtime=self.rt).enqueue(kind, target)

    def enqueue_ranked(self, target: str, priority: float) -> str:
        """A judgement the typed tier escalated with an `order` priority (as typed_tier commits it)."""
        jid = self.enqueue("ranked", target)
        assert self.rt.storage.records.claim([jid], "typed")
        moves = Moves()
        kind = self.rt.config.kind("ranked")
        moves.move_up(jid, kind, "typed", "ordered by the typed tier", host=None, priority=priority)
        self.rt.dispatcher.commit(moves)
        return jid

    def record(self, jid: str) -> Record:
        record = self.rt.storage.records.get(jid)
        assert record is not None, f"judgement {jid} has no record"
        return record

    def statuses(self, ids: list[str]) -> list[str | None]:
        return self.rt.storage.records.statuses(ids)

    def all_status(self, ids: list[str], status: str) -> bool:
        return all(s == status for s in self.statuses(ids))

    def line(self) -> list[str]:
        return self.rt.storage.records.line_ids(keys.session_line())

    def claimed_order(self, ids: list[str]) -> list[str]:
        stamps = {jid: float(self.redis.hget(keys.record(jid), "claimed") or 0) for jid in ids}
        return sorted(ids, key=lambda jid: stamps[jid])

    # --- the fake session -----------------------------------------------------------------------
    def plan(self, *steps: dict[str, Any]) -> None:
        self.plan_file.write_text(json.dumps(list(steps)))

    def spawns(self) -> int:
        return len(self.spawn_log.read_text().splitlines()) if self.spawn_log.exists() else 0

    def spawns_on(self, credential: str) -> int:
        """How many sessions were given `credential` (the fake logs the one it saw)."""
        lines = self.spawn_log.read_text().splitlines() if self.spawn_log.exists() else []
        return sum(1 for line in lines if line.split()[2:3] == [credential])

    def spawns_stay(self, count: int, period: float = 1.5) -> int:
        """Watch the spawn log for `period` seconds; return the count (the caller asserts it)."""
        deadline = time.monotonic() + period
        while time.monotonic() < deadline and self.spawns() <= count:
            time.sleep(0.05)
        return self.spawns()

    def gated_command(self) -> tuple[str, Path]:
        gate = self.tmp / "gate"
        gate.mkdir()
        script = self.tmp / "gate.py"
        script.write_text(GATE)
        return f"{sys.executable} {script} {gate} {SESSION_COMMAND}", gate

    # --- the marker -------------------------------------------------------------------------
    def close_for(self, seconds: float) -> float:
        """What `dispatchq window close --until 3s` does, without a CLI start-up eating the window."""
        until = datetime.now(UTC) + timedelta(seconds=seconds)
        return self.rt.window.close(until, reason=f"closed for {seconds:g}s", who="test").lifts_at

    def marker(self, scope: str = GENERAL_SCOPE) -> marker.Marker | None:
        return self.rt.window.get(scope)

    def marker_state(self, scope: str = GENERAL_SCOPE) -> str | None:
        value = self.redis.hget(keys.marker(scope), "state")
        return value.decode() if value else None

    def retriggers(self) -> list[tuple[str, float]]:
        """The rq-scheduler jobs for `jobs.tiers.retrigger`: (scope, instant)."""
        out = []
        for job, when in self.rt.scheduler.get_jobs(with_times=True):
            if job.func_name == "jobs.tiers.retrigger":
                at = when.replace(tzinfo=UTC) if when.tzinfo is None else when
                out.append((str(job.args[0]), at.timestamp()))
        return out

    def audit(self) -> list[dict[str, Any]]:
        return self.rt.window.audit_log(20)


def iso_epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# --- secrets: the scrub, and /proc/<pid>/environ ---------------------------------------------------
NOBODY = 65534
