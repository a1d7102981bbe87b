"""The collector is held off while `dispatchq` starts and is back on before a command runs.

A worker or `serve` runs for weeks in the process `main` started: a command that ran with
the collector still off would keep every reference cycle it ever made. Each case is a fresh
interpreter, as a real start is (the hold is once per process).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# A command the static table does not have, put in for the run: it reports the collector.
PROBE = textwrap.dedent(
    """
    import gc, json, sys, types
    import click
    import dispatchq.cli as cli

    @click.command("probe")
    def probe():
        print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))

    module = types.ModuleType("gcprobe.cmd")
    module.probe = probe
    sys.modules["gcprobe.cmd"] = module
    cli.COMMANDS["probe"] = "gcprobe.cmd"  # a dotted name is imported as it stands
    if sys.argv[1] == "off":
        gc.disable()
    try:
        cli.main(["probe"])
    except SystemExit:
        pass
    print(json.dumps({"after": gc.isenabled()}))
    """
)


def _run(mode: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_a_command_runs_with_the_collector_on_and_start_up_frozen_out_of_it() -> None:
    during, after = _run("on")
    assert during["enabled"] is True
    assert isinstance(during["frozen"], int) and during["frozen"] > 10_000  # the modules' objects
    assert after == {"after": True}


def test_a_caller_that_keeps_the_collector_off_is_left_be() -> None:
    during, after = _run("off")
    assert during == {"enabled": False, "frozen": 0}
    assert after == {"after": False}
