"""The counters' 24-hour history: one sample a minute whoever samples, trimmed, gaps kept."""

from __future__ import annotations

from typing import Any

from dispatchq.storage import keys
from dispatchq.storage.history import HISTORY_SECONDS, read_history, record_sample, series

T0 = 1_800_000_000.0  # a minute boundary, far from today's clock (the history is keyed by minute)


def test_two_schedulers_sampling_the_same_minute_write_one_sample(redis_client: Any) -> None:
    assert record_sample(redis_client, T0 + 5, window_closed=False) is True
    assert record_sample(redis_client, T0 + 40, window_closed=True) is False  # same minute: refused
    (point,) = read_history(redis_client, T0 + 60)
    assert point.at == T0 and point.values["closed"] == 0


def test_deltas_per_minute_gaps_as_gaps_and_closed_bands(redis_client: Any) -> None:
    redis_client.set(keys.answered_counter("typed"), 10)
    record_sample(redis_client, T0, window_closed=False)
    redis_client.incrby(keys.answered_counter("typed"), 3)
    redis_client.incr(keys.STATS_SESSIONS_SPAWNED)
    record_sample(redis_client, T0 + 60, window_closed=True)
    redis_client.incr(keys.STATS_SESSIONS_REFUSED)
    record_sample(redis_client, T0 + 300, window_closed=True)  # minutes 2-4 never sampled
    rows = series(read_history(redis_client, T0 + 300))
    assert rows[0]["answered:typed"] == 3 and rows[0]["spawned"] == 1 and rows[0]["closed"] is True
    assert rows[1] == {"at": T0 + 120, "gap": True}
    assert rows[2]["refused"] == 1 and rows[2]["answered:typed"] == 0


def test_samples_older_than_a_day_are_trimmed_on_write(redis_client: Any) -> None:
    record_sample(redis_client, T0, window_closed=False)
    record_sample(redis_client, T0 + HISTORY_SECONDS + 120, window_closed=False)
    assert redis_client.xlen("dispatchq:history") == 1
