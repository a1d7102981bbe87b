"""Typed answers and the confidence band, with no I/O.

The typed tier and the rules engine both read answers from TypeSafe's Jev. Keeping the
conversion from the wire form and the gate comparison here means one definition of
"confident enough" for the whole system, tested without a network.

Answer types (the SDK's wire shapes):

- ``noul``: ``{"type": "noul", "noul": p}``; only a probability of yes. The value is
  ``p >= 0.5`` and the confidence is derived as ``|2p - 1|`` (0.5 is a coin flip).
- ``choice``: the label plus a reported confidence and per-label probabilities.
- ``score``: the probability-weighted *fractional* level plus a reported confidence.
  Never rounded: 1.6 sits between two levels, and rounding would move a threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from dispatchq.errors import AnswerError

__all__ = [
    "ANSWER_TYPES",
    "Answer",
    "AnswerType",
    "describe_gate",
    "margin",
    "meets",
    "min_confidence",
    "noul_gate_as_probability",
    "wire_question",
]

AnswerType = Literal["noul", "choice", "score"]
ANSWER_TYPES: tuple[AnswerType, ...] = ("noul", "choice", "score")

# Thresholds are compared after rounding to this many decimal places, so that
# |2*0.8 - 1| (0.6000000000000001) acts at 0.6 and |2*0.16 - 1| acts at 0.68.
_PLACES = 9


@dataclass(frozen=True)
class Answer:
    """One question's answer, normalised across the three types."""

    question: str
    type: AnswerType
    value: bool | str | float
    confidence: float
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def p(self) -> float | None:
        """The probability of yes, for a noul; None for the other types."""
        return float(self.raw["noul"]) if self.type == "noul" else None

    @property
    def expression_value(self) -> float | str:
        """What a rules expression sees: noul p as a double, the label, the fractional level."""
        if self.type == "noul":
            return float(self.raw["noul"])
        if self.type == "score":
            return float(self.value)
        return str(self.value)

    @classmethod
    def from_wire(cls, question: str, wire: dict[str, Any]) -> Answer:
        """Read the SDK's JSON form of an answer; raise AnswerError naming what is wrong."""
        if not isinstance(wire, dict):
            raise AnswerError(f"answer {question!r} is not an object")
        kind = wire.get("type")
        try:
            if kind == "noul":
                p = _probability(wire["noul"], f"{question}.noul")
                return cls(question, "noul", p >= 0.5, abs(2 * p - 1), dict(wire))
            if kind == "choice":
                label = wire["choice"]
                if not isinstance(label, str):
                    raise AnswerError(f"answer {question!r}: choice must be a string")
                conf = _probability(wire["confidence"], f"{question}.confidence")
                return cls(question, "choice", label, conf, dict(wire))
            if kind == "score":
                level = wire["score"]
                if isinstance(level, bool) or not isinstance(level, int | float) or not math.isfinite(level):
                    raise AnswerError(f"answer {question!r}: score must be a finite number")
                conf = _probability(wire["confidence"], f"{question}.confidence")
                return cls(question, "score", float(level), conf, dict(wire))
        except KeyError as missing:
            raise AnswerError(f"answer {question!r} of type {kind!r} lacks {missing.args[0]!r}") from None
        raise AnswerError(f"answer {question!r} has unknown type {kind!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "type": self.type,
            "value": self.value,
            "confidence": self.confidence,
            "raw": self.raw,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Answer:
        return cls(
            data["question"], data["type"], data["value"], float(data["confidence"]), data.get("raw", {})
        )


def _probability(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
        raise AnswerError(f"{where} must be a number between 0 and 1, got {value!r}")
    return float(value)


def wire_question(answer_type: str, instructions: Any = None, criteria: Any = None) -> dict[str, Any]:
    """A question as the SDK sends it (`QuestionModel`): only the keys that are set."""
    out: dict[str, Any] = {"type": answer_type}
    if instructions is not None:
        out["instructions"] = instructions
    if criteria is not None:
        out["criteria"] = criteria
    return out


def meets(confidence: float, threshold: float) -> bool:
    """Inclusive gate comparison, robust to float error in derived confidences."""
    return round(confidence, _PLACES) >= round(threshold, _PLACES)


def margin(confidence: float, threshold: float) -> float:
    """How far above (positive) or below (negative) the gate a confidence sits."""
    return round(confidence - threshold, _PLACES)


def min_confidence(answers: dict[str, Answer], questions: list[str]) -> float | None:
    """The weakest confidence over `questions`: a rule is as sure as its least sure input.

    Returns None when any of the questions has no answer (the caller decides what a
    missing answer means: escalate, `no_answers`, ...). An empty list is
    unconditional: confidence 1.
    """
    if not questions:
        return 1.0
    if any(q not in answers for q in questions):
        return None
    return min(answers[q].confidence for q in questions)


def noul_gate_as_probability(threshold: float) -> tuple[float, float]:
    """A noul confidence gate restated as probabilities: act when p >= hi or p <= lo.

    0.6 <=> p >= 0.8 or p <= 0.2. People reason in p; the gate is defined on |2p-1|.
    """
    hi = round((1 + threshold) / 2, _PLACES)
    lo = round((1 - threshold) / 2, _PLACES)
    return hi, lo


def describe_gate(answer_type: str, threshold: float) -> str:
    """Human form of a gate, showing noul gates also as probabilities."""
    if answer_type == "noul":
        hi, lo = noul_gate_as_probability(threshold)
        return f"confidence >= {threshold:g} (p >= {hi:g} or p <= {lo:g})"
    return f"confidence >= {threshold:g}"
