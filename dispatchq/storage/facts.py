"""What `status` shows of the Redis server itself: version, fsync mode, memory, encoding limit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from dispatchq.core.status import ServerFacts
from dispatchq.core.text import as_text

__all__ = ["server_facts"]


def server_facts(client: redis.Redis) -> ServerFacts:
    """What `status` shows of the server in effect: version, fsync mode, memory.

    Read from the server itself, not from the settings: a server started by another
    process, or configured by hand, is what the data's durability depends on. An ACL
    user without `@dangerous` may not run INFO or CONFIG: what it could not read is
    None, and `redis_unreadable` names the commands refused, instead of a traceback.
    """
    unreadable: list[str] = []

    def read(what: str, call: Callable[[], Any], empty: Any) -> Any:
        try:
            return call()
        except redis.exceptions.NoPermissionError:
            unreadable.append(what)
            return empty

    server = read("INFO server", lambda: client.info("server"), {})
    memory = read("INFO memory", lambda: client.info("memory"), {})
    fsync = read("CONFIG GET appendfsync", lambda: client.config_get("appendfsync").get("appendfsync"), None)
    # Redis 7 names it listpack and still answers the ziplist name; 6.2 knows only that one.
    limit = read(
        "CONFIG GET hash-max-ziplist-value",
        lambda: client.config_get("hash-max-ziplist-value").get("hash-max-ziplist-value"),
        None,
    )
    return ServerFacts(
        redis_version=server.get("redis_version"),
        redis_appendfsync=as_text(fsync) if fsync is not None else None,
        redis_used_memory=int(memory["used_memory"]) if "used_memory" in memory else None,
        redis_maxmemory=int(memory["maxmemory"]) if "maxmemory" in memory else None,
        redis_hash_value_limit=int(limit) if limit is not None else None,
        redis_unreadable=unreadable,
    )
