#!/usr/bin/env python3
"""Spawns per judgement with the real Claude Code CLI, and the real-client layer's run time.

    python3 ops/dev.py bench sessions    # or: .venv/bin/python bench/sessions.py
                                         # (runs tests/integration/test_claude_cli.py, pytest -n 2)
    .venv/bin/python bench/sessions.py --sandbox   # only the sandbox's cost per spawn

The cases are the real-client tests themselves (the pinned CLI against the loopback stand-in
for the Messages API, real session workers on an embedded Redis): each asserts its spawn counts
and, with BENCH_SPAWN_FIGURES set, writes them down; this script collects them into a table
(targets: 1 spawn for a limit hit then 0 until the lift, 1 for a host-wide failure then 0 until
cleared, no spawn loop) and times the whole layer (target: under 3 minutes on 2 cores).

The plain alternative is measured in the same run, with the same CLI and stand-in: a retry loop
(`until claude -p …; do :; done` per judgement) over a usage limit that lifts 8 s after the first
request, and the same loop retrying a failed session once (what a job queue's retry does) on a
host whose credential is refused. The ratio is its spawns over dispatchq's.
Results go to bench/results/sessions.json too.

The sandbox's cost per spawn is measured the same way: the same session spawned confined
(bubblewrap, the egress proxy, the shim) and unconfined, interleaved, in the same run; the
ratio is confined over unconfined (bench/results/sandbox.json).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dispatchq.launcher.releases import OLDEST, installed_claude  # noqa: E402
from dispatchq.testing.anthropic import FakeAnthropicAPI, Reply, Seen  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CLAUDE = installed_claude(ROOT, OLDEST)  # each release has its own folder (docs/claude-code.md)
LIFT_AFTER = 8.0  # as the layer's usage-limit test: the window reopens 8 s after the first request


def _cli_env(api: FakeAnthropicAPI, home: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": home,
        "TZ": "UTC",
        "ANTHROPIC_BASE_URL": api.url,
        "CLAUDE_CODE_OAUTH_TOKEN": "stand-in-token",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_RETRIES": "1",
        "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB": "0",
    }


def _spawn(env: dict[str, str], prompt: str) -> bool:
    argv = [str(CLAUDE), "-p", "--output-format", "stream-json", "--verbose", prompt]
    return subprocess.run(argv, env=env, capture_output=True, timeout=180, check=False).returncode == 0


def plain_limit(judgements: int = 2) -> int:
    """Refused spawns a plain retry loop makes over a limit lifting LIFT_AFTER s after the first request."""
    lift: list[float] = []

    def closed_for_a_while(seen: Seen) -> Reply | None:
        if not lift:
            lift.append(seen.at + LIFT_AFTER)
        return Reply.limit(resets_at=int(lift[0]) + 1) if seen.at < lift[0] else None

    with FakeAnthropicAPI() as api, tempfile.TemporaryDirectory() as home:
        api.rule = closed_for_a_while
        env = _cli_env(api, home)
        refused = 0
        for j in range(judgements):
            while not _spawn(env, f"q{j}"):
                refused += 1
        return refused


def plain_host(judgements: int = 2, retries: int = 1) -> int:
    """Spawns a plain queue (one retry per failed session) makes on a host whose credential is refused."""
    with FakeAnthropicAPI() as api, tempfile.TemporaryDirectory() as home:
        api.default = Reply.error(401, "authentication_error", "Invalid bearer token")
        env = _cli_env(api, home)
        spawns = 0
        for j in range(judgements):
            for _ in range(1 + retries):
                spawns += 1
                if _spawn(env, f"q{j}"):
                    break
        return spawns


def run_sessions() -> dict[str, Any]:
    """The table, the layer's time and the plain comparison (also `python3 ops/dev.py bench sessions`)."""
    if not CLAUDE.exists():
        raise SystemExit(
            f"the pinned CLI is not at {CLAUDE}: run `python3 ops/dev.py test` once (it installs it)"
        )
    figures = Path(tempfile.mkdtemp(prefix="dq-bench-sessions-")) / "figures.jsonl"
    argv = [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "--durations=8"]
    argv.append("tests/integration/test_claude_cli.py")
    load_before = os.getloadavg()
    used_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "BENCH_SPAWN_FIGURES": str(figures)})
    elapsed = time.monotonic() - start
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU the layer itself used (every process it started, the CLIs included): on a host shared
    # with other work the wall time says more about the neighbours than about the layer.
    cpu = used.ru_utime - used_before.ru_utime + used.ru_stime - used_before.ru_stime
    load_after = os.getloadavg()
    rows: list[dict[str, Any]] = (
        [json.loads(line) for line in figures.read_text().splitlines()] if figures.exists() else []
    )
    columns = ["case", "judgements", "until_lift", "while_closed", "until_cleared", "total"]
    print("\n| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in sorted(rows, key=lambda r: r["case"]):
        print("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    print(
        f"\nreal-client layer: {elapsed:.0f} s with pytest -n 2 (exit {done.returncode}); "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after, on {os.cpu_count()} cores; "
        f"{cpu:.0f} CPU-seconds used by the layer ({cpu / 2:.0f} s of 2 cores)"
    )

    by_case = {row["case"]: row for row in rows}
    # Spawns that could not answer: while the window was closed / while the host was broken.
    plain = {
        "usage limit (five_hour)": ("until_lift", plain_limit()),
        "host-wide: 401": ("until_cleared", plain_host()),
    }
    print("\n| case (2 judgements) | wasted spawns, plain | wasted spawns, dispatchq | ratio |")
    print("|---|---|---|---|")
    comparison = []
    for case, (column, plain_spawns) in plain.items():
        ours = by_case.get(case, {}).get(column)
        ratio = f"{plain_spawns / ours:.1f}x" if ours else "n/a"
        print(f"| {case} | {plain_spawns} | {ours if ours is not None else 'n/a'} | {ratio} |")
        comparison.append({"case": case, "plain_wasted": plain_spawns, "dispatchq_wasted": ours})
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {
        "pytest_exit": done.returncode,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "load_before": load_before,
        "load_after": load_after,
        "cases": rows,
        "plain": comparison,
    }
    (RESULTS / "sessions.json").write_text(json.dumps(out, indent=2))
    return out


def _timed_spawns(argv: list[str], env: dict[str, str], work: Path, rounds: int) -> dict[str, list[float]]:
    """`rounds` spawns each way, interleaved (unconfined, confined, ...), through `launch`."""
    import shutil

    from dispatchq.launcher.egress import allowed_destinations
    from dispatchq.launcher.sandbox import SandboxPlan
    from dispatchq.launcher.spawn import launch

    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SystemExit("the sandbox figure needs bubblewrap (apt-get install -y bubblewrap)")
    times: dict[str, list[float]] = {"unconfined": [], "confined": []}
    for _ in range(rounds):
        for way in ("unconfined", "confined"):
            config = Path(tempfile.mkdtemp(prefix="dq-bench-cfg-"))
            plan = SandboxPlan(bwrap=bwrap, workdir=work, config_dir=config) if way == "confined" else None
            start = time.perf_counter()
            result = launch(
                argv,
                "what is 2+2",
                cwd=work,
                env={**env, "CLAUDE_CONFIG_DIR": str(config)},
                timeout=120,
                sandbox=plan,
                egress=allowed_destinations(env),
            )
            times[way].append(time.perf_counter() - start)
            if result.returncode != 0:
                raise SystemExit(f"a {way} spawn failed: {result.stderr[-500:]}")
    return times


def sandbox_cost(rounds: int = 8) -> dict[str, Any]:
    """The sandbox's cost per spawn, as a ratio against an unconfined spawn in the same run.

    Two sessions, each spawned `rounds` times both ways, interleaved: the real CLI answering
    through the stand-in (what a judgement costs), and `true` (the fixed cost of bwrap, the
    namespaces, the mounts and the shim, with nothing else to hide it).
    """
    import statistics

    work = Path(tempfile.mkdtemp(prefix="dq-bench-work-"))
    rows = []
    with FakeAnthropicAPI() as api:
        api.answer("4")
        env = _cli_env(api, tempfile.mkdtemp(prefix="dq-bench-home-"))
        cases = {
            "real CLI answer": [str(CLAUDE), "-p", "--output-format", "stream-json", "--verbose"],
            "`true` (fixed cost)": ["/bin/true"],
        }
        for case, argv in cases.items():
            times = _timed_spawns(argv, env, work, rounds)
            plain, confined = statistics.median(times["unconfined"]), statistics.median(times["confined"])
            ratio = confined / plain
            rows.append({"case": case, "unconfined_s": plain, "confined_s": confined, "ratio": ratio})
    print(f"\n| spawn ({rounds} each way, medians) | unconfined | confined | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['case']} | {row['unconfined_s'] * 1000:.0f} ms | {row['confined_s'] * 1000:.0f} ms "
            f"| {row['ratio']:.2f}x |"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sandbox.json").write_text(json.dumps({"rounds": rounds, "cases": rows}, indent=2))
    return {"cases": rows}


def main() -> int:
    if "--sandbox" in sys.argv[1:]:
        sandbox_cost()
        return 0
    code = int(run_sessions()["pytest_exit"])
    sandbox_cost()
    return code


if __name__ == "__main__":
    sys.exit(main())
