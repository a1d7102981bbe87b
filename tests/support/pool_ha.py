"""A credential pool across hosts: its config on a partition cluster, spawns per credential, and
contenders that race the real session admission for the last room under a spend cap.

The contenders are processes of their own (a host each: its own `DISPATCHQ_HOST`, runtime and
Redis link), each running a few threads. Every contender tries one admission per round; a
barrier shared by all of them starts each round at once, so the admissions of one round read
the pool's state together and then race for what is left. They stop together after the first
round that admitted nobody.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from dispatchq.queue.parts import QUEUE_PARTS
from dispatchq.runtime import Runtime
from dispatchq.settings import load_settings
from dispatchq.tiers.session import Admission, admit, model_of
from tests.support.partition import CONFIG, Cluster
from tests.support.pool_config import pool_text, write_secret

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import SynchronizedArray
    from multiprocessing.synchronize import Barrier

__all__ = [
    "MAX_ROUNDS",
    "RaceTally",
    "pool_config",
    "race_admissions",
    "retriggers",
    "sample_max",
    "secret",
    "spawns_on",
    "tally",
]

#: A race that has not settled after this many rounds is a failure of its own (see `tally`).
MAX_ROUNDS = 40


def secret(cluster: Cluster, name: str, value: str) -> Path:
    """A credential file as an operator keeps one (owner-only)."""
    return write_secret(cluster.tmp, name, value)


def pool_config(cluster: Cluster, credentials: str, kinds_extra: str = "") -> None:
    """The cluster's config with a `credentials:` section (read by every host started after)."""
    text = pool_text(CONFIG, credentials, kinds_extra)
    (cluster.tmp / "dispatchq.yaml").write_text(text)
    cluster.rt.__dict__.pop("config", None)
    cluster.rt.__dict__.pop("window", None)


def spawns_on(cluster: Cluster, credential: str, host: str | None = None) -> int:
    """Sessions given `credential` (the fake logs the one it saw), on one host or on all."""
    count = 0
    for name in [host] if host is not None else list(cluster.links):
        log = cluster.tmp / f"spawns-{name}.log"
        lines = log.read_text().splitlines() if log.exists() else []
        count += sum(1 for line in lines if line.split()[2:3] == [credential])
    return count


def retriggers(cluster: Cluster) -> list[tuple[str, int]]:
    """The scheduled lifts (`jobs.tiers.retrigger`): (scope, epoch second)."""
    out = []
    for job, when in cluster.rt.scheduler.get_jobs(with_times=True):
        if job.func_name == "jobs.tiers.retrigger":
            at = when.replace(tzinfo=UTC) if when.tzinfo is None else when
            out.append((str(job.args[0]), round(at.timestamp())))
    return out


# --- the race ---------------------------------------------------------------------------------
def race_admissions(
    env: dict[str, str],
    threads: int,
    cost: float,
    barrier: Barrier,
    admitted_per_round: SynchronizedArray[int],
    out: str,
) -> None:
    """One host: `threads` contenders admitting through `dispatchq.tiers.session.admit`.

    Each admission is settled at once with `cost` (what its session reported) and its slot
    given back, as a run that ended does. What each contender got is written to `out` (JSON:
    the admitted judgements and the reasons of its waits).
    """
    settings = load_settings(env)
    client = redis.Redis.from_url(env["DISPATCHQ_REDIS_URL"], socket_timeout=30)
    runtime = Runtime(settings=settings, redis=client, queue_parts=QUEUE_PARTS)
    host = env["DISPATCHQ_HOST"]
    kinds = runtime.config.kinds
    window = runtime.window
    seen: dict[str, list[Any]] = {"admitted": [], "waits": [], "errors": []}
    lock = threading.Lock()

    def model(kind_name: str) -> str | None:
        return model_of(kinds, kind_name)

    def contender(index: int) -> None:
        holder = f"{host}-racer-{index}"
        for round_ in range(MAX_ROUNDS):
            barrier.wait(timeout=30)
            try:  # whatever happens, the barrier must still be met: the race reports it
                decided = admit(window, host, holder, model)
                if isinstance(decided, Admission):
                    window.settle(decided.slot, cost)
                    window.release(decided.slot, decided.probes)
                    with admitted_per_round.get_lock():
                        admitted_per_round[round_] += 1
                    with lock:
                        seen["admitted"].append([decided.jid, decided.credential])
                else:
                    with lock:
                        seen["waits"].append(decided.why)
            except Exception as error:
                with lock:
                    seen["errors"].append(repr(error))
            barrier.wait(timeout=30)
            if admitted_per_round[round_] == 0:
                return

    workers = [threading.Thread(target=contender, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    Path(out).write_text(json.dumps(seen))
    client.close()


@dataclass(frozen=True)
class RaceTally:
    """What every contender of a race got."""

    admitted: list[tuple[str, str]]
    waits: list[str]
    errors: list[str]
    rounds: int


def tally(outs: list[Path], admitted_per_round: list[int]) -> RaceTally:
    admitted: list[tuple[str, str]] = []
    waits: list[str] = []
    errors: list[str] = []
    for path in outs:
        seen = json.loads(path.read_text())
        admitted += [(str(jid), str(cred)) for jid, cred in seen["admitted"]]
        waits += [str(w) for w in seen["waits"]]
        errors += [str(e) for e in seen["errors"]]
    rounds = next((i + 1 for i, n in enumerate(admitted_per_round) if n == 0), MAX_ROUNDS + 1)
    return RaceTally(admitted, waits, errors, rounds)


def sample_max(read: Callable[[], float], stop: threading.Event, into: list[float]) -> None:
    """Keep the highest value `read()` returned until `stop` is set (a watcher thread's body)."""
    top = 0.0
    while not stop.is_set():
        top = max(top, read())
    into.append(max(top, read()))
