"""The typed tier's provider: TypeSafe's Jev through the real `typesafe-sdk`, and nothing else.

The typed worker must never depend on an answer from here (no key, a failure, a missing
answer: the judgement simply moves up), so this module never raises for provider trouble.
Every call ends in one of four small outcomes the worker can act on without knowing the SDK:

- `Answered`: typed answers (`dispatchq.core.answers.Answer`) per question, the resolved model id,
  the usage numbers, and the questions that got no usable answer (the SDK silently drops
  answer types it does not know; that is "no answer", never a KeyError).
- `Transient`: rate limit, timeout, connection or 5xx *after* the SDK's own short retries,
  with the delay the server advised (seconds) so the worker can re-enqueue without waiting.
- `Permanent`: auth (401/403) or an invalid request (400/404/422, a malformed response):
  retrying cannot help, move up at once.
- `NoKey`: the tier has no key; no request was made.

The key goes to the SDK client and is otherwise held only as a `SecretStr`, to redact it from
every message this module produces; no result, repr or log line carries it.

Batching lives here too (`plan_batches` / `split_outcome`, pure and separately testable):
Jev answers many questions about one state in one request, so judgements that share a state
travel together, question ids namespaced per judgement.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from http import HTTPStatus
from typing import Any, Literal, Protocol, TypeAlias

import httpx2
import typesafe_sdk
from pydantic import SecretStr
from typesafe_sdk import (
    ChoiceAnswer,
    NoulAnswer,
    RetryPolicy,
    ScoreAnswer,
    SystemOneResponse,
    TypeSafeAPIConnectionError,
    TypeSafeAPIError,
    TypeSafeAPIResponseValidationError,
    TypeSafeAPITimeoutError,
    TypeSafeAuthenticationError,
    TypeSafeBadRequestError,
    TypeSafeClient,
    TypeSafeError,
    TypeSafeInternalServerError,
    TypeSafeNotFoundError,
    TypeSafePermissionDeniedError,
    TypeSafeRateLimitError,
    TypeSafeUnprocessableEntityError,
)

from dispatchq.core.answers import Answer, outside_question
from dispatchq.core.judgement import canonical_json
from dispatchq.errors import AnswerError, SettingsError

log = logging.getLogger(__name__)

__all__ = [
    "NAMESPACE_SEPARATOR",
    "REDACTED",
    "Answered",
    "Ask",
    "Batch",
    "JSONState",
    "KeylessProvider",
    "NoKey",
    "Outcome",
    "Permanent",
    "Provider",
    "ProviderOptions",
    "Transient",
    "TypeSafeProvider",
    "Usage",
    "WireQuestion",
    "advised_delay",
    "canonical_state",
    "classify_error",
    "make_provider",
    "merge_outcomes",
    "namespaced",
    "plan_batches",
    "read_answers",
    "read_raw_answers",
    "redact",
    "split_outcome",
]

JSONState: TypeAlias = str | dict[str, Any] | list[Any]
"""The state a judgement's questions are about: text or JSON, as the API accepts it."""

WireQuestion: TypeAlias = Mapping[str, Any]
"""A question in the API's form: `{"type", "instructions", "criteria"}`."""

NAMESPACE_SEPARATOR = "__"
REDACTED = "***"


# --- the key ------------------------------------------------------------------------------
def redact(text: str, secret: str | None) -> str:
    """Remove a secret, in the spellings an error might carry it, from `text`."""
    if not secret:
        return text
    variants = {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1]}
    for variant in sorted(variants, key=len, reverse=True):
        text = text.replace(variant, REDACTED)
    return text


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


# --- options ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProviderOptions:
    """Knobs from the settings object; defaults keep the SDK's own retry short and bounded.

    `retry_budget` caps one call's total time including the SDK's retries; a retry-after
    longer than what is left ends the call at once as `Transient` with that delay, so a worker
    is never held waiting on a rate limit. `request_timeout=None` keeps the SDK default, and
    `compression=None` keeps the SDK's choice (zstd when importable).
    """

    max_retries: int = 2
    retry_budget: float = 15.0
    request_timeout: float | None = None
    backoff_initial: float = 0.5
    backoff_max: float = 2.0
    max_questions_per_request: int = 64
    concurrency: int = 1
    compression: Literal["zstd", False] | None = None

    def __post_init__(self) -> None:
        if self.max_questions_per_request < 1:
            raise ValueError("max_questions_per_request must be at least 1")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")

    def retry_policy(self) -> RetryPolicy:
        """The SDK's default policy (408/429/5xx, connection, timeout; retry-after honoured), bounded."""
        return RetryPolicy(
            max_retries=self.max_retries,
            timeout=self.retry_budget,
            backoff_initial=self.backoff_initial,
            backoff_max=self.backoff_max,
        )


# --- batching (pure) ----------------------------------------------------------------------
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


# --- classification -----------------------------------------------------------------------
def advised_delay(headers: httpx2.Headers | Mapping[str, str] | None) -> float | None:
    """Seconds from `retry-after-ms`, else `retry-after` (seconds or an HTTP date); None if absent."""
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            ms = float(raw_ms.strip())
        except ValueError:
            ms = math.nan
        if math.isfinite(ms) and ms >= 0:
            return ms / 1000
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw.strip())
    except ValueError:
        try:
            return max(0.0, parsedate_to_datetime(raw).timestamp() - time.time())
        except (TypeError, ValueError, OverflowError):
            return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def classify_error(error: TypeSafeError, api_key: str | None) -> Transient | Permanent:
    """Sort an SDK error (after its own retries) into what the worker does next, by its class.

    The rate limit's delay is the SDK's own `retry_after_ms`. The SDK parses advice only for
    429; a 5xx or 408 that advises a delay is read from the error's public `headers`. A 408
    has no class of its own (the SDK's retry policy treats it as transient, so do we).
    """
    message = redact(f"{type(error).__name__}: {error}", api_key)
    if isinstance(error, TypeSafeAPITimeoutError):
        return Transient("timeout", message)
    if isinstance(error, TypeSafeAPIConnectionError):
        return Transient("connection", message)
    if isinstance(error, TypeSafeAPIResponseValidationError):
        return Permanent("bad_response", message, error.status)
    if isinstance(error, TypeSafeRateLimitError):
        delay = error.retry_after_ms / 1000 if error.retry_after_ms is not None else None
        return Transient("rate_limit", message, delay, error.status)
    if isinstance(error, TypeSafeInternalServerError):
        return Transient("server", message, advised_delay(error.headers), error.status)
    if isinstance(error, TypeSafeAuthenticationError | TypeSafePermissionDeniedError):
        return Permanent("auth", message, error.status)
    if isinstance(error, TypeSafeBadRequestError | TypeSafeNotFoundError | TypeSafeUnprocessableEntityError):
        return Permanent("invalid", message, error.status)
    if isinstance(error, TypeSafeAPIError) and error.status == HTTPStatus.REQUEST_TIMEOUT:
        return Transient("timeout", message, advised_delay(error.headers), error.status)
    status = error.status if isinstance(error, TypeSafeAPIError) else None
    return Permanent("invalid", message, status)


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


def _collect(
    wires: Mapping[str, Any], questions: Mapping[str, WireQuestion]
) -> tuple[dict[str, Answer], dict[str, str]]:
    answers: dict[str, Answer] = {}
    missing: dict[str, str] = {}
    for qid, question in questions.items():
        read = _read_one(qid, wires.get(qid), question)
        if isinstance(read, Answer):
            answers[qid] = read
        else:
            missing[qid] = read
    return answers, missing


def _wire_of(answer: Any) -> dict[str, Any]:
    """The SDK's typed answer as the wire fields dispatchq keeps, read off its attributes.

    Once, with no `model_dump` round trip; `Answer.from_wire` then only checks the ranges
    the SDK does not (a probability in [0, 1]). Any other type (a box: never asked) keeps
    only its type, so it reads as a mistyped answer.
    """
    if isinstance(answer, NoulAnswer):
        return {"type": "noul", "noul": answer.noul}
    if isinstance(answer, ChoiceAnswer):
        wire: dict[str, Any] = {"type": "choice", "choice": answer.choice, "confidence": answer.confidence}
        wire["probabilities"] = dict(answer.probabilities)
        return wire
    if isinstance(answer, ScoreAnswer):
        return {
            "type": "score",
            "score": answer.score,
            "confidence": answer.confidence,
            "legend": {str(level): text for level, text in answer.legend.items()},
            "probabilities": {str(level): p for level, p in answer.probabilities.items()},
        }
    return {"type": getattr(answer, "type", None)}


def read_answers(response: SystemOneResponse, questions: Mapping[str, WireQuestion]) -> Answered:
    """Typed answers for the asked questions; anything absent, mistyped, malformed or outside
    the question (a label not in the criteria, a score off the levels) is missing.

    The SDK drops answer types it does not model, so absence is normal and never a KeyError.
    """
    wires = {qid: _wire_of(a) for qid, a in response.answers.items()}
    answers, missing = _collect(wires, questions)
    usage = Usage(response.usage.input_tokens, response.usage.output_tokens)
    try:
        request_id: str | None = response.request_id
    except TypeSafeError:  # the server sent none
        request_id = None
    return Answered(answers, response.model, usage, missing, (request_id,) if request_id else ())


def read_raw_answers(
    error: TypeSafeAPIResponseValidationError, questions: Mapping[str, WireQuestion], model: str | None
) -> Answered | None:
    """The answers of a response the SDK refused as a whole, read per question; None if unreadable.

    One malformed answer (a choice without `confidence`) makes the SDK refuse the whole
    response; the other questions' answers are still good. The error carries the decoded
    body (`error.body`): when it is an object with an `answers` object, each question is
    read and checked on its own, and only the broken ones are missing (with the SDK's path
    named). A body that is not such an object (HTML on a 200) has no answer to read.
    """
    body = error.body
    if not isinstance(body, dict) or not isinstance(body.get("answers"), dict):
        return None
    answers, missing = _collect(body["answers"], questions)
    for qid in missing:
        if error.field_path.startswith(f"answers.{qid}."):
            missing[qid] = f"{missing[qid]} (the SDK refused the response at {error.field_path!r})"
    usage_raw: dict[str, Any] = body["usage"] if isinstance(body.get("usage"), dict) else {}

    def count(name: str) -> int | None:
        value = usage_raw.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    resolved = body.get("model") if isinstance(body.get("model"), str) else model
    request_id = error.request_id
    return Answered(
        answers,
        resolved or "",
        Usage(count("input_tokens"), count("output_tokens")),
        missing,
        (request_id,) if request_id else (),
    )


# --- providers ----------------------------------------------------------------------------
class Provider(Protocol):
    """What the typed worker calls; a keyless provider and the real one look the same."""

    @property
    def keyless(self) -> bool: ...

    @property
    def requested_model(self) -> str | None: ...

    @property
    def calls(self) -> int: ...

    def ask(self, state: JSONState, questions: Mapping[str, WireQuestion]) -> Outcome: ...

    def ask_many(self, asks: Sequence[Ask]) -> dict[str, Outcome]: ...

    def close(self) -> None: ...


class KeylessProvider:
    """No key: answers nothing, makes no request, so every judgement moves on unchanged."""

    keyless = True
    requested_model: str | None = None
    calls = 0

    def ask(self, state: JSONState, questions: Mapping[str, WireQuestion]) -> Outcome:
        return NoKey()

    def ask_many(self, asks: Sequence[Ask]) -> dict[str, Outcome]:
        return {ask.judgement_id: NoKey() for ask in asks}

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> KeylessProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "KeylessProvider()"


class TypeSafeProvider:
    """The real provider: one SDK client, its bounded retry policy, batching and classification."""

    keyless = False

    def __init__(
        self,
        api_key: str,
        *,
        base_url: str | None = None,
        model: str | None = None,
        options: ProviderOptions | None = None,
    ) -> None:
        """Build the SDK client; None for `base_url`/`model` leaves the SDK's own variables in charge."""
        self._options = options or ProviderOptions()
        # Held only to redact it from messages; a SecretStr keeps it out of vars() dumps and
        # tracebacks that print locals.
        self._key = SecretStr(api_key)
        try:
            self._client = TypeSafeClient(
                api_key=api_key,
                base_url=base_url,
                model=model,
                retry=self._options.retry_policy(),
                timeout=self._options.request_timeout,
                compression=self._options.compression,
            )
        except TypeSafeError as error:
            raise SettingsError(f"TypeSafe client: {redact(str(error), api_key)}") from None
        self._calls = 0
        self._calls_lock = threading.Lock()
        self._requested_model = model or _sdk_default_model()

    @property
    def requested_model(self) -> str | None:
        """The model name sent in requests (the decision cache keys on it, not the resolved id)."""
        return self._requested_model

    @property
    def calls(self) -> int:
        """`system_one` calls made (the SDK's internal retries are not counted)."""
        return self._calls

    @property
    def options(self) -> ProviderOptions:
        return self._options

    def ask(self, state: JSONState, questions: Mapping[str, WireQuestion]) -> Outcome:
        """One request about one state, with the caller's own question ids."""
        with self._calls_lock:
            self._calls += 1
        try:
            # Wire dicts, not the SDK's typed models: the SDK validates them itself.
            wire: Any = dict(questions)
            response = self._client.system_one(state=state, questions=wire, model=self._requested_model)
        except TypeSafeAPIResponseValidationError as error:
            partial = read_raw_answers(error, questions, self._requested_model)
            if partial is not None:
                key = self._key.get_secret_value()
                log.warning("typed provider: %s; answers read one by one", redact(str(error), key))
                return partial
            outcome = classify_error(error, self._key.get_secret_value())
            log.warning("typed provider %s: %s", outcome.reason, outcome.message)
            return outcome
        except TypeSafeError as error:
            outcome = classify_error(error, self._key.get_secret_value())
            log.warning("typed provider %s: %s", outcome.reason, outcome.message)
            return outcome
        return read_answers(response, questions)

    def ask_many(self, asks: Sequence[Ask]) -> dict[str, Outcome]:
        """Every judgement's outcome, asking as few requests as shared states allow."""
        batches = plan_batches(asks, self._options.max_questions_per_request)
        if self._options.concurrency > 1 and len(batches) > 1:
            with ThreadPoolExecutor(max_workers=min(self._options.concurrency, len(batches))) as pool:
                results = list(pool.map(lambda b: self.ask(b.state, b.questions), batches))
        else:
            results = [self.ask(b.state, b.questions) for b in batches]
        collected: dict[str, list[Outcome]] = {ask.judgement_id: [] for ask in asks}
        for batch, outcome in zip(batches, results, strict=True):
            for jid, part in split_outcome(batch, outcome).items():
                collected[jid].append(part)
        return {jid: merge_outcomes(parts) for jid, parts in collected.items()}

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> TypeSafeProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TypeSafeProvider(model={self._requested_model!r}, key={REDACTED})"


def _sdk_default_model() -> str:
    """The SDK's published default model: with no model set (the settings read
    TYPESAFE_DEFAULT_MODEL), this is the one requested, and every request names it."""
    return typesafe_sdk.constants.DEFAULT_MODEL


def make_provider(
    api_key: str | SecretStr | None,
    *,
    base_url: str | None = None,
    model: str | None = None,
    options: ProviderOptions | None = None,
) -> TypeSafeProvider | KeylessProvider:
    """The typed tier's provider: keyless when there is no key, else the real one.

    The key is what the settings read (`TYPESAFE_API_KEY` or the file `TYPESAFE_API_KEY_FILE`
    names); a `SecretStr` is unwrapped only here, at the client's door.
    """
    key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
    if key is None or not key.strip():
        return KeylessProvider()
    return TypeSafeProvider(key.strip(), base_url=base_url, model=model, options=options)
