"""The red facts at the top of `status`, the page and `/metrics`: what stops work, and the fix.

Computed from `status`'s own data (a pure function of it), so `status --json`, the page and
`dispatchq_warning{id}` never disagree. Each warning is a `StatusWarning` (`id`, `text`, `hint`):
`id` is stable and names the fact (a metrics label, a key the page may style by), `text` says what is
wrong in words an operator reads once, `hint` says what to do about it. The ids:

- `queued_no_worker:<tier>`: judgements queued for a tier no live worker serves;
- `scheduler_down`: no fresh scheduler heartbeat (delayed retries and window lifts stall);
- `session_command_missing:<host>`: a session worker cannot find its session command;
- `keyless`: the typed workers have no TypeSafe key, so the typed tier escalates everything;
- `unconfined:<host>`: a session worker runs its sessions without the sandbox;
- `host_blocked:<host>`: a host's sessions are blocked by a host-wide failure (its reason);
- `record_encoding`: the server's `hash-max-listpack-value` is too small for a judgement's record
  to stay in the compact encoding, so each one costs about twice the memory.
"""

from __future__ import annotations

from dispatchq.core.status import RECORD_VALUE_LIMIT, RECORD_VALUE_WARN, Status, StatusWarning
from dispatchq.core.tiers import TIERS, row
from dispatchq.tiers.preflight import COMMAND_HINT

__all__ = ["collect_warnings"]


def _warning(wid: str, text: str, hint: str) -> StatusWarning:
    return StatusWarning(id=wid, text=text, hint=hint)


def _idle_tiers(status: Status) -> list[StatusWarning]:
    out = []
    for tier in TIERS:
        queued = status.queues.get(tier, 0)
        if queued > 0 and not status.workers.get(tier, 0):
            command = "worker session" if row(tier).worker == "session" else f"worker {tier}"
            out.append(
                _warning(
                    f"queued_no_worker:{tier}",
                    f"{queued} judgement(s) queued for the {tier} tier and no live {tier} worker",
                    f"start one: `dispatchq {command}`",
                )
            )
    return out


def _session_workers(status: Status) -> list[StatusWarning]:
    """Per host (several workers on one host report the same fact once)."""
    out: dict[str, StatusWarning] = {}
    for w in status.worker_details:
        if w.tier not in TIERS or row(str(w.tier)).worker != "session":
            continue
        host = w.host or "?"
        if w.session_command_found is False:
            wid = f"session_command_missing:{host}"
            out[wid] = _warning(
                wid, f"session worker on {host} cannot find its session command", COMMAND_HINT
            )
        if w.sandbox == "off":
            wid = f"unconfined:{host}"
            out[wid] = _warning(
                wid,
                f"sessions on {host} run UNCONFINED (DISPATCHQ_SESSION_SANDBOX=off)",
                "install bubblewrap and set DISPATCHQ_SESSION_SANDBOX=on",
            )
    return [out[k] for k in sorted(out)]


def collect_warnings(status: Status) -> list[StatusWarning]:
    """Every warning `status`'s data supports, most blocking first."""
    found = _idle_tiers(status)
    if not status.scheduler.alive:
        found.append(
            _warning(
                "scheduler_down",
                "the scheduler is not running: delayed retries and window lifts wait for it",
                "start it: `dispatchq scheduler`",
            )
        )
    for host, reason in sorted(status.sessions.blocked.items()):
        found.append(
            _warning(
                f"host_blocked:{host}",
                f"sessions on host {host} are blocked: {reason}",
                f"fix the cause; `dispatchq window open --host {host}` clears the block",
            )
        )
    found += _session_workers(status)
    if status.typed.keyless:
        found.append(
            _warning(
                "keyless",
                "the typed workers have no TypeSafe key: the typed tier escalates every judgement",
                "set TYPESAFE_API_KEY (or TYPESAFE_API_KEY_FILE) for the typed workers",
            )
        )
    found += _record_encoding(status)
    return found


def _record_encoding(status: Status) -> list[StatusWarning]:
    """A server whose compact-hash limit is under a record's input stores every record as a
    hashtable: about 2.1 KB per waiting judgement instead of about 1 KB (bench/backlog.py)."""
    limit = status.redis_hash_value_limit
    if limit is None or limit >= RECORD_VALUE_WARN:
        return []
    return [
        _warning(
            "record_encoding",
            f"the Redis server's hash-max-listpack-value is {limit}: judgement records longer than that "
            "are stored as hashtables, about twice the memory each "
            "(2.1 KB rather than 1 KB a waiting judgement)",
            f"set `hash-max-listpack-value {RECORD_VALUE_LIMIT}` (Redis 7+; `hash-max-ziplist-value` before) "
            "in the server's config, or `CONFIG SET` it; records written before keep their encoding",
        )
    ]
