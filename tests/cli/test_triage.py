"""`dispatchq triage` end to end through click, over fakeredis, with the recording executor.

`_redis` is the CLI's one seam to Redis (its wiring function); the config comes
through `DISPATCHQ_CONFIG` like in production.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from dispatchq.cli import main
from dispatchq.errors import UserError
from dispatchq.storage.triage import TriageStorage
from dispatchq.triage.executors import RecordingExecutor
from dispatchq.triage.rules import Event
from tests.support.cli import CONFIG, Env

EVENT = {
    "event": "issues.opened",
    "target": "acme/app#12",
    "item": "issue:12",
    "context": {"repo": "acme/app"},
    "state": {"title": "It crashes", "body": "it crashes; $(rm -rf /) `whoami`"},
}
ANSWERS = {
    "needs_repro": {"type": "noul", "noul": 0.97},
    "area": {
        "type": "choice",
        "choice": "bug",
        "confidence": 0.9,
        "probabilities": {"bug": 0.9, "feature": 0.05, "docs": 0.05},
    },
}


def test_keyless_run_lists_no_answers_never_nothing(triage_env: Env) -> None:
    out = triage_env.run_json("--event", triage_env.file("event.json", EVENT))
    assert [(e["rule"], e["reason"]) for e in out["suppressed"]] == [
        ("needs-repro", "no_answers"),
        ("needs-repro", "no_answers"),
    ]
    assert "keyless" in out["suppressed"][0]["explanation"]
    assert out["applied"] == [] and out["suggested"] == []
    assert out["escalated"]["label"] == "needs-triage"


def test_answers_file_in_shadow_mode_prints_the_suppressed_list(triage_env: Env) -> None:
    result = triage_env.run(
        "--event", triage_env.file("event.json", EVENT), "--answers", triage_env.file("answers.json", ANSWERS)
    )
    assert result.exit_code == 0, result.output
    line = "x label: add needs-repro    [needs-repro] shadow_mode — "
    assert line + "shadow mode decides and logs but writes nothing" in result.stdout
    assert "Suppressed (2)" in result.stdout
    assert RecordingExecutor(TriageStorage(triage_env.redis())).recorded() == []


def test_auto_mode_applies_through_the_recording_executor(triage_env: Env) -> None:
    out = triage_env.run_json(
        "--event",
        triage_env.file("event.json", EVENT),
        "--answers",
        triage_env.file("answers.json", ANSWERS),
        "--mode",
        "auto",
    )
    assert out["mode"] == "auto"
    assert [(e["action"]["op"], e["executed"].split(":")[0]) for e in out["applied"]] == [
        ("label.add", "performed"),
        ("comment", "performed"),
    ]
    state = RecordingExecutor(TriageStorage(triage_env.redis())).state("acme/app#12")
    assert state["labels"] == ["needs-repro"]
    (body,) = state["comments"].values()
    assert body.startswith("Please add the steps") and "<!-- dispatchq:comment:" in body


def test_the_decision_id_is_stable_across_modes_and_redelivery(triage_env: Env) -> None:
    args = (
        "--event",
        triage_env.file("event.json", EVENT),
        "--answers",
        triage_env.file("answers.json", ANSWERS),
    )
    first = triage_env.run_json(*args)
    again = triage_env.run_json(*args)
    auto = triage_env.run_json(*args, "--mode", "auto")
    assert first["decision_id"] == again["decision_id"] == auto["decision_id"]
    edited = dict(EVENT, state={"title": "It crashes", "body": "steps: 1. run 2. crash"})
    assert (
        triage_env.run_json("--event", triage_env.file("edited.json", edited))["decision_id"]
        != first["decision_id"]
    )


def test_suggest_then_apply(triage_env: Env) -> None:
    triage_env.write_config("suggest")
    out = triage_env.run_json(
        "--event", triage_env.file("event.json", EVENT), "--answers", triage_env.file("answers.json", ANSWERS)
    )
    assert len(out["suggested"]) == 2
    assert RecordingExecutor(TriageStorage(triage_env.redis())).recorded() == []
    result = triage_env.run("apply", out["decision_id"][:10], "--rule", "needs-repro")
    assert result.exit_code == 0, result.output
    assert "label: add needs-repro    [needs-repro] performed" in result.stdout
    assert [r["op"] for r in RecordingExecutor(TriageStorage(triage_env.redis())).recorded()] == [
        "label.add",
        "comment",
    ]


def test_apply_an_unknown_decision_is_a_user_error(triage_env: Env) -> None:
    triage_env.write_config("suggest")
    result = CliRunner().invoke(main, ["triage", "apply", "deadbeefdeadbeef"])
    assert result.exit_code == 2
    assert "no triage decision 'deadbeefdeadbeef'" in result.stderr


def test_replay_shows_changed_outcomes_without_asking(triage_env: Env) -> None:
    triage_env.run_json(
        "--event",
        triage_env.file("event.json", EVENT),
        "--answers",
        triage_env.file("answers.json", ANSWERS),
        "--mode",
        "auto",
    )
    left_out = triage_env.run_json("replay", "--gate-auto", "0.99", "--mode", "auto")
    assert (left_out["decisions"], left_out["skipped_file_answers"], left_out["changes"]) == (0, 1, [])
    assert "left out 1 decided over --answers files" in triage_env.run("replay").stdout
    report = triage_env.run_json(
        "replay", "--gate-auto", "0.99", "--mode", "auto", "--since", "1h", "--include-file-answers"
    )
    assert report["decisions"] == 1 and report["answers_from"] == {"file": 1}
    assert {(c["action"]["op"], tuple(c["before"]), tuple(c["after"])) for c in report["changes"]} == {
        ("label.add", ("apply", "apply"), ("suggest", "suggest")),
        ("comment", ("apply", "apply"), ("suggest", "suggest")),
    }
    human = triage_env.run("replay", "--mode", "shadow", "--include-file-answers")
    assert "(1 from file)" in human.stdout and "2 outcome(s) would change" in human.stdout
    assert triage_env.run_json("replay", "--since", "2099-01-01T00:00:00")["decisions"] == 0


def test_lint_exits_non_zero_on_problems(triage_env: Env) -> None:
    assert triage_env.run("lint").exit_code == 0
    broken = CONFIG.format(mode="shadow").replace(
        "events: [issues.opened]\n      if", "events: [issues.opened, issues.edited]\n      if"
    )
    broken = broken.replace(
        "templates: {repro: templates/needs-repro.md}", "templates: {repro: templates/gone.md}"
    )
    triage_env.write_config(text=broken)
    result = triage_env.run("lint")
    assert result.exit_code == 1
    assert "triage.rules[needs-repro]: question 'area' is not asked for issues.edited" in result.stdout
    assert "templates/gone.md does not exist" in result.stdout


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda e: e.file("event.json", "{not json"), "event file"),
        (lambda e: e.file("event.json", {"event": "Opened!", "target": "a/b#1"}), "event.event"),
    ],
)
def test_a_bad_event_is_one_line_and_exit_2(triage_env: Env, setup: Any, message: str) -> None:
    path = setup(triage_env)
    result = CliRunner().invoke(main, ["triage", "--event", path])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert "Traceback" not in result.output


def _bytes(env: Env, name: str, data: bytes) -> str:
    path = env.root / name
    path.write_bytes(data)
    return str(path)


def test_a_non_utf8_event_file_names_the_file_and_the_byte_offset(triage_env: Env) -> None:
    raw = json.dumps(EVENT).encode().replace(b"It crashes", b"It \xff crashes")
    path = _bytes(triage_env, "event.json", raw)
    result = CliRunner().invoke(main, ["triage", "--event", path])
    assert result.exit_code == 2, result.output
    offset = raw.index(b"\xff")
    assert result.stderr.strip() == f"error: event file {path}: not UTF-8 (byte 0xff at offset {offset})"


def test_a_non_utf8_answers_file_names_the_file_and_the_byte_offset(triage_env: Env) -> None:
    raw = b'{"needs_repro": {"type": "noul", "noul": 0.9}, "x": "\xc3("}'
    answers = _bytes(triage_env, "a.json", raw)
    offset = raw.index(b"\xc3")
    result = CliRunner().invoke(
        main, ["triage", "--event", triage_env.file("event.json", EVENT), "--answers", answers]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"error: answers file {answers}: not UTF-8 (byte 0xc3 at offset {offset})"


@pytest.mark.parametrize(
    ("event", "where"),
    [
        ({**EVENT, "state": {"title": "\ud800 crash"}}, "state.title"),
        ({**EVENT, "target": "acme/app#\udfff"}, "target"),
    ],
)
def test_a_lone_surrogate_is_a_user_error_not_a_hash_crash(triage_env: Env, event: Any, where: str) -> None:
    path = triage_env.file("event.json", json.dumps(event))  # json.dumps writes it as a \ud800 escape
    result = CliRunner().invoke(main, ["triage", "--event", path])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{where}: a lone surrogate" in lines[0] and "is not text" in lines[0]


def test_a_lone_surrogate_is_refused_by_the_event_model_too() -> None:
    with pytest.raises(UserError, match=r"event.target: a lone surrogate \\ud800"):
        Event.from_json({**EVENT, "target": "acme/app#\ud800"})
    with pytest.raises(UserError, match=r"event.state.title: a lone surrogate"):
        Event.from_json({**EVENT, "state": {"title": "\ud800"}})


def test_a_malformed_answers_file_is_refused(triage_env: Env) -> None:
    bad = {"needs_repro": {"type": "noul", "noul": 1.7}}
    result = CliRunner().invoke(
        main,
        [
            "triage",
            "--event",
            triage_env.file("event.json", EVENT),
            "--answers",
            triage_env.file("a.json", bad),
        ],
    )
    assert result.exit_code == 2 and "needs_repro.noul" in result.stderr


def test_a_rule_keyed_on_is_refused_with_a_hint(triage_env: Env) -> None:
    triage_env.write_config(
        text=CONFIG.format(mode="shadow").replace(
            "events: [issues.opened]\n      if", "on: [issues.opened]\n      if"
        )
    )
    result = CliRunner().invoke(main, ["triage", "lint"])
    assert result.exit_code == 2
    assert (
        "triage.rules[needs-repro]: unknown key 'on' (name events with 'events', not 'on')" in result.stderr
    )


def test_an_if_that_does_not_parse_refuses_the_file(triage_env: Env) -> None:
    triage_env.write_config(text=CONFIG.format(mode="shadow").replace('area == "bug"\'', "area == '"))
    result = CliRunner().invoke(main, ["triage", "--event", triage_env.file("event.json", EVENT)])
    assert result.exit_code == 2 and "triage.rules[needs-repro].if" in result.stderr


def test_a_missing_config_file_is_a_user_error(triage_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHQ_CONFIG", str(triage_env.root / "nope.yaml"))
    result = CliRunner().invoke(main, ["triage", "lint"])
    assert result.exit_code == 2 and "nope.yaml" in result.stderr


def test_no_event_and_no_subcommand_is_a_usage_error(triage_env: Env) -> None:
    result = CliRunner().invoke(main, ["triage"])
    assert result.exit_code == 2 and "--event" in result.output


def test_lint_says_a_rule_on_a_misspelt_event_never_fires_and_names_the_cel_fix(triage_env: Env) -> None:
    broken = CONFIG.format(mode="shadow").replace(
        "events: [issues.opened]\n      if: 'needs_repro >= 0.8",
        "events: [issue.opened]\n      if: '1 == needs_repro",
    )
    triage_env.write_config(text=broken)
    result = triage_env.run("lint")
    assert result.exit_code == 1
    assert (
        "triage.rules[needs-repro].events[0]: 'issue.opened' is not a GitHub webhook event, "
        "so the rule never fires; did you mean 'issues.opened'?  [unknown_event]" in result.stdout
    )
    assert "1 == needs_repro compares an int with a double answer" in result.stdout
    assert "write 1.0  [int_double_comparison]" in result.stdout
