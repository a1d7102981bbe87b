"""The producer CLI, run as a real process: every bad input is one clear line, never a traceback.

Exit statuses: 2 for a usage or user error (nothing done), 1 for JSON Lines with refused
lines (the good ones still enqueued), 0 otherwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.support.helpers import calls_of, run_cli

CONTRACT = ["id", "kind", "target", "status", "tier", "value", "confidence", "reason", "trail"]


def records(redis_client: Any) -> list[bytes]:
    return list(redis_client.scan_iter("dispatchq:j:*"))


def assert_one_line_error(done: subprocess.CompletedProcess[str], fragment: str, code: int = 2) -> None:
    assert done.returncode == code, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    assert fragment in lines[0], lines[0]


def enqueue(env: dict[str, str], *args: str) -> str:
    done = run_cli(["enqueue", *args], env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# --- bad input: exit 2, one line, nothing written ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--kind", "lock", "--target", "a", "--state", "{bad"], "--state: not valid JSON"),
        (["--kind", "lock", "--target", "a", "--context", '{"checkout": '], "--context: not valid JSON"),
        (["--kind", "lock", "--target", "a", "--context", "[1, 2]"], "--context: must be a JSON object"),
        (["--kind", "lock", "--target", "a", "--state", "@/no/such/state.json"], "--state: cannot read"),
        (["--kind", "lock", "--target", "a", "--context", "@/no/such/ctx.json"], "--context: cannot read"),
        (["--kind", "lock", "--target", "a", "--state", "NaN"], "state: not plain JSON"),
        (["--kind", "nope", "--target", "a"], "unknown kind 'nope'"),
        (
            ["--kind", "lock", "--target", "a", "--context", '{"checkout": "/etc"}'],
            "outside DISPATCHQ_CHECKOUT_ROOTS",
        ),
        (
            ["--kind", "lock", "--target", "a", "--context", '{"checkout": "repo"}'],
            "must be an absolute path",
        ),
        (["--kind", "lock", "--target", "a", "--context", '{"checkout": 7}'], "context.checkout"),
        (["--kind", "lock"], "give --kind and --target"),
        (["stray"], "unexpected argument 'stray'"),
        (["-", "--kind", "lock"], "drop --kind"),
    ],
)
def test_enqueue_bad_input(
    core_env: dict[str, str], redis_client: Any, args: list[str], fragment: str
) -> None:
    assert_one_line_error(run_cli(["enqueue", *args], core_env), fragment)
    assert records(redis_client) == []


def test_a_checkout_escaping_the_roots_with_dotdot(
    core_env: dict[str, str], tmp_path: Path, redis_client: Any
) -> None:
    escaping = json.dumps({"checkout": f"{tmp_path}/../{tmp_path.name}/../.."})
    done = run_cli(["enqueue", "--kind", "lock", "--target", "a", "--context", escaping], core_env)
    assert_one_line_error(done, "outside DISPATCHQ_CHECKOUT_ROOTS")
    assert records(redis_client) == []
    assert calls_of(Path(core_env["_CALLS"])) == []


def test_state_file_that_is_not_utf8(core_env: dict[str, str], tmp_path: Path, redis_client: Any) -> None:
    binary = tmp_path / "state.bin"
    binary.write_bytes(b"\xff\xfe{")
    done = run_cli(["enqueue", "--kind", "lock", "--target", "a", "--state", f"@{binary}"], core_env)
    assert_one_line_error(done, "not UTF-8")
    assert records(redis_client) == []


@pytest.mark.parametrize(
    ("variable", "value"),
    [("DISPATCHQ_RESULT_TTL", "abc"), ("DISPATCHQ_BATCH_SIZE", "0"), ("DISPATCHQ_APPENDFSYNC", "sometimes")],
)
@pytest.mark.parametrize("command", [["enqueue", "--kind", "lock", "--target", "a"], ["list"], ["status"]])
def test_a_bad_setting(
    core_env: dict[str, str], redis_client: Any, command: list[str], variable: str, value: str
) -> None:
    done = run_cli(command, {**core_env, variable: value})
    assert_one_line_error(done, f"{variable}: ")
    assert records(redis_client) == []


def test_a_yaml_syntax_error_reports_line_and_column(core_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "dispatchq.yaml"
    config.write_text("kinds:\n  lock:\n    check: [unclosed\n")
    done = run_cli(["enqueue", "--kind", "lock", "--target", "a"], core_env)
    assert_one_line_error(done, f"{config}:")
    location = done.stderr.strip().removeprefix(f"error: {config}:").split(":")[:2]
    assert all(part.isdigit() for part in location), done.stderr


def test_an_invalid_config_names_kind_and_field(core_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "dispatchq.yaml").write_text(
        "kinds:\n  lock:\n    check: tests.support.checks:noop\n    chek: typo\n"
    )
    assert_one_line_error(
        run_cli(["enqueue", "--kind", "lock", "--target", "a"], core_env), "kinds.lock.chek"
    )


def test_a_missing_config_file(core_env: dict[str, str], tmp_path: Path) -> None:
    done = run_cli(
        ["enqueue", "--kind", "lock", "--target", "a"],
        {**core_env, "DISPATCHQ_CONFIG": str(tmp_path / "x.yaml")},
    )
    assert_one_line_error(done, "config file not found")


@pytest.mark.parametrize(
    "command",
    [["result", "0123456789abcdef"], ["cancel", "0123456789abcdef"], ["retry", "0123456789abcdef"]],
)
def test_an_unknown_id(core_env: dict[str, str], command: list[str]) -> None:
    assert_one_line_error(run_cli(command, core_env), "no judgement 0123456789abcdef")


def test_run_with_a_missing_file(core_env: dict[str, str], tmp_path: Path) -> None:
    assert_one_line_error(run_cli(["run", str(tmp_path / "absent.jsonl")], core_env), "cannot read")


@pytest.mark.parametrize(
    "args",
    [["worker", "sideways"], ["list", "--status", "done"], ["result", "x", "--wait", "soon"], ["nonsense"]],
)
def test_click_usage_errors_exit_2_without_a_traceback(core_env: dict[str, str], args: list[str]) -> None:
    done = run_cli(args, core_env)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "Error:" in done.stderr


# --- JSON Lines ------------------------------------------------------------------------------------------

LINES = "\n".join(
    [
        '{"kind": "lock", "target": "one", "state": {"answer": 1}}',
        "[1, 2, 3]",
        '{"kind": "lock", "target": "two", "bogus": true}',
        "not json at all",
        "",
        '{"kind": "nope", "target": "three"}',
        '{"kind": "lock", "target": "four", "context": {"checkout": "/etc"}}',
        '{"kind": "lock", "target": "five", "state": {"answer": 5}}',
        '{"kind": "lock", "target": "one", "state": {"answer": 1}}',
        '{"target": "six"}',
    ]
)


def test_enqueue_jsonl_reports_bad_lines_and_enqueues_the_good(
    core_env: dict[str, str], redis_client: Any
) -> None:
    done = run_cli(["enqueue", "-"], core_env, input=LINES + "\n")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    out = [line.split("\t") for line in done.stdout.splitlines()]
    assert [number for number, _ in out] == ["1", "8", "9"]
    ids = {number: jid for number, jid in out}
    assert ids["9"] == ids["1"]  # the same judgement twice: one id
    assert len(records(redis_client)) == 2
    errors = done.stderr.splitlines()
    by_line = {e.split(":", 1)[0]: e for e in errors if e.startswith("line ")}
    assert set(by_line) == {"line 2", "line 3", "line 4", "line 6", "line 7", "line 10"}
    assert "JSON object" in by_line["line 2"]
    assert "bogus: unknown field" in by_line["line 3"]
    assert "not valid JSON" in by_line["line 4"]
    assert "unknown kind 'nope'" in by_line["line 6"]
    assert "outside DISPATCHQ_CHECKOUT_ROOTS" in by_line["line 7"]
    assert "kind" in by_line["line 10"]
    assert "6 of 9 lines refused" in done.stderr


def test_enqueue_jsonl_all_good_exits_0(core_env: dict[str, str]) -> None:
    lines = "\n".join(json.dumps({"kind": "lock", "target": f"t{i}"}) for i in range(5)) + "\n"
    done = run_cli(["enqueue", "-"], core_env, input=lines)
    assert done.returncode == 0, done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert [r[0] for r in rows] == ["1", "2", "3", "4", "5"]
    assert len({r[1] for r in rows}) == 5


def test_enqueue_jsonl_json_output(core_env: dict[str, str]) -> None:
    lines = '{"kind": "lock", "target": "a"}\n{"kind": "lock", "target": "b", "x": 1}\n'
    done = run_cli(["enqueue", "-", "--json"], core_env, input=lines)
    assert done.returncode == 1
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    assert first["line"] == 1 and first["id"] and first["created"] is True and first["error"] is None
    assert second["line"] == 2 and second["id"] is None and "x: unknown field" in second["error"]


# --- priority classes ------------------------------------------------------------------------------------


def test_a_bad_priority_exits_2_naming_the_option_and_writes_nothing(
    core_env: dict[str, str], redis_client: Any
) -> None:
    done = run_cli(["enqueue", "--kind", "lock", "--target", "a", "--priority", "bogus"], core_env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    named = [line for line in done.stderr.splitlines() if "--priority" in line and "'bogus'" in line]
    assert named and "urgent" in named[0], done.stderr
    assert records(redis_client) == []


def test_the_class_said_is_the_class_a_result_shows(core_env: dict[str, str]) -> None:
    urgent = enqueue(core_env, "--kind", "lock", "--target", "a", "--priority", "urgent")
    plain = enqueue(core_env, "--kind", "lock", "--target", "b")
    assert result_json(core_env, urgent)["urgency"] == "urgent"
    assert result_json(core_env, plain)["urgency"] == "normal"
    # The class is not part of the judgement: asking again more urgently finds the live one.
    assert enqueue(core_env, "--kind", "lock", "--target", "b", "--priority", "background") == plain


def test_a_json_line_says_its_own_priority(core_env: dict[str, str], redis_client: Any) -> None:
    lines = "\n".join(
        [
            '{"kind": "lock", "target": "a", "priority": "background"}',
            '{"kind": "lock", "target": "b", "priority": "soon"}',
            '{"kind": "lock", "target": "c"}',
        ]
    )
    done = run_cli(["enqueue", "-"], core_env, input=lines + "\n")
    assert done.returncode == 1, done.stderr
    ids = dict(line.split("\t") for line in done.stdout.splitlines())
    assert set(ids) == {"1", "3"}
    assert "line 2: priority: must be one of urgent, normal, background (got 'soon')" in done.stderr
    assert result_json(core_env, ids["1"])["urgency"] == "background"
    assert result_json(core_env, ids["3"])["urgency"] == "normal"
    assert len(records(redis_client)) == 2


def test_priority_with_stdin_is_refused_in_one_line(core_env: dict[str, str]) -> None:
    done = run_cli(["enqueue", "-", "--priority", "urgent"], core_env, input="")
    assert_one_line_error(done, "a line's own `priority` field")


# --- results and the public contract ------------------------------------------------------------------------


def result_json(env: dict[str, str], jid: str, *extra: str) -> dict[str, Any]:
    done = run_cli(["result", jid, "--json", *extra], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_result_json_contract(core_env: dict[str, str], tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    state_file.write_text('{"answer": {"label": "bug"}}')
    answered = enqueue(
        core_env, "--kind", "lock", "--target", "acme/app#12", "--item", "c:1", "--state", f"@{state_file}"
    )
    escalated = enqueue(core_env, "--kind", "lock", "--target", "acme/app#13")
    queued = result_json(core_env, answered)
    assert list(queued)[: len(CONTRACT)] == CONTRACT
    assert (queued["status"], queued["tier"], queued["trail"]) == ("queued", "code", [])
    assert queued["state"] == {"answer": {"label": "bug"}} and queued["item"] == "c:1"

    assert run_cli(["worker", "code", "--burst"], core_env).returncode == 0
    done = result_json(core_env, answered)
    assert list(done)[: len(CONTRACT)] == CONTRACT
    assert done["id"] == answered and done["kind"] == "lock" and done["target"] == "acme/app#12"
    assert (done["status"], done["tier"], done["value"], done["confidence"]) == (
        "answered",
        "code",
        {"label": "bug"},
        None,
    )
    assert done["reason"]
    assert [{k: step[k] for k in ("tier", "outcome")} for step in done["trail"]] == [
        {"tier": "code", "outcome": "answered"}
    ]
    assert all(isinstance(step["why"], str) for step in done["trail"])

    up = result_json(core_env, escalated)
    assert (up["status"], up["tier"]) == ("needs-triage", "needs-triage")
    assert [(s["tier"], s["outcome"]) for s in up["trail"]] == [("code", "moved-up")]
    assert "cannot tell" in up["trail"][0]["why"]


def test_result_human_form(core_env: dict[str, str]) -> None:
    jid = enqueue(core_env, "--kind", "lock", "--target", "acme/app#12", "--state", '{"answer": "rebuild"}')
    run_cli(["worker", "code", "--burst"], core_env)
    done = run_cli(["result", jid], core_env)
    assert done.returncode == 0
    assert "answered" in done.stdout and "rebuild" in done.stdout and "code" in done.stdout


def test_result_wait_returns_a_finished_record(core_env: dict[str, str]) -> None:
    jid = enqueue(core_env, "--kind", "lock", "--target", "a", "--state", '{"answer": true}')
    worker = subprocess.Popen(
        [sys.executable, "-m", "dispatchq.cli", "worker", "code", "--burst"],
        env=core_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        record = result_json(core_env, jid, "--wait", "60")
    finally:
        worker.wait(timeout=60)
    assert (record["status"], record["value"]) == ("answered", True)


def test_list_filters_by_status_and_kind(core_env: dict[str, str]) -> None:
    answered = enqueue(core_env, "--kind", "lock", "--target", "a", "--state", '{"answer": 1}')
    escalated = enqueue(core_env, "--kind", "lock", "--target", "b")
    run_cli(["worker", "code", "--burst"], core_env)
    waiting_label = enqueue(core_env, "--kind", "label", "--target", "c")

    def listed(*args: str) -> list[str]:
        done = run_cli(["list", "--json", *args], core_env)
        assert done.returncode == 0, done.stderr
        return [r["id"] for r in json.loads(done.stdout)]

    assert listed("--status", "answered") == [answered]
    assert listed("--status", "needs-triage") == [escalated]
    assert listed("--status", "queued") == [waiting_label]
    assert listed("--kind", "label") == [waiting_label]
    assert listed() == [waiting_label, escalated, answered]  # newest first
    assert listed("--status", "failed") == []
    table = run_cli(["list"], core_env)
    assert table.returncode == 0 and answered[:12] in table.stdout


def test_cancel_and_cancel_again(core_env: dict[str, str], redis_client: Any) -> None:
    jid = enqueue(core_env, "--kind", "lock", "--target", "a", "--state", '{"answer": 1}')
    done = run_cli(["cancel", jid], core_env)
    assert (done.returncode, done.stdout.strip()) == (0, f"cancelled {jid}")
    run_cli(["worker", "code", "--burst"], core_env)
    record = result_json(core_env, jid)
    assert record["status"] == "cancelled" and record["value"] is None
    assert calls_of(Path(core_env["_CALLS"])) == []  # the worker skipped it
    assert_one_line_error(run_cli(["cancel", jid], core_env), "already finished")


def test_retry_re_judges(core_env: dict[str, str]) -> None:
    jid = enqueue(core_env, "--kind", "lock", "--target", "a", "--state", '{"answer": 1}')
    run_cli(["worker", "code", "--burst"], core_env)
    assert result_json(core_env, jid)["status"] == "answered"
    done = run_cli(["retry", jid], core_env)
    assert (done.returncode, done.stdout.strip()) == (0, f"re-queued {jid}")
    assert result_json(core_env, jid)["status"] == "queued"
    run_cli(["worker", "code", "--burst"], core_env)
    record = result_json(core_env, jid)
    assert record["status"] == "answered"
    assert [s["outcome"] for s in record["trail"]] == ["answered", "requeued", "answered"]
    assert calls_of(Path(core_env["_CALLS"])) == ["a", "a"]


def test_retry_of_a_queued_judgement_is_refused(core_env: dict[str, str]) -> None:
    jid = enqueue(core_env, "--kind", "lock", "--target", "a")
    assert_one_line_error(run_cli(["retry", jid], core_env), "nothing to retry")


def test_prune(core_env: dict[str, str], redis_client: Any) -> None:
    jid = enqueue(core_env, "--kind", "lock", "--target", "a")
    redis_client.delete(f"dispatchq:j:{jid}")  # as if its TTL ran out
    done = run_cli(["prune"], core_env)
    assert (done.returncode, done.stdout.strip()) == (0, "pruned 1 expired entries")


# --- run: the main job -------------------------------------------------------------------------


def test_run_answers_a_batch_and_summarises_it(core_env: dict[str, str], tmp_path: Path) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text(
        "\n".join(
            [
                json.dumps({"kind": "lock", "target": "a", "state": {"answer": "rebuild"}}),
                json.dumps({"kind": "lock", "target": "b", "state": {"answer": False}}),
                json.dumps({"kind": "lock", "target": "c"}),
                json.dumps({"kind": "label", "target": "d"}),
            ]
        )
        + "\n"
    )
    done = run_cli(["run", str(batch), "--json"], core_env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    by_target = {r["target"]: r for r in report["judgements"]}
    assert by_target["a"]["value"] == "rebuild" and by_target["b"]["value"] is False
    assert {t: r["status"] for t, r in by_target.items()} == {
        "a": "answered",
        "b": "answered",
        "c": "needs-triage",
        "d": "needs-triage",
    }
    summary = report["summary"]
    assert summary["total"] == 4 and summary["answered"] == {"code": 2, "typed": 0, "session": 0}
    assert summary["needs_triage"] == 2 and summary["failed"] == 0
    human = run_cli(["run", str(batch)], core_env)  # the same batch again: nothing new to do
    assert human.returncode == 0
    assert "sessions avoided: 2" in human.stdout
    assert calls_of(Path(core_env["_CALLS"])) == ["a", "b", "c"]


def test_run_with_refused_lines_exits_1(core_env: dict[str, str], tmp_path: Path) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text(
        '{"kind": "lock", "target": "a", "state": {"answer": 1}}\n{"kind": "nope", "target": "b"}\n'
    )
    done = run_cli(["run", str(batch), "--json"], core_env)
    assert done.returncode == 1
    assert "line 2: unknown kind 'nope'" in done.stderr and "Traceback" not in done.stderr
    assert json.loads(done.stdout)["summary"]["answered"]["code"] == 1


# --- status and help ----------------------------------------------------------------------------


def test_status_json_keys(core_env: dict[str, str]) -> None:
    enqueue(core_env, "--kind", "lock", "--target", "a", "--state", '{"answer": 1}')
    enqueue(core_env, "--kind", "lock", "--target", "b")
    enqueue(core_env, "--kind", "lock", "--target", "crash", "--state", '{"raise": true}')
    run_cli(["worker", "code", "--burst"], core_env)
    enqueue(core_env, "--kind", "label", "--target", "c")
    done = run_cli(["status", "--json"], core_env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert {
        "redis",
        "queues",
        "workers",
        "judgements",
        "answered",
        "sessions_avoided",
        "waiting",
        "scheduler",
    } <= set(data)
    assert "marker" in data or "markers" in data  # the usage-window section
    assert set(data["queues"]) >= {"code", "typed", "session"}
    assert set(data["workers"]) >= {"code", "typed", "session"}
    assert data["queues"]["typed"] == 1
    assert data["judgements"]["answered"] == 1 and data["judgements"]["needs-triage"] == 1
    assert data["judgements"]["queued"] == 1
    assert data["judgements"]["failed"] == 1  # a crashing check is visible, not escalated
    assert data["answered"]["code"] == 1 and data["sessions_avoided"] == 1
    assert data["redis"].startswith("embedded (")
    human = run_cli(["status"], core_env)
    assert human.returncode == 0, human.stderr
    assert "sessions avoided" in human.stdout


def all_command_paths() -> list[list[str]]:
    import click

    from dispatchq.cli import main

    ctx = click.Context(main)
    paths: list[list[str]] = [[]]
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None, name
        paths.append([name])
        if isinstance(command, click.Group):
            sub = click.Context(command, parent=ctx)
            paths += [[name, s] for s in command.list_commands(sub)]
    return paths


def test_every_command_has_help() -> None:
    from dispatchq.cli import main

    paths = all_command_paths()
    names = {p[0] for p in paths if p}
    assert {
        "enqueue",
        "result",
        "list",
        "cancel",
        "retry",
        "prune",
        "run",
        "worker",
        "scheduler",
        "status",
    } <= names
    assert ["redis", "stop"] in paths
    runner = CliRunner()
    for path in paths:
        done = runner.invoke(main, [*path, "--help"])
        assert done.exit_code == 0, (path, done.output, done.exception)
        assert "Usage:" in done.output, path


def test_help_from_a_real_process(core_env: dict[str, str]) -> None:
    done = run_cli(["--help"], core_env)
    assert done.returncode == 0 and "enqueue" in done.stdout and "worker" in done.stdout
    done = run_cli(["enqueue", "--help"], core_env)
    assert done.returncode == 0 and "--force" in done.stdout
