"""Spawning one headless session safely: argv, and the child's lifetime.

Two promises live here (the third, that untrusted text stays data in the prompt, is kept
by `dispatchq.core.prompts`, which frames the prompt this module only writes to stdin):

1. **Nothing reaches a shell, nothing secret reaches argv.** The command is split as a shell
   splits words and executed without one; the prompt goes on stdin (argv is world-readable in
   `/proc/<pid>/cmdline`).
2. **The session never outlives its worker.** It runs in its own process group under a tiny
   supervisor (see `_SUPERVISOR`) that holds a parent-death signal, so a worker killed even
   with SIGKILL takes the whole session group with it, and a retried judgement never runs
   beside an orphan. On timeout the group gets SIGTERM, then SIGKILL after a grace; after any
   exit the group is swept with SIGKILL so no background process of the session survives it.

A missing executable is a result (`LaunchResult.missing_executable`), never an exception: the
caller parks the judgement as waiting, with that reason, and spends no retry.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dispatchq.errors import ConfigError, SettingsError, UserError
from dispatchq.launcher.egress import EgressProxy
from dispatchq.launcher.environment import NEVER_PASS
from dispatchq.launcher.sandbox import SandboxPlan, installation_of

__all__ = ["DEFAULT_SESSION_COMMAND", "LaunchResult", "build_argv", "launch"]

log = logging.getLogger(__name__)

DEFAULT_SESSION_COMMAND = "claude -p --output-format stream-json --verbose"

# --- argv -------------------------------------------------------------------------------
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def build_argv(command: str, *, extra_args: Sequence[str] = (), resume: str | None = None) -> list[str]:
    """The session's argv: the command split as a shell would, the kind's args, `--resume ID`.

    The session id comes from a session's own output, so it is checked to be a plain token
    (a value like `--dangerously-skip-permissions` must never become an option).
    """
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise SettingsError(f"session command {command!r} cannot be split into words: {exc}") from None
    if not argv:
        raise SettingsError("session command is empty")
    extra = list(extra_args)
    if not all(isinstance(arg, str) for arg in extra):
        raise ConfigError("session args must be a list of strings")
    argv += extra
    if resume is not None:
        if not _SESSION_ID.match(resume):
            raise UserError(f"session id {resume!r} is not a plain token; refusing to --resume it")
        argv += ["--resume", resume]
    return argv


# --- launching --------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchResult:
    """What one spawn did. `stdout` is the session's whole output, for `limits.read_outcome`."""

    argv: tuple[str, ...]
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    session_id: str | None = None
    timed_out: bool = False
    cancelled: bool = False
    missing_executable: str | None = None
    pid: int | None = None
    cwd: str | None = None
    output_truncated: bool = False
    callback_errors: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return (
            self.missing_executable is None
            and not self.timed_out
            and not self.cancelled
            and self.returncode == 0
        )


# The supervisor is the session's group leader. It runs as `python -I -S -c`, so nothing in
# the cwd (a repository checkout) or the environment can change what it imports. It:
# - asks for SIGUSR1 when its parent thread dies (PR_SET_PDEATHSIG) and answers it by
#   SIGKILLing its whole process group, itself included: the session and anything the session
#   started die with the worker;
# - re-checks its parent after arming, closing the race where the worker died before prctl;
# - forks the session with PR_SET_PDEATHSIG=SIGKILL towards itself, so even a SIGKILLed
#   supervisor cannot leave the session behind;
# - execs the session with the environment it was itself started with, read back from
#   /proc/self/environ (Python may add LC_CTYPE to its own copy when coercing a C locale);
# - gives the session default signal dispositions (Python ignores SIGPIPE and SIGXFSZ, and an
#   ignored signal stays ignored across exec: `yes | head` in a tool would misbehave);
# - forwards SIGTERM/SIGINT/SIGHUP to the session, and exits with the session's status
#   (128+N when the session died of signal N), or 127 when it cannot exec it.
_SUPERVISOR = r"""
import ctypes, json, os, signal, sys
PR_SET_PDEATHSIG = 1
libc = ctypes.CDLL(None, use_errno=True)
parent, mode, exe, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
sandboxed = mode == "sandbox"
try:
    with open("/proc/self/environ", "rb") as f:
        env = dict(i.split(b"=", 1) for i in f.read().split(b"\0") if b"=" in i)
except OSError:
    env = dict(os.environb)
child = 0
inner = 0
def parent_died(signum, frame):
    if child:
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    os.killpg(0, signal.SIGKILL)
def forward(signum, frame):
    target = inner or child
    if target:
        try:
            os.kill(target, signum)
        except OSError:
            pass
signal.signal(signal.SIGUSR1, parent_died)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, forward)
if libc.prctl(PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0) != 0 or os.getppid() != parent:
    os._exit(125)
info_r = info_w = -1
if sandboxed:
    info_r, info_w = os.pipe()
    os.set_inheritable(info_w, True)
    argv = [str(info_w) if a == "@DISPATCHQ_INFO_FD@" else a for a in argv]
me = os.getpid()
child = os.fork()
if child == 0:
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != me:
        os._exit(125)
    if sandboxed:
        os.close(info_r)
        os.setpgid(0, 0)
    for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(s, signal.SIG_DFL)
    try:
        os.execve(exe, argv, env)
    except OSError as e:
        os.write(2, ("dispatchq-supervisor: cannot execute %s: %s\n" % (exe, e.strerror)).encode())
    os._exit(127)
if sandboxed:
    os.close(info_w)
    raw = b""
    while True:
        chunk = os.read(info_r, 4096)
        if not chunk:
            break
        raw += chunk
        try:
            inner = int(json.loads(raw)["child-pid"])
            break
        except (ValueError, KeyError, TypeError):
            continue
    os.close(info_r)
while True:
    pid, status = os.waitpid(child, 0)
    if pid == child:
        break
code = os.waitstatus_to_exitcode(status)
os._exit(128 - code if code < 0 else code)
"""
_EXEC_FAILED_MARK = "dispatchq-supervisor: cannot execute"
_USE_SUPERVISOR = sys.platform.startswith("linux")
_DRAIN_AFTER_EXIT = 2.0  # seconds to collect output still in the pipes once the group is gone
_POLL = 0.05  # only where pidfd is unavailable, or to notice `cancel`


def _resolve_executable(name: str, env: Mapping[str, str], cwd: Path) -> str | None:
    if "/" in name:
        path = Path(name) if os.path.isabs(name) else cwd / name
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(name, path=env.get("PATH", os.defpath))


def _missing_reason(name: str) -> str:
    if "/" in name:
        return f"{name} not found or not executable"
    return f"{name} not found on PATH"


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _exited_unreaped(pid: int) -> bool:
    """True once the process has exited, without reaping it: its pid (= the group id) stays
    reserved, so a later killpg cannot hit an unrelated group that reused the number."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
    except ChildProcessError:
        return True
    return info is not None


class _Lines:
    """Splits a byte stream into lines, keeping at most `limit` bytes of text."""

    def __init__(self, limit: int) -> None:
        self.pending = b""
        self.kept: list[str] = []
        self.size = 0
        self.limit = limit
        self.truncated = False

    def feed(self, data: bytes) -> list[str]:
        self.pending += data
        *complete, self.pending = self.pending.split(b"\n")
        return [self._keep(raw + b"\n") for raw in complete]

    def close(self) -> list[str]:
        if not self.pending:
            return []
        raw, self.pending = self.pending, b""
        return [self._keep(raw)]

    def _keep(self, raw: bytes) -> str:
        text = raw.decode("utf-8", errors="replace")
        if self.size + len(raw) <= self.limit:
            self.kept.append(text)
            self.size += len(raw)
        else:
            self.truncated = True
        return text

    def text(self) -> str:
        return "".join(self.kept)


def launch(
    argv: Sequence[str],
    prompt: str,
    *,
    cwd: Path | None,
    env: Mapping[str, str],
    timeout: float,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    cancel: threading.Event | None = None,
    kill_grace: float = 10.0,
    max_output: int = 64 * 1024 * 1024,
    sandbox: SandboxPlan | None = None,
    egress: frozenset[tuple[str, int]] = frozenset(),
) -> LaunchResult:
    """Run one session to completion (or timeout / cancel) and return what it printed.

    - `prompt` is written to stdin, never argv; no shell is involved.
    - `cwd` is the judgement's checkout; None means a fresh empty temp dir, removed after.
    - `env` is used exactly as given: build it with `environment.session_environment`.
    - `on_event(event)` is called in *this* thread for every stream-json object as its line
      arrives, so the caller learns the session id early and sees a rejected
      `rate_limit_event` (or any sign of an open window) while the session runs. An exception
      it raises is logged and recorded in `callback_errors`; the session goes on. It must not
      block: while it runs, stdout is not drained and the timeout is not enforced (the session
      tier hands its record writes to a writer thread of its own, `tiers.lease.Holding`).
    - `timeout` (seconds, from spawn) or a set `cancel` event: SIGTERM to the group, SIGKILL
      after `kill_grace`.

    Thread safety of the parent-death signal: PR_SET_PDEATHSIG fires when the *thread* that
    forked the child ends, not the process. The fork happens here, in the calling thread,
    and this function does not return (even on an exception, see the `finally`) until the
    session's group leader has exited, so that thread always outlives the session.

    `sandbox` confines the session (`dispatchq.launcher.sandbox`): the plan's working
    directory becomes `cwd`, the command's installation is added to what it sees, and
    `egress` (host, port) pairs are all its proxy lets it reach; None runs it unconfined.
    """
    argv = [str(a) for a in argv]
    if not argv:
        raise ValueError("launch needs a non-empty argv")
    leaked = sorted(name for name in env if name.upper() in NEVER_PASS)
    if leaked:
        raise ValueError(f"refusing to start a session with {', '.join(leaked)} in its environment")

    if cwd is not None and not Path(cwd).is_dir():
        raise UserError(f"session working directory {str(cwd)!r} is not a directory")
    own_dir = cwd is None
    workdir = Path(tempfile.mkdtemp(prefix="dispatchq-session-")) if cwd is None else Path(cwd)
    try:
        executable = _resolve_executable(argv[0], env, workdir)
        if executable is None:
            return LaunchResult(
                argv=tuple(argv), missing_executable=_missing_reason(argv[0]), cwd=str(workdir)
            )
        limits = (timeout, on_event, cancel, kill_grace, max_output)
        if sandbox is None:
            return _run(argv, _supervised_command(argv, executable), prompt, workdir, env, *limits)
        with EgressProxy(egress) as proxy:
            plan = replace(
                sandbox,
                workdir=workdir,
                installs=(*sandbox.installs, *installation_of(executable)),
                egress_socket=proxy.path,
            )
            command = plan.command(executable, argv, os.path.realpath(sys.executable))
            supervised = _supervised_command(command, command[0], sandboxed=True)
            return _run(argv, supervised, prompt, workdir, plan.environment(env), *limits)
    finally:
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)


def _supervised_command(argv: list[str], executable: str, *, sandboxed: bool = False) -> list[str]:
    """What is actually exec'd: the session under `_SUPERVISOR`, which holds the parent-death signal.

    Sandboxed, `argv` is bwrap's (`SandboxPlan.command`): the supervisor then reads the shim's
    pid from `--info-fd` and forwards its signals there (see `dispatchq.launcher.sandbox`).
    """
    if _USE_SUPERVISOR:
        mode = "sandbox" if sandboxed else "plain"
        return [sys.executable, "-I", "-S", "-c", _SUPERVISOR, str(os.getpid()), mode, executable, *argv]
    # No parent-death signal outside Linux: the group and the timeout still apply.
    return [executable, *argv[1:]]


def _run(
    argv: list[str],
    command: list[str],
    prompt: str,
    workdir: Path,
    env: Mapping[str, str],
    timeout: float,
    on_event: Callable[[dict[str, Any]], None] | None,
    cancel: threading.Event | None,
    kill_grace: float,
    max_output: int,
) -> LaunchResult:
    """Start the session in its own group, pump its pipes until it is gone, and say what it did.

    An executable that vanished between `_resolve_executable` and the spawn is the same
    result as one that was never there: `missing_executable`, not an exception.
    """
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=dict(env),
            start_new_session=True,
            close_fds=True,
        )
    except FileNotFoundError:
        return LaunchResult(argv=tuple(argv), missing_executable=_missing_reason(argv[0]), cwd=str(workdir))
    pump = _Pump(
        proc, prompt, timeout, on_event=on_event, cancel=cancel, kill_grace=kill_grace, max_output=max_output
    )
    pump.run()
    return pump.result(argv, workdir)


class _Pump:
    """One running session: its pipes, its deadlines, and what it has said so far.

    The launch is a single-threaded select loop (so `on_event` runs in the caller's thread,
    the one whose death the parent-death signal follows); this object is the state that loop
    carries from one wake-up to the next. Its lifetime rules, in order of a wake-up:

    - once the group leader has exited (seen through a pidfd, or polled without one or after
      a SIGTERM), the group is swept with SIGKILL and the pipes are drained for at most
      `_DRAIN_AFTER_EXIT` seconds, since a background process may still hold them open;
    - before that, the timeout and the `cancel` event each send SIGTERM once (whichever comes
      first names the ending), and SIGKILL follows `kill_grace` seconds later;
    - stdin is fed the prompt as the pipe takes it; stdout is split into lines, each JSON
      object handed to `on_event` as it arrives; stderr is only kept.
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        prompt: str,
        timeout: float,
        *,
        on_event: Callable[[dict[str, Any]], None] | None,
        cancel: threading.Event | None,
        kill_grace: float,
        max_output: int,
    ) -> None:
        self.proc = proc
        self.pgid = proc.pid
        self.on_event = on_event
        self.cancel = cancel
        self.kill_grace = kill_grace
        self.out, self.err = _Lines(max_output), _Lines(1024 * 1024)
        self.session_id: str | None = None
        self.callback_errors: list[str] = []
        self.timed_out = self.cancelled = self.exited = False
        self.term_at: float | None = None
        self.killed = False
        self.drain_until: float | None = None
        self.stdin_data = prompt.encode("utf-8")
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.stdin = proc.stdin
        self.fds = {"in": proc.stdin.fileno(), "out": proc.stdout.fileno(), "err": proc.stderr.fileno()}
        for fd in self.fds.values():
            os.set_blocking(fd, False)
        self.pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self.pidfd = os.pidfd_open(proc.pid)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.fds["out"], selectors.EVENT_READ, "out")
        self.sel.register(self.fds["err"], selectors.EVENT_READ, "err")
        if self.stdin_data:
            self.sel.register(self.fds["in"], selectors.EVENT_WRITE, "in")
        else:
            self.stdin.close()
        if self.pidfd is not None:
            self.sel.register(self.pidfd, selectors.EVENT_READ, "exit")
        self.open_streams = {"out", "err"}
        self.deadline = time.monotonic() + timeout

    def run(self) -> None:
        """Wake on pipe, exit or deadline until the session and its output are done.

        Whatever ends the loop (even an exception or KeyboardInterrupt in this thread), the
        group leader is reaped before this returns: see `launch` on the parent-death signal.
        """
        try:
            while True:
                now = time.monotonic()
                if self._finished(now):
                    break
                for key, _ in self.sel.select(max(0.0, self._wait(now))):
                    self._handle(key.data)
        finally:
            self._close()

    def _finished(self, now: float) -> bool:
        """Apply the lifetime rules for this wake-up; True once there is nothing left to wait for."""
        if not self.exited and (self.pidfd is None or self.term_at is not None):
            self.exited = _exited_unreaped(self.proc.pid)
        if not self.exited:
            self._enforce_deadlines(now)
            return False
        if self.drain_until is None:
            _killpg(self.pgid, signal.SIGKILL)  # sweep whatever the session left running
            self.drain_until = now + _DRAIN_AFTER_EXIT
        return not self.open_streams or now >= self.drain_until

    def _enforce_deadlines(self, now: float) -> None:
        """Timeout or cancel: SIGTERM once; SIGKILL when the group outlives the grace."""
        if now >= self.deadline and not self.cancelled:
            self.timed_out = True
            self._terminate()
        if self.cancel is not None and self.cancel.is_set() and not self.timed_out:
            self.cancelled = True
            self._terminate()
        if self.term_at is not None and not self.killed and now >= self.term_at + self.kill_grace:
            self.killed = True
            _killpg(self.pgid, signal.SIGKILL)

    def _terminate(self) -> None:
        if self.term_at is None:
            self.term_at = time.monotonic()
            _killpg(self.pgid, signal.SIGTERM)

    def _wait(self, now: float) -> float:
        """How long select may sleep: until the next deadline, or a short poll where nothing
        else would wake us (no pidfd, a `cancel` event to notice, a SIGTERM awaiting its exit)."""
        waits = [self.drain_until - now] if self.drain_until is not None else []
        if not self.exited:
            next_deadline = self.deadline if self.term_at is None else self.term_at + self.kill_grace
            waits.append(next_deadline - now)
            if self.pidfd is None or self.cancel is not None or self.term_at is not None:
                waits.append(_POLL)
        return min(waits)

    def _handle(self, what: str) -> None:
        if what == "exit":
            self.exited = _exited_unreaped(self.proc.pid)
            if self.exited and self.pidfd is not None:  # only a registered pidfd reports "exit"
                self.sel.unregister(self.pidfd)
        elif what == "in":
            self._feed_stdin()
        else:
            self._read(what)

    def _feed_stdin(self) -> None:
        """Write what the pipe takes of the prompt; close stdin once it is all written (EOF)."""
        try:
            written = os.write(self.fds["in"], self.stdin_data[:65536])
            self.stdin_data = self.stdin_data[written:]
        except BlockingIOError:
            return
        except OSError:  # the session closed stdin (or died): stop feeding it
            self.stdin_data = b""
        if not self.stdin_data:
            self.sel.unregister(self.fds["in"])
            self.stdin.close()

    def _read(self, what: str) -> None:
        lines = self.out if what == "out" else self.err
        try:
            data = os.read(self.fds[what], 65536)
        except BlockingIOError:
            return
        if data:
            fresh = lines.feed(data)
        else:
            self.sel.unregister(self.fds[what])
            self.open_streams.discard(what)
            fresh = lines.close()
        if what == "out":
            for line in fresh:
                self._dispatch(line)

    def _dispatch(self, line: str) -> None:
        """One stdout line: a JSON object goes to `on_event` (its first session id is kept)."""
        stripped = line.strip()
        if not stripped.startswith("{"):
            return
        try:
            event = json.loads(stripped)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if self.session_id is None and isinstance(event.get("session_id"), str) and event["session_id"]:
            self.session_id = event["session_id"]
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception as exc:  # the session must not be abandoned over a callback
                log.exception("on_event callback failed")
                self.callback_errors.append(f"{type(exc).__name__}: {exc}")

    def _close(self) -> None:
        if not self.exited:  # an exception (or KeyboardInterrupt) in this thread: leave nothing behind
            _killpg(self.pgid, signal.SIGKILL)
        self.sel.close()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]
        if self.pidfd is not None:
            os.close(self.pidfd)

    def result(self, argv: list[str], workdir: Path) -> LaunchResult:
        """The finished run; a trailing line without a newline is read (and dispatched) here."""
        for line in self.out.close():
            self._dispatch(line)
        self.err.close()
        stderr = self.err.text()
        exec_failed = self.proc.returncode == 127 and _EXEC_FAILED_MARK in stderr
        return LaunchResult(
            argv=tuple(argv),
            returncode=self.proc.returncode,
            stdout=self.out.text(),
            stderr=stderr,
            session_id=self.session_id,
            timed_out=self.timed_out,
            cancelled=self.cancelled,
            missing_executable=_missing_reason(argv[0]) if exec_failed else None,
            pid=self.proc.pid,
            cwd=str(workdir),
            output_truncated=self.out.truncated,
            callback_errors=tuple(self.callback_errors),
        )
