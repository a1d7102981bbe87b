"""The store is closed to everyone but dispatchq: a password, a private socket, owner-only files.

Each test starts its own embedded server under its own data dir (never the session's
shared one). The cases with a second user run a tiny listener as `nobody` (root can
`setpriv` to it): it records every connection it gets, so "dispatchq never talked to that
user's server" is a file that stays empty, not an absence of errors.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import redis

from dispatchq.errors import RedisUnavailable
from dispatchq.settings import load_settings
from dispatchq.storage.connection import (
    PASSWORD_FILE,
    SOCKET_RECORD,
    EmbeddedRedis,
    connect,
    connect_async,
    redis_server_binary,
)
from tests.support.helpers import REPO, run_cli, wait_for, write_check_module, write_config
from tests.support.store_access import NOBODY, Listener, as_nobody, free_port, redis_pids

DEEP = ["a-rather-long-directory-name-for-a-data-dir"] * 4


def env_for(data_dir: Path, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCHQ_", "TYPESAFE_"))}
    env.update(
        DISPATCHQ_DATA_DIR=str(data_dir),
        DISPATCHQ_CHECKOUT_ROOTS=str(tmp_path),
        DISPATCHQ_CONFIG=str(tmp_path / "dispatchq.yaml"),
        PYTHONPATH=str(REPO),
    )
    return env


def owner_only(root: Path) -> list[str]:
    """Every path under `root` (and `root`) with a group or other bit, as `path mode`."""
    found = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            found.append(f"{path} {mode:04o}")
    return found


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# --- the password -------------------------------------------------------------------------------


def test_the_password_file_is_0600_and_the_server_refuses_a_ping_without_it(
    tmp_path: Path, access_servers: list[Path]
) -> None:
    data_dir = tmp_path / "data"
    access_servers.append(data_dir)
    server = EmbeddedRedis(data_dir)
    socket_path = server.ensure_running()
    password_file = data_dir / PASSWORD_FILE
    assert mode_of(password_file) == 0o600
    password = password_file.read_text().strip()
    assert len(password) >= 32

    anonymous = redis.Redis(unix_socket_path=str(socket_path))
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    anonymous.close()
    wrong = redis.Redis(unix_socket_path=str(socket_path), password="not-it")
    with pytest.raises(redis.AuthenticationError):
        wrong.ping()
    wrong.close()
    assert server.client().ping()

    # The password reached the server on its stdin: not in its config, not on its command line.
    assert password not in (data_dir / "redis.conf").read_text()
    [pid] = redis_pids(data_dir)
    assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert server.client().config_get("requirepass")["requirepass"] == password


def test_every_client_logs_in(tmp_path: Path, access_servers: list[Path]) -> None:
    data_dir = tmp_path / "data"
    access_servers.append(data_dir)
    settings = load_settings({"DISPATCHQ_DATA_DIR": str(data_dir)})
    client = connect(settings)
    client.set("k", "v")
    assert connect(settings, start=False).get("k") == b"v"

    async def read() -> bytes | None:
        async_client = connect_async(settings)
        try:
            return await async_client.get("k")
        finally:
            await async_client.aclose()

    assert asyncio.run(read()) == b"v"
    server = EmbeddedRedis(data_dir.resolve())
    assert server.is_running()
    done = run_cli(["redis", "status", "--json"], env_for(data_dir, tmp_path))
    assert json.loads(done.stdout)["running"] is True, done.stderr
    assert server.stop()
    assert redis_pids(data_dir) == []


def test_processes_starting_at_once_agree_on_one_password(tmp_path: Path, access_servers: list[Path]) -> None:
    data_dir = tmp_path / "fresh"
    access_servers.append(data_dir)
    code = (
        "from dispatchq.storage.connection import connect\n"
        "from dispatchq.settings import load_settings\n"
        "connect(load_settings()).incr('clients')\n"
    )
    env = env_for(data_dir, tmp_path)
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for proc in procs:
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    assert len(redis_pids(data_dir)) == 1
    assert int(EmbeddedRedis(data_dir).client().get("clients")) == 4
    assert [p.name for p in data_dir.iterdir() if p.name.startswith(f".{PASSWORD_FILE}")] == []


# --- upgrading from a release without a password ------------------------------------------------------

OLD_RELEASE_CONFIG = """\
port 0
unixsocket {sock}
unixsocketperm 700
daemonize yes
pidfile {dir}/redis.pid
dir {dir}
logfile {dir}/redis.log
appendonly yes
appendfilename appendonly.aof
appendfsync everysec
dbfilename dump.rdb
save 900 1
maxmemory-policy noeviction
"""


def start_like_the_previous_release(data_dir: Path, sock: Path) -> int:
    """The server the previous release left: no password, data dir 0755, its files 0644."""
    data_dir.mkdir(parents=True)
    data_dir.chmod(0o755)
    config = data_dir / "redis.conf"
    config.write_text(OLD_RELEASE_CONFIG.format(sock=sock, dir=data_dir))
    config.chmod(0o644)
    subprocess.run([redis_server_binary(), str(config)], check=True, umask=0o022, stdout=subprocess.DEVNULL)
    old = redis.Redis(unix_socket_path=str(sock))
    wait_for(lambda: sock.exists() and old.ping(), what="the old release's server")
    old.close()
    pid = int((data_dir / "redis.pid").read_text())
    return pid


CONNECT_AND_LOG = (
    "import logging, sys\n"
    "logging.basicConfig(stream=sys.stderr, level=logging.INFO, format='%(name)s %(message)s')\n"
    "from dispatchq.storage.connection import connect\n"
    "from dispatchq.settings import load_settings\n"
    "connect(load_settings()).ping()\n"
)


def test_a_password_less_server_of_the_previous_release_is_restarted_once_and_keeps_its_data(
    tmp_path: Path, access_servers: list[Path]
) -> None:
    data_dir = tmp_path / "data"
    access_servers.append(data_dir)
    old_pid = start_like_the_previous_release(data_dir, data_dir / "redis.sock")
    old = redis.Redis(unix_socket_path=str(data_dir / "redis.sock"))
    old.hset("dispatchq:j:before", mapping={"status": "queued"})
    old.rpush("rq:queue:dispatchq-code", "job-before")
    old.close()
    assert mode_of(data_dir / "appendonly.aof") == 0o644  # what the upgrade must fix

    env = env_for(data_dir, tmp_path)
    runs = [
        subprocess.run(
            [sys.executable, "-c", CONNECT_AND_LOG], env=env, capture_output=True, text=True, timeout=60
        )
        for _ in range(3)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr
    restarts = [line for run in runs for line in run.stderr.splitlines() if "with a password" in line]
    assert len(restarts) == 1, [run.stderr for run in runs]
    assert restarts[0].startswith("dispatchq.storage.connection restarting the embedded Redis in")
    [new_pid] = redis_pids(data_dir)
    assert new_pid != old_pid

    server = EmbeddedRedis(data_dir)
    client = server.client()
    assert client.hget("dispatchq:j:before", "status") == b"queued"
    assert client.lrange("rq:queue:dispatchq-code", 0, -1) == [b"job-before"]
    anonymous = redis.Redis(unix_socket_path=str(data_dir / "redis.sock"))
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    anonymous.close()
    assert mode_of(data_dir) == 0o700
    assert owner_only(data_dir) == []
    assert mode_of(data_dir / "redis.conf") == 0o600


def test_a_deep_data_dir_from_the_previous_release_leaves_its_old_tmp_socket(
    tmp_path: Path, access_servers: list[Path]
) -> None:
    """The old release's socket was a fixed name in /tmp: the new one never connects there."""
    data_dir = tmp_path.joinpath(*DEEP)
    access_servers.append(data_dir)
    legacy = legacy_socket(data_dir)
    old_pid = start_like_the_previous_release(data_dir, legacy)
    old = redis.Redis(unix_socket_path=str(legacy))
    old.set("before", "kept")
    old.close()

    client = connect(load_settings({"DISPATCHQ_DATA_DIR": str(data_dir)}))
    assert client.get("before") == b"kept"
    [new_pid] = redis_pids(data_dir)
    assert new_pid != old_pid
    new_socket = EmbeddedRedis(data_dir).socket_path
    assert new_socket is not None and new_socket != legacy
    assert not legacy.exists()  # the old server removed it on its way out


# --- modes ---------------------------------------------------------------------------------------


def test_a_fresh_data_dir_is_0700_and_everything_in_it_owner_only(
    tmp_path: Path, access_servers: list[Path]
) -> None:
    data_dir = tmp_path / "data"
    access_servers.append(data_dir)
    client = connect(load_settings({"DISPATCHQ_DATA_DIR": str(data_dir)}))
    client.set("k", "v")
    client.bgrewriteaof()
    wait_for(lambda: client.info("persistence")["aof_rewrite_in_progress"] == 0, what="the AOF rewrite")
    client.save()
    assert mode_of(data_dir) == 0o700
    names = {p.name for p in data_dir.iterdir()}
    assert {"appendonly.aof", "dump.rdb", "redis.log", "redis.conf", "redis.pid", PASSWORD_FILE} <= names
    for path in data_dir.iterdir():
        wanted = 0o700 if stat.S_ISSOCK(path.lstat().st_mode) else 0o600
        assert mode_of(path) == wanted, path


def test_files_an_older_release_left_open_are_made_owner_only_on_start(
    tmp_path: Path, access_servers: list[Path]
) -> None:
    data_dir = tmp_path / "data"
    access_servers.append(data_dir)
    (data_dir / "session-logs").mkdir(parents=True)
    (data_dir / "session-logs" / "j1.log").write_text("stderr\n")
    (data_dir / "redis.log").write_text("old log\n")
    for path in (data_dir, data_dir / "session-logs"):
        path.chmod(0o755)
    for path in (data_dir / "session-logs" / "j1.log", data_dir / "redis.log"):
        path.chmod(0o644)
    EmbeddedRedis(data_dir).ensure_running()
    assert owner_only(data_dir) == []
    assert mode_of(data_dir / "session-logs" / "j1.log") == 0o600


def test_a_password_file_readable_by_others_is_replaced_not_chmodded(
    tmp_path: Path, access_servers: list[Path]
) -> None:
    data_dir = tmp_path / "data"
    access_servers.append(data_dir)
    server = EmbeddedRedis(data_dir)
    server.ensure_running()
    leaked = server.password()
    (data_dir / PASSWORD_FILE).chmod(0o644)  # someone opened it up: it may have been read
    server.ensure_running()
    assert server.password() != leaked
    assert mode_of(data_dir / PASSWORD_FILE) == 0o600
    assert server.client().ping()
    stale = redis.Redis(unix_socket_path=str(server.socket_path), password=leaked)
    with pytest.raises(redis.AuthenticationError):
        stale.ping()
    stale.close()


# --- the socket's folder ----------------------------------------------------------------------------


def legacy_socket(data_dir: Path) -> Path:
    """The name the previous release used for a deep data dir's socket: anyone could take it."""
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    return Path("/tmp") / f"dispatchq-{os.getuid()}-{digest}.sock"


def test_a_deep_data_dir_gets_a_private_socket_folder_recorded_in_the_data_dir(
    tmp_path: Path, access_servers: list[Path]
) -> None:
    data_dir = tmp_path.joinpath(*DEEP)
    access_servers.append(data_dir)
    sock = EmbeddedRedis(data_dir).ensure_running()
    folder = sock.parent
    info = folder.lstat()
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
    assert mode_of(folder) == 0o700
    assert (data_dir / SOCKET_RECORD).read_text().strip() == str(folder)
    assert mode_of(data_dir / SOCKET_RECORD) == 0o600
    assert sock != legacy_socket(data_dir)
    assert not folder.name.startswith(f"dispatchq-{os.getuid()}-")  # not the old guessable name


@pytest.mark.parametrize("swap", ["open", "symlink"])
def test_a_socket_folder_swapped_for_an_open_one_or_a_symlink_is_refused(
    tmp_path: Path, access_servers: list[Path], swap: str
) -> None:
    data_dir = tmp_path.joinpath(*DEEP)
    access_servers.append(data_dir)
    server = EmbeddedRedis(data_dir)
    folder = server.ensure_running().parent
    assert server.stop()
    shutil.rmtree(folder)
    if swap == "open":
        folder.mkdir()
        folder.chmod(0o755)
        reason = "open to other users (mode 0755"
    else:
        target = tmp_path / "elsewhere"
        target.mkdir(mode=0o700)
        folder.symlink_to(target)
        reason = "is a symlink"
    try:
        settings = load_settings({"DISPATCHQ_DATA_DIR": str(data_dir)})
        with pytest.raises(RedisUnavailable) as caught:
            connect(settings, start=False)
        message = str(caught.value)
        assert str(folder) in message and reason in message and "\n" not in message
        with pytest.raises(RedisUnavailable):
            connect_async(settings)
        assert not server.is_running()
        # A start leaves the swapped folder alone and makes a private one of its own.
        fresh = server.ensure_running()
        assert fresh.parent != folder and mode_of(fresh.parent) == 0o700
    finally:
        if folder.is_symlink():
            folder.unlink()
        else:
            shutil.rmtree(folder, ignore_errors=True)


# --- a second local user ------------------------------------------------------------------------


def need_another_uid() -> None:
    """Root, with setpriv, may run a second user; elsewhere skip loudly, but never under CI."""
    missing = "not root" if os.geteuid() != 0 else "no setpriv" if shutil.which("setpriv") is None else ""
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"a second uid is needed ({missing}) and CI=true: this must run")
        pytest.skip(f"SKIPPED LOUDLY: the second-uid cases need root and setpriv ({missing})")


def enqueue_one(data_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    module = write_check_module(tmp_path, "def check(judgement):\n    return 1\n")
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  one:\n    check: {module}:check\n")
    return run_cli(["enqueue", "--kind", "one", "--target", "t1"], env_for(data_dir, tmp_path), cwd=tmp_path)


def jobs_in(server: EmbeddedRedis) -> int:
    client = server.client()
    return sum(int(client.llen(key)) for key in client.scan_iter("rq:queue:*"))


def test_another_user_binding_the_old_fallback_name_first_gets_no_connection(
    tmp_path: Path, access_servers: list[Path], listeners: list[Listener]
) -> None:
    need_another_uid()
    data_dir = tmp_path.joinpath(*DEEP)
    access_servers.append(data_dir)
    trap = Listener(legacy_socket(data_dir))
    listeners.append(trap)

    done = enqueue_one(data_dir, tmp_path)
    assert done.returncode == 0, done.stderr
    server = EmbeddedRedis(data_dir)
    assert jobs_in(server) == 1  # the job is in our own server ...
    assert trap.connections() == 0  # ... and nobody's listener never heard from us
    socket_path = server.socket_path
    assert socket_path is not None and socket_path.parent.lstat().st_uid == os.getuid()


def test_another_user_taking_the_recorded_socket_folder_is_refused_and_never_written_to(
    tmp_path: Path, access_servers: list[Path], listeners: list[Listener]
) -> None:
    need_another_uid()
    data_dir = tmp_path.joinpath(*DEEP)
    access_servers.append(data_dir)
    server = EmbeddedRedis(data_dir)
    folder = server.ensure_running().parent
    assert server.stop()
    # Our folder went (a tmp cleaner), and nobody, who saw its name in /tmp, made it again.
    shutil.rmtree(folder)
    subprocess.run(as_nobody(["mkdir", "-m", "0700", str(folder)]), check=True)
    try:
        trap = Listener(folder / "redis.sock")
        listeners.append(trap)

        settings = load_settings({"DISPATCHQ_DATA_DIR": str(data_dir)})
        with pytest.raises(RedisUnavailable) as caught:
            connect(settings, start=False)
        message = str(caught.value)
        assert f"{folder} belongs to uid {NOBODY}" in message and "\n" not in message
        with pytest.raises(RedisUnavailable):
            connect_async(settings)
        assert not server.is_running()
        done = run_cli(["redis", "status"], env_for(data_dir, tmp_path))
        assert "running: False" in done.stdout, done.stderr

        done = enqueue_one(data_dir, tmp_path)  # starts the server: in a private place of its own
        assert done.returncode == 0, done.stderr
        fresh = server.socket_path
        assert fresh is not None and fresh.parent != folder
        assert jobs_in(server) == 1
        assert trap.connections() == 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_data_dir_another_user_made_first_is_refused_in_one_line(
    tmp_path: Path, listeners: list[Listener]
) -> None:
    need_another_uid()
    shared = Path(tempfile.mkdtemp(prefix="dq-shared-"))
    shared.chmod(0o1777)  # a /tmp-like folder both users may create in
    try:
        data_dir = shared / "data"
        subprocess.run(as_nobody(["mkdir", "-m", "0755", str(data_dir)]), check=True)
        trap = Listener(data_dir / "redis.sock")
        listeners.append(trap)

        done = enqueue_one(data_dir, tmp_path)
        assert done.returncode == 2
        assert done.stderr.startswith(f"error: DISPATCHQ_DATA_DIR: {data_dir} belongs to uid {NOBODY}")
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
        assert trap.connections() == 0
        assert not (data_dir / PASSWORD_FILE).exists()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# --- an operator's server with a password --------------------------------------------------------


def test_an_external_server_with_a_password_works_from_the_url(password_server: tuple[int, str]) -> None:
    port, password = password_server
    client = connect(load_settings({"DISPATCHQ_REDIS_URL": f"redis://:{password}@127.0.0.1:{port}/0"}))
    client.set("k", "v")
    assert client.get("k") == b"v"


@pytest.mark.parametrize("auth", ["wrong", "missing", "user"])
def test_a_wrong_or_missing_password_is_one_line_without_it(
    password_server: tuple[int, str], tmp_path: Path, auth: str
) -> None:
    port, password = password_server
    url = {
        "wrong": f"redis://:{password}x@127.0.0.1:{port}/0",
        "missing": f"redis://127.0.0.1:{port}/0",
        "user": f"redis://worker:{password}@127.0.0.1:{port}/0",  # no such ACL user
    }[auth]
    with pytest.raises(RedisUnavailable) as caught:
        connect(load_settings({"DISPATCHQ_REDIS_URL": url}))
    message = str(caught.value)
    assert message.startswith("DISPATCHQ_REDIS_URL: Redis at ")
    assert "refused the login: wrong or missing password" in message
    assert password not in message and "\n" not in message

    env = env_for(tmp_path / "data", tmp_path)
    env["DISPATCHQ_REDIS_URL"] = url
    done = run_cli(["list"], env)
    assert done.returncode == 2
    assert "refused the login" in done.stderr
    assert password not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_shipped_redis_conf_refuses_to_start_until_the_auth_file_exists(tmp_path: Path) -> None:
    auth = tmp_path / "redis-auth.conf"
    text = (REPO / "ops" / "redis.conf").read_text()
    assert text.rstrip().endswith("include /etc/dispatchq/redis-auth.conf")
    config = tmp_path / "redis.conf"
    config.write_text(text.replace("/etc/dispatchq/redis-auth.conf", str(auth)))
    port = free_port()
    argv = [
        redis_server_binary(),
        str(config),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(tmp_path),
    ]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert refused.returncode != 0
    assert str(auth) in refused.stderr + refused.stdout

    password = "op-" + os.urandom(8).hex()
    auth.write_text(f"user default off\nuser dispatchq on >{password} ~* &* +@all\n")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        url = f"redis://dispatchq:{password}@127.0.0.1:{port}/0"
        wait_for(lambda: _logs_in(url), what="the shipped config's server")
        anonymous = redis.Redis(port=port)
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        anonymous.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _logs_in(url: str) -> bool:
    try:
        connect(load_settings({"DISPATCHQ_REDIS_URL": url})).ping()
    except RedisUnavailable:
        return False
    return True
