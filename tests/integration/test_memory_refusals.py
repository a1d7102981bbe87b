"""Under `maxmemory` (noeviction) every write command is refused in one line, whole.

Each case has a redis-server of its own (never the session's shared one): the state a
command would change is set up with room, then the limit is brought below what is used,
the command runs, and not one key may have changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dispatchq.storage import keys
from dispatchq.storage.connection import EmbeddedRedis
from tests.support.helpers import run_cli, write_config

pytestmark = pytest.mark.slow

MESSAGE = "error: Redis is out of memory (maxmemory "
TAIL = ", policy noeviction): nothing was written"


def _everything(client: Any) -> dict[bytes, Any]:
    """Every key's value, by type (not DUMP: a hash's serialised field order may change when
    Redis rehashes it, with nothing written). The write probe aside: it is how a refusal is
    detected."""
    probe = keys.WRITE_PROBE.encode()
    read = {
        b"string": client.get,
        b"hash": client.hgetall,
        b"list": lambda k: client.lrange(k, 0, -1),
        b"set": client.smembers,
        b"zset": lambda k: client.zrange(k, 0, -1, withscores=True),
        b"stream": lambda k: client.xrange(k),
    }
    out: dict[bytes, Any] = {}
    for key in sorted(client.keys("*")):
        if key != probe:
            kind = client.type(key)
            out[key] = (kind, read[kind](key))
    return out


def _cli(env: dict[str, str], *argv: str, stdin: str | None = None) -> Any:
    return run_cli(list(argv), env, input=stdin)


# (command, what has to be there first so the command would write)
COMMANDS = {
    "window close": ["window", "close", "--until", "2h"],
    "window open": ["window", "open"],
    "window open --host": ["window", "open", "--host"],
    "retry": ["retry", "{cancelled}"],
    "cancel": ["cancel", "{queued}"],
    "enqueue -": ["enqueue", "-"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_write_command_under_maxmemory_is_refused_in_one_line_and_writes_nothing(
    name: str, dq_env: dict[str, str], tmp_path: Path, oom_redis: EmbeddedRedis
) -> None:
    env = {**dq_env, "DISPATCHQ_REDIS_URL": oom_redis.url()}
    write_config(tmp_path / "dispatchq.yaml", "kinds:\n  k:\n    check: os.path:exists\n")
    line = json.dumps({"kind": "k", "target": "t"}) + "\n"
    assert _cli(env, "window", "close", "--until", "1h").returncode == 0  # a marker to replace/open
    queued, cancelled = (
        _cli(env, "enqueue", "-", stdin=line + json.dumps({"kind": "k", "target": "u"}) + "\n")
        .stdout.split("\n")[i]
        .split("\t")[1]
        for i in (0, 1)
    )
    assert _cli(env, "cancel", cancelled).returncode == 0
    client = oom_redis.client()
    before = _everything(client)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", str(max(1, used // 2)))  # reached: writes are refused now

    argv = [a.format(queued=queued, cancelled=cancelled) for a in COMMANDS[name]]
    done = _cli(env, *argv, stdin=json.dumps({"kind": "k", "target": "new"}) + "\n")

    client.config_set("maxmemory", "0")
    message = done.stderr.strip()
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in message and len(message.splitlines()) == 1, message
    assert message.startswith(MESSAGE) and TAIL in message, message
    assert done.stdout == ""
    assert _everything(client) == before  # nothing half-written: not one key changed
