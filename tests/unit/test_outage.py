"""Redis outages are named, backed off from, and said once; memory refusals are one line."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import redis

from dispatchq.errors import RedisUnavailable, RedisUnreachable, UserError
from dispatchq.process import logs
from dispatchq.settings import Settings, load_settings
from dispatchq.storage import keys
from dispatchq.storage import outage as outage_module
from dispatchq.storage.outage import (
    Backoff,
    MemoryLog,
    OutageLog,
    is_login_refused,
    is_out_of_memory,
    is_outage,
    out_of_memory_message,
    outage_reason,
    wait_for_redis,
    waiting_here,
    weather_kind,
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
    assert (
        messages[0]
        == "Redis unreachable at unix:///data/redis.sock (Error 111: Connection refused), retrying in 0.5 s"
    )
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

    logs.configure("session", fmt, stream=sys.stderr, rq_info=True)  # RQ's INFO shown, as asked
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


# --- weather: what a long-running process waits out (issue 21) ------------------------------------


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (
            redis.ReadOnlyError("You can't write against a read only replica.", status_code="READONLY"),
            "writes",
        ),
        (redis.ResponseError("NOREPLICAS Not enough good replicas to write."), "writes"),
        (redis.exceptions.MasterDownError("Link with MASTER is down"), "writes"),
        (redis.BusyLoadingError("Redis is loading the dataset in memory"), "writes"),
        (redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"), "writes"),
        (
            redis.ResponseError("UNBLOCKED force unblock from blocking operation, instance state changed"),
            "writes",
        ),
        # A record's transition script refused at its first write on a demoted master.
        (
            redis.ResponseError(
                "Error running script (call to f_35508e9a): @user_script:11: "
                "@user_script: 11: -READONLY You can't write against a read only replica."
            ),
            "writes",
        ),
        (redis.AuthenticationError("invalid username-password pair", status_code="WRONGPASS"), "login"),
        (redis.ResponseError("NOAUTH Authentication required."), "login"),
        (redis.ConnectionError("Error 111 connecting to x. Connection refused."), "unreachable"),
    ],
)
def test_weather_is_named_by_kind(error: BaseException, kind: str) -> None:
    assert weather_kind(error) == kind
    assert is_outage(error)


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.NoPermissionError("this user has no permissions to run the 'set' command"),
        redis.ResponseError("ERR unknown command 'FOO'"),
        redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value READONLYx"),
    ],
)
def test_a_refused_permission_or_a_wrong_request_is_not_weather(error: BaseException) -> None:
    assert weather_kind(error) is None


def _refused_at_login() -> RedisUnavailable:
    # As `connect` raises it: a one-line refusal `from None` over redis-py's AuthenticationError.
    try:
        try:
            raise redis.AuthenticationError("invalid username-password pair")
        except redis.AuthenticationError:
            raise RedisUnavailable("DISPATCHQ_REDIS_URL: Redis at x refused the login") from None
    except RedisUnavailable as refusal:
        return refusal


def test_a_refused_login_is_weather_once_running_and_a_bad_url_never_is() -> None:
    assert is_login_refused(_refused_at_login()) and is_outage(_refused_at_login())
    try:
        try:
            raise redis.ConnectionError("refused")
        except redis.ConnectionError:
            raise RedisUnavailable("DISPATCHQ_REDIS_URL: invalid scheme") from None
    except RedisUnavailable as configuration:
        assert not is_outage(configuration)  # whatever it was raised over


def test_the_reason_keeps_the_code_redis_py_strips() -> None:
    error = redis.ReadOnlyError("You can't write against a read only replica.", status_code="READONLY")
    assert outage_reason(error) == "READONLY You can't write against a read only replica."


class _Refusing:
    """A client whose writes fail with `error` (as a demoted master's do)."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error
        self.writes = 0

    def set(self, *args: object, **kwargs: object) -> None:
        self.writes += 1
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        pass


def _settings(tmp_path: Path) -> Settings:
    return load_settings(
        {"DISPATCHQ_REDIS_URL": "redis://127.0.0.1:1/0", "DISPATCHQ_DATA_DIR": str(tmp_path)}
    )


def test_the_wait_probes_with_a_write_and_keeps_its_back_off_across_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    readonly = redis.ReadOnlyError("You can't write against a read only replica.", status_code="READONLY")
    plan = [_Refusing(readonly), _Refusing(readonly), _Refusing(None)]
    made: list[_Refusing] = []

    def connect(settings: Settings) -> _Refusing:
        made.append(plan.pop(0) if plan else _Refusing(None))
        return made[-1]

    slept: list[float] = []
    monkeypatch.setattr(outage_module, "connect", connect)
    monkeypatch.setattr(outage_module.time, "monotonic", lambda: sum(slept))
    log = logging.getLogger("test.weather")
    outage = OutageLog.for_settings(_settings(tmp_path), log)
    with caplog.at_level(logging.WARNING, logger=log.name):
        outage.down(readonly, 0.5)
        client = wait_for_redis(
            _settings(tmp_path), log=log, stopping=lambda: False, sleep=slept.append, outage=outage
        )
        assert client is made[-1] and [c.writes for c in made] == [1, 1, 1]  # a write each round, not PING
        assert outage.backoff.current == 1
        # Back within one step: READONLY again. The next round waits the next step first.
        outage.down(readonly, 0.5)
        before = sum(slept)
        wait_for_redis(
            _settings(tmp_path), log=log, stopping=lambda: False, sleep=slept.append, outage=outage
        )
    assert sum(slept) - before == pytest.approx(2)  # the 2 s step, not the first one again
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("Redis not writable at redis://127.0.0.1:1/0 (READONLY You can't write")
    assert messages[2].endswith("retrying in 2 s")
    assert len(messages) == 4, messages  # down, back, down, back: two lines per step at most


def test_nopermission_on_the_probe_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = redis.exceptions.NoPermissionError("this user has no permissions to run the 'set' command")
    monkeypatch.setattr(outage_module, "connect", lambda settings: _Refusing(refused))
    with pytest.raises(UserError, match="may not write dispatchq's keys"):
        wait_for_redis(_settings(tmp_path), log=logging.getLogger("t"), stopping=lambda: False)


def test_a_refused_login_stops_a_starting_process_and_is_waited_on_by_a_running_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def connect(settings: Settings) -> _Refusing:
        raise _refused_at_login()

    monkeypatch.setattr(outage_module, "connect", connect)
    settings = _settings(tmp_path)
    with pytest.raises(RedisUnavailable, match="refused the login"):
        wait_for_redis(settings, log=logging.getLogger("t"), stopping=lambda: False, starting=True)
    rounds: list[float] = []
    stop = lambda: len(rounds) >= 3  # noqa: E731
    assert wait_for_redis(settings, log=logging.getLogger("t"), stopping=stop, sleep=rounds.append) is None
    notes = waiting_here(settings)
    assert [n["kind"] for n in notes] == ["login"] and notes[0]["pid"] == os.getpid()


def test_the_probe_key_is_one_per_process_and_not_a_window_probe() -> None:
    assert keys.wait_probe("h1", 42) == "dispatchq:wait-probe:h1:42"
    assert not keys.wait_probe("h1", 42).startswith(keys.probe(""))


def test_a_connection_error_keeps_its_strerror_and_drops_the_address() -> None:
    error = redis.ConnectionError("Error 111 connecting to 10.0.0.5:6379. Connection refused.")
    assert outage_reason(error) == "Error 111: Connection refused"
    named = redis.ConnectionError("Error 113 connecting to :secret@h:1. No route to host.")
    assert "secret" not in outage_reason(named) and outage_reason(named).endswith("No route to host")
