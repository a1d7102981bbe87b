"""The `triage` section's model: validated once, every mistake at once, in the engine's words.

`tests/unit/test_rules.py` pins the wording of each single mistake through `load_triage`;
this file holds what the model adds: several mistakes reported together, a question's type
tag stepped over in a path, an op's parameters, the section the config file holds being the
engine's own class, and the shared pieces in `dispatchq.core.fields`.
"""

from __future__ import annotations

import ast
import copy
import inspect
from typing import Any

import pytest

from dispatchq.config import ConfigFile, parse_config
from dispatchq.core.fields import field_at, untagged
from dispatchq.errors import ConfigError
from dispatchq.triage import rules, schema

SECTION: dict[str, Any] = {
    "questions": {
        "needs_repro": {"type": "noul", "instructions": "Does it lack steps to reproduce?"},
        "area": {"type": "choice", "criteria": {"bug": None, "docs": None}},
    },
    "rules": [
        {
            "id": "needs-repro",
            "events": ["issues.opened"],
            "if": "needs_repro > 0.5",
            "actions": [
                {"op": "label.add", "label": "needs-repro"},
                {"op": "close", "reason": "not_planned"},
            ],
        }
    ],
}


def problems(section: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        rules.load_triage(section)
    return caught.value.problems


def test_every_mistake_is_one_line_and_all_are_reported_together() -> None:
    section = copy.deepcopy(SECTION)
    section["mode"] = "yolo"
    section["budget"] = {"window": 0}
    section["rules"][0]["events"] = ["Issues Opened"]
    assert problems(section) == [
        "triage.mode: expected one of shadow, suggest, auto, got 'yolo'",
        "triage.budget.window: expected a whole number of seconds >= 1, got 0",
        "triage.rules[needs-repro].events[0]: 'Issues Opened' is not an '<event>.<action>' name",
    ]


@pytest.mark.parametrize(
    ("question", "line"),
    [
        ({"type": "maybe"}, "triage.questions.q.type: expected one of noul, choice, score, got 'maybe'"),
        ({"instructions": "?"}, "triage.questions.q.type: required"),
        (
            {"type": "score", "criteria": [], "why": 1},
            "triage.questions.q: unknown key 'why'; allowed: type, instructions, criteria, events",
        ),
        ({"type": "noul"}, "triage.questions.q: a noul needs instructions or criteria"),
    ],
)
def test_a_question_s_type_tag_is_no_part_of_its_path(question: dict[str, Any], line: str) -> None:
    assert line in problems({"questions": {"q": question}})


@pytest.mark.parametrize(
    ("action", "line"),
    [
        ({"op": "label.add"}, "triage.rules[r].actions[0]: label.add needs 'label'"),
        (
            {"op": "close", "label": "x"},
            "triage.rules[r].actions[0]: close takes no 'label' (it takes: reason)",
        ),
        (
            {"op": "close", "reason": "bored"},
            "triage.rules[r].actions[0].reason: expected one of completed, not_planned",
        ),
        ({"op": "label.add", "label": "x" * 51}, "triage.rules[r].actions[0].label: expected a label name"),
        (
            {"op": "assign", "assignees": ["-bad"]},
            "triage.rules[r].actions[0].assignees[0]: '-bad' is not a GitHub",
        ),
    ],
)
def test_an_action_takes_the_parameters_of_its_op(action: dict[str, Any], line: str) -> None:
    (found,) = problems({"rules": [{"id": "r", "events": ["issues.opened"], "actions": [action]}]})
    assert found.startswith(line)


def test_the_engine_s_config_is_built_from_the_validated_model() -> None:
    model = schema.validate_triage(copy.deepcopy(SECTION))
    built = rules.triage_config(model)
    loaded = rules.load_triage(copy.deepcopy(SECTION))
    assert (built.hash, built.questions, built.mode) == (loaded.hash, loaded.questions, loaded.mode)
    (rule,) = built.rules
    assert rule.refs == {"needs_repro"} and rule.condition is model.rules[0].condition  # parsed once
    assert [a.to_json() for a in rule.actions] == SECTION["rules"][0]["actions"]
    assert model.section == SECTION and built.section == SECTION


def test_the_rules_module_checks_nothing_by_hand() -> None:
    """Keys, types and names are the model's: the loader raises no ConfigError of its own."""
    tree = ast.parse(inspect.getsource(rules))
    raised = {ast.unparse(node.exc) for node in ast.walk(tree) if isinstance(node, ast.Raise) and node.exc}
    assert not [text for text in raised if "ConfigError" in text]


def test_the_config_file_holds_the_engine_s_own_section_class() -> None:
    assert schema.TriageSection in ConfigFile.model_fields["triage"].annotation.__args__
    config = parse_config({"triage": copy.deepcopy(SECTION)})
    assert isinstance(config.triage, rules.TriageConfig)
    assert config.triage.hash == rules.load_triage(copy.deepcopy(SECTION)).hash


def test_a_union_s_tag_picks_the_section_and_is_no_key_of_the_file() -> None:
    loc = ("kinds", "k", "questions", "q", "choice", "criteria")
    assert untagged(ConfigFile, loc) == ("kinds", "k", "questions", "q", "criteria")
    _, field = field_at(ConfigFile, loc)
    assert field.description == "a mapping of 1 to 255 options"
    _, score = field_at(ConfigFile, ("kinds", "k", "questions", "q", "score", "criteria"))
    assert score.description == "a list of 2 to 10 levels"


def test_a_kind_s_question_names_its_type_when_the_type_is_unknown() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"kinds": {"k": {"questions": {"q": {"type": "maybe"}}, "answer": "q"}}})
    assert caught.value.problems == ["kinds.k.questions.q.type: must be noul, choice or score (got 'maybe')"]


@pytest.mark.parametrize(
    ("rule", "line"),
    [
        ({"if": None}, "triage.rules[r].if: expected a CEL expression over the answers, got None"),
        ({"gateOn": None}, "triage.rules[r].gateOn: expected a non-empty list of question ids"),
        ({"state": None}, "triage.rules[r].state: expected a non-empty list of dotted paths"),
        (
            {"actions": [{"op": "lock", "reason": None}]},
            "triage.rules[r].actions[0].reason: expected a reason",
        ),
    ],
)
def test_an_optional_key_written_as_null_is_a_mistake(rule: dict[str, Any], line: str) -> None:
    base = {"id": "r", "events": ["issues.opened"], "actions": [{"op": "reopen"}]}
    (found,) = problems({"rules": [{**base, **rule}]})
    assert found.startswith(line)
