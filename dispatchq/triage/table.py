"""The resolution table: what every planned action comes to, given the config and the answers.

Given a config, an event and what is known about the answers (which arrived, which
were asked and came back empty, which the budget kept us from asking), `resolve`
decides every planned action by a fixed first-match table; `lint` finds, before a
run does, the references the table would resolve as suppressions. Keeping it pure is
what lets `replay` re-run history as a what-if and lets the tests reach every row
without a network.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from dispatchq.core.answers import Answer, margin, meets, min_confidence, noul_gate_as_probability
from dispatchq.errors import ConditionError
from dispatchq.triage.cel import bindings
from dispatchq.triage.github_events import WEBHOOK_EVENTS
from dispatchq.triage.rules import DESTRUCTIVE_OPS, ActionSpec, Event, Mode, Rule, TriageConfig

__all__ = [
    "APPLY",
    "BELOW_SUGGEST_THRESHOLD",
    "BUDGET_EXHAUSTED",
    "DESTRUCTIVE_NOT_OPTED_IN",
    "INT_DOUBLE_COMPARISON",
    "MISSING_TEMPLATE",
    "NO_ANSWERS",
    "REASONS",
    "SHADOW_MODE",
    "SUGGEST",
    "UNDECIDED_REASONS",
    "UNKNOWN_EVENT",
    "UNKNOWN_QUESTION",
    "UNSUPPORTED_BY_EXECUTOR",
    "Entry",
    "Knowledge",
    "Outcome",
    "Problem",
    "Resolution",
    "RuleError",
    "SupportsOps",
    "lint",
    "possible_rules",
    "questions_to_ask",
    "resolve",
    "unknown_event",
]

log = logging.getLogger(__name__)

Outcome = Literal["apply", "suggest", "suppress"]

# Reason codes, in table order (rows 3-12; rows 1 and 2 are never listed as entries).
BUDGET_EXHAUSTED = "budget_exhausted"
NO_ANSWERS = "no_answers"
UNKNOWN_QUESTION = "unknown_question"
DESTRUCTIVE_NOT_OPTED_IN = "destructive_not_opted_in"
UNSUPPORTED_BY_EXECUTOR = "unsupported_by_executor"
# Lint-only reasons: found before a run, never an entry's reason.
UNKNOWN_EVENT = "unknown_event"
INT_DOUBLE_COMPARISON = "int_double_comparison"
MISSING_TEMPLATE = "missing_template"
BELOW_SUGGEST_THRESHOLD = "below_suggest_threshold"
SHADOW_MODE = "shadow_mode"
SUGGEST = "suggest"
APPLY = "apply"
REASONS: tuple[str, ...] = (
    BUDGET_EXHAUSTED,
    NO_ANSWERS,
    UNKNOWN_QUESTION,
    DESTRUCTIVE_NOT_OPTED_IN,
    UNSUPPORTED_BY_EXECUTOR,
    MISSING_TEMPLATE,
    BELOW_SUGGEST_THRESHOLD,
    SHADOW_MODE,
    SUGGEST,
    APPLY,
)
#: Reasons that mean "nothing could be decided" for the escalation rule: the answers or
#: the config fell short. A shadow-mode suppression is a decision that was not written.
UNDECIDED_REASONS = frozenset(
    {
        BUDGET_EXHAUSTED,
        NO_ANSWERS,
        UNKNOWN_QUESTION,
        DESTRUCTIVE_NOT_OPTED_IN,
        UNSUPPORTED_BY_EXECUTOR,
        MISSING_TEMPLATE,
        BELOW_SUGGEST_THRESHOLD,
    }
)


@dataclass(frozen=True)
class Knowledge:
    """What is known about the answers an event needs, and why the missing ones are missing."""

    answers: Mapping[str, Answer]
    unanswered: Mapping[str, str] = field(default_factory=dict)  # asked, nothing came back: why
    over_budget: frozenset[str] = frozenset()  # not asked: the budget was spent


@dataclass(frozen=True)
class Entry:
    """One planned action and how it resolved, with the numbers that were compared."""

    rule: str
    action: ActionSpec
    outcome: Outcome
    reason: str
    explanation: str
    confidence: float | None = None
    threshold: float | None = None
    margin: float | None = None
    question: str | None = None  # the least sure question the confidence came from
    executed: str | None = None  # for applied entries: what the executor did

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "action": self.action.to_json(),
            "outcome": self.outcome,
            "reason": self.reason,
            "explanation": self.explanation,
            "confidence": _round(self.confidence),
            "threshold": _round(self.threshold),
            "margin": _round(self.margin),
            "question": self.question,
            "executed": self.executed,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        return cls(
            rule=data["rule"],
            action=ActionSpec.from_json(data["action"]),
            outcome=data["outcome"],
            reason=data["reason"],
            explanation=data.get("explanation", ""),
            confidence=data.get("confidence"),
            threshold=data.get("threshold"),
            margin=data.get("margin"),
            question=data.get("question"),
            executed=data.get("executed"),
        )

    def render(self, question_type: str | None = None) -> str:
        """`x label: add needs-repro    [needs-repro] shadow_mode — shadow mode ...`."""
        mark = {"apply": "+", "suggest": "?", "suppress": "x"}[self.outcome]
        line = f"{mark} {self.action.text()}    [{self.rule}] {self.reason} — {self.explanation}"
        numbers = []
        if self.confidence is not None:
            numbers.append(f"confidence {self.confidence:.4g}")
        if self.threshold is not None:
            numbers.append(f"threshold {self.threshold:.4g}")
            if question_type == "noul":
                hi, lo = noul_gate_as_probability(self.threshold)
                numbers[-1] += f" (p >= {hi:g} or p <= {lo:g})"
        if self.margin is not None:
            numbers.append(f"margin {self.margin:+.4g}")
        if self.executed:
            numbers.append(f"executed: {self.executed}")
        return line + ("\n      " + "  ".join(numbers) if numbers else "")


def _round(value: float | None) -> float | None:
    """For output only: 0.8600000000000001 reads as 0.86 (comparisons use answers.meets)."""
    return None if value is None else round(value, 9)


@dataclass(frozen=True)
class RuleError:
    """Row 2: an `if` that threw. Not an entry (nothing was planned), but never silent."""

    rule: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "error": self.message}


@dataclass(frozen=True)
class Resolution:
    entries: tuple[Entry, ...]
    errors: tuple[RuleError, ...]

    @property
    def undecided(self) -> bool:
        """Nothing could be decided: no action decided (even in shadow), something fell short."""
        decided = any(e.outcome != "suppress" or e.reason == SHADOW_MODE for e in self.entries)
        return not decided and (bool(self.errors) or any(e.reason in UNDECIDED_REASONS for e in self.entries))


class SupportsOps(Protocol):
    def supports(self, op: str) -> bool: ...


def resolve(
    config: TriageConfig,
    event: Event,
    knowledge: Knowledge,
    *,
    executor: SupportsOps,
    mode: Mode | None = None,
    template_exists: Callable[[str], bool] | None = None,
) -> Resolution:
    """Resolve every planned action of every rule through the first-match table.

    Rows, first match wins: 1 disabled/not triggered/`if` false (silent) · 2 `if` throws
    (logged) · 3 budget_exhausted · 4 no_answers · 5 unknown_question ·
    6 destructive_not_opted_in · 7 unsupported_by_executor · 8 missing_template ·
    9 below_suggest_threshold · 10 shadow_mode · 11 suggest · 12 apply.

    A missing answer is not a throw: when the `if` references one it is undetermined,
    and rows 3-5 say why. So a keyless run lists every rule that needed answers as
    `no_answers` instead of nothing.
    """
    mode = mode or config.mode
    exists = template_exists or config.template_exists
    answers = {q: a for q, a in knowledge.answers.items() if q in config.questions}
    activation: dict[str, Any] | None = None
    entries: list[Entry] = []
    errors: list[RuleError] = []

    for rule in config.rules:
        # Row 1: disabled or not triggered.
        if not rule.triggered_by(event.event):
            continue
        missing = sorted(q for q in rule.dependencies if q not in answers)
        if activation is None:
            activation = bindings(event.to_json(), answers)
        # Row 2 (and the silent half of row 1): an `if` whose answers are all here.
        if rule.condition is not None and rule.refs <= answers.keys():
            try:
                matched = rule.condition.evaluate(activation)
            except ConditionError as error:
                log.warning("triage rule %s: if failed on %s: %s", rule.id, event.target, error)
                errors.append(RuleError(rule.id, str(error)))
                continue
            if not matched:
                continue
        # Row 1 too: an `if` already false on what is known (the event, the answers that came)
        # is false whatever the missing answers say, so nothing was asked for it.
        elif rule.condition is not None and _false_without(rule, activation):
            continue
        # Rows 3-5: undetermined, or determined but a gateOn answer is missing.
        if missing:
            reason, explanation = _missing_reason(config, event, knowledge, missing)
            entries.extend(Entry(rule.id, a, "suppress", reason, explanation) for a in rule.actions)
            continue

        confidence, weakest = _rule_confidence(rule, answers)
        for action in rule.actions:
            entries.append(_resolve_action(config, rule, action, confidence, weakest, mode, executor, exists))
    return Resolution(tuple(entries), tuple(errors))


def _false_without(rule: Rule, activation: Mapping[str, Any]) -> bool:
    """Whether the `if` is false on a partial activation, whatever the absent answers are.

    CEL's `&&`/`||` absorb an error on one side when the other decides (`false && e` is
    false), and cel-python implements that: an absent answer is an undeclared reference,
    an error, so a False here is False for every answer. An error means "undetermined".
    """
    if rule.condition is None:
        return False
    try:
        return not rule.condition.evaluate(activation)
    except ConditionError:
        return False


def possible_rules(config: TriageConfig, event: Event, answers: Mapping[str, Answer]) -> list[Rule]:
    """The rules this event triggers whose `if` can still be true given what is known."""
    activation = bindings(event.to_json(), {q: a for q, a in answers.items() if q in config.questions})
    return [rule for rule in config.triggered(event.event) if not _false_without(rule, activation)]


def questions_to_ask(config: TriageConfig, event: Event, answers: Mapping[str, Answer]) -> frozenset[str]:
    """What a rule that can still fire depends on (in scope for the event), minus what is known.

    Conditions that need only the event (`!has(event.state.pull_request)`) are evaluated
    first, so an event every rule excludes costs no request.
    """
    needed: set[str] = set()
    for rule in possible_rules(config, event, answers):
        needed |= {q for q in rule.dependencies if config.questions[q].asked_for(event.event)}
    return frozenset(needed - answers.keys())


def _missing_reason(
    config: TriageConfig, event: Event, knowledge: Knowledge, missing: list[str]
) -> tuple[str, str]:
    budget = [q for q in missing if q in knowledge.over_budget]
    if budget:
        notes = sorted({knowledge.unanswered[q] for q in budget if knowledge.unanswered.get(q)})
        detail = f" ({'; '.join(notes)})" if notes else ""
        return (
            BUDGET_EXHAUSTED,
            f"the request budget was spent before {_names(budget)} could be asked{detail}",
        )
    unasked = [q for q in missing if not config.questions[q].asked_for(event.event)]
    empty = [q for q in missing if q not in unasked]
    if empty:
        whys = sorted({knowledge.unanswered.get(q, "no answer recorded") for q in empty})
        return NO_ANSWERS, f"no answer for {_names(empty)} ({'; '.join(whys)})"
    return (
        UNKNOWN_QUESTION,
        f"{_names(unasked)} {'is' if len(unasked) == 1 else 'are'} not asked for {event.event}",
    )


def _names(ids: list[str]) -> str:
    return ", ".join(ids)


def _rule_confidence(rule: Rule, answers: Mapping[str, Answer]) -> tuple[float, str | None]:
    """The minimum over `gateOn` (else the `if` references); 1 when unconditional.

    Never an average: one confident answer must not carry a coin flip.
    """
    ids = list(rule.confidence_ids)
    confidence = min_confidence(dict(answers), ids)
    if confidence is None:  # resolve() only gets here with every dependency answered
        raise AssertionError(f"rule {rule.id}: confidence over missing answers")
    weakest = min(ids, key=lambda q: (answers[q].confidence, q)) if ids else None
    return confidence, weakest


def _resolve_action(
    config: TriageConfig,
    rule: Rule,
    action: ActionSpec,
    confidence: float,
    weakest: str | None,
    mode: Mode,
    executor: SupportsOps,
    template_exists: Callable[[str], bool],
) -> Entry:
    def entry(outcome: Outcome, reason: str, explanation: str, threshold: float | None = None) -> Entry:
        gap = margin(confidence, threshold) if threshold is not None else None
        return Entry(rule.id, action, outcome, reason, explanation, confidence, threshold, gap, weakest)

    # Row 6: destructive ops need an explicit opt-in.
    if action.op in DESTRUCTIVE_OPS and action.op not in config.allow_destructive:
        return entry(
            "suppress",
            DESTRUCTIVE_NOT_OPTED_IN,
            f"{action.op} destroys; list it in triage.allowDestructive to allow it",
        )
    # Row 7: the configured executor (even in shadow mode: shadow previews what it would do).
    if not executor.supports(action.op):
        return entry(
            "suppress", UNSUPPORTED_BY_EXECUTOR, f"the {config.executor} executor cannot {action.op}"
        )
    # Row 8.
    if action.template is not None and not template_exists(action.template):
        path = config.templates.get(action.template)
        where = f" ({path})" if path else " (not in triage.templates)"
        return entry("suppress", MISSING_TEMPLATE, f"template {action.template!r}{where} does not exist")
    # Row 9.
    if not meets(confidence, config.gate_suggest):
        return entry(
            "suppress",
            BELOW_SUGGEST_THRESHOLD,
            f"confidence {confidence:.4g} is below the suggest gate {config.gate_suggest:g}",
            config.gate_suggest,
        )
    # Row 10: the numbers still show whether auto would have applied it.
    if mode == "shadow":
        return entry(
            "suppress", SHADOW_MODE, "shadow mode decides and logs but writes nothing", config.gate_auto
        )
    # Row 11.
    if mode == "suggest":
        return entry(
            "suggest", SUGGEST, "suggest mode: a person accepts it with `triage apply`", config.gate_auto
        )
    if not meets(confidence, config.gate_auto):
        return entry(
            "suggest",
            SUGGEST,
            f"confidence {confidence:.4g} is below the auto gate {config.gate_auto:g}",
            config.gate_auto,
        )
    # Row 12.
    return entry(
        "apply",
        APPLY,
        f"confidence {confidence:.4g} meets the auto gate {config.gate_auto:g}",
        config.gate_auto,
    )


# ------------------------------------------------------------------------------------ lint


@dataclass(frozen=True)
class Problem:
    """A reference that will fail at run time (rows 5, 7, 8), found before it does."""

    where: str
    message: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"

    def to_json(self) -> dict[str, str]:
        return {"where": self.where, "message": self.message, "reason": self.reason}


def unknown_event(name: str) -> str | None:
    """Why `name` is no GitHub webhook event a delivery can carry, or None when it is one.

    Events with actions are named `<event>.<action>` (`issues.opened`); those without are
    named bare (`push`). The names come from the list shipped with the code
    (`dispatchq.triage.github_events`, generated from githubkit's webhook models).
    """
    event, _, action = name.partition(".")
    if event not in WEBHOOK_EVENTS:
        close = difflib.get_close_matches(event, list(WEBHOOK_EVENTS), n=1)
        hint = f"; did you mean {close[0] + ('.' + action if action else '')!r}?" if close else ""
        return f"{name!r} is not a GitHub webhook event, so the rule never fires{hint}"
    actions = WEBHOOK_EVENTS[event]
    if not actions:
        return None if not action else f"{event!r} has no actions: name it {event!r}, not {name!r}"
    if not action:
        return f"{event!r} deliveries carry an action: name one, such as {event + '.' + actions[0]!r}"
    if action not in actions:
        close = difflib.get_close_matches(action, list(actions), n=1)
        hint = f"did you mean {event + '.' + close[0]!r}? " if close else ""
        return (
            f"{event!r} has no action {action!r}, so the rule never fires; {hint}known: {', '.join(actions)}"
        )
    return None


def lint(config: TriageConfig, executor: SupportsOps, base_dir: Path | None = None) -> list[Problem]:
    """Everything `load_triage` let through that a run would resolve as a suppression.

    For CI: a non-empty list means some rule can never act as written.
    """
    base = Path(base_dir) if base_dir is not None else config.base_dir
    problems: list[Problem] = []
    doubles = {q for q, question in config.questions.items() if question.type in ("noul", "score")}
    for rule in config.rules:
        where = f"triage.rules[{rule.id}]"
        for i, event_name in enumerate(rule.events):
            unknown = unknown_event(event_name)
            if unknown is not None:
                problems.append(Problem(f"{where}.events[{i}]", unknown, UNKNOWN_EVENT))
        if rule.condition is not None:
            for text, literal in rule.condition.int_double_comparisons(doubles):
                problems.append(
                    Problem(
                        f"{where}.if",
                        f"{text} compares an int with a double answer, which cel-python refuses at "
                        f"run time: write {literal}.0",
                        INT_DOUBLE_COMPARISON,
                    )
                )
        for event_name in rule.events:
            for qid in sorted(rule.dependencies):
                if not config.questions[qid].asked_for(event_name):
                    problems.append(
                        Problem(where, f"question {qid!r} is not asked for {event_name}", UNKNOWN_QUESTION)
                    )
        for i, action in enumerate(rule.actions):
            at = f"{where}.actions[{i}]"
            if not executor.supports(action.op):
                problems.append(
                    Problem(at, f"the {config.executor} executor cannot {action.op}", UNSUPPORTED_BY_EXECUTOR)
                )
            if action.template is not None:
                relative = config.templates.get(action.template)
                if relative is None:
                    problems.append(
                        Problem(
                            at, f"template {action.template!r} is not in triage.templates", MISSING_TEMPLATE
                        )
                    )
                elif not (base / relative).is_file():
                    problems.append(
                        Problem(
                            at, f"template {action.template!r}: {relative} does not exist", MISSING_TEMPLATE
                        )
                    )
    return problems
