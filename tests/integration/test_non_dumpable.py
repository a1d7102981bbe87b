"""Every long-running dispatchq entry point marks itself non-dumpable (issue 20, "Other processes").

A session runs as the same user as the processes around it, and the kernel lets a process read
the `/proc/<pid>/environ` (and memory) of any dumpable process of its own uid: the TypeSafe key,
the GitHub token, the Redis password. So each entry point is started here for real and checked
from outside, while it runs.

How the flag is read from outside: the kernel hands every file under `/proc/<pid>/` (but the
directory itself) to root when the process is not dumpable, and to the process's own uid when
it is (`task_dump_owner`). So the target runs as a uid other than root (`nobody` when the tests
run as root, with CAP_DAC_READ_SEARCH so it can read the checkout and the interpreter wherever
they live; the test's own uid otherwise) and `stat("/proc/<pid>/environ").st_uid` flips from that
uid to 0 at the mark. A control process that never marks itself proves the reading can fail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dispatchq.core.tiers import TIERS
from tests.support.non_dumpable import (
    DUMPABLE_CANARY,
    DumpableWorld,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux")


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/environ").st_uid
    except FileNotFoundError:
        return None


def _running_as(pid: int, uid: int) -> bool:
    """The target itself runs, as `uid`, with its memory: only then does the owner tell.

    Not setpriv before its exec: setpriv is root at first, and non-dumpable between its
    setresuid and the exec (a change of uid clears the flag, the exec sets it again); `comm`
    changes only after the exec has reset the flag. And not a process on its way out: once
    its memory is gone (a main thread that has exited, a zombie) the kernel gives its /proc
    files to root as well; `VmSize` is listed only while the memory is there.
    """
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    lines = status.splitlines()
    real = next((line.split()[1] for line in lines if line.startswith("Uid:")), None)
    has_memory = any(line.startswith("VmSize:") for line in lines)
    return comm != "setpriv" and real == str(uid) and has_memory


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_marked(
    world: DumpableWorld, proc: subprocess.Popen[bytes], name: str, deadline: float = 90.0
) -> None:
    """Wait until the target's /proc files turn root-owned; fail if it exits or never does."""
    end = time.monotonic() + deadline
    seen: int | None = None
    while time.monotonic() < end:
        if proc.poll() is not None:
            pytest.fail(f"{name} exited ({proc.returncode}) still dumpable:\n{world.log(name)}")
        if _running_as(proc.pid, world.uid):
            seen = _owner(proc.pid)
            # Still running with its memory after the stat: the owner was read from a live mm.
            if seen == 0 and _running_as(proc.pid, world.uid):
                return
            assert seen in (world.uid, None), f"{name}: /proc/{proc.pid}/environ owned by {seen}"
        time.sleep(0.02)
    pytest.fail(f"{name} is still dumpable after {deadline:g}s (owner uid {seen}):\n{world.log(name)}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _check(world: DumpableWorld, args: list[str], name: str, **extra_env: str) -> None:
    proc = world.start(args, name, **extra_env)
    try:
        _wait_marked(world, proc, name)
    finally:
        _stop(proc)


def test_the_control_an_unmarked_process_reads_as_dumpable(dumpable_world: DumpableWorld) -> None:
    # Without this the check below could pass on a kernel that hands /proc files to root anyway.
    proc = subprocess.Popen(
        [*dumpable_world.prefix, sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        cwd=dumpable_world.root,
        env=dumpable_world.env,
    )
    try:
        owner = None
        for _ in range(500):
            owner = _owner(proc.pid) if _running_as(proc.pid, dumpable_world.uid) else None
            if owner is not None:
                break
            time.sleep(0.02)
        assert owner == dumpable_world.uid != 0
        # ...and a reader of the same uid and capability gets its environ: the hole the mark closes.
        done = subprocess.run(
            [*dumpable_world.prefix, "cat", f"/proc/{proc.pid}/environ"],
            capture_output=True,
            cwd="/",
            timeout=60,
        )
        assert DUMPABLE_CANARY.encode() in done.stdout, done.stderr
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdin is not None
        proc.stdin.close()


@pytest.mark.parametrize("tier", TIERS)
def test_every_worker_is_non_dumpable(dumpable_world: DumpableWorld, tier: str) -> None:
    _check(dumpable_world, ["worker", tier], f"worker-{tier}")


def test_the_scheduler_is_non_dumpable(dumpable_world: DumpableWorld) -> None:
    _check(dumpable_world, ["scheduler"], "scheduler")


def test_serve_is_non_dumpable(dumpable_world: DumpableWorld) -> None:
    _check(dumpable_world, ["serve", "--port", str(_free_port())], "serve")


def test_run_is_non_dumpable_while_it_answers(dumpable_world: DumpableWorld) -> None:
    _check(dumpable_world, ["run", str(dumpable_world.root / "judgements.jsonl"), "--no-progress"], "run")


@pytest.mark.parametrize("command", ["run", "sweep", "dispatch"])
def test_every_findings_command_that_runs_sessions_is_non_dumpable(
    dumpable_world: DumpableWorld, silent_redis: str, command: str
) -> None:
    args = [
        "findings",
        command,
        str(dumpable_world.root / "report.md"),
        "--repo",
        str(dumpable_world.root / "repo"),
    ]
    _check(dumpable_world, args, f"findings-{command}", DISPATCHQ_REDIS_URL=silent_redis)


def test_a_marked_process_keeps_its_environ_from_a_same_uid_reader(dumpable_world: DumpableWorld) -> None:
    """What the mark is for, end to end: a same-uid process (a session) reads nothing."""
    proc = dumpable_world.start(["worker", "code"], "worker-read")
    try:
        _wait_marked(dumpable_world, proc, "worker-read")
        # The reader runs exactly as the target does (same uid, same capability): the kernel
        # refuses a reader with fewer capabilities than its target whatever the flag says.
        done = subprocess.run(
            [*dumpable_world.prefix, "cat", f"/proc/{proc.pid}/environ"],
            capture_output=True,
            cwd="/",
            timeout=60,
        )
    finally:
        _stop(proc)
    assert DUMPABLE_CANARY.encode() not in done.stdout
    assert done.returncode != 0 and b"Permission denied" in done.stderr, done.stderr
