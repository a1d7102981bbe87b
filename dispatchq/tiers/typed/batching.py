"""The typed tier's pure half: what is asked, how asks travel together, what comes back.

No SDK and no HTTP here (the import contract holds it): these are the rules of batching,
tested as functions, and the outcomes every provider (`provider.TypeSafeProvider`, the
keyless one, a test's fake) returns, so code that only talks to a provider never loads
the SDK. Every call ends in one of four small outcomes the worker can act on:

- `Answered`: typed answers (`dispatchq.core.answers.Answer`) per question, the resolved model id,
  the usage numbers, and the questions that got no usable answer (the SDK silently drops
  answer types it does not know; that is "no answer", never a KeyError).
- `Transient`: rate limit, timeout, connection or 5xx *after* the SDK's own short retries,
  with the delay the server advised (seconds) so the worker can re-enqueue without waiting.
- `Permanent`: auth (401/403) or an invalid request (400/404/422, a malformed response):
  retrying cannot help, move up at once.
- `NoKey`: the tier has no key; no request was made.

Jev answers many questions about one state in one request, so judgements that share a
state travel together (`plan_batches` / `split_outcome` / `merge_outcomes`), question ids
namespaced per judgement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from dispatchq.core.answers import Answer, outside_question
from dispatchq.core.judgement import canonical_json
from dispatchq.errors import AnswerError

__all__ = [
    "NAMESPACE_SEPARATOR",
    "Answered",
    "Ask",
    "Batch",
    "JSONState",
    "NoKey",
    "Outcome",
    "Permanent",
    "PermanentReason",
    "Transient",
    "TransientReason",
    "Usage",
    "WireQuestion",
    "canonical_state",
    "collect_answers",
    "merge_outcomes",
    "namespaced",
    "plan_batches",
    "split_outcome",
]

JSONState: TypeAlias = str | dict[str, Any] | list[Any]
"""The state a judgement's questions are about: text or JSON, as the API accepts it."""

WireQuestion: TypeAlias = Mapping[str, Any]
"""A question in the API's form: `{"type", "instructions", "criteria"}`."""

NAMESPACE_SEPARATOR = "__"


# --- outcomes -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Usage:
    """Token counts of the request(s) that carried an answer (shared by a batch's judgements)."""

    input_tokens: int | None = None
    output_tokens: int | None = None

    def __add__(self, other: Usage) -> Usage:
        def add(a: int | None, b: int | None) -> int | None:
            return None if a is None and b is None else (a or 0) + (b or 0)

        return Usage(add(self.input_tokens, other.input_tokens), add(self.output_tokens, other.output_tokens))


@dataclass(frozen=True)
class Answered:
    """The provider answered. Questions in `missing` have no usable answer (reason as value)."""

    answers: dict[str, Answer]
    model: str
    usage: Usage = field(default_factory=Usage)
    missing: dict[str, str] = field(default_factory=dict)
    request_ids: tuple[str, ...] = ()
    kind: Literal["answered"] = "answered"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "answers": {qid: a.to_json() for qid, a in self.answers.items()},
            "model": self.model,
            "usage": {"input_tokens": self.usage.input_tokens, "output_tokens": self.usage.output_tokens},
            "missing": dict(self.missing),
            "request_ids": list(self.request_ids),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Answered:
        usage = data.get("usage") or {}
        return cls(
            answers={qid: Answer.from_json(a) for qid, a in data["answers"].items()},
            model=str(data["model"]),
            usage=Usage(usage.get("input_tokens"), usage.get("output_tokens")),
            missing=dict(data.get("missing", {})),
            request_ids=tuple(data.get("request_ids", ())),
        )


TransientReason = Literal["rate_limit", "timeout", "connection", "server"]
PermanentReason = Literal["auth", "invalid", "bad_response"]


@dataclass(frozen=True)
class Transient:
    """Trouble that may pass: retry after `retry_after` seconds (None: the server gave no advice)."""

    reason: TransientReason
    message: str
    retry_after: float | None = None
    status: int | None = None
    kind: Literal["transient"] = "transient"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "reason": self.reason,
            "message": self.message,
            "retry_after": self.retry_after,
            "status": self.status,
        }


@dataclass(frozen=True)
class Permanent:
    """Trouble that retrying cannot fix: the judgement moves up at once, this in its trail."""

    reason: PermanentReason
    message: str
    status: int | None = None
    kind: Literal["permanent"] = "permanent"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, "message": self.message, "status": self.status}


@dataclass(frozen=True)
class NoKey:
    """The typed tier has no key: nothing was asked, nothing is answered."""

    kind: Literal["keyless"] = "keyless"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind}


Outcome: TypeAlias = Answered | Transient | Permanent | NoKey


# --- batching -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Ask:
    """One judgement's questions about one state."""

    judgement_id: str
    state: JSONState
    questions: Mapping[str, WireQuestion]


@dataclass(frozen=True)
class Batch:
    """One `system_one` request: a shared state and namespaced questions, with the way back."""

    state: JSONState
    questions: dict[str, dict[str, Any]]
    routes: dict[str, tuple[str, str]]
    """Wire question id -> (judgement id, the judgement's own question id)."""

    @property
    def judgement_ids(self) -> list[str]:
        return list(dict.fromkeys(jid for jid, _ in self.routes.values()))


def canonical_state(state: JSONState) -> str:
    """The state as canonical JSON, so equal states compare equal however they were built.

    The one canonical spelling (`dispatchq.core.judgement.canonical_json`): the same that
    keys the judgement, so two judgements share a request exactly when their states hash alike.
    """
    return canonical_json(state)


def namespaced(index: int, question_id: str) -> str:
    """`j<index>__<qid>`: the batch position, not the judgement id, keeps wire ids short and plain.

    The API's wire model puts no pattern on question names (any string key); ids built from
    `[A-Za-z0-9_]` plus the judgement's own id stay portable.
    """
    return f"j{index}{NAMESPACE_SEPARATOR}{question_id}"


def plan_batches(asks: Sequence[Ask], max_questions: int) -> list[Batch]:
    """Group asks that share a state into requests of at most `max_questions` questions.

    Judgements are packed whole, in arrival order within each state; a judgement with more
    questions than the cap is split over several requests of its own (`merge_outcomes` joins
    them back). k judgements on one state within the cap cost one request.
    """
    if max_questions < 1:
        raise ValueError("max_questions must be at least 1")
    seen: set[str] = set()
    groups: dict[str, list[Ask]] = {}
    for ask in asks:
        if ask.judgement_id in seen:
            raise ValueError(f"judgement {ask.judgement_id!r} appears twice in one batch")
        seen.add(ask.judgement_id)
        if not ask.questions:
            raise ValueError(f"judgement {ask.judgement_id!r} asks no questions")
        try:
            key = canonical_state(ask.state)
        except (TypeError, ValueError) as error:
            raise ValueError(f"judgement {ask.judgement_id!r}: state is not JSON: {error}") from None
        groups.setdefault(key, []).append(ask)

    batches: list[Batch] = []
    for group in groups.values():
        current: list[Ask] = []
        size = 0
        for ask in group:
            n = len(ask.questions)
            if n > max_questions:
                batches.extend(_chunks(ask, max_questions))
                continue
            if current and size + n > max_questions:
                batches.append(_pack(current))
                current, size = [], 0
            current.append(ask)
            size += n
        if current:
            batches.append(_pack(current))
    return batches


def _pack(asks: Sequence[Ask]) -> Batch:
    questions: dict[str, dict[str, Any]] = {}
    routes: dict[str, tuple[str, str]] = {}
    for index, ask in enumerate(asks):
        for qid, question in ask.questions.items():
            wire_id = namespaced(index, qid)
            questions[wire_id] = dict(question)
            routes[wire_id] = (ask.judgement_id, qid)
    return Batch(asks[0].state, questions, routes)


def _chunks(ask: Ask, max_questions: int) -> list[Batch]:
    items = list(ask.questions.items())
    return [
        _pack([Ask(ask.judgement_id, ask.state, dict(items[start : start + max_questions]))])
        for start in range(0, len(items), max_questions)
    ]


def split_outcome(batch: Batch, outcome: Outcome) -> dict[str, Outcome]:
    """One request's outcome, per judgement, with each judgement's own question ids back."""
    if not isinstance(outcome, Answered):
        return dict.fromkeys(batch.judgement_ids, outcome)
    per: dict[str, tuple[dict[str, Answer], dict[str, str]]] = {jid: ({}, {}) for jid in batch.judgement_ids}
    for wire_id, (jid, qid) in batch.routes.items():
        answers, missing = per[jid]
        answer = outcome.answers.get(wire_id)
        if answer is not None:
            answers[qid] = Answer(qid, answer.type, answer.value, answer.confidence, answer.raw)
        else:
            # The cause in the judgement's own terms: `j1__area` is the batch's name for `area`.
            missing[qid] = outcome.missing.get(wire_id, "no answer in the response").replace(wire_id, qid)
    return {
        jid: Answered(answers, outcome.model, outcome.usage, missing, outcome.request_ids)
        for jid, (answers, missing) in per.items()
    }


def merge_outcomes(outcomes: Sequence[Outcome]) -> Outcome:
    """One judgement's outcome from the requests its questions were split over.

    The worst wins (no key, then permanent, then transient with the longest advised delay):
    a judgement acts on all its questions or none.
    """
    if not outcomes:
        raise ValueError("nothing to merge")
    if len(outcomes) == 1:
        return outcomes[0]
    for kind in (NoKey, Permanent):
        for outcome in outcomes:
            if isinstance(outcome, kind):
                return outcome
    transients = [o for o in outcomes if isinstance(o, Transient)]
    if transients:
        delays = [t.retry_after for t in transients if t.retry_after is not None]
        first = transients[0]
        return Transient(first.reason, first.message, max(delays) if delays else None, first.status)
    answered = [o for o in outcomes if isinstance(o, Answered)]
    usage = Usage()
    for item in answered:
        usage = usage + item.usage
    return Answered(
        answers={qid: a for item in answered for qid, a in item.answers.items()},
        model=answered[0].model,
        usage=usage,
        missing={qid: why for item in answered for qid, why in item.missing.items()},
        request_ids=tuple(rid for item in answered for rid in item.request_ids),
    )


# --- reading answers ----------------------------------------------------------------------
def _read_one(qid: str, wire: Any, question: WireQuestion) -> Answer | str:
    """One wire answer checked against the question it answers: the Answer, or why it is none."""
    if not isinstance(wire, dict):
        return "no answer in the response (absent, or a type this SDK does not know)"
    asked = question.get("type")
    if wire.get("type") != asked:
        return f"asked {asked!r}, answered {wire.get('type')!r}"
    try:
        answer = Answer.from_wire(qid, wire)
    except AnswerError as error:
        return str(error)
    outside = outside_question(answer, dict(question))
    return answer if outside is None else f"outside the question: {outside}"


def collect_answers(
    wires: Mapping[str, Any], questions: Mapping[str, WireQuestion]
) -> tuple[dict[str, Answer], dict[str, str]]:
    """Each asked question's answer from wire dicts, or why it has none (the pure part of
    reading a response: the provider hands over the wire form, from the SDK's models or
    from a body the SDK refused)."""
    answers: dict[str, Answer] = {}
    missing: dict[str, str] = {}
    for qid, question in questions.items():
        read = _read_one(qid, wires.get(qid), question)
        if isinstance(read, Answer):
            answers[qid] = read
        else:
            missing[qid] = read
    return answers, missing
