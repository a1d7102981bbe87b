#!/usr/bin/env python3
"""Typed-tier concurrency: judgements/s over s states with a 200 ms API, concurrency 1 vs 4.

    python3 ops/dev.py bench typed-concurrency          # s = 50 states, 200 ms per request
    python3 ops/dev.py bench typed-concurrency -s 50 --latency 0.2

Each state is its own provider request (Jev answers every question about one state at
once), so a typed worker's requests for different states are independent: run one after
another, s states cost s x latency; run `DISPATCHQ_TYPED_CONCURRENCY` at a time, about
s x latency / concurrency. Both sides are the same real `dispatchq worker typed --burst`
process against the loopback fake of the TypeSafe API in its own process (answering
every request after `latency` seconds), on one Redis, with only the setting changed.
Target: >= 3x judgements/s at 4 than at 1, and requests per distinct state still 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dispatchq.storage import keys  # noqa: E402
from dispatchq.testing.typesafe import FakeTypeSafeProcess  # noqa: E402

if TYPE_CHECKING:
    from bench.common import Bench

__all__ = ["typed_concurrency"]

CONFIG = (
    "kinds:\n"
    "  actionable:\n"
    "    questions:\n"
    '      actionable: {type: noul, instructions: "Does this ask for a code change?"}\n'
    "    answer: actionable\n"
    "    escalate: needs-triage\n"
)


def _last_answer_at(bench: Bench) -> float:
    """When the last typed answer was written: the latest trail entry over every record."""
    latest = 0.0
    for key in bench.redis.scan_iter(match=keys.record("*"), count=1000):
        trail = json.loads(bench.redis.hget(key, "trail") or "[]")
        latest = max([latest, *(float(step["at"]) for step in trail if step.get("tier") == "typed")])
    return latest


def typed_concurrency(
    bench: Bench, states: int, latency: float, per_state: int = 2, levels: tuple[int, ...] = (1, 4)
) -> dict[str, Any]:
    """Run the same judgements through a typed worker at each concurrency level; compare."""
    bench.config(CONFIG)
    k = states * per_state
    jsonl = bench.workdir / "typed-concurrency.jsonl"
    lines = (
        {"kind": "actionable", "target": f"bench#{i}", "item": f"c{i}", "state": {"pr": i % states}}
        for i in range(k)
    )
    jsonl.write_text("".join(json.dumps(line) + "\n" for line in lines))
    script = {"answers": {"actionable": {"type": "noul", "noul": 0.95}}, "latency": latency}
    results: dict[str, Any] = {"states": states, "judgements": k, "latency_s": latency}
    with FakeTypeSafeProcess(script, workdir=bench.workdir) as api:
        env = dict(bench.env, TYPESAFE_API_KEY="test-key", TYPESAFE_BASE_URL=api.url)
        for level in levels:
            bench.redis.flushall()
            api.reset()
            api.script({"latency": latency})
            run_env = dict(env, DISPATCHQ_TYPED_CONCURRENCY=str(level))
            bench.timed(bench.dispatchq("enqueue", "-"), stdin=jsonl, env=run_env)
            elapsed = bench.timed(bench.dispatchq("worker", "typed", "--burst", "--quiet"), env=run_env)
            answered = int(bench.redis.get("dispatchq:stats:answered:typed") or 0)
            if answered != k:
                raise SystemExit(f"concurrency {level}: expected {k} typed answers, found {answered}")
            seen = [r for r in api.requests if r.path == "/v1/systemone"]
            # The tier's own time: the first request sent to the last judgement answered
            # (the worker process's start-up, the same on both sides, left out).
            tier = _last_answer_at(bench) - min(r.received for r in seen)
            results[f"concurrency_{level}"] = {
                "worker_seconds": elapsed,
                "tier_seconds": tier,
                "judgements_per_s": k / tier,
                "judgements_per_s_with_startup": k / elapsed,
                "requests": len(seen),
                "requests_per_state": len(seen) / states,
            }
    low, high = (results[f"concurrency_{level}"] for level in (levels[0], levels[-1]))
    results["ratio"] = high["judgements_per_s"] / low["judgements_per_s"]
    with_startup = "judgements_per_s_with_startup"
    results["ratio_with_startup"] = high[with_startup] / low[with_startup]
    results["target_ratio"] = 3.0
    return results
