"""`dispatchq config check` and `dispatchq config schema`, run as a user runs them.

A broken file is one line per mistake, `FILE: full.path.to.key: what is wrong`, exit 2,
never a traceback; nothing is started (the Redis named below does not exist). The schema
`config schema` prints accepts the shipped examples and the `dispatchq init` starter, and
refuses a broken file.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from dispatchq.config import read_document
from tests.support.helpers import REPO, run_cli, write_config

EXAMPLES = REPO / "examples"


def _offline_env(tmp_path: Path) -> dict[str, str]:
    """No Redis to reach (a closed port), and the default config file under tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCHQ_", "TYPESAFE_"))}
    env.update(
        DISPATCHQ_REDIS_URL="redis://127.0.0.1:9/0",
        DISPATCHQ_DATA_DIR=str(tmp_path / "data"),
        DISPATCHQ_CONFIG=str(tmp_path / "dispatchq.yaml"),
        XDG_CONFIG_HOME=str(tmp_path / "xdg"),
        PYTHONPATH=str(REPO),
    )
    return env


#: One mistake each: the file, and the line `config check` prints for it (after `FILE: `).
BROKEN = {
    "unknown key three levels deep": (
        """
        kinds:
          pr-risk:
            session: {prompt: "Judge {{ target }}", promt: typo}
        """,
        "kinds.pr-risk.session.promt: unknown key "
        "(allowed: args, backends, bind, cost_estimate, format, model, prompt, prompts)",
    ),
    "wrong type": (
        """
        kinds:
          pr-risk:
            session: {prompt: "Judge {{ target }}", args: "--model opus"}
        """,
        "kinds.pr-risk.session.args: must be a list of strings (got '--model opus')",
    ),
    "bad enum": (
        """
        kinds:
          pr-risk:
            effect: global
            session: {prompt: "Judge {{ target }}"}
        """,
        "kinds.pr-risk.effect: must be local or external (got 'global')",
    ),
    "missing required field": (
        """
        kinds:
          pr-risk:
            session: {args: ["--permission-mode", "plan"]}
        """,
        "kinds.pr-risk.session.prompt: field required",
    ),
    "bad regex in a rule": (
        """
        triage:
          questions:
            area: {type: choice, instructions: "Which area?", criteria: {bug: null, docs: null}}
          rules:
            - id: versioned
              events: [issues.opened]
              if: 'event.title.matches("^v[0-9") && area == "bug"'
              actions: [{op: label.add, label: bug}]
        """,
        "triage.rules[versioned].if: matches('^v[0-9'): not a regular expression (missing ]: [0-9)",
    ),
    "a kind with no tier": (
        """
        kinds:
          pr-risk:
            effect: external
        """,
        "kinds.pr-risk: declares no tier (give a check, produce/verify, questions or a session)",
    ),
    "a metered credential without a cap": (
        """
        credentials:
          api-overflow:
            api_key_file: /etc/dispatchq/anthropic
            billing: metered
        """,
        "credentials.api-overflow: a metered credential needs spend_cap (USD per day and/or month)",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_file_is_one_line_naming_the_path_and_exit_2(tmp_path: Path, case: str) -> None:
    text, expected = BROKEN[case]
    path = write_config(tmp_path / "broken.yaml", text)
    done = run_cli(["config", "check", str(path)], _offline_env(tmp_path))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.splitlines() == [f"{path}: {expected}"], done.stderr
    assert done.stdout == ""


def test_several_mistakes_are_one_line_each_and_json_lists_them(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "dispatchq.yaml",
        """
        kinds:
          a: {effect: global, session: {prompt: "{{ target }}"}}
          b: {session: {prompt: "{{ owner }}"}}
        colours: red
        """,
    )
    env = _offline_env(tmp_path)
    done = run_cli(["config", "check"], env)  # no FILE: the file the settings load
    expected = [
        f"{path}: kinds.a.effect: must be local or external (got 'global')",
        f"{path}: kinds.b.session.prompt: unknown placeholder {{{{ owner }}}} "
        "(known: context, item, state, target)",
        f"{path}: colours: unknown top-level key (allowed: credentials, kinds, triage)",
    ]
    assert (done.returncode, done.stderr.splitlines()) == (2, expected), done.stderr
    as_json = run_cli(["config", "check", "--json"], env)
    assert as_json.returncode == 2
    assert json.loads(as_json.stdout) == {
        "file": str(path),
        "ok": False,
        "problems": expected,
        "kinds": [],
        "credentials": [],
    }
    assert "Traceback" not in done.stderr + as_json.stderr


def test_a_valid_file_is_one_ok_line_and_exit_0(tmp_path: Path) -> None:
    done = run_cli(["config", "check", str(EXAMPLES / "dispatchq.yaml")], _offline_env(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{EXAMPLES / 'dispatchq.yaml'}: OK (5 kinds, triage rules)\n"
    as_json = run_cli(["config", "check", "--json", str(EXAMPLES / "starter.yaml")], _offline_env(tmp_path))
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["kinds"] == ["comment-actionable", "explain-failure"]


def test_a_missing_file_and_a_yaml_syntax_error_are_one_line_too(tmp_path: Path) -> None:
    env = _offline_env(tmp_path)
    missing = run_cli(["config", "check"], env)
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [
        f"{tmp_path / 'dispatchq.yaml'}: config file not found (set DISPATCHQ_CONFIG or create it)"
    ]
    path = write_config(tmp_path / "bad.yaml", 'kinds:\n  k:\n    check: "unclosed\n')
    syntax = run_cli(["config", "check", str(path)], env)
    assert syntax.returncode == 2 and len(syntax.stderr.splitlines()) == 1
    assert syntax.stderr.startswith(f"{path}:")


def test_another_command_prints_each_mistake_on_its_own_error_line(
    dq_env: dict[str, str], tmp_path: Path
) -> None:
    write_config(
        tmp_path / "dispatchq.yaml",
        """
        kinds:
          a: {effect: global, session: {prompt: "{{ target }}"}}
          b: {session: {prompt: "{{ target }}", format: yaml}}
        """,
    )
    listed = run_cli(["enqueue", "--kind", "a", "--target", "x"], dq_env)
    assert listed.returncode == 2, listed.stderr
    assert listed.stderr.splitlines() == [
        "error: kinds.a.effect: must be local or external (got 'global')",
        "error: kinds.b.session.format: must be text or json (got 'yaml')",
    ]


@functools.cache
def _schema() -> str:
    """What `dispatchq config schema` prints (run once for this file's tests)."""
    with tempfile.TemporaryDirectory() as folder:
        done = run_cli(["config", "schema"], _offline_env(Path(folder)))
    assert done.returncode == 0, done.stderr
    return done.stdout


def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(_schema())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_schema_accepts_the_shipped_examples_and_the_init_starter(tmp_path: Path) -> None:
    validator = _validator()
    written = run_cli(["init", "--here"], _offline_env(tmp_path), cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    files = [*sorted(EXAMPLES.glob("*.yaml")), tmp_path / "dispatchq.yaml"]
    assert len(files) >= 3
    for path in files:
        errors = [e.message for e in validator.iter_errors(read_document(path))]
        assert errors == [], (path, errors)


@pytest.mark.parametrize(
    "document",
    [
        {"kinds": {"k": {"session": {"prompt": "{{ target }}", "promt": "typo"}}}},
        {"kinds": {"k": {"effect": "global", "check": "m:f"}}},
        {"kinds": {"k": {"session": {"args": ["--x"]}}}},
        {"kinds": {"bad kind!": {"check": "m:f"}}},
        {"triage": {"mode": "loud"}},
        {"triage": {"rules": [{"id": "r", "events": ["issues.opened"], "actions": [{"op": "explode"}]}]}},
        {"kindz": {}},
    ],
)
def test_the_schema_refuses_a_broken_file(document: dict[str, Any]) -> None:
    validator = _validator()
    assert list(validator.iter_errors(document)), document


#: Two credentials, their files beside the config file (relative paths are its folder's).
POOL = """
kinds:
  pr-risk:
    session: {prompt: "Judge {{ target }}", cost_estimate: 0.5}
    priority: urgent
credentials:
  team-max:
    token_file: team-max.token
    concurrency: 2
  api-overflow:
    api_key_file: anthropic.key
    billing: metered
    spend_cap: {day: 20.0, month: 300.0}
    serves: {priority: urgent, kinds: [pr-risk]}
"""


def test_a_good_file_with_credentials_is_ok_and_lists_them(tmp_path: Path) -> None:
    path = write_config(tmp_path / "pool.yaml", POOL)
    (tmp_path / "team-max.token").write_text("sk-ant-oat01-not-a-real-token\n")
    (tmp_path / "anthropic.key").write_text("sk-ant-api03-not-a-real-key\n")
    env = _offline_env(tmp_path)
    done = run_cli(["config", "check", str(path)], env)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{path}: OK (1 kind, 2 credentials)\n", "")
    as_json = run_cli(["config", "check", "--json", str(path)], env)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["credentials"] == ["team-max", "api-overflow"]
    assert "not-a-real" not in done.stdout + as_json.stdout


def test_a_missing_or_empty_credential_file_is_one_line_naming_credential_and_path(tmp_path: Path) -> None:
    path = write_config(tmp_path / "pool.yaml", POOL)
    (tmp_path / "anthropic.key").write_text("\n")
    env = _offline_env(tmp_path)
    done = run_cli(["config", "check", str(path)], env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.splitlines() == [
        f"{path}: credentials.team-max: token_file {tmp_path / 'team-max.token'} does not exist",
        f"{path}: credentials.api-overflow: api_key_file {tmp_path / 'anthropic.key'} is empty",
    ]
    assert done.stdout == ""
    as_json = run_cli(["config", "check", "--json", str(path)], env)
    assert as_json.returncode == 2
    assert json.loads(as_json.stdout)["problems"] == done.stderr.splitlines()
    away = run_cli(["config", "check", "--no-files", str(path)], env)
    assert (away.returncode, away.stdout) == (0, f"{path}: OK (1 kind, 2 credentials)\n"), away.stderr


def test_the_schema_accepts_a_pool_file(tmp_path: Path) -> None:
    path = write_config(tmp_path / "pool.yaml", POOL)
    assert [e.message for e in _validator().iter_errors(read_document(path))] == []
