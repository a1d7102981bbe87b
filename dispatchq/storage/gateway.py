"""`Storage`: every Redis operation of dispatchq, one attribute per area, built once per runtime.

A reader lists what dispatchq does to Redis here (and in `docs/storage.md`, checked against
this class by a test): each area is a small class whose methods are the named operations,
and nothing outside `dispatchq/storage/` issues a Redis command, runs a Lua script or
spells a key name (an import-linter contract and `tests/unit/test_storage_boundary.py`
say so). A process builds one `Storage` on its client (`Runtime.storage`); an area is made
on first use, so a command that needs one area does not register the others' scripts.

RQ's own objects (queues, jobs, workers, the scheduler) still receive the client itself:
what they do with it is RQ's business. What dispatchq does to RQ's keys is the `jobs` area
(`storage.rqstate`).
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from dispatchq.core.status import ServerFacts
from dispatchq.storage import histograms, history, rqstate, unstarted
from dispatchq.storage.facts import server_facts
from dispatchq.storage.findings import FindingsStore
from dispatchq.storage.locks import LeasedLock
from dispatchq.storage.outage import require_room
from dispatchq.storage.pools import PoolStore
from dispatchq.storage.sentinel import await_replica
from dispatchq.storage.serve import ServeStorage
from dispatchq.storage.store import Store
from dispatchq.storage.triage import TriageStorage
from dispatchq.storage.typed import TypedStorage
from dispatchq.storage.usage import UsageStore
from dispatchq.storage.window import WindowStore

if TYPE_CHECKING:
    import redis

    from dispatchq.settings import Settings

__all__ = [
    "AREAS",
    "Histograms",
    "History",
    "Jobs",
    "Scheduler",
    "Server",
    "Storage",
    "area_classes",
]


class History:
    """The 24-hour history of the counters, one sample a minute."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def sample(self, now: float, *, window_closed: bool) -> bool:
        """Sample the counters for the minute `now` is in; False if it has one already."""
        return history.record_sample(self._redis, now, window_closed=window_closed)

    def read(self, now: float) -> list[history.Point]:
        return history.read_history(self._redis, now)


class Histograms:
    """The latency histograms `/metrics` exposes, and the oldest waiting judgement per tier."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def read(self) -> dict[str, dict[str, histograms.Histogram]]:
        return histograms.read_histograms(self._redis)

    def oldest_waiting(self, now: float | None = None) -> dict[str, float]:
        """Per tier, the oldest unstarted judgement's age, from the index (`storage.unstarted`)."""
        return unstarted.oldest_waiting(self._redis, now)


class Jobs:
    """What dispatchq reads and fixes on RQ's own keys (`storage.rqstate`), for a runtime."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def queue_name(self, tier: str, host: str | None = None) -> str:
        """A tier's RQ queue name (optionally bound to one host)."""
        return rqstate.queue_name(tier, host)

    def control_queue(self) -> str:
        """The RQ queue of the scheduler's own control jobs."""
        return rqstate.CONTROL_QUEUE

    def in_list(self, key: str, member: str) -> bool:
        return rqstate.in_list(self._redis, key, member)

    def list_members(self, lists: Sequence[str]) -> set[str]:
        return rqstate.list_members(self._redis, lists)

    def job_fields(self, job_keys: Sequence[str], names: Sequence[str]) -> list[list[str | None]]:
        return rqstate.job_fields(self._redis, job_keys, names)

    def worker_info(self, name: str) -> dict[str, Any]:
        return rqstate.worker_info(self._redis, name)


class Scheduler:
    """The scheduler's heartbeat: how `status` knows one is running."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def beat(self, ttl: int) -> None:
        rqstate.scheduler_beat(self._redis, ttl)

    def alive(self) -> bool:
        return rqstate.scheduler_alive(self._redis)

    def stopped(self) -> None:
        rqstate.drop_scheduler_heartbeat(self._redis)


class Server:
    """The server as a whole: does it answer, is there room, did a write reach a replica."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def ping(self) -> bool:
        return bool(self._redis.ping())

    def require_room(self) -> None:
        """Refuse (one line) when Redis is at `maxmemory` with nothing to evict."""
        require_room(self._redis)

    def await_replica(self, settings: Settings) -> None:
        """Wait until the last write reached a replica, when the settings ask for one."""
        await_replica(self._redis, settings)

    def facts(self) -> ServerFacts:
        """What `status` shows of the server in effect (`storage.facts`)."""
        return server_facts(self._redis)

    def lock(self, key: str, holder: str) -> LeasedLock:
        """A lock with a lease, owned by `holder` (`storage.locks`)."""
        return LeasedLock(self._redis, key, holder)


class Storage:
    """One process's storage gateway: an attribute per area, each made once on first use."""

    def __init__(self, client: redis.Redis, *, result_ttl: int = 7 * 86_400) -> None:
        self.redis = client
        self.result_ttl = result_ttl

    @cached_property
    def records(self) -> Store:
        """Judgement records: create, claim, transition, lines, leases, counts, workers."""
        return Store(self.redis, result_ttl=self.result_ttl)

    @cached_property
    def window(self) -> WindowStore:
        """The usage window's markers, probes, slots, lines' heads and host blocks."""
        return WindowStore(self.redis)

    @cached_property
    def usage(self) -> UsageStore:
        """The window's usage as sessions reported it, and when each host's login ends."""
        return UsageStore(self.redis)

    @cached_property
    def pool(self) -> PoolStore:
        """The credentials' slots, spend reservations and settlements, and blocks."""
        return PoolStore(self.redis)

    @cached_property
    def typed(self) -> TypedStorage:
        """The typed tier's answer cache, per-state sets and request counts."""
        return TypedStorage(self.redis)

    @cached_property
    def triage(self) -> TriageStorage:
        """Triage decisions, budgets, the ledger, labels and the recording executor's state."""
        return TriageStorage(self.redis)

    @cached_property
    def serve(self) -> ServeStorage:
        """What `dispatchq serve` reads synchronously (deliveries, id prefixes)."""
        return ServeStorage(self.redis)

    @cached_property
    def findings(self) -> FindingsStore:
        """The decision gate's lines, dispatch log, approvals and fixer attempts."""
        return FindingsStore(self.redis)

    @cached_property
    def history(self) -> History:
        return History(self.redis)

    @cached_property
    def histograms(self) -> Histograms:
        return Histograms(self.redis)

    @cached_property
    def jobs(self) -> Jobs:
        return Jobs(self.redis)

    @cached_property
    def scheduler(self) -> Scheduler:
        return Scheduler(self.redis)

    @cached_property
    def server(self) -> Server:
        return Server(self.redis)


#: The areas, in the order `docs/storage.md` lists them.
AREAS: tuple[str, ...] = (
    "records",
    "window",
    "usage",
    "pool",
    "typed",
    "triage",
    "serve",
    "findings",
    "history",
    "histograms",
    "jobs",
    "scheduler",
    "server",
)


def area_classes() -> list[tuple[str, type]]:
    """(area, class) for each area of `Storage`, for the docs page and its test."""
    return [(name, typing.get_type_hints(getattr(Storage, name).func)["return"]) for name in AREAS]
