"""The typed tier: fixed-set judgements answered by TypeSafe's Jev, acted on only inside the band.

What falls short is not an error: it moves up (to a session, or to a person) with the
numbers compared in its trail. No key, or provider trouble, changes nothing but cost:
every judgement moves on exactly as if the tier did not exist, so no path ever depends
on an answer this tier gave.

Judgements of one RQ job that share a state cost one provider request (Jev answers
many questions about one state at once). Answers are cached under the judgement's
content key plus the requested model, so a re-delivered judgement makes no request.

The provider is reached through `protocol.Provider`; `provider_for` is where the real one
(`provider.make_provider`, the SDK) is built, once per process.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from dispatchq.core.answers import describe_gate
from dispatchq.core.judgement import TrailEntry, state_digest
from dispatchq.core.ladder import decide_typed, threshold_for
from dispatchq.queue.dispatch import Moves
from dispatchq.queue.scheduler import schedule_typed_retry
from dispatchq.storage.typed import TypedStorage
from dispatchq.tiers.typed.batching import Answered, Ask, NoKey, Outcome, Permanent, Transient
from dispatchq.tiers.typed.protocol import Provider, ProviderOptions
from dispatchq.tiers.typed.provider import make_provider
from dispatchq.triage.engine import Ask as TriageAsk
from dispatchq.triage.engine import AskResult

if TYPE_CHECKING:
    from dispatchq.core.kinds import Kind
    from dispatchq.runtime import Runtime
    from dispatchq.storage.store import Claimed

__all__ = ["KEYLESS_WHY", "SIBLING_CAP", "process_batch", "provider_ask", "provider_for"]

KEYLESS_WHY = "no TypeSafe key: the typed tier answers nothing"


def provider_for(runtime: Runtime) -> Provider:
    """One provider (one HTTP connection pool) per process."""
    provider = runtime.parts.get("typed_provider")
    if provider is None:
        settings = runtime.settings
        provider = make_provider(
            settings.typesafe_api_key,
            base_url=settings.typesafe_base_url,
            model=settings.typesafe_default_model,
            options=ProviderOptions(
                request_timeout=settings.typed_timeout,
                max_questions_per_request=settings.typed_max_questions,
                concurrency=settings.typed_concurrency,
            ),
        )
        runtime.parts["typed_provider"] = provider
    return cast("Provider", provider)


def _cache_get(storage: TypedStorage, content_key: str, model: str | None) -> Answered | None:
    if model is None:
        return None
    cached = storage.cached_answers(content_key, model)
    return Answered.from_json(cached) if cached else None


def _cache_put(
    storage: TypedStorage, content_key: str, model: str | None, answered: Answered, ttl: int
) -> None:
    # Only complete answers are cached: a missing answer, an error or a keyless run
    # must be asked again next time, not remembered.
    if model is None or answered.missing:
        return
    # Not the record's TTL: a judgement re-delivered after its record expired (so no
    # longer a live duplicate) is exactly what the cache is for.
    storage.cache_answers(content_key, model, answered.to_json(), ttl)


def _host(runtime: Runtime, claimed: Claimed) -> str | None:
    return runtime.settings.host if (claimed.input.get("context") or {}).get("checkout") else None


def _decide(
    runtime: Runtime,
    moves: Moves,
    claimed: Claimed,
    kind: Kind,
    answered: Answered,
    *,
    cached: bool,
    model: str | None,
) -> None:
    settings = runtime.settings
    threshold = threshold_for(kind, settings.gate_local, settings.gate_external)
    decision = decide_typed(kind, answered.answers, threshold)
    raw = {
        "answers": {qid: a.to_json() for qid, a in answered.answers.items()},
        "missing": answered.missing,
        "model": answered.model,
        "requested_model": model,
        "cached": cached,
        "numbers": decision.numbers,
    }
    extra: dict[str, Any] = {"cached": cached, "numbers": decision.numbers}
    if kind.answer and decision.threshold is not None:
        # The gate is on `gateOn` (else the answer question): the p form only when all are nouls.
        types = {kind.questions[q].type for q in kind.gate_questions if q in kind.questions}
        extra["gate"] = describe_gate("noul" if types == {"noul"} else "confidence", decision.threshold)
    host = _host(runtime, claimed)
    why = decision.why
    if not decision.answered and answered.missing and why.startswith("no answer for"):
        # The cause, not only the fact: "no answer for area (area: choice 'zzz' is not one ...)".
        why += " (" + "; ".join(f"{q}: {r}" for q, r in answered.missing.items()) + ")"
    if decision.answered:
        moves.answer(
            claimed.id,
            "typed",
            decision.value,
            why,
            confidence=decision.confidence,
            raw=raw,
            **extra,
        )
    else:
        fields: dict[str, Any] = {"raw": raw}
        if decision.confidence is not None:
            fields["confidence"] = decision.confidence
        moves.move_up(
            claimed.id,
            kind,
            "typed",
            why,
            host=host,
            priority=decision.priority,
            fields=fields,
            **extra,
        )


#: At most this many extra judgements are taken from other jobs' batches at once.
SIBLING_CAP = 5000


def _claim_siblings(runtime: Runtime, storage: TypedStorage, claimed: list[Claimed]) -> list[Claimed]:
    """Also take waiting judgements (from any job) that share a state with these.

    Jev answers many questions about one state in one request, so k judgements on one
    state should cost one request even when they arrived in different RQ jobs. Their
    own jobs later find them taken and do nothing.
    """
    digests = {state_digest(c.input.get("state")) for c in claimed}
    mine = {c.id for c in claimed}
    extra = sorted(storage.waiting_on(digests, SIBLING_CAP) - mine)
    siblings = runtime.storage.records.claim(extra[:SIBLING_CAP], "typed", strict=True) if extra else []
    storage.stop_waiting(digests, [c.id for c in (*claimed, *siblings)])
    return siblings


def _still_carried(storage: TypedStorage, ids: Sequence[str], job_id: str | None) -> list[str]:
    """The ids whose record still names the running RQ job as the one that carries it.

    Another job may have taken a judgement as a sibling and, on provider trouble, put it
    under a scheduled retry job: its original job must leave it to wait for the advised
    delay instead of asking again at once.
    """
    if job_id is None:  # called outside RQ (tests, benchmarks): the caller owns the ids
        return list(ids)
    owners = storage.carrying_jobs(ids)
    return [jid for jid, owner in zip(ids, owners, strict=True) if not owner or owner == job_id]


def process_batch(runtime: Runtime, ids: Sequence[str], *, job_id: str | None = None) -> int:
    """Ask the provider about one job's judgements (batched by state) and act on the band.

    `job_id` is the RQ job carrying `ids` (the entry point `jobs.tiers.typed` passes it);
    None outside RQ, where the caller owns every id.
    """
    storage = runtime.storage.typed
    claimed = runtime.storage.records.claim(_still_carried(storage, ids, job_id), "typed")
    if not claimed:
        return 0
    claimed += _claim_siblings(runtime, storage, claimed)
    provider = provider_for(runtime)
    moves = Moves()
    asks, kinds = _answer_or_ask(runtime, storage, provider, moves, claimed)
    if provider.keyless:  # `dispatchq status` reports the tier keyless while this is set
        storage.note_keyless(runtime.settings.host)
    else:
        storage.clear_keyless(runtime.settings.host)
    retries: dict[float, list[str]] = {}
    if asks:
        before = provider.calls
        outcomes = provider.ask_many(asks)
        storage.count_requests(provider.calls - before)
        by_id = {c.id: c for c in claimed}
        for jid, outcome in outcomes.items():
            delay = _act(runtime, storage, moves, by_id[jid], kinds[jid], outcome, provider.requested_model)
            if delay is not None:
                retries.setdefault(round(delay, 3), []).append(jid)
    runtime.dispatcher.commit(moves)
    for delay, jids in retries.items():
        _retry_later(runtime, jids, delay)
    return len(claimed)


def _answer_or_ask(
    runtime: Runtime, storage: TypedStorage, provider: Provider, moves: Moves, claimed: Sequence[Claimed]
) -> tuple[list[Ask], dict[str, Kind]]:
    """What needs no request is settled here (a kind gone, no key, a cached answer); the
    rest become asks. Returns the asks and every judgement's kind still in the config."""
    kinds: dict[str, Kind] = {}
    asks: list[Ask] = []
    model = provider.requested_model
    for c in claimed:
        kind = runtime.config.kinds.get(c.input["kind"])
        if kind is None:
            moves.fail(c.id, "typed", f"kind {c.input['kind']!r} is no longer in the config")
            continue
        kinds[c.id] = kind
        if provider.keyless:
            moves.move_up(c.id, kind, "typed", KEYLESS_WHY, host=_host(runtime, c))
            continue
        cached = _cache_get(storage, c.content_key, model)
        if cached is not None:
            _decide(runtime, moves, c, kind, cached, cached=True, model=model)
            continue
        questions = {qid: q.wire() for qid, q in kind.questions.items()}
        state: Any = c.input.get("state")  # the producer's JSON, as it was enqueued
        asks.append(Ask(c.id, state, questions))
    return asks, kinds


def _act(
    runtime: Runtime,
    storage: TypedStorage,
    moves: Moves,
    c: Claimed,
    kind: Kind,
    outcome: Outcome,
    model: str | None,
) -> float | None:
    """Act on one judgement's outcome; the delay to retry it after, when it is to be retried."""
    host = _host(runtime, c)
    if isinstance(outcome, Answered):
        _cache_put(storage, c.content_key, model, outcome, runtime.settings.typed_cache_ttl)
        _decide(runtime, moves, c, kind, outcome, cached=False, model=model)
    elif isinstance(outcome, Transient):
        attempts = runtime.storage.records.incr_attempts(c.id)
        if attempts < runtime.settings.typed_attempts:
            return outcome.retry_after if outcome.retry_after is not None else min(2.0**attempts, 60.0)
        why = f"provider {outcome.reason} after {attempts} attempts: {outcome.message}"
        moves.move_up(c.id, kind, "typed", why, host=host, error=outcome.message)
    elif isinstance(outcome, Permanent):
        why = f"provider refused ({outcome.reason}): {outcome.message}"
        moves.move_up(c.id, kind, "typed", why, host=host, error=outcome.message)
    elif isinstance(outcome, NoKey):
        moves.move_up(c.id, kind, "typed", KEYLESS_WHY, host=host)
    return None


def _retry_later(runtime: Runtime, ids: list[str], delay: float) -> None:
    """Re-enqueue after the provider's advised delay, without holding a worker meanwhile."""
    job = schedule_typed_retry(runtime, ids, delay)
    when = time.strftime("%H:%M:%S", time.gmtime(time.time() + delay))
    for jid in ids:
        runtime.storage.records.transition(
            jid,
            "queued",
            expect=["running"],
            trail=TrailEntry(
                tier="typed", outcome="retry-scheduled", why=f"provider trouble; retry at {when} UTC"
            ),
            fields={"job": job.id},
        )


# --- triage: the rules engine's questions go through the same provider --------------------
def provider_ask(provider: Provider) -> TriageAsk:
    """The rules engine's `ask(state, questions) -> AskResult`, over the typed tier's provider."""

    def ask(state: Any, questions: Mapping[str, dict[str, Any]]) -> AskResult:
        if provider.keyless:
            return AskResult(unanswered=dict.fromkeys(questions, "keyless"))
        before = provider.calls
        outcome = provider.ask(state, {q: dict(v) for q, v in questions.items()})
        requests = provider.calls - before
        if isinstance(outcome, Answered):
            return AskResult(answers=outcome.answers, unanswered=dict(outcome.missing), requests=requests)
        why = getattr(outcome, "message", None) or type(outcome).__name__
        reason = getattr(outcome, "reason", "keyless")
        return AskResult(unanswered=dict.fromkeys(questions, f"provider {reason}: {why}"), requests=requests)

    return ask
