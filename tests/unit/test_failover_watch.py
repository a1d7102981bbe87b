"""A wait under Sentinel follows the failover: a new primary named ends the back-off's sleep, and
while a failover is under way or the primary is new in its role the steps stay short.

The rules of `storage.failover.PrimaryWatch` with a scripted sentinel and a clock that moves
only as the wait sleeps; the real sentinels are in tests/ha/test_failover_watch.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from dispatchq.settings import Settings, load_settings
from dispatchq.storage import outage as outage_module
from dispatchq.storage.failover import (
    POLL_S,
    SETTLED_STEP,
    Named,
    PrimaryWatch,
    primary_watch,
    read_master_reply,
)
from dispatchq.storage.outage import Backoff, OutageLog, wait_for_redis

OLD = ("10.0.0.1", 6379)
NEW = ("10.0.0.2", 6379)
NOREPLICAS = redis.ResponseError("NOREPLICAS Not enough good replicas to write.")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _watch(answers: Callable[[float], Named | None], clock: _Clock, settle: float = 30.0) -> PrimaryWatch:
    return PrimaryWatch(lambda: answers(clock.now), clock=clock, settle=settle)


def test_a_move_is_another_address_than_the_round_tried_and_is_asked_at_most_every_poll() -> None:
    clock = _Clock()
    asked: list[float] = []

    def answers(now: float) -> Named | None:
        asked.append(now)
        return Named(NEW if now >= 2 else OLD, age=100)

    watch = _watch(answers, clock)
    watch.before_round()
    assert not watch.moved()  # asked a moment ago: no new question
    clock.now = POLL_S
    assert not watch.moved()  # the same primary
    clock.now = 2.0
    assert watch.moved()
    assert watch.tried is not None and watch.tried.address == NEW
    clock.now = 3.0
    assert not watch.moved()  # the new one is now the one to compare with
    assert asked == [0.0, POLL_S, 2.0, 3.0]


def test_a_sentinel_that_does_not_answer_is_no_news_and_one_that_answers_again_is() -> None:
    clock = _Clock()
    plan: list[Named | None] = [None, None, Named(OLD, age=100)]
    watch = _watch(lambda now: plan.pop(0), clock)
    watch.before_round()  # nobody answered as the round began
    clock.now = 1.0
    assert not watch.moved()
    clock.now = 2.0
    assert watch.moved()  # the sentinels answer again: worth a round at once


def test_the_steps_are_capped_while_the_primary_is_new_or_a_failover_is_under_way() -> None:
    clock = _Clock()
    fresh = _watch(lambda now: Named(NEW, age=2.0), clock)
    fresh.before_round()
    assert fresh.ceiling() == SETTLED_STEP
    clock.now = 27.9
    assert fresh.ceiling() == SETTLED_STEP  # 29.9 s in the role
    clock.now = 28.1
    assert fresh.ceiling() is None  # settled: the back-off is the outage's own again

    clock.now = 0.0
    old = _watch(lambda now: Named(OLD, age=500.0), clock)
    old.before_round()
    assert old.ceiling() is None
    failing = _watch(lambda now: Named(OLD, age=500.0, failing_over=True), clock)
    failing.before_round()
    assert failing.ceiling() == SETTLED_STEP
    silent = _watch(lambda now: None, clock)
    silent.before_round()
    assert silent.ceiling() is None


def test_the_sentinel_master_reply_is_read_as_redis_py_gives_it_and_as_the_wire_does() -> None:
    mapping = {
        b"name": b"dq",
        b"ip": b"127.0.0.1",
        b"port": b"7001",
        b"flags": b"master",
        b"role-reported-time": b"2500",
    }
    assert read_master_reply(mapping) == Named(("127.0.0.1", 7001), 2.5, False)
    flat = [
        "ip",
        "10.0.0.2",
        "port",
        "6380",
        "flags",
        "master,failover_in_progress",
        "role-reported-time",
        "0",
    ]
    assert read_master_reply(flat) == Named(("10.0.0.2", 6380), 0.0, True)
    assert read_master_reply({b"ip": b"127.0.0.1"}) is None
    assert read_master_reply(["ip"]) is None
    assert read_master_reply(b"OK") is None


def test_only_a_sentinel_url_has_a_watch(tmp_path: Path) -> None:
    plain = load_settings(
        {"DISPATCHQ_REDIS_URL": "redis://127.0.0.1:1/0", "DISPATCHQ_DATA_DIR": str(tmp_path)}
    )
    assert primary_watch(plain) is None
    sentinel = load_settings(
        {"DISPATCHQ_REDIS_URL": "redis+sentinel://127.0.0.1:1/dq", "DISPATCHQ_DATA_DIR": str(tmp_path)}
    )
    assert isinstance(primary_watch(sentinel), PrimaryWatch)


class _Primary:
    """A client whose probe write is refused until `writable()` says otherwise."""

    def __init__(self, writable: Callable[[], bool]) -> None:
        self.writable = writable

    def set(self, *args: object, **kwargs: object) -> None:
        if not self.writable():
            raise NOREPLICAS

    def close(self) -> None:
        pass


def _wait(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    watch: PrimaryWatch,
    clock: _Clock,
    writable: Callable[[], bool],
    first: float,
) -> tuple[list[float], list[str]]:
    """Run `wait_for_redis` on a sentinel URL with a scripted primary; the steps it announced
    and the rounds' times. The clock moves only as the wait sleeps."""
    rounds: list[str] = []

    def connect(settings: Settings) -> _Primary:
        rounds.append(f"{clock.now:.1f}")
        return _Primary(writable)

    def sleep(seconds: float) -> None:
        clock.now += seconds

    monkeypatch.setattr(outage_module, "connect", connect)
    monkeypatch.setattr(outage_module.time, "monotonic", clock)
    settings = load_settings(
        {"DISPATCHQ_REDIS_URL": "redis+sentinel://127.0.0.1:1/dq", "DISPATCHQ_DATA_DIR": str(tmp_path)}
    )
    log = logging.getLogger("test.failover-watch")
    outage = OutageLog(settings.describe_redis(), log, backoff=Backoff(first=first, cap=600))
    steps: list[float] = []
    real_step = outage.step

    def step(error: BaseException, ceiling: float | None = None) -> float:
        steps.append(real_step(error, ceiling))
        return steps[-1]

    monkeypatch.setattr(outage, "step", step)
    client = wait_for_redis(
        settings, log=log, stopping=lambda: clock.now > 1000, sleep=sleep, outage=outage, watch=watch
    )
    assert client is not None, f"the wait gave up at {clock.now} s; rounds at {rounds}"
    return steps, rounds


def test_a_wait_asleep_in_a_long_step_tries_the_new_primary_as_soon_as_the_sentinels_name_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = _Clock()
    # Settled primaries (no cap): only the move can end the 60 s sleep early.
    watch = _watch(lambda now: Named(NEW if now >= 1.5 else OLD, age=500), clock, settle=0)
    with caplog.at_level(logging.INFO, logger="test.failover-watch"):
        steps, rounds = _wait(tmp_path, monkeypatch, watch, clock, lambda: clock.now >= 1.5, first=60)
    assert steps == [60]
    assert len(rounds) == 2 and float(rounds[1]) < 60  # the second round did not wait the step out
    assert any("new primary at 10.0.0.2:6379" in r.getMessage() for r in caplog.records)


def test_a_wait_that_began_after_the_move_tries_a_new_primary_every_second_until_it_takes_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    watch = _watch(lambda now: Named(NEW, age=3.0 + now), clock)
    steps, rounds = _wait(tmp_path, monkeypatch, watch, clock, lambda: clock.now >= 6.2, first=0.5)
    assert steps == [0.5, 1, 1, 1, 1, 1, 1]  # not 0.5, 1, 2, 4: a grown step would sleep past it
    assert len(rounds) == len(steps) + 1


def test_a_wait_on_a_settled_primary_keeps_its_back_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    watch = _watch(lambda now: Named(OLD, age=500.0), clock)
    steps, _ = _wait(tmp_path, monkeypatch, watch, clock, lambda: clock.now >= 6.2, first=0.5)
    assert steps == [0.5, 1, 2, 4]
