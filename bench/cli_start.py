"""How fast the CLI starts: `dispatchq --help` and `dispatchq status` against `rq` in the same run.

    python3 ops/dev.py bench cli                 # 9 runs per command, medians

Operators run `status` in loops and `--help` whenever they forget a word, so start-up is
the whole cost. Each side is a whole process on an idle embedded Redis (this run's own):
`dispatchq --help` against `rq --help`, and `dispatchq status` against `rq info` (RQ's own
ops view, on the same server). Targets: `--help` <= 0.3 s, `status` <= 0.6 s.

Both sides run with bytecode caching on, into this run's own folder (PYTHONPYCACHEPREFIX),
whatever the calling shell says: an installed dispatchq has its `.pyc` files as RQ does in
site-packages, and a shell with PYTHONDONTWRITEBYTECODE=1 (this project's CI and dev boxes)
would otherwise compile every dispatchq module from source on every run and measure the
compiler, not the start-up. The warm-up run fills the cache.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.common import Bench

__all__ = ["run_cli_start"]

BIN = Path(sys.executable).parent


def run_cli_start(bench: Bench, runs: int = 9) -> dict[str, Any]:
    bench.config('kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n')
    rq = str(BIN / "rq")
    url = bench.server.url()
    env = {k: v for k, v in bench.env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(bench.workdir / "pycache")
    sides = {
        "dispatchq --help": (bench.dispatchq("--help"), env),
        "rq --help": ([rq, "--help"], env),
        "dispatchq status": (bench.dispatchq("status"), env),
        "rq info": ([rq, "info", "--url", url], env),
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
        "bytecode": "cached (PYTHONPYCACHEPREFIX in the run's folder)",
    }
