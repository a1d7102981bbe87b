"""The commands operators run in loops import only what they use.

`dispatchq status` is run in `watch` loops and by scripts every few seconds; before issue
24 it loaded the triage engine (the CEL parser, githubkit through the executors) and the
findings gate's built-in kinds, none of which it uses. Wall time is never asserted here
(`bench/cli_start.py` measures it): what is asserted is which modules a real process ends
up holding, which is what the time was spent on. Each probe is a real subprocess running
the real CLI's `main` against the test's embedded Redis, then printing `sys.modules`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import write_config

#: Top-level packages and dispatchq modules none of these commands needs.
HEAVY_PACKAGES = ("githubkit", "celpy", "lark")
HEAVY_MODULES = ("dispatchq.triage.engine", "dispatchq.triage.executors", "dispatchq.findings")

PROBE = """\
import json, sys
from dispatchq.cli import main
try:
    main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
else:
    code = 0
print("MODULES " + json.dumps(sorted(sys.modules)), file=sys.stderr)
sys.exit(code)
"""


#: What reading the config costs: the findings gate's built-in kinds (their names, from the
#: pure texts and grammar rooms; a YAML kind may not take one), never the gate's machinery
#: behind them (`run.fixer`, the evidence room), which only a gate session needs.
CONFIG_READS = (
    "dispatchq.findings",
    "dispatchq.findings.run",
    "dispatchq.findings.run.kinds",
    "dispatchq.findings.texts",
    "dispatchq.findings.texts.returns",
    "dispatchq.findings.grammar",
)


def within(module: str, names: tuple[str, ...]) -> bool:
    """`module` is one of `names` or a submodule of one."""
    return any(module == n or module.startswith(n + ".") for n in names)


def drawn(modules: list[str]) -> list[str]:
    """The rich modules imported: a `--json` command prints JSON and never draws a table."""
    return [m for m in modules if within(m, ("rich",))]


def heavy(modules: list[str], allowed: tuple[str, ...] = ()) -> list[str]:
    """The modules of `modules` a light command must not have imported (but `allowed` ones:
    exactly those names, and everything under `dispatchq.findings.grammar` when it is named)."""
    grammar = tuple(n for n in allowed if n.endswith(".grammar"))
    return [
        m
        for m in modules
        if m not in allowed
        and not within(m, grammar)
        and (m.split(".")[0] in HEAVY_PACKAGES or within(m, HEAVY_MODULES))
    ]


def probe(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run `dispatchq ARGS` in a real process; its result and every module it imported."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("MODULES ")]
    assert lines, done.stderr
    return done, json.loads(lines[-1].removeprefix("MODULES "))


def test_the_heavy_filter_recognises_what_it_must_refuse() -> None:
    """The check below can fail: the names it looks for are the ones a heavy import leaves."""
    refused = ["githubkit.rest", "celpy", "dispatchq.findings.run.kinds", "dispatchq.triage.engine"]
    assert heavy([*refused, "json"]) == refused
    assert heavy(["dispatchq.triage.status", "dispatchq.findingsx", "redis"]) == []
    assert heavy(["dispatchq.findings.run.kinds", "dispatchq.findings.run.fixer"], CONFIG_READS) == [
        "dispatchq.findings.run.fixer"
    ]


def test_status_json_imports_neither_the_triage_engine_nor_the_gate(speed_env: dict[str, str]) -> None:
    done, modules = probe(["status", "--json"], speed_env)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    # The triage section is still there, read from storage alone.
    assert data["triage"]["runs"] == 0 and data["triage"]["needs_triage"] == 0, data["triage"]
    assert heavy(modules) == []
    assert "dispatchq.triage.status" in modules
    assert not drawn(modules), "--json draws nothing, so it needs no rich"


@pytest.mark.parametrize(
    ("args", "code", "allowed"),
    [
        (["enqueue", "--kind", "ask", "--target", "some/target"], 0, CONFIG_READS),
        (["list", "--json"], 0, ()),
        (["result", "0123456789abcdef", "--json"], 2, ()),  # no such judgement: one line, exit 2
        (["window", "open"], 0, ()),
    ],
    ids=["enqueue", "list", "result", "window"],
)
def test_the_other_loop_commands_import_only_what_they_use(
    speed_env: dict[str, str], args: list[str], code: int, allowed: tuple[str, ...]
) -> None:
    done, modules = probe(args, speed_env)
    assert done.returncode == code and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert heavy(modules, allowed) == []
    if "--json" in args:
        assert not drawn(modules)


def test_a_config_with_triage_rules_still_loads_them(speed_env: dict[str, str], tmp_path: Path) -> None:
    """The rules' loader is imported when a config has a `triage` section, and a bad rule in it
    is still the same one-line error: lazy, not skipped."""
    write_config(
        tmp_path / "dispatchq.yaml",
        """
        kinds:
          ask:
            session:
              prompt: "Answer {{ target }}"
        triage:
          not_a_key: 1
        """,
    )
    done, modules = probe(["enqueue", "--kind", "ask", "--target", "x"], speed_env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "not_a_key" in done.stderr, done.stderr[-2000:]
    assert "dispatchq.triage.rules" in modules
