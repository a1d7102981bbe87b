"""The typed tier: fixed-set judgements answered by TypeSafe's Jev, acted on only inside the band.

What falls short is not an error: it moves up (to a session, or to a person) with the
numbers compared in its trail. No key, or provider trouble, changes nothing but cost:
every judgement moves on exactly as if the tier did not exist, so no path ever depends
on an answer this tier gave.

Judgements of one RQ job that share a state cost one provider request (Jev answers
many questions about one state at once). Answers are cached under the judgement's
content key plus the requested model, so a re-delivered judgement makes no request.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dispatchq import keys
from dispatchq.core.answers import describe_gate
from dispatchq.core.judgement import TrailEntry, state_digest
from dispatchq.core.ladder import decide_typed, threshold_for
from dispatchq.queue.dispatch import Moves
from dispatchq.tiers.typesafe import (
    Answered,
    Ask,
    NoKey,
    Permanent,
    Provider,
    ProviderOptions,
    Transient,
    make_provider,
)

if TYPE_CHECKING:
    from dispatchq.config import Kind
    from dispatchq.runtime import Runtime
    from dispatchq.storage.store import Claimed

KEYLESS_WHY = "no TypeSafe key: the typed tier answers nothing"


def provider_for(runtime: Runtime) -> Provider:
    """One provider (one HTTP connection pool) per process."""
    provider = getattr(runtime, "_typed_provider", None)
    if provider is None:
        settings = runtime.settings
        provider = make_provider(
            settings.typesafe_api_key,
            base_url=settings.typesafe_base_url,
            model=settings.typesafe_default_model,
            options=ProviderOptions(
                request_timeout=settings.typed_timeout,
                max_questions_per_request=settings.typed_max_questions,
            ),
        )
        runtime._typed_provider = provider  # type: ignore[attr-defined]
    return provider


def _cache_get(runtime: Runtime, content_key: str, model: str | None) -> Answered | None:
    if model is None:
        return None
    raw = runtime.redis.get(keys.typed_cache(content_key, model))
    return Answered.from_json(json.loads(raw)) if raw else None


def _cache_put(runtime: Runtime, content_key: str, model: str | None, answered: Answered) -> None:
    # Only complete answers are cached: a missing answer, an error or a keyless run
    # must be asked again next time, not remembered.
    if model is None or answered.missing:
        return
    runtime.redis.set(
        keys.typed_cache(content_key, model),
        json.dumps(answered.to_json()),
        # Not the record's TTL: a judgement re-delivered after its record expired (so no
        # longer a live duplicate) is exactly what the cache is for.
        ex=runtime.settings.typed_cache_ttl,
    )


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
    answer_q = kind.questions.get(kind.answer) if kind.answer else None
    if answer_q is not None and decision.threshold is not None:
        extra["gate"] = describe_gate(answer_q.type, decision.threshold)
    host = _host(runtime, claimed)
    if decision.answered:
        moves.answer(
            claimed.id,
            "typed",
            decision.value,
            decision.why,
            confidence=decision.confidence,
            raw=raw,
            **extra,
        )
    else:
        fields = {"raw": raw}
        if decision.confidence is not None:
            fields["confidence"] = decision.confidence
        moves.move_up(
            claimed.id,
            kind,
            "typed",
            decision.why,
            host=host,
            priority=decision.priority,
            fields=fields,
            **extra,
        )


#: At most this many extra judgements are taken from other jobs' batches at once.
SIBLING_CAP = 5000


def _claim_siblings(runtime: Runtime, claimed: list[Claimed]) -> list[Claimed]:
    """Also take waiting judgements (from any job) that share a state with these.

    Jev answers many questions about one state in one request, so k judgements on one
    state should cost one request even when they arrived in different RQ jobs. Their
    own jobs later find them taken and do nothing.
    """
    redis = runtime.redis
    groups = {keys.typed_state(state_digest(c.input.get("state"))) for c in claimed}
    mine = {c.id for c in claimed}
    pipe = redis.pipeline(transaction=False)
    for group in groups:
        pipe.srandmember(group, SIBLING_CAP)
    extra = sorted({m.decode() if isinstance(m, bytes) else m for ms in pipe.execute() for m in ms} - mine)
    siblings = runtime.store.claim(extra[:SIBLING_CAP], "typed", strict=True) if extra else []
    pipe = redis.pipeline(transaction=False)
    taken = [c.id for c in (*claimed, *siblings)]
    for group in groups:
        pipe.srem(group, *taken)
    pipe.execute()
    return siblings


def _still_carried(runtime: Runtime, ids: Sequence[str]) -> list[str]:
    """The ids whose record still names the running RQ job as the one that carries it.

    Another job may have taken a judgement as a sibling and, on provider trouble, put it
    under a scheduled retry job: its original job must leave it to wait for the advised
    delay instead of asking again at once.
    """
    from rq import get_current_job

    job = get_current_job()
    if job is None:  # called outside RQ (tests, benchmarks): the caller owns the ids
        return list(ids)
    pipe = runtime.redis.pipeline(transaction=False)
    for jid in ids:
        pipe.hget(keys.record(jid), "job")
    owners = pipe.execute()
    return [
        jid
        for jid, owner in zip(ids, owners, strict=True)
        if not owner or (owner.decode() if isinstance(owner, bytes) else owner) == job.id
    ]


def process_batch(runtime: Runtime, ids: Sequence[str]) -> int:
    """Ask the provider about one job's judgements (batched by state) and act on the band."""
    claimed = runtime.store.claim(_still_carried(runtime, ids), "typed")
    if not claimed:
        return 0
    claimed += _claim_siblings(runtime, claimed)
    provider = provider_for(runtime)
    moves = Moves()
    kinds: dict[str, Kind] = {}
    asks: list[Ask] = []
    by_id: dict[str, Claimed] = {}
    model = provider.requested_model
    for c in claimed:
        kind = runtime.config.kinds.get(c.input["kind"])
        if kind is None:
            moves.fail(c.id, "typed", f"kind {c.input['kind']!r} is no longer in the config")
            continue
        kinds[c.id] = kind
        by_id[c.id] = c
        if provider.keyless:
            moves.move_up(c.id, kind, "typed", KEYLESS_WHY, host=_host(runtime, c))
            continue
        cached = _cache_get(runtime, c.content_key, model)
        if cached is not None:
            _decide(runtime, moves, c, kind, cached, cached=True, model=model)
            continue
        questions = {qid: q.wire() for qid, q in kind.questions.items()}
        asks.append(Ask(c.id, c.input.get("state"), questions))
    if provider.keyless:  # `dispatchq status` reports the tier keyless while this is set
        runtime.redis.set(keys.TYPED_KEYLESS, runtime.settings.host, ex=3600)
    elif runtime.redis.get(keys.TYPED_KEYLESS) in (runtime.settings.host, runtime.settings.host.encode()):
        runtime.redis.delete(keys.TYPED_KEYLESS)  # this host has a key now
    retries: dict[float, list[str]] = {}
    if asks:
        before = provider.calls
        outcomes = provider.ask_many(asks)
        runtime.redis.incrby(keys.TYPED_REQUESTS, provider.calls - before)
        for jid, outcome in outcomes.items():
            c, kind = by_id[jid], kinds[jid]
            host = _host(runtime, c)
            if isinstance(outcome, Answered):
                _cache_put(runtime, c.content_key, model, outcome)
                _decide(runtime, moves, c, kind, outcome, cached=False, model=model)
            elif isinstance(outcome, Transient):
                attempts = runtime.store.incr_attempts(jid)
                if attempts < runtime.settings.typed_attempts:
                    delay = (
                        outcome.retry_after if outcome.retry_after is not None else min(2.0**attempts, 60.0)
                    )
                    retries.setdefault(round(delay, 3), []).append(jid)
                else:
                    why = f"provider {outcome.reason} after {attempts} attempts: {outcome.message}"
                    moves.move_up(jid, kind, "typed", why, host=host, error=outcome.message)
            elif isinstance(outcome, Permanent):
                why = f"provider refused ({outcome.reason}): {outcome.message}"
                moves.move_up(jid, kind, "typed", why, host=host, error=outcome.message)
            elif isinstance(outcome, NoKey):
                moves.move_up(jid, kind, "typed", KEYLESS_WHY, host=host)
    runtime.dispatcher.commit(moves)
    for delay, jids in retries.items():
        _retry_later(runtime, jids, delay)
    return len(claimed)


def _retry_later(runtime: Runtime, ids: list[str], delay: float) -> None:
    """Re-enqueue after the provider's advised delay, without holding a worker meanwhile."""
    from dispatchq.queue.scheduler import schedule_typed_retry

    job = schedule_typed_retry(runtime, ids, delay)
    when = time.strftime("%H:%M:%S", time.gmtime(time.time() + delay))
    for jid in ids:
        runtime.store.transition(
            jid,
            "queued",
            expect=["running"],
            trail=TrailEntry(
                tier="typed", outcome="retry-scheduled", why=f"provider trouble; retry at {when} UTC"
            ),
            fields={"job": job.id},
        )


# --- triage: the rules engine's questions go through the same provider --------------------
def provider_ask(provider: Provider) -> Any:
    """The rules engine's `ask(state, questions) -> AskResult`, over the typed tier's provider."""
    from dispatchq.triage.engine import AskResult

    def ask(state: Any, questions: Any) -> AskResult:
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


def enqueue_triage(runtime: Runtime, event: dict[str, Any], mode: str | None) -> str:
    """Put an event on the typed queue: a typed worker asks, resolves and runs the executor."""
    job = runtime.dispatcher.queue("typed").enqueue_call(
        "jobs.tiers.triage",
        args=(event, mode),
        timeout=runtime.settings.typed_job_timeout,
        result_ttl=runtime.settings.result_ttl,
        failure_ttl=runtime.settings.result_ttl,
        description=f"dispatchq triage {event.get('event')} {event.get('target')}",
    )
    return str(job.id)


def run_triage(runtime: Runtime, event_data: dict[str, Any], mode: str | None) -> dict[str, Any]:
    """The typed worker's side of `triage --enqueue`: one batched request, the table, the executor.

    Triage has no confidence band of its own and never escalates to a session: the
    table's gates are the band. Its budget is per hour across every enqueued event.
    """
    from dispatchq.triage.engine import HourlyBudget, TriageStore, triage
    from dispatchq.triage.executors import build_executor
    from dispatchq.triage.rules import Event

    config = runtime.config.triage
    if config is None:
        raise RuntimeError("the config has no triage section")
    event = Event.from_json(event_data)
    settings = runtime.settings
    executor = build_executor(
        config.executor,
        runtime.redis,
        github_token=settings.github_token,
        github_api_url=settings.github_api_url,
    )
    try:
        result = triage(
            event,
            config,
            ask=provider_ask(provider_for(runtime)),
            store=TriageStore(runtime.redis),
            executor=executor,
            budget=HourlyBudget(runtime.redis, settings.triage_hourly_budget),
            mode_override=mode,  # type: ignore[arg-type]
        )
    finally:
        close = getattr(executor, "close", None)
        if callable(close):
            close()
    return result.to_json()
