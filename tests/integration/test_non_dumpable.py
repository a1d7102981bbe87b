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
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dispatchq.core.tiers import TIERS
from dispatchq.storage.connection import EmbeddedRedis
from tests.support.gate import finding_block

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux")

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
CANARY = "canary-" + os.urandom(4).hex()


def _as_target() -> tuple[list[str], int]:
    """The argv prefix that runs a target as another uid, and that uid."""
    if os.geteuid() != 0:
        return [], os.geteuid()
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run the targets as another uid than root")
    caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *caps], NOBODY


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


@dataclass
class World:
    root: Path
    env: dict[str, str]
    prefix: list[str]
    uid: int

    def start(self, args: list[str], name: str, **extra_env: str) -> subprocess.Popen[bytes]:
        log = (self.root / "logs" / f"{name}.log").open("wb")
        try:
            return subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "dispatchq.cli", *args],
                env={**self.env, **extra_env},
                cwd=self.root / "repo",
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()  # the child holds its own copy

    def log(self, name: str) -> str:
        return (self.root / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]


def _chown_tree(root: Path, uid: int) -> None:
    for directory, dirs, files in os.walk(root):
        for entry in [directory, *(os.path.join(directory, n) for n in dirs + files)]:
            os.lchown(entry, uid, uid)


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def world() -> Iterator[World]:
    prefix, uid = _as_target()
    root = Path(tempfile.mkdtemp(prefix="dq-nondump-"))
    root.chmod(0o755)
    (root / "logs").mkdir()
    (root / "home").mkdir()
    repo = root / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "guide.md").write_text("Run scripts/old-tool.sh first.\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "init")
    # A check that holds `dispatchq run` inside its drain, where the mark must already be.
    (root / "slowcheck.py").write_text("import time\n\ndef check(judgement):\n    time.sleep(600)\n")
    (root / "dispatchq.yaml").write_text("kinds:\n  slow:\n    check: slowcheck:check\n")
    (root / "judgements.jsonl").write_text(json.dumps({"kind": "slow", "target": "acme/app"}) + "\n")
    (root / "report.md").write_text("# Findings\n\n" + finding_block("F1", "A dead reference"))
    sleeper = root / "sleeping_session.py"
    sleeper.write_text("import time\ntime.sleep(600)\n")
    _chown_tree(root, uid)
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(root / "home"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(REPO),
        "DISPATCHQ_DATA_DIR": str(root / "data"),
        "DISPATCHQ_CONFIG": str(root / "dispatchq.yaml"),
        "DISPATCHQ_CHECKOUT_ROOTS": str(root),
        "DISPATCHQ_SESSION_SANDBOX": "off",
        "DISPATCHQ_SESSION_COMMAND": f"{sys.executable} {sleeper}",
        "CLAUDE_CODE_OAUTH_TOKEN": CANARY,
        "TYPESAFE_API_KEY": CANARY,
    }
    try:
        yield World(root, env, prefix, uid)
    finally:
        if (root / "data" / "redis.pid").exists():
            try:
                EmbeddedRedis(root / "data").stop()
            except Exception as error:  # teardown must not hide the test's own failure
                print(f"stopping the embedded server failed: {error}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_marked(world: World, proc: subprocess.Popen[bytes], name: str, deadline: float = 90.0) -> None:
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


def _check(world: World, args: list[str], name: str, **extra_env: str) -> None:
    proc = world.start(args, name, **extra_env)
    try:
        _wait_marked(world, proc, name)
    finally:
        _stop(proc)


@pytest.fixture
def silent_redis() -> Iterator[str]:
    """A TCP listener that never answers: a process talking to it waits right where it first
    needs the store, which for the findings commands comes after the point the mark must be."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"


def test_the_control_an_unmarked_process_reads_as_dumpable(world: World) -> None:
    # Without this the check below could pass on a kernel that hands /proc files to root anyway.
    proc = subprocess.Popen(
        [*world.prefix, sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        cwd=world.root,
        env=world.env,
    )
    try:
        owner = None
        for _ in range(500):
            owner = _owner(proc.pid) if _running_as(proc.pid, world.uid) else None
            if owner is not None:
                break
            time.sleep(0.02)
        assert owner == world.uid != 0
        # ...and a reader of the same uid and capability gets its environ: the hole the mark closes.
        done = subprocess.run(
            [*world.prefix, "cat", f"/proc/{proc.pid}/environ"], capture_output=True, cwd="/", timeout=60
        )
        assert CANARY.encode() in done.stdout, done.stderr
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdin is not None
        proc.stdin.close()


@pytest.mark.parametrize("tier", TIERS)
def test_every_worker_is_non_dumpable(world: World, tier: str) -> None:
    _check(world, ["worker", tier], f"worker-{tier}")


def test_the_scheduler_is_non_dumpable(world: World) -> None:
    _check(world, ["scheduler"], "scheduler")


def test_serve_is_non_dumpable(world: World) -> None:
    _check(world, ["serve", "--port", str(_free_port())], "serve")


def test_run_is_non_dumpable_while_it_answers(world: World) -> None:
    _check(world, ["run", str(world.root / "judgements.jsonl"), "--no-progress"], "run")


@pytest.mark.parametrize("command", ["run", "sweep", "dispatch"])
def test_every_findings_command_that_runs_sessions_is_non_dumpable(
    world: World, silent_redis: str, command: str
) -> None:
    args = ["findings", command, str(world.root / "report.md"), "--repo", str(world.root / "repo")]
    _check(world, args, f"findings-{command}", DISPATCHQ_REDIS_URL=silent_redis)


def test_a_marked_process_keeps_its_environ_from_a_same_uid_reader(world: World) -> None:
    """What the mark is for, end to end: a same-uid process (a session) reads nothing."""
    proc = world.start(["worker", "code"], "worker-read")
    try:
        _wait_marked(world, proc, "worker-read")
        # The reader runs exactly as the target does (same uid, same capability): the kernel
        # refuses a reader with fewer capabilities than its target whatever the flag says.
        done = subprocess.run(
            [*world.prefix, "cat", f"/proc/{proc.pid}/environ"], capture_output=True, cwd="/", timeout=60
        )
    finally:
        _stop(proc)
    assert CANARY.encode() not in done.stdout
    assert done.returncode != 0 and b"Permission denied" in done.stderr, done.stderr
