"""dispatchq's own records of judgements, in Redis.

Every state change is one Lua script, so a record, its status index and its
idempotency key never disagree, and a change can ride in the same MULTI as the RQ
enqueue that hands the judgement to its next tier: either both happen or neither,
so no judgement is ever recorded as queued with nothing queued to run it.

Batch forms exist for the hot paths (enqueue, claim) because RQ jobs carry many
judgement ids and one round trip per judgement would cost more than RQ itself.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import redis
from redis.client import Pipeline

from dispatchq.core.judgement import FINISHED, STATUSES, Record, TrailEntry
from dispatchq.core.priority import PRIORITIES, line_score, stored_priority
from dispatchq.core.status import Brief, Counters
from dispatchq.core.text import as_text
from dispatchq.core.tiers import TIERS
from dispatchq.core.waiting import WAIT_CLASSES, reason_class
from dispatchq.storage import directory, keys, scripts, stale
from dispatchq.storage.counts import RECOUNT_LUA
from dispatchq.storage.histograms import observe_answer
from dispatchq.storage.scripts import LEGACY_CLAIM

__all__ = [
    "LEGACY_CLAIM",
    "WAITING_SAMPLE",
    "WAIT_CLASS",
    "Claimed",
    "LiveCounts",
    "NewRecord",
    "P",
    "Store",
    "lease_key",
]

log = logging.getLogger("dispatchq.store")

P = keys.PREFIX
#: The record field holding a waiting record's reason class (`dispatchq.core.waiting`).
#: A writer that knows the class (a host block) passes it with the reason; else it is
#: read from the reason's wording.
WAIT_CLASS = "wclass"
#: At most this many waiting judgements are read for `status` (a sample, never all).
WAITING_SAMPLE = 10

#: Fields whose change moves the live counts: `set_fields` writes these through `scripts.SET_FIELDS`.
_COUNTED_FIELDS = frozenset({"tier", "reason", WAIT_CLASS})


def lease_key(jid: str) -> str:
    """The key whose life is a session judgement's lease: its holder renews it, it expires alone."""
    return f"{P}:lease:{jid}"


class NewRecord(NamedTuple):
    """A judgement's record as written at enqueue (all strings: they go straight to Lua)."""

    id: str
    content_key: str
    force: str  # "1" re-judges even when a live duplicate exists
    line: str  # the session line to join, or ""
    input: str  # the judgement as JSON
    tier: str
    effect: str
    host: str  # "" when not bound to a host
    job: str  # the RQ job that will run it, or ""
    group: str  # the typed tier's same-state set to join, or ""
    urgency: str = ""  # its class (`dispatchq.core.priority`); "" writes none, read as normal
    score: str = ""  # its score in `line` (`line_score`), or "" for 0


@dataclass(frozen=True)
class Claimed:
    """A judgement a worker now holds (status running)."""

    id: str
    input: dict[str, Any]
    content_key: str
    attempts: int
    effect: str
    was: str
    priority: float | None


@dataclass(frozen=True)
class LiveCounts:
    """The live counts, read in one trip: unfinished judgements per (tier, status), waiting
    judgements per reason class, and how many records a rebuild counted (None: no rebuild)."""

    by_tier: dict[str, dict[str, int]]
    waiting: dict[str, int]
    rebuilt: int | None = None


class Store:
    """Typed access to judgement records. Takes a client; knows nothing of settings."""

    #: The lease (seconds) a claim from a session line starts with: the session tier sets it
    #: from DISPATCHQ_SESSION_LEASE before it admits; the holder then renews it.
    claim_lease: float = 120.0

    def __init__(self, client: redis.Redis, *, result_ttl: int = 7 * 86_400) -> None:
        self.redis = client
        self.result_ttl = result_ttl
        self._refusals: set[tuple[str, str]] = set()
        self._enqueue = client.register_script(scripts.ENQUEUE)
        self._claim = client.register_script(scripts.CLAIM)
        self._transition = client.register_script(scripts.TRANSITION)
        self._transition_many = client.register_script(scripts.TRANSITION_MANY)
        self._line_add = client.register_script(scripts.LINE_ADD)
        self._line_claim = client.register_script(scripts.LINE_CLAIM)
        self._set_fields = client.register_script(scripts.SET_FIELDS)
        self._recount = client.register_script(RECOUNT_LUA)
        self._stale = client.register_script(scripts.STALE)
        self._renew_claim = client.register_script(scripts.RENEW_CLAIM)
        self._take_over = client.register_script(scripts.TAKE_OVER)
        self._late_trail = client.register_script(scripts.LATE_TRAIL)

    def bounded(self, timeout: float) -> Store:
        """The same store on a client of its own whose every call gives up after `timeout` s.

        RQ raises the shared pool's `socket_timeout` to about 70 s for its blocking reads; a
        session's holder must notice a lost Redis in seconds (to renew, to fence itself, to
        spool), so its writes go through this one. A pool it cannot copy (a client built by
        hand) is shared as it is.
        """
        pool = self.redis.connection_pool
        kwargs = dict(pool.connection_kwargs)
        kwargs.update(socket_timeout=timeout, socket_connect_timeout=timeout)
        for name in ("retry", "connection_pool"):
            kwargs.pop(name, None)
        kwargs.update(connection_class=pool.connection_class, max_connections=4)
        service, manager = getattr(pool, "service_name", None), getattr(pool, "sentinel_manager", None)
        make: Callable[..., redis.ConnectionPool] = type(pool)
        if service is not None and manager is not None:
            # A Sentinel pool asks the same sentinels where the primary is (`storage.sentinel`).
            kwargs.update(
                service_name=service, sentinel_manager=manager, is_master=getattr(pool, "is_master", True)
            )
        try:
            copy = make(**kwargs)
        except (TypeError, ValueError):
            return self
        other = Store(redis.Redis(connection_pool=copy), result_ttl=self.result_ttl)
        other.claim_lease = self.claim_lease
        return other

    def disconnect(self) -> None:
        """Close this store's connections (a `bounded` copy's own pool, when its holder is done)."""
        self.redis.connection_pool.disconnect()

    def note_refused(self, jid: str, claim: str, what: str) -> None:
        """A holder's write refused by the fence: said once per judgement and claim, never raised."""
        if (jid, claim) not in self._refusals:
            self._refusals.add((jid, claim))
            log.warning("refused %s of %s: the writer's claim is gone (another holder has it now)", what, jid)

    # --- writes --------------------------------------------------------------------------
    def create_many(
        self, entries: Sequence[NewRecord], *, pipe: Pipeline | None = None
    ) -> list[tuple[str, bool]] | None:
        """Create records, or find the live duplicate of each.

        Returns (id, created) per entry: a duplicate returns the live judgement's id and
        False. With `pipe`, the call is queued on it and the caller reads the result.
        """
        args = [repr(time.time()), json.dumps(entries, separators=(",", ":"), ensure_ascii=False)]
        if pipe is not None:
            self._enqueue(args=args, client=pipe)
            return None
        return self.parse_created(self._enqueue(args=args), entries)

    @staticmethod
    def parse_created(raw: list[Any], entries: Sequence[NewRecord]) -> list[tuple[str, bool]]:
        """(id, created) per entry, from the script's list of duplicates."""
        duplicates = {int(raw[i]) - 1: as_text(raw[i + 1]) for i in range(0, len(raw), 2)}
        return [
            (duplicates[i], False) if i in duplicates else (entry.id, True) for i, entry in enumerate(entries)
        ]

    def claim(self, ids: Sequence[str], tier: str, *, strict: bool = False) -> list[Claimed]:
        """Mark the claimable ones running.

        An RQ job's own ids may already be `running` (a retried job whose worker died)
        and are taken back; with `strict`, only queued or waiting ones are taken (for
        judgements another job might be running right now).
        """
        if not ids:
            return []
        raw = self._claim(args=[repr(time.time()), tier, "1" if strict else "0", *ids])
        out = []
        for item in raw:
            if not item:
                continue
            data = json.loads(item)
            priority = data.get("priority")
            out.append(
                Claimed(
                    id=data["id"],
                    input=json.loads(data["input"]),
                    content_key=data["ckey"],
                    attempts=int(data.get("attempts") or 0),
                    effect=data.get("effect") or "local",
                    was=data["was"],
                    priority=float(priority) if priority not in (None, "") else None,
                )
            )
        return out

    def transition(
        self,
        jid: str,
        status: str,
        *,
        expect: Iterable[str] = (),
        trail: TrailEntry | None = None,
        fields: dict[str, Any] | None = None,
        delete: Iterable[str] = (),
        pipe: Pipeline | None = None,
        claim: str | None = None,
    ) -> bool | None:
        """Move a record to `status` if it is in one of `expect` (any unfinished if empty).

        `claim` is the writer's claim token when it writes as the judgement's holder (a
        session's worker): the move is refused (False, logged once) unless the record still
        carries that claim. `LEGACY_CLAIM`, from a holder that has none (its job was made
        before claim tokens existed), is accepted once, and only on a record without one.
        None: not a holder's write (a person's cancel, reconciliation, a takeover), unchecked.
        """
        if not expect:
            expect = [s for s in STATUSES if s not in FINISHED]
        finished = status in FINISHED
        answered_tier = ""
        flat: list[str] = []
        for name, value in _with_class(fields or {}).items():
            flat += [name, _encode_field(name, value)]
            if name == "tier" and status == "answered":
                answered_tier = str(value)
        for name in delete:
            flat += [name, "\0"]
        args = [
            repr(time.time()),
            ",".join(expect),
            status,
            trail.model_dump_json() if trail else "",
            str(self.result_ttl) if finished else "",
            answered_tier,
            claim or "",
            *flat,
        ]
        if pipe is not None:
            self._transition(keys=[keys.record(jid)], args=args, client=pipe)
            observe_answer(pipe, jid, answered_tier, args[0])  # time in queue (storage/histograms.py)
            return None
        done = int(self._transition(keys=[keys.record(jid)], args=args))
        if done < 0:
            self.note_refused(jid, claim or "", f"the move to {status}")
            return False
        observe_answer(self.redis, jid, answered_tier, args[0])  # time in queue (storage/histograms.py)
        return done == 1

    def transition_many(
        self,
        ids: Sequence[str],
        status: str,
        *,
        expect: Iterable[str],
        fields: dict[str, Any] | None = None,
        delete: Iterable[str] = (),
    ) -> int:
        """Move every record of `ids` in one of `expect` to `status` (unfinished to unfinished), a
        script call per 500: how many moved. What a window does to a whole line at once."""
        flat: list[str] = []
        for name, value in _with_class(fields or {}).items():
            flat += [name, _encode_field(name, value)]
        for name in delete:
            flat += [name, "\0"]
        head = [",".join(expect), status, str(len(flat) // 2), *flat]
        moved = 0
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            moved += int(self._transition_many(args=[repr(time.time()), *head, *chunk]))
        return moved

    def add_to_line(
        self,
        jid: str,
        line: str,
        priority: float | None,
        *,
        urgency: str | None = None,
        front: bool = False,
        pipe: Pipeline | None = None,
    ) -> None:
        """Place a record in a session line: higher class first, then higher `priority` (the
        `order` score), then FIFO (or `front`: ahead of its equals).

        `urgency` is the record's class; None leaves it to the script to read from the record
        (a caller moving judgements it holds only by id), where a record written before
        classes existed reads as `normal`. The score of each class is computed here, so the
        script does no float arithmetic (Lua would print it back with 14 digits).
        """
        chosen = "" if urgency is None else stored_priority(urgency)
        scores = [x for name in PRIORITIES for x in (name, repr(line_score(priority, name)))]
        self._line_add(
            keys=[keys.record(jid), line], args=["1" if front else "0", chosen, *scores], client=pipe
        )

    def claim_from_line(self, line: str, member: str, jid: str) -> str:
        """Admit one judgement from a session line: out of the line and running, atomically.

        Returns the claim's fresh token ("" when it was not claimable): written on the record
        and as its lease (`claim_lease` seconds) in the same script, so no holder ever runs
        a judgement whose record does not name it.
        """
        token = uuid.uuid4().hex
        lease_ms = str(max(1, int(self.claim_lease * 1000)))
        args = [member, repr(time.time()), token, lease_ms]
        done = self._line_claim(keys=[line, keys.record(jid), lease_key(jid)], args=args)
        return token if done else ""

    def claim_of(self, jid: str) -> str | None:
        """The claim token a record carries now (None: a record claimed before tokens existed)."""
        return as_text(self.redis.hget(keys.record(jid), "claim"))

    def renew_claim(self, jid: str, claim: str, lease: float) -> bool:
        """Renew a holder's lease; False once the claim is no longer the record's (taken over, settled)."""
        args = [claim, str(max(1, int(lease * 1000)))]
        return bool(self._renew_claim(keys=[keys.record(jid), lease_key(jid)], args=args))

    def lease_alive(self, jid: str) -> bool:
        """Does the judgement's lease still live (its holder renewed it within the lease)?"""
        return bool(self.redis.exists(lease_key(jid)))

    def take_over(self, jid: str, claim: str | None) -> int:
        """Fence off a holder whose lease lapsed: 1 taken (its claim is now a tombstone), 0 not
        running under `claim` any more (someone else settled or took it), -1 its lease lives."""
        return int(self._take_over(keys=[keys.record(jid), lease_key(jid)], args=[claim or ""]))

    def late_trail(self, jid: str, claim: str, entry: TrailEntry) -> bool:
        """Put a late answer on a record's trail, once per claim; False when it was not needed."""
        return bool(self._late_trail(keys=[keys.record(jid)], args=[claim, entry.model_dump_json()]))

    def set_fields(self, jid: str, claim: str | None = None, **fields: Any) -> bool:
        """Set fields on a record; those the live counts depend on move them in the same script.

        With a holder's `claim`, refused (False, logged once) when the record's claim differs.
        """
        fields = _with_class(fields)
        if claim is None and _COUNTED_FIELDS.isdisjoint(fields):
            self.redis.hset(keys.record(jid), mapping={k: _encode_field(k, v) for k, v in fields.items()})
            return True
        flat = [x for k, v in fields.items() for x in (k, _encode_field(k, v))]
        done = int(self._set_fields(keys=[keys.record(jid)], args=[claim or "", *flat]))
        if done < 0:
            self.note_refused(jid, claim or "", "a field write")
        return done == 1

    def incr_attempts(self, jid: str) -> int:
        return int(self.redis.hincrby(keys.record(jid), "attempts", 1))

    def add_death(self, jid: str) -> int:
        """Count one more worker death on a judgement's record (atomic); returns the new count.

        Counted here rather than by RQ's `retries_left`, which RQ also spends on failures
        that were not deaths: the record is what decides when to stop retrying.
        """
        return int(self.redis.hincrby(keys.record(jid), "deaths", 1))

    def add_shutdown(self, jid: str) -> int:
        """Count one more session ended by a shutdown signal its worker never got (atomic)."""
        return int(self.redis.hincrby(keys.record(jid), "shutdowns", 1))

    @staticmethod
    def watch_record(pipe: Pipeline, jid: str) -> tuple[str | None, str | None]:
        """WATCH a record on `pipe` (before its MULTI) and read its (status, job) now.

        A caller that decided from an earlier read (reconciliation: "its job is gone") acts
        only if the record is still as it saw it: a change in between fails the MULTI.
        """
        pipe.watch(keys.record(jid))
        status, job = pipe.hmget(keys.record(jid), "status", "job")
        return (as_text(status) if status is not None else None, as_text(job) if job else None)

    # --- a hand-off's MULTI (records and RQ's enqueue in one step) ------------------------
    def transaction(self) -> Pipeline:
        """A MULTI pipeline, opened explicitly so RQ can add its enqueue commands to it."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.multi()
        return pipe

    @staticmethod
    def execute(pipe: Pipeline) -> list[Any]:
        """Run a hand-off's MULTI: its records' writes and RQ's enqueues, all or nothing."""
        return pipe.execute()

    def guarded(
        self, jid: str, expected: tuple[str | None, str | None], write: Callable[[Pipeline], None]
    ) -> bool:
        """Run `write`'s MULTI only if the record's (status, job) is still `expected` when it
        runs (WATCH): False when it was not, or changed meanwhile (whoever changed it has it)."""
        pipe = self.redis.pipeline(transaction=True)
        try:
            if self.watch_record(pipe, jid) != expected:
                return False
            pipe.multi()
            write(pipe)
            pipe.execute()
            return True
        except redis.WatchError:
            return False
        finally:
            pipe.reset()

    @staticmethod
    def note_job(jid: str, job_id: str, *, pipe: Pipeline) -> None:
        """The RQ job that carries a judgement now, written in the hand-off's MULTI."""
        pipe.hset(keys.record(jid), "job", job_id)

    @staticmethod
    def wake(*, pipe: Pipeline) -> None:
        """Wake the session workers waiting on a line (work arrived), in the hand-off's MULTI."""
        pipe.publish(keys.WAKE_CHANNEL, "work")

    @staticmethod
    def line_of(host: str | None = None) -> str:
        """The session line of `host` (None: the line any host may take)."""
        return keys.session_line(host)

    def inputs(self, ids: Sequence[str]) -> list[str | None]:
        """Each record's input (`JudgementIn` as JSON); None when gone."""
        return [row[0] for row in self.fields_of(ids, "in")]

    def fields_of(self, ids: Sequence[str], *names: str) -> list[list[str | None]]:
        """Some fields of each record, in a pipeline per thousand (None where unset or gone)."""
        out: list[list[str | None]] = []
        for start in range(0, len(ids), 1000):
            reader = self.redis.pipeline(transaction=False)
            for jid in ids[start : start + 1000]:
                reader.hmget(keys.record(jid), *names)
            out += [[as_text(v) if v is not None else None for v in row] for row in reader.execute()]
        return out

    def forget_deaths(self, jid: str) -> None:
        """A retry asked for by a person starts the count of worker deaths again."""
        self.redis.hdel(keys.record(jid), "deaths", "shutdowns")

    def take_reconcile_turn(self, holder: str, ttl: float) -> bool:
        """True for the one process (of all workers and the scheduler) that reconciles now.

        Reconciliation reads the old queued records and asks RQ about their jobs; run by each
        of N processes at every maintenance round it would cost N times that for nothing.
        """
        return bool(self.redis.set(keys.RECONCILE_TURN, holder, nx=True, px=max(1, int(ttl * 1000))))

    def accepts_writes(self) -> bool:
        """False while a `noeviction` server refuses writes (maxmemory reached); else True.

        A worker that met the limit waits on this rather than restarting its loop (and
        logging a traceback) every few seconds until an operator makes room.
        """
        try:
            self.redis.set(keys.WRITE_PROBE, "1", ex=10)
        except redis.ResponseError as error:
            if str(error).startswith("OOM") or isinstance(error, redis.OutOfMemoryError):
                return False
            raise
        return True

    # --- reads ------------------------------------------------------------------------------
    def get(self, jid: str) -> Record | None:
        raw = self.redis.hgetall(keys.record(jid))
        return _record(jid, raw) if raw else None

    def get_many(self, ids: Sequence[str]) -> list[Record | None]:
        pipe = self.redis.pipeline(transaction=False)
        for jid in ids:
            pipe.hgetall(keys.record(jid))
        return [(_record(jid, raw) if raw else None) for jid, raw in zip(ids, pipe.execute(), strict=True)]

    def stale(
        self, status: str, tiers: Sequence[str], before: float, *, jobs: Iterable[str] | None = None
    ) -> list[tuple[str, str]]:
        """Reconciliation's candidates: (id, RQ job id or "") of the records in `status` at
        one of `tiers` not updated after `before`.

        With `jobs=None`, one record per distinct job (every record without one): what to
        ask RQ about. With `jobs`, every such record of those jobs ("" for none): what to put
        back. Queued ones at batch tiers are read from the index by last update
        (`storage.stale`): a pass reads the old records only, never a backlog of fresh ones
        or of session judgements; otherwise (or before the index's backfill) the status set
        is scanned, filtered in Redis a chunk per call.
        """
        if jobs is not None:
            jobs = list(jobs)
            if not jobs:
                return []
        wanted = "*" if jobs is None else "," + ",".join(jobs) + ","
        if stale.usable(self.redis, status, tiers):
            return stale.find(self.redis, status, tiers, before, wanted).found
        return stale.scan(self._stale, status, tiers, before, wanted).found

    def statuses(self, ids: Sequence[str]) -> list[str | None]:
        pipe = self.redis.pipeline(transaction=False)
        for jid in ids:
            pipe.hget(keys.record(jid), "status")
        return [as_text(v) if v is not None else None for v in pipe.execute()]

    def ids(self, status: str | None = None) -> list[str]:
        if status is not None:
            return sorted(_texts(self.redis.smembers(keys.status_index(status))))
        return directory.all_ids(self.redis)

    def newest(self, limit: int | None = None) -> list[str]:
        """Judgement ids, newest first: the newest `limit`, or every one."""
        return directory.newest(self.redis, limit) if limit else list(reversed(directory.all_ids(self.redis)))

    def with_prefix(self, prefix: str, *, limit: int) -> list[str]:
        return directory.ids_with_prefix(self.redis, prefix, limit=limit)

    def count(self, status: str) -> int:
        return int(self.redis.scard(keys.status_index(status)))

    def answered_counts(self) -> dict[str, int]:
        values = self.redis.mget([keys.answered_counter(t) for t in TIERS])
        return {t: int(v or 0) for t, v in zip(TIERS, values, strict=True)}

    def line_depth(self, lines: Sequence[str]) -> int:
        """How many judgements wait in these session lines."""
        return sum(int(self.redis.zcard(line)) for line in lines)

    # --- live counts (constant time: `status` never reads the waiting records) ---------------
    def live_counts(self) -> LiveCounts:
        """Unfinished judgements per tier and status, and waiting ones per reason class.

        Kept by every script that changes a record. A store written before they existed has
        none: they are rebuilt once from a scan (atomic), and `rebuilt` says how many records
        that counted.
        """
        raw = {as_text(k): as_text(v) for k, v in self.redis.hgetall(keys.STATS_LIVE).items()}
        rebuilt = None
        if "built" not in raw:
            rebuilt = self.recount()
            raw = {as_text(k): as_text(v) for k, v in self.redis.hgetall(keys.STATS_LIVE).items()}
        by_tier: dict[str, dict[str, int]] = {}
        waiting = dict.fromkeys(WAIT_CLASSES, 0)
        for name, value in raw.items():
            if name.startswith("s:"):
                tier, _, status = name[2:].rpartition(":")
                by_tier.setdefault(tier, {})[status] = max(0, int(value))
            elif name.startswith("c:"):
                waiting[name[2:]] = max(0, int(value))
        return LiveCounts(by_tier=by_tier, waiting=waiting, rebuilt=rebuilt)

    def recount(self) -> int:
        """Rebuild the live counts from every unfinished record; returns how many it counted.

        The waiting records' reasons are classified here (Python decides classes, not Lua),
        then one script counts and writes everything atomically; a record that changed in
        between is classified on the next try.
        """
        ids = self.ids("waiting")
        classes: dict[str, str] = {}
        for start in range(0, len(ids), 1000):
            pipe = self.redis.pipeline(transaction=False)
            for jid in ids[start : start + 1000]:
                pipe.hmget(keys.record(jid), WAIT_CLASS, "reason")
            for wclass, reason in pipe.execute():
                if wclass is None:
                    text = as_text(reason) if reason is not None else ""
                    classes[text] = reason_class(text)
        for attempt in range(4):
            done, detail = self._recount(
                args=[
                    json.dumps(classes, ensure_ascii=False),
                    repr(time.time()),
                    "1" if attempt == 3 else "0",
                ]
            )
            if int(done):
                return int(detail)
            for text in json.loads(as_text(detail)):
                classes[text] = reason_class(text)
        return 0  # unreachable: the last try counts an unclassified reason as `other`

    def waiting_reasons(self, limit: int = 20) -> tuple[dict[str, int], int]:
        """The most common waiting reasons (exact counts) and how many distinct reasons there are.

        Reads a hash of distinct reasons, not the records; past 500 distinct reasons only a
        first page of them is ranked (they are free text: a bound, not a promise of the top).
        """
        distinct = int(self.redis.hlen(keys.STATS_WAITING_REASONS))
        raw: Mapping[Any, Any]
        if distinct <= 500:
            raw = self.redis.hgetall(keys.STATS_WAITING_REASONS)
        else:
            raw = cast("Mapping[Any, Any]", self.redis.hscan(keys.STATS_WAITING_REASONS, 0, count=500)[1])
        ranked = sorted(((as_text(k), int(v)) for k, v in raw.items()), key=lambda kv: (-kv[1], kv[0]))
        return {k: v for k, v in ranked[:limit] if v > 0}, distinct

    def waiting_sample(self, limit: int = WAITING_SAMPLE) -> list[Brief]:
        """At most `limit` waiting judgements, briefly (the first the set yields, oldest first)."""
        found: list[str] = []
        cursor = 0
        for _ in range(8):  # bounded: a sparse set may yield few members per step
            cursor, members = self.redis.sscan(keys.status_index("waiting"), cursor, count=limit * 2)
            found += _texts(members)
            if len(found) >= limit or cursor == 0:
                break
        return sorted(self.briefs(sorted(set(found))[:limit]), key=lambda r: r.created_at or 0.0)

    def latest(self, limit: int = 10) -> list[Brief]:
        """The most recently enqueued judgements, briefly, newest first."""
        return self.briefs(directory.newest(self.redis, limit))

    def briefs(self, ids: Sequence[str]) -> list[Brief]:
        """Judgements as lists show them (what, where, why), read field by field: no trail, no model."""
        names = ("in", "status", "tier", "value", "reason", "created", "updated", "urgency")
        pipe = self.redis.pipeline(transaction=False)
        for jid in ids:
            pipe.hmget(keys.record(jid), *names)
        out = []
        for jid, values in zip(ids, pipe.execute(), strict=True):
            f = dict(zip(names, (as_text(v) if v is not None else None for v in values), strict=True))
            if f["status"] is None:
                continue  # expired since it was listed
            data = json.loads(f["in"] or "{}")
            out.append(
                Brief(
                    id=jid,
                    kind=data.get("kind", "?"),
                    target=data.get("target", "?"),
                    item=data.get("item"),
                    status=f["status"],
                    tier=f["tier"] or None,
                    value=json.loads(f["value"]) if f["value"] else None,
                    reason=f["reason"] or None,
                    created_at=float(f["created"]) if f["created"] else None,
                    updated_at=float(f["updated"]) if f["updated"] else None,
                    urgency=stored_priority(f["urgency"]),
                )
            )
        return out

    def counters(self) -> Counters:
        """Every monotonic counter the store keeps, in one trip (what `/metrics` exports)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.mget(
            [keys.STATS_SESSIONS_SPAWNED, keys.STATS_SESSIONS_REFUSED, keys.TYPED_REQUESTS]
            + [keys.answered_counter(t) for t in TIERS]
        )
        pipe.hgetall(keys.STATS_FINISHED)
        pipe.hgetall(keys.STATS_TRIAGE_OUTCOMES)
        values, finished, triage = pipe.execute()
        spawned, refused, typed, *answered = (int(v or 0) for v in values)
        return Counters(
            sessions_spawned=spawned,
            sessions_refused=refused,
            typed_requests=typed,
            answered=dict(zip(TIERS, answered, strict=True)),
            finished={as_text(k): int(v) for k, v in finished.items()},
            triage_outcomes={as_text(k): int(v) for k, v in triage.items()},
        )

    def publish_worker(self, name: str, info: Mapping[str, Any], ttl: float) -> None:
        """A worker's own account of itself, kept while its heartbeat is (`status` reads it)."""
        now = time.time()
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(
            keys.worker_info(name), json.dumps({**info, "name": name, "heartbeat": now}), ex=int(ttl) + 1
        )
        pipe.zadd(keys.WORKERS, {name: now})
        pipe.execute()

    def forget_worker(self, name: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(keys.worker_info(name))
        pipe.zrem(keys.WORKERS, name)
        pipe.execute()

    def live_workers(self, ttl: float) -> list[dict[str, Any]]:
        """Workers whose heartbeat is younger than `ttl`; older entries are dropped."""
        now = time.time()
        self.redis.zremrangebyscore(keys.WORKERS, "-inf", now - ttl)
        names = _texts(self.redis.zrange(keys.WORKERS, 0, -1))
        if not names:
            return []
        values = self.redis.mget([keys.worker_info(n) for n in names])
        return [json.loads(v) for v in values if v]

    def typed_keyless_host(self) -> str | None:
        """The host whose typed worker last said it runs without a TypeSafe key, if any."""
        return as_text(self.redis.get(keys.TYPED_KEYLESS))

    def line_ids(self, line: str) -> list[str]:
        return [m.split(":", 1)[1] for m in _texts(self.redis.zrange(line, 0, -1))]

    def prune(self, *, everything: bool = False) -> int:
        """Unlist the judgements whose record has expired; how many were (`storage.directory`).
        `everything` checks every listed id (`dispatchq prune`), not only those due by now."""
        return directory.prune_all(self.redis) if everything else directory.prune(self.redis)


_JSON_FIELDS = {"value", "raw", "priority", "confidence"}
#: Optional fields some tiers keep on a record (shown in `result --json` when set).
_EXTRA_FIELDS = ("session_id", "resume_session", "claim", "settled_by", "credential")


def _with_class(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A reason goes with its class (kept only while the record waits), unless the writer named it."""
    out = dict(fields)
    if "reason" in out and WAIT_CLASS not in out:
        out[WAIT_CLASS] = reason_class(out["reason"])
    return out


def _encode_field(name: str, value: Any) -> str:
    if name in _JSON_FIELDS:
        return json.dumps(value, separators=(",", ":"), default=str)
    return "" if value is None else str(value)


def _texts(values: Iterable[Any]) -> list[str]:
    """Members of a Redis set or sorted set, as text (redis-py types them loosely)."""
    return [as_text(v) for v in values]


def _record(jid: str, raw: Mapping[Any, Any]) -> Record:
    f = {as_text(k): as_text(v) for k, v in raw.items()}
    data = json.loads(f.get("in", "{}"))
    trail = [TrailEntry.model_validate(t) for t in json.loads(f.get("trail") or "[]")]

    def j(name: str) -> Any:
        return json.loads(f[name]) if f.get(name) not in (None, "") else None

    extra = {k: f[k] for k in _EXTRA_FIELDS if f.get(k)}
    # Fields beyond the declared ones (job, attempts, session ids) ride as pydantic extras.
    return Record.model_validate(
        {
            "id": jid,
            "kind": data.get("kind", "?"),
            "target": data.get("target", "?"),
            "item": data.get("item"),
            "context": data.get("context") or {},
            "state": data.get("state"),
            "key": data.get("key"),
            "status": f.get("status", "queued"),
            "tier": f.get("tier") or None,
            "value": j("value"),
            "confidence": j("confidence"),
            "reason": f.get("reason") or None,
            "trail": trail,
            "content_key": f.get("ckey"),
            "effect": f.get("effect", "local"),
            "host": f.get("host") or None,
            "priority": j("priority"),
            "urgency": stored_priority(f.get("urgency")),
            "raw": j("raw"),
            "created_at": float(f["created"]) if f.get("created") else None,
            "updated_at": float(f["updated"]) if f.get("updated") else None,
            "attempts": int(f.get("attempts") or 0),
            "job": f.get("job") or None,
            **({"deaths": int(f["deaths"])} if f.get("deaths") else {}),
            **({"shutdowns": int(f["shutdowns"])} if f.get("shutdowns") else {}),
            **extra,
        }
    )
