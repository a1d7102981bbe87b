"""The one supervise loop of every long-running role: signals, Redis away said once, the shutdown order."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import redis

from dispatchq import supervise as supervise_module
from dispatchq.errors import UserError
from dispatchq.runtime import Runtime
from dispatchq.settings import Settings, load_settings
from dispatchq.storage import outage as outage_module
from dispatchq.supervise import Done, Ended, Role, supervise

LOG = logging.getLogger("test.supervise")


class _Probe:
    """A client for the loop's wait: its write probe raises `error`, or passes."""

    def __init__(self, error: BaseException | None, writes: list[str]) -> None:
        self.error = error
        self.writes = writes

    def set(self, *args: Any, **kwargs: Any) -> None:
        self.writes.append("probe")
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        pass

    def info(self, section: str) -> dict[str, str]:
        return {"maxmemory_human": "1.00M", "maxmemory_policy": "noeviction"}


def _settings(tmp_path: Path) -> Settings:
    return load_settings(
        {"DISPATCHQ_REDIS_URL": "redis://127.0.0.1:1/0", "DISPATCHQ_DATA_DIR": str(tmp_path)}
    )


def _runtime(tmp_path: Path, accepts: Callable[[], bool] = lambda: True) -> Runtime:
    writes: list[str] = []
    return cast(
        Runtime,
        SimpleNamespace(
            settings=_settings(tmp_path),
            redis=_Probe(None, writes),
            storage=SimpleNamespace(records=SimpleNamespace(accepts_writes=accepts)),
        ),
    )


def _rounds(*steps: BaseException | float | Done, seen: list[str]) -> Callable[[], float | Done]:
    """A round that raises or returns each step in turn, noting each call in `seen`."""
    plan = list(steps)

    def round_() -> float | Done:
        seen.append("round")
        step = plan.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    return round_


def test_a_stop_ends_the_round_then_closes_then_restores_the_handlers(
    tmp_path: Path, supervise_clock: list[float]
) -> None:
    seen: list[str] = []
    before = signal.getsignal(signal.SIGTERM)

    def round_() -> float:
        seen.append("round")
        if len(seen) == 1:
            # As RQ's loop does while it runs: its own handler, left installed after.
            signal.signal(signal.SIGTERM, lambda *_: seen.append("the round's own handler"))
            return 1.0
        signal.raise_signal(signal.SIGTERM)  # the loop's handler is back: it takes it
        seen.append("the round's warm end")
        return 1.0

    def close() -> None:
        assert signal.getsignal(signal.SIGTERM) is not before, "handlers restored before close"
        seen.append("close")

    role = Role("the test role", round_, close=close)
    assert supervise(_runtime(tmp_path), role, log=LOG, sleep=supervise_clock.append) == 0
    assert seen == ["round", "round", "the round's warm end", "close"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_between_rounds_is_the_loops_even_after_a_round_installed_its_own(
    tmp_path: Path, supervise_clock: list[float]
) -> None:
    seen: list[str] = []

    def round_() -> float:
        seen.append("round")
        signal.signal(signal.SIGINT, lambda *_: seen.append("the round's own handler"))
        return 5.0

    def sleep(delay: float) -> None:
        supervise_clock.append(delay)
        signal.raise_signal(signal.SIGINT)

    role = Role("the test role", round_, close=lambda: seen.append("close"))
    assert supervise(_runtime(tmp_path), role, log=LOG, sleep=sleep) == 0
    assert seen == ["round", "close"]
    assert supervise_clock == [0.2]  # the pause was cut short at its first step


def test_a_round_that_took_the_stop_itself_ends_the_loop_with_no_round_after(
    tmp_path: Path, supervise_clock: list[float]
) -> None:
    seen: list[str] = []
    role = Role(
        "the test role",
        _rounds(0.0, 0.0, 0.0, seen=seen),
        stopped=lambda: len(seen) == 2,
        close=lambda: seen.append("close"),
    )
    assert supervise(_runtime(tmp_path), role, log=LOG, sleep=supervise_clock.append) == 0
    assert seen == ["round", "round", "close"]


def test_redis_away_is_said_once_waited_on_with_write_probes_and_said_back_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    supervise_clock: list[float],
) -> None:
    away = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    writes: list[str] = []
    answers = [_Probe(away, writes), _Probe(away, writes), _Probe(None, writes)]
    monkeypatch.setattr(outage_module, "connect", lambda settings: answers.pop(0))
    seen: list[str] = []
    role = Role("the test role", _rounds(away, Done(7), seen=seen), close=lambda: seen.append("close"))
    with caplog.at_level(logging.INFO, logger=LOG.name):
        assert supervise(_runtime(tmp_path), role, log=LOG, sleep=supervise_clock.append) == 7
    said = [r.getMessage() for r in caplog.records]
    assert sum("Redis unreachable at redis://127.0.0.1:1/0" in line for line in said) == 1, said
    assert sum(line.startswith("Redis back after") for line in said) == 1, said
    assert len(said) == 2, said
    assert writes == ["probe", "probe", "probe"]  # the wait asked with a write each round
    assert seen == ["round", "round", "close"]
    assert not list((tmp_path / "weather").glob("*.json"))  # the note for `status` went with it


def test_a_blip_that_is_over_at_the_first_probe_is_still_said_and_said_over(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    supervise_clock: list[float],
) -> None:
    writes: list[str] = []
    monkeypatch.setattr(outage_module, "connect", lambda settings: _Probe(None, writes))
    seen: list[str] = []
    role = Role("the test role", _rounds(redis.TimeoutError("Timeout reading"), Done(), seen=seen))
    with caplog.at_level(logging.INFO, logger=LOG.name):
        assert supervise(_runtime(tmp_path), role, log=LOG, sleep=supervise_clock.append) == 0
    said = [r.getMessage() for r in caplog.records]
    assert [line.split(" at ")[0] for line in said] == ["Redis unreachable", "Redis back after 0.0 s"], said
    assert writes == ["probe"]


def test_out_of_memory_is_said_once_probed_each_step_and_said_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, supervise_clock: list[float]
) -> None:
    answers = [False, False, True]
    seen: list[str] = []
    full = redis.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
    role = Role("the test role", _rounds(full, Done(), seen=seen))
    with caplog.at_level(logging.INFO, logger=LOG.name):
        supervise(_runtime(tmp_path, lambda: answers.pop(0)), role, log=LOG, sleep=supervise_clock.append)
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith("Redis is out of memory (maxmemory 1.00M, policy noeviction)"), said
    assert said[1].startswith("Redis has room again after"), said
    assert len(said) == 2 and answers == [] and seen == ["round", "round"]
    assert supervise_clock and sum(supervise_clock) == pytest.approx(0.5 + 1 + 2)


def test_a_fault_is_one_line_and_the_round_starts_again_after_a_back_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, supervise_clock: list[float]
) -> None:
    seen: list[str] = []
    role = Role(
        "the test role",
        _rounds(RuntimeError("boom\nsecond line"), Ended(), Done(), seen=seen),
    )
    with caplog.at_level(logging.INFO, logger=LOG.name):
        assert supervise(_runtime(tmp_path), role, log=LOG, sleep=supervise_clock.append) == 0
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        ("ERROR", "the test role's loop failed (RuntimeError: boom); starting it again in 0 s"),
        ("WARNING", "the test role's loop ended unexpectedly; starting it again"),
    ]
    assert sum(supervise_clock) == pytest.approx(0.5 + 1)  # the back-off grew between them
    assert seen == ["round", "round", "round"]


def test_a_configuration_mistake_is_raised_after_the_roles_last_step(
    tmp_path: Path, supervise_clock: list[float]
) -> None:
    seen: list[str] = []
    before = signal.getsignal(signal.SIGINT)
    mistake = UserError("DISPATCHQ_X: wrong")
    role = Role("the test role", _rounds(mistake, seen=seen), close=lambda: seen.append("close"))
    with pytest.raises(UserError, match="DISPATCHQ_X"):
        supervise(_runtime(tmp_path), role, log=LOG, sleep=supervise_clock.append)
    assert seen == ["round", "close"]
    assert signal.getsignal(signal.SIGINT) is before


def test_a_clean_round_waits_what_it_asked_and_a_stop_cuts_the_wait_short(
    tmp_path: Path, supervise_clock: list[float]
) -> None:
    stop = supervise_module.threading.Event()
    seen: list[str] = []

    def sleep(delay: float) -> None:
        supervise_clock.append(delay)
        if sum(supervise_clock) >= 1.0:
            stop.set()

    role = Role("the test role", _rounds(0.4, 5.0, 0.0, seen=seen))
    assert supervise(_runtime(tmp_path), role, log=LOG, sleep=sleep, stop=stop) == 0
    assert seen == ["round", "round"]
    assert sum(supervise_clock) == pytest.approx(1.0)
