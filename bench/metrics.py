"""`GET /metrics` at 0 and at N waiting judgements: a scrape costs the same however many wait.

    python3 ops/dev.py bench metrics                     # N = 100,000
    python3 ops/dev.py bench metrics --waiting 20000
    python bench/metrics.py --waiting 100000 --rounds 15

Two embedded Redis servers, each behind its own `/metrics` (uvicorn on 127.0.0.1, in this
process, as `bench/status.py` serves it): one store empty, one holding N session judgements
waiting on a closed window (enqueued through the batch API, `Client.enqueue_many`, 5,000 a
call, then the window closed, which moves them all to `waiting`). The two are scraped in turn, one scrape on
each side per round after a warm-up, so both see the same moment's load on a shared machine;
the medians are compared.

- goal: the N-side median scrape within 1.5x of the empty side's (the figures are read from
  counts and indexes, never from the waiting records);
- the plain alternative, reported beside it: the same scrape on the same N with the oldest
  waiting age found by the bounded scan the index replaced (`storage.histograms.oldest_waiting`,
  up to 10,000 records read per scrape), as a ratio to the empty side too;
- the upgrade: the one-time backfill of the N judgements into the index on that store with the
  index and its mark removed (`storage.unstarted.backfill`, run at a worker's, the scheduler's
  or `serve`'s start), and the ages it gives against the scan's.

Exits 1 when the goal is missed (`run.py` does too, for this benchmark).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: `python bench/metrics.py`
    sys.path.insert(0, str(ROOT))

from bench.common import Bench  # noqa: E402
from bench.status import fetch, serve  # noqa: E402
from dispatchq.client import Client  # noqa: E402
from dispatchq.core.tiers import TIERS  # noqa: E402
from dispatchq.queue.parts import QUEUE_PARTS  # noqa: E402
from dispatchq.runtime import Runtime  # noqa: E402
from dispatchq.settings import load_settings  # noqa: E402
from dispatchq.storage import histograms, keys, unstarted  # noqa: E402
from dispatchq.storage.connection import EmbeddedRedis  # noqa: E402
from dispatchq.workers.status import collect_status  # noqa: E402

CONFIG = 'kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n'
GOAL_RATIO = 1.5
BATCH = 5_000


def populate(rt: Runtime, n: int) -> tuple[float, str | None]:
    """N session judgements waiting on a closed window, through the batch API: seconds it took,
    and the first one's id (the oldest)."""
    started = time.perf_counter()
    first: str | None = None
    client = Client(runtime=rt)
    for start in range(0, n, BATCH):
        batch = [
            {"kind": "ask", "target": f"bench/repo#{i}", "item": f"comment {i}"}
            for i in range(start, min(n, start + BATCH))
        ]
        done = client.enqueue_many(batch)
        if any(e.error for e in done):
            raise SystemExit(f"enqueue refused: {next(e.error for e in done if e.error)}")
        first = first or done[0].id
    # Closing the window moves every judgement in the line to `waiting`, with the window's reason.
    rt.window.close(datetime.now(UTC) + timedelta(hours=5), reason="bench: window closed")
    return time.perf_counter() - started, first


def scan_side(rt: Runtime) -> Runtime:
    """The same store, its oldest waiting ages found by the bounded scan (the plain alternative)."""
    other = Runtime(settings=rt.settings, redis=rt.redis, queue_parts=QUEUE_PARTS)
    area = other.storage.histograms
    area.oldest_waiting = lambda now=None: histograms.oldest_waiting(rt.redis, now)  # type: ignore[method-assign]
    return other


def scrape_turns(urls: dict[str, str], rounds: int) -> dict[str, list[float]]:
    """Each side scraped once per round, in turn; the seconds of every scrape per side."""
    times: dict[str, list[float]] = {name: [] for name in urls}
    for url in urls.values():
        fetch(url)  # warm: imports and script loading
    for _ in range(rounds):
        for name, url in urls.items():
            started = time.perf_counter()
            body = fetch(url)
            times[name].append(time.perf_counter() - started)
            if b"dispatchq_oldest_waiting_age_seconds" not in body:
                raise SystemExit(f"{name}: /metrics has no oldest waiting age")
    return times


def run_metrics(bench: Bench, n: int, rounds: int) -> dict[str, Any]:
    bench.redis.flushall()
    bench.config(CONFIG)
    settings = load_settings(bench.env)
    full = Runtime(settings=settings, redis=bench.redis, queue_parts=QUEUE_PARTS)
    empty_server = EmbeddedRedis(bench.workdir / "redis-empty")
    empty_server.ensure_running()
    servers: list[Any] = []
    try:
        empty = Runtime(settings=settings, redis=empty_server.client(), queue_parts=QUEUE_PARTS)
        populate_s, first = populate(full, n)
        status = collect_status(full)
        if status.judgements["waiting"] != n:
            raise SystemExit(f"expected {n} waiting, status says {status.judgements}")
        oldest = full.storage.histograms.oldest_waiting()
        if n and not oldest["session"] > 0:
            raise SystemExit(f"no oldest waiting age with {n} waiting: {oldest}")

        sides = {"empty": empty, "waiting": full, "waiting_scan": scan_side(full)}
        urls = {}
        for name, rt in sides.items():
            url, server, thread = serve(rt)
            servers.append((server, thread))
            urls[name] = f"{url}/metrics"
        times = scrape_turns(urls, rounds)
    finally:
        for server, thread in servers:
            server.should_exit = True
            thread.join(timeout=10)
        empty_server.stop()

    med = {name: statistics.median(values) for name, values in times.items()}
    backfill_s, backfilled, agree = upgrade(full, first)
    bench.redis.flushall()  # else the server's shutdown save of N records outlasts its stop timeout
    ratio = med["waiting"] / med["empty"]
    return {
        "waiting": n,
        "rounds": rounds,
        "populate_s (window closed, enqueue_many)": round(populate_s, 1),
        "scrape_ms": {name: round(m * 1000, 2) for name, m in med.items()},
        "ratio (N waiting / empty)": round(ratio, 2),
        "paired ratio (median of the rounds' ratios)": round(
            statistics.median(w / e for w, e in zip(times["waiting"], times["empty"], strict=True)), 2
        ),
        "ratio with the scan (plain alternative / empty)": round(med["waiting_scan"] / med["empty"], 2),
        "target_ratio": GOAL_RATIO,
        "upgrade_backfill_s": round(backfill_s, 2),
        "upgrade_backfilled": backfilled,
        "upgrade_ages_right": agree,
        "scrape_ms_all": {name: [round(t * 1000, 2) for t in ts] for name, ts in times.items()},
        "met": ratio <= GOAL_RATIO and agree,
    }


def upgrade(rt: Runtime, first: str | None) -> tuple[float, int | None, bool]:
    """The store as the release before the index left it (no index, no mark), backfilled once;
    whether the ages it gives are the records' (the first judgement enqueued is the oldest)."""
    client = rt.redis
    client.delete(keys.UNSTARTED_INDEXED, *(keys.unstarted_index(t) for t in TIERS))
    started = time.perf_counter()
    added = unstarted.backfill(client)
    took = time.perf_counter() - started
    now = time.time()
    record = rt.storage.records.get(first) if first else None
    want = {t: 0.0 for t in TIERS}
    if record is not None and record.created_at is not None:
        want["session"] = now - record.created_at
    got = unstarted.oldest_waiting(client, now)
    return took, added, all(abs(got[t] - want[t]) < 1e-3 for t in TIERS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--waiting", type=int, default=100_000, help="waiting judgements on the full side")
    parser.add_argument("--rounds", type=int, default=15, help="scrapes per side (medians compared)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dispatchq-bench-metrics-") as tmp:
        bench = Bench(Path(tmp))
        try:
            data = run_metrics(bench, args.waiting, args.rounds)
        finally:
            bench.close()
    print(json.dumps(data, indent=2))
    return 0 if data["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
