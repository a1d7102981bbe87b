"""How fast the CLI starts: `dispatchq --help` and `dispatchq status` against `rq` in the same run.

    python3 ops/dev.py bench cli                 # 9 runs per command, medians

Operators run `status` in loops and `--help` whenever they forget a word, so start-up is
the whole cost. Each side is a whole process on an idle embedded Redis (this run's own):
`dispatchq --help` against `rq --help`, and `dispatchq status` against `rq info` (RQ's own
ops view, on the same server). Targets: `--help` <= 0.3 s, `status` <= 0.6 s.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.run import Bench

__all__ = ["run_cli_start"]

BIN = Path(sys.executable).parent


def run_cli_start(bench: Bench, runs: int = 9) -> dict[str, Any]:
    bench.config('kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n')
    rq = str(BIN / "rq")
    url = bench.server.url()
    sides = {
        "dispatchq --help": (bench.dispatchq("--help"), bench.env),
        "rq --help": ([rq, "--help"], bench.env),
        "dispatchq status": (bench.dispatchq("status"), bench.env),
        "rq info": ([rq, "info", "--url", url], bench.env),
    }
    for argv, env in sides.values():  # warm the page cache and the .pyc files once
        bench.timed(argv, env=env)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(runs):  # interleaved, so a busy moment hits both sides alike
        for name, (argv, env) in sides.items():
            times[name].append(bench.timed(argv, env=env))
    median = {name: round(statistics.median(values), 3) for name, values in times.items()}
    return {
        "runs": runs,
        "median_seconds": median,
        "help_ratio_vs_rq": round(median["dispatchq --help"] / median["rq --help"], 2),
        "status_ratio_vs_rq_info": round(median["dispatchq status"] / median["rq info"], 2),
        "targets": {"dispatchq --help": 0.3, "dispatchq status": 0.6},
    }
