"""Redis belongs to `dispatchq/storage/`: no command, Lua script or key name outside it.

The import-linter contract keeps `storage.keys` and `storage.scripts` inside the room; this
scan catches what an import cannot: a Redis command called on a client or pipeline, a Lua
script, a key name written out by hand. It reads `dispatchq/` and `jobs/` (without
`storage/`) with `ast`, so a string in a docstring is not mistaken for a call.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Redis commands as redis-py names them (the ones a reader would call on a client).
COMMANDS = frozenset(
    [
        "append",
        "bitcount",
        "blmove",
        "blpop",
        "brpop",
        "dbsize",
        "decr",
        "decrby",
        "delete",
        "eval",
        "evalsha",
        "execute",
        "exists",
        "expire",
        "expireat",
        "flushall",
        "flushdb",
        "get",
        "getdel",
        "getset",
        "hdel",
        "hexists",
        "hget",
        "hgetall",
        "hincrby",
        "hincrbyfloat",
        "hkeys",
        "hlen",
        "hmget",
        "hmset",
        "hscan",
        "hscan_iter",
        "hset",
        "hsetnx",
        "hvals",
        "incr",
        "incrby",
        "incrbyfloat",
        "info",
        "keys",
        "lindex",
        "linsert",
        "llen",
        "lmove",
        "lpop",
        "lpos",
        "lpush",
        "lrange",
        "lrem",
        "lset",
        "ltrim",
        "mget",
        "mset",
        "msetnx",
        "multi",
        "persist",
        "pexpire",
        "pipeline",
        "ping",
        "psubscribe",
        "pttl",
        "publish",
        "pubsub",
        "register_script",
        "rename",
        "renamenx",
        "rpop",
        "rpoplpush",
        "rpush",
        "sadd",
        "scan",
        "scan_iter",
        "scard",
        "sdiff",
        "set",
        "setex",
        "setnx",
        "sinter",
        "sismember",
        "smembers",
        "smismember",
        "spop",
        "srandmember",
        "srem",
        "sscan",
        "sscan_iter",
        "strlen",
        "subscribe",
        "sunion",
        "transaction",
        "ttl",
        "type",
        "unlink",
        "unwatch",
        "watch",
        "xadd",
        "xrange",
        "zadd",
        "zcard",
        "zcount",
        "zincrby",
        "zpopmax",
        "zpopmin",
        "zrange",
        "zrangebyscore",
        "zrank",
        "zrem",
        "zremrangebyrank",
        "zremrangebyscore",
        "zrevrange",
        "zrevrangebyscore",
        "zscan",
        "zscan_iter",
        "zscore",
    ]
)
#: What a Redis client or pipeline is called in this code base.
RECEIVERS = frozenset({"redis", "_redis", "client", "connection", "conn", "pipe", "pipeline", "reader"})
#: Calls that mean Lua whatever they are called on.
LUA_CALLS = frozenset({"register_script", "eval", "evalsha"})
KEY_LITERAL = re.compile(r"^(dispatchq|rq|rq-scheduler):[a-z]")
LUA_TEXT = re.compile(r"redis\.p?call\s*\(")


def _receiver(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def violations(source: str, name: str) -> list[str]:
    """Every Redis command call, Lua script and key-name literal in `source`, one line each."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method, receiver = node.func.attr, _receiver(node.func.value)
            if method in LUA_CALLS or (method in COMMANDS and receiver in RECEIVERS):
                found.append(f"{name}:{node.lineno}: {receiver}.{method}(...)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if KEY_LITERAL.match(node.value):
                found.append(f"{name}:{node.lineno}: key name {node.value!r}")
            elif LUA_TEXT.search(node.value):
                found.append(f"{name}:{node.lineno}: a Lua script")
    return found


def _outside_storage() -> list[Path]:
    files = [*sorted((ROOT / "dispatchq").rglob("*.py")), *sorted((ROOT / "jobs").rglob("*.py"))]
    return [p for p in files if "storage" not in p.relative_to(ROOT).parts[:2]]


def test_no_redis_command_lua_or_key_outside_storage() -> None:
    found = []
    for path in _outside_storage():
        found += violations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert found == [], "Redis outside dispatchq/storage/ (ask runtime.storage):\n" + "\n".join(found)


def runtime_store_reads(source: str, name: str) -> list[str]:
    """Every `runtime.store` / `rt.store` (the records area by its short name) in `source`."""
    return [
        f"{name}:{node.lineno}: {_receiver(node.value)}.store"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and node.attr == "store"
        and _receiver(node.value) in {"runtime", "rt"}
    ]


def test_dispatchq_asks_storage_records_not_runtime_store() -> None:
    found = []
    for path in _outside_storage():
        found += runtime_store_reads(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert found == [], "ask runtime.storage.records:\n" + "\n".join(found)
    assert runtime_store_reads("runtime.store.get(jid)\nself.runtime.store.prune()", "probe.py")


@pytest.mark.parametrize(
    "line",
    [
        'runtime.redis.hget("x", "in")',
        "self.connection.zrem(key, job.id)",
        "pipe.sadd(name, jid)",
        "client.register_script(LUA)",
        'X = "dispatchq:j:abc"',
        'Y = f"rq:job:{job_id}"',
        "S = \"return redis.call('GET', KEYS[1])\"",
    ],
)
def test_the_scan_sees_each_kind(line: str) -> None:
    assert violations(line, "probe.py"), line


def test_the_scan_leaves_ordinary_code_alone() -> None:
    assert violations('d = {}\nd.get("x")\nq.enqueue(job)\nrecords.get(jid)\n', "ok.py") == []


def test_the_scan_covers_the_rooms_that_used_redis() -> None:
    names = {str(p.relative_to(ROOT)) for p in _outside_storage()}
    assert "dispatchq/queue/dispatch.py" in names and "jobs/tiers.py" in names
    assert not any(n.startswith("dispatchq/storage/") for n in names)
