"""The decision gate's Redis state, behind one gateway with a method per operation.

The findings room keeps four kinds of state in Redis: dispatchq's own copy of the lines it
wrote into a report (tamper evidence), the per-checkout dispatch log (pin attribution), the
approvals of out-of-boundary checks, and each fixer attempt's own state. Keeping every read
and write here, named for what it means, is what lets the findings code hold no Redis client
calls at all (and lets a test see every key the gate touches in one file).

Values cross this boundary as text: JSON encoding and decoding stays with the callers that
know the shapes.
"""

from __future__ import annotations

from collections.abc import Mapping

import redis
from redis.typing import EncodableT, FieldT

from dispatchq.core.text import as_text
from dispatchq.storage import keys
from dispatchq.storage.locks import LeasedLock

__all__ = [
    "ATTEMPT_TTL",
    "FindingsStore",
]

ATTEMPT_TTL = 90 * 86_400  # seconds an attempt's own state outlives its last write


class FindingsStore:
    """Named reads and writes of the findings keys (`dispatchq.storage.keys.findings_*`)."""

    def __init__(self, redis_client: redis.Redis) -> None:
        self.redis = redis_client

    # --- dispatchq's copy of the lines it wrote ------------------------------------------------
    def written_lines(self, repo: str, ref: str) -> str | None:
        """The JSON list of (name, value) lines dispatchq last wrote for a finding, if any."""
        return as_text(self.redis.hget(keys.findings_lines(repo, ref), "lines"))

    def pin_log_position(self, repo: str, ref: str) -> int:
        """How long the dispatch log was when the finding's current pin was written (0: never)."""
        raw = self.redis.hget(keys.findings_lines(repo, ref), "pin_log")
        return int(as_text(raw)) if raw is not None else 0

    def save_lines(self, repo: str, ref: str, lines: str, *, pin_log: int | None = None) -> None:
        """Keep the lines as written; `pin_log` records the log length when the pin changed."""
        mapping: dict[FieldT, EncodableT] = {"lines": lines}
        if pin_log is not None:
            mapping["pin_log"] = str(pin_log)
        self.redis.hset(keys.findings_lines(repo, ref), mapping=mapping)

    # --- the dispatch log ---------------------------------------------------------------------
    def dispatch_log_length(self, repo: str) -> int:
        return int(self.redis.llen(keys.findings_dispatch_log(repo)))

    def append_dispatch(self, repo: str, entry: str) -> int:
        """Append one JSON entry; returns its 1-based position."""
        return int(self.redis.rpush(keys.findings_dispatch_log(repo), entry))

    def dispatches_since(self, repo: str, position: int) -> list[str]:
        """The JSON entries after the first `position`, oldest first."""
        return [as_text(item) for item in self.redis.lrange(keys.findings_dispatch_log(repo), position, -1)]

    # --- approvals of out-of-boundary checks ----------------------------------------------------
    def save_approval(self, repo: str, finding: str, field: str, value: str) -> None:
        self.redis.hset(keys.findings_approval(repo, finding), field, value)

    def approval(self, repo: str, finding: str, field: str) -> str | None:
        return as_text(self.redis.hget(keys.findings_approval(repo, finding), field))

    def revoke_approvals(self, repo: str, finding: str) -> None:
        self.redis.delete(keys.findings_approval(repo, finding))

    # --- the fixer's per-repository lock ------------------------------------------------------
    def repo_lock(self, repo: str, holder: str) -> LeasedLock:
        """The lock that makes fixer dispatch sequential per repository, owned by `holder`."""
        return LeasedLock(self.redis, keys.findings_lock(repo), holder)

    # --- one fixer attempt's own state ----------------------------------------------------------
    @staticmethod
    def attempt_key(repo: str, finding: str, attempt: int) -> str:
        """The name of one fixer attempt's state hash."""
        return keys.findings_attempt(repo, finding, attempt)

    def attempt_fields(self, key: str) -> dict[str, str]:
        """Every field of an attempt's state hash (`keys.findings_attempt`), as text."""
        return {as_text(k): as_text(v) for k, v in self.redis.hgetall(key).items()}

    def save_attempt_fields(self, key: str, fields: Mapping[str, str]) -> None:
        """Write fields of an attempt's state and push its expiry out again."""
        mapping: dict[FieldT, EncodableT] = dict(fields.items())
        self.redis.hset(key, mapping=mapping)
        self.redis.expire(key, ATTEMPT_TTL)

    # --- the session tier's host block, as the gate reads it -------------------------------------
    def session_blocked(self, host: str) -> str | None:
        """Why sessions cannot start on `host`, or None when they can."""
        return as_text(self.redis.hget(keys.SESSION_BLOCKED, host))
