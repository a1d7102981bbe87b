"""`dispatchq run`'s exit status tells a pipeline whether a person must act.

0 for what finishes or lifts by itself (answered, needs-triage, a closed usage window), 3
for what never will without a person (a failed judgement, a host blocked because its
session command is missing), real processes and the real embedded Redis throughout.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.helpers import run_cli


def _batch(tmp_path: Path, *lines: dict[str, Any]) -> Path:
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_answered_work_exits_0(run_env: dict[str, str], tmp_path: Path) -> None:
    batch = _batch(tmp_path, {"kind": "lock", "target": "a", "state": {"answer": 1}})
    done = run_cli(["run", str(batch)], run_env)
    assert done.returncode == 0, (done.stdout, done.stderr)


def test_a_failed_judgement_exits_3(run_env: dict[str, str], tmp_path: Path) -> None:
    run_env["DISPATCHQ_JOB_RETRIES"] = "0"
    batch = _batch(
        tmp_path,
        {"kind": "lock", "target": "good", "state": {"answer": 1}},
        {"kind": "lock", "target": "crash", "state": {"raise": True}},
    )
    done = run_cli(["run", str(batch), "--json"], run_env)
    statuses = {r["target"]: r["status"] for r in json.loads(done.stdout)["judgements"]}
    assert statuses["good"] == "answered"
    assert statuses["crash"] == "failed", statuses
    assert done.returncode == 3, (statuses, done.stderr)
    assert "Traceback" not in done.stderr


def test_a_missing_session_command_blocks_and_exits_3(run_env: dict[str, str], tmp_path: Path) -> None:
    run_env["DISPATCHQ_SESSION_COMMAND"] = str(tmp_path / "no-such-claude") + " -p"
    batch = _batch(tmp_path, {"kind": "ask", "target": "x"})
    done = run_cli(["run", str(batch), "--json"], run_env)
    (record,) = json.loads(done.stdout)["judgements"]
    assert record["status"] == "waiting", record
    assert done.returncode == 3, (record, done.stderr)


def test_a_file_of_code_judgements_needs_no_session_credential(
    run_env: dict[str, str], tmp_path: Path
) -> None:
    del run_env["CLAUDE_CODE_OAUTH_TOKEN"]
    batch = _batch(tmp_path, {"kind": "lock", "target": "a", "state": {"answer": 1}})
    done = run_cli(["run", str(batch), "--json"], run_env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    (record,) = json.loads(done.stdout)["judgements"]
    assert (record["status"], record["value"]) == ("answered", 1)


def test_without_a_session_credential_run_answers_the_rest_and_the_session_judgement_waits_saying_why(
    run_env: dict[str, str], tmp_path: Path
) -> None:
    del run_env["CLAUDE_CODE_OAUTH_TOKEN"]
    batch = _batch(
        tmp_path,
        {"kind": "lock", "target": "a", "state": {"answer": "yes"}},
        {"kind": "ask", "target": "x"},
        {"kind": "lock", "target": "b", "state": {"answer": False}},
    )
    done = run_cli(["run", str(batch)], run_env)
    assert done.returncode == 3, (done.stdout, done.stderr)  # a person must act
    assert "Traceback" not in done.stderr
    assert "CLAUDE_CODE_OAUTH_TOKEN is not set" in done.stdout + done.stderr
    assert "claude setup-token" in done.stdout + done.stderr
    as_json = run_cli(["run", str(batch), "--json"], run_env)  # the same file again: nothing lost
    assert as_json.returncode == 3, (as_json.stdout, as_json.stderr)
    by_target = {r["target"]: r for r in json.loads(as_json.stdout)["judgements"]}
    assert {t: r["status"] for t, r in by_target.items()} == {
        "a": "answered",
        "x": "waiting",
        "b": "answered",
    }
    assert (by_target["a"]["value"], by_target["b"]["value"]) == ("yes", False)
    waiting = by_target["x"]
    assert "CLAUDE_CODE_OAUTH_TOKEN is not set" in waiting["reason"], waiting
    assert "claude setup-token" in waiting["reason"], waiting
    assert waiting["attempts"] == 0, waiting  # nothing charged: it runs once a credential is there
    shown = run_cli(["result", waiting["id"]], run_env)
    assert shown.returncode == 0 and "CLAUDE_CODE_OAUTH_TOKEN is not set" in shown.stdout, shown.stdout

    run_env["CLAUDE_CODE_OAUTH_TOKEN"] = "test-session-credential"  # a person acts
    again = run_cli(["run", str(batch), "--json"], run_env)
    assert again.returncode == 0, (again.stdout, again.stderr)
    statuses = {r["target"]: r["status"] for r in json.loads(again.stdout)["judgements"]}
    assert statuses == {"a": "answered", "x": "answered", "b": "answered"}


def test_a_closed_window_lifts_by_itself_so_exits_0(run_env: dict[str, str], tmp_path: Path) -> None:
    closed = run_cli(["window", "close", "--until", "2h", "--reason", "test"], run_env)
    assert closed.returncode == 0, closed.stderr
    batch = _batch(tmp_path, {"kind": "ask", "target": "x"})
    done = run_cli(["run", str(batch), "--json"], run_env)
    (record,) = json.loads(done.stdout)["judgements"]
    assert record["status"] == "waiting", record
    assert done.returncode == 0, (record, done.stderr)


def test_help_lists_the_exit_codes_and_version_prints(run_env: dict[str, str]) -> None:
    helped = run_cli(["run", "--help"], run_env)
    assert "3  a judgement failed" in helped.stdout
    version = run_cli(["--version"], run_env)
    assert version.returncode == 0 and version.stdout.startswith("dispatchq 0."), version.stdout


def test_help_imports_no_command_module_nor_redis_nor_pydantic() -> None:
    probe = (
        "import sys\n"
        "from dispatchq.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('redis', 'pydantic', 'rq', 'githubkit')"
        " or m.startswith('dispatchq.cli.'))\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "Commands:" in done.stdout
    assert "HEAVY []" in done.stderr, done.stderr


def test_a_second_close_never_silently_shortens_the_first(run_env: dict[str, str]) -> None:
    run_env["DISPATCHQ_TIMEZONE"] = "Europe/Paris"
    first = run_cli(["window", "close", "--until", "3h", "--reason", "release day"], run_env)
    assert first.returncode == 0, first.stderr
    # The operator's clock first (a named zone), UTC in brackets for the logs.
    assert re.search(
        r"closed until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d CE[S]?T \(\d\d:\d\d:\d\d UTC\)", first.stdout
    )
    shorter = run_cli(["window", "close", "--until", "1h"], run_env)
    assert shorter.returncode == 2 and "Traceback" not in shorter.stderr
    assert "already closed until" in shorter.stderr and "--force" in shorter.stderr
    status = json.loads(run_cli(["status", "--json"], run_env).stdout)
    assert status["marker"]["message"] == "release day"  # the longer reservation kept
    forced = run_cli(["window", "close", "--until", "1h", "--force"], run_env)
    assert forced.returncode == 0, forced.stderr
    status = json.loads(run_cli(["status", "--json"], run_env).stdout)
    assert status["marker"]["message"] == "closed by an operator"
    longer = run_cli(["window", "close", "--until", "5h"], run_env)  # lengthening needs no --force
    assert longer.returncode == 0, longer.stderr


def test_init_writes_a_starter_config_the_lookup_finds_and_never_overwrites(
    dq_env: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in dq_env.items() if k != "DISPATCHQ_CONFIG"}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    done = run_cli(["init"], env)
    assert done.returncode == 0, done.stderr
    written = tmp_path / "xdg" / "dispatchq" / "dispatchq.yaml"
    assert f"wrote {written}" in done.stdout
    # The lookup finds it without DISPATCHQ_CONFIG, and its kinds load.
    added = run_cli(["enqueue", "--kind", "explain-failure", "--target", "acme/app@1"], env)
    assert added.returncode == 0, added.stderr
    again = run_cli(["init"], env)
    assert again.returncode == 2 and "exists already; --force replaces it" in again.stderr
    here = tmp_path / "checkout"
    here.mkdir()
    local = run_cli(["init", "--here"], env, cwd=here)
    assert local.returncode == 0, local.stderr
    assert f"export DISPATCHQ_CONFIG={here / 'dispatchq.yaml'}" in local.stdout
