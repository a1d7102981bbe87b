"""The confinement a session runs in: bubblewrap, with an allow-list of what it may see.

A session reads text from outside and runs tools, so it is treated as hostile: it runs as
the worker's user, and without this it could read the store's socket and password, every
`*_FILE` secret, the operator's home, and every process of that user through `/proc`.
`DISPATCHQ_SESSION_SANDBOX=on` (the default) wraps each spawn in `bwrap` so that

- **the file system is an allow-list**: `/usr` and the `/bin`, `/sbin`, `/lib*` links or
  folders, `/etc` (minus `/etc/dispatchq` and every file the operator did not make
  world-readable, such as `/etc/shadow`), what name resolution needs, the session command's
  own installation, the interpreter the in-sandbox shim runs on, the working directory
  (read-write), a worktree's main `.git` (read-write, its hooks and config read-only), the
  judgement's own CLI config folder, and the paths a kind or the deployment names; anything
  added to the host later stays hidden because nothing else is mounted;
- **`/tmp` and `HOME` are private** (a tmpfs; `HOME=/tmp/home`, `TMPDIR=/tmp`);
- **it sees only its own processes** (a new pid namespace and a fresh `/proc`), no host IPC,
  and **no network** but its own loopback: the only way out is the egress proxy
  (`dispatchq.launcher.egress`), reached through one bound unix socket by the relay the shim
  runs on `127.0.0.1:EGRESS_PORT`, given to the CLI as `HTTPS_PROXY`/`HTTP_PROXY`.

Kill semantics. bwrap does not forward signals, and `--new-session` takes the sandbox out of
the launcher's process group, so the launcher's group signals cannot reach inside. The shim
(`SHIM`) is therefore the sandbox's pid 1 (`--as-pid-1`): it forwards SIGTERM/SIGINT/SIGHUP to
the session (so a SIGTERMed CLI saves its transcript and can be `--resume`d), reaps orphans,
and when it exits the kernel kills everything left in the namespace. The launcher's supervisor
learns the shim's host pid from `--info-fd` and forwards its own signals there; bwrap itself
runs in a process group of its own (a group SIGTERM must not kill it before the session has
saved), holds a parent-death signal towards the supervisor, and `--die-with-parent` takes the
shim with it, so a SIGKILLed worker still leaves nothing behind.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dispatchq.errors import SettingsError
from dispatchq.launcher.egress import EGRESS_PORT

__all__ = [
    "BWRAP_HINT",
    "INFO_FD_MARK",
    "SANDBOX_HOME",
    "SANDBOX_TMP",
    "SHIM",
    "Bind",
    "SandboxPlan",
    "hidden_etc",
    "installation_of",
    "nested_bwrap_problem",
    "parse_bind",
    "probe_problem",
    "sandbox_problem",
]

BWRAP_HINT = (
    "install bubblewrap (Debian/Ubuntu: sudo apt-get install -y bubblewrap; "
    "Fedora: sudo dnf install -y bubblewrap) on a host that allows user namespaces, "
    "or set DISPATCHQ_SESSION_SANDBOX=off to run sessions unconfined"
)
SANDBOX_TMP = "/tmp"  # noqa: S108 (a private tmpfs inside the sandbox, not the host's /tmp)
SANDBOX_HOME = "/tmp/home"  # noqa: S108
EGRESS_SOCKET = "/run/dispatchq/egress.sock"
#: Replaced by the supervisor with the number of the pipe it reads bwrap's `--info-fd` from.
INFO_FD_MARK = "@DISPATCHQ_INFO_FD@"

_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SECRET_ETC = ("/etc/dispatchq",)


# The sandbox's pid 1, run as `python -I -S -c SHIM PORT SOCKET EXE ARGV...`:
# - relays every connection to 127.0.0.1:PORT (the sandbox's own loopback) to the egress
#   proxy's unix socket, byte for byte, in threads;
# - forks the session with default signal dispositions and execs it;
# - forwards SIGTERM/SIGINT/SIGHUP to it, reaps every orphan (it is init here), and exits
#   with the session's status once the session has exited: the kernel then kills whatever
#   the session left in the namespace.
SHIM = r"""
import os, signal, socket, sys, threading
port, sock_path, exe, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def relay(conn):
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(sock_path)
    except OSError:
        conn.close(); up.close(); return
    t = threading.Thread(target=pump, args=(up, conn), daemon=True)
    t.start(); pump(conn, up); t.join(); conn.close(); up.close()
def listen():
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port)); srv.listen(64)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=relay, args=(conn,), daemon=True).start()
if port:
    threading.Thread(target=listen, daemon=True).start()
child = 0
def forward(signum, frame):
    if child:
        try:
            os.kill(child, signum)
        except OSError:
            pass
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, forward)
child = os.fork()
if child == 0:
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(s, signal.SIG_DFL)
    try:
        try:
            with open("/proc/self/environ", "rb") as f:
                env = dict(i.split(b"=", 1) for i in f.read().split(b"\0") if b"=" in i)
        except OSError:
            env = dict(os.environb)
        os.execve(exe, argv, env)
    except OSError as e:
        os.write(2, ("dispatchq-supervisor: cannot execute %s: %s\n" % (exe, e.strerror)).encode())
    os._exit(127)
status = 0
while True:
    try:
        pid, st = os.wait()
    except ChildProcessError:
        break
    except InterruptedError:
        continue
    if pid == child:
        status = st
        break
code = os.waitstatus_to_exitcode(status)
os._exit(128 - code if code < 0 else code)
"""


@dataclass(frozen=True)
class Bind:
    """One extra path a session sees, at the same place, read-only unless `writable`."""

    path: str
    writable: bool = False


def parse_bind(text: str, where: str) -> Bind:
    """`PATH`, `PATH:ro` or `PATH:rw` (absolute); SettingsError naming `where` otherwise."""
    raw = text.strip()
    path, writable = raw, False
    for suffix, rw in ((":rw", True), (":ro", False)):
        if raw.endswith(suffix):
            path, writable = raw[: -len(suffix)], rw
    if not path.startswith("/"):
        raise SettingsError(f"{where}: {raw!r} is not an absolute path (PATH, PATH:ro or PATH:rw)")
    path = os.path.normpath(path)
    if path in ("/", "//", "/proc", "/dev", "/tmp", "/run"):  # noqa: S108
        raise SettingsError(f"{where}: {raw!r} would undo the sandbox (name the folder a session needs)")
    return Bind(path, writable)


def installation_of(executable: str) -> tuple[Path, ...]:
    """The folders a command's installation lives in, so it runs inside with what it needs.

    An npm package (Claude Code: a `.bin` link into `node_modules`, its native binary a sibling
    package) is its outermost `node_modules`; a `PREFIX/bin/X` install is `PREFIX` (an
    interpreter needs its `lib/` beside `bin/`); anything else its own folder. Both the path
    as named and where its links lead count: a virtualenv's `bin/python` is a link into the
    base interpreter's prefix, and the venv itself holds the packages.
    """
    found: list[Path] = []
    for path in (Path(os.path.abspath(executable)), Path(os.path.realpath(executable))):
        parts = path.parts
        if "node_modules" in parts:
            home = Path(*parts[: parts.index("node_modules") + 1])
        elif path.parent.name == "bin":
            home = path.parent.parent
        else:
            home = path.parent
        if home not in found:
            found.append(home)
    return tuple(found)


@functools.lru_cache(maxsize=4)
def hidden_etc(root: str = "/etc") -> tuple[tuple[str, bool], ...]:
    """Everything under `/etc` a session must not read: (path, is_dir) pairs.

    `/etc/dispatchq`, and every file or folder there that is not world-readable: what the
    operator did not show every local user (`/etc/shadow`, ssh host keys, a service's
    credentials) a session does not see either, even when it runs as root.
    """
    hidden: list[tuple[str, bool]] = [(p, True) for p in _SECRET_ETC if os.path.isdir(p)]
    for top, dirs, files in os.walk(root):
        for name in list(dirs):
            path = os.path.join(top, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                dirs.remove(name)
            elif path in _SECRET_ETC or not (info.st_mode & stat.S_IROTH and info.st_mode & stat.S_IXOTH):
                hidden.append((path, True))
                dirs.remove(name)
        for name in files:
            path = os.path.join(top, name)
            with_info = os.lstat(path)
            if stat.S_ISREG(with_info.st_mode) and not with_info.st_mode & stat.S_IROTH:
                hidden.append((path, False))
    return tuple(sorted(set(hidden)))


def _resolver_binds() -> list[str]:
    """Targets outside `/etc` of the name-resolution files' links (systemd-resolved's stub)."""
    found = []
    for name in ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf"):
        real = os.path.realpath(name)
        if real != name and not real.startswith("/etc/") and os.path.exists(real):
            found.append(real)
    return found


def _git_binds(workdir: Path) -> list[str]:
    """A worktree's main `.git` folder (git writes objects and refs there): `[]` for a plain dir."""
    pointer = workdir / ".git"
    if not pointer.is_file():
        return []
    try:
        text = pointer.read_text(encoding="utf-8").strip()
    except OSError:
        return []
    if not text.startswith("gitdir:"):
        return []
    gitdir = Path(text.removeprefix("gitdir:").strip())
    if not gitdir.is_absolute():
        gitdir = (workdir / gitdir).resolve()
    # <main>/.git/worktrees/<name>: the main repository's .git is two levels up.
    main = gitdir.parent.parent if gitdir.parent.name == "worktrees" else gitdir
    return [str(main)] if main.is_dir() else []


@dataclass(frozen=True)
class SandboxPlan:
    """Everything one confined spawn needs, from which `command` builds the bwrap argv."""

    bwrap: str
    workdir: Path
    config_dir: Path | None = None
    installs: tuple[Path, ...] = ()
    binds: tuple[Bind, ...] = ()
    egress_socket: Path | None = None
    hide: tuple[str, ...] = ()  # secrets to mask wherever a bound folder would show them
    config_var: str = "CLAUDE_CONFIG_DIR"  # the backend's name for `config_dir` inside

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """The session's environment as it is inside: private HOME and TMPDIR, the proxy."""
        inside = {k: v for k, v in env.items() if k.upper() not in {"NO_PROXY", "ALL_PROXY"}}
        inside.update(HOME=SANDBOX_HOME, TMPDIR=SANDBOX_TMP)
        if self.egress_socket is not None:
            proxy = f"http://127.0.0.1:{EGRESS_PORT}"
            for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
                inside[name] = proxy
        if self.config_dir is not None:
            inside[self.config_var] = str(self.config_dir)
        return inside

    def command(self, executable: str, argv: Sequence[str], python: str) -> list[str]:
        """`bwrap ... -- python -I -S -c SHIM PORT SOCKET EXE ARGV...` for one spawn."""
        port = str(EGRESS_PORT) if self.egress_socket is not None else "0"
        shim = [python, "-I", "-S", "-c", SHIM, port, EGRESS_SOCKET, executable, *argv]
        return [self.bwrap, *self._options(python), "--", *shim]

    def _options(self, python: str) -> list[str]:
        opts = [
            "--die-with-parent",
            "--new-session",
            "--as-pid-1",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--info-fd",
            INFO_FD_MARK,
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for link in _ROOT_LINKS:
            opts += _root_entry(link)
        opts += ["--ro-bind", "/etc", "/etc"]
        for path, is_dir in hidden_etc():
            opts += ["--tmpfs", path] if is_dir else ["--ro-bind", "/dev/null", path]
        for real in _resolver_binds():
            opts += ["--ro-bind", real, real]
        opts += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", SANDBOX_TMP, "--dir", SANDBOX_HOME]
        for ro in _unique([*self.installs, *_interpreter_home(python)]):
            if not _is_system(str(ro)):
                opts += ["--ro-bind", str(ro), str(ro)]
        opts += self._writable()
        for bind in self.binds:
            if os.path.exists(bind.path):
                opts += ["--bind" if bind.writable else "--ro-bind", bind.path, bind.path]
        if self.egress_socket is not None:
            opts += ["--dir", "/run/dispatchq", "--ro-bind", str(self.egress_socket), EGRESS_SOCKET]
        roots = [opts[i + 2] for i, opt in enumerate(opts) if opt in ("--bind", "--ro-bind")]
        for path in self.hide:
            if os.path.exists(path) and any(_under(path, root) for root in roots):
                opts += ["--tmpfs", path] if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]
        return [*opts, "--chdir", str(self.workdir)]

    def _writable(self) -> list[str]:
        opts = ["--bind", str(self.workdir), str(self.workdir)]
        for git in _git_binds(self.workdir):
            opts += ["--bind", git, git]
            for fixed in ("hooks", "config"):
                if os.path.exists(os.path.join(git, fixed)):
                    opts += ["--ro-bind", os.path.join(git, fixed), os.path.join(git, fixed)]
        if self.config_dir is not None:
            opts += ["--bind", str(self.config_dir), str(self.config_dir)]
        return opts


def _is_system(path: str) -> bool:
    """`/`, or what the sandbox mounts anyway (`/usr`, `/bin`, `/lib*`, `/etc`): never bound again.

    A command in `/bin` would otherwise count `/` as its installation, and `/` bound read-only
    would show the whole host.
    """
    return path == "/" or any(_under(path, root) for root in ("/usr", "/etc", *_ROOT_LINKS))


def _under(path: str, root: str) -> bool:
    """Is `path` `root` or inside it (so that a mount of `root` would show it)?"""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _root_entry(path: str) -> list[str]:
    if os.path.islink(path):
        return ["--symlink", os.readlink(path), path]
    if os.path.isdir(path):
        return ["--ro-bind", path, path]
    return []


def _interpreter_home(python: str) -> tuple[Path, ...]:
    return installation_of(python)


def _unique(paths: Iterable[Path]) -> list[Path]:
    seen: list[Path] = []
    for path in paths:
        if path not in seen:
            seen.append(path)
    return seen


def sandbox_problem(path_var: str, python: str = sys.executable) -> str | None:
    """None when a confined spawn can start here, else why not (one line, for the host breaker).

    The check is a real sandbox of the same shape (namespaces, mounts, the shim as pid 1)
    running `true`: bwrap missing, user namespaces refused by the kernel or a container, or
    a mount this host cannot make all show here. It runs once per bwrap binary: a worker
    whose host got bubblewrap installed sees it at its next host probe, without a restart.
    """
    bwrap = shutil.which("bwrap", path=path_var)
    if bwrap is None:
        return "the session sandbox needs bubblewrap: bwrap not found on PATH"
    try:
        stamp = os.stat(bwrap).st_mtime_ns
    except OSError:
        stamp = 0
    return _sandbox_check(bwrap, stamp, path_var, python)


@functools.lru_cache(maxsize=8)
def _sandbox_check(bwrap: str, stamp: int, path_var: str, python: str) -> str | None:
    del stamp  # part of the cache key only
    true = shutil.which("true", path=path_var) or "/bin/true"
    return _run_inside(bwrap, [true], path_var, python, "the session sandbox cannot start")


@functools.lru_cache(maxsize=8)
def nested_bwrap_problem(path_var: str, python: str = sys.executable) -> str | None:
    """`bwrap --ro-bind / / true` run *inside* the session sandbox: None when it works.

    Claude Code's own scrub of its tool subprocesses is itself bubblewrap, started by the
    session, so whether it can work is a question about the inside of the sandbox (nested
    user namespaces), not about the host.
    """
    bwrap = shutil.which("bwrap", path=path_var)
    if bwrap is None:
        return "bwrap not found on PATH"
    bwrap = os.path.realpath(bwrap)  # a PATH folder of links may not be visible inside
    true = os.path.realpath(shutil.which("true", path=path_var) or "/bin/true")
    nested = [bwrap, "--ro-bind", "/", "/", true]
    return _run_inside(bwrap, nested, path_var, python, "bwrap --ro-bind / / true failed inside the sandbox")


def _run_inside(bwrap: str, argv: list[str], path_var: str, python: str, what: str) -> str | None:
    scratch = Path(tempfile.mkdtemp(prefix="dispatchq-sandbox-check-"))
    argv = SandboxPlan(bwrap=bwrap, workdir=scratch).command(argv[0], argv, os.path.realpath(python))
    at = argv.index(INFO_FD_MARK)
    del argv[at - 1 : at + 1]  # nobody reads the check's info
    try:
        return probe_problem(argv, path_var, what, timeout=30)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def probe_problem(argv: list[str], path_var: str, what: str, *, timeout: float) -> str | None:
    """Run a check command with only PATH set: None when it succeeds, else `what: <its last line>`."""
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={"PATH": path_var},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{what}: {error}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"{what}: {last[:200]}"
    return None
