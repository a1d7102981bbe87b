"""After a killed `dispatchq findings dispatch`, the next run: recovers the dead process's session
at once (its worker ran on this host and is gone), says which judgement held it, and prints none
of RQ's own lines about the abandoned job on the person's terminal.

The heartbeat grace is set far beyond the run's bounded wait, so only the at-once recovery can
finish it: RQ's own timing would leave the rerun waiting for ten minutes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest
from rq.registry import StartedJobRegistry

from dispatchq.queue.entrypoints import DispatchqQueue
from dispatchq.queue.liveness import session_holders
from dispatchq.storage import keys
from tests.support.gate import (
    GONE,
    REMOVE,
    REMOVE_EDIT,
    World,
    finding_block,
    fixer_count,
    fixer_step,
    start,
    until,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")

ROLES = {"docs/guide.md": "edit", "scripts/old-tool.sh": "ref"}
NEVER = {"wait_for": "/nonexistent/never", "wait_timeout": "600"}


WORLD_REPORT = finding_block("DOC-1", "Guide cites a removed script")


WORLD_ENV = {"DISPATCHQ_HEARTBEAT_GRACE": "600"}  # RQ alone would notice the dead job in ten minutes


def test_a_rerun_after_a_killed_dispatch_recovers_its_session_at_once_and_says_whose(world: World) -> None:
    world.decide("DOC-1", "A", REMOVE, plan=[GONE], roles=ROLES)
    world.steps(fixer_step("DOC-1", [], **NEVER))
    proc = start(world, "dispatch")
    until(lambda: fixer_count(world) == 1, "the fixer to start")
    proc.kill()
    proc.wait()
    world.steps(fixer_step("DOC-1", [REMOVE_EDIT]))
    done = world.cli("dispatch", timeout=240)  # text mode: exactly what the terminal shows
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal
    assert f"pid {proc.pid}): recovered now, back in line" in terminal
    assert "the fixer of reviews/report.md#DOC-1 (judgement " in terminal
    assert "AbandonedJobError" not in terminal and "FailedJobRegistry" not in terminal
    assert "fixed:\n    - DOC-1" in done.stdout
    assert fixer_count(world) == 2
    assert (world.line("DOC-1", "Decision") or "").endswith("; attempt 1: interrupted, unverified]")


def test_a_holder_is_dead_only_on_this_host_with_its_heartbeat_stopped_and_its_pid_gone(
    redis_client: Any,
) -> None:
    queue = DispatchqQueue("dispatchq-session-liveness-test", connection=redis_client)
    job = queue.create_job("jobs.tiers.session", args=("j1", "w1:slot"))
    job.worker_name = "w1"
    job.save()
    registry = StartedJobRegistry(queue.name, connection=redis_client)
    redis_client.zadd(registry.key, {f"{job.id}:exec1": time.time() + 600})
    gone = _dead_pid()

    def holder(*, host: str, beat: float) -> Any:
        redis_client.set(keys.worker_info("w1"), json.dumps({"host": "h1", "pid": gone, "heartbeat": beat}))
        (found,) = session_holders(redis_client, [queue], host=host, stale_after=3.0)
        return found

    assert holder(host="h1", beat=time.time() - 60).dead
    assert not holder(host="h1", beat=time.time()).dead  # still beating: another PID namespace, maybe
    assert not holder(host="h2", beat=time.time() - 60).dead  # another machine: its heartbeat decides
    found = holder(host="h1", beat=time.time() - 60)
    assert (found.jid, found.slot, found.worker) == ("j1", "w1:slot", "w1")


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid
