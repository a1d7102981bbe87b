"""The upgrade from pickled RQ jobs to JSON ones, run once per store before the first job.

The previous release let RQ pickle every job. A worker of this one never unpickles
(`DispatchqQueue` fails a job whose data is not JSON), so the jobs already waiting in a
user's Redis would all fail on the first start. Instead each pickled job hash (`rq:job:*`:
its zlib-compressed `data`, and its `meta` if it has one) is decoded by an unpickler that
admits no globals at all, and rewritten as JSON. dispatchq's own jobs need none: their data
is `(function name, None, args, kwargs)` of strings, numbers, lists and dicts. A pickle that
names a global (a `__reduce__` calling `os.system`, a class, a function) is refused at the
first global it names, before anything of it is built: the job fails with the one line,
leaves its queue and the schedule, and the line is logged.

When: every worker (`build_worker`) and the scheduler's mover run `ensure_upgraded` before
they take their first job; it costs one EXISTS once the store is marked done
(`storage.rqstate.jobs_upgraded`). Several processes starting at once may each scan; that is safe and
the same as one doing it, because every job is rewritten with a compare-and-set (WATCH on
its hash: a job changed meanwhile is read again) and a job already JSON is left as it is.
So no lock is needed, and no process takes a job before its own pass is over. A pickled job
written after the mark (a previous-release producer still running) is refused by the
worker like any other foreign job, and reconciliation re-enqueues its judgements.

A second step: `migrate_directory` moves the judgement ids of the sorted sets a store kept
before the directory (`dispatchq.storage.directory`) into it, once per store (the legacy sets
are deleted when it is done), so `GET /judgements/{prefix}` and `list` find them there too.
`serve` runs it at start as well.
A third, the same way: `backfill_unstarted_index` puts the judgements queued or waiting
before the unstarted index (`dispatchq.storage.unstarted`) into it, so `/metrics` reads the
oldest waiting age from the index rather than a bounded scan.
A fourth: `backfill_stale_index` puts the judgements queued at a batch tier before the index by
last update (`dispatchq.storage.stale`) into it, so reconciliation reads only the old ones.

Not rewritten: RQ's result streams (`rq:results:*`) of jobs that already finished. Nothing
in dispatchq reads them, a JSON reader only fails to decode them (never unpickles them),
and they expire with their result TTL.
"""

from __future__ import annotations

import io
import logging
import pickle
import time
import zlib
from dataclasses import dataclass
from typing import Any

import redis
from rq.exceptions import NoSuchJobError
from rq.job import Job

from dispatchq.queue.entrypoints import DispatchqJob, DispatchqQueue, RefusedData, RefusedEntryPoint, refuse
from dispatchq.queue.serializer import JSONSerializer, is_plain
from dispatchq.storage import directory, rqstate, stale, unstarted

__all__ = [
    "NeedsGlobal",
    "Upgrade",
    "backfill_stale_index",
    "backfill_unstarted_index",
    "ensure_upgraded",
    "migrate_directory",
    "no_globals_loads",
    "upgrade_job",
    "upgrade_jobs",
]

log = logging.getLogger("dispatchq.queue.upgrade")

#: The field of a job hash the upgrade refused: its one line (RQ ignores fields it does not know).
_REFUSED = "dispatchq_refused"


class NeedsGlobal(pickle.UnpicklingError):
    """The pickle names a global (or a persistent id): it is not decoded any further."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"needs global {name!r}")


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise NeedsGlobal(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise NeedsGlobal("a persistent id")


def no_globals_loads(data: bytes) -> Any:
    """Unpickle `data` admitting no global: only str, bytes, numbers, None, bools, tuples, lists,
    dicts and sets can be built, so nothing is imported or called. `NeedsGlobal` otherwise."""
    return _NoGlobals(io.BytesIO(data)).load()


@dataclass
class Upgrade:
    """What one pass did: jobs rewritten as JSON, refused (with their ids), already JSON."""

    rewritten: int = 0
    refused: int = 0
    unchanged: int = 0


def migrate_directory(client: redis.Redis) -> int | None:
    """Move the ids of a store's legacy id indexes into the directory (`storage.directory`).

    None when there were none (the step is done, or the store never had them); else how many
    ids were moved (an id whose record expired is dropped instead).
    """
    moved = directory.migrate(client)
    if moved:
        log.warning("upgrade: %d judgement id(s) moved into the id directory", moved)
    return moved


def backfill_unstarted_index(client: redis.Redis) -> int | None:
    """Put the judgements queued or waiting before the unstarted index into it
    (`storage.unstarted`), once per store: None when it was done already; else how many."""
    added = unstarted.backfill(client)
    if added:
        log.warning("upgrade: %d unstarted judgement(s) added to the oldest-waiting index", added)
    return added


def backfill_stale_index(client: redis.Redis) -> int | None:
    """Put the judgements queued at a batch tier before the index by last update into it
    (`storage.stale`), once per store: None when it was done already; else how many."""
    added = stale.backfill(client)
    if added:
        log.warning("upgrade: %d queued judgement(s) added to the reconciliation index", added)
    return added


def ensure_upgraded(client: redis.Redis) -> Upgrade | None:
    """Run `upgrade_jobs` unless the store is marked upgraded; None when it already was.

    The indexes' steps (`migrate_directory`, `backfill_unstarted_index`,
    `backfill_stale_index`) run first, each under its own mark.
    """
    migrate_directory(client)
    backfill_unstarted_index(client)
    backfill_stale_index(client)
    if rqstate.jobs_upgraded(client):
        return None
    return upgrade_jobs(client)


def upgrade_jobs(client: redis.Redis) -> Upgrade:
    """Rewrite every pickled job hash as JSON (or refuse it), then mark the store upgraded."""
    done = Upgrade()
    pattern = f"{Job.redis_job_namespace_prefix}*"
    for key in rqstate.hash_keys(client, pattern):
        outcome = upgrade_job(client, key)
        if outcome == "rewritten":
            done.rewritten += 1
        elif outcome == "refused":
            done.refused += 1
        else:
            done.unchanged += 1
    rqstate.mark_jobs_upgraded(
        client, {"at": time.time(), "rewritten": done.rewritten, "refused": done.refused}
    )
    if done.rewritten or done.refused:
        log.warning(
            "upgrade: %d pickled RQ job(s) rewritten as JSON, %d refused (they needed a global)",
            done.rewritten,
            done.refused,
        )
    return done


def _inflate(data: bytes) -> bytes:
    try:
        return zlib.decompress(data)
    except zlib.error:
        return data  # RQ's own fallback: stored uncompressed


def _pickled(data: bytes | None) -> bool:
    # RQ pickles with the highest protocol, whose first opcode is PROTO (0x80); JSON never starts so.
    return data is not None and data[:1] == b"\x80"


def _as_json(data: bytes, *, meta: bool) -> bytes:
    """The JSON of a pickled job tuple (or `meta` dict), or the refusal saying why not."""
    try:
        value = no_globals_loads(data)
    except NeedsGlobal as error:
        raise RefusedEntryPoint("global", error.name) from None
    except Exception:
        raise RefusedData("a pickle that cannot be decoded") from None
    if meta:
        shaped = isinstance(value, dict)
    else:
        shaped = isinstance(value, tuple) and len(value) == 4 and isinstance(value[0], str)
    if not shaped or not is_plain(value):
        raise RefusedData("a pickle that is not a dispatchq job's plain data")
    return JSONSerializer.dumps(list(value) if isinstance(value, tuple) else value)


def upgrade_job(client: redis.Redis, key: str) -> str:
    """Rewrite one job hash: `rewritten`, `refused` or `unchanged` (already JSON, or gone).

    A compare-and-set: the hash is watched while it is read and decoded, and written only if
    nobody changed it meanwhile (then it is read again), so concurrent passes agree.
    """
    refusals: list[RefusedEntryPoint] = []

    def decide(values: list[bytes | None]) -> tuple[str, dict[Any, Any] | None]:
        data, meta, seen = values
        raw = _inflate(data) if data is not None else None
        if seen is not None or (not _pickled(raw) and not _pickled(meta)):
            return "unchanged", None
        fields: dict[Any, Any] = {}
        try:
            if raw is not None and _pickled(raw):
                fields["data"] = zlib.compress(_as_json(raw, meta=False))
            if meta is not None and _pickled(meta):
                fields["meta"] = _as_json(meta, meta=True)
        except RefusedEntryPoint as refused:
            # Marked in the same compare-and-set, so of passes running at once only
            # one refuses it (and logs it); its data stays as it was, never read again.
            refusals.append(refused)
            return "refused", {_REFUSED: str(refused)}
        return "rewritten", fields

    outcome = rqstate.compare_and_set_hash(client, key, ["data", "meta", _REFUSED], decide)
    if outcome == "refused":
        _refuse(client, key, refusals[-1])
    return outcome


def _refuse(client: redis.Redis, key: str, refused: RefusedEntryPoint) -> None:
    """Fail the job with the one line, out of its queue and the schedule: it never runs."""
    job_id = key.removeprefix(Job.redis_job_namespace_prefix)
    try:
        job = DispatchqJob.fetch(job_id, connection=client)  # its data stays as it is, unread
    except NoSuchJobError:
        return
    rqstate.unschedule(client, rqstate.SCHEDULE, job.id)
    queue = DispatchqQueue(job.origin, connection=client) if job.origin else None
    refuse(job, refused, queue=queue)
