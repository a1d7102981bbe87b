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
    "PROBABILITY_SUM_TOLERANCE",
    "Answer",
    "AnswerType",
    "describe_gate",
    "margin",
    "meets",
    "min_confidence",
    "noul_gate_as_probability",
    "outside_question",
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


#: A probability map may be off 1 by this much and still count as one (rounding on the wire).
PROBABILITY_SUM_TOLERANCE = 0.01


def outside_question(answer: Answer, question: Any) -> str | None:
    """Why `answer` is not an answer to `question` (the SDK wire form), or None when it is.

    The wire can carry anything: a label not in the criteria, a score outside the levels'
    range, a noul outside [0, 1], a probability map over other labels or not summing to 1.
    Any of these is *no answer*: acting on it would act outside the set that was asked.
    """
    asked = question.get("type") if isinstance(question, dict) else None
    if asked is not None and answer.type != asked:
        return f"asked a {asked}, answered a {answer.type}"
    criteria = question.get("criteria") if isinstance(question, dict) else None
    raw = answer.raw
    if answer.type == "noul":
        p = raw.get("noul")
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= float(p) <= 1.0:
            return f"noul {p!r} is outside [0, 1]"
        return None
    if answer.type == "choice":
        labels = [str(label) for label in criteria] if isinstance(criteria, dict) else None
        if labels is not None and answer.value not in labels:
            return f"choice {answer.value!r} is not one of the criteria ({', '.join(labels)})"
        return _probability_map(raw.get("probabilities"), labels, "choice")
    if answer.type == "score":
        levels = len(criteria) if isinstance(criteria, list) else None
        level = float(answer.value)
        if levels is not None and not 0.0 <= level <= levels - 1:
            return f"score {level:g} is outside the levels' range [0, {levels - 1}]"
        keys = [str(i) for i in range(levels)] if levels is not None else None
        return _probability_map(raw.get("probabilities"), keys, "score")
    return None


def _probability_map(probabilities: Any, keys: list[str] | None, what: str) -> str | None:
    """None when the map (if sent) is over the asked keys, each in [0, 1], summing to ~1."""
    if probabilities is None:
        return None
    if not isinstance(probabilities, dict) or not probabilities:
        return f"{what} probabilities are not a map of numbers"
    total = 0.0
    for key, value in probabilities.items():
        if keys is not None and str(key) not in keys:
            return f"{what} probabilities name {str(key)!r}, which was not asked"
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
            return f"{what} probability of {str(key)!r} is {value!r}, not in [0, 1]"
        total += float(value)
    if not math.isfinite(total) or abs(total - 1.0) > PROBABILITY_SUM_TOLERANCE:
        return f"{what} probabilities sum to {total:.4g}, not 1"
    return None


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
    """How far above (positive) or below (negative) the gate a confidence sits.

    Never -0.0: a confidence that meets its gate exactly (after float error) is `+0`.
    """
    return round(confidence - threshold, _PLACES) + 0.0


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
