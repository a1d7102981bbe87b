"""Admission and hand-off: from a producer's judgement to the queue of the tier that runs it.

Records and RQ jobs are written in one MULTI, so a judgement is never recorded as
queued without a job to run it, and a job never runs without its record. RQ jobs
carry batches of judgement ids; each judgement keeps its own record and failure.
"""

from __future__ import annotations

import json
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rq import Callback, Queue, Retry

from dispatchq.core.entrypoints import FAILURE_CALLBACK
from dispatchq.core.judgement import JudgementIn, Record, TrailEntry, content_key, state_digest
from dispatchq.core.kinds import Kind
from dispatchq.core.ladder import entry_tier, next_tier
from dispatchq.core.priority import DEFAULT_PRIORITY, Priority, line_score, parse_priority
from dispatchq.core.tiers import NEEDS_TRIAGE, TierRow, rank, row, row_of
from dispatchq.errors import EnqueueInterrupted, UserError
from dispatchq.git import runner as git
from dispatchq.queue.entrypoints import DispatchqQueue
from dispatchq.queue.liveness import job_liveness
from dispatchq.storage.store import NewRecord

if TYPE_CHECKING:
    from redis.client import Pipeline

    from dispatchq.config import Config
    from dispatchq.settings import Settings
    from dispatchq.storage.gateway import Storage

__all__ = [
    "WRITE_CHUNK",
    "BuiltChunk",
    "Dispatcher",
    "Moves",
    "Prepared",
    "Seen",
    "parse_json_arg",
    "urgency_of",
]

#: A record as a caller saw it when it decided to act: (status, RQ job id).
Seen = tuple[str | None, str | None]


def _new_id() -> str:
    """128 random bits as hex: a judgement or job id (uuid4's randomness, without its overhead).

    Drawn from a buffer of 256 ids read from the OS at once: a system call per id was about
    7 µs of every judgement enqueued. A lock, since a chunk may be made on another thread; and
    a forked child (RQ's work horse) starts with an empty buffer, or it would hand out the very
    ids its parent and its siblings do.
    """
    with _IDS_LOCK:
        if not _IDS:
            raw = os.urandom(16 * 256).hex()
            _IDS.extend(raw[i : i + 32] for i in range(0, len(raw), 32))
        return _IDS.pop()


_IDS: list[str] = []
_IDS_LOCK = threading.Lock()


def _fresh_ids_after_fork() -> None:
    global _IDS_LOCK  # a lock another thread held at the fork stays held in the child
    _IDS.clear()
    _IDS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_fresh_ids_after_fork)


#: Judgements written per MULTI; keeps any one transaction (and Lua call) short.
WRITE_CHUNK = 1000


@dataclass(frozen=True)
class Prepared:
    """A validated judgement, ready to be written."""

    id: str
    judgement: JudgementIn
    kind: Kind
    content_key: str
    tier: str
    host: str | None
    force: bool = False
    #: Its class: the producer's `priority`, else its kind's default.
    urgency: Priority = DEFAULT_PRIORITY


@dataclass(frozen=True)
class BuiltChunk:
    """One chunk's MULTI, made and not yet sent, with the records it creates."""

    pipe: Pipeline
    entries: list[NewRecord]


@dataclass
class Moves:
    """The outcomes of one worker batch, committed together in one MULTI."""

    finished: list[tuple[str, str, TrailEntry, dict[str, Any]]] = field(default_factory=list)
    up: list[tuple[str, Kind, str, TrailEntry, dict[str, Any], str | None, float | None]] = field(
        default_factory=list
    )
    states: dict[str, Any] = field(default_factory=dict)

    def answer(
        self,
        jid: str,
        tier: str,
        value: Any,
        why: str,
        *,
        confidence: float | None = None,
        reason: str | None = None,
        raw: Any = None,
        **trail_extra: Any,
    ) -> None:
        fields: dict[str, Any] = {
            "tier": tier,
            "value": value,
            "confidence": confidence,
            "reason": reason or why,
        }
        if raw is not None:
            fields["raw"] = raw
        self.finished.append(
            (jid, "answered", TrailEntry(tier=tier, outcome="answered", why=why, **trail_extra), fields)
        )

    def fail(self, jid: str, tier: str, reason: str, **trail_extra: Any) -> None:
        trail = TrailEntry(tier=tier, outcome="failed", why=reason, **trail_extra)
        self.finished.append((jid, "failed", trail, {"tier": tier, "reason": reason}))

    def move_up(
        self,
        jid: str,
        kind: Kind,
        from_tier: str,
        why: str,
        *,
        host: str | None,
        priority: float | None = None,
        fields: dict[str, Any] | None = None,
        state: Any = None,
        **trail_extra: Any,
    ) -> None:
        """`state` is the judgement's state when the caller has it in hand (it saves the
        commit a read to index a judgement entering the typed tier by state)."""
        trail = TrailEntry(tier=from_tier, outcome="moved-up", why=why, **trail_extra)
        self.up.append((jid, kind, from_tier, trail, dict(fields or {}), host, priority))
        if state is not None:
            self.states[jid] = state

    def __len__(self) -> int:
        return len(self.finished) + len(self.up)


class Dispatcher:
    """Validates judgements and hands them to tiers, for producers and workers alike."""

    def __init__(self, *, settings: Settings, storage: Storage, config: Callable[[], Config]) -> None:
        # `config` is a getter: a producer or `dispatchq status` that never names a kind
        # must not need a readable config file just to reach the queues.
        self.settings = settings
        self.storage = storage
        self.redis = storage.redis  # RQ's queues take the client itself
        self.store = storage.records
        self._config = config
        self._queues: dict[str, Queue] = {}

    @property
    def config(self) -> Config:
        return self._config()

    # --- queues ---------------------------------------------------------------------------
    def queue(self, tier: str, host: str | None = None) -> Queue:
        name = self.storage.jobs.queue_name(tier, host)
        if name not in self._queues:
            self._queues[name] = DispatchqQueue(name, connection=self.redis)
        return self._queues[name]

    def queues_for(self, tier: str) -> list[Queue]:
        """What a worker on this host listens to: the host-bound queue first."""
        if row(tier).queue == "shared":
            return [self.queue(tier)]
        return [self.queue(tier, self.settings.host), self.queue(tier)]

    def job_timeout(self, tier: str) -> int:
        spec = row(tier)
        return int(getattr(self.settings, spec.timeout)) + spec.timeout_margin

    def _enqueue_job(self, tier: str, host: str | None, ids: list[str], pipe: Pipeline, job_id: str) -> None:
        spec = row(tier)
        self.queue(tier, host if spec.queue == "per-host" else None).enqueue_call(
            spec.entry_point,
            args=(ids,),
            timeout=self.job_timeout(tier),
            result_ttl=0,
            failure_ttl=self.settings.result_ttl,
            job_id=job_id,
            retry=Retry(max=self.settings.job_retries) if self.settings.job_retries else None,
            on_failure=Callback(FAILURE_CALLBACK),
            description=f"dispatchq {tier} x{len(ids)}",
            pipeline=pipe,
        )

    # --- admission --------------------------------------------------------------------------
    def check_checkout(self, checkout: str) -> Path:
        """A judgement's checkout must be an existing directory under a checkout root."""
        path = Path(checkout)
        if not path.is_absolute():
            raise UserError(f"context.checkout: {checkout!r} must be an absolute path")
        resolved = path.resolve()
        roots = self.settings.checkout_roots
        if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
            shown = os.pathsep.join(str(r) for r in roots)
            raise UserError(
                f"context.checkout: {checkout} is outside DISPATCHQ_CHECKOUT_ROOTS ({shown}); refused"
            )
        if not resolved.is_dir():
            raise UserError(f"context.checkout: {checkout} is not a directory")
        return resolved

    def prepare(
        self, judgement: JudgementIn, *, force: bool = False, fingerprints: dict[Path, str] | None = None
    ) -> Prepared:
        kind = self.config.kind(judgement.kind)
        host = None
        fingerprint = None
        if judgement.checkout is not None:
            checkout = self.check_checkout(judgement.checkout)
            host = self.settings.host
            cache = fingerprints if fingerprints is not None else {}
            if checkout not in cache:
                if git.toplevel(checkout) is None:
                    if kind.produce:
                        raise UserError(f"context.checkout: {checkout} is not a git repository")
                    cache[checkout] = "not-a-repo"
                else:
                    cache[checkout] = git.fingerprint(checkout)
            fingerprint = cache[checkout]
        elif kind.produce:
            raise UserError(f"kind {kind.name} produces and verifies in a checkout: give context.checkout")
        ckey = content_key(judgement, kind.digest, fingerprint)
        return Prepared(
            _new_id(), judgement, kind, ckey, entry_tier(kind), host, force, urgency_of(judgement, kind)
        )

    def submit(self, prepared: Sequence[Prepared]) -> list[tuple[str, bool]]:
        """Write records and their jobs; returns (id, created) in input order.

        A duplicate (same content key, live judgement) returns the existing id and
        creates nothing. Candidate ids of duplicates may appear in a job's batch; the
        job finds no record for them and does nothing.
        """
        out: list[tuple[str, bool]] = []
        for start in range(0, len(prepared), WRITE_CHUNK):
            try:
                out += self._submit_chunk(prepared[start : start + WRITE_CHUNK])
            except Exception as error:
                if not out:
                    raise  # nothing went in: the plain error says it all
                raise EnqueueInterrupted(out, error) from error
        return out

    def _submit_chunk(self, chunk: Sequence[Prepared]) -> list[tuple[str, bool]]:
        return self.run_chunk(self.build_chunk(chunk))

    def build_chunk(self, chunk: Sequence[Prepared]) -> BuiltChunk:
        """At most `WRITE_CHUNK` judgements' records and jobs as one MULTI, made but not sent.

        No Redis I/O: `run_chunk` sends it. Apart so that a caller can make the next chunk
        while this one is written (`queue.writer.ChunkWriter`).
        """
        groups: dict[tuple[str, str | None], list[Prepared]] = defaultdict(list)
        entries = []
        job_of: dict[str, str] = {}
        for p in chunk:
            if _admission(p.tier) == "queue":
                groups[(p.tier, p.host)].append(p)
        plans: list[tuple[str, str | None, list[str], str]] = []
        for (tier, host), members in groups.items():
            size = 1 if row(tier).one_per_job(members[0].kind) else self.settings.batch_size
            for start in range(0, len(members), size):
                batch = members[start : start + size]
                job_id = _new_id()
                for p in batch:
                    job_of[p.id] = job_id
                plans.append((tier, host, [p.id for p in batch], job_id))
        for p in chunk:
            entries.append(
                NewRecord(
                    p.id,
                    p.content_key,
                    "1" if p.force else "0",
                    self.store.line_of(p.host) if _admission(p.tier) == "line" else "",
                    p.judgement.model_dump_json(exclude_defaults=True),
                    p.tier,
                    p.kind.effect,
                    p.host or "",
                    job_of.get(p.id, ""),
                    self.storage.typed.state_set(state_digest(p.judgement.state))
                    if _groups_by_state(p.tier)
                    else "",
                    p.urgency,
                    repr(line_score(None, p.urgency)),
                )
            )
        pipe = self.store.transaction()
        self.store.create_many(entries, pipe=pipe)
        for tier, host, ids, job_id in plans:
            self._enqueue_job(tier, host, ids, pipe, job_id)
        if any(_admission(p.tier) == "line" for p in chunk):
            self.store.wake(pipe=pipe)
        return BuiltChunk(pipe, entries)

    def run_chunk(self, built: BuiltChunk) -> list[tuple[str, bool]]:
        """Send a chunk `build_chunk` made: (id, created) per judgement, in its order."""
        results = self.store.execute(built.pipe)
        self.storage.server.await_replica(self.settings)  # acknowledged means replicated
        return self.store.parse_created(results[0], built.entries)

    # --- moves between tiers ----------------------------------------------------------------
    def commit(self, moves: Moves) -> None:
        """Apply a batch's outcomes: finished records and hand-offs, atomically."""
        if not len(moves):
            return
        store = self.store
        pipe = store.transaction()
        for jid, status, trail, fields in moves.finished:
            store.transition(jid, status, expect=["running"], trail=trail, fields=fields, pipe=pipe)
        wake = False
        to_queue: dict[tuple[str, str | None], list[str]] = defaultdict(list)
        for jid, kind, from_tier, trail, fields, host, priority in moves.up:
            to = next_tier(kind, from_tier)
            assert rank(to) > rank(from_tier)
            spec = row_of(to)
            if spec is None:
                fields = {**fields, "tier": NEEDS_TRIAGE, "reason": trail.why}
                store.transition(jid, NEEDS_TRIAGE, expect=["running"], trail=trail, fields=fields, pipe=pipe)
                continue
            fields = {**fields, "tier": to}
            if priority is not None:
                fields["priority"] = priority
            store.transition(jid, "queued", expect=["running"], trail=trail, fields=fields, pipe=pipe)
            if spec.admission == "line":
                # Its class is on its record: the script reads it there (urgency=None).
                store.add_to_line(jid, store.line_of(host), priority, pipe=pipe)
                wake = True
            else:
                to_queue[(to, host if spec.queue == "per-host" else None)].append(jid)
        for (tier, host), ids in to_queue.items():
            if row(tier).groups_by_state:
                self._join_state_groups(ids, moves.states, pipe)
            for start in range(0, len(ids), self.settings.batch_size):
                batch = ids[start : start + self.settings.batch_size]
                job_id = _new_id()
                for jid in batch:
                    store.note_job(jid, job_id, pipe=pipe)
                self._enqueue_job(tier, host, batch, pipe, job_id)
        if wake:
            store.wake(pipe=pipe)
        store.execute(pipe)

    def _join_state_groups(self, ids: list[str], known: dict[str, Any], pipe: Pipeline) -> None:
        """Index judgements entering the typed tier by state, for cross-job batching."""
        states = {jid: known[jid] for jid in ids if jid in known}
        unknown = [jid for jid in ids if jid not in known]
        if unknown:
            for jid, raw in zip(unknown, self.store.inputs(unknown), strict=True):
                if raw:
                    states[jid] = json.loads(raw).get("state")
        for jid, state in states.items():
            self.storage.typed.join_state(state_digest(state), jid, pipe=pipe)

    def requeue(self, ids: Iterable[str], why: str, *, seen: Mapping[str, Seen] | None = None) -> int:
        """Put judgements back at their current tier (`retry`, reconcile, a dead job).

        With `seen` (id -> (status, job) as the caller read them when it decided), a record
        is put back only if it is still exactly so when the MULTI runs: reconciliation that
        found "its job is gone" must not re-queue a judgement answered a moment later.
        """
        store = self.store
        count = 0
        for record in store.get_many(list(ids)):
            spec = row_of(record.tier) if record is not None else None
            if record is None or spec is None:
                continue
            expected = (
                seen.get(record.id) if seen is not None else (record.status, getattr(record, "job", None))
            )
            # Written only if the record is still as read: whoever changed it meanwhile has it.
            if expected is not None and store.guarded(
                record.id, expected, partial(self._put_back, record, spec, why)
            ):
                count += 1
        return count

    def _put_back(self, record: Record, spec: TierRow, why: str, pipe: Pipeline) -> None:
        """`requeue`'s writes for one record, in its guarded MULTI."""
        store = self.store
        store.transition(
            record.id,
            "queued",
            expect=[record.status],
            trail=TrailEntry(tier=spec.name, outcome="requeued", why=why),
            delete=["value", "confidence", "reason"],
            pipe=pipe,
        )
        if spec.admission == "line":
            line = store.line_of(record.host)
            store.add_to_line(record.id, line, record.priority, urgency=record.urgency, pipe=pipe)
            store.wake(pipe=pipe)
        else:
            job_id = _new_id()
            store.note_job(record.id, job_id, pipe=pipe)
            self._enqueue_job(spec.name, record.host, [record.id], pipe, job_id)

    def retry(self, jid: str) -> None:
        """Re-judge on purpose, from the kind's entry tier, keeping the trail."""
        record = self.store.get(jid)
        if record is None:
            raise UserError(f"no judgement {jid}")
        if record.status == "running" and _admission(record.tier) == "queue":
            # A judgement whose worker died (or whose job was lost) is not really running:
            # let a person put it back now rather than wait for the heartbeat to expire.
            alive = job_liveness(self.redis, getattr(record, "job", None))
            if alive.state == "alive":
                raise UserError(f"judgement {jid} is running (its job is {alive.why}); nothing to retry")
        elif record.status in ("queued", "running"):
            raise UserError(f"judgement {jid} is {record.status}; nothing to retry")
        kind = self.config.kind(record.kind)
        tier = entry_tier(kind)
        self.store.set_fields(jid, tier=tier)
        self.store.forget_deaths(jid)
        self.requeue([jid], "retry requested")

    def cancel(self, jid: str) -> bool:
        record = self.store.get(jid)
        if record is None:
            raise UserError(f"no judgement {jid}")
        if record.finished:
            return False
        return bool(
            self.store.transition(
                jid,
                "cancelled",
                trail=TrailEntry(tier=record.tier or "?", outcome="cancelled", why="cancelled by request"),
                fields={"reason": "cancelled by request"},
            )
        )


def urgency_of(judgement: JudgementIn, kind: Kind) -> Priority:
    """The judgement's class: what its producer said, else its kind's default, else `normal`."""
    if judgement.priority is not None:
        return judgement.priority
    try:
        return parse_priority(kind.priority)
    except ValueError as error:
        raise UserError(f"kind {kind.name}: {error}") from None


def _admission(rung: str | None) -> str | None:
    """How work reaches the tier `rung` names (None: no tier, so no job and no line)."""
    spec = row_of(rung)
    return spec.admission if spec is not None else None


def _groups_by_state(rung: str) -> bool:
    spec = row_of(rung)
    return spec is not None and spec.groups_by_state


def parse_json_arg(text: str, what: str) -> Any:
    """`--state`/`--context` take JSON or @file; a bad value names the option."""
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise UserError(f"{what}: cannot read {path}: {error.strerror}") from None
        except UnicodeDecodeError:
            raise UserError(f"{what}: {path} is not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(
            f"{what}: not valid JSON ({error.msg} at line {error.lineno} column {error.colno})"
        ) from None
