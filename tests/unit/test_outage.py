"""Redis outages are named, backed off from, and said once; memory refusals are one line."""

from __future__ import annotations

import json
import logging

import pytest
import redis

from dispatchq.errors import RedisUnavailable, RedisUnreachable, UserError
from dispatchq.process import logs
from dispatchq.storage.outage import (
    Backoff,
    MemoryLog,
    OutageLog,
    is_out_of_memory,
    is_outage,
    out_of_memory_message,
)


@pytest.mark.parametrize(
    "error",
    [
        redis.ConnectionError("Error 111 connecting to x. Connection refused."),
        redis.BusyLoadingError("Redis is loading the dataset in memory"),
        redis.TimeoutError("Timeout reading from socket"),
        redis.ReadOnlyError("You can't write against a read only replica."),
        RedisUnreachable("cannot reach Redis at unix:///x: refused"),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
)
def test_these_are_outages(error: BaseException) -> None:
    assert is_outage(error)


@pytest.mark.parametrize(
    "error",
    [
        redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        redis.OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'."),
        RedisUnavailable("DISPATCHQ_REDIS_URL: invalid scheme"),  # configuration: exit 2, never waited on
        ValueError("bug"),
    ],
)
def test_these_are_not(error: BaseException) -> None:
    assert not is_outage(error)


def test_an_outage_wrapped_by_another_error_is_still_one() -> None:
    try:
        try:
            raise redis.ConnectionError("refused")
        except redis.ConnectionError as inner:
            raise RuntimeError("job failed") from inner
    except RuntimeError as outer:
        assert is_outage(outer)


def test_a_bad_url_is_a_user_error_and_an_unreachable_server_is_a_kind_of_it() -> None:
    assert issubclass(RedisUnreachable, RedisUnavailable) and issubclass(RedisUnavailable, UserError)


def test_out_of_memory_is_one_line_naming_the_limit_and_policy() -> None:
    class Info:
        def info(self, section: str) -> dict[str, object]:
            assert section == "memory"
            return {"maxmemory_human": "20.00M", "maxmemory_policy": "noeviction"}

    error = redis.OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'.")
    assert out_of_memory_message(error, Info()) == (  # type: ignore[arg-type]
        "Redis is out of memory (maxmemory 20.00M, policy noeviction): nothing was written"
    )
    assert out_of_memory_message(redis.ResponseError("OOM command not allowed"), None) is not None
    assert out_of_memory_message(redis.ResponseError("WRONGTYPE"), None) is None


def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(first=0.5, cap=4)
    assert [backoff.next() for _ in range(6)] == [0.5, 1, 2, 4, 4, 4]
    backoff.reset()
    assert backoff.next() == 0.5


def test_an_outage_is_said_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("test.outage")
    outage = OutageLog("unix:///data/redis.sock", log)
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        for delay in (0.5, 1, 2, 4):
            outage.down(redis.ConnectionError("Error 111 connecting to x. Connection refused."), delay)
        outage.up()
        outage.up()  # nothing to say twice
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "Redis unreachable at unix:///data/redis.sock (Error 111), retrying in 0.5 s"
    assert messages[-1].startswith("Redis back after ")
    assert len(messages) == 2


def test_a_growing_backoff_says_it_is_still_down(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.outage2")
    outage = OutageLog("redis://r:6379/0", log)
    with caplog.at_level(logging.WARNING, logger="test.outage2"):
        for delay in (0.5, 1, 2, 4, 8, 16, 30, 30):
            outage.down(redis.TimeoutError("Timeout"), delay)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "Redis unreachable at redis://r:6379/0 (Timeout), retrying in 0.5 s",
        "Redis still unreachable at redis://r:6379/0, retrying in 8 s",
        "Redis still unreachable at redis://r:6379/0, retrying in 16 s",
        "Redis still unreachable at redis://r:6379/0, retrying in 30 s",
    ]


def _emit(fmt: str, capsys: pytest.CaptureFixture[str]) -> str:
    import sys

    logs.configure("session", fmt, stream=sys.stderr)
    try:
        logging.getLogger("dispatchq.tiers.session").warning("Redis back after %d s", 12)
        logging.getLogger("rq.worker").info("Worker abc: started")
    finally:
        logging.getLogger().handlers.clear()
    return capsys.readouterr().err


def test_text_logs_are_one_line_with_time_level_role(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _emit("text", capsys).splitlines()
    assert len(lines) == 2
    stamp, level, role, *rest = lines[0].split(" ")
    assert stamp.endswith("Z") and "T" in stamp and level == "WARNING" and role == "session:"
    assert " ".join(rest) == "Redis back after 12 s"
    assert lines[1].split(" ", 3)[1:] == ["INFO", "session:", "Worker abc: started"]  # RQ's own records too


def test_json_logs_have_the_four_keys(capsys: pytest.CaptureFixture[str]) -> None:
    first, second = (json.loads(line) for line in _emit("json", capsys).splitlines())
    assert set(first) == {"time", "level", "role", "message"}
    assert (first["level"], first["role"], first["message"]) == (
        "WARNING",
        "session",
        "Redis back after 12 s",
    )
    assert second["message"] == "Worker abc: started"


def test_out_of_memory_is_found_through_the_chain_of_causes() -> None:
    oom = redis.OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'.")
    try:
        try:
            raise oom
        except redis.OutOfMemoryError as inner:
            raise UserError("enqueue failed") from inner
    except UserError as outer:
        assert is_out_of_memory(outer)
    assert is_out_of_memory(redis.ResponseError("OOM command not allowed"))
    assert not is_out_of_memory(redis.ConnectionError("Error 111"))
    assert not is_out_of_memory(redis.ResponseError("WRONGTYPE"))


def test_memory_refusals_are_said_once_and_so_is_the_room_coming_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("dispatchq.test.memory")
    memory = MemoryLog(log)
    oom = redis.OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'.")
    with caplog.at_level(logging.WARNING, logger=log.name):
        memory.down(oom, 0.5)
        memory.down(oom, 1.0)
        memory.up()
        memory.up()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("Redis is out of memory (maxmemory ?, policy noeviction): nothing was written")
    assert lines[1].startswith("Redis has room again after ")


@pytest.mark.parametrize(
    "text",
    [
        # A Lua script refused at its first write (the marker's, a record's transition).
        "Error running script (call to f_35508e9ade4a50e1960d55a0d8b41b8f0d4fcda6): @user_script:11: "
        "@user_script: 11: -OOM command not allowed when used memory > 'maxmemory'.",
        # A MULTI whose queued command was refused (redis-py names the command).
        "Command # 2 (HSET dispatchq:marker:general) of pipeline caused error: "
        "OOM command not allowed when used memory > 'maxmemory'.",
    ],
)
def test_a_refusal_wrapped_by_a_script_or_a_transaction_is_out_of_memory_too(text: str) -> None:
    assert out_of_memory_message(redis.ResponseError(text)) == (
        "Redis is out of memory (maxmemory ?, policy noeviction): nothing was written"
    )
    assert is_out_of_memory(redis.ResponseError(text))
    assert not is_out_of_memory(redis.ResponseError("Error running script: @user_script:3: WRONGTYPE"))
