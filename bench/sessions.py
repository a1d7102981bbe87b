#!/usr/bin/env python3
"""Spawns per judgement with the real Claude Code CLI, and the real-client layer's run time.

    python3 bench/sessions.py            # runs tests/integration/test_claude_cli.py (pytest -n 2)

The cases are the real-client tests themselves (the pinned CLI against the loopback stand-in
for the Messages API, real session workers on an embedded Redis): each asserts its spawn counts
and, with BENCH_SPAWN_FIGURES set, writes them down; this script collects them into a table
(targets: 1 spawn for a limit hit then 0 until the lift, 1 for a host-wide failure then 0 until
cleared, no spawn loop) and times the whole layer (target: under 3 minutes on 2 cores).
Results go to bench/results/sessions.json too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def main() -> int:
    figures = Path(tempfile.mkdtemp(prefix="dq-bench-sessions-")) / "figures.jsonl"
    argv = [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider"]
    argv.append("tests/integration/test_claude_cli.py")
    start = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "BENCH_SPAWN_FIGURES": str(figures)})
    elapsed = time.monotonic() - start
    rows = [json.loads(line) for line in figures.read_text().splitlines()] if figures.exists() else []
    columns = ["case", "judgements", "until_lift", "while_closed", "until_cleared", "total", "spawns"]
    print("\n| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in sorted(rows, key=lambda r: r["case"]):
        print("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    print(f"\nreal-client layer: {elapsed:.0f} s (pytest exit {done.returncode})")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sessions.json").write_text(json.dumps({"seconds": elapsed, "cases": rows}, indent=2))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
