"""A Sentinel-managed Redis: `redis+sentinel://[user:pass@]h:p[,h:p…]/<service>[/db]`.

One place reads that URL and builds clients from it, sync and async alike, so every
dispatchq process follows a failover the same way: the sentinels are asked for the
service's primary on every new connection, and a connection to a demoted primary is
dropped (redis-py's `SentinelManagedConnection` does that). The URL's userinfo is the
primary's login; the sentinels' own password, when they need one, is the secret setting
`DISPATCHQ_REDIS_SENTINEL_PASSWORD`, because the sentinels and the primary are
different servers with different passwords and a URL has room for one.

Three mistakes would otherwise make a long-running role wait forever instead of saying
what is wrong, so they are told apart here from an outage: a sentinel port given as a
plain `redis://` URL (it answers PING, then refuses every data command), a service no
sentinel monitors, and a password the sentinels refuse. A failover under way (the
sentinels know the service but have no primary to offer) is an outage, waited out.

redis-py 8.1's sync `SentinelManagedConnection.read_response` defaults
`disconnect_on_error` to False where every other connection defaults it to True
(redis/redis-py#4292): after a blocking read cut short by an exception (a worker's
SIGTERM handler raising while it sits in BLPOP), the connection goes back to the pool
with the blocked command's reply still to come, and the next command on it reads that
reply as its own. `_DisconnectingConnection` restores the default for the releases before
redis-py 8.2, which fixed it; `redis>=5.0` still allows them (the asyncio connection always
had it).

`rediss+sentinel://` is TLS to the sentinels *and* to the primary they name, with the same
CA and client certificate (`tls_options`): an operator who encrypts one hop encrypts both,
and the host the sentinels name (an IP, usually) must be in the primary's certificate.
A TLS failure is told apart from an outage (`tls_reason`): a CA that does not sign the
server's certificate, a name the certificate does not cover, or a plain port spoken to as
TLS are the operator's to fix, and redis-py's own text for them is "Error 1 connecting".

An enqueue is acknowledged only once a replica has it (`await_replica`): Redis replicates
asynchronously, so a primary dying a moment after its reply would otherwise take an
acknowledged judgement with it.
"""

from __future__ import annotations

import re
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection, SentinelManagedSSLConnection
from redis.utils import SENTINEL

from dispatchq.errors import RedisUnavailable, RedisUnreachable
from dispatchq.settings import Settings
from dispatchq.storage.keys import WRITE_PROBE

__all__ = [
    "DEFAULT_SENTINEL_PORT",
    "SCHEME",
    "TLS_SCHEME",
    "NotReplicated",
    "SentinelTarget",
    "await_replica",
    "is_sentinel_url",
    "parse_sentinel_url",
    "plain_redis_at",
    "refuse_a_sentinel",
    "sentinel_client",
    "sentinel_client_async",
    "sentinel_problem",
    "tls_options",
    "tls_reason",
]

SCHEME = "redis+sentinel"
TLS_SCHEME = "rediss+sentinel"
DEFAULT_SENTINEL_PORT = 26379
#: How long one sentinel may take to answer: a dead one must not stall discovery for long.
SENTINEL_TIMEOUT = 2.0
_URL = "DISPATCHQ_REDIS_URL"


@dataclass(frozen=True)
class SentinelTarget:
    """What a `redis+sentinel://` URL names: the sentinels, the service, and the primary's login."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    #: `rediss+sentinel://`: TLS to the sentinels and to the primary.
    tls: bool = False

    def where(self) -> str:
        """The sentinels and service, for messages (never the password)."""
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.sentinels)
        return f"{hosts}/{self.service}"

    def primary_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"db": self.db}
        if self.username is not None:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        return kwargs


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in (SCHEME, TLS_SCHEME)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Read a `redis+sentinel://` URL, or raise `RedisUnavailable` naming what is wrong.

    Parsed by hand around `urlsplit`, which cannot take a port from a netloc of several
    hosts. `rediss+sentinel://` is the same URL spoken over TLS.
    """
    tls = url.split("://", 1)[0].lower() == TLS_SCHEME
    try:
        parts = urlsplit(url)
    except ValueError as error:
        raise RedisUnavailable(f"{_URL}: {error}") from None
    if parts.query or parts.fragment:
        raise RedisUnavailable(f"{_URL}: a {SCHEME}:// URL takes no ?query or #fragment")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, password = _userinfo(userinfo)
    sentinels = tuple(_host_port(item) for item in hosts.split(","))
    path = [unquote(p) for p in parts.path.split("/")[1:]]
    if not path or not path[0] or len(path) > 2:
        raise RedisUnavailable(
            f"{_URL}: a {SCHEME}:// URL ends in /<service> or /<service>/<db>"
            " (the name the sentinels monitor)"
        )
    db = 0
    if len(path) == 2 and path[1] != "":
        if not path[1].isdigit():
            raise RedisUnavailable(f"{_URL}: the database after /{path[0]}/ must be a number")
        db = int(path[1])
    return SentinelTarget(sentinels, path[0], db, username, password, tls)


def _userinfo(userinfo: str) -> tuple[str | None, str | None]:
    if not userinfo:
        return None, None
    user, colon, password = userinfo.partition(":")
    return (unquote(user) or None), (unquote(password) if colon else None)


def _host_port(item: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # [::1]:26379
        host, _, rest = item[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = item.rpartition(":") if ":" in item else (item, "", "")
    if not host:
        raise RedisUnavailable(f"{_URL}: a sentinel address is empty (host:port, comma-separated)")
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise RedisUnavailable(f"{_URL}: sentinel port {port_text!r} is not a port number")
    return host, int(port_text)


class _DisconnectingConnection(SentinelManagedConnection):
    """A sentinel-managed connection that drops itself when a read fails, as every other does.

    Without it, a read cut short (an exception raised by a signal handler during BLPOP)
    leaves the blocked command's reply on the socket for the next command to read.
    """

    def read_response(
        self,
        disable_decoding: bool = False,
        *,
        timeout: float | object = SENTINEL,
        disconnect_on_error: bool | None = True,
        push_request: bool | None = False,
    ) -> Any:
        return super().read_response(
            disable_decoding=disable_decoding,
            timeout=timeout,
            disconnect_on_error=disconnect_on_error,
            push_request=push_request,
        )


class _DisconnectingSSLConnection(_DisconnectingConnection, SentinelManagedSSLConnection):
    """`_DisconnectingConnection` over TLS (`rediss+sentinel://`): the same read, then TLS's."""


def _manager(pool: object) -> Any:
    """The `Sentinel` a master_for pool asks (redis-py types the pool as a plain one)."""
    return getattr(pool, "sentinel_manager")  # noqa: B009 (an attribute mypy cannot see)


class _OwningRedis(redis.Redis):
    """A primary's client that closes its sentinels' connections when it is closed.

    redis-py leaves the `Sentinel` manager to whoever made it; here nobody else holds it,
    so the client must, or every closed client would leave a socket per sentinel open.
    """

    def close(self) -> None:
        try:
            super().close()
        finally:
            _manager(self.connection_pool).close()


class _OwningAsyncRedis(redis.asyncio.Redis):
    """The asyncio twin of `_OwningRedis`."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            for sentinel in _manager(self.connection_pool).sentinels:
                await sentinel.aclose()


def _sentinel_kwargs(sentinel_password: str | None, tls: dict[str, Any] | None = None) -> dict[str, Any]:
    # No retries against one sentinel: the next sentinel in the list is the retry.
    kwargs: dict[str, Any] = {
        "socket_timeout": SENTINEL_TIMEOUT,
        "socket_connect_timeout": SENTINEL_TIMEOUT,
    }
    if sentinel_password is not None:
        kwargs["password"] = sentinel_password
    if tls is not None:
        kwargs.update(ssl=True, **tls)
    return kwargs


def tls_options(settings: Settings) -> dict[str, Any]:
    """redis-py's TLS keywords from the `DISPATCHQ_REDIS_TLS_*` settings (only those set).

    Each file is checked here, once, so a missing or unreadable one is a line naming its
    setting rather than an "Error 2 connecting" on every connection. The certificate is
    always verified, and so is the host name: a Redis that unpickles what it stores must be
    the one we meant.
    """
    files = {
        "ssl_ca_certs": ("DISPATCHQ_REDIS_TLS_CA_FILE", settings.redis_tls_ca_file),
        "ssl_certfile": ("DISPATCHQ_REDIS_TLS_CERT_FILE", settings.redis_tls_cert_file),
        "ssl_keyfile": ("DISPATCHQ_REDIS_TLS_KEY_FILE", settings.redis_tls_key_file),
    }
    options: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    for keyword, (name, path) in files.items():
        if path is None:
            continue
        resolved = path.expanduser()
        try:
            with open(resolved, "rb"):
                pass
        except OSError as error:
            raise RedisUnavailable(f"{name}: cannot read {resolved}: {error.strerror}") from None
        options[keyword] = str(resolved)
    if "ssl_keyfile" in options and "ssl_certfile" not in options:
        raise RedisUnavailable(
            "DISPATCHQ_REDIS_TLS_KEY_FILE is set without DISPATCHQ_REDIS_TLS_CERT_FILE"
            " (the key of which certificate?)"
        )
    return options


def _errors(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def tls_reason(error: BaseException) -> str | None:
    """Why a TLS handshake failed, in the operator's words, or None when `error` is not that.

    redis-py wraps the `ssl` error as "Error 1 connecting to …" and keeps the real one as the
    context: that is where the reason is (the verifier's message, or OpenSSL's reason code).
    """
    for current in _errors(error):
        if isinstance(current, ssl.SSLCertVerificationError):
            message = current.verify_message or current.reason or "certificate verify failed"
            if "hostname" in message.lower() or "ip address mismatch" in message.lower():
                return f"the server's certificate does not name the host dialled ({message})"
            return (
                f"the server's certificate is not trusted ({message};"
                " is DISPATCHQ_REDIS_TLS_CA_FILE the CA that signed it?)"
            )
        if isinstance(current, ssl.SSLEOFError):
            return (
                "the server ended the TLS handshake (does it want a client certificate?"
                " set DISPATCHQ_REDIS_TLS_CERT_FILE and DISPATCHQ_REDIS_TLS_KEY_FILE)"
            )
        if isinstance(current, ssl.SSLError):
            reason = (
                current.reason or _OPENSSL_WHERE.sub("", current.strerror or "") or type(current).__name__
            )
            if "CERTIFICATE_REQUIRED" in reason:
                return (
                    f"the server wants a client certificate ({reason}):"
                    " set DISPATCHQ_REDIS_TLS_CERT_FILE (and DISPATCHQ_REDIS_TLS_KEY_FILE)"
                )
            if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "HTTP_REQUEST"):
                return f"the server does not speak TLS on that port ({reason}): is it a plain port?"
            return f"TLS handshake failed ({reason})"
    return None


_OPENSSL_WHERE = re.compile(r"\s*\(_ssl\.c:\d+\)")


def plain_redis_at(host: str, port: int) -> bool:
    """True when a plain (not TLS) Redis or sentinel answers at host:port.

    Asked only after a TLS handshake there failed without a TLS reason (timed out): a
    plain Redis reads a ClientHello as an unfinished inline command and never answers it,
    so the only way to name that mistake is to ask the port in plain, once.
    """
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH", b"-ERR", b"-WRONGPASS", b"-NOPERM"))


def sentinel_client(
    target: SentinelTarget,
    sentinel_password: str | None,
    tls: dict[str, Any] | None = None,
    **kwargs: Any,
) -> redis.Redis:
    """A client of the service's primary, wherever the sentinels say it is now.

    With `tls` (a `rediss+sentinel://` URL), both the sentinels and the primary are spoken
    to over TLS with the same options.
    """
    sentinel_kwargs = {**_sentinel_kwargs(sentinel_password, tls), "retry": Retry(NoBackoff(), 0)}
    manager = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)
    connection_class = _DisconnectingSSLConnection if tls is not None else _DisconnectingConnection
    return manager.master_for(
        target.service,
        redis_class=_OwningRedis,
        connection_class=connection_class,
        **target.primary_kwargs(),
        **(tls or {}),
        **kwargs,
    )


def sentinel_client_async(
    target: SentinelTarget,
    sentinel_password: str | None,
    tls: dict[str, Any] | None = None,
    **kwargs: Any,
) -> redis.asyncio.Redis:
    """The asyncio twin of `sentinel_client` (redis-py's async connection already disconnects)."""
    sentinel_kwargs = {
        **_sentinel_kwargs(sentinel_password, tls),
        "retry": redis.asyncio.retry.Retry(NoBackoff(), 0),
    }
    manager = redis.asyncio.sentinel.Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)
    secure: dict[str, Any] = {"ssl": True, **tls} if tls is not None else {}
    return manager.master_for(
        target.service, redis_class=_OwningAsyncRedis, **target.primary_kwargs(), **secure, **kwargs
    )


def sentinel_problem(
    target: SentinelTarget,
    sentinel_password: str | None,
    described: str,
    tls: dict[str, Any] | None = None,
) -> RedisUnavailable:
    """Why no primary was found: a configuration error (`RedisUnavailable`) or an outage.

    Asks every sentinel once, directly. Any sentinel that knows the service means a
    failover is under way (or the primary is down): an outage (`RedisUnreachable`,
    itself a `RedisUnavailable`). Otherwise a refused
    login, a server that is not a sentinel, or a service nobody monitors is the
    operator's to fix, and waiting would never fix it.
    """
    answers = [_ask(host, port, target.service, sentinel_password, tls) for host, port in target.sentinels]
    if tls is not None:
        plain = [
            (host, port)
            for (host, port), answer in zip(target.sentinels, answers, strict=True)
            if answer == "away" and plain_redis_at(host, port)
        ]
        if plain:
            return RedisUnavailable(
                f"{_URL}: the sentinel at {plain[0][0]}:{plain[0][1]} answers in plain, not TLS"
                " (a plain port in a rediss+sentinel:// URL?)"
            )
    handshakes = [a.removeprefix("tls: ") for a in answers if a.startswith("tls: ")]
    if handshakes and len(handshakes) == len([a for a in answers if a != "away"]):
        return RedisUnavailable(f"{_URL}: TLS to the sentinels at {target.where()} failed: {handshakes[0]}")
    if "knows" in answers:
        return RedisUnreachable(
            f"cannot reach Redis at {described}: the sentinels have no primary for {target.service!r} now"
        )
    if "refused" in answers:
        return RedisUnavailable(
            f"{_URL}: the sentinels at {target.where()} refused the login:"
            " wrong or missing DISPATCHQ_REDIS_SENTINEL_PASSWORD"
        )
    if "not a sentinel" in answers:
        return RedisUnavailable(
            f"{_URL}: {target.where()} names a Redis server, not a sentinel"
            " (a redis+sentinel:// URL lists the sentinels' host:port)"
        )
    if "unknown" in answers:
        return RedisUnavailable(
            f"{_URL}: no sentinel at {target.where()} monitors a service named {target.service!r}"
        )
    return RedisUnreachable(f"cannot reach Redis at {described}: no sentinel answers")


def _ask(host: str, port: int, service: str, password: str | None, tls: dict[str, Any] | None) -> str:
    """One sentinel's word on the service: knows, unknown, refused, not a sentinel, away,
    or "tls: <reason>" when the handshake failed."""
    probe = redis.Redis(host, port, **_sentinel_kwargs(password, tls), retry=Retry(NoBackoff(), 0))
    try:
        probe.execute_command("SENTINEL", "MASTER", service)
    except redis.AuthenticationError:
        return "refused"
    except (redis.ConnectionError, redis.TimeoutError, OSError) as error:
        reason = tls_reason(error)
        return f"tls: {reason}" if reason is not None else "away"
    except redis.ResponseError as error:
        text = str(error)
        if text.startswith(("NOAUTH", "WRONGPASS", "NOPERM")):
            return "refused"
        if "no such master" in text.lower():
            return "unknown"
        return "not a sentinel" if "unknown command" in text.lower() else "away"
    finally:
        probe.close()
    return "knows"


def refuse_a_sentinel(client: redis.Redis, described: str) -> None:
    """For a plain URL: raise `RedisUnavailable` when the server behind it is a sentinel.

    A sentinel answers PING and then "unknown command" to every data command, which a
    worker would otherwise meet as a puzzling error on its first write. `SENTINEL MYID`
    is the cheapest question only a sentinel answers (a Redis server does not know the
    command, whatever its ACL).
    """
    try:
        client.execute_command("SENTINEL", "MYID")
    except redis.ResponseError:
        return
    raise RedisUnavailable(
        f"{_URL}: {described} is a Redis Sentinel, not a Redis server:"
        f" name it as {SCHEME}://<host:port>[,<host:port>…]/<service>"
    )


class NotReplicated(redis.ResponseError):
    """No replica acknowledged a write in time (`WAIT`): weather of the NOREPLICAS kind.

    Its text starts with NOREPLICAS so `storage.outage` classes it as a primary that cannot
    take writes now, and a producer reports the enqueue as not written (enqueuing it again is
    safe: the content key makes a copy that did land a no-op).
    """


def await_replica(client: redis.Redis, settings: Settings) -> None:
    """With Sentinel configured, return only once a replica has everything written so far.

    `WAIT` counts the replication offset of the connection it runs on, and a pool may hand
    the enqueue's write and the WAIT different connections: so a short probe write goes
    first on the WAIT's own connection (one pipeline, one connection). Its offset is at or
    after every write the primary acknowledged before it, the enqueue's included.

    No replica within `DISPATCHQ_REDIS_WAIT_MS`: `NotReplicated` (the caller does not
    acknowledge). A plain URL, or a wait of 0, never waits: there is no replica we know of.
    """
    if settings.redis_wait_ms == 0 or settings.redis_url is None:
        return
    if not is_sentinel_url(settings.redis_url.get_secret_value()):
        return
    pipe = client.pipeline(transaction=False)
    pipe.set(WRITE_PROBE, "1", px=10_000)
    pipe.execute_command("WAIT", 1, settings.redis_wait_ms)
    replicas = pipe.execute()[-1]
    if int(replicas) < 1:
        raise NotReplicated(
            f"NOREPLICAS no replica acknowledged the enqueue within {settings.redis_wait_ms} ms"
            " (DISPATCHQ_REDIS_WAIT_MS): not acknowledged"
        )
