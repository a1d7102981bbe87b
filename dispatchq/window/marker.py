"""The usage-window marker: a circuit breaker whose reopening time the service tells us.

One Redis hash per limit scope (`general`, or `model:<name>` for a model's own weekly
limit) records when the limit lifts (UTC), the message that said so, its kind and the
session that saw it. While a marker is *closed*, no session in its scope is spawned.

At the lift instant the marker is not simply deleted: the stated time can be wrong
(messages are rounded, some are stale), so the window goes to *probing*, exactly one
session (elected through Redis, across machines) runs first, and only when it shows
the window open is the marker removed and the rest released. If the probe is refused
again the marker goes back up with the new time: one wasted spawn, never N.

Exactly one retrigger is scheduled with rq-scheduler for the lift instant of each
scope (re-scheduled, never duplicated, when the lift moves later). It runs on the
control queue that `dispatchq scheduler` executes itself. Session workers also time
the lift themselves, so a dead scheduler costs nothing but its status line.
"""

from __future__ import annotations

import getpass
import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from dispatchq import keys
from dispatchq.errors import UserError
from dispatchq.window.limits import GENERAL_SCOPE, LimitSignal, reprobe_backoff

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime

AUDIT_LENGTH = 200

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


@dataclass(frozen=True)
class Marker:
    scope: str
    lifts_at: float
    state: str  # "closed" until the lift instant; "probing" after it, until a probe shows it open
    kind: str
    message: str
    session: str | None
    set_at: float
    stated: str
    refusals: int
    source: str
    retrigger: str | None = None

    def closed(self, now: float | None = None) -> bool:
        """True while no session in this scope may start."""
        return self.state == "closed" and (now if now is not None else time.time()) < self.lifts_at

    def public(self, timezone: str) -> dict[str, Any]:
        lifts = datetime.fromtimestamp(self.lifts_at, UTC)
        return {
            "scope": self.scope,
            "up": self.closed(),
            "state": "closed" if self.closed() else "probing",
            "lifts_at": lifts.isoformat(),
            "lifts_at_local": lifts.astimezone(ZoneInfo(timezone)).strftime("%Y-%m-%d %H:%M %Z"),
            "lifts_at_epoch": self.lifts_at,
            "countdown_seconds": max(0, math.ceil(self.lifts_at - time.time())),
            "kind": self.kind,
            "message": self.message,
            "session": self.session,
            "set_at": datetime.fromtimestamp(self.set_at, UTC).isoformat(),
            "source": self.source,
            "refusals": self.refusals,
        }


def _s(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _marker(scope: str, raw: dict[bytes, bytes]) -> Marker | None:
    f = {_s(k): _s(v) for k, v in raw.items()}
    if "lifts_at" not in f:
        return None
    return Marker(
        scope=scope,
        lifts_at=float(f["lifts_at"] or 0),
        state=f.get("state") or "closed",
        kind=f.get("kind") or "unknown",
        message=f.get("message") or "",
        session=f.get("session") or None,
        set_at=float(f.get("set_at") or 0),
        stated=f.get("stated") or "unknown",
        refusals=int(f.get("refusals") or 0),
        source=f.get("source") or "session",
        retrigger=f.get("retrigger") or None,
    )


def scope_of(marker_key: str) -> str:
    return marker_key.removeprefix(keys.marker(""))


def get(runtime: Runtime, scope: str) -> Marker | None:
    return _marker(scope, runtime.redis.hgetall(keys.marker(scope)))


def all_markers(runtime: Runtime) -> list[Marker]:
    out = []
    for key in sorted(_s(k) or "" for k in runtime.redis.smembers(keys.MARKER_SCOPES)):
        scope = scope_of(key)
        marker = get(runtime, scope)
        if marker is None:
            runtime.redis.srem(keys.MARKER_SCOPES, key)
        else:
            out.append(marker)
    return out


def applies(scope: str, model: str | None) -> bool:
    """Does a marker in `scope` pause a session running `model` (None = the account default)?

    The general limit pauses everything. A model's own limit (the Opus weekly limit)
    pauses every kind except one whose session explicitly names another model; a kind on
    the default model is paused by every model scope, since the default may be that model.
    """
    if scope == GENERAL_SCOPE or not scope.startswith("model:"):
        return True
    if model is None:
        return True
    limited = scope.removeprefix("model:").lower()
    return limited in model.lower()


def blocking(markers: Iterable[Marker], model: str | None, now: float | None = None) -> list[Marker]:
    """The markers that currently forbid a spawn for `model`."""
    return [m for m in markers if applies(m.scope, model) and m.closed(now)]


def probing(markers: Iterable[Marker], model: str | None, now: float | None = None) -> list[Marker]:
    """Lifted markers still waiting for a probe to show the window open."""
    return [m for m in markers if applies(m.scope, model) and not m.closed(now)]


def raise_marker(
    runtime: Runtime, signal: LimitSignal, *, session: str | None, source: str = "session", reason: str = ""
) -> Marker:
    """Record that the window is closed until `signal.lifts_at`; keep the later time.

    A refusal seen while the window was being probed with the same stated time as
    before is pushed out by `DISPATCHQ_REPROBE_MIN`, doubling, so a stale "resets 3am"
    message cannot make a spawn loop.
    """
    scope = signal.scope or GENERAL_SCOPE
    current = get(runtime, scope)
    refusals = 1
    if current is not None and not current.closed() and source == "session":
        signal, refusals = reprobe_backoff(
            signal,
            previous_stated=current.stated,
            previous_refusals=current.refusals,
            now=datetime.now(UTC),
            reprobe_min=runtime.settings.reprobe_min,
        )
    fields = {
        "kind": signal.kind,
        "message": signal.message[:1000],
        "session": session or "",
        "set_at": repr(time.time()),
        "stated": signal.stated,
        "refusals": str(refusals),
        "source": source,
        "reason": reason,
    }
    script = runtime.redis.register_script(_RAISE)
    flat: list[str] = [repr(signal.lifts_at.timestamp())]
    for name, value in fields.items():
        flat += [name, value]
    moved, _ = script(keys=[keys.marker(scope), keys.MARKER_SCOPES], args=flat)
    marker = get(runtime, scope)
    assert marker is not None
    if int(moved):
        _audit(runtime, scope, "closed", marker, who=session or source, reason=reason or signal.message)
        schedule_retrigger(runtime, scope)
        _mark_waiting(runtime, marker)
    return marker


def schedule_retrigger(runtime: Runtime, scope: str) -> str | None:
    """Make the scheduled retriggers for `scope` exactly one, at the marker's lift instant.

    Done under a short lock so that concurrent raisers, whatever their order, leave
    one job at the latest time rather than one each.
    """
    from dispatchq.queue.scheduler import scheduler_for

    redis = runtime.redis
    lock = redis.lock(keys.retrigger_lock(scope), timeout=10, blocking_timeout=10)
    with lock:
        marker = get(runtime, scope)
        scheduler = scheduler_for(runtime)
        for job in list(scheduler.get_jobs()):
            if job.func_name == "jobs.tiers.retrigger" and job.args and job.args[0] == scope:
                scheduler.cancel(job)
        if marker is None or not marker.closed():
            redis.hdel(keys.marker(scope), "retrigger")
            return None
        # rq-scheduler keeps whole seconds: round up so it never fires before the lift.
        at = datetime.fromtimestamp(math.ceil(marker.lifts_at), UTC)
        job = scheduler.enqueue_at(
            at,
            "jobs.tiers.retrigger",
            scope,
            marker.lifts_at,
            queue_name=keys.CONTROL_QUEUE,
            timeout=60,
            job_result_ttl=0,
            job_description=f"dispatchq retrigger {scope}",
        )
        redis.hset(keys.marker(scope), "retrigger", job.id)
        return str(job.id)


def retrigger(runtime: Runtime, scope: str, lifts_at: float) -> str:
    """The scheduled job: at the lift instant, take the marker down to probing and wake workers."""
    marker = get(runtime, scope)
    if marker is None:
        return "no marker"
    if marker.closed():
        return f"marker now says {datetime.fromtimestamp(marker.lifts_at, UTC).isoformat()}: nothing to do"
    runtime.redis.hset(keys.marker(scope), mapping={"state": "probing", "retrigger": ""})
    runtime.redis.publish(keys.WAKE_CHANNEL, f"lift:{scope}")
    return "lifted: one probe goes first"


def window_open(runtime: Runtime, scope: str, *, why: str, who: str = "probe") -> bool:
    """A probe (or an operator) showed the window open: remove the marker, release everyone."""
    redis = runtime.redis
    marker = get(runtime, scope)
    pipe = redis.pipeline(transaction=True)
    pipe.delete(keys.marker(scope))
    pipe.srem(keys.MARKER_SCOPES, keys.marker(scope))
    pipe.delete(keys.probe(scope))
    pipe.publish(keys.WAKE_CHANNEL, f"open:{scope}")
    deleted = pipe.execute()[0]
    if marker is not None:
        _audit(runtime, scope, "opened", marker, who=who, reason=why)
        _release_waiting(runtime)
    if marker is not None and marker.retrigger:
        schedule_retrigger(runtime, scope)  # cancels the now-pointless job
    return bool(deleted)


def try_probe(runtime: Runtime, scope: str, holder: str) -> bool:
    """Elect the one probe for a lifted scope (across all machines)."""
    lease = runtime.settings.probe_grace * 2 + 30
    return bool(runtime.redis.set(keys.probe(scope), holder, nx=True, ex=lease))


def end_probe(runtime: Runtime, scope: str, holder: str) -> None:
    if _s(runtime.redis.get(keys.probe(scope))) == holder:
        runtime.redis.delete(keys.probe(scope))


def acquire_slot(runtime: Runtime, holder: str, lease: float = 30.0) -> bool:
    """One of DISPATCHQ_SESSION_CONCURRENCY session slots, shared by every machine."""
    now = time.time()
    script = runtime.redis.register_script(_SLOT)
    return bool(
        script(
            keys=[keys.SESSION_SLOTS],
            args=[repr(now), repr(now + lease), holder, str(runtime.settings.session_concurrency)],
        )
    )


def release_slot(runtime: Runtime, holder: str) -> None:
    runtime.redis.zrem(keys.SESSION_SLOTS, holder)


def close_window(runtime: Runtime, until: datetime, *, reason: str, who: str | None = None) -> Marker:
    """An operator reserves the window (e.g. for their own sessions) until `until`."""
    signal = LimitSignal(
        lifts_at=until.astimezone(UTC),
        kind="operator",
        scope=GENERAL_SCOPE,
        message=reason or "closed by an operator",
        stated=f"operator:{until.isoformat()}",
        source="status",
    )
    who = who or getpass.getuser()
    # An operator's close replaces any earlier time (it may shorten a reservation too).
    runtime.redis.delete(keys.marker(GENERAL_SCOPE))
    return raise_marker(runtime, signal, session=f"operator {who}", source="operator", reason=reason)


def open_window(runtime: Runtime, *, who: str | None = None, scope: str | None = None) -> list[str]:
    """An operator opens the window now: markers removed, waiting sessions released."""
    who = who or getpass.getuser()
    opened = []
    for marker in all_markers(runtime):
        if scope is None or marker.scope == scope:
            window_open(runtime, marker.scope, why=f"opened by operator {who}", who=f"operator {who}")
            opened.append(marker.scope)
    return opened


def _audit(runtime: Runtime, scope: str, action: str, marker: Marker, *, who: str, reason: str) -> None:
    entry = {
        "at": datetime.now(UTC).isoformat(),
        "scope": scope,
        "action": action,
        "lifts_at": datetime.fromtimestamp(marker.lifts_at, UTC).isoformat(),
        "who": who,
        "reason": reason[:300],
    }
    pipe = runtime.redis.pipeline()
    pipe.lpush(keys.MARKER_AUDIT, json.dumps(entry))
    pipe.ltrim(keys.MARKER_AUDIT, 0, AUDIT_LENGTH - 1)
    pipe.execute()


def audit_log(runtime: Runtime, limit: int = 10) -> list[dict[str, Any]]:
    return [json.loads(_s(e) or "{}") for e in runtime.redis.lrange(keys.MARKER_AUDIT, 0, limit - 1)]


def _line_records(runtime: Runtime) -> list[Any]:
    lines = [_s(k) or "" for k in runtime.redis.scan_iter(match=keys.SESSION_LINES_PATTERN)]
    ids: list[str] = []
    for line in lines:
        ids += runtime.store.line_ids(line)
    return [r for r in runtime.store.get_many(ids) if r is not None]


def waiting_reason(marker: Marker) -> str:
    """The one wording every held-back judgement shows (status, `run`'s summary)."""
    when = datetime.fromtimestamp(marker.lifts_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"usage window closed until {when} ({marker.kind})"


def _mark_waiting(runtime: Runtime, marker: Marker) -> None:
    """Make the pause visible on every judgement it holds back (status `waiting`, with why)."""
    reason = waiting_reason(marker)
    try:
        kinds = runtime.config.kinds
    except UserError:  # no readable config here (an operator's shell): treat every kind as default-model
        kinds = {}
    for record in _line_records(runtime):
        kind = kinds.get(record.kind)
        model = kind.session.model if kind and kind.session else None
        if record.status in ("queued", "waiting") and applies(marker.scope, model):
            runtime.store.transition(
                record.id, "waiting", expect=["queued", "waiting"], fields={"reason": reason}
            )


def _release_waiting(runtime: Runtime) -> None:
    for record in _line_records(runtime):
        if record.status == "waiting" and (record.reason or "").startswith("usage window"):
            runtime.store.transition(record.id, "queued", expect=["waiting"], delete=["reason"])


def status_section(runtime: Runtime) -> dict[str, Any]:
    """The usage-window part of `dispatchq status --json`."""
    from dispatchq.queue.scheduler import scheduler_for

    tz = runtime.settings.timezone
    markers = [m.public(tz) for m in all_markers(runtime)]
    general = next((m for m in markers if m["scope"] == GENERAL_SCOPE), None)
    retriggers = []
    for job, when in scheduler_for(runtime).get_jobs(with_times=True):
        if job.func_name == "jobs.tiers.retrigger":
            at = when.replace(tzinfo=UTC) if when.tzinfo is None else when
            retriggers.append(
                {"scope": job.args[0] if job.args else "?", "at": at.isoformat(), "job": job.id}
            )
    redis = runtime.redis
    running = {
        (_s(k) or ""): json.loads(_s(v) or "{}") for k, v in redis.hgetall(keys.SESSION_RUNNING).items()
    }
    blocked = {(_s(k) or ""): _s(v) for k, v in redis.hgetall(keys.SESSION_BLOCKED).items()}
    spawned, refused = redis.mget([keys.STATS_SESSIONS_SPAWNED, keys.STATS_SESSIONS_REFUSED])
    return {
        "marker": general
        or {"scope": GENERAL_SCOPE, "up": False, "lifts_at": None, "kind": None, "message": None},
        "markers": markers,
        "retrigger": retriggers[0]["at"] if retriggers else None,
        "retriggers": retriggers,
        "sessions": {
            "running": running,
            "spawned": int(spawned or 0),
            "refused_at_spawn": int(refused or 0),
            "blocked": blocked,
        },
        "window_audit": audit_log(runtime, 5),
    }
