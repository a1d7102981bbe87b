"""The commands dispatchq issues on RQ's and rq-scheduler's own keys.

RQ and rq-scheduler keep their queues, registries, job hashes and schedule under their own
names; dispatchq reads and fixes a few of them (a lost job found in no queue, a pickled job
rewritten as JSON, a cleaning lock cut short, the scheduler's fenced move). Those commands
live here, beside every other Redis command, as functions of a client (or of the pipeline
RQ hands in): the RQ subclasses that call them hold a connection, not a runtime. The
gateway's `jobs` area (`dispatchq.storage.gateway.Jobs`) offers the same to code holding a
runtime.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from redis.exceptions import WatchError

from dispatchq.core.text import as_text
from dispatchq.storage import keys

if TYPE_CHECKING:
    import redis
    from redis.client import Pipeline

__all__ = [
    "CONTROL_QUEUE",
    "SCHEDULE",
    "batch",
    "command_channel",
    "compare_and_set_hash",
    "cut_ttl",
    "drop_from_lists",
    "drop_scheduler_heartbeat",
    "expire_started_entry",
    "fenced_move",
    "forget_execution",
    "hash_keys",
    "in_list",
    "job_fields",
    "jobs_upgraded",
    "list_members",
    "mark_jobs_upgraded",
    "queue_name",
    "reschedule",
    "scheduler_alive",
    "scheduler_beat",
    "started_entries",
    "unschedule",
    "worker_info",
]

#: The RQ queue of the scheduler's own control jobs (retriggers).
CONTROL_QUEUE = keys.CONTROL_QUEUE
#: rq-scheduler's schedule: a sorted set of job ids by when each is due.
SCHEDULE = "rq:scheduler:scheduled_jobs"
#: A tier's RQ queue name (optionally bound to one host).
queue_name = keys.queue_name


# --- queues and job hashes ------------------------------------------------------------------
def in_list(client: redis.Redis, key: str, member: str) -> bool:
    """Whether `member` is in the list `key` (a queue, or the list a worker moves a job to)."""
    return client.lpos(key, member) is not None


def list_members(client: redis.Redis, lists: Sequence[str]) -> set[str]:
    """Every member of these lists, read in one round trip (a snapshot)."""
    found: set[str] = set()
    pipe = client.pipeline(transaction=False)
    for key in lists:
        pipe.lrange(key, 0, -1)
    for members in pipe.execute():
        found.update(as_text(m) or "" for m in members)
    return found


def job_fields(client: redis.Redis, job_keys: Sequence[str], names: Sequence[str]) -> list[list[str | None]]:
    """The fields `names` of each job hash, in one pipelined read (None where a hash is gone)."""
    pipe = client.pipeline(transaction=False)
    for key in job_keys:
        pipe.hmget(key, list(names))
    return [[as_text(v) for v in values] for values in pipe.execute()]


@contextmanager
def batch(client: redis.Redis) -> Iterator[Pipeline]:
    """A pipeline (no MULTI) whose commands, RQ's included, are sent together on exit."""
    with client.pipeline() as pipe:
        yield pipe
        pipe.execute()


def drop_from_lists(pipe: Pipeline, lists: Iterable[str], member: str) -> None:
    """Take `member` out of these lists, in the caller's pipeline."""
    for key in lists:
        pipe.lrem(key, 0, member)


def hash_keys(client: redis.Redis, pattern: str) -> Iterator[str]:
    """The names of the hashes matching `pattern` (a SCAN: safe on a large store)."""
    for raw in client.scan_iter(match=pattern, count=1000, _type="HASH"):
        yield as_text(raw) or ""


def compare_and_set_hash(
    client: redis.Redis,
    key: str,
    names: Sequence[str],
    decide: Callable[[list[bytes | None]], tuple[str, Mapping[Any, Any] | None]],
) -> str:
    """Read `names` of hash `key`, let `decide` say what to write, write it only if the hash
    did not change meanwhile (else read again). Returns `decide`'s outcome."""
    with client.pipeline() as pipe:
        while True:
            try:
                pipe.watch(key)
                outcome, fields = decide(cast("list[bytes | None]", pipe.hmget(key, list(names))))
                if not fields:
                    return outcome
                pipe.multi()
                pipe.hset(key, mapping=dict(fields))
                pipe.execute()
                return outcome
            except WatchError:
                continue


def jobs_upgraded(client: redis.Redis) -> bool:
    """Whether the store's pickled jobs were rewritten already (once per store)."""
    return bool(client.exists(keys.JOBS_UPGRADED))


def mark_jobs_upgraded(client: redis.Redis, summary: Mapping[str, Any]) -> None:
    client.set(keys.JOBS_UPGRADED, json.dumps(dict(summary)))


# --- registries -----------------------------------------------------------------------------
def started_entries(client: redis.Redis, registry_key: str) -> list[tuple[str, float]]:
    """A started registry's entries with their scores (when each is taken for abandoned)."""
    raw = cast("list[tuple[bytes, float]]", client.zrange(registry_key, 0, -1, withscores=True))
    return [(as_text(entry) or "", float(score)) for entry, score in raw]


def expire_started_entry(client: redis.Redis, registry_key: str, entry: str) -> None:
    """Mark one started entry expired now, so RQ's next cleanup takes it for abandoned."""
    client.zadd(registry_key, {entry: 0}, xx=True)


def worker_info(client: redis.Redis, name: str) -> dict[str, Any]:
    """What a worker published about itself (`Store.publish_worker`); {} when it expired."""
    loaded = json.loads(as_text(client.get(keys.worker_info(name))) or "{}")
    return loaded if isinstance(loaded, dict) else {}


def cut_ttl(client: redis.Redis, key: str, longest: int) -> None:
    """Shorten `key`'s time to live to `longest` seconds if it is longer."""
    if client.ttl(key) > longest:
        client.expire(key, longest)


def forget_execution(
    client: redis.Redis, registry_key: str, execution_key: str, execution_id: str, *, keep: bool
) -> int:
    """Drop one entry of a job's execution registry whose hash is gone (unless `keep`) or torn
    (no `created_at`): 1 when it was dropped."""
    if not keep and not client.exists(execution_key):
        return int(client.zrem(registry_key, execution_id))
    if client.exists(execution_key) and not client.hexists(execution_key, "created_at"):
        client.delete(execution_key)
        return int(client.zrem(registry_key, execution_id))
    return 0


# --- rq-scheduler's schedule ----------------------------------------------------------------
def unschedule(client: redis.Redis | Pipeline, schedule_key: str, job_id: str) -> bool:
    """Take a job off the schedule; True when this call took it (in a pipeline: queued)."""
    return bool(client.zrem(schedule_key, job_id))


def reschedule(pipe: Pipeline, schedule_key: str, job_id: str, at: float) -> None:
    pipe.zadd(schedule_key, {job_id: at})


def fenced_move(
    client: redis.Redis,
    schedule_key: str,
    job_id: str,
    move: Callable[[Pipeline], None],
    *,
    lock: tuple[str, str] | None,
    attempts: int,
) -> str:
    """Run `move` in one MULTI only while `job_id` is still scheduled and (with `lock`, a
    key and its holder) the lock is still ours; the WATCH makes check and move one step.

    `moved`; `gone` (moved or cancelled by someone else); `lapsed` (the lock is another's);
    `busy` (the schedule kept changing for `attempts` tries).
    """
    watched = [schedule_key, *([lock[0]] if lock else [])]
    with client.pipeline() as pipe:
        for _ in range(attempts):
            try:
                pipe.watch(*watched)
                if pipe.zscore(schedule_key, job_id) is None:
                    return "gone"
                if lock is not None and as_text(pipe.get(lock[0])) != lock[1]:
                    return "lapsed"
                pipe.multi()
                move(pipe)
                pipe.execute()
                return "moved"
            except WatchError:
                continue
    return "busy"


# --- the scheduler's heartbeat --------------------------------------------------------------
def scheduler_beat(client: redis.Redis, ttl: int) -> None:
    client.set(keys.SCHEDULER_HEARTBEAT, repr(time.time()), ex=ttl)


def scheduler_alive(client: redis.Redis) -> bool:
    return bool(client.exists(keys.SCHEDULER_HEARTBEAT))


def drop_scheduler_heartbeat(client: redis.Redis) -> None:
    client.delete(keys.SCHEDULER_HEARTBEAT)


def command_channel(
    client: redis.Redis,
    channel: str,
    handler: Callable[[dict[str, Any]], None],
    *,
    poll: float,
    on_error: Callable[..., None],
) -> tuple[Any, Any]:
    """A worker's RQ command channel, read by a thread that looks at its stop flag every `poll` s.

    redis-py (8.2 on) joins that thread when it is stopped, so `poll` bounds a worker's teardown.
    Returns the pubsub and its thread, as RQ keeps them.
    """
    pubsub = client.pubsub()
    pubsub.subscribe(**{channel: handler})
    return pubsub, pubsub.run_in_thread(sleep_time=poll, daemon=True, exception_handler=on_error)
