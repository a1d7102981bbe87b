"""Every Redis operation of the usage window and the session tier, each behind a name.

The marker hashes, the shared session slots, the probe election, the session lines, the
per-host "cannot start here" reasons, the running-session table, the audit log, the wake
channel and the session counters all live in Redis so that every machine sees the same
window. Keeping each query here (as procrastinate keeps its queries behind one manager)
means the window and the session tier say *what* they do, and a reader looking for the
Lua that keeps the later lift finds it in one file. Key names come from `dispatchq.storage.keys`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from dispatchq.core.priority import DEFAULT_PRIORITY, stored_priority
from dispatchq.core.text import as_text
from dispatchq.storage import keys
from dispatchq.storage.histograms import observe_session
from dispatchq.storage.pools import PoolStore
from dispatchq.storage.scripts import CLEAR_RUNNING
from dispatchq.storage.usage import UsageStore

if TYPE_CHECKING:
    import redis
    from redis.client import PubSub
    from redis.lock import Lock

    from dispatchq.core.judgement import TrailEntry
    from dispatchq.storage.store import Store

__all__ = ["LineEntry", "WindowStore"]

# KEYS: marker hash, scopes set. ARGV: lifts_at, then field/value pairs.
# Keeps the later lift when the window is already closed; returns {moved, lifts_at}.
_RAISE = """
local cur = redis.call('HGET', KEYS[1], 'lifts_at')
local state = redis.call('HGET', KEYS[1], 'state')
if cur and state == 'closed' and tonumber(cur) >= tonumber(ARGV[1]) then
  return {0, cur}
end
local args = {'lifts_at', ARGV[1], 'state', 'closed'}
for i = 2, #ARGV, 2 do
  table.insert(args, ARGV[i]); table.insert(args, ARGV[i+1])
end
redis.call('HSET', KEYS[1], unpack(args))
redis.call('SADD', KEYS[2], KEYS[1])
return {1, ARGV[1]}
"""

# KEYS: slots zset. ARGV: now, lease_until, holder, max. A lease that was not renewed
# (its worker died) frees the slot by itself.
# KEYS: the probe. ARGV: its holder ('' = whoever holds it), the lease in ms. 1 renewed, 0 not held.
_RENEW_PROBE = """
local held = redis.call('GET', KEYS[1])
if not held or (ARGV[1] ~= '' and held ~= ARGV[1]) then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

_SLOT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3]); return 1
end
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3]); return 1
end
return 0
"""


class LineEntry:
    """One judgement at the head of a session line, as admission sees it.

    `urgency` is its class (`dispatchq.core.priority`), which decides who may spend what
    (a credential kept for `urgent` work); `describe` fills it, with `kind` and `status`.
    """

    __slots__ = ("jid", "kind", "line", "member", "not_before", "score", "status", "urgency")

    def __init__(
        self,
        score: float,
        member: str,
        line: str,
        kind: str = "",
        status: str = "",
        not_before: float = 0.0,
        urgency: str = DEFAULT_PRIORITY,
    ) -> None:
        self.score = score
        self.member = member
        self.line = line
        self.jid = member.split(":", 1)[1]
        self.kind = kind
        self.status = status
        self.not_before = not_before
        self.urgency = urgency


class WindowStore:
    """Named Redis operations for the window and the session tier. Knows nothing of settings."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._raise = client.register_script(_RAISE)
        self._slot = client.register_script(_SLOT)
        self._renew_probe = client.register_script(_RENEW_PROBE)
        self._clear_running = client.register_script(CLEAR_RUNNING)
        #: The window's usage as sessions report it (`storage.usage`), on the same client.
        self.usage = UsageStore(client)
        #: The credentials' slots, spend and blocks (`storage.pools`), on the same client.
        self.pool = PoolStore(client)

    def on(self, records: Store) -> WindowStore:
        """The same operations on `records`' client (a holder's bounded one), or this store."""
        return self if records.redis is self.redis else WindowStore(records.redis)

    def observe_session(self, seconds: float) -> None:
        """One session's length, into the `/metrics` histogram (`storage.histograms`)."""
        observe_session(self.redis, seconds)

    # --- markers ------------------------------------------------------------------------
    def marker_fields(self, scope: str) -> dict[str, str]:
        """A scope's marker hash as text (empty when there is none)."""
        return {as_text(k): as_text(v) for k, v in self.redis.hgetall(keys.marker(scope)).items()}

    def marker_keys(self) -> list[str]:
        """The marker hash keys recorded in the scopes set, sorted."""
        return sorted(as_text(k) for k in self.redis.smembers(keys.MARKER_SCOPES))

    @staticmethod
    def scope_of(marker_key: str) -> str:
        """The scope a marker hash key names."""
        return marker_key.removeprefix(keys.marker(""))

    def forget_marker_key(self, marker_key: str) -> None:
        """Drop a scopes-set entry whose marker hash is gone."""
        self.redis.srem(keys.MARKER_SCOPES, marker_key)

    def raise_marker(self, scope: str, lifts_at: float, fields: Mapping[str, str]) -> bool:
        """Close the scope until `lifts_at` unless it is already closed until later; True if moved."""
        flat: list[str] = [repr(lifts_at)]
        for name, value in fields.items():
            flat += [name, value]
        moved, _ = self._raise(keys=[keys.marker(scope), keys.MARKER_SCOPES], args=flat)
        return bool(int(moved))

    def delete_marker(self, scope: str) -> None:
        self.redis.delete(keys.marker(scope))

    def set_marker_fields(self, scope: str, **fields: str) -> None:
        self.redis.hset(keys.marker(scope), mapping=cast("dict[Any, Any]", fields))

    def clear_marker_field(self, scope: str, name: str) -> None:
        self.redis.hdel(keys.marker(scope), name)

    def lift_to_probing(self, scope: str) -> None:
        """The lift instant came: the marker goes to probing and every worker is woken."""
        self.redis.hset(keys.marker(scope), mapping={"state": "probing", "retrigger": ""})
        self.redis.publish(keys.WAKE_CHANNEL, f"lift:{scope}")

    def remove_marker(self, scope: str) -> bool:
        """The window is open: marker, scope entry and probe gone, workers woken, atomically."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.marker(scope))
        pipe.srem(keys.MARKER_SCOPES, keys.marker(scope))
        pipe.delete(keys.probe(scope))
        pipe.publish(keys.WAKE_CHANNEL, f"open:{scope}")
        return bool(pipe.execute()[0])

    def retrigger_lock(self, scope: str) -> Lock:
        """The short lock under which a scope's one retrigger is (re)scheduled.

        Never waited for: a raiser that finds it held leaves a request (below) that the
        holder serves, so sixteen sessions reporting at once cost one holder a few loops
        instead of fifteen waiters a lock timeout.
        """
        return cast("Lock", self.redis.lock(keys.retrigger_lock(scope), timeout=30, blocking=False))

    def request_retrigger(self, scope: str) -> None:
        self.redis.set(keys.retrigger_request(scope), "1", ex=3600)

    def take_retrigger_request(self, scope: str) -> bool:
        """Consume the request; True when there was one."""
        return bool(self.redis.delete(keys.retrigger_request(scope)))

    def retrigger_requested(self, scope: str) -> bool:
        return bool(self.redis.exists(keys.retrigger_request(scope)))

    # --- probes and slots ---------------------------------------------------------------
    def try_probe(self, scope: str, holder: str, lease: float) -> bool:
        """Elect `holder` as the one probe of a lifted scope, across machines, for `lease` seconds."""
        return bool(self.redis.set(keys.probe(scope), holder, nx=True, px=max(1, int(lease * 1000))))

    def end_probe(self, scope: str, holder: str) -> None:
        if as_text(self.redis.get(keys.probe(scope))) == holder:
            self.redis.delete(keys.probe(scope))

    def renew_probe(self, scope: str, lease: float, holder: str | None = None) -> bool:
        """Keep a probe elected `lease` more seconds; with `holder`, only while it is that holder's
        (a probe that lapsed and was won by another is not stretched). False when not renewed."""
        args: list[str | int] = [holder or "", max(1, int(lease * 1000))]
        return bool(self._renew_probe(keys=[keys.probe(scope)], args=args))

    def acquire_slot(self, holder: str, lease: float, limit: int, credential: str = "default") -> bool:
        """Take (or renew) one of a credential's `limit` session slots, shared by every machine."""
        now = time.time()
        return bool(
            self._slot(
                keys=[keys.session_slots(credential)], args=[repr(now), repr(now + lease), holder, str(limit)]
            )
        )

    def release_slot(self, holder: str, credential: str = "default") -> None:
        self.redis.zrem(keys.session_slots(credential), holder)

    # --- audit --------------------------------------------------------------------------
    def append_audit(self, entry: Mapping[str, Any], keep: int) -> None:
        pipe = self.redis.pipeline()
        pipe.lpush(keys.MARKER_AUDIT, json.dumps(entry))
        pipe.ltrim(keys.MARKER_AUDIT, 0, keep - 1)
        pipe.execute()

    def audit_log(self, limit: int) -> list[dict[str, Any]]:
        return [json.loads(as_text(e) or "{}") for e in self.redis.lrange(keys.MARKER_AUDIT, 0, limit - 1)]

    # --- session lines ------------------------------------------------------------------
    def line_heads(self, lines: Iterable[str], count: int) -> list[LineEntry]:
        """The first `count` entries of each line, merged, best first (lowest score)."""
        out = []
        for line in lines:
            heads = cast("list[tuple[bytes, float]]", self.redis.zrange(line, 0, count - 1, withscores=True))
            for member, score in heads:
                out.append(LineEntry(float(score), as_text(member), line))
        out.sort(key=lambda e: (e.score, e.member, e.line))
        return out

    def describe(self, entries: Sequence[LineEntry]) -> None:
        """Fill each entry's kind, status, not-before instant and class from its record, in one
        trip (a record without a class, written before classes existed, is `normal`)."""
        pipe = self.redis.pipeline(transaction=False)
        for entry in entries:
            pipe.hmget(keys.record(entry.jid), "in", "status", "not_before", "urgency")
        for entry, (raw, status, later, urgency) in zip(entries, pipe.execute(), strict=True):
            entry.kind = json.loads(raw)["kind"] if raw else ""
            entry.status = as_text(status) if status else ""
            entry.not_before = float(later) if later else 0.0
            entry.urgency = stored_priority(as_text(urgency))

    def any_waiting(self, lines: Iterable[str]) -> bool:
        return any(self.redis.zcard(line) for line in lines)

    def all_lines(self) -> list[str]:
        """Every host's session line that exists now."""
        return [as_text(k) for k in self.redis.scan_iter(match=keys.SESSION_LINES_PATTERN)]

    def requeue_front(
        self,
        records: Store,
        jid: str,
        status: str,
        *,
        trail: TrailEntry,
        fields: Mapping[str, Any],
        line: str,
        priority: float | None,
        urgency: str | None = None,
        claim: str | None = None,
    ) -> bool:
        """Back to the front of its line and workers woken, in one MULTI, with nothing charged.

        With a holder's `claim`, only while the record still carries it: a refused move puts
        nothing in the line (the line entry is added only after the fenced move, in the same
        MULTI, and taken out again when the move did not happen). False when not moved.
        """
        pipe = self.redis.pipeline(transaction=True)
        pipe.multi()
        records.transition(
            jid, status, expect=["running"], trail=trail, fields=dict(fields), pipe=pipe, claim=claim
        )
        records.add_to_line(jid, line, priority, urgency=urgency, front=True, pipe=pipe)
        pipe.publish(keys.WAKE_CHANNEL, "work")
        moved, member, _ = pipe.execute()
        if int(moved) == 1:
            return True
        # Not moved (refused, or no longer running): a running or finished record is in no line.
        status_now = as_text(self.redis.hget(keys.record(jid), "status"))
        if status_now not in ("queued", "waiting"):
            self.redis.zrem(line, as_text(member) or "")
        if int(moved) < 0:
            records.note_refused(jid, claim or "", f"the move to {status}")
        return False

    # --- running sessions, blocked hosts, counters, wake-ups ----------------------------
    def set_running(self, jid: str, info: Mapping[str, Any]) -> None:
        self.redis.hset(keys.SESSION_RUNNING, jid, json.dumps(info))

    def clear_running(self, jid: str, claim: str | None = None) -> None:
        """Forget a judgement's running-here entry; with `claim`, only the entry that holder wrote."""
        if claim is None:
            self.redis.hdel(keys.SESSION_RUNNING, jid)
            return
        self._clear_running(keys=[keys.SESSION_RUNNING], args=[jid, claim])

    def running(self) -> dict[str, Any]:
        return {
            as_text(k): json.loads(as_text(v) or "{}")
            for k, v in self.redis.hgetall(keys.SESSION_RUNNING).items()
        }

    def blocked_reason(self, host: str) -> str | None:
        """Why sessions cannot start on `host` (a missing executable), or None."""
        value = self.redis.hget(keys.SESSION_BLOCKED, host)
        return as_text(value) if value else None

    def block(
        self, host: str, reason: str, *, fingerprint: str = "", probe_after: float | None = None
    ) -> None:
        """Block sessions on `host` with `reason`; its next probe is due in `probe_after` seconds."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.SESSION_BLOCKED, host, reason)
        pipe.hset(keys.SESSION_BLOCKED_BY, host, fingerprint)
        if probe_after is not None:
            pipe.set(
                keys.session_host_probe(host), repr(time.time() + probe_after), ex=max(1, int(probe_after))
            )
        pipe.execute()

    def unblock(self, host: str) -> bool:
        """Clear the host's block; True if there was one."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(keys.SESSION_BLOCKED, host)
        pipe.hdel(keys.SESSION_BLOCKED_BY, host)
        pipe.delete(keys.session_host_probe(host))
        pipe.publish(keys.WAKE_CHANNEL, f"unblock:{host}")
        return bool(pipe.execute()[0])

    def blocked_fingerprint(self, host: str) -> str | None:
        value = self.redis.hget(keys.SESSION_BLOCKED_BY, host)
        return as_text(value) if value is not None else None

    def try_host_probe(self, host: str, interval: float) -> bool:
        """Claim a blocked host's periodic probe (once per `interval`, across processes)."""
        due = repr(time.time() + interval)
        return bool(self.redis.set(keys.session_host_probe(host), due, nx=True, ex=max(1, int(interval))))

    def host_probe_due(self, host: str) -> float | None:
        """When the blocked host's next probe is due (epoch seconds), None when due now."""
        value = self.redis.get(keys.session_host_probe(host))
        return float(as_text(value)) if value else None

    def blocked(self) -> dict[str, str]:
        return {as_text(k): as_text(v) for k, v in self.redis.hgetall(keys.SESSION_BLOCKED).items()}

    def count_spawned(self) -> None:
        self.redis.incr(keys.STATS_SESSIONS_SPAWNED)

    def count_refused(self) -> None:
        self.redis.incr(keys.STATS_SESSIONS_REFUSED)

    def session_counts(self) -> tuple[int, int]:
        """(sessions spawned, sessions refused at spawn) since the store was created."""
        spawned, refused = self.redis.mget([keys.STATS_SESSIONS_SPAWNED, keys.STATS_SESSIONS_REFUSED])
        return int(spawned or 0), int(refused or 0)

    def subscribe_wake(self) -> PubSub:
        """A subscription to the wake channel (a marker came down or work arrived)."""
        pubsub: PubSub = self.redis.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(keys.WAKE_CHANNEL)
        return pubsub
