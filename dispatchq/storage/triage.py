"""The rules engine's Redis: decisions, runs, escalations, budgets, the ledger, the recording model.

One gateway for every key under `dispatchq:triage:` (names in `dispatchq.storage.keys`), each
query a named method, so the engine, the executors and the budgets say *what* they
store and never *how*. Values cross this boundary as JSON data (dicts, lists,
strings); turning them into decisions and answers is the engine's business, which is
why this module knows nothing of `dispatchq.triage` (storage sits below it).

Values are stored as compact JSON. That is a serialisation, not a hash: the one
canonical spelling used for hashing is `dispatchq.core.judgement.canonical_json`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from redis import exceptions as redis_errors

from dispatchq.core.text import as_text
from dispatchq.storage import keys

if TYPE_CHECKING:
    import redis

__all__ = ["TriageStorage"]


def _dump(value: Any) -> str:
    """Compact JSON for a stored value; a value that is not JSON data is a bug, so it raises."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _load(raw: Any) -> Any:
    return json.loads(as_text(raw))


class TriageStorage:
    """Every Redis read and write of triage, over one client.

    Layout: one hash per decision (`keys.triage_decision`) indexed by time in
    `TRIAGE_EVENTS`; a capped `TRIAGE_RUNS` list; `TRIAGE_NEEDS_TRIAGE` for escalated
    events; a sorted set per rolling request budget; the ledger hash of performed
    actions and the per-target set of labels dispatchq added; the recording executor's
    model of each target and its write log.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    # -- decisions -------------------------------------------------------------------------
    def decision(self, decision_id: str) -> dict[str, Any] | None:
        """A stored decision, its JSON fields parsed; None when there is none.

        Keys: event, config_hash, answers, unanswered, over_budget, answers_from,
        result (None until resolved), created, updated.
        """
        raw = self._redis.hgetall(keys.triage_decision(decision_id))
        if not raw:
            return None
        data = {as_text(k): as_text(v) for k, v in raw.items()}
        return {
            "event": json.loads(data["event"]),
            "config_hash": data.get("config_hash", ""),
            "answers": json.loads(data.get("answers", "{}")),
            "unanswered": json.loads(data.get("unanswered", "{}")),
            "over_budget": json.loads(data.get("over_budget", "[]")),
            "answers_from": data.get("answers_from", "provider"),
            "result": json.loads(data["result"]) if data.get("result") else None,
            "created": float(data.get("created", 0)),
            "updated": float(data.get("updated", 0)),
        }

    def save_decision(
        self,
        decision_id: str,
        *,
        event: Mapping[str, Any],
        config_hash: str,
        answers: Mapping[str, Any],
        unanswered: Mapping[str, str],
        over_budget: list[str],
        answers_from: str,
        now: float,
    ) -> None:
        """Write a decision's answers (keeping its first `created`) and index it at `now`."""
        key = keys.triage_decision(decision_id)
        pipe = self._redis.pipeline()
        pipe.hsetnx(key, "created", repr(now))
        pipe.hset(
            key,
            mapping={
                "event": _dump(dict(event)),
                "config_hash": config_hash,
                "answers": _dump(dict(answers)),
                "unanswered": _dump(dict(unanswered)),
                "over_budget": _dump(over_budget),
                "answers_from": answers_from,
                "updated": repr(now),
            },
        )
        pipe.zadd(keys.TRIAGE_EVENTS, {decision_id: now})
        pipe.execute()

    def save_decision_result(self, decision_id: str, result: Mapping[str, Any]) -> None:
        self._redis.hset(keys.triage_decision(decision_id), "result", _dump(dict(result)))

    def decision_ids(self, since: float | None = None) -> list[str]:
        """Stored decision ids, oldest first; only those updated at or after `since` if given."""
        low: float | str = since if since is not None else "-inf"
        ids = self._redis.zrangebyscore(keys.TRIAGE_EVENTS, low, "+inf")  # no scores asked: members only
        return [as_text(cast("bytes | str", i)) for i in ids]

    # -- escalations -----------------------------------------------------------------------
    def mark_needs_triage(self, decision_id: str, record: Mapping[str, Any]) -> None:
        self._redis.hset(keys.TRIAGE_NEEDS_TRIAGE, decision_id, _dump(dict(record)))

    def needs_triage(self) -> dict[str, Any]:
        raw = self._redis.hgetall(keys.TRIAGE_NEEDS_TRIAGE)
        return {as_text(k): _load(v) for k, v in raw.items()}

    def clear_needs_triage(self, target: str) -> int:
        """Drop every escalation recorded for `target` (a later delivery decided it); how many."""
        raw = self._redis.hgetall(keys.TRIAGE_NEEDS_TRIAGE)
        gone = [k for k, v in raw.items() if _load(v).get("target") == target]
        return int(self._redis.hdel(keys.TRIAGE_NEEDS_TRIAGE, *gone)) if gone else 0

    def needs_triage_count(self) -> int:
        return int(self._redis.hlen(keys.TRIAGE_NEEDS_TRIAGE))

    # -- runs ------------------------------------------------------------------------------
    def push_run(self, line: Mapping[str, Any], keep: int) -> None:
        """Record one run's outcome counts, newest first, keeping the last `keep`."""
        pipe = self._redis.pipeline()
        pipe.lpush(keys.TRIAGE_RUNS, _dump(dict(line)))
        pipe.ltrim(keys.TRIAGE_RUNS, 0, keep - 1)
        for reason, count in dict(line.get("counts") or {}).items():  # by resolution row, ever
            pipe.hincrby(keys.STATS_TRIAGE_OUTCOMES, reason, int(count))
        pipe.execute()

    def recent_runs(self, limit: int) -> list[Any]:
        return [_load(v) for v in self._redis.lrange(keys.TRIAGE_RUNS, 0, max(0, limit - 1))]

    # -- rolling request budgets (per config and the overall hourly cap) -------------------
    def reserve_budget(
        self, limits: list[tuple[str, int, float]], now: float, member: str
    ) -> tuple[int, int, float | None] | None:
        """Count one request against every `(name, requests, window)` limit, or against none.

        Each limit is a sorted set of counted requests scored by time. Every limit is checked
        and the request counted in all of them in one optimistic transaction (WATCH, retried
        when another process wrote in between), so two processes cannot both take the last
        request. None when counted; else `(index of the spent limit, requests in its window,
        time of the oldest of them)`, the time None when the limit is 0 (it never refills).
        """
        if not limits:
            return None
        names = [keys.triage_budget_log(name) for name, _, _ in limits]
        while True:
            with self._redis.pipeline() as pipe:
                try:
                    pipe.watch(*names)
                    for index, (key, (_, requests, window)) in enumerate(zip(names, limits, strict=True)):
                        in_window = pipe.zrangebyscore(key, f"({now - window!r}", "+inf", withscores=True)
                        if len(in_window) >= requests:
                            oldest = float(in_window[0][1]) if in_window else None
                            return index, len(in_window), oldest
                    pipe.multi()
                    for key, (_, _, window) in zip(names, limits, strict=True):
                        pipe.zremrangebyscore(key, "-inf", now - window)
                        pipe.zadd(key, {member: now})
                        pipe.expire(key, int(window) + 1)
                    pipe.execute()
                    return None
                except redis_errors.WatchError:
                    continue

    def settle_budget(self, names: list[str], member: str, requests: int, now: float, ttl: int) -> None:
        """A reservation's real cost: 0 gives it back, more than 1 counts the extra requests."""
        pipe = self._redis.pipeline()
        for name in names:
            key = keys.triage_budget_log(name)
            if requests <= 0:
                pipe.zrem(key, member)
            for extra in range(1, requests):
                pipe.zadd(key, {f"{member}+{extra}": now})
            pipe.expire(key, ttl)
        pipe.execute()

    def budget_used(self, name: str, window: float, now: float) -> int:
        """Requests counted against a rolling limit within the last `window` seconds."""
        return int(self._redis.zcount(keys.triage_budget_log(name), now - window, "+inf"))

    # -- the ledger of performed actions ---------------------------------------------------
    def ledger_entry(self, fingerprint: str) -> Any:
        """The performed action with this fingerprint, or None."""
        raw = self._redis.hget(keys.TRIAGE_LEDGER, fingerprint)
        return None if raw is None else _load(raw)

    def put_ledger_entry(self, fingerprint: str, entry: Mapping[str, Any]) -> None:
        self._redis.hset(keys.TRIAGE_LEDGER, fingerprint, _dump(dict(entry)))

    def ledger_entries(self) -> list[Any]:
        return [_load(v) for v in self._redis.hvals(keys.TRIAGE_LEDGER)]

    def label_added(self, target: str, label: str) -> bool:
        """Whether dispatchq itself added `label` to `target` (the only labels it may remove)."""
        return bool(self._redis.sismember(keys.triage_labels_added(target), label))

    def note_label_added(self, target: str, label: str) -> None:
        self._redis.sadd(keys.triage_labels_added(target), label)

    def note_label_removed(self, target: str, label: str) -> None:
        self._redis.srem(keys.triage_labels_added(target), label)

    # -- the recording executor's model of targets -----------------------------------------
    def recorded_state(self, target: str) -> Any:
        """The recording executor's stored model of a target, or None when it has none."""
        raw = self._redis.hget(keys.TRIAGE_RECORDED_STATE, target)
        return None if raw is None else _load(raw)

    def put_recorded_state(self, target: str, state: Mapping[str, Any]) -> None:
        self._redis.hset(keys.TRIAGE_RECORDED_STATE, target, _dump(dict(state)))

    def record_write(self, target: str, state: Mapping[str, Any], line: Mapping[str, Any]) -> None:
        """A recorded write: the target's new model and its log line, together."""
        pipe = self._redis.pipeline()
        pipe.hset(keys.TRIAGE_RECORDED_STATE, target, _dump(dict(state)))
        pipe.rpush(keys.TRIAGE_RECORDED, _dump(dict(line)))
        pipe.execute()

    def recorded_writes(self) -> list[Any]:
        return [_load(v) for v in self._redis.lrange(keys.TRIAGE_RECORDED, 0, -1)]
