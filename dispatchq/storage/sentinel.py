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
reply as its own. `_DisconnectingConnection` restores the default until redis-py ships
the fix; the asyncio connection already has it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection
from redis.utils import SENTINEL

from dispatchq.errors import RedisUnavailable, RedisUnreachable

__all__ = [
    "DEFAULT_SENTINEL_PORT",
    "SCHEME",
    "SentinelTarget",
    "is_sentinel_url",
    "parse_sentinel_url",
    "refuse_a_sentinel",
    "sentinel_client",
    "sentinel_client_async",
    "sentinel_problem",
]

SCHEME = "redis+sentinel"
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
    return url.split("://", 1)[0].lower() in (SCHEME, "rediss+sentinel")


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Read a `redis+sentinel://` URL, or raise `RedisUnavailable` naming what is wrong.

    Parsed by hand around `urlsplit`, which cannot take a port from a netloc of several
    hosts. TLS (`rediss+sentinel://`) is refused in so many words: it is not built yet.
    """
    scheme = url.split("://", 1)[0].lower()
    if scheme == "rediss+sentinel":
        raise RedisUnavailable(f"{_URL}: rediss+sentinel:// (TLS to Sentinel) is not supported yet")
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
    return SentinelTarget(sentinels, path[0], db, username, password)


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


def _sentinel_kwargs(sentinel_password: str | None) -> dict[str, Any]:
    # No retries against one sentinel: the next sentinel in the list is the retry.
    kwargs: dict[str, Any] = {
        "socket_timeout": SENTINEL_TIMEOUT,
        "socket_connect_timeout": SENTINEL_TIMEOUT,
    }
    if sentinel_password is not None:
        kwargs["password"] = sentinel_password
    return kwargs


def sentinel_client(target: SentinelTarget, sentinel_password: str | None, **kwargs: Any) -> redis.Redis:
    """A client of the service's primary, wherever the sentinels say it is now."""
    sentinel_kwargs = {**_sentinel_kwargs(sentinel_password), "retry": Retry(NoBackoff(), 0)}
    manager = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)
    return manager.master_for(
        target.service,
        redis_class=_OwningRedis,
        connection_class=_DisconnectingConnection,
        **target.primary_kwargs(),
        **kwargs,
    )


def sentinel_client_async(
    target: SentinelTarget, sentinel_password: str | None, **kwargs: Any
) -> redis.asyncio.Redis:
    """The asyncio twin of `sentinel_client` (redis-py's async connection already disconnects)."""
    sentinel_kwargs = {
        **_sentinel_kwargs(sentinel_password),
        "retry": redis.asyncio.retry.Retry(NoBackoff(), 0),
    }
    manager = redis.asyncio.sentinel.Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)
    return manager.master_for(
        target.service, redis_class=_OwningAsyncRedis, **target.primary_kwargs(), **kwargs
    )


def sentinel_problem(
    target: SentinelTarget, sentinel_password: str | None, described: str
) -> RedisUnavailable:
    """Why no primary was found: a configuration error (`RedisUnavailable`) or an outage.

    Asks every sentinel once, directly. Any sentinel that knows the service means a
    failover is under way (or the primary is down): an outage (`RedisUnreachable`,
    itself a `RedisUnavailable`). Otherwise a refused
    login, a server that is not a sentinel, or a service nobody monitors is the
    operator's to fix, and waiting would never fix it.
    """
    answers = [_ask(host, port, target.service, sentinel_password) for host, port in target.sentinels]
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


def _ask(host: str, port: int, service: str, password: str | None) -> str:
    """One sentinel's word on the service: knows, unknown, refused, not a sentinel, or away."""
    probe = redis.Redis(host, port, **_sentinel_kwargs(password), retry=Retry(NoBackoff(), 0))
    try:
        probe.execute_command("SENTINEL", "MASTER", service)
    except redis.AuthenticationError:
        return "refused"
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return "away"
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
