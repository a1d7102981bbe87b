"""`Status`: what `dispatchq status --json`, `GET /status` and the page read, as one typed model.

`collect_status` (`dispatchq.workers.status`) builds it; the CLI's text view, `/metrics` and
the warnings read it through attributes; `Status.as_json()` is the document every JSON reader
gets, so a field renamed here is renamed for all of them, or a test fails
(`tests/unit/test_status_model.py` checks the page's JavaScript and `docs/status.schema.json`).

The document's shape is versioned by its `schema` field (`SCHEMA_VERSION`): a field added keeps
the version, a field renamed, removed or changed in meaning raises it. `docs/status.md`
describes every field.

Every field has a default so that a part of the document (a test's, a dashboard's) validates,
but `as_json()` writes only what was set: `collect_status` sets every field except the two
that are absent unless they apply (`waiting_counts_rebuilt`, `waiting_for_redis_here`), and
what a worker or a stored entry wrote is passed on with exactly its own keys.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "OPTIONAL_FIELDS",
    "SCHEMA_VERSION",
    "AuditEntry",
    "BacklogPart",
    "Brief",
    "Counters",
    "CredentialRow",
    "MarkerView",
    "PoolCredential",
    "PoolPart",
    "Retrigger",
    "RunningSession",
    "SchedulerPart",
    "ServerFacts",
    "SessionsPart",
    "SpendPart",
    "Status",
    "StatusWarning",
    "Suppressed",
    "TriagePart",
    "TypedPart",
    "UsageRow",
    "WaitingNote",
    "WindowPart",
    "WindowReport",
    "WorkerFacts",
    "status_json_schema",
]

#: The version of the document's shape (`status --json`'s `schema` field; `Status` says it as a Literal).
SCHEMA_VERSION: Literal[1] = 1

#: Top-level fields present only when they apply.
OPTIONAL_FIELDS = ("waiting_counts_rebuilt", "waiting_for_redis_here")


class _Part(BaseModel):
    """A part built by dispatchq itself: an unknown field is a mistake."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


class _Stored(BaseModel):
    """A part read back from what a process stored: its own extra keys are passed on."""

    model_config = ConfigDict(extra="allow")


#: The longest value a hash may hold and stay in Redis's compact encoding (listpack, ziplist before
#: Redis 7) on the server dispatchq starts itself. A judgement's record is one hash whose longest
#: value is its input (a few hundred bytes): under this limit it costs about half the memory of the
#: hashtable Redis falls back to past it (2.1 KB a waiting judgement at the default of 64).
RECORD_VALUE_LIMIT = 4096
#: Below this `hash-max-listpack-value`, `status` warns: a typical record no longer fits.
RECORD_VALUE_WARN = 1024


class ServerFacts(_Part):
    """What the Redis server says of itself (`storage.facts.server_facts`).

    The document keeps these at its top level (`Status` has each under the same name), so this
    part is what the store hands `collect_status`, not a field of the document.
    """

    redis_version: str | None = None
    redis_appendfsync: str | None = None
    redis_used_memory: int | None = None
    redis_maxmemory: int | None = None
    redis_hash_value_limit: int | None = None
    redis_unreadable: list[str] = Field(default_factory=list)


class WorkerFacts(_Stored):
    """A live worker as it describes itself (`workers.base.DispatchqWorker.facts`)."""

    name: str | None = None
    tier: str | None = None
    host: str | None = None
    machine_id: str | None = None
    pid: int | None = None
    heartbeat: float | None = None
    keyless: bool | None = None
    session_command_found: bool | None = None
    subprocess_scrub: str | None = None  # "on" or "off"; None for a worker that spawns no session
    subprocess_scrub_warning: str | None = None
    sandbox: str | None = None  # "on", "off" (unconfined) or "unavailable" (the host is blocked)
    sandbox_problem: str | None = None
    claude_code: dict[str, Any] | None = None  # version, supported, supported_range, problem


class Brief(_Stored):
    """A judgement as `status` lists it: what, where, why; `item` and `value` cut short."""

    id: str = ""
    kind: str | None = None
    target: str | None = None
    item: Any = None
    status: str | None = None
    tier: str | None = None
    value: Any = None
    reason: str | None = None
    created_at: float | None = None
    updated_at: float | None = None
    #: Its class: `urgent`, `normal` or `background` (the session line serves higher first).
    urgency: str = "normal"


class SchedulerPart(_Part):
    alive: bool = False
    scheduled_jobs: int = 0


class TypedPart(_Part):
    """Keyless when the typed workers are (their own report), else a recent word from one."""

    keyless: bool = False
    keyless_worker_host: str | None = None


class MarkerView(_Stored):
    """A scope's usage-window marker (`window.marker.Marker.public`); the general scope with
    no marker is `{scope, up: false, lifts_at: null, kind: null, message: null}`."""

    scope: str = "general"
    up: bool = False
    state: str | None = None  # "closed" or "probing"
    lifts_at: str | None = None
    lifts_at_local: str | None = None
    lifts_at_epoch: float | None = None
    countdown_seconds: int | None = None
    kind: str | None = None
    message: str | None = None
    session: str | None = None
    set_at: str | None = None
    source: str | None = None
    refusals: int | None = None
    utilization: float | None = None


class UsageRow(_Part):
    """One window's use as a session last reported it (`window.usage.usage_rows`)."""

    scope: str = ""
    utilization: float | None = None
    resets_at: str | None = None
    resets_at_epoch: float | None = None
    status: Any = None
    reported_at: str | None = None
    reported_at_epoch: float | None = None
    age_seconds: int | None = None
    session: Any = None
    host: Any = None


class CredentialRow(_Part):
    """When a host's stored login ends; `warning` set within a week of it."""

    host: str = ""
    expires_at: str | None = None
    expires_at_epoch: float | None = None
    expires_in_seconds: int | None = None
    reported_at: str | None = None
    warning: str | None = None


class Retrigger(_Part):
    scope: Any = None
    at: str = ""
    job: str = ""


class RunningSession(_Stored):
    """A session running now, as its worker wrote it (`tiers.session`): where, since when, which."""

    host: str | None = None
    session_id: str | None = None
    started: float | None = None
    probe: list[str] | None = None  # the scopes this session probes after a lift
    pid: int | None = None
    claim: str | None = None  # the claim token the worker holds (`tiers.lease`)
    credential: str | None = None  # the pool credential it runs on (None: written before pools)


class SessionsPart(_Part):
    running: dict[str, RunningSession] = Field(default_factory=dict)  # judgement id -> its session
    spawned: int = 0
    refused_at_spawn: int = 0
    blocked: dict[str, str] = Field(default_factory=dict)  # host -> why its sessions cannot start


class AuditEntry(_Stored):
    """Who closed or opened which scope, and why (`window.marker.audit`)."""

    at: str | None = None
    scope: str | None = None
    action: str | None = None
    lifts_at: str | None = None
    who: str | None = None
    reason: str | None = None


class WindowReport(_Part):
    """One window of one credential as its sessions last reported it, with the report's age."""

    window: str = ""
    utilization: float | None = None
    resets_at: str | None = None
    reported_at: str | None = None
    age_seconds: int | None = None


class SpendPart(_Part):
    """USD a credential spent today and this month (in `DISPATCHQ_TIMEZONE`), and its caps."""

    day: float = 0.0
    month: float = 0.0
    cap_day: float | None = None
    cap_month: float | None = None


class PoolCredential(_Part):
    """One credential of the pool as people see it (`window.poolstatus`).

    `state` is the first that holds of `blocked` (refused everywhere), `closed` (a marker has
    not lifted), `spent` (a metered cap has no room), `probing` (lifted: one probe goes first),
    `busy` (every slot taken), else `open`; `why` says it in the waiting reasons' words.
    """

    name: str = ""
    backend: str = "claude"
    billing: str = "subscription"
    state: Literal["open", "closed", "probing", "blocked", "spent", "busy"] = "open"
    why: str = ""
    concurrency: int = 1
    running: int = 0
    lifts_at: str | None = None
    lifts_at_epoch: float | None = None
    windows: list[WindowReport] = Field(default_factory=list)
    markers: list[MarkerView] = Field(default_factory=list)
    spend: SpendPart = Field(default_factory=SpendPart)


class PoolPart(_Part):
    """The credentials sessions may use, in the operator's order."""

    credentials: list[PoolCredential] = Field(default_factory=list)


class BacklogPart(_Part):
    """The session judgements not yet started, and when they are estimated to be answered.

    `docs/status.md` gives the formula (`window.poolstatus.drain_estimate`).
    """

    waiting: int = 0
    rate_per_hour: float | None = None
    rate_hours: float = 0.0
    starts_at: str | None = None
    drain_at: str | None = None
    drain_at_epoch: float | None = None
    drain_seconds: float | None = None
    drain_text: str = ""


class WindowPart(_Part):
    """The usage window's fields of the document, as `Window.status()` reads them.

    The document keeps them at its top level (`Status` has each under the same name), so this
    part is what the window hands `collect_status`, not a field of the document.
    """

    marker: MarkerView = Field(default_factory=MarkerView)
    markers: list[MarkerView] = Field(default_factory=list)
    window_usage: list[UsageRow] = Field(default_factory=list)
    credentials: list[CredentialRow] = Field(default_factory=list)
    sessions: SessionsPart = Field(default_factory=SessionsPart)
    window_audit: list[AuditEntry] = Field(default_factory=list)
    pool: PoolPart = Field(default_factory=PoolPart)


class Counters(_Part):
    """Monotonic counters (what `/metrics` exports as `*_total`)."""

    sessions_spawned: int = 0
    sessions_refused: int = 0
    typed_requests: int = 0
    answered: dict[str, int] = Field(default_factory=dict)
    finished: dict[str, int] = Field(default_factory=dict)  # "tier:status" -> count
    triage_outcomes: dict[str, int] = Field(default_factory=dict)


class Suppressed(_Stored):
    """What one shadow-mode decision suppressed: the rule, its reason and the numbers compared."""

    decision_id: str | None = None
    event: Any = None
    target: Any = None
    time: Any = None
    rule: Any = None
    action: Any = None
    reason: Any = None
    explanation: Any = None
    confidence: Any = None
    threshold: Any = None
    margin: Any = None


class TriagePart(_Part):
    runs: int = 0
    last_run: float | None = None
    counts: dict[str, int] = Field(default_factory=dict)
    needs_triage: int = 0
    outcomes_total: dict[str, int] = Field(default_factory=dict)
    suppressed: list[Suppressed] = Field(default_factory=list)


class StatusWarning(_Part):
    """A red fact at the top (`workers.warnings`): a stable `id`, the `text`, the `hint`."""

    id: str
    text: str
    hint: str


class WaitingNote(_Stored):
    """A process of this host waiting for Redis, as its note says (`storage.outage.waiting_here`)."""

    pid: Any = None
    role: Any = None
    since: Any = None
    state: Any = None
    redis: Any = None
    reason: Any = None


class Status(_Part):
    """Everything `dispatchq status` shows, in the order of its `--json` document."""

    schema_version: Literal[1] = Field(default=SCHEMA_VERSION, alias="schema")
    now: float = 0.0  # the server's clock: the page counts down from it, not the browser's
    redis: str = ""
    redis_version: str | None = None
    redis_appendfsync: str | None = None
    redis_used_memory: int | None = None
    redis_maxmemory: int | None = None
    redis_hash_value_limit: int | None = None
    redis_unreadable: list[str] = Field(default_factory=list)
    queues: dict[str, int] = Field(default_factory=dict)
    workers: dict[str, int] = Field(default_factory=dict)
    worker_details: list[WorkerFacts] = Field(default_factory=list)
    judgements: dict[str, int] = Field(default_factory=dict)
    answered: dict[str, int] = Field(default_factory=dict)
    sessions_avoided: int = 0
    waiting: dict[str, int] = Field(default_factory=dict)  # reason -> count, the most common
    waiting_reasons_distinct: int = 0
    waiting_by_class: dict[str, int] = Field(default_factory=dict)
    waiting_sample: list[Brief] = Field(default_factory=list)
    judgements_by_tier: dict[str, dict[str, int]] = Field(default_factory=dict)
    latest: list[Brief] = Field(default_factory=list)
    scheduler: SchedulerPart = Field(default_factory=SchedulerPart)
    typed: TypedPart = Field(default_factory=TypedPart)
    judgements_orphaned: int = 0
    waiting_counts_rebuilt: int | None = None
    marker: MarkerView = Field(default_factory=MarkerView)
    markers: list[MarkerView] = Field(default_factory=list)
    window_usage: list[UsageRow] = Field(default_factory=list)
    credentials: list[CredentialRow] = Field(default_factory=list)
    retrigger: str | None = None
    retriggers: list[Retrigger] = Field(default_factory=list)
    sessions: SessionsPart = Field(default_factory=SessionsPart)
    window_audit: list[AuditEntry] = Field(default_factory=list)
    pool: PoolPart = Field(default_factory=PoolPart)
    backlog: BacklogPart = Field(default_factory=BacklogPart)
    counters: Counters = Field(default_factory=Counters)
    triage: TriagePart = Field(default_factory=TriagePart)
    warnings: list[StatusWarning] = Field(default_factory=list)
    waiting_for_redis_here: list[WaitingNote] | None = None

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_serialization_defaults_required=True,
        title="dispatchq status",
    )

    def model_post_init(self, context: Any, /) -> None:
        self.model_fields_set.add("schema_version")  # the version is always written

    def as_json(self) -> dict[str, Any]:
        """The `status --json` document: what was set, with JSON's types."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def status_json_schema() -> dict[str, Any]:
    """The JSON Schema of the `status --json` document (`docs/status.schema.json`)."""
    schema = Status.model_json_schema(mode="serialization", by_alias=True)
    schema["required"] = [name for name in schema["required"] if name not in OPTIONAL_FIELDS]
    return schema
