"""The embedded Redis default: one real server per data dir, shared by every process.

Each test here starts its own server under its own tmp data dir (never the session's
shared one) and stops it afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dispatchq.errors import RedisUnavailable
from dispatchq.settings import load_settings
from dispatchq.storage.connection import MAX_SOCKET_PATH, EmbeddedRedis, connect
from tests.support.connection import redis_pids
from tests.support.helpers import REPO, run_cli, wait_for


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    with contextlib.suppress(OSError):
        if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
            return False
    return True


def env_for(data_dir: Path, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCHQ_", "TYPESAFE_"))}
    env.update(
        DISPATCHQ_DATA_DIR=str(data_dir),
        DISPATCHQ_CHECKOUT_ROOTS=str(tmp_path),
        DISPATCHQ_CONFIG=str(tmp_path / "dispatchq.yaml"),
        PYTHONPATH=str(REPO),
    )
    return env


# --- the socket path ----------------------------------------------------------------------------


def test_socket_path_stays_short_under_a_deep_data_dir(
    tmp_path: Path, connection_servers: list[Path]
) -> None:
    deep = tmp_path.joinpath(*(["a-rather-long-directory-name-for-a-data-dir"] * 4))
    assert len(str(deep / "redis.sock")) > MAX_SOCKET_PATH
    server = EmbeddedRedis(deep)
    connection_servers.append(deep)
    assert server.socket_path is None  # no folder before the first start: nothing to guess
    socket = server.ensure_running()
    assert socket == server.socket_path
    assert len(str(socket)) <= MAX_SOCKET_PATH
    assert server.client().ping()
    assert server.stop()
    assert not server.is_running()


def test_socket_path_stays_short_under_a_deep_tmpdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connection_servers: list[Path]
) -> None:
    deep_tmp = tmp_path.joinpath(*(["a-rather-long-temporary-directory-name"] * 3))
    monkeypatch.setattr(tempfile, "tempdir", str(deep_tmp))
    deep = tmp_path.joinpath(*(["a-rather-long-directory-name-for-a-data-dir"] * 4))
    connection_servers.append(deep)
    server = EmbeddedRedis(deep)
    socket = server.ensure_running()
    assert len(str(socket)) <= MAX_SOCKET_PATH
    assert socket.parent.parent == Path("/tmp")
    assert server.stop()


def test_a_short_data_dir_keeps_its_socket_inside(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "d")
    assert server.socket_path == tmp_path / "d" / "redis.sock"


def test_different_data_dirs_get_different_sockets(tmp_path: Path, connection_servers: list[Path]) -> None:
    deep = tmp_path.joinpath(*(["a-rather-long-directory-name-for-a-data-dir"] * 4))
    one, two = EmbeddedRedis(deep / "one"), EmbeddedRedis(deep / "two")
    connection_servers.extend([one.data_dir, two.data_dir])
    assert one.ensure_running() != two.ensure_running()
    one.client().set("which", "one")
    assert two.client().get("which") is None
    assert one.stop() and two.stop()


def test_a_deep_data_dir_keeps_its_socket_folder_across_restarts(
    tmp_path: Path, connection_servers: list[Path]
) -> None:
    """Every process finds the same socket: the folder is recorded in the data dir, and reused."""
    deep = tmp_path.joinpath(*(["a-rather-long-directory-name-for-a-data-dir"] * 4))
    connection_servers.append(deep)
    server = EmbeddedRedis(deep)
    first = server.ensure_running()
    assert EmbeddedRedis(deep).socket_path == first  # another process's view of the same dir
    assert server.stop()
    assert server.ensure_running() == first
    assert server.stop()


# --- one server for many processes ------------------------------------------------------------------


def test_processes_starting_at_once_share_one_server(tmp_path: Path, connection_servers: list[Path]) -> None:
    data_dir = tmp_path / "fresh-data"
    connection_servers.append(data_dir)
    env = env_for(data_dir, tmp_path)
    code = (
        "from dispatchq.storage.connection import connect, embedded_for\n"
        "from dispatchq.settings import load_settings\n"
        "s = load_settings()\n"
        "c = connect(s)\n"
        "c.incr('started-clients')\n"
        "print(embedded_for(s).pid())\n"
    )
    # Two CLI processes and two library users, released together against a dir with no server.
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "dispatchq.cli", "status", "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ] + [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    pids = redis_pids(data_dir)
    assert len(pids) == 1
    assert {int(outputs[2][0]), int(outputs[3][0])} == set(pids)
    server = EmbeddedRedis(data_dir.resolve())
    assert int(server.client().get("started-clients")) == 2


def test_status_shows_the_embedded_server_in_use(tmp_path: Path, connection_servers: list[Path]) -> None:
    data_dir = tmp_path / "data"
    connection_servers.append(data_dir)
    done = run_cli(["status", "--json"], env_for(data_dir, tmp_path))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["redis"] == f"embedded ({data_dir.resolve()})"


# --- crashes and restarts ---------------------------------------------------------------------------


def test_stale_socket_and_pid_file_after_kill_9_are_recovered(
    tmp_path: Path, connection_servers: list[Path]
) -> None:
    data_dir = tmp_path / "data"
    connection_servers.append(data_dir)
    server = EmbeddedRedis(data_dir)
    server.ensure_running()
    old_pid = server.pid()
    assert old_pid is not None
    os.kill(old_pid, signal.SIGKILL)
    wait_for(lambda: not alive(old_pid), what="the killed server to exit")
    assert server.socket_path.exists() and server.pid_path.exists()  # left behind by the crash
    assert not server.is_running()

    done = run_cli(["status", "--json"], env_for(data_dir, tmp_path))
    assert done.returncode == 0, done.stderr
    new_pid = server.pid()
    assert new_pid is not None and new_pid != old_pid
    assert redis_pids(data_dir) == [new_pid]
    assert server.client().ping()


def test_a_stale_pid_file_naming_another_process_is_never_killed(
    tmp_path: Path, connection_servers: list[Path]
) -> None:
    data_dir = tmp_path / "data"
    connection_servers.append(data_dir)
    data_dir.mkdir()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        server = EmbeddedRedis(data_dir)
        server.pid_path.write_text(f"{bystander.pid}\n")  # the pid was reused by something else
        server.socket_path.write_text("not a socket")
        server.ensure_running()
        assert server.client().ping()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_graceful_restart_keeps_every_write(tmp_path: Path, connection_servers: list[Path]) -> None:
    data_dir = tmp_path / "data"
    connection_servers.append(data_dir)
    server = EmbeddedRedis(data_dir)
    server.ensure_running()
    client = server.client()
    client.hset("dispatchq:j:x", mapping={"status": "queued"})
    client.rpush("rq:queue:dispatchq-code", "job-1")
    assert client.config_get("appendonly")["appendonly"] == "yes"
    assert server.stop()
    assert redis_pids(data_dir) == []
    server.ensure_running()
    client = server.client()
    assert client.hget("dispatchq:j:x", "status") == b"queued"
    assert client.lrange("rq:queue:dispatchq-code", 0, -1) == [b"job-1"]


def test_appendfsync_setting_reaches_the_server(tmp_path: Path, connection_servers: list[Path]) -> None:
    data_dir = tmp_path / "data"
    connection_servers.append(data_dir)
    client = connect(load_settings({"DISPATCHQ_DATA_DIR": str(data_dir), "DISPATCHQ_APPENDFSYNC": "always"}))
    assert client.config_get("appendfsync")["appendfsync"] == "always"
    assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"


def test_redis_stop_command(tmp_path: Path, connection_servers: list[Path]) -> None:
    data_dir = tmp_path / "data"
    connection_servers.append(data_dir)
    env = env_for(data_dir, tmp_path)
    server = EmbeddedRedis(data_dir)
    server.ensure_running()
    [pid] = redis_pids(data_dir)
    done = run_cli(["redis", "stop"], env)
    assert (done.returncode, done.stdout.strip()) == (0, "stopped"), done.stderr
    wait_for(lambda: not alive(pid), what="the stopped server to exit")
    assert not server.is_running()
    again = run_cli(["redis", "stop"], env)
    assert (again.returncode, again.stdout.strip()) == (0, "not running")


# --- an operator's own Redis ---------------------------------------------------------------------


def test_with_a_redis_url_nothing_embedded_starts(tmp_path: Path, redis_server: EmbeddedRedis) -> None:
    data_dir = tmp_path / "never-used"
    settings = load_settings({"DISPATCHQ_REDIS_URL": redis_server.url(), "DISPATCHQ_DATA_DIR": str(data_dir)})
    assert connect(settings).ping()
    assert not data_dir.exists()
    assert settings.describe_redis() == f"unix://:***@{redis_server.socket_path}"


def test_redis_stop_refuses_a_server_it_does_not_manage(tmp_path: Path, redis_server: EmbeddedRedis) -> None:
    env = env_for(tmp_path / "data", tmp_path)
    env["DISPATCHQ_REDIS_URL"] = redis_server.url()
    done = run_cli(["redis", "stop"], env)
    assert done.returncode == 2
    assert "DISPATCHQ_REDIS_URL" in done.stderr and "Traceback" not in done.stderr
    assert redis_server.is_running()


def test_unreachable_redis_is_one_line_without_the_password(tmp_path: Path) -> None:
    settings = load_settings({"DISPATCHQ_REDIS_URL": "redis://worker:s3cr3t-pw@127.0.0.1:1/0"})
    with pytest.raises(RedisUnavailable) as caught:
        connect(settings)
    message = str(caught.value)
    assert "s3cr3t-pw" not in message
    assert "redis://worker:***@127.0.0.1:1/0" in message
    assert "\n" not in message


def test_unreachable_redis_from_the_cli(tmp_path: Path) -> None:
    env = env_for(tmp_path / "data", tmp_path)
    env["DISPATCHQ_REDIS_URL"] = "redis://worker:s3cr3t-pw@127.0.0.1:1/0"
    done = run_cli(["list"], env)
    assert done.returncode == 2
    assert "s3cr3t-pw" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_an_unusable_data_dir_is_one_line_naming_the_variable(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(RedisUnavailable, match=r"^DISPATCHQ_DATA_DIR: "):
        EmbeddedRedis(blocked / "data").ensure_running()
    done = run_cli(["status"], env_for(blocked / "data", tmp_path))
    assert done.returncode == 2
    assert done.stderr.startswith("error: DISPATCHQ_DATA_DIR: ") and "Traceback" not in done.stderr
