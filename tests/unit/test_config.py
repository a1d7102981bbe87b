"""Config validation: every mistake is caught at load, as one error naming kind and field.

Unit tests: no Redis. `parse_config` validates an already-parsed document; `load_config`
reads YAML (1.2: `on`, `yes`, `no` stay strings).
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from dispatchq.config import Config, config_source, load_config, parse_config
from dispatchq.errors import ConfigError, UserError
from dispatchq.storage.triage import TriageStorage
from dispatchq.triage.executors import Command, RecordingExecutor, RepositoryGate, build_executor
from tests.support.helpers import write_check_module, write_config

NOUL = {"type": "noul", "instructions": "Is it actionable?"}
SCORE = {"type": "score", "instructions": "How urgent?", "criteria": ["can wait", "this week", "today"]}
SESSION = {"prompt": "Decide {{ target }} given {{ state }}"}
EXAMPLES = (Path(__file__).resolve().parents[2] / "examples").resolve()  # a link to dispatchq/examples


def config_of(kinds: dict[str, Any], tmp_path: Path | None = None) -> Config:
    path = tmp_path / "dispatchq.yaml" if tmp_path is not None else None
    return parse_config({"kinds": kinds}, path)


def error_of(kinds: dict[str, Any], tmp_path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        config_of(kinds, tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert isinstance(caught.value, UserError)
    return message


def typed_kind(**extra: Any) -> dict[str, Any]:
    return {"questions": {"actionable": NOUL}, "answer": "actionable", "escalate": "needs-triage", **extra}


# --- a valid config ---------------------------------------------------------------------------


def test_the_documented_example_loads(tmp_path: Path, fresh_checks: None) -> None:
    shutil.copy(EXAMPLES / "checks.py", tmp_path / "checks.py")  # the example checks, beside it
    path = write_config(
        tmp_path / "dispatchq.yaml",
        """
        kinds:
          lockfile-conflict:
            check: checks:lockfile_only
          repair-main:
            produce: [["ruff", "format", "."]]
            verify: [["pytest", "-q"]]
          comment-actionable:
            effect: local
            questions:
              actionable: {type: noul, instructions: "Does this review comment ask for a code change?"}
              severity:
                {type: score, instructions: "How urgent is it?", criteria: [can wait, this week, today]}
            answer: actionable
            gateOn: [actionable, severity]
            order: severity
            escalate: session
            session:
              prompt: "Decide {{ target }} given {{ state }}"
              args: ["--permission-mode", "plan"]
              format: json
        """,
    )
    config = load_config(path)
    assert set(config.kinds) == {"lockfile-conflict", "repair-main", "comment-actionable"}
    lock = config.kinds["lockfile-conflict"]
    assert lock.check == "checks:lockfile_only" and callable(lock.check_fn)
    assert lock.escalate == "needs-triage"  # no session block: a person decides
    repair = config.kinds["repair-main"]
    assert repair.produce == (("ruff", "format", "."),) and repair.verify == (("pytest", "-q"),)
    comment = config.kinds["comment-actionable"]
    assert comment.gate_on == ("actionable", "severity") and comment.order == "severity"
    assert comment.session is not None and comment.session.format == "json"
    assert comment.session.args == ("--permission-mode", "plan")
    assert comment.questions["severity"].wire() == {
        "type": "score",
        "instructions": "How urgent is it?",
        "criteria": ["can wait", "this week", "today"],
    }


def test_effect_comes_from_the_kind_and_defaults_to_local() -> None:
    config = config_of({"a": typed_kind(), "b": typed_kind(effect="external")})
    assert config.kinds["a"].effect == "local"
    assert config.kinds["b"].effect == "external"


def test_a_check_imports_from_the_config_files_directory_also_when_it_runs(tmp_path: Path) -> None:
    """A check may import its own helpers from the config's directory at call time."""
    (tmp_path / "helper_for_checks.py").write_text("VALUE = 'from-a-helper'\n")
    module = write_check_module(
        tmp_path, "def check(judgement):\n    import helper_for_checks\n    return helper_for_checks.VALUE\n"
    )
    try:
        config = config_of({"k": {"check": f"{module}:check"}}, tmp_path)
        fn = config.kinds["k"].check_fn
        assert fn is not None and fn(None) == "from-a-helper"
    finally:
        sys.modules.pop("helper_for_checks", None)
        if str(tmp_path.resolve()) in sys.path:
            sys.path.remove(str(tmp_path.resolve()))


def test_the_shipped_example_config_loads_its_checks_from_beside_it(fresh_checks: None) -> None:
    config = load_config(EXAMPLES / "dispatchq.yaml")
    lock = config.kinds["lockfile-conflict"]
    assert lock.check == "checks:lockfile_only" and lock.check_fn is not None
    assert Path(lock.check_fn.__code__.co_filename).resolve() == EXAMPLES / "checks.py"


def test_the_old_jobs_examples_names_still_load_the_same_checks_for_one_release() -> None:
    """`jobs.examples` is a shim over examples/checks.py; it goes away next release."""
    fn = parse_config({"kinds": {"k": {"check": "jobs.examples:lockfile_only"}}}).kinds["k"].check_fn
    assert fn is not None and Path(fn.__code__.co_filename).resolve() == EXAMPLES / "checks.py"
    state = {"conflicts": ["a/poetry.lock"]}
    assert fn(type("J", (), {"state": state})())["value"] == "rebuild-lockfile"


def test_the_config_folder_goes_last_on_the_path_never_first(tmp_path: Path) -> None:
    """A user's folder must not shadow an installed package (their own `jobs/` once did)."""
    module = write_check_module(tmp_path, "def check(judgement):\n    return 1\n")
    entry = str(tmp_path.resolve())
    before = [p for p in sys.path if p != entry]
    try:
        config_of({"k": {"check": f"{module}:check"}}, tmp_path)
        assert sys.path[-1] == entry and sys.path[: len(before)] == before
    finally:
        if entry in sys.path:
            sys.path.remove(entry)


def test_missing_file_and_optional_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")
    assert load_config(tmp_path / "absent.yaml", required=False).kinds == {}


def test_empty_file_is_an_empty_config(tmp_path: Path) -> None:
    assert load_config(write_config(tmp_path / "dispatchq.yaml", "")).kinds == {}


# --- YAML --------------------------------------------------------------------------------------


def test_yaml_syntax_error_reports_file_line_and_column(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "dispatchq.yaml",
        """
        kinds:
          k:
            check: "tests.support.checks:noop
        """,
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:")
    line, column = message.removeprefix(f"{path}:").split(":")[:2]
    assert line.isdigit() and column.isdigit()


def test_yaml_duplicate_key_is_an_error_with_its_line(tmp_path: Path) -> None:
    path = write_config(tmp_path / "dispatchq.yaml", "kinds:\n  k:\n    check: a:b\n    check: c:d\n")
    with pytest.raises(ConfigError, match=r":4:\d+: .*duplicate key"):
        load_config(path)


def test_yaml_1_2_keeps_on_yes_no_as_strings(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "dispatchq.yaml",
        """
        kinds:
          on:
            questions:
              pick: {type: choice, instructions: yes, criteria: {yes: agree, no: disagree, off: abstain}}
            answer: pick
            escalate: needs-triage
        """,
    )
    config = load_config(path)
    assert list(config.kinds) == ["on"]  # YAML 1.1 would have made this key True
    question = config.kinds["on"].questions["pick"]
    assert question.instructions == "yes"
    assert list(question.criteria) == ["yes", "no", "off"]


def test_yaml_1_2_a_value_yes_is_not_a_boolean(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "dispatchq.yaml",
        """
        kinds:
          k:
            questions: {q: {type: noul, instructions: "?"}}
            answer: q
            escalate: yes
        """,
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "kinds.k.escalate" in str(caught.value)
    assert "'yes'" in str(caught.value) and "True" not in str(caught.value)


@pytest.mark.parametrize(("value", "shown"), [("2024-01-01", "date"), (".nan", "nan"), (".inf", "inf")])
def test_a_value_json_cannot_spell_is_a_config_error_naming_the_field(
    tmp_path: Path, value: str, shown: str
) -> None:
    path = write_config(
        tmp_path / "dispatchq.yaml",
        f"""
        kinds:
          k:
            questions: {{q: {{type: noul, instructions: {value}}}}}
            answer: q
            escalate: needs-triage
        """,
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith("kinds.k.questions.q.instructions: ")
    assert shown in str(caught.value)


# --- structure and unknown keys ------------------------------------------------------------------


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        parse_config(["kinds"])


def test_unknown_top_level_key() -> None:
    with pytest.raises(ConfigError, match=r"^kindz: unknown top-level key"):
        parse_config({"kindz": {}})


def test_unknown_kind_key_names_kind_and_field() -> None:
    assert error_of({"k": typed_kind(gate_on=["actionable"])}).startswith("kinds.k.gate_on: unknown key")


def test_unknown_question_key() -> None:
    kind = typed_kind(questions={"actionable": {**NOUL, "instruction": "typo"}})
    assert error_of({"k": kind}).startswith("kinds.k.questions.actionable.instruction: unknown key")


def test_unknown_session_key() -> None:
    kind = {"session": {**SESSION, "promt": "typo"}}
    assert error_of({"k": kind}).startswith("kinds.k.session.promt: unknown key")


def test_kind_name_characters() -> None:
    assert error_of({"bad kind!": typed_kind()}).startswith("kinds.bad kind!: ")


def test_kind_must_be_a_mapping() -> None:
    assert error_of({"k": "tests.support.checks:noop"}).startswith("kinds.k: must be a mapping")


def test_kind_declaring_no_tier() -> None:
    assert error_of({"k": {"effect": "local"}}).startswith("kinds.k: declares no tier")


def test_effect_must_be_local_or_external() -> None:
    assert error_of({"k": typed_kind(effect="global")}).startswith("kinds.k.effect: ")


# --- the code tier --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "fragment"),
    [
        ("no_such_module_dq:check", "cannot import 'no_such_module_dq'"),
        ("tests.support.checks:no_such_function", "has no callable 'no_such_function'"),
        ("tests.support.checks.noop", "is not module:function"),
        ("tests.support.checks:NOT_CALLABLE", "has no callable 'NOT_CALLABLE'"),
    ],
)
def test_a_check_that_does_not_import(check: str, fragment: str) -> None:
    message = error_of({"k": {"check": check}})
    assert message.startswith("kinds.k.check: ")
    assert fragment in message


def test_a_check_module_that_raises_on_import(tmp_path: Path) -> None:
    module = write_check_module(tmp_path, "raise RuntimeError('broken at import')\n")
    message = error_of({"k": {"check": f"{module}:check"}}, tmp_path)
    assert message.startswith("kinds.k.check: ")
    assert "RuntimeError" in message and "broken at import" in message


def test_a_check_must_be_text() -> None:
    assert error_of({"k": {"check": ["tests.support.checks", "noop"]}}).startswith("kinds.k.check: ")


def test_checks_are_not_imported_when_asked_not_to() -> None:
    config = parse_config({"kinds": {"k": {"check": "no_such_module_dq:check"}}}, import_checks=False)
    assert config.kinds["k"].check_fn is None


@pytest.mark.parametrize(
    ("kind", "field"),
    [
        ({"produce": [["make"]]}, "kinds.k.verify"),
        ({"verify": [["make", "test"]]}, "kinds.k.produce"),
        ({"produce": "make", "verify": [["make"]]}, "kinds.k.produce"),
        ({"produce": [], "verify": [["make"]]}, "kinds.k.produce"),
        ({"produce": [["make"]], "verify": [[]]}, "kinds.k.verify[0]"),
        ({"produce": [["make", 1]], "verify": [["make"]]}, "kinds.k.produce[0]"),
        ({"produce": [["make"]], "verify": ["make test"]}, "kinds.k.verify[0]"),
        (
            {"check": "tests.support.checks:noop", "produce": [["make"]], "verify": [["make"]]},
            "kinds.k.produce",
        ),
    ],
)
def test_produce_and_verify_rules(kind: dict[str, Any], field: str) -> None:
    assert error_of({"k": kind}).startswith(f"{field}: ")


# --- the typed tier: questions the SDK would reject --------------------------------------------------


def test_question_type_must_be_noul_choice_or_score() -> None:
    kind = typed_kind(questions={"actionable": {"type": "boolean", "instructions": "?"}})
    message = error_of({"k": kind})
    assert message.startswith("kinds.k.questions.actionable.type: ")
    assert "noul, choice or score" in message


def test_question_id_characters() -> None:
    kind = typed_kind(questions={"1st": NOUL}, answer="1st")
    assert error_of({"k": kind}).startswith("kinds.k.questions.1st: ")


def test_noul_needs_instructions_or_described_outcome() -> None:
    kind = typed_kind(questions={"actionable": {"type": "noul"}})
    assert error_of({"k": kind}).startswith("kinds.k.questions.actionable.instructions: ")
    described = typed_kind(
        questions={"actionable": {"type": "noul", "criteria": {"true": "asks for a change"}}}
    )
    assert config_of({"k": described}).kinds["k"].questions["actionable"].type == "noul"


def test_noul_criteria_only_true_and_false() -> None:
    kind = typed_kind(questions={"actionable": {**NOUL, "criteria": {"true": "x", "maybe": "y"}}})
    assert error_of({"k": kind}).startswith("kinds.k.questions.actionable.criteria: ")


def choice_kind(options: int) -> dict[str, Any]:
    criteria = {f"label{i}": f"option {i}" for i in range(options)}
    return typed_kind(
        questions={"pick": {"type": "choice", "instructions": "?", "criteria": criteria}}, answer="pick"
    )


def test_choice_allows_255_options_and_no_more() -> None:
    assert len(config_of({"k": choice_kind(255)}).kinds["k"].questions["pick"].criteria) == 255
    message = error_of({"k": choice_kind(256)})
    assert message.startswith("kinds.k.questions.pick.criteria: ")
    assert "255" in message


def test_choice_needs_options() -> None:
    assert error_of({"k": choice_kind(0)}).startswith("kinds.k.questions.pick.criteria: ")


@pytest.mark.parametrize("levels", [2, 10])
def test_score_allows_2_to_10_levels(levels: int) -> None:
    kind = typed_kind(
        questions={"s": {"type": "score", "instructions": "?", "criteria": [f"l{i}" for i in range(levels)]}},
        answer="s",
    )
    assert len(config_of({"k": kind}).kinds["k"].questions["s"].criteria) == levels


@pytest.mark.parametrize("criteria", [["only"], [f"l{i}" for i in range(11)], {"a": 1, "b": 2}, None])
def test_score_outside_2_to_10_levels(criteria: Any) -> None:
    kind = typed_kind(
        questions={"s": {"type": "score", "instructions": "?", "criteria": criteria}}, answer="s"
    )
    message = error_of({"k": kind})
    assert message.startswith("kinds.k.questions.s.criteria: ")
    assert "2 to 10" in message


def test_answer_naming_no_question() -> None:
    message = error_of({"k": typed_kind(answer="actionabel")})
    assert message.startswith("kinds.k.answer: names no question")


def test_answer_required_with_questions_unless_ordering_only() -> None:
    kind = {"questions": {"actionable": NOUL}, "escalate": "needs-triage"}
    assert error_of({"k": kind}).startswith("kinds.k.answer: required")
    ordering_only = {"questions": {"severity": SCORE}, "order": "severity", "session": SESSION}
    assert config_of({"k": ordering_only}).kinds["k"].answer is None


@pytest.mark.parametrize(
    ("gate_on", "fragment"),
    [(["actionable", "nope"], "'nope' names no question"), ([], "non-empty list"), ("actionable", "list")],
)
def test_gate_on_must_name_questions(gate_on: Any, fragment: str) -> None:
    message = error_of({"k": typed_kind(gateOn=gate_on)})
    assert message.startswith("kinds.k.gateOn: ")
    assert fragment in message


def test_gate_defaults_to_the_answer_question() -> None:
    config = config_of(
        {
            "plain": typed_kind(),
            "gated": typed_kind(questions={"actionable": NOUL, "severity": SCORE}, gateOn=["severity"]),
        }
    )
    assert config.kinds["plain"].gate_questions == ("actionable",)
    assert config.kinds["gated"].gate_questions == ("severity",)


def test_order_rules() -> None:
    base = {
        "questions": {"actionable": NOUL, "severity": SCORE},
        "answer": "actionable",
        "escalate": "needs-triage",
    }
    assert config_of({"k": {**base, "order": "severity"}}).kinds["k"].order == "severity"
    assert error_of({"k": {**base, "order": "nope"}}).startswith("kinds.k.order: 'nope' names no question")
    assert error_of({"k": {**base, "order": "actionable"}}).startswith("kinds.k.order: must name a score")
    choice = {"type": "choice", "instructions": "?", "criteria": {"low": "l", "high": "h"}}
    plain_choice = {**base, "questions": {"actionable": NOUL, "tier": choice}, "order": "tier"}
    assert error_of({"k": plain_choice}).startswith("kinds.k.order: must name a score")
    ranked = {
        **base,
        "questions": {"actionable": NOUL, "tier": {**choice, "priority": {"low": 1, "high": 5}}},
    }
    kind = config_of({"k": {**ranked, "order": "tier"}}).kinds["k"]
    assert kind.questions["tier"].priority == {"low": 1.0, "high": 5.0}


@pytest.mark.parametrize(
    ("question", "field"),
    [
        ({**SCORE, "priority": {"today": 1}}, "kinds.k.questions.q.priority"),
        (
            {"type": "choice", "instructions": "?", "criteria": {"a": "x"}, "priority": {"b": 1}},
            "kinds.k.questions.q.priority.b",
        ),
        (
            {"type": "choice", "instructions": "?", "criteria": {"a": "x"}, "priority": {"a": "high"}},
            "kinds.k.questions.q.priority.a",
        ),
        (
            {"type": "choice", "instructions": "?", "criteria": {"a": "x"}, "priority": {"a": True}},
            "kinds.k.questions.q.priority.a",
        ),
    ],
)
def test_priority_map_rules(question: dict[str, Any], field: str) -> None:
    kind = typed_kind(questions={"q": question}, answer="q")
    assert error_of({"k": kind}).startswith(f"{field}: ")


# --- the session tier --------------------------------------------------------------------------------


def test_unknown_prompt_placeholder() -> None:
    message = error_of({"k": {"session": {"prompt": "Decide {{ target }} for {{ owner }}"}}})
    assert message.startswith("kinds.k.session.prompt: unknown placeholder")
    assert "owner" in message


def test_known_placeholders_and_literal_braces() -> None:
    prompt = "{{target}} {{ item }} {{ state }} {{ context }} and {literal} braces"
    assert config_of({"k": {"session": {"prompt": prompt}}}).kinds["k"].session is not None


def test_escalate_session_needs_a_session_block() -> None:
    message = error_of({"k": typed_kind(escalate="session")})
    assert message.startswith("kinds.k.escalate: ")
    assert "session block" in message


def test_escalate_must_be_session_or_needs_triage() -> None:
    assert error_of({"k": typed_kind(escalate="human")}).startswith("kinds.k.escalate: ")


def test_escalate_defaults_to_session_when_there_is_one() -> None:
    kind = {"questions": {"actionable": NOUL}, "answer": "actionable", "session": SESSION}
    assert config_of({"k": kind}).kinds["k"].escalate == "session"


@pytest.mark.parametrize(
    ("session", "field"),
    [
        ({"prompt": ""}, "kinds.k.session.prompt"),
        ({"args": ["--x"]}, "kinds.k.session.prompt"),
        ({**SESSION, "args": "--permission-mode plan"}, "kinds.k.session.args"),
        ({**SESSION, "format": "yaml"}, "kinds.k.session.format"),
        ({**SESSION, "model": 4}, "kinds.k.session.model"),
        ("just a prompt", "kinds.k.session"),
    ],
)
def test_session_block_rules(session: Any, field: str) -> None:
    assert error_of({"k": {"session": session}}).startswith(f"{field}: ")


def test_session_model_is_passed_as_an_argument() -> None:
    kind = config_of({"k": {"session": {**SESSION, "model": "opus"}}}).kinds["k"]
    assert kind.session is not None
    assert kind.session.model == "opus" and kind.session.args[-2:] == ("--model", "opus")


# --- the kind's digest (part of the content key) ---------------------------------------------------


def test_digest_changes_with_any_edit_of_the_kind_and_only_that_kind() -> None:
    before = config_of({"a": typed_kind(), "b": typed_kind()})
    edited = config_of(
        {"a": typed_kind(questions={"actionable": {**NOUL, "instructions": "Reworded?"}}), "b": typed_kind()}
    )
    assert before.kinds["a"].digest != edited.kinds["a"].digest
    assert before.kinds["b"].digest == edited.kinds["b"].digest


def test_digest_ignores_key_order() -> None:
    one = config_of({"a": {"questions": {"q": NOUL}, "answer": "q", "escalate": "needs-triage"}})
    two = config_of({"a": {"escalate": "needs-triage", "answer": "q", "questions": {"q": NOUL}}})
    assert one.kinds["a"].digest == two.kinds["a"].digest


def test_unknown_kind_lookup_lists_the_known_ones() -> None:
    config = config_of({"b": typed_kind(), "a": typed_kind()})
    with pytest.raises(ConfigError, match=r"unknown kind 'zzz' \(known: a, b\)"):
        config.kind("zzz")


# --- a kind's `env:` (what its produce/verify commands receive) -----------------------------------
PV: dict[str, Any] = {"produce": [["true"]], "verify": [["true"]]}


def test_env_takes_exact_names_and_globs_and_defaults_to_none() -> None:
    assert config_of({"k": PV}).kinds["k"].env == ()
    kind = config_of({"k": {**PV, "env": ["GOPATH", "CARGO_*", "GO?LAGS", "_X"]}}).kinds["k"]
    assert kind.env == ("GOPATH", "CARGO_*", "GO?LAGS", "_X")


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ("GOPATH", "kinds.k.env: must be a list"),
        ({"GOPATH": 1}, "kinds.k.env: must be a list"),
        (["GO PATH"], "kinds.k.env[0]: 'GO PATH' is not a variable name or glob"),
        (["", "X"], "kinds.k.env[0]: '' is not a variable name or glob"),
        (["OK", 3], "kinds.k.env[1]: 3 is not a variable name or glob"),
        (["1ABC"], "kinds.k.env[0]: '1ABC' is not a variable name"),
        (["CARGO-HOME"], "kinds.k.env[0]"),
        (["NPM_TOKEN"], "kinds.k.env[0]: NPM_TOKEN looks like a credential"),
        (["GH_PAT"], "kinds.k.env[0]: GH_PAT looks like a credential"),
        (["githubToken"], "kinds.k.env[0]: githubToken looks like a credential"),
    ],
)
def test_a_bad_env_entry_is_a_config_error_naming_the_field(env: Any, fragment: str) -> None:
    assert fragment in error_of({"k": {**PV, "env": env}})


def test_env_is_part_of_the_kind_s_digest() -> None:
    plain = config_of({"k": PV}).kinds["k"]
    with_env = config_of({"k": {**PV, "env": ["GOPATH"]}}).kinds["k"]
    assert plain.digest != with_env.digest


# --- `session.bind` (extra paths the kind's confined session sees) ---------------------------------
def test_session_bind_keeps_absolute_paths_with_their_mode_as_written() -> None:
    kind = config_of(
        {"k": {"session": {**SESSION, "bind": ["/opt/tool", "/srv/data:rw", "/etc/x:ro"]}}}
    ).kinds["k"]
    assert kind.session is not None
    assert kind.session.bind == ("/opt/tool", "/srv/data:rw", "/etc/x:ro")
    plain = config_of({"k": {"session": SESSION}}).kinds["k"]
    assert plain.session is not None and plain.session.bind == ()
    assert plain.digest != kind.digest


@pytest.mark.parametrize(
    ("bind", "fragment"),
    [
        ("/opt/tool", "kinds.k.session.bind: must be a list of absolute paths"),
        (["opt/tool"], "kinds.k.session.bind[0]: 'opt/tool' is not an absolute path"),
        (["./tool:rw"], "kinds.k.session.bind[0]: './tool:rw' is not an absolute path"),
        (["~/tool"], "kinds.k.session.bind[0]: '~/tool' is not an absolute path"),
        (["/ok", ""], "kinds.k.session.bind[1]: must be an absolute path"),
        (["/ok", 7], "kinds.k.session.bind[1]: must be an absolute path"),
        (["/srv/data:rx"], "kinds.k.session.bind[0]: '/srv/data:rx': the only suffixes are :ro and :rw"),
        (["/srv/data:RW"], "kinds.k.session.bind[0]: '/srv/data:RW': the only suffixes are :ro and :rw"),
        (["/a:b:rw"], "kinds.k.session.bind[0]: '/a:b:rw': the only suffixes are :ro and :rw"),
        (["/srv/../etc"], "kinds.k.session.bind[0]: '/srv/../etc': no '..'"),
    ],
)
def test_a_bad_bind_is_a_config_error_naming_the_field(bind: Any, fragment: str) -> None:
    assert fragment in error_of({"k": {"session": {**SESSION, "bind": bind}}})


# --- which file, said once; the executor's repository allowlist (issue 22) -----------------------


def test_the_start_line_names_the_loaded_file_or_says_there_is_none(tmp_path: Path) -> None:
    path = write_config(tmp_path / "named.yaml", "kinds: {}\n")
    assert config_source(path) == f"config: loaded {path.resolve()}"
    missing = tmp_path / "nowhere" / "dispatchq.yaml"
    assert config_source(missing) == (
        f"config: none loaded (no file at {missing}; set DISPATCHQ_CONFIG to name one)"
    )


def _triage_yaml(executor: str, repositories: str | None) -> str:
    listed = f"  repositories: {repositories}\n" if repositories is not None else ""
    return f"kinds: {{}}\ntriage:\n  executor: {executor}\n{listed}"


def test_a_github_executor_without_an_allowlist_warns_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dispatchq.config")
    open_ = load_config(write_config(tmp_path / "open.yaml", _triage_yaml("github", None)))
    assert open_.triage.repositories is None
    listed = load_config(write_config(tmp_path / "listed.yaml", _triage_yaml("github", "[Acme/Widgets]")))
    assert listed.triage.repositories == frozenset({"acme/widgets"})
    load_config(write_config(tmp_path / "rec.yaml", _triage_yaml("recording", None)))
    load_config(tmp_path / "open.yaml")  # reloaded: warned once
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "open.yaml: triage.repositories is not set" in warnings[0]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("acme/widgets", "triage.repositories: expected a list of owner/name"),
        ("[acme]", "triage.repositories[0]: 'acme' is not owner/name"),
        ("[acme/ok, 'a/b/c']", "triage.repositories[1]: 'a/b/c' is not owner/name"),
        ("[3]", "triage.repositories[0]: expected owner/name"),
    ],
)
def test_a_bad_allowlist_is_a_config_error_naming_the_entry(
    tmp_path: Path, value: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path / "bad.yaml", _triage_yaml("recording", value)))
    assert fragment in str(caught.value)


def test_the_allowlist_refuses_other_repositories_before_the_executor_acts() -> None:
    storage = TriageStorage(fakeredis.FakeRedis())
    gated = build_executor("recording", storage, repositories=["Acme/Widgets"])
    assert isinstance(gated, RepositoryGate) and gated.name == "recording"
    label = Command("label.add", label="triaged")
    refused = gated.perform(label, "evil/elsewhere#3")
    assert (refused.status, refused.detail) == ("refused", "evil/elsewhere is not in triage.repositories")
    assert gated.remove_label("evil/elsewhere#3", "triaged").status == "refused"
    assert gated.perform(label, "not-a-target").status == "refused"
    assert RecordingExecutor(storage).recorded() == []  # nothing was written for them
    assert gated.perform(label, "acme/widgets#3").status == "performed"
    assert [w["target"] for w in RecordingExecutor(storage).recorded()] == ["acme/widgets#3"]
    assert not isinstance(build_executor("recording", storage), RepositoryGate)  # no key: any


@pytest.mark.parametrize("url", ["http://api.github.example", "http://10.1.2.3/api/v3", "ftp://x.example"])
def test_the_github_executor_refuses_plain_http_beyond_loopback(url: str) -> None:
    storage = TriageStorage(fakeredis.FakeRedis())
    with pytest.raises(UserError) as caught:
        build_executor("github", storage, github_token="t", github_api_url=url)
    assert str(caught.value).startswith("DISPATCHQ_GITHUB_API_URL: must be")
    assert (
        build_executor("github", storage, github_token="t", github_api_url="http://127.0.0.1:9/").name
        == "github"
    )
