"""The tier ladder: where a judgement enters and where it goes when a tier cannot answer.

Pure functions over a `Kind`. The one rule they keep: a judgement only moves *up*
(code -> typed -> session, or to a person), so nothing the code answered is ever
asked of a model, and nothing a typed decision settled reaches a session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dispatchq.core import tiers
from dispatchq.core.answers import Answer, margin, meets, min_confidence
from dispatchq.core.kinds import Kind
from dispatchq.errors import LadderError

__all__ = [
    "TypedDecision",
    "decide_typed",
    "entry_tier",
    "next_tier",
    "priority_of",
    "threshold_for",
]


def entry_tier(kind: Kind) -> str:
    """The cheapest tier that serves the kind; else where it escalates to (a person)."""
    for candidate in tiers.ladder():
        if candidate.serves(kind):
            return candidate.name
    return kind.escalate


def next_tier(kind: Kind, current: str) -> str:
    """Where a judgement goes when `current` cannot answer it: the next tier above that
    serves the kind, else the kind's last rung (`escalate`: a session or a person).
    Always strictly higher: a judgement already at its last rung has nowhere to go."""
    here = tiers.rank(current)
    target = kind.escalate
    for candidate in tiers.ladder():
        if candidate.rank > here and candidate.serves(kind):
            target = candidate.name
            break
    if tiers.rank(target) <= here:
        raise LadderError(f"kind {kind.name}: {current} -> {target} does not move up the ladder")
    return target


def threshold_for(kind: Kind, gate_local: float, gate_external: float) -> float:
    """The confidence band: a write outside the checkout needs more than a local one."""
    return gate_external if kind.effect == "external" else gate_local


@dataclass(frozen=True)
class TypedDecision:
    """What the typed tier concluded for one judgement, before any I/O acts on it."""

    answered: bool
    value: Any = None
    confidence: float | None = None
    threshold: float | None = None
    priority: float | None = None
    why: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)


def priority_of(kind: Kind, answers: dict[str, Answer]) -> float | None:
    """The ordering answer as a number (higher starts sooner). No gate: it never blocks."""
    if kind.order is None or kind.order not in answers:
        return None
    answer = answers[kind.order]
    question = kind.questions[kind.order]
    if question.type == "score":
        return float(answer.value)
    if question.priority is not None:
        return question.priority.get(str(answer.value), 0.0)
    return None


def decide_typed(kind: Kind, answers: dict[str, Answer], threshold: float) -> TypedDecision:
    """Act only inside the band; what falls short moves up with the numbers compared.

    The judgement's confidence is the minimum over `gateOn` (else the answer
    question), never an average: one confident answer must not carry a coin flip.
    """
    priority = priority_of(kind, answers)
    if kind.answer is None:
        # Only an ordering question: the typed tier sets priority and passes it on.
        return TypedDecision(False, priority=priority, why="ordering only: priority set, no answer to give")
    gate = list(kind.gate_questions)
    numbers: dict[str, Any] = {
        "threshold": threshold,
        "confidences": {q: answers[q].confidence for q in gate if q in answers},
    }
    missing = [q for q in [kind.answer, *gate] if q not in answers]
    if missing:
        return TypedDecision(
            False,
            threshold=threshold,
            priority=priority,
            why=f"no answer for {', '.join(dict.fromkeys(missing))}",
            numbers=numbers,
        )
    confidence = min_confidence(answers, gate)
    assert confidence is not None
    numbers["confidence"] = confidence
    numbers["margin"] = margin(confidence, threshold)
    weakest = min(gate, key=lambda q: answers[q].confidence)
    if meets(confidence, threshold):
        return TypedDecision(
            True,
            value=answers[kind.answer].value,
            confidence=confidence,
            threshold=threshold,
            priority=priority,
            why=f"confidence {confidence:.4g} >= {threshold:g}",
            numbers=numbers,
        )
    return TypedDecision(
        False,
        confidence=confidence,
        threshold=threshold,
        priority=priority,
        why=f"confidence {confidence:.4g} < {threshold:g} (weakest: {weakest})",
        numbers=numbers,
    )
