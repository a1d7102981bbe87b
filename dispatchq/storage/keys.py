"""Every Redis key and RQ queue name dispatchq uses, in one place.

Keeping the names here (as rq does in its registries) means an operator reading
`redis-cli --scan` can map every key back to the code that owns it, and a rename
never leaves a reader and a writer disagreeing.
"""

from __future__ import annotations

__all__ = [
    "ALL_IDS",
    "CONTROL_QUEUE",
    "CREDENTIAL_BLOCKED",
    "DIRECTORY_PREFIX",
    "EXPIRING",
    "JOBS_UPGRADED",
    "LIVE_KEYS_PREFIX",
    "MARKER_AUDIT",
    "MARKER_SCOPES",
    "PREFIX",
    "QUEUED_BY_UPDATE",
    "QUEUED_BY_UPDATE_INDEXED",
    "RECENT",
    "RECONCILE_TURN",
    "SCHEDULER_HEARTBEAT",
    "SEQUENCE",
    "SERVE_LOGINS",
    "SESSION_BLOCKED",
    "SESSION_BLOCKED_BY",
    "SESSION_LINES_PATTERN",
    "SESSION_RUNNING",
    "SESSION_SLOTS",
    "STATS_FINISHED",
    "STATS_LIVE",
    "STATS_SESSIONS_REFUSED",
    "STATS_SESSIONS_SPAWNED",
    "STATS_TRIAGE_OUTCOMES",
    "STATS_WAITING_REASONS",
    "TRIAGE_EVENTS",
    "TRIAGE_LEDGER",
    "TRIAGE_NEEDS_TRIAGE",
    "TRIAGE_RECORDED",
    "TRIAGE_RECORDED_STATE",
    "TRIAGE_RUNS",
    "TYPED_KEYLESS",
    "TYPED_REQUESTS",
    "UNSTARTED_INDEXED",
    "UNSTARTED_INDEX_PREFIX",
    "WAKE_CHANNEL",
    "WORKERS",
    "WRITE_PROBE",
    "answered_counter",
    "directory",
    "findings_approval",
    "findings_attempt",
    "findings_dispatch_log",
    "findings_lines",
    "findings_lock",
    "idempotency",
    "live_key",
    "marker",
    "probe",
    "queue_name",
    "record",
    "replay_wait",
    "retrigger_lock",
    "retrigger_request",
    "serve_failures",
    "session_host_probe",
    "session_line",
    "session_slots",
    "spend",
    "spend_recent",
    "spend_reservation",
    "status_index",
    "triage_budget_log",
    "triage_decision",
    "triage_labels_added",
    "typed_cache",
    "typed_state",
    "unstarted_index",
    "wait_probe",
    "worker_info",
]

PREFIX = "dispatchq"

# --- RQ queue names -------------------------------------------------------------
# A tier's queue, optionally bound to one host (judgements that name a checkout run
# only where the checkout is).
CONTROL_QUEUE = "dispatchq-control"


def queue_name(tier: str, host: str | None = None) -> str:
    """RQ queue for a tier, e.g. `dispatchq-code` or `dispatchq-code@build-01`."""
    base = f"{PREFIX}-{tier}"
    return f"{base}@{host}" if host else base


# --- judgement records ---------------------------------------------------------
def record(judgement_id: str) -> str:
    """Hash holding one judgement's record (its input, status, answer, trail)."""
    return f"{PREFIX}:j:{judgement_id}"


def status_index(status: str) -> str:
    """Set of judgement ids currently in `status` (kept by the store's scripts)."""
    return f"{PREFIX}:by-status:{status}"


def idempotency(content_key: str) -> str:
    """String: the id of the live judgement with this content (or producer) key."""
    return f"{PREFIX}:key:{content_key}"


ALL_IDS = f"{PREFIX}:ids"  # sorted set: id -> enqueue time; stores made before the directory
SEQUENCE = f"{PREFIX}:seq"  # counter giving every judgement a FIFO sequence number


#: Hashes `dir:<first 4 characters of an id>`: the rest of the id -> its enqueue time in ms.
#: Every judgement id, in 65,536 small hashes Redis keeps in its compact encoding (about 35 bytes
#: an id, where one sorted set of every id cost 130 and a second one for prefixes 130 more): a
#: prefix lookup reads one, `list` and the upgrade read them all (`storage.directory`).
DIRECTORY_PREFIX = f"{PREFIX}:dir:"
#: List: the newest judgement ids, newest first, capped (`list` and `status` read it).
RECENT = f"{PREFIX}:recent"
#: Sorted set: finished judgements by the instant their record expires, so `prune` reads only
#: the expired, not every id.
EXPIRING = f"{PREFIX}:expiring"
#: Hashes `live-keys:<first 4 hex of a content key>`: its next 20 -> the live judgement
#: with it. A finished judgement's key moves to `idempotency` (a string that expires with its
#: record): what waits costs one small hash entry, not a key of its own.
LIVE_KEYS_PREFIX = f"{PREFIX}:live-keys:"


def live_key(content_key: str) -> tuple[str, str]:
    """(hash, field) that hold the live judgement with this content key (the scripts' `live_key`)."""
    return f"{LIVE_KEYS_PREFIX}{content_key[:4]}", content_key[4:24]


def directory(judgement_id: str) -> tuple[str, str]:
    """(hash, field) that list a judgement id in the directory."""
    return f"{DIRECTORY_PREFIX}{judgement_id[:4]}", judgement_id[4:]


def answered_counter(tier: str) -> str:
    """Counter: judgements answered by a tier since the store was created."""
    return f"{PREFIX}:stats:answered:{tier}"


STATS_SESSIONS_SPAWNED = f"{PREFIX}:stats:sessions:spawned"
STATS_SESSIONS_REFUSED = f"{PREFIX}:stats:sessions:refused"


# --- typed tier ----------------------------------------------------------------------
def typed_cache(content_key: str, model: str) -> str:
    """Cached provider answers for a judgement's content under a requested model."""
    return f"{PREFIX}:typed:cache:{model}:{content_key}"


def typed_state(state_digest: str) -> str:
    """Set of typed-tier judgements waiting on one state: a typed worker asks about them together."""
    return f"{PREFIX}:typed:state:{state_digest}"


TYPED_REQUESTS = f"{PREFIX}:stats:typed:requests"  # provider requests made
TYPED_KEYLESS = f"{PREFIX}:typed:keyless"  # set by typed workers that run without a key


# --- session tier, marker, retrigger ---------------------------------------------
def session_line(host: str | None = None) -> str:
    """Sorted set of session judgements waiting to be spawned (priority, then FIFO)."""
    return f"{PREFIX}:session:line@{host}" if host else f"{PREFIX}:session:line"


SESSION_SLOTS = f"{PREFIX}:session:slots"  # sorted set: slot holder -> lease expiry (`default`'s)


def session_slots(credential: str) -> str:
    """Sorted set: one credential's slot holders -> lease expiry (`default` keeps the old key)."""
    return SESSION_SLOTS if credential == "default" else f"{SESSION_SLOTS}:{credential}"


def spend(credential: str, period: str) -> str:
    """Float: USD one credential spent (and holds reserved) in a day `2026-12-05` or month `2026-12`."""
    return f"{PREFIX}:spend:{credential}:{period}"


def spend_recent(credential: str) -> str:
    """List: the costs of one credential's last sessions, newest first (its running mean)."""
    return f"{PREFIX}:spend:{credential}:recent"


def spend_reservation(slot: str) -> str:
    """String with a TTL: what one admitted session reserved (credential, estimate, periods)."""
    return f"{PREFIX}:spend:reservation:{slot}"


CREDENTIAL_BLOCKED = f"{PREFIX}:session:credential-blocked"  # hash: credential -> why it is refused
SESSION_BLOCKED = f"{PREFIX}:session:blocked"  # hash: host -> why sessions cannot start there
SESSION_RUNNING = f"{PREFIX}:session:running"  # hash: judgement id -> json (pid, host, session id)
WAKE_CHANNEL = f"{PREFIX}:wake"  # pub/sub: a marker came down or work arrived


def marker(scope: str) -> str:
    """Hash: the usage-window marker for one limit scope (`general`, `model:opus`, ...)."""
    return f"{PREFIX}:marker:{scope}"


def retrigger_lock(scope: str) -> str:
    """Lock held while the one retrigger of a scope is (re)scheduled."""
    return f"{PREFIX}:marker:{scope}:retrigger-lock"


def retrigger_request(scope: str) -> str:
    """Set by whoever changed a scope's marker: its retrigger must be (re)scheduled."""
    return f"{PREFIX}:marker:{scope}:retrigger-request"


SESSION_LINES_PATTERN = f"{PREFIX}:session:line*"  # SCAN pattern matching every host's line
MARKER_SCOPES = f"{PREFIX}:marker:scopes"  # set of scopes that have a marker record
MARKER_AUDIT = f"{PREFIX}:marker:audit"  # capped list of marker changes (who, when, why)


def probe(scope: str) -> str:
    """String with a lease: the one session elected to probe a lifted window."""
    return f"{PREFIX}:probe:{scope}"


def replay_wait(jid: str) -> str:
    """String (the holder's claim) that outlives a session's lease by the spool wait: while it
    lives, another host leaves the judgement to its holder's own spool replay."""
    return f"{PREFIX}:replay-wait:{jid}"


SCHEDULER_HEARTBEAT = f"{PREFIX}:scheduler:heartbeat"
#: Workers that published what they run with: sorted set, name -> last heartbeat (epoch).
WORKERS = f"{PREFIX}:workers"


def worker_info(name: str) -> str:
    """What one worker runs with (tier, host, keyless, ...), expiring with its heartbeat."""
    return f"{PREFIX}:worker:{name}"


# --- rules engine ----------------------------------------------------------------------
def triage_decision(decision_key: str) -> str:
    """Hash: stored answers and resolution of one triage decision."""
    return f"{PREFIX}:triage:decision:{decision_key}"


TRIAGE_EVENTS = f"{PREFIX}:triage:events"  # sorted set: decision key -> time, for replay
TRIAGE_LEDGER = f"{PREFIX}:triage:ledger"  # hash: action fingerprint -> json of performed action
TRIAGE_RECORDED = f"{PREFIX}:triage:recorded"  # list: what the recording executor "performed"
TRIAGE_RUNS = f"{PREFIX}:triage:runs"  # capped list of recent runs' outcome counts


def triage_labels_added(target: str) -> str:
    """Set of labels dispatchq itself added to a target: the only labels it may remove."""
    return f"{PREFIX}:triage:labels-added:{target}"


TRIAGE_NEEDS_TRIAGE = f"{PREFIX}:triage:needs-triage"  # hash: decision key -> json of an escalated event
TRIAGE_RECORDED_STATE = f"{PREFIX}:triage:recorded-state"  # hash: target -> json the recording executor keeps


# --- decision record (findings reports) --------------------------------------------
def findings_lines(repo_id: str, finding_id: str) -> str:
    """Hash: dispatchq's own copy of every line it wrote into a finding (tamper evidence)."""
    return f"{PREFIX}:findings:lines:{repo_id}:{finding_id}"


def findings_dispatch_log(repo_id: str) -> str:
    """List: one entry per fixer dispatch with before/after hashes of pinned paths."""
    return f"{PREFIX}:findings:dispatch-log:{repo_id}"


def findings_approval(repo_id: str, finding_id: str) -> str:
    """Hash: approvals of out-of-boundary checks, keyed by plan digest and argv."""
    return f"{PREFIX}:findings:approval:{repo_id}:{finding_id}"


def findings_lock(repo_id: str) -> str:
    """Lock key making fixer dispatch sequential per repository across workers."""
    return f"{PREFIX}:findings:dispatch-lock:{repo_id}"


def findings_attempt(repo_id: str, finding_id: str, attempt: int) -> str:
    """Hash: one fixer attempt's own state (the before-observation, the marker it replaced,
    a resumable session, the outcome), so every start of the job can read where it stands."""
    return f"{PREFIX}:findings:attempt:{repo_id}:{finding_id}:{attempt}"


# The host breaker.
SESSION_BLOCKED_BY = f"{PREFIX}:session:blocked-by"
"""Hash: host -> the fingerprint of the session command and credential a host block was set under."""


def session_host_probe(host: str) -> str:
    """Key with a TTL: while it lives, a blocked host's next probe session is not due yet."""
    return f"{PREFIX}:session:host-probe:{host}"


WRITE_PROBE = f"{PREFIX}:write-probe"  # string, short TTL: "does Redis accept writes again?" (maxmemory)
RECONCILE_TURN = f"{PREFIX}:reconcile:turn"  # string, TTL one recovery interval: whose turn to reconcile


# `dispatchq serve`.
def webhook_delivery(delivery_id: str) -> str:
    """String with a TTL: JSON {decision_id, event, target, state} of one X-GitHub-Delivery, so a
    redelivery is answered with the same ids instead of a second decision."""
    return f"{PREFIX}:webhook:delivery:{delivery_id}"


SERVE_LOGINS = f"{PREFIX}:serve:logins"
"""Sorted set, TTL the longest login: one member per live page login (its random id, which both of
its cookies carry), scored by when it ends. Logging out removes one; `serve revoke-logins` the key."""


def serve_failures(kind: str, peer: str) -> str:
    """Counter with a TTL: how many wrong credentials of one kind (`login`, `bearer`, `signature`)
    one peer presented in the throttle's window; past the allowance, the TTL is its wait."""
    return f"{PREFIX}:serve:failures:{kind}:{peer}"


def triage_budget_log(name: str) -> str:
    """Sorted set: one member per provider request a rolling triage budget counted, scored by time."""
    return f"{PREFIX}:triage:budget-log:{name}"


# Status in constant time, metrics.
STATS_LIVE = f"{PREFIX}:stats:live"
"""Hash kept by the store's scripts with every record change: `s:<tier>:<status>` -> how many
unfinished judgements are there, `c:<class>` -> how many wait for that class of reason,
`built` -> when the counts were last rebuilt from a scan (absent: rebuild before trusting them)."""
STATS_WAITING_REASONS = f"{PREFIX}:stats:waiting-reasons"  # hash: waiting reason text -> how many
STATS_FINISHED = f"{PREFIX}:stats:finished"  # hash: `<tier>:<status>` -> judgements ever finished so
STATS_TRIAGE_OUTCOMES = f"{PREFIX}:stats:triage:outcomes"  # hash: resolution row (reason code) -> count
UNSTARTED_INDEX_PREFIX = f"{PREFIX}:unstarted:"
UNSTARTED_INDEXED = f"{PREFIX}:unstarted-indexed"
"""String, no TTL: set once every judgement queued or waiting is in its tier's `unstarted_index`
(a fresh store at its first change, an older one by `storage.unstarted.backfill`)."""


def unstarted_index(tier: str) -> str:
    """Sorted set: the tier's judgements queued or waiting (not started), id -> enqueue time, kept
    by the store's scripts with every change (`dispatchq.storage.unstarted`)."""
    return f"{UNSTARTED_INDEX_PREFIX}{tier}"


QUEUED_BY_UPDATE = f"{PREFIX}:queued-by-update"
"""Sorted set: the judgements queued at a batch tier (code, typed), id -> last update, kept by the
store's scripts with every change (`dispatchq.storage.stale`): what reconciliation reads."""
QUEUED_BY_UPDATE_INDEXED = f"{PREFIX}:queued-by-update-indexed"
"""String, no TTL: set once every judgement queued at a batch tier is in `QUEUED_BY_UPDATE` (a
fresh store at its first change, an older one by `storage.stale.backfill`)."""


# A worker runs only dispatchq's own jobs.
JOBS_UPGRADED = f"{PREFIX}:upgrade:jobs-json"
"""String, no TTL: JSON {at, rewritten, refused} once every pickled RQ job hash (`rq:job:*`) was
rewritten as JSON or refused (`dispatchq.queue.upgrade`); while it is absent, each worker and
the scheduler run the upgrade before their first job."""


# Waiting means waiting for a writable primary.
def wait_probe(host: str, pid: int) -> str:
    """String, 5 s TTL: the write a process waiting out an outage makes to learn that Redis takes
    writes again (a demoted master answers PING but refuses every write), one key per process.
    Not `probe(scope)`'s namespace: a window scope may be any name."""
    return f"{PREFIX}:wait-probe:{host}:{pid}"
