"""The session sandbox, tried from inside: what a confined spawn can see, reach and outlive.

Each test runs a real `bwrap` through `dispatchq.launcher.spawn.launch`, the way the session
tier does, with a small Python program as the session. Where bubblewrap cannot run here the
tests skip saying so; under `CI=true` they fail instead (ops/dev.py installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from dispatchq.errors import SettingsError
from dispatchq.launcher.egress import EgressProxy, allowed_destinations, parse_destination
from dispatchq.launcher.sandbox import SandboxPlan, hidden_etc, installation_of, parse_bind, sandbox_problem
from dispatchq.launcher.spawn import LaunchResult, launch

PATH = os.environ.get("PATH", os.defpath)
_WHY_NOT = sandbox_problem(PATH)
if _WHY_NOT is not None and os.environ.get("CI") == "true":
    raise RuntimeError(f"CI=true and the session sandbox cannot run here: {_WHY_NOT}")
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"SESSION SANDBOX TESTS SKIPPED: {_WHY_NOT}")


def plan_for(workdir: Path, **extra: Any) -> SandboxPlan:
    bwrap = shutil.which("bwrap", path=PATH)
    assert bwrap is not None
    return SandboxPlan(bwrap=bwrap, workdir=workdir, **extra)


def run_inside(
    tmp_path: Path, program: str, *, env: dict[str, str] | None = None, timeout: float = 60, **extra: Any
) -> tuple[LaunchResult, Any]:
    """Run `program` (Python) confined; it prints one JSON line, returned parsed."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    result = launch(
        [sys.executable, "-c", program],
        "",
        cwd=work,
        env={"PATH": PATH, **(env or {})},
        timeout=timeout,
        sandbox=plan_for(work, **extra),
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith(("{", "["))]
    return result, json.loads(lines[-1]) if lines else None


LOOK = r"""
import json, os
def can_read(path):
    try:
        with open(path, "rb") as f:
            f.read(1)
        return True
    except OSError:
        return False
print(json.dumps({
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "home": os.environ.get("HOME"), "tmpdir": os.environ.get("TMPDIR"),
    "tmp": sorted(os.listdir("/tmp")), "root": sorted(os.listdir("/")),
    "cwd": os.getcwd(),
    "read": {p: can_read(p) for p in json.loads(os.environ["PROBE_PATHS"])},
    "exists": {p: os.path.exists(p) for p in json.loads(os.environ["PROBE_PATHS"])},
}))
"""


def test_a_session_sees_its_own_processes_a_private_tmp_and_none_of_the_hidden_paths(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "redis.password").write_text("store-password")
    secret_dir = tmp_path / "work" / "nested"
    secret_dir.mkdir(parents=True)
    key_file = secret_dir / "typesafe.key"  # a *_FILE secret under a folder the session sees
    key_file.write_text("ts-key")
    marker = tmp_path / "host-only.txt"
    marker.write_text("not for the session")
    probes = [str(data / "redis.password"), str(key_file), str(marker), "/etc/shadow", str(Path.home())]
    result, seen = run_inside(
        tmp_path,
        LOOK,
        env={"PROBE_PATHS": json.dumps(probes)},
        hide=(str(data), str(key_file)),
    )
    assert result.returncode == 0, result.stderr
    assert len(seen["pids"]) <= 3, seen["pids"]  # the shim (pid 1) and the session
    assert seen["home"] == "/tmp/home" and seen["tmpdir"] == "/tmp"
    assert seen["cwd"] == str(tmp_path / "work")
    assert not any(seen["read"].values()), seen["read"]
    assert not seen["exists"][str(data / "redis.password")]
    assert not seen["exists"][str(marker)]
    assert "home" in seen["tmp"]


def test_an_unconfined_spawn_of_the_same_program_does_see_them(tmp_path: Path) -> None:
    """The probe above can fail: run plainly, the same program reads the same files."""
    marker = tmp_path / "host-only.txt"
    marker.write_text("visible")
    work = tmp_path / "work"
    work.mkdir()
    result = launch(
        [sys.executable, "-c", LOOK],
        "",
        cwd=work,
        env={"PATH": PATH, "PROBE_PATHS": json.dumps([str(marker)]), "HOME": str(tmp_path)},
        timeout=60,
    )
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["read"][str(marker)] is True
    assert len(seen["pids"]) > 3


def test_etc_files_the_operator_did_not_make_world_readable_are_hidden(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "svc").mkdir(parents=True)
    (etc / "open.conf").write_text("x")
    (etc / "svc" / "token").write_text("t")
    os.chmod(etc / "svc" / "token", 0o600)
    (etc / "private").mkdir()
    os.chmod(etc / "private", 0o700)
    hidden = dict(hidden_etc(str(etc)))
    assert hidden.get(str(etc / "svc" / "token")) is False
    assert hidden.get(str(etc / "private")) is True
    assert str(etc / "open.conf") not in hidden


def test_the_host_loopback_and_abstract_sockets_are_out_of_reach(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"dispatchq-test-{uuid.uuid4().hex}"
    abstract.bind("\0" + name)
    abstract.listen(1)
    program = rf"""
import json, socket
out = {{}}
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close(); out["tcp"] = True
except OSError as e:
    out["tcp"] = False
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect("\0{name}"); out["abstract"] = True
except OSError:
    out["abstract"] = False
print(json.dumps(out))
"""
    try:
        _, seen = run_inside(tmp_path, program)
        plain = launch([sys.executable, "-c", program], "", cwd=tmp_path, env={"PATH": PATH}, timeout=60)
    finally:
        listener.close()
        abstract.close()
    assert seen == {"tcp": False, "abstract": False}
    assert json.loads(plain.stdout.splitlines()[-1]) == {"tcp": True, "abstract": True}


def test_the_proxy_is_the_only_way_out_and_leads_only_to_the_api_host(
    tmp_path: Path, echo_server: int
) -> None:
    other = socket.create_server(("127.0.0.1", 0))
    other_port = other.getsockname()[1]
    program = rf"""
import json, os, urllib.request
out = {{}}
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except Exception as e:
        return "refused: " + type(e).__name__ + " " + str(getattr(e, "code", ""))
out["api"] = get("http://127.0.0.1:{echo_server}/v1/messages?beta=true")
out["other"] = get("http://127.0.0.1:{other_port}/")
out["proxy"] = os.environ.get("HTTP_PROXY")
print(json.dumps(out))
"""
    env = {"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{echo_server}"}
    work = tmp_path / "work"
    work.mkdir()
    try:
        result = launch(
            [sys.executable, "-c", program],
            "",
            cwd=work,
            env={"PATH": PATH, **env},
            timeout=60,
            sandbox=plan_for(work),
            egress=allowed_destinations(env),
        )
    finally:
        other.close()
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["api"] == {"path": "/v1/messages?beta=true", "connection": "close"}
    assert seen["other"].startswith("refused: HTTPError 403"), seen
    assert seen["proxy"] == "http://127.0.0.1:3128"


def test_connect_is_refused_for_any_destination_but_the_allowed_ones(echo_server: int) -> None:
    with EgressProxy(frozenset({("127.0.0.1", echo_server)})) as proxy:
        answers = {}
        for target in (f"127.0.0.1:{echo_server}", "127.0.0.1:6379", "example.invalid:443"):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(str(proxy.path))
            conn.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            answers[target] = conn.recv(100).split(b"\r\n")[0].decode()
            conn.close()
    assert answers[f"127.0.0.1:{echo_server}"] == "HTTP/1.1 200 Connection Established"
    assert answers["127.0.0.1:6379"] == "HTTP/1.1 403 Forbidden"
    assert answers["example.invalid:443"] == "HTTP/1.1 403 Forbidden"


def test_destinations_and_binds_are_parsed_strictly() -> None:
    assert allowed_destinations({}) == frozenset({("api.anthropic.com", 443)})
    assert allowed_destinations(
        {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9/x"}, ["Gw.Example:8443"]
    ) == frozenset({("127.0.0.1", 9), ("gw.example", 8443)})
    with pytest.raises(ValueError, match="not host:port"):
        parse_destination("gw.example")
    assert parse_bind("/srv/data:rw", "X").writable
    assert not parse_bind("/opt/tool", "X").writable
    with pytest.raises(SettingsError, match="X: 'relative' is not an absolute path"):
        parse_bind("relative", "X")


def test_the_installation_of_a_venv_python_is_the_venv_and_the_base_prefix() -> None:
    homes = installation_of(sys.executable)
    assert Path(sys.prefix) in homes or Path(sys.base_prefix) in homes
    assert all(path.is_dir() for path in homes)


TRAP = r"""
import signal, subprocess, sys, time
subprocess.Popen(["sleep", sys.argv[1]], start_new_session=True)
def term(*_):
    open("got-term", "w").write("saved"); raise SystemExit(3)
signal.signal(signal.SIGTERM, term)
print('{"type":"system","session_id":"s1"}', flush=True)
time.sleep(120)
"""


def _running(pattern: str) -> list[str]:
    done = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return done.stdout.split()


def test_a_timeout_reaches_the_session_with_sigterm_and_ends_everything_inside(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    token = f"1000.{uuid.uuid4().int % 10**8}"
    result = launch(
        [sys.executable, "-c", TRAP, token],
        "",
        cwd=work,
        env={"PATH": PATH},
        timeout=3,
        kill_grace=20,
        sandbox=plan_for(work),
    )
    assert result.timed_out and result.returncode == 3, result
    assert (work / "got-term").read_text() == "saved"  # graceful: a CLI saves its transcript here
    assert _running(f"sleep {token}") == []  # its background process (own session) is gone too


def test_a_sigkilled_worker_leaves_nothing_of_its_confined_session_behind(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    token = f"1000.{uuid.uuid4().int % 10**8}"
    driver = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from pathlib import Path
from dispatchq.launcher.sandbox import SandboxPlan
from dispatchq.launcher.spawn import launch
work = Path({str(work)!r})
launch([sys.executable, "-c", {TRAP!r}, {token!r}], "", cwd=work, env={{"PATH": {PATH!r}}}, timeout=300,
       sandbox=SandboxPlan(bwrap={shutil.which("bwrap")!r}, workdir=work))
"""
    worker = subprocess.Popen(
        [sys.executable, "-c", driver], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while not _running(f"sleep {token}"):
            assert time.monotonic() < deadline, "the confined session never started"
            time.sleep(0.1)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _running(f"sleep {token}") or _running(token):
            assert time.monotonic() < deadline, f"left behind: {_running(token)}"
            time.sleep(0.1)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert not (work / "got-term").exists()  # SIGKILL gives nobody a chance: nothing ran after it


# --- through a real session worker ---------------------------------------------------------------
def _path_without_bwrap(tmp: Path) -> str:
    from tests.support.real_client import path_without_bwrap

    return path_without_bwrap(tmp, PATH)


def test_a_host_that_cannot_start_the_sandbox_is_blocked_and_spawns_nothing(sandbox_harness: Any) -> None:
    from dispatchq.storage import keys

    jid = sandbox_harness.enqueue("ask", "confined or not at all")
    done = sandbox_harness.cli(
        "worker",
        "session",
        "--burst",
        DISPATCHQ_SESSION_SANDBOX="on",
        PATH=_path_without_bwrap(sandbox_harness.tmp),
    )
    assert done.returncode == 0, done.stderr
    assert "sessions cannot start on this host: the session sandbox needs bubblewrap" in done.stderr
    assert "DISPATCHQ_SESSION_SANDBOX=off" in done.stderr  # the hint names the way out
    assert int(sandbox_harness.redis.get(keys.STATS_SESSIONS_SPAWNED) or 0) == 0
    record = sandbox_harness.record(jid)
    assert record.status in {"queued", "waiting"} and record.attempts == 0, record
    status = sandbox_harness.status()
    assert "bubblewrap" in status["sessions"]["blocked"][sandbox_harness.rt.settings.host]


def test_a_session_that_the_sandbox_admits_answers_through_the_worker(sandbox_harness: Any) -> None:
    """The fake session, confined: its script folder bound read-only, the rest hidden."""
    from tests.support.session import FAKE

    jid = sandbox_harness.enqueue("ask", "inside")
    done = sandbox_harness.cli(
        "worker",
        "session",
        "--burst",
        DISPATCHQ_SESSION_SANDBOX="on",
        DISPATCHQ_SESSION_SANDBOX_BIND=f"{FAKE.parent},{sandbox_harness.tmp}:rw",
    )
    assert done.returncode == 0, done.stderr
    record = sandbox_harness.record(jid)
    assert record.status == "answered", (record, done.stderr[-2000:])
    assert "UNCONFINED" not in done.stderr


def test_a_session_worker_without_a_credential_refuses_to_start_with_the_hint(sandbox_harness: Any) -> None:
    env = {k: v for k, v in sandbox_harness.env.items() if k != "CLAUDE_CODE_OAUTH_TOKEN"}
    from tests.support.helpers import run_cli

    done = run_cli(["worker", "session", "--burst"], env, cwd=sandbox_harness.tmp)
    assert done.returncode == 2, done.stderr
    assert "CLAUDE_CODE_OAUTH_TOKEN is not set" in done.stderr
    assert "claude setup-token" in done.stderr and "CLAUDE_CODE_OAUTH_TOKEN_FILE" in done.stderr
    assert "Traceback" not in done.stderr


def test_sandbox_off_is_said_when_the_worker_starts(sandbox_harness: Any) -> None:
    sandbox_harness.enqueue("ask", "unconfined")
    done = sandbox_harness.cli("worker", "session", "--burst", DISPATCHQ_SESSION_SANDBOX="off")
    assert done.returncode == 0, done.stderr
    assert "sessions on this host run UNCONFINED (DISPATCHQ_SESSION_SANDBOX=off)" in done.stderr


def test_the_tool_scrub_is_off_with_a_warning_where_socat_is_missing(tmp_path: Path) -> None:
    from dispatchq.launcher.scrub import decide_scrub

    folder = tmp_path / "bin"
    folder.mkdir()
    for directory in PATH.split(os.pathsep):
        if Path(directory).is_dir():
            for entry in Path(directory).iterdir():
                if entry.name != "socat" and not (folder / entry.name).exists():
                    (folder / entry.name).symlink_to(entry)
    decision = decide_scrub("auto", {"PATH": str(folder)}, confined=True)
    assert decision.enabled is False
    assert decision.warning is not None and "socat not found on PATH" in decision.warning
    assert decide_scrub("auto", {"PATH": PATH}, confined=True).enabled  # the same host, with socat
    with pytest.raises(SettingsError, match="socat"):
        decide_scrub("on", {"PATH": str(folder)})


def test_each_judgement_gets_its_own_cli_config_folder_and_it_goes_when_the_judgement_ends(
    sandbox_harness: Any,
) -> None:
    settings = sandbox_harness.rt.settings
    orphan = settings.sessions_dir / ("0" * 32)  # a judgement that ended elsewhere (pruned)
    (orphan / "config").mkdir(parents=True)
    dumps = [sandbox_harness.tmp / f"env{i}.json" for i in range(2)]
    sandbox_harness.plan_file.write_text(json.dumps([{"env_dump": str(dump)} for dump in dumps]))
    ids = [sandbox_harness.enqueue("ask", f"q{i}") for i in range(2)]
    done = sandbox_harness.cli("worker", "session", "--burst")
    assert done.returncode == 0, done.stderr
    assert all(sandbox_harness.record(jid).status == "answered" for jid in ids)
    configs = [Path(json.loads(dump.read_text())["CLAUDE_CONFIG_DIR"]) for dump in dumps]
    assert {config.parent.name for config in configs} == set(ids)  # one folder per judgement
    assert all(config.parent.parent == settings.sessions_dir for config in configs)
    assert settings.data_dir.resolve() not in configs[0].parents  # beside the data dir, not in it
    assert not any(config.exists() for config in configs)  # answered: its transcripts are gone
    assert not orphan.exists()  # swept when the worker started


def test_a_judgement_cut_off_mid_run_keeps_its_folder_for_the_resume(sandbox_harness: Any) -> None:
    settings = sandbox_harness.rt.settings
    sandbox_harness.plan_file.write_text(json.dumps([{"scenario": "limit_mid_run"}]))
    jid = sandbox_harness.enqueue("ask", "long")
    done = sandbox_harness.cli("worker", "session", "--burst")
    assert done.returncode == 0, done.stderr
    record = sandbox_harness.record(jid)
    assert record.status == "waiting" and record.resume_session, record
    assert (settings.sessions_dir / jid / "config").is_dir()
    assert (settings.sessions_dir / jid / "work").is_dir()


def test_a_command_in_bin_does_not_bind_the_whole_host(tmp_path: Path) -> None:
    """`/bin/X` would make `/` its installation: the sandbox must not bind it."""
    marker = tmp_path / "host-only.txt"
    marker.write_text("x")
    work = tmp_path / "work"
    work.mkdir()
    check = f"test -e {marker} && echo True || echo False"
    result = launch(
        ["/bin/sh", "-c", check], "", cwd=work, env={"PATH": PATH}, timeout=60, sandbox=plan_for(work)
    )
    assert result.stdout.strip() == "False", result.stderr
    true = launch(["/bin/true"], "", cwd=work, env={"PATH": PATH}, timeout=60, sandbox=plan_for(work))
    assert true.returncode == 0, true.stderr
    with pytest.raises(SettingsError, match="would undo the sandbox"):
        parse_bind("/", "DISPATCHQ_SESSION_SANDBOX_BIND")


def test_git_works_in_a_worktree_but_the_main_checkouts_hooks_stay_read_only(tmp_path: Path) -> None:
    """A worktree's `.git` is a pointer into the main checkout's `.git`: bound, with hooks fixed."""
    main, tree = tmp_path / "main", tmp_path / "tree"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", str(main)], check=True)
    (main / "f.txt").write_text("one\n")
    subprocess.run([*git, "-C", str(main), "add", "f.txt"], check=True)
    subprocess.run([*git, "-C", str(main), "commit", "-qm", "one"], check=True)
    subprocess.run([*git, "-C", str(main), "worktree", "add", "-q", str(tree)], check=True)
    program = r"""
import json, subprocess
git = ["git", "-c", "user.name=s", "-c", "user.email=s@example.invalid"]
open("f.txt", "a").write("two\n")
done = subprocess.run([*git, "commit", "-qam", "two"], capture_output=True, text=True)
try:
    open(HOOKS + "/post-commit", "w").write("#!/bin/sh\necho pwned\n"); hook = True
except OSError:
    hook = False
print(json.dumps({"commit": done.returncode, "err": done.stderr[-300:], "hook": hook}))
"""
    program = f"HOOKS = {str(main / '.git' / 'hooks')!r}\n" + program
    result = launch(
        [sys.executable, "-c", program],
        "",
        cwd=tree,
        env={"PATH": PATH},
        timeout=60,
        sandbox=plan_for(tree),
    )
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["commit"] == 0, seen["err"]
    assert seen["hook"] is False
    log = subprocess.run(["git", "-C", str(tree), "log", "--format=%s"], capture_output=True, text=True)
    assert log.stdout.split() == ["two", "one"]
    assert not (main / ".git" / "hooks" / "post-commit").exists()
