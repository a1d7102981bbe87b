"""`status` with N session judgements waiting on a closed window: counters against the scan.

    python3 ops/dev.py bench status              # N = 100,000
    python3 ops/dev.py bench status --waiting 20000

Measured in one run on one Redis (medians of --repeat runs):

- `collect_status` (the function behind `status --json`, `/status`, `/metrics`), reading
  the live counters, against the plain alternative it replaced: the same function plus the
  per-reason breakdown that loads every waiting record (what `status` did before);
- `dispatchq status --json`, the whole CLI process (Python start-up included; the start-up
  alone, `dispatchq --help`, is reported beside it);
- `GET /status` and `GET /metrics` over HTTP from uvicorn on 127.0.0.1.

Target: <= 100 ms for the function and the routes (it was 5.9 s on a 2-core machine).
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from dispatchq.queue.parts import QUEUE_PARTS
from dispatchq.runtime import Runtime
from dispatchq.settings import load_settings
from dispatchq.storage import keys
from dispatchq.storage.store import NewRecord, Store
from dispatchq.window.marker import waiting_reason
from dispatchq.workers.status import collect_status

CONFIG = 'kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n'


def scan_breakdown(store: Store) -> dict[str, int]:
    """The plain alternative: every waiting record loaded, counted by reason (the old way)."""
    return dict(Counter(r.reason or "unknown" for r in store.get_many(store.ids("waiting")) if r is not None))


def populate(rt: Runtime, n: int) -> None:
    """N session judgements in the line, all waiting on a closed window (written in batches)."""
    marker = rt.window.close(datetime.now(UTC) + timedelta(hours=5), reason="bench: window closed")
    reason = waiting_reason(marker)  # what the window gives every judgement it holds back
    line = keys.session_line()
    batch = 2000
    for start in range(0, n, batch):
        entries = [
            NewRecord(
                id=f"bench-{i:07d}",
                content_key=f"bench-{i}",
                force="0",
                line=line,
                input=json.dumps({"kind": "ask", "target": f"bench/repo#{i}", "item": f"comment {i}"}),
                tier="session",
                effect="local",
                host="",
                job="",
                group="",
            )
            for i in range(start, min(n, start + batch))
        ]
        rt.storage.records.create_many(entries)
        pipe = rt.redis.pipeline(transaction=False)
        for e in entries:
            rt.storage.records.transition(
                e.id, "waiting", expect=["queued"], fields={"reason": reason}, pipe=pipe
            )
        pipe.execute()


def median_ms(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 1)


def serve(rt: Runtime) -> tuple[str, Any, threading.Thread]:
    import uvicorn
    from starlette.applications import Starlette

    from dispatchq.serve import metrics, page, status

    app = Starlette(
        routes=[*status.routes(lambda: rt), *metrics.routes(lambda: rt), *page.routes(lambda: rt)]
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, thread


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:
        return bytes(response.read())


def run_status(bench: Any, n: int, repeat: int) -> dict[str, Any]:
    bench.redis.flushall()
    bench.config(CONFIG)
    rt = Runtime(settings=load_settings(bench.env), redis=bench.redis, queue_parts=QUEUE_PARTS)
    started = time.perf_counter()
    populate(rt, n)
    populated_s = round(time.perf_counter() - started, 1)
    status = collect_status(rt)
    if status.judgements["waiting"] != n or status.waiting_by_class["window"] != n:
        raise SystemExit(f"expected {n} waiting on the window, status says {status.waiting_by_class}")
    scanned = scan_breakdown(rt.storage.records)
    if sum(scanned.values()) != n or status.waiting != scanned:
        raise SystemExit("the counters and the scan disagree")

    function_ms = median_ms(lambda: collect_status(rt), repeat)
    scan_ms = median_ms(
        lambda: (collect_status(rt), scan_breakdown(rt.storage.records)), 1 if n >= 50_000 else 3
    )
    cli_ms = round(
        statistics.median(bench.timed(bench.dispatchq("status", "--json")) for _ in range(3)) * 1000, 1
    )
    startup_ms = round(statistics.median(bench.timed(bench.dispatchq("--help")) for _ in range(3)) * 1000, 1)
    url, server, thread = serve(rt)
    try:
        fetch(f"{url}/metrics")  # warm: the first request pays for imports and script loading
        status_ms = median_ms(lambda: fetch(f"{url}/status"), repeat)
        metrics_ms = median_ms(lambda: fetch(f"{url}/metrics"), repeat)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        bench.redis.flushall()  # else the server's shutdown save of N records outlasts its stop timeout
    return {
        "waiting": n,
        "populate_s": populated_s,
        "collect_status_ms": function_ms,
        "collect_status_with_scan_ms (before)": scan_ms,
        "speedup (before / after)": round(scan_ms / function_ms, 1) if function_ms else None,
        "status_cli_ms (whole process)": cli_ms,
        "cli_startup_ms (dispatchq --help)": startup_ms,
        "status_cli_minus_startup_ms": round(cli_ms - startup_ms, 1),
        "get_status_ms": status_ms,
        "get_metrics_ms": metrics_ms,
        "target_ms": 100,
        "met (function, /status, /metrics)": max(function_ms, status_ms, metrics_ms) <= 100,
    }
