"""The typed tier's provider: TypeSafe's Jev through the real `typesafe-sdk`, and nothing else.

The only module of dispatchq that imports `typesafe_sdk` or `httpx2` (a test holds it):
everything else talks to a `protocol.Provider` and reads `batching`'s outcomes.

The typed worker must never depend on an answer from here (no key, a failure, a missing
answer: the judgement simply moves up), so this module never raises for provider trouble:
every call ends in one of `batching`'s four outcomes (`Answered`, `Transient`, `Permanent`,
`NoKey`), the SDK's errors sorted by `classify_error`.

The key goes to the SDK client and is otherwise held only as a `SecretStr`, to redact it from
every message this module produces; no result, repr or log line carries it.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from email.utils import parsedate_to_datetime
from http import HTTPStatus
from typing import Any

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

from dispatchq.errors import SettingsError
from dispatchq.tiers.typed.batching import (
    Answered,
    Ask,
    JSONState,
    Outcome,
    Permanent,
    Transient,
    Usage,
    WireQuestion,
    collect_answers,
    merge_outcomes,
    plan_batches,
    split_outcome,
)
from dispatchq.tiers.typed.protocol import KeylessProvider, ProviderOptions

log = logging.getLogger(__name__)

__all__ = [
    "REDACTED",
    "TypeSafeProvider",
    "advised_delay",
    "classify_error",
    "make_provider",
    "read_answers",
    "read_raw_answers",
    "redact",
    "retry_policy",
]

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


# --- options ------------------------------------------------------------------------------
def retry_policy(options: ProviderOptions) -> RetryPolicy:
    """The SDK's default policy (408/429/5xx, connection, timeout; retry-after honoured), bounded."""
    return RetryPolicy(
        max_retries=options.max_retries,
        timeout=options.retry_budget,
        backoff_initial=options.backoff_initial,
        backoff_max=options.backoff_max,
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
    answers, missing = collect_answers(wires, questions)
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
    answers, missing = collect_answers(body["answers"], questions)
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
                retry=retry_policy(self._options),
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
