"""The config file's pydantic model: one line per mistake with its full path, and its schema.

The wording of each mistake is `tests/unit/test_config.py`'s; this file holds what the
model adds: several mistakes at once, the paths of items and mapping keys, the allowed
keys of an unknown one, reserved names, and a schema that says what the model says.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dispatchq.config import ConfigFile, config_schema, parse_config
from dispatchq.config.messages import problems_of
from dispatchq.core.kinds import Kind
from dispatchq.errors import ConfigError
from dispatchq.triage import rules
from dispatchq.triage import schema as triage_schema

SESSION = {"prompt": "Decide {{ target }}"}


def problems(document: Any, **kwargs: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(document, **kwargs)
    assert str(caught.value) == "\n".join(caught.value.problems)
    return caught.value.problems


def test_several_mistakes_are_reported_together_one_line_each() -> None:
    found = problems(
        {
            "kinds": {
                "a": {"effect": "global", "session": SESSION},
                "b": {"session": {"prompt": "x", "format": "yaml", "args": "--x"}},
                "c": {"produce": [["make"]]},
            },
            "extra": 1,
        }
    )
    assert found == [
        "kinds.a.effect: must be local or external (got 'global')",
        "kinds.b.session.args: must be a list of strings (got '--x')",
        "kinds.b.session.format: must be text or json (got 'yaml')",
        "kinds.c.verify: produce and verify go together (the verifier judges what was produced)",
        "extra: unknown top-level key (allowed: credentials, kinds, triage)",
    ]


def test_an_unknown_key_names_the_keys_allowed_there() -> None:
    (line,) = problems({"kinds": {"k": {"session": SESSION, "escalte": "session"}}})
    assert line == (
        "kinds.k.escalte: unknown key (allowed: answer, check, effect, env, escalate, gateOn, "
        "order, priority, produce, questions, session, verify)"
    )
    (deep,) = problems(
        {"kinds": {"k": {"questions": {"q": {"type": "noul", "instructions": "?", "why": 1}}, "answer": "q"}}}
    )
    assert deep.startswith("kinds.k.questions.q.why: unknown key (allowed: criteria, instructions, ")


def test_a_kind_named_like_a_field_is_still_a_kind() -> None:
    """`check` is a kind's field and may also be a kind's name: the path walk keeps them apart."""
    (line,) = problems({"kinds": {"check": {"session": SESSION, "typo": 1}}})
    assert line.startswith("kinds.check.typo: unknown key (allowed: answer, check, ")


def test_items_are_named_by_index_and_mapping_keys_by_name() -> None:
    (line,) = problems({"kinds": {"k": {"session": {**SESSION, "bind": ["/ok", "relative"]}}}})
    assert line.startswith("kinds.k.session.bind[1]: 'relative' is not an absolute path")
    (key,) = problems({"kinds": {"k": {"questions": {"9lives": {"type": "noul", "instructions": "?"}}}}})
    assert key.startswith("kinds.k.questions.9lives: '9lives' is not a question id")


def test_a_type_mistake_says_what_the_field_takes() -> None:
    (line,) = problems({"kinds": {"k": {"session": {**SESSION, "model": 4}}}})
    assert line == "kinds.k.session.model: must be a model name (got 4)"
    (listed,) = problems({"kinds": {"k": {"check": "m:f", "env": "GOPATH"}}}, import_checks=False)
    assert listed == (
        "kinds.k.env: must be a list of variable names or globs, e.g. [GOPATH, CARGO_*] (got 'GOPATH')"
    )


def test_a_missing_field_is_field_required() -> None:
    assert problems({"kinds": {"k": {"session": {"args": []}}}}) == ["kinds.k.session.prompt: field required"]


def test_values_are_taken_as_written_never_coerced() -> None:
    """No YAML 1.1 booleans, no number that is really text: strict types, as the hand checks were."""
    (line,) = problems({"kinds": {"k": {"session": {**SESSION, "args": [1]}}}})
    assert line.startswith("kinds.k.session.args[0]: must be text (got 1)")
    choice = {"type": "choice", "instructions": "?", "criteria": {"a": "x"}, "priority": {"a": True}}
    (flag,) = problems({"kinds": {"k": {"questions": {"q": choice}, "answer": "q"}}})
    assert flag.startswith("kinds.k.questions.q.priority.a: ")
    ranked = {**choice, "priority": {"a": 2}}
    question = parse_config({"kinds": {"k": {"questions": {"q": ranked}, "answer": "q"}}}).kinds["k"]
    assert question.questions["q"].priority == {"a": 2.0}


def test_every_kind_without_a_tier_is_named_once_the_kinds_are_otherwise_valid() -> None:
    assert problems({"kinds": {"a": {"effect": "local"}, "b": {}, "c": {"session": SESSION}}}) == [
        "kinds.a: declares no tier (give a check, produce/verify, questions or a session)",
        "kinds.b: declares no tier (give a check, produce/verify, questions or a session)",
    ]


def test_a_built_in_kind_s_name_is_reserved() -> None:
    builtin = {"findings-gate": Kind(name="findings-gate")}
    (line,) = problems({"kinds": {"findings-gate": {"session": SESSION}}}, builtin=builtin)
    assert line.startswith("kinds.findings-gate: the name is reserved for dispatchq's built-in")
    config = parse_config({"kinds": {"mine": {"session": SESSION}}}, builtin=builtin)
    assert list(config.kinds) == ["mine"] and "findings-gate" in config.kinds


def test_the_rules_engine_names_its_own_mistakes_in_its_own_words() -> None:
    section = {"rules": [{"id": "r", "events": ["Issues Opened"], "actions": [{"op": "close"}]}]}
    assert problems({"triage": section}) == [
        "triage.rules[r].events[0]: 'Issues Opened' is not an '<event>.<action>' name"
    ]


@pytest.mark.parametrize(
    ("condition", "refused"),
    [
        ('event.title.matches("^v[0-9]+$")', False),
        ('matches(event.title, r"\\d+")', False),
        ('event.title.matches("^v[0-9")', True),
        ('matches(event.title, "a(")', True),
    ],
)
def test_a_rule_s_regex_is_checked_at_load(condition: str, refused: bool) -> None:
    rule = {"id": "r", "events": ["issues.opened"], "if": condition, "actions": [{"op": "close"}]}
    document = {"triage": {"rules": [rule]}}
    if refused:
        (line,) = problems(document)
        assert line.startswith("triage.rules[r].if: matches(") and "not a regular expression" in line
    else:
        assert parse_config(document).triage.rules[0].id == "r"


# --- the schema --------------------------------------------------------------------------------


def test_every_section_of_the_schema_refuses_unknown_keys() -> None:
    schema = config_schema()
    assert schema["additionalProperties"] is False
    assert schema["$defs"]
    for name, section in schema["$defs"].items():
        assert section.get("additionalProperties") is False, name
    assert set(schema["properties"]) == set(ConfigFile.model_fields) == {"credentials", "kinds", "triage"}


def test_the_schema_s_key_names_are_the_file_s() -> None:
    kind = config_schema()["$defs"]["KindSection"]["properties"]
    assert "gateOn" in kind and "gate_on" not in kind
    rule = config_schema()["$defs"]["RuleSection"]["properties"]
    assert "if" in rule and "if_" not in rule


@pytest.mark.parametrize(
    ("ours", "engine"),
    [
        ("RuleId", rules.RULE_ID),
        ("EventName", rules.EVENT_NAME),
        ("StatePath", rules.STATE_PATH),
        ("GithubLogin", rules.GITHUB_LOGIN),
    ],
)
def test_the_schema_s_triage_patterns_are_the_engine_s(ours: str, engine: Any) -> None:
    """The section's model holds the engine's patterns (the CEL parser stays lazy)."""
    pattern = getattr(triage_schema, ours).__metadata__[1].json_schema["pattern"]
    assert pattern == engine.pattern


def test_the_schema_s_enums_are_the_engine_s() -> None:
    triage = config_schema()["$defs"]["TriageSection"]["properties"]
    assert tuple(triage["mode"]["enum"]) == rules.MODES
    assert tuple(triage["executor"]["enum"]) == rules.EXECUTORS
    action = config_schema()["$defs"]["ActionSection"]["properties"]
    assert tuple(action["op"]["enum"]) == rules.KNOWN_OPS


@pytest.mark.parametrize(
    ("question", "valid"),
    [
        ({"type": "choice", "instructions": "?", "criteria": {"a": None}}, True),
        ({"type": "score", "instructions": "?", "criteria": ["low", "high"]}, True),
        ({"type": "noul", "criteria": {"true": "asks for a change"}}, True),
        ({"type": "score", "instructions": "?", "criteria": ["only"]}, False),
        ({"type": "choice", "instructions": "?", "criteria": ["a", "b"]}, False),
        ({"type": "noul", "instructions": "?", "criteria": {"maybe": "x"}}, False),
    ],
)
def test_the_schema_knows_each_answer_type_s_criteria(question: dict[str, Any], valid: bool) -> None:
    """What an editor underlines agrees with what loading says, for the criteria of each type."""
    document = {"kinds": {"k": {"questions": {"q": question}, "answer": "q", "escalate": "needs-triage"}}}
    errors = list(jsonschema.Draft202012Validator(config_schema()).iter_errors(document))
    assert (errors == []) is valid, errors
    if valid:
        parse_config(document)
    else:
        problems(document)


def test_a_new_section_is_one_class_and_one_field() -> None:
    """How the next section is added: its class, and a field on the file's model."""

    class Vault(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        variable: str = Field(description="an environment variable name")
        rotate: int = 0

    class WithVault(ConfigFile):
        vault: dict[str, Vault] | None = None

    document = {"kinds": {}, "vault": {"main": {"variable": 7, "rotat": 1}}}
    with pytest.raises(ValidationError) as caught:
        WithVault.model_validate(document)
    assert problems_of(caught.value, WithVault) == [
        "vault.main.variable: must be an environment variable name (got 7)",
        "vault.main.rotat: unknown key (allowed: rotate, variable)",
    ]
    assert "vault" in WithVault.model_json_schema()["properties"]
