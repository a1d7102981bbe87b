#!/usr/bin/env python3
"""dispatchq benchmarks, each against bare RQ (or the naive way) in the same run, as a ratio.

    python3 ops/dev.py bench                  # all of them
    python3 ops/dev.py bench foundation -n 20000
    python3 ops/dev.py bench typed resume

Every side is a whole process started from here (start-up included, amortised by N), on
one Redis server started for the run. Results are printed and written to
bench/results/<name>.json. Timing lives here, never in the test suite.

- foundation: JSON Lines batch enqueue (`dispatchq enqueue -`) against a script calling RQ's
  `enqueue` N times (target >= 5x), and code-tier judgements/s (`dispatchq worker code
  --burst`) against a bare RQ `SimpleWorker` running N no-op jobs (target >= 2x).
- typed: k judgements over s distinct states through the typed worker against the loopback
  fake of the TypeSafe API: provider requests (target: s) and judgements/s, against the
  same judgements one request each.
- resume: lift instant -> first spawn, median over several lifts (target <= 1 s), and
  spawns while the window was closed (target 0), with real worker and scheduler processes
  and a fake session command; against a bare RQ worker held by `rq suspend` and resumed by a
  poller that checks every 5 s (the shortest interval tools in use today poll at).
- webhooks (`bench/webhooks.py`): signed GitHub deliveries per second accepted by `dispatchq
  serve` end to end (verified, mapped, enqueued for a typed worker) against a bare Starlette
  endpoint that only verifies the signature (target >= 0.5x).
- typed-concurrency (`bench/typed.py`): judgements/s over 50 states with the loopback API
  answering after 200 ms, DISPATCHQ_TYPED_CONCURRENCY 1 against 4 (target >= 3x), one request
  per distinct state either way.
- status (`bench/status.py`): `status` with 100,000 session judgements waiting on a closed
  window: the function, the CLI, `GET /status` and `GET /metrics` (target <= 100 ms),
  against the same function plus the old per-reason scan of every waiting record.
- metrics (`bench/metrics.py`, not in the default set: it enqueues 100,000 judgements): a
  `GET /metrics` scrape with N judgements waiting against one on an empty store, taking turns
  (target <= 1.5x), with the bounded scan the oldest-waiting index replaced beside it, and the
  index's one-time backfill on an upgraded store. A missed target makes the run exit 1.
- backlog (`bench/backlog.py`, not in the default set): N = 10,000, 100,000 and 1,000,000 session
  judgements waiting on a closed window while a code worker answers 100,000 more: Redis bytes
  per waiting judgement (target <= 1,024 at 1M; a plain server's beside it), idle commands/s
  (<= 50) and CPU (<= 5 %), `status --json` (<= 0.5 s), the code rate by decile (>= 0.8x of
  N = 10,000's). A missed target makes the run exit 1.
- faults (`bench/faults.py`, not in the default set): the fault suite's scenarios at scale
  (10,000 judgements, 20 worker kills, 4 Redis kills with `everysec` and with `always`):
  acknowledged, answered, answered twice, lost, stuck, processes exited, time to recover.
- cli (`bench/cli_start.py`): `dispatchq --help` and `dispatchq status` on an idle server
  against `rq --help` and `rq info` (targets: 0.3 s and 0.6 s).
- pools (`bench/pools.py`): three credentials (two subscriptions, one metered with a day cap
  serving urgent only) whose windows close at set counts, through the real admission:
  judgements waiting while a credential they may use had room (target 0), spawns into a
  closed window per limit hit (target 1), metered spend past the cap (target <= one
  session's estimate), admission per judgement against one `default` credential (<= 1.2x).
  A missed target makes the run exit 1.
- serve-flood (`bench/serve_flood.py`, not in the default set): 1,000 idle connections from
  one client, then `/healthz`, a signed webhook and a logged-in `/status` from another (target:
  each 200 within 1 s), and 256 slow 5 MB webhook bodies in flight (target: RSS < 300 MB),
  against a plain Starlette receiver under uvicorn's `limit_concurrency`.
- enqueue (`bench/enqueue.py`): `dispatchq enqueue -` and `POST /judgements` against raw
  redis-py pipelines writing the same records (what the store writes, read back from the server;
  targets >= 0.5x), and `enqueue -` against RQ's `Queue.enqueue` x N (target >= 5x), in one
  run. A missed target makes the run exit 1.
- sessions (`bench/sessions.py`, not in the default set): spawns per judgement with the real
  Claude Code CLI for each case of the real-client layer, the layer's run time, and a plain
  retry loop's wasted spawns over the same limit and the same refused credential.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.backlog import run_backlog  # noqa: E402
from bench.cli_start import run_cli_start  # noqa: E402
from bench.common import PY, Bench, write_jsonl  # noqa: E402
from bench.enqueue import run_enqueue  # noqa: E402
from bench.faults import QUICK, run_faults  # noqa: E402
from bench.metrics import run_metrics  # noqa: E402
from bench.pools import run_pools  # noqa: E402
from bench.serve_flood import run_serve_flood  # noqa: E402
from bench.sessions import run_sessions  # noqa: E402
from bench.status import run_status  # noqa: E402
from bench.typed import typed_concurrency  # noqa: E402
from bench.webhooks import run_webhooks  # noqa: E402

RESULTS = ROOT / "bench" / "results"

# The embedded server has a password: the bare-RQ side gets its URL in the environment
# (BENCH_REDIS_URL), never on a command line every user can read in /proc.
BARE_RQ = r"""
import os, sys, time
import redis
from rq import Queue, SimpleWorker
from bench.noop import noop
conn = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
q = Queue("bench-bare", connection=conn)
if sys.argv[1] == "enqueue":
    for i in range(int(sys.argv[2])):
        q.enqueue(noop, i, result_ttl=0)
else:
    SimpleWorker([q], connection=conn).work(burst=True, logging_level="WARNING")
"""


def foundation(bench: Bench, n: int, repeat: int) -> dict[str, Any]:
    """Both sides alternate `repeat` times on the same Redis; medians are compared."""
    shutil.copy(ROOT / "examples" / "checks.py", bench.workdir / "checks.py")  # beside the config
    bench.config("kinds:\n  noop:\n    check: checks:noop\n")
    jsonl = bench.workdir / "noop.jsonl"
    write_jsonl(jsonl, [{"kind": "noop", "target": f"bench/{i}", "state": {"i": i}} for i in range(n)])
    times: dict[str, list[float]] = {"rq_enqueue": [], "dq_enqueue": [], "rq_work": [], "dq_work": []}
    for _ in range(repeat):
        bench.redis.flushall()
        times["rq_enqueue"].append(bench.timed([PY, "-c", BARE_RQ, "enqueue", str(n)], env=bench.bare_env()))
        times["dq_enqueue"].append(bench.timed(bench.dispatchq("enqueue", "-"), stdin=jsonl))
        times["rq_work"].append(bench.timed([PY, "-c", BARE_RQ, "work"], env=bench.bare_env()))
        times["dq_work"].append(bench.timed(bench.dispatchq("worker", "code", "--burst", "--quiet")))
        answered = int(bench.redis.get("dispatchq:stats:answered:code") or 0)
        if answered != n:
            raise SystemExit(f"expected {n} judgements answered by the code tier, found {answered}")
    med = {name: statistics.median(values) for name, values in times.items()}
    return {
        "n": n,
        "repeat": repeat,
        "enqueue": {
            "dispatchq_per_s": n / med["dq_enqueue"],
            "bare_rq_per_s": n / med["rq_enqueue"],
            "ratio": med["rq_enqueue"] / med["dq_enqueue"],
            "target_ratio": 5.0,
        },
        "code_tier": {
            "dispatchq_per_s": n / med["dq_work"],
            "bare_rq_per_s": n / med["rq_work"],
            "ratio": med["rq_work"] / med["dq_work"],
            "target_ratio": 2.0,
        },
        "seconds": times,
    }


def typed(bench: Bench, k: int, s: int) -> dict[str, Any]:
    from dispatchq.testing.typesafe import FakeTypeSafeProcess

    bench.config(
        "kinds:\n"
        "  actionable:\n"
        "    questions:\n"
        '      actionable: {type: noul, instructions: "Does this ask for a code change?"}\n'
        "    answer: actionable\n"
        "    escalate: needs-triage\n"
    )
    jsonl = bench.workdir / "typed.jsonl"
    write_jsonl(
        jsonl,
        [
            {"kind": "actionable", "target": f"bench#{i}", "item": f"c{i}", "state": {"pr": i % s}}
            for i in range(k)
        ],
    )
    results: dict[str, Any] = {"k": k, "s": s}
    with FakeTypeSafeProcess(
        {"answers": {"actionable": {"type": "noul", "noul": 0.95}}}, workdir=bench.workdir
    ) as api:
        env = dict(bench.env, TYPESAFE_API_KEY="test-key", TYPESAFE_BASE_URL=api.url)
        # The naive side: every judgement its own request (one question per request).
        for label, cap in (("batched", "64"), ("one_request_each", "1")):
            bench.redis.flushall()
            api.reset()
            run_env = dict(env, DISPATCHQ_TYPED_MAX_QUESTIONS=cap)
            bench.timed(bench.dispatchq("enqueue", "-"), stdin=jsonl, env=run_env)
            elapsed = bench.timed(bench.dispatchq("worker", "typed", "--burst", "--quiet"), env=run_env)
            answered = int(bench.redis.get("dispatchq:stats:answered:typed") or 0)
            if answered != k:
                raise SystemExit(f"{label}: expected {k} typed answers, found {answered}")
            requests = api.request_count
            results[label] = {
                "requests": requests,
                "requests_per_judgement": requests / k,
                "judgements_per_s": k / elapsed,
                "seconds": elapsed,
            }
    results["ratio"] = (
        results["batched"]["judgements_per_s"] / results["one_request_each"]["judgements_per_s"]
    )
    results["target_requests"] = s
    return results


def resume(bench: Bench, lifts: int) -> dict[str, Any]:
    spawn_log = bench.workdir / "spawns.log"
    bench.config('kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n')
    env = dict(
        bench.env,
        DISPATCHQ_SESSION_COMMAND=(
            f"{PY} {ROOT / 'bench' / 'timed_session.py'} {spawn_log} -p --output-format stream-json --verbose"
        ),
        DISPATCHQ_PROBE_GRACE="1",
    )
    bench.redis.flushall()
    worker = subprocess.Popen(bench.dispatchq("worker", "session", "--quiet"), env=env, cwd=ROOT)
    scheduler = subprocess.Popen(
        bench.dispatchq("scheduler"), env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    latencies: list[float] = []
    closed_spawns = 0
    try:
        for i in range(lifts):
            spawn_log.write_text("")
            lift = time.time() + 3.0
            until = (
                time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(lift)) + f".{int(lift % 1 * 1e6):06d}+00:00"
            )
            bench.timed(bench.dispatchq("window", "close", "--until", until, "--reason", "bench"), env=env)
            bench.timed(bench.dispatchq("enqueue", "--kind", "ask", "--target", f"lift-{i}"), env=env)
            deadline = time.time() + 30
            while time.time() < deadline and not spawn_log.read_text().strip():
                time.sleep(0.005)
            first = spawn_log.read_text().strip().splitlines()
            if not first:
                raise SystemExit("no session was spawned after the lift")
            spawned_at = float(json.loads(first[0])["time"])
            if spawned_at < lift:
                closed_spawns += 1
            latencies.append(spawned_at - lift)
            time.sleep(0.5)
    finally:
        for proc in (worker, scheduler):
            proc.terminate()
            proc.wait(timeout=30)
    baseline = rq_poller_resume(bench, lifts)
    median = statistics.median(latencies)
    return {
        "lifts": lifts,
        "median_lift_to_spawn_s": median,
        "max_lift_to_spawn_s": max(latencies),
        "latencies_s": latencies,
        "spawns_while_closed": closed_spawns,
        "target_s": 1.0,
        "bare_rq_5s_poller": baseline,
        "ratio": baseline["median_lift_to_start_s"] / max(median, 1e-3),
    }


BARE_RQ_SUSPENDED = r"""
import os
import redis
from rq import Queue, SimpleWorker
conn = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
SimpleWorker([Queue("bench-resume", connection=conn)], connection=conn).work(logging_level="WARNING")
"""


def rq_poller_resume(bench: Bench, lifts: int, period: float = 5.0) -> dict[str, Any]:
    """Bare RQ the ways people hold work for a usage window today.

    - `rq suspend`, then `rq resume` from a poller: an idle worker blocked in its dequeue
      still takes the next job while suspended (it checks suspension only between jobs),
      so spawns happen while the window is closed: counted as `started_while_suspended`.
    - A poller that holds the work and enqueues it once it sees the lift time passed,
      checking every 5 s (the shortest interval in use): its lift-to-start latency.
    """
    from rq import Queue
    from rq.suspension import resume as rq_resume
    from rq.suspension import suspend as rq_suspend

    stamps = bench.workdir / "rq-starts.log"
    conn = bench.redis
    queue = Queue("bench-resume", connection=conn)
    worker = subprocess.Popen([PY, "-c", BARE_RQ_SUSPENDED], cwd=ROOT, env=bench.bare_env())

    def first_start(deadline: float) -> float | None:
        while time.time() < deadline:
            text = stamps.read_text().split()
            if text:
                return float(text[0])
            time.sleep(0.005)
        return None

    leaked = 0
    latencies: list[float] = []
    try:
        time.sleep(1.0)  # the worker is up and idle, as it would be while waiting for a window
        for _ in range(lifts):
            stamps.write_text("")
            rq_suspend(conn)
            lift = time.time() + 2.0
            queue.enqueue("bench.noop.stamp", str(stamps), result_ttl=0)
            started = first_start(lift)
            if started is not None and started < lift:
                leaked += 1
            while time.time() < lift:
                time.sleep(0.01)
            rq_resume(conn)
            first_start(time.time() + 30)
        for i in range(lifts):
            stamps.write_text("")
            lift = time.time() + 2.0
            next_poll = time.time() + period * ((i * 0.37) % 1)  # the poller's phase is unrelated to the lift
            while True:
                now = time.time()
                if now >= next_poll:
                    next_poll += period
                    if now >= lift:
                        queue.enqueue("bench.noop.stamp", str(stamps), result_ttl=0)
                        break
                time.sleep(0.005)
            started = first_start(time.time() + 30)
            if started is None:
                raise SystemExit("the bare RQ worker did not start the job")
            latencies.append(started - lift)
    finally:
        rq_resume(conn)
        worker.terminate()
        worker.wait(timeout=30)
    return {
        "rq_suspend_started_while_suspended": f"{leaked} of {lifts}",
        "poll_every_s": period,
        "median_lift_to_start_s": statistics.median(latencies),
        "latencies_s": latencies,
    }


def report(name: str, data: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2))
    print(f"\n== {name}")
    print(json.dumps(data, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "which",
        nargs="*",
        default=["foundation", "typed", "resume", "webhooks", "status", "cli", "pools", "enqueue"],
    )
    parser.add_argument("-n", type=int, default=20_000, help="judgements for the foundation benchmark")
    parser.add_argument("-k", type=int, default=1_000, help="typed judgements")
    parser.add_argument("-s", type=int, default=20, help="distinct states among the typed judgements")
    parser.add_argument("--lifts", type=int, default=5, help="lifts for the resume benchmark")
    parser.add_argument("--states", type=int, default=50, help="states for typed-concurrency")
    parser.add_argument("--latency", type=float, default=0.2, help="API latency for typed-concurrency (s)")
    parser.add_argument("--repeat", type=int, default=3, help="foundation runs per side (medians compared)")
    parser.add_argument("--rounds", type=int, default=7, help="webhooks: rounds per side (paired, medians)")
    parser.add_argument("--kills", type=int, default=20, help="worker kills for the faults benchmark")
    parser.add_argument("--redis-kills", type=int, default=4, help="Redis kills per faults scenario")
    parser.add_argument(
        "--waiting",
        type=int,
        default=100_000,
        help="waiting judgements for the status and metrics benchmarks",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="faults at a small scale (1,000; 3 and 2 kills); pools at N 120, K 200",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="dispatchq-bench-"))
    bench = Bench(workdir)
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "foundation": lambda: foundation(bench, args.n, args.repeat),
        "typed": lambda: typed(bench, args.k, args.s),
        "resume": lambda: resume(bench, args.lifts),
        "typed-concurrency": lambda: typed_concurrency(bench, args.states, args.latency),
        "status": lambda: run_status(bench, args.waiting, 9),
        # --waiting judgements on the full side; --rounds scrapes per side (default 21 here).
        "metrics": lambda: run_metrics(bench, args.waiting, args.rounds if args.rounds != 7 else 21),
        "cli": lambda: run_cli_start(bench),
        # Not in the default set: a million judgements; each N brings its own Redis.
        "backlog": lambda: (
            run_backlog([1_000, 10_000], 10_000, 12.0)
            if args.quick
            else run_backlog([10_000, 100_000, 1_000_000], 100_000, 30.0)
        ),
        # Not in the default set: each scenario brings its own Redis and takes minutes.
        "faults": lambda: (
            run_faults(**QUICK)
            if args.quick
            else run_faults(args.n if args.n != 20_000 else 10_000, args.kills, args.redis_kills)
        ),
        # Its own Redis and two servers; -n is the deliveries per side and round (default 1,000).
        "webhooks": lambda: run_webhooks(args.n if args.n != 20_000 else 1_000, args.rounds),
        # Not in the default set: 1,000 idle connections and 1.3 GB of slow bodies, per side.
        "serve-flood": run_serve_flood,
        # -n judgements per side and round (default 20,000), --repeat rounds (default 3).
        "enqueue": lambda: run_enqueue(bench, args.n, args.repeat),
        "sessions": run_sessions,  # the real Claude Code CLI: spawns per case, the layer's time
        # -n judgements in the scenario (default 300), -k admissions per side (default 1,000).
        "pools": lambda: (
            run_pools(bench, 120, 200, 1)
            if args.quick
            else run_pools(bench, args.n if args.n != 20_000 else 300, args.k, args.repeat)
        ),
    }
    missed: list[str] = []
    try:
        for name in args.which:
            if name not in runs:
                parser.error(f"unknown benchmark {name!r} (choose from {', '.join(runs)})")
            data = runs[name]()
            report(name, data)
            if data.get("met") is False:  # a benchmark that gates on its targets (pools, metrics, enqueue)
                missed.append(name)
    finally:
        bench.close()
        shutil.rmtree(workdir, ignore_errors=True)
    if missed:
        print(f"\ntargets missed: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
