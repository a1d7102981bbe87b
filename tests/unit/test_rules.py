"""The rules engine: config loading, CEL, the 12-row table and its order, and the engine.

The table tests call `resolve` directly (pure); the engine tests run `triage()` over
fakeredis with a counting `ask`, so "zero provider requests" is a count, not a hope.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from dispatchq.core.answers import Answer
from dispatchq.core.judgement import canonical_json, sha256_hex
from dispatchq.errors import ConfigError, UserError
from dispatchq.storage.triage import TriageStorage
from dispatchq.triage.cel import Condition
from dispatchq.triage.engine import (
    AskResult,
    BudgetLimit,
    RollingBudget,
    RunBudget,
    TriageStore,
    answers_file_ask,
    budget_for,
    keyless_ask,
    replay,
    status_section,
    triage,
)
from dispatchq.triage.executors import GitHubExecutor, Ledger, RecordingExecutor
from dispatchq.triage.rules import ActionSpec, Event, TriageConfig, decision_key, load_triage
from dispatchq.triage.table import Entry, Knowledge, Resolution, lint, questions_to_ask, resolve

GITHUB_OPS = frozenset({"label.add", "label.remove", "comment", "close", "reopen", "assign"})


# --------------------------------------------------------------------------------- helpers


def noul(p: float) -> dict[str, Any]:
    return {"type": "noul", "noul": p}


AREAS = ("bug", "feature", "docs")


def choice(label: str, confidence: float) -> dict[str, Any]:
    """A well-formed choice over the `area` criteria: the rest of the probability spread evenly."""
    others = [a for a in AREAS if a != label]
    probabilities = {label: confidence, **{a: (1 - confidence) / len(others) for a in others}}
    return {"type": "choice", "choice": label, "confidence": confidence, "probabilities": probabilities}


def score(level: float, confidence: float) -> dict[str, Any]:
    return {"type": "score", "score": level, "confidence": confidence}


def answers_of(wire: dict[str, dict[str, Any]]) -> dict[str, Answer]:
    return {q: Answer.from_wire(q, w) for q, w in wire.items()}


def section(rules: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "mode": "auto",
        "gate": {"suggest": 0.6, "auto": 0.85},
        "allowDestructive": [],
        "executor": "github",
        "templates": {"repro": "templates/repro.md"},
        "questions": {
            "needs_repro": {"type": "noul", "instructions": "Does the issue lack steps to reproduce?"},
            "area": {
                "type": "choice",
                "criteria": {"bug": None, "feature": None, "docs": None},
                "events": ["issues.opened"],
            },
            "severity": {"type": "score", "criteria": ["none", "low", "high", "critical"]},
        },
        "rules": rules,
    }
    base.update(top)
    return base


def rule(**spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": "r", "events": ["issues.opened", "issues.edited"]}
    out.update(spec)
    out.setdefault("actions", [{"op": "label.add", "label": "x"}])
    return out


@dataclass
class Caps:
    ops: frozenset[str] = GITHUB_OPS

    def supports(self, op: str) -> bool:
        return op in self.ops


def run(
    rule_spec: dict[str, Any],
    *,
    answers: dict[str, dict[str, Any]] | None = None,
    unanswered: dict[str, str] | None = None,
    over_budget: tuple[str, ...] = (),
    event: str = "issues.opened",
    mode: str | None = None,
    ops: frozenset[str] = GITHUB_OPS,
    templates_exist: bool = True,
    **top: Any,
) -> Resolution:
    config = load_triage(section([rule_spec], **top), base_dir=Path("."))
    knowledge = Knowledge(answers_of(answers or {}), unanswered or {}, frozenset(over_budget))
    ev = Event(event, "acme/app#12", "issue:12", {"repo": "acme/app"}, {"title": "it crashes"})
    return resolve(
        config,
        ev,
        knowledge,
        executor=Caps(ops),
        mode=mode,  # type: ignore[arg-type]
        template_exists=lambda name: templates_exist,
    )


def outcome(resolution: Resolution) -> str | None:
    """What happened to the rule's (single) action: a reason code, 'error', or None (silent)."""
    assert len(resolution.entries) <= 1
    if resolution.errors:
        assert not resolution.entries
        return "error"
    return resolution.entries[0].reason if resolution.entries else None


HIGH = noul(0.99)  # confidence 0.98
LOW = noul(0.7)  # confidence 0.4
MID = noul(0.85)  # confidence 0.7: between the gates

# ------------------------------------------------------------------- every row, reached


ROWS: list[tuple[str, dict[str, Any], dict[str, Any], str | None]] = [
    (
        "1 disabled",
        rule(enabled=False, **{"if": "needs_repro > 0.5"}),
        {"answers": {"needs_repro": HIGH}},
        None,
    ),
    ("1 trigger", rule(events=["issues.closed"]), {}, None),
    ("1 if false", rule(**{"if": "needs_repro > 0.995"}), {"answers": {"needs_repro": HIGH}}, None),
    ("2 if throws", rule(**{"if": "area > 1"}), {"answers": {"area": choice("bug", 0.9)}}, "error"),
    ("2 not bool", rule(**{"if": "needs_repro"}), {"answers": {"needs_repro": HIGH}}, "error"),
    ("2 event field", rule(**{"if": "event.state.nope == 1"}), {}, "error"),
    ("3 budget", rule(**{"if": "needs_repro > 0.5"}), {"over_budget": ("needs_repro",)}, "budget_exhausted"),
    (
        "4 no answers",
        rule(**{"if": "needs_repro > 0.5"}),
        {"unanswered": {"needs_repro": "keyless"}},
        "no_answers",
    ),
    ("4 dropped", rule(**{"if": "needs_repro > 0.5"}), {}, "no_answers"),
    ("5 not asked", rule(**{"if": 'area == "bug"'}), {"event": "issues.edited"}, "unknown_question"),
    (
        "6 destructive",
        rule(actions=[{"op": "close"}]),
        {},
        "destructive_not_opted_in",
    ),
    (
        "7 unsupported",
        rule(actions=[{"op": "lock"}]),
        {"allowDestructive": ["lock"]},
        "unsupported_by_executor",
    ),
    (
        "8 missing template",
        rule(actions=[{"op": "comment", "template": "repro"}]),
        {"templates_exist": False},
        "missing_template",
    ),
    (
        "9 below suggest",
        rule(**{"if": "needs_repro > 0.5"}),
        {"answers": {"needs_repro": LOW}},
        "below_suggest_threshold",
    ),
    (
        "10 shadow",
        rule(**{"if": "needs_repro > 0.5"}),
        {"answers": {"needs_repro": HIGH}, "mode": "shadow"},
        "shadow_mode",
    ),
    (
        "11 suggest mode",
        rule(**{"if": "needs_repro > 0.5"}),
        {"answers": {"needs_repro": HIGH}, "mode": "suggest"},
        "suggest",
    ),
    ("11 below auto", rule(**{"if": "needs_repro > 0.5"}), {"answers": {"needs_repro": MID}}, "suggest"),
    ("12 apply", rule(**{"if": "needs_repro > 0.5"}), {"answers": {"needs_repro": HIGH}}, "apply"),
    ("12 unconditional", rule(), {}, "apply"),
]


@pytest.mark.parametrize(("name", "spec", "kwargs", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_every_row_is_reached(
    name: str, spec: dict[str, Any], kwargs: dict[str, Any], expected: str | None
) -> None:
    assert outcome(run(spec, **kwargs)) == expected


# -------------------------------------------------------- order: a case matching two rows


ORDER: list[tuple[str, dict[str, Any], dict[str, Any], str | None]] = [
    # 1 before 2: a disabled rule whose `if` would throw stays silent (not even logged).
    ("1<2", rule(enabled=False, **{"if": "area > 1"}), {"answers": {"area": choice("bug", 0.9)}}, None),
    # 2 before 3: the `if` throws on what it has; its gateOn answer was over budget.
    (
        "2<3",
        rule(gateOn=["needs_repro"], **{"if": "area > 1"}),
        {"answers": {"area": choice("bug", 0.9)}, "over_budget": ("needs_repro",)},
        "error",
    ),
    # 3 before 4: one answer over budget, another asked and empty.
    (
        "3<4",
        rule(**{"if": 'needs_repro > 0.5 && area == "bug"'}),
        {"over_budget": ("needs_repro",), "unanswered": {"area": "keyless"}},
        "budget_exhausted",
    ),
    # 4 before 5: one asked and empty, another not asked for this event.
    (
        "4<5",
        rule(**{"if": 'needs_repro > 0.5 && area == "bug"'}),
        {"unanswered": {"needs_repro": "provider error (TimeoutError)"}, "event": "issues.edited"},
        "no_answers",
    ),
    # 5 before 6: not asked for this event, and a destructive op not opted in.
    (
        "5<6",
        rule(actions=[{"op": "close"}], **{"if": 'area == "bug"'}),
        {"event": "issues.edited"},
        "unknown_question",
    ),
    # 6 before 7: lock is destructive and the github executor cannot lock.
    ("6<7", rule(actions=[{"op": "lock"}]), {}, "destructive_not_opted_in"),
    # 7 before 8: the executor cannot comment, and the template is missing.
    (
        "7<8",
        rule(actions=[{"op": "comment", "template": "repro"}]),
        {"ops": frozenset({"label.add"}), "templates_exist": False},
        "unsupported_by_executor",
    ),
    # 8 before 9: missing template, and the confidence is below the suggest gate.
    (
        "8<9",
        rule(actions=[{"op": "comment", "template": "repro"}], **{"if": "needs_repro > 0.5"}),
        {"answers": {"needs_repro": LOW}, "templates_exist": False},
        "missing_template",
    ),
    # 9 before 10: below the suggest gate in shadow mode.
    (
        "9<10",
        rule(**{"if": "needs_repro > 0.5"}),
        {"answers": {"needs_repro": LOW}, "mode": "shadow"},
        "below_suggest_threshold",
    ),
    # 10 before 11: shadow mode with a confidence only good enough to suggest.
    (
        "10<11",
        rule(**{"if": "needs_repro > 0.5"}),
        {"answers": {"needs_repro": MID}, "mode": "shadow"},
        "shadow_mode",
    ),
    # 11 before 12: suggest mode with a confidence that would apply in auto.
    (
        "11<12",
        rule(**{"if": "needs_repro > 0.5"}),
        {"answers": {"needs_repro": HIGH}, "mode": "suggest"},
        "suggest",
    ),
]


@pytest.mark.parametrize(("name", "spec", "kwargs", "expected"), ORDER, ids=[r[0] for r in ORDER])
def test_a_case_matching_two_rows_gets_the_earlier(
    name: str, spec: dict[str, Any], kwargs: dict[str, Any], expected: str | None
) -> None:
    assert outcome(run(spec, **kwargs)) == expected


def test_a_throwing_if_is_logged_and_the_run_continues(caplog: pytest.LogCaptureFixture) -> None:
    config = load_triage(
        section(
            [
                rule(id="broken", **{"if": "area > 1"}),
                rule(id="fine", **{"if": "needs_repro > 0.5"}),
            ]
        )
    )
    ev = Event("issues.opened", "acme/app#12")
    knowledge = Knowledge(answers_of({"area": choice("bug", 0.9), "needs_repro": HIGH}))
    with caplog.at_level(logging.WARNING, logger="dispatchq.triage.table"):
        resolution = resolve(config, ev, knowledge, executor=Caps())
    assert [e.rule for e in resolution.errors] == ["broken"]
    assert "TypeError" in resolution.errors[0].message
    assert [(e.rule, e.reason) for e in resolution.entries] == [("fine", "apply")]
    assert any("broken" in r.getMessage() for r in caplog.records)


def test_a_missing_answer_is_not_a_throw() -> None:
    # `area` is referenced but missing: undetermined, so rows 3-5 explain, not row 2.
    resolution = run(rule(**{"if": 'area == "bug"'}), unanswered={"area": "keyless"})
    assert not resolution.errors
    assert resolution.entries[0].reason == "no_answers"
    assert "keyless" in resolution.entries[0].explanation


# ---------------------------------------------------------------------------- confidence


def test_rule_confidence_is_the_minimum_never_the_average() -> None:
    # 0.98 and 0.3 average to 0.64, which would pass the 0.6 suggest gate.
    resolution = run(
        rule(gateOn=["needs_repro", "area"]),
        answers={"needs_repro": HIGH, "area": choice("bug", 0.3)},
    )
    entry = resolution.entries[0]
    assert entry.reason == "below_suggest_threshold"
    assert entry.confidence == pytest.approx(0.3)
    assert entry.question == "area"


def test_gate_on_takes_precedence_over_the_if_references() -> None:
    # The `if` reads area (confidence 0.3) but the rule gates on needs_repro (0.98).
    resolution = run(
        rule(gateOn=["needs_repro"], **{"if": 'area == "bug" && needs_repro > 0.5'}),
        answers={"needs_repro": HIGH, "area": choice("bug", 0.3)},
    )
    assert resolution.entries[0].reason == "apply"
    assert resolution.entries[0].confidence == pytest.approx(0.98)


def test_without_gate_on_the_if_references_gate() -> None:
    resolution = run(
        rule(**{"if": 'area == "bug" && needs_repro > 0.5'}),
        answers={"needs_repro": HIGH, "area": choice("bug", 0.7)},
    )
    assert resolution.entries[0].reason == "suggest"
    assert resolution.entries[0].confidence == pytest.approx(0.7)


def test_an_unconditional_rule_has_confidence_one() -> None:
    entry = run(rule()).entries[0]
    assert entry.confidence == 1.0
    assert entry.reason == "apply"


def test_reading_confidence_makes_a_dependency() -> None:
    spec = rule(**{"if": "confidence.area > 0.5"})
    assert outcome(run(spec, unanswered={"area": "keyless"})) == "no_answers"
    assert outcome(run(spec, answers={"area": choice("bug", 0.9)})) == "apply"
    assert outcome(run(spec, answers={"area": choice("bug", 0.4)})) is None


# ----------------------------------------------------------------- fractional scores, floats


def test_scores_are_compared_unrounded() -> None:
    # 1.6 sits between levels; rounding would make it 2 and match `>= 2`.
    answers = {"severity": score(1.6, 0.9)}
    assert outcome(run(rule(**{"if": "severity >= 2.0"}), answers=answers)) is None
    assert outcome(run(rule(**{"if": "severity > 1.5"}), answers=answers)) == "apply"
    assert outcome(run(rule(**{"if": "severity < 1.7"}), answers=answers)) == "apply"


def test_noul_binds_p_as_a_double_and_choice_the_label() -> None:
    answers = {"needs_repro": noul(0.93), "area": choice("docs", 0.9)}
    assert outcome(run(rule(**{"if": 'needs_repro == 0.93 && area == "docs"'}), answers=answers)) == "apply"
    assert outcome(run(rule(**{"if": 'area == "bug"'}), answers=answers)) is None


@pytest.mark.parametrize(
    ("p", "gates", "expected"),
    [
        (0.8, {"suggest": 0.6, "auto": 0.85}, "suggest"),  # |2*0.8-1| = 0.6000000000000001: meets 0.6
        (0.2, {"suggest": 0.6, "auto": 0.85}, "suggest"),  # the other tail: 0.6 too
        (0.79, {"suggest": 0.6, "auto": 0.85}, "below_suggest_threshold"),
        (0.16, {"suggest": 0.6, "auto": 0.68}, "apply"),  # |2*0.16-1| = 0.6799999999999999: meets 0.68
        (0.165, {"suggest": 0.6, "auto": 0.68}, "suggest"),  # 0.67
        (0.16, {"suggest": 0.68, "auto": 0.9}, "suggest"),  # the same float error at the suggest gate
        (0.84, {"suggest": 0.68, "auto": 0.9}, "suggest"),
        (0.925, {"suggest": 0.6, "auto": 0.85}, "apply"),  # 0.85 exactly, inclusive
    ],
)
def test_gate_boundaries_are_inclusive_and_float_robust(
    p: float, gates: dict[str, float], expected: str
) -> None:
    resolution = run(rule(gateOn=["needs_repro"]), answers={"needs_repro": noul(p)}, gate=gates)
    assert outcome(resolution) == expected


def test_boundary_margin_is_zero_not_a_rounding_error() -> None:
    entry = run(rule(gateOn=["needs_repro"]), answers={"needs_repro": noul(0.925)}).entries[0]
    assert entry.margin == 0.0
    assert entry.threshold == 0.85


# ------------------------------------------------------------------------------- loading


ISSUE_EXAMPLE: dict[str, Any] = {
    "mode": "shadow",
    "gate": {"suggest": 0.6, "auto": 0.85},
    "budget": {"requests": 100},
    "allowDestructive": ["close"],
    "executor": "github",
    "escalate": "needs-triage",
    "templates": {"repro": "templates/needs-repro.md"},
    "questions": {
        "needs_repro": {"type": "noul", "instructions": "Does the issue lack steps to reproduce?"},
        "area": {
            "type": "choice",
            "criteria": {"bug": None, "feature": None, "docs": None},
            "events": ["issues.opened"],
        },
    },
    "rules": [
        {
            "id": "needs-repro",
            "events": ["issues.opened"],
            "if": 'needs_repro >= 0.8 && area == "bug"',
            "gateOn": ["needs_repro"],
            "actions": [{"op": "label.add", "label": "needs-repro"}, {"op": "comment", "template": "repro"}],
        }
    ],
}


def test_the_issue_example_loads() -> None:
    config = load_triage(ISSUE_EXAMPLE, base_dir="/srv/repo")
    (only,) = config.rules
    assert only.dependencies == {"needs_repro", "area"}
    assert only.confidence_ids == ("needs_repro",)
    assert config.questions["area"].wire() == {
        "type": "choice",
        "criteria": {"bug": None, "feature": None, "docs": None},
    }
    assert config.template_path("repro") == Path("/srv/repo/templates/needs-repro.md")


def test_config_hash_leaves_out_mode_only() -> None:
    base = load_triage(ISSUE_EXAMPLE)
    other_mode = load_triage({**ISSUE_EXAMPLE, "mode": "auto"})
    moved_gate = load_triage({**ISSUE_EXAMPLE, "gate": {"suggest": 0.6, "auto": 0.9}})
    renamed = copy.deepcopy(ISSUE_EXAMPLE)
    renamed["rules"][0]["id"] = "repro-please"
    assert base.hash == other_mode.hash
    assert base.hash != moved_gate.hash
    assert base.hash != load_triage(renamed).hash


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.update(modes="auto"), "triage: unknown key 'modes'"),
        (lambda s: s["rules"][0].update(on=["issues.opened"]), "name events with 'events', not 'on'"),
        (lambda s: s["rules"][0].update({True: ["issues.opened"]}), "not 'on'"),
        (
            lambda s: s["rules"][0].update({"if": "needs_repro >= && 1"}),
            "triage.rules[needs-repro].if: does not parse",
        ),
        (
            lambda s: s["rules"][0].update({"if": "need_repro > 0.5"}),
            "triage.rules[needs-repro].if: 'need_repro'",
        ),
        (lambda s: s["rules"][0].update(gateOn=["nope"]), "triage.rules[needs-repro].gateOn[0]: 'nope'"),
        (lambda s: s["rules"][0].update(gateOn=[]), "triage.rules[needs-repro].gateOn"),
        (
            lambda s: s["rules"][0]["actions"].append({"op": "lable.add"}),
            "triage.rules[needs-repro].actions[2].op",
        ),
        (lambda s: s["rules"][0]["actions"].append({"op": "label.add"}), "label.add needs 'label'"),
        (lambda s: s["rules"][0]["actions"][0].update(colour="red"), "actions[0]: unknown key 'colour'"),
        (lambda s: s["rules"].append(dict(s["rules"][0])), "duplicate rule id 'needs-repro'"),
        (lambda s: s["rules"][0].update(events=["Issues Opened"]), "triage.rules[needs-repro].events[0]"),
        (lambda s: s.update(mode="yolo"), "triage.mode"),
        (lambda s: s.update(gate={"suggest": 0.9, "auto": 0.8}), "suggest (0.9) is above auto (0.8)"),
        (lambda s: s.update(gate={"suggest": 1.5}), "triage.gate.suggest"),
        (lambda s: s.update(budget={"requests": -1}), "triage.budget.requests"),
        (lambda s: s.update(executor="gitlab"), "triage.executor"),
        (lambda s: s.update(templates={"repro": "../../etc/passwd"}), "triage.templates.repro"),
        (lambda s: s["questions"].update(event={"type": "noul", "instructions": "x"}), "reserved"),
        (lambda s: s["questions"].update(bad={"type": "maybe"}), "triage.questions.bad.type"),
        (lambda s: s["questions"]["area"].update(criteria={}), "triage.questions.area.criteria"),
        (
            lambda s: s["questions"]["area"].update(events=["issues.Opened"]),
            "triage.questions.area.events[0]",
        ),
    ],
)
def test_load_errors_name_the_section_rule_and_field(mutate: Any, message: str) -> None:
    spec = copy.deepcopy(ISSUE_EXAMPLE)
    mutate(spec)
    with pytest.raises(ConfigError) as caught:
        load_triage(spec)
    assert message in str(caught.value)


def test_references_come_from_the_parsed_expression() -> None:
    # A macro's loop variable is not a reference, even when a question shares its name.
    condition = Condition.compile('event.state.labels.exists(l, l == "bug") && needs_repro > 0.5')
    assert condition.names == {"event", "needs_repro"}
    shadowed = Condition.compile("[0.1, 0.9].exists(needs_repro, needs_repro > 0.5)")
    assert shadowed.names == frozenset()
    assert Condition.compile('confidence["area"] > 0.5 && size(event.item) > 0').question_refs(
        ["area", "needs_repro"]
    ) == {"area"}


def test_unknown_question_scoped_to_other_events_is_a_run_time_matter() -> None:
    spec = copy.deepcopy(ISSUE_EXAMPLE)
    spec["rules"][0]["events"] = ["issues.opened", "issues.edited"]
    config = load_triage(spec)  # loads: rows 5 and lint report it, the file is not refused
    assert config.questions_for("issues.edited") == {"needs_repro"}
    assert config.questions_for("issues.opened") == {"needs_repro", "area"}


# -------------------------------------------------------------------------------- output


def test_a_suppressed_entry_renders_like_the_issue() -> None:
    entry = Entry(
        "needs-repro",
        ActionSpec("label.add", {"label": "needs-repro"}),
        "suppress",
        "shadow_mode",
        "shadow mode decides and logs but writes nothing",
        confidence=0.86,
        threshold=0.85,
        margin=0.01,
        question="needs_repro",
    )
    first, numbers = entry.render("noul").split("\n")
    expected = "x label: add needs-repro    [needs-repro] shadow_mode — "
    assert first == expected + "shadow mode decides and logs but writes nothing"
    assert "confidence 0.86" in numbers
    assert "threshold 0.85 (p >= 0.925 or p <= 0.075)" in numbers
    assert "margin +0.01" in numbers


def test_lint_reports_what_would_fail_at_run_time(tmp_path: Path) -> None:
    spec = copy.deepcopy(ISSUE_EXAMPLE)
    spec["rules"][0]["events"] = ["issues.opened", "issues.edited"]
    spec["rules"][0]["actions"].append({"op": "lock"})
    spec["rules"][0]["actions"].append({"op": "comment", "template": "nowhere"})
    config = load_triage(spec, base_dir=tmp_path)
    problems = lint(config, Caps(), tmp_path)
    reasons = sorted(p.reason for p in problems)
    assert reasons == ["missing_template", "missing_template", "unknown_question", "unsupported_by_executor"]
    assert any(
        str(p) == "triage.rules[needs-repro]: question 'area' is not asked for issues.edited"
        for p in problems
    )

    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "needs-repro.md").write_text("Please add steps.")
    clean = load_triage(ISSUE_EXAMPLE, base_dir=tmp_path)
    assert lint(clean, Caps(), tmp_path) == []


def test_events_are_validated_like_any_input() -> None:
    with pytest.raises(UserError, match=r"event\.event"):
        Event.from_json({"event": "Issues.Opened", "target": "acme/app#1"})
    with pytest.raises(UserError, match="unknown key 'evnet'"):
        Event.from_json({"evnet": "issues.opened", "target": "acme/app#1"})


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("state", {"score": float("nan")}, "no JSON spelling"),
        ("state", {"at": datetime(2026, 1, 1, tzinfo=UTC)}, "datetime is not JSON data"),
        ("state", [2**70], "64-bit"),
        ("context", {"since": date(2026, 1, 1)}, "date is not JSON data"),
    ],
)
def test_an_event_that_is_not_plain_json_is_refused_not_stringified(field: str, value: Any, why: str) -> None:
    """The decision key hashes the event with the one canonical JSON: no spelling, no key.

    (The Python API can hand over any object; `str()` of it is no identity.)
    """
    data = {"event": "issues.opened", "target": "acme/app#1", field: value}
    with pytest.raises(UserError, match=rf"event\.{field}: not plain JSON data \(.*{why}"):
        Event.from_json(data)


def test_a_triage_section_that_is_not_plain_json_is_refused() -> None:
    """An unquoted YAML date or `.nan` has no canonical spelling, so the config hash refuses it."""
    dated = copy.deepcopy(ISSUE_EXAMPLE)
    dated["questions"]["needs_repro"]["instructions"] = date(2026, 1, 1)
    with pytest.raises(ConfigError, match=r"triage\.questions\.needs_repro\.instructions: not plain JSON"):
        load_triage(dated)
    huge = {**ISSUE_EXAMPLE, "budget": {"requests": 2**70}}
    with pytest.raises(ConfigError, match=r"^triage: not plain JSON data"):
        load_triage(huge)


def test_hashes_use_the_one_canonical_json() -> None:
    config = load_triage(ISSUE_EXAMPLE)
    event = Event.from_json({**EVENT.to_json(), "state": {"title": "é", "n": 1.5}})
    digest = {"event": event.event, "item": event.item, "state": sha256_hex(canonical_json(event.state))}
    payload = [event.target, digest, event.context, sorted(config.questions_for(event.event)), config.hash]
    assert decision_key(event, config) == sha256_hex(canonical_json(payload))
    plain = {k: v for k, v in config.section.items() if k != "mode"}
    assert config.hash == sha256_hex(canonical_json(plain))


# -------------------------------------------------------------------------------- the engine


@dataclass
class CountingAsk:
    """A provider stand-in: answers from `wire`, counting calls and the questions asked."""

    wire: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)

    def __call__(self, state: Any, questions: Any) -> AskResult:
        self.calls.append(sorted(questions))
        found = {q: Answer.from_wire(q, self.wire[q]) for q in questions if q in self.wire}
        return AskResult(
            answers=found, unanswered={q: "dropped" for q in questions if q not in self.wire}, requests=1
        )


ENGINE_RULES = [
    {
        "id": "needs-repro",
        "events": ["issues.opened"],
        "if": 'needs_repro >= 0.8 && area == "bug"',
        "gateOn": ["needs_repro"],
        "actions": [{"op": "label.add", "label": "needs-repro"}],
    },
    {
        "id": "docs",
        "events": ["issues.opened"],
        "if": 'area == "docs"',
        "actions": [{"op": "label.add", "label": "docs"}],
    },
    {"id": "welcome", "events": ["issues.opened"], "actions": [{"op": "label.add", "label": "new"}]},
]
EVENT = Event(
    "issues.opened", "acme/app#12", "issue:12", {"repo": "acme/app"}, {"title": "crash", "body": "x"}
)
GOOD = {"needs_repro": noul(0.99), "area": choice("bug", 0.95)}


def engine_config(**top: Any) -> TriageConfig:
    return load_triage(section(copy.deepcopy(ENGINE_RULES), executor="recording", **top))


def go(config: TriageConfig, ask: Any, store: TriageStore, executor: Any, **kw: Any) -> Any:
    budget = kw.pop("budget", None) or RunBudget.from_config(config)
    return triage(EVENT, config, ask=ask, store=store, executor=executor, budget=budget, **kw)


def test_keyless_shadow_run_lists_every_rule_needing_answers(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    result = go(engine_config(mode="shadow"), keyless_ask, triage_store, recording_executor)
    reasons = {(e.rule, e.reason) for e in result.suppressed}
    assert reasons == {("needs-repro", "no_answers"), ("docs", "no_answers"), ("welcome", "shadow_mode")}
    assert result.requests == 0
    assert not result.applied and not result.suggested
    assert recording_executor.recorded() == []  # shadow wrote nothing, not even to the recording model


def test_redelivery_serves_the_stored_decision_with_zero_ask_calls(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    config = engine_config()
    ask = CountingAsk(GOOD)
    first = go(config, ask, triage_store, recording_executor)
    second = go(config, ask, triage_store, recording_executor)
    assert len(ask.calls) == 1
    assert first.decision_id == second.decision_id
    assert second.requests == 0 and second.reused == ("area", "needs_repro")
    assert [e.to_json()["outcome"] for e in first.entries] == [e.to_json()["outcome"] for e in second.entries]
    # The redelivered applies come from the ledger: the executor was not asked twice.
    assert all((e.executed or "").startswith("already") for e in second.applied)
    assert len(recording_executor.recorded()) == 2


def test_editing_the_config_re_triages(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    ask = CountingAsk(GOOD)
    first = go(engine_config(), ask, triage_store, recording_executor)
    moved = go(engine_config(gate={"suggest": 0.6, "auto": 0.9}), ask, triage_store, recording_executor)
    renamed_rules = copy.deepcopy(ENGINE_RULES)
    renamed_rules[0]["id"] = "repro-please"
    renamed = go(
        load_triage(section(renamed_rules, executor="recording")), ask, triage_store, recording_executor
    )
    assert len({first.decision_id, moved.decision_id, renamed.decision_id}) == 3
    assert len(ask.calls) == 3


def test_an_edited_event_re_triages(triage_store: TriageStore, recording_executor: RecordingExecutor) -> None:
    config = engine_config()
    ask = CountingAsk(GOOD)
    go(config, ask, triage_store, recording_executor)
    edited = Event(
        EVENT.event, EVENT.target, EVENT.item, EVENT.context, {"title": "crash", "body": "steps: 1. 2."}
    )
    triage(edited, config, ask=ask, store=triage_store, executor=recording_executor, budget=RunBudget(None))
    assert len(ask.calls) == 2
    assert decision_key(edited, config) != decision_key(EVENT, config)


def test_changing_only_the_mode_reuses_every_answer(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    ask = CountingAsk({"needs_repro": noul(0.99), "area": choice("bug", 0.7)})
    shadow = go(engine_config(mode="shadow"), ask, triage_store, recording_executor)
    suggest = go(engine_config(mode="suggest"), ask, triage_store, recording_executor)
    auto = go(engine_config(mode="auto"), ask, triage_store, recording_executor, mode_override="auto")
    assert len(ask.calls) == 1
    assert shadow.decision_id == suggest.decision_id == auto.decision_id
    assert {e.reason for e in shadow.entries} == {"shadow_mode"}
    assert {e.reason for e in suggest.entries} == {"suggest"}
    assert [(e.rule, e.outcome) for e in auto.entries] == [("needs-repro", "apply"), ("welcome", "apply")]


def test_a_spent_budget_asks_nothing(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    ask = CountingAsk(GOOD)
    result = go(engine_config(budget={"requests": 0}), ask, triage_store, recording_executor)
    assert ask.calls == []
    assert {e.reason for e in result.entries if e.rule != "welcome"} == {"budget_exhausted"}


def test_the_callers_own_budget_shows_as_budget_exhausted(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    def hourly_spent(state: Any, questions: Any) -> AskResult:
        return AskResult(over_budget=frozenset(questions))

    result = go(engine_config(), hourly_spent, triage_store, recording_executor)
    assert {e.reason for e in result.entries if e.rule != "welcome"} == {"budget_exhausted"}


def test_the_run_budget_counts_provider_requests(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    budget = RunBudget(1)
    ask = CountingAsk(GOOD)
    go(engine_config(), ask, triage_store, recording_executor, budget=budget)
    assert budget.spent == 1 and not budget.available()
    go(
        engine_config(), ask, triage_store, recording_executor, budget=budget
    )  # a stored decision costs nothing
    assert budget.spent == 1


def test_a_provider_failure_is_no_answer_and_is_not_stored(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    def broken(state: Any, questions: Any) -> AskResult:
        raise TimeoutError("provider timed out")

    config = engine_config()
    failed = go(config, broken, triage_store, recording_executor)
    assert {e.reason for e in failed.entries if e.rule != "welcome"} == {"no_answers"}
    assert "provider error (TimeoutError)" in failed.suppressed[0].explanation
    ask = CountingAsk(GOOD)
    go(config, ask, triage_store, recording_executor)
    assert len(ask.calls) == 1  # the failure was not cached: the next delivery asks again


def test_an_answer_of_the_wrong_type_counts_as_no_answer(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    result = go(
        engine_config(),
        CountingAsk({"needs_repro": choice("yes", 0.9), "area": choice("bug", 0.9)}),
        triage_store,
        recording_executor,
    )
    entry = next(e for e in result.entries if e.rule == "needs-repro")
    assert entry.reason == "no_answers" and "the question is a noul" in entry.explanation


def test_file_answers_are_not_reused_by_a_provider_run(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    config = engine_config()
    go(config, answers_file_ask(GOOD), triage_store, recording_executor, answers_from="file")
    ask = CountingAsk(GOOD)
    go(config, ask, triage_store, recording_executor)
    go(config, ask, triage_store, recording_executor)
    assert len(ask.calls) == 1


def test_nothing_decided_escalates_in_the_store_only_in_shadow(
    fake_client: fakeredis.FakeRedis, triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    rules = [r for r in copy.deepcopy(ENGINE_RULES) if r["id"] != "welcome"]
    shadow = load_triage(section(rules, executor="recording", escalate="needs-triage", mode="shadow"))
    result = go(shadow, keyless_ask, triage_store, recording_executor)
    assert result.escalated is not None
    assert list(triage_store.needs_triage()) == [result.decision_id]
    assert recording_executor.recorded() == []

    auto = load_triage(section(rules, executor="recording", escalate="needs-triage", mode="auto"))
    go(auto, keyless_ask, triage_store, recording_executor)
    assert "needs-triage" in recording_executor.state(EVENT.target)["labels"]


def test_a_decided_event_is_not_escalated(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    config = load_triage(section(copy.deepcopy(ENGINE_RULES), executor="recording", escalate="needs-triage"))
    result = go(config, CountingAsk(GOOD), triage_store, recording_executor)
    assert result.escalated is None and triage_store.needs_triage() == {}


def test_replay_shows_what_a_stricter_gate_would_change(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    config = engine_config()
    ask = CountingAsk({"needs_repro": noul(0.95), "area": choice("bug", 0.9)})  # needs_repro confidence 0.9
    go(config, ask, triage_store, recording_executor)
    report = replay(triage_store, config, executor=recording_executor, gate_auto=0.95)
    assert len(ask.calls) == 1
    assert report.decisions == 1
    assert [(c.rule, c.before, c.after) for c in report.changes] == [
        ("needs-repro", ("apply", "apply"), ("suggest", "suggest"))
    ]
    assert replay(triage_store, config, executor=recording_executor).changes == ()
    assert {
        c.after for c in replay(triage_store, config, executor=recording_executor, mode="shadow").changes
    } == {("suppress", "shadow_mode")}


def test_the_json_shape(triage_store: TriageStore, recording_executor: RecordingExecutor) -> None:
    result = go(engine_config(mode="suggest"), CountingAsk(GOOD), triage_store, recording_executor).to_json()
    assert {"decision_id", "event", "target", "mode", "applied", "suggested", "suppressed"} <= set(result)
    entry = result["suggested"][0]
    assert {"rule", "action", "outcome", "reason", "confidence", "threshold", "margin"} <= set(entry)
    assert entry["action"] == {"op": "label.add", "label": "needs-repro"}
    assert (result["event"], result["target"], result["mode"]) == ("issues.opened", "acme/app#12", "suggest")


def test_github_executor_capabilities_drive_row_7(fake_client: fakeredis.FakeRedis) -> None:
    github = GitHubExecutor(None, ledger=Ledger(TriageStorage(fake_client)))  # supports() needs no token
    spec = rule(actions=[{"op": "lock"}, {"op": "assign", "assignees": ["alice"]}])
    config = load_triage(section([spec], allowDestructive=["lock"]))
    resolution = resolve(config, EVENT, Knowledge({}), executor=github)
    assert [e.reason for e in resolution.entries] == ["unsupported_by_executor", "apply"]


def test_status_counts_the_last_runs_by_outcome(
    fake_client: fakeredis.FakeRedis, triage_store: TriageStore
) -> None:
    recording = RecordingExecutor(TriageStorage(fake_client))
    config = load_triage(section(copy.deepcopy(ENGINE_RULES), executor="recording", escalate="needs-triage"))
    go(config, keyless_ask, triage_store, recording, mode_override="shadow")
    go(config, CountingAsk(GOOD), triage_store, recording)

    status = status_section(TriageStorage(fake_client))
    assert status.runs == 2
    assert status.counts == {"no_answers": 2, "shadow_mode": 1, "apply": 2}
    assert status.needs_triage == 0


# ----------------------------------------------------------------- answers outside the question


@pytest.mark.parametrize(
    ("wire", "cause"),
    [
        ({"type": "choice", "choice": "zzz", "confidence": 0.99}, "not one of the criteria"),
        (
            {
                "type": "choice",
                "choice": "bug",
                "confidence": 0.9,
                "probabilities": {"bug": 0.9, "docs": 0.5},
            },
            "sum to 1.4",
        ),
    ],
)
def test_an_answer_outside_the_question_is_no_answer_even_from_a_file(
    triage_store: TriageStore, recording_executor: RecordingExecutor, wire: dict[str, Any], cause: str
) -> None:
    ask = answers_file_ask({"needs_repro": noul(0.99), "area": wire})
    result = go(engine_config(), ask, triage_store, recording_executor, answers_from="file")
    by_rule = {e.rule: e for e in result.entries}
    assert by_rule["needs-repro"].reason == "no_answers" and cause in by_rule["needs-repro"].explanation
    assert by_rule["docs"].reason == "no_answers"
    assert not any(e.rule != "welcome" for e in result.applied)
    assert "area" not in (triage_store.load(result.decision_id) or pytest.fail("not stored")).answers


def test_a_score_outside_its_levels_is_no_answer(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    rules = [
        {
            "id": "sev",
            "events": ["issues.opened"],
            "if": "severity >= 2.0",
            "actions": [{"op": "label.add", "label": "hot"}],
        }
    ]
    config = load_triage(section(rules, executor="recording"))
    ask = CountingAsk({"severity": score(3.5, 0.99)})  # levels 0..3
    result = go(config, ask, triage_store, recording_executor)
    assert [e.reason for e in result.entries] == ["no_answers"]
    assert "outside the levels' range [0, 3]" in result.entries[0].explanation


# ------------------------------------------------- `if`s that need only the event are evaluated first

PR_RULES = [
    {
        "id": "issue-repro",
        "events": ["issues.opened"],
        "if": "!has(event.state.pull_request) && needs_repro >= 0.8",
        "actions": [{"op": "label.add", "label": "needs-repro"}],
    },
    {
        "id": "docs-area",
        "events": ["issues.opened"],
        "if": 'event.context.repo == "acme/docs" && area == "docs"',
        "actions": [{"op": "label.add", "label": "docs"}],
    },
]


def test_an_event_every_rule_excludes_costs_no_request(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    config = load_triage(section(copy.deepcopy(PR_RULES), executor="recording"))
    pull = Event(
        "issues.opened", "acme/app#3", "issue:3", {"repo": "acme/app"}, {"pull_request": {"url": "u"}}
    )
    ask = CountingAsk({"needs_repro": noul(0.99), "area": choice("docs", 0.99)})
    result = triage(
        pull, config, ask=ask, store=triage_store, executor=recording_executor, budget=RunBudget(None)
    )
    assert ask.calls == [] and result.requests == 0 and result.asked == ()
    assert result.entries == () and result.errors == ()  # row 1: silent, not no_answers


def test_only_questions_of_rules_that_can_still_fire_are_asked(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    config = load_triage(section(copy.deepcopy(PR_RULES), executor="recording"))
    ask = CountingAsk({"needs_repro": noul(0.99), "area": choice("docs", 0.99)})
    result = go(config, ask, triage_store, recording_executor)  # an issue in acme/app: docs-area cannot fire
    assert ask.calls == [["needs_repro"]]
    assert [(e.rule, e.outcome) for e in result.entries] == [("issue-repro", "apply")]


def test_an_if_false_on_a_known_answer_needs_no_other_answer() -> None:
    config = load_triage(
        section(
            [
                {
                    "id": "r",
                    "events": ["issues.opened"],
                    "if": 'area == "docs" && needs_repro >= 0.8',
                    "actions": [{"op": "label.add", "label": "x"}],
                }
            ]
        )
    )
    known = answers_of({"area": choice("bug", 0.9)})
    assert questions_to_ask(config, EVENT, known) == frozenset()
    resolution = resolve(
        config, EVENT, Knowledge(known), executor=RecordingExecutor(TriageStorage(fakeredis.FakeRedis()))
    )
    assert resolution.entries == () and resolution.errors == ()
    assert questions_to_ask(config, EVENT, {}) == {"area", "needs_repro"}  # undetermined: both asked


# ------------------------------------------------------------------ one budget model, in Redis


def _event(n: int) -> Event:
    return Event("issues.opened", f"acme/app#{n}", f"issue:{n}", {"repo": "acme/app"}, {"title": f"t{n}"})


def test_the_config_budget_counts_across_invocations_and_says_what_was_spent(
    fake_client: fakeredis.FakeRedis, triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    config = engine_config(budget={"requests": 2, "window": 600})
    ask = CountingAsk(GOOD)
    results = [
        triage(
            _event(n),
            config,
            ask=ask,
            store=triage_store,
            executor=recording_executor,
            budget=budget_for(
                TriageStorage(fake_client), config, 1000
            ),  # a new one each run, like a new process
        )
        for n in range(3)
    ]
    assert len(ask.calls) == 2 and [r.requests for r in results] == [1, 1, 0]
    spent = [e for e in results[2].suppressed if e.rule == "needs-repro"]
    assert spent[0].reason == "budget_exhausted"
    assert (
        "triage.budget budget spent: 2 of 2 requests in the last 10m; it refills at " in spent[0].explanation
    )
    assert spent[0].explanation.endswith(" UTC)")


def test_the_hourly_cap_applies_with_no_config_budget_and_refills_on_a_rolling_hour(
    fake_client: fakeredis.FakeRedis, triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    config = engine_config()
    now = [1_000_000.0]
    limits = [BudgetLimit("hourly", "DISPATCHQ_TRIAGE_HOURLY_BUDGET", 1, 3600.0)]

    def budget() -> RollingBudget:
        return RollingBudget(TriageStorage(fake_client), limits, clock=lambda: now[0])

    ask = CountingAsk(GOOD)
    go(config, ask, triage_store, recording_executor, budget=budget())
    now[0] += 1800  # half an hour later: a clock-hour counter might have reset, a rolling one has not
    refused = budget().reserve()
    assert refused == (
        "DISPATCHQ_TRIAGE_HOURLY_BUDGET budget spent: 1 of 1 requests in the last 1h; "
        "it refills at " + time.strftime("%H:%M:%S UTC", time.gmtime(1_000_000.0 + 3600))
    )
    now[0] += 1801
    assert budget().reserve() is None


def test_a_request_not_made_is_given_back_and_a_zero_limit_never_refills(
    fake_client: fakeredis.FakeRedis, triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    config = engine_config(budget={"requests": 1})
    go(
        config,
        keyless_ask,
        triage_store,
        recording_executor,
        budget=budget_for(TriageStorage(fake_client), config, 10),
    )
    assert TriageStorage(fake_client).budget_used("config", 3600, time.time()) == 0  # keyless: 0 requests
    zero = load_triage(section(copy.deepcopy(ENGINE_RULES), executor="recording", budget={"requests": 0}))
    assert budget_for(TriageStorage(fake_client), zero, 10).reserve() == (
        "triage.budget budget spent: 0 of 0 requests in the last 1h; it never refills (the limit is 0)"
    )


@pytest.mark.parametrize("window", [0, -5, 1.5, "1h", True])
def test_a_bad_budget_window_is_refused(window: Any) -> None:
    with pytest.raises(ConfigError, match=r"triage.budget.window: expected a whole number of seconds"):
        load_triage(section(copy.deepcopy(ENGINE_RULES), budget={"requests": 3, "window": window}))


# ---------------------------------------------------- lint: events that never fire, CEL int/double


def test_lint_checks_event_names_against_githubs_webhook_events(tmp_path: Path) -> None:
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "repro.md").write_text("steps?")
    rules = [
        {
            "id": "typo",
            "events": ["issue.opened", "issues.open", "issues.opened"],
            "actions": [{"op": "label.add", "label": "x"}],
        }
    ]
    problems = lint(load_triage(section(rules), base_dir=tmp_path), Caps(), tmp_path)
    assert [(p.where, p.reason) for p in problems] == [
        ("triage.rules[typo].events[0]", "unknown_event"),
        ("triage.rules[typo].events[1]", "unknown_event"),
    ]
    assert "did you mean 'issues.opened'?" in problems[0].message and "never fires" in problems[0].message
    assert (
        "'issues' has no action 'open'" in problems[1].message
        and "did you mean 'issues.opened'?" in problems[1].message
    )


def test_the_shipped_event_list_knows_bare_and_actioned_events() -> None:
    from dispatchq.triage.github_events import WEBHOOK_EVENTS
    from dispatchq.triage.table import unknown_event

    assert WEBHOOK_EVENTS["push"] == () and "opened" in WEBHOOK_EVENTS["pull_request"]
    assert unknown_event("push") is None and unknown_event("issue_comment.created") is None
    assert "has no actions: name it 'push'" in (unknown_event("push.created") or "")
    assert "carry an action" in (unknown_event("issues") or "")


@pytest.mark.parametrize(
    ("condition", "literal"),
    [
        ("2 <= severity", "2"),
        ("needs_repro == 1", "1"),
        ("1 <= confidence.area", "1"),
        ("severity in [1, 2]", "1"),
    ],
)
def test_lint_finds_int_double_comparisons_cel_python_refuses(
    tmp_path: Path, condition: str, literal: str
) -> None:
    rules = [
        {
            "id": "cmp",
            "events": ["issues.opened"],
            "if": condition,
            "actions": [{"op": "label.add", "label": "x"}],
        }
    ]
    config = load_triage(section(rules), base_dir=tmp_path)
    [problem] = lint(config, Caps(), tmp_path)
    assert (problem.where, problem.reason) == ("triage.rules[cmp].if", "int_double_comparison")
    assert f"write {literal}.0" in problem.message and "cel-python refuses" in problem.message
    # And it is refused at run time, as lint said.
    answers = answers_of({"severity": score(2.0, 0.9), "needs_repro": noul(0.9), "area": choice("bug", 0.9)})
    resolution = resolve(config, EVENT, Knowledge(answers), executor=Caps())
    assert [e.rule for e in resolution.errors] == ["cmp"]


@pytest.mark.parametrize(
    "condition", ["severity >= 2.0", "severity >= 2", 'area == "bug"', "event.context.n == 1"]
)
def test_lint_leaves_comparisons_cel_python_accepts(tmp_path: Path, condition: str) -> None:
    rules = [
        {
            "id": "cmp",
            "events": ["issues.opened"],
            "if": condition,
            "actions": [{"op": "label.add", "label": "x"}],
        }
    ]
    assert lint(load_triage(section(rules), base_dir=tmp_path), Caps(), tmp_path) == []


def test_a_passing_boundary_renders_margin_plus_zero() -> None:
    from dispatchq.core.answers import margin

    assert f"{margin(0.6, 0.6000000000000001):+.4g}" == "+0"
    entry = Entry(
        "r", ActionSpec("label.add", {"label": "x"}), "apply", "apply", "ok", 0.6, 0.6, margin(0.6, 0.6)
    )
    assert "margin +0" in entry.render("choice") and "p >=" not in entry.render("choice")


def test_a_later_delivery_that_decides_removes_our_own_needs_triage_label(
    fake_client: fakeredis.FakeRedis, triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    rules = copy.deepcopy(ENGINE_RULES[:2])  # no unconditional rule: keyless decides nothing
    config = load_triage(section(rules, executor="recording", mode="auto", escalate="needs-triage"))
    first = go(config, keyless_ask, triage_store, recording_executor)  # nothing decidable: escalated
    assert first.escalated is not None and "needs-triage" in recording_executor.state(EVENT.target)["labels"]
    assert TriageStorage(fake_client).needs_triage_count() == 1

    second = go(config, CountingAsk(GOOD), triage_store, recording_executor)  # answered now: rules decide
    assert second.escalated is None and second.applied
    assert "needs-triage" not in recording_executor.state(EVENT.target)["labels"]
    assert (second.escalation_cleared or "").startswith("needs-triage: performed")
    assert TriageStorage(fake_client).needs_triage_count() == 0


def test_a_needs_triage_label_a_person_added_is_never_removed(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    recording_executor.seed(EVENT.target, labels=["needs-triage"])  # not added by dispatchq
    result = go(
        engine_config(mode="auto", escalate="needs-triage"),
        CountingAsk(GOOD),
        triage_store,
        recording_executor,
    )
    assert result.applied and "needs-triage" in recording_executor.state(EVENT.target)["labels"]
    assert result.escalation_cleared is None


def test_replay_uses_provider_answers_only_and_says_which_it_used(
    triage_store: TriageStore, recording_executor: RecordingExecutor
) -> None:
    config = engine_config(mode="auto")
    go(config, CountingAsk(GOOD), triage_store, recording_executor)
    what_if = answers_file_ask(GOOD)
    triage(
        _event(7),
        config,
        ask=what_if,
        store=triage_store,
        executor=recording_executor,
        budget=RunBudget(None),
        answers_from="file",
    )

    report = replay(triage_store, config, executor=recording_executor)
    assert (report.decisions, dict(report.answers_from), report.skipped_file_answers) == (
        1,
        {"provider": 1},
        1,
    )
    assert report.earlier_config == 0
    both = replay(triage_store, config, executor=recording_executor, include_file_answers=True)
    assert (both.decisions, dict(both.answers_from)) == (2, {"provider": 1, "file": 1})
    edited = engine_config(mode="auto", gate={"suggest": 0.5, "auto": 0.9})
    assert replay(triage_store, edited, executor=recording_executor).earlier_config == 1
    assert (
        "1 decided under an earlier config"
        in replay(triage_store, edited, executor=recording_executor).summary()
    )
