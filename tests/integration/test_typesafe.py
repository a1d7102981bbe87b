"""The typed tier's provider against the loopback fake, through the real typesafe-sdk.

Every test here makes real HTTP requests to 127.0.0.1 and counts what the server saw, so
batching, retries and keyless runs are checked by the requests they cost, not by mocks.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from dispatchq.core.answers import Answer
from dispatchq.errors import SettingsError
from dispatchq.settings import load_settings
from dispatchq.testing.typesafe import (
    Failure,
    FakeTypeSafeAPI,
    FakeTypeSafeProcess,
    Rule,
    choice,
    noul,
    score,
)
from dispatchq.tiers.typed.batching import (
    Answered,
    Ask,
    NoKey,
    Outcome,
    Permanent,
    Transient,
    Usage,
    canonical_state,
    merge_outcomes,
    plan_batches,
    split_outcome,
)
from dispatchq.tiers.typed.protocol import KeylessProvider, ProviderOptions
from dispatchq.tiers.typed.provider import REDACTED, TypeSafeProvider, advised_delay, make_provider, redact
from tests.support.typesafe import FAST, provider_for

NOUL_Q = {"type": "noul", "instructions": "Is this comment actionable?"}
CHOICE_Q = {
    "type": "choice",
    "instructions": "Which label fits?",
    "criteria": {"bug": None, "docs": None, "feature": None},
}
SCORE_Q = {"type": "score", "instructions": "How urgent?", "criteria": ["can wait", "this week", "today"]}


def answered(outcome: Outcome) -> Answered:
    assert isinstance(outcome, Answered), outcome
    return outcome


# --- answer types ----------------------------------------------------------------------------
def test_noul_answer_is_value_and_derived_confidence(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.answer("actionable", noul(0.16))
    result = answered(typesafe_provider.ask("please fix the typo", {"actionable": NOUL_Q}))
    a = result.answers["actionable"]
    assert (a.type, a.value, a.p) == ("noul", False, 0.16)
    assert a.confidence == pytest.approx(0.68)
    assert result.missing == {}


def test_choice_answer_keeps_label_confidence_and_probabilities(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.answer("label", choice("docs", 0.72, {"bug": 0.18, "docs": 0.72, "feature": 0.1}))
    a = answered(typesafe_provider.ask("README typo", {"label": CHOICE_Q})).answers["label"]
    assert (a.type, a.value, a.confidence) == ("choice", "docs", 0.72)
    assert a.raw["probabilities"] == {"bug": 0.18, "docs": 0.72, "feature": 0.1}


def test_score_answer_is_fractional_never_rounded(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.answer("urgency", score(1.6, 0.55, probabilities={"0": 0.1, "1": 0.2, "2": 0.7}))
    a = answered(typesafe_provider.ask({"title": "main is red"}, {"urgency": SCORE_Q})).answers["urgency"]
    assert (a.type, a.value, a.confidence) == ("score", 1.6, 0.55)
    assert a.raw["legend"] == {"0": "can wait", "1": "this week", "2": "today"}
    assert a.raw["probabilities"] == {"0": 0.1, "1": 0.2, "2": 0.7}


def test_resolved_model_usage_and_request_id_are_kept(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    result = answered(typesafe_provider.ask("x", {"q": NOUL_Q}))
    assert result.model == "jev-2026-09-15"
    assert typesafe_provider.requested_model == "jev-latest"
    assert typesafe_api.systemone_requests[0].body["model"] == "jev-latest"
    assert result.usage.input_tokens is not None and result.usage.output_tokens == 1
    assert len(result.request_ids) == 1 and result.request_ids[0].startswith("fake-")


def test_answered_round_trips_through_json(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.unknown_type("gone")
    result = answered(typesafe_provider.ask("x", {"a": NOUL_Q, "b": CHOICE_Q, "c": SCORE_Q, "gone": NOUL_Q}))
    again = Answered.from_json(json.loads(json.dumps(result.to_json())))
    assert again == result


# --- the SDK's own variables and the key ----------------------------------------------------
def test_base_url_and_model_come_from_the_sdk_variables(
    typesafe_api: FakeTypeSafeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The settings are the one reader of the environment: they pass TYPESAFE_DEFAULT_MODEL
    # on, and every request names the model it is cached under.
    monkeypatch.setenv("TYPESAFE_BASE_URL", typesafe_api.url)
    settings = load_settings({"TYPESAFE_DEFAULT_MODEL": "jev-preview"})
    with make_provider(
        typesafe_api.api_key, model=settings.typesafe_default_model, options=ProviderOptions(**FAST)
    ) as p:
        assert isinstance(answered(p.ask("x", {"q": NOUL_Q})), Answered)
        assert p.requested_model == "jev-preview"
    assert typesafe_api.request_count == 1
    assert typesafe_api.systemone_requests[0].body["model"] == "jev-preview"


def test_with_no_model_set_the_sdks_default_is_requested_by_name(
    typesafe_api: FakeTypeSafeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TYPESAFE_DEFAULT_MODEL", "jev-elsewhere")  # not read behind the settings' back
    with make_provider(typesafe_api.api_key, base_url=typesafe_api.url, options=ProviderOptions(**FAST)) as p:
        answered(p.ask("x", {"q": NOUL_Q}))
        assert p.requested_model == "jev-latest"
    assert typesafe_api.systemone_requests[0].body["model"] == "jev-latest"


def test_key_is_sent_as_bearer_and_secretstr_is_accepted(typesafe_api: FakeTypeSafeAPI) -> None:
    with make_provider(SecretStr(typesafe_api.api_key), base_url=typesafe_api.url) as p:
        answered(p.ask("x", {"q": NOUL_Q}))
    assert typesafe_api.systemone_requests[0].headers["Authorization"] == f"Bearer {typesafe_api.api_key}"


@pytest.mark.parametrize("key", [None, "", "   ", SecretStr("")])
def test_keyless_makes_no_request_and_answers_nothing(
    typesafe_api: FakeTypeSafeAPI, monkeypatch: pytest.MonkeyPatch, key: Any
) -> None:
    # Even with the SDK's own variables pointing at a live server with a valid key.
    monkeypatch.setenv("TYPESAFE_API_KEY", typesafe_api.api_key)
    monkeypatch.setenv("TYPESAFE_BASE_URL", typesafe_api.url)
    p = make_provider(key)
    assert isinstance(p, KeylessProvider) and p.keyless
    asks = [Ask(f"j{i}", "same state", {"q": NOUL_Q}) for i in range(3)]
    assert p.ask_many(asks) == {"j0": NoKey(), "j1": NoKey(), "j2": NoKey()}
    assert p.ask("x", {"q": NOUL_Q}) == NoKey()
    assert typesafe_api.request_count == 0 and typesafe_api.requests == []


def test_an_unusable_key_is_a_settings_error_that_hides_the_key() -> None:
    with pytest.raises(SettingsError) as caught:
        make_provider("tsk-secret with-space")
    assert "tsk-secret" not in str(caught.value) and "with-space" not in str(caught.value)


# --- provider trouble -----------------------------------------------------------------------
def test_rate_limit_then_success_is_the_sdks_own_retry(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.rate_limit(retry_after_ms=10, times=1)
    result = answered(typesafe_provider.ask("x", {"q": NOUL_Q}))
    assert "q" in result.answers
    seen = typesafe_api.systemone_requests
    assert [r.status for r in seen] == [429, 200]
    assert seen[1].headers.get("X-TypeSafe-Retry-Count") == "1"
    assert typesafe_provider.calls == 1


def test_rate_limit_beyond_the_budget_returns_at_once_with_the_advised_delay(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.rate_limit(retry_after_ms=None, retry_after="120", times=1)
    outcome = typesafe_provider.ask("x", {"q": NOUL_Q})
    assert isinstance(outcome, Transient)
    assert (outcome.reason, outcome.retry_after, outcome.status) == ("rate_limit", 120.0, 429)
    assert typesafe_api.request_count == 1  # no worker held waiting two minutes


def test_server_errors_exhausted_are_transient_with_the_advised_delay(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.fail(503, headers={"retry-after-ms": "10"}, times=3)
    outcome = typesafe_provider.ask("x", {"q": NOUL_Q})
    assert isinstance(outcome, Transient)
    assert (outcome.reason, outcome.status, outcome.retry_after) == ("server", 503, 0.01)
    assert typesafe_api.request_count == 3  # the initial attempt and max_retries=2


def test_server_error_without_advice_has_no_delay(typesafe_api: FakeTypeSafeAPI) -> None:
    typesafe_api.fail(500, times=1)
    with provider_for(typesafe_api, max_retries=0) as p:
        outcome = p.ask("x", {"q": NOUL_Q})
    assert isinstance(outcome, Transient) and (outcome.reason, outcome.retry_after) == ("server", None)
    assert typesafe_api.request_count == 1


def test_server_error_then_success(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.fail(502, headers={"retry-after-ms": "10"}, times=2)
    assert isinstance(typesafe_provider.ask("x", {"q": NOUL_Q}), Answered)
    assert typesafe_api.request_count == 3


def test_a_request_timeout_status_has_no_class_and_is_transient(typesafe_api: FakeTypeSafeAPI) -> None:
    typesafe_api.fail(408, headers={"retry-after": "7"}, times=1)
    with provider_for(typesafe_api, max_retries=0) as p:
        outcome = p.ask("x", {"q": NOUL_Q})
    assert isinstance(outcome, Transient)
    assert (outcome.reason, outcome.status, outcome.retry_after) == ("timeout", 408, 7.0)


def test_wrong_key_is_permanent_auth_and_not_retried(typesafe_api: FakeTypeSafeAPI) -> None:
    with TypeSafeProvider("not-the-key", base_url=typesafe_api.url, options=ProviderOptions(**FAST)) as p:
        outcome = p.ask("x", {"q": NOUL_Q})
    assert isinstance(outcome, Permanent) and (outcome.reason, outcome.status) == ("auth", 401)
    assert "Invalid API key" in outcome.message
    assert typesafe_api.request_count == 1


@pytest.mark.parametrize(
    ("status", "reason"), [(401, "auth"), (403, "auth"), (400, "invalid"), (404, "invalid"), (422, "invalid")]
)
def test_client_errors_are_permanent(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider, status: int, reason: str
) -> None:
    typesafe_api.fail(status)
    outcome = typesafe_provider.ask("x", {"q": NOUL_Q})
    assert isinstance(outcome, Permanent) and (outcome.reason, outcome.status) == (reason, status)
    assert typesafe_api.request_count == 1


def test_invalid_request_is_permanent_with_the_servers_reason(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    # A score question with no levels passes the SDK's dict checks only if criteria is
    # present; an unknown question type is left for the server, which rejects it (422).
    outcome = typesafe_provider.ask("x", {"q": {"type": "sentiment", "instructions": "?"}})
    assert isinstance(outcome, Permanent) and (outcome.reason, outcome.status) == ("invalid", 422)
    assert "questions.q" in outcome.message
    assert typesafe_api.request_count == 1


def test_a_request_the_sdk_refuses_to_send_is_permanent(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    outcome = typesafe_provider.ask("x", {})
    assert isinstance(outcome, Permanent) and outcome.reason == "invalid"
    assert typesafe_api.request_count == 0


def test_timeouts_exhausted_are_transient(typesafe_api: FakeTypeSafeAPI) -> None:
    typesafe_api.slow(30.0, times=3)
    with provider_for(typesafe_api, request_timeout=0.2) as p:
        outcome = p.ask("x", {"q": NOUL_Q})
    assert isinstance(outcome, Transient) and outcome.reason == "timeout"
    assert typesafe_api.request_count == 3


def test_connection_refused_is_transient() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with TypeSafeProvider("k", base_url=f"http://127.0.0.1:{port}", options=ProviderOptions(**FAST)) as p:
        outcome = p.ask("x", {"q": NOUL_Q})
    assert isinstance(outcome, Transient) and outcome.reason == "connection"


def test_an_html_body_on_a_200_is_permanent_bad_response(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.queue(Failure(status=200, body="<html><body>Gateway login</body></html>"))
    outcome = typesafe_provider.ask("x", {"q": NOUL_Q})
    assert isinstance(outcome, Permanent) and outcome.reason == "bad_response"


def test_a_malformed_answer_the_sdk_refuses_is_read_per_question(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    # The SDK refuses the whole response ("Invalid response data at 'answers.b.confidence'");
    # the raw answers are read one by one, so only `b` is missing.
    body = {
        "model": "jev-x",
        "answers": {"a": noul(0.9), "b": {"type": "choice", "choice": "bug", "probabilities": {"bug": 1.0}}},
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }
    typesafe_api.queue(Failure(status=200, body=body, headers={"x-typesafe-request-id": "req-7"}))
    result = answered(typesafe_provider.ask("x", {"a": NOUL_Q, "b": CHOICE_Q}))
    assert set(result.answers) == {"a"} and result.answers["a"].p == 0.9
    assert "lacks 'confidence'" in result.missing["b"] and "answers.b.confidence" in result.missing["b"]
    assert (result.model, result.usage, result.request_ids) == ("jev-x", Usage(3, 2), ("req-7",))


@pytest.mark.parametrize(
    ("question", "wire", "why"),
    [
        (CHOICE_Q, {"type": "choice", "choice": "zzz", "confidence": 0.99}, "not one of the criteria"),
        (CHOICE_Q, choice("bug", 0.9, {"bug": 0.9, "docs": 0.3, "feature": 0.1}), "sum to 1.3"),
        (CHOICE_Q, choice("bug", 0.9, {"bug": 0.9, "zzz": 0.1}), "'zzz', which was not asked"),
        (SCORE_Q, score(2.5, 0.9, probabilities={"2": 1.0}), "outside the levels' range [0, 2]"),
        (SCORE_Q, score(-0.1, 0.9, probabilities={"0": 1.0}), "outside the levels' range"),
        (SCORE_Q, score(1.0, 0.9, probabilities={"1": 0.5, "7": 0.5}), "'7', which was not asked"),
        (SCORE_Q, score(1.0, 0.9, probabilities={"1": 0.5}), "sum to 0.5"),
        (NOUL_Q, noul(1.2), "between 0 and 1"),
        (NOUL_Q, noul(-0.01), "between 0 and 1"),
    ],
)
def test_an_answer_outside_the_question_is_no_answer(
    typesafe_api: FakeTypeSafeAPI,
    typesafe_provider: TypeSafeProvider,
    question: dict[str, Any],
    wire: dict[str, Any],
    why: str,
) -> None:
    typesafe_api.answer("q", wire)
    result = answered(typesafe_provider.ask("x", {"q": question, "fine": NOUL_Q}))
    assert set(result.answers) == {"fine"}
    assert why in result.missing["q"]


def test_an_answer_inside_the_question_within_rounding_is_kept(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.answer("label", choice("docs", 0.7, {"bug": 0.2, "docs": 0.7, "feature": 0.105}))
    typesafe_api.answer("urgency", score(2.0, 0.8, probabilities={"1": 0.0, "2": 0.995}))
    result = answered(typesafe_provider.ask("x", {"label": CHOICE_Q, "urgency": SCORE_Q}))
    assert result.missing == {} and result.answers["label"].value == "docs"


# --- answers that are not there ----------------------------------------------------------------
def test_unknown_answer_type_is_no_answer_for_that_question_only(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.unknown_type("where")
    typesafe_api.answer("actionable", noul(0.95))
    result = answered(typesafe_provider.ask("x", {"where": NOUL_Q, "actionable": NOUL_Q}))
    assert set(result.answers) == {"actionable"}
    assert "where" in result.missing
    assert result.answers.get("where") is None


def test_mistyped_or_malformed_answers_are_missing_not_errors(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.answer("typed_wrong", choice("bug", 0.9))  # a choice for a noul question
    typesafe_api.answer("out_of_range", noul(1.5))
    result = answered(
        typesafe_provider.ask("x", {"typed_wrong": NOUL_Q, "out_of_range": NOUL_Q, "fine": NOUL_Q})
    )
    assert set(result.answers) == {"fine"}
    assert "answered 'choice'" in result.missing["typed_wrong"]
    assert "between 0 and 1" in result.missing["out_of_range"]


def test_a_question_absent_from_the_response_is_missing(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.queue(
        Failure(
            status=200, body={"model": "jev-x", "answers": {"a": noul(0.9)}, "usage": {"input_tokens": 1}}
        )
    )
    result = answered(typesafe_provider.ask("x", {"a": NOUL_Q, "b": NOUL_Q}))
    assert set(result.answers) == {"a"} and set(result.missing) == {"b"}


# --- batching ---------------------------------------------------------------------------------
def _state_noul(qid: str, question: dict[str, Any], state: Any) -> dict[str, Any] | None:
    """Answer p = the state's `p`, so a misrouted answer shows up as a wrong number."""
    return noul(state["p"]) if isinstance(state, dict) and question["type"] == "noul" else None


def test_k_judgements_over_s_states_cost_s_requests(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.responder = _state_noul
    states = [{"p": 0.1}, {"p": 0.9}, {"p": 0.7}]
    asks = [Ask(f"j{i}", dict(states[i % 3]), {"actionable": NOUL_Q, "other": NOUL_Q}) for i in range(9)]
    results = typesafe_provider.ask_many(asks)
    assert typesafe_api.request_count == 3
    assert typesafe_provider.calls == 3
    for i in range(9):
        r = answered(results[f"j{i}"])
        assert set(r.answers) == {"actionable", "other"}
        assert r.answers["actionable"].p == states[i % 3]["p"]
        assert r.answers["actionable"].question == "actionable"
    sent = typesafe_api.systemone_requests[0].question_ids
    assert sent == [
        "j0__actionable",
        "j0__other",
        "j1__actionable",
        "j1__other",
        "j2__actionable",
        "j2__other",
    ]


def test_states_equal_as_json_share_a_request(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    asks = [Ask("a", {"x": 1, "y": [1, 2]}, {"q": NOUL_Q}), Ask("b", {"y": [1, 2], "x": 1}, {"q": NOUL_Q})]
    results = typesafe_provider.ask_many(asks)
    assert typesafe_api.request_count == 1
    assert all(isinstance(r, Answered) for r in results.values())


def test_cap_splits_requests(typesafe_api: FakeTypeSafeAPI) -> None:
    asks = [Ask(f"j{i}", "one state", {"a": NOUL_Q, "b": NOUL_Q}) for i in range(5)]
    with provider_for(typesafe_api, max_questions_per_request=4) as p:
        results = p.ask_many(asks)
    assert typesafe_api.request_count == 3
    assert [len(r.question_ids) for r in typesafe_api.systemone_requests] == [4, 4, 2]
    assert all(set(answered(r).answers) == {"a", "b"} for r in results.values())


def test_a_judgement_over_the_cap_is_split_and_merged(typesafe_api: FakeTypeSafeAPI) -> None:
    questions = {f"q{n}": NOUL_Q for n in range(5)}
    with provider_for(typesafe_api, max_questions_per_request=2) as p:
        result = answered(p.ask_many([Ask("big", "s", questions)])["big"])
    assert typesafe_api.request_count == 3
    assert set(result.answers) == set(questions)
    assert len(result.request_ids) == 3


def test_one_failed_part_fails_the_whole_split_judgement(typesafe_api: FakeTypeSafeAPI) -> None:
    typesafe_api.add_rule(Rule(noul(0.9)))  # every question answered...
    questions = {f"q{n}": NOUL_Q for n in range(4)}
    with provider_for(typesafe_api, max_questions_per_request=2) as p:
        typesafe_api.fail(400)  # ...but the first request is refused
        outcome = p.ask_many([Ask("big", "s", questions), Ask("small", "other", {"q": NOUL_Q})])
    assert isinstance(outcome["big"], Permanent)
    assert isinstance(outcome["small"], Answered)


def test_a_batch_failure_reaches_every_judgement_in_it(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.fail(503, headers={"retry-after-ms": "10"}, times=3)
    results = typesafe_provider.ask_many([Ask(f"j{i}", "s", {"q": NOUL_Q}) for i in range(4)])
    assert typesafe_api.request_count == 3
    assert {type(r) for r in results.values()} == {Transient}


def test_concurrent_batches_give_the_same_answers(typesafe_api: FakeTypeSafeAPI) -> None:
    typesafe_api.responder = _state_noul
    asks = [Ask(f"j{i}", {"p": i / 10}, {"q": NOUL_Q}) for i in range(6)]
    with provider_for(typesafe_api, concurrency=3) as p:
        results = p.ask_many(asks)
        assert p.calls == 6
    assert typesafe_api.request_count == 6
    assert {jid: answered(r).answers["q"].p for jid, r in results.items()} == {
        f"j{i}": i / 10 for i in range(6)
    }


def test_requests_for_different_states_are_in_flight_together(typesafe_api: FakeTypeSafeAPI) -> None:
    # Each answer waits until four requests are being answered at once: one after another,
    # the barrier breaks and nothing is answered; four at a time, all are.
    barrier = threading.Barrier(4, timeout=20)

    def together(qid: str, question: dict[str, Any], state: Any) -> dict[str, Any]:
        barrier.wait()
        return noul(state["p"])

    typesafe_api.responder = together
    asks = [Ask(f"j{i}", {"p": i / 10}, {"q": NOUL_Q}) for i in range(8)]
    with provider_for(typesafe_api, concurrency=4, max_retries=0) as p:
        results = p.ask_many(asks)
    assert {jid: answered(r).answers["q"].p for jid, r in results.items()} == {
        f"j{i}": i / 10 for i in range(8)
    }
    assert typesafe_api.request_count == 8  # still one request per state


def test_plan_batches_is_pure_and_ordered() -> None:
    asks = [
        Ask("a", "s1", {"x": NOUL_Q}),
        Ask("b", "s2", {"x": NOUL_Q}),
        Ask("c", "s1", {"x": NOUL_Q, "y": NOUL_Q}),
    ]
    batches = plan_batches(asks, max_questions=10)
    assert [b.judgement_ids for b in batches] == [["a", "c"], ["b"]]
    assert batches[0].routes == {"j0__x": ("a", "x"), "j1__x": ("c", "x"), "j1__y": ("c", "y")}
    assert batches[0].questions["j1__y"] == NOUL_Q


def test_plan_batches_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="twice"):
        plan_batches([Ask("a", "s", {"x": NOUL_Q}), Ask("a", "s", {"y": NOUL_Q})], 10)
    with pytest.raises(ValueError, match="no questions"):
        plan_batches([Ask("a", "s", {})], 10)
    with pytest.raises(ValueError, match="not JSON"):
        plan_batches([Ask("a", {"x": float("nan")}, {"q": NOUL_Q})], 10)
    with pytest.raises(ValueError):
        plan_batches([], 0)


def test_question_ids_with_the_separator_route_back_exactly() -> None:
    batch = plan_batches([Ask("a", "s", {"x__y": NOUL_Q})], 10)[0]
    wire = Answered({"j0__x__y": Answer.from_wire("j0__x__y", noul(0.9))}, "m")
    result = answered(split_outcome(batch, wire)["a"])
    assert list(result.answers) == ["x__y"] and result.answers["x__y"].question == "x__y"


def test_canonical_state_ignores_key_order_only() -> None:
    assert canonical_state({"a": 1, "b": 2}) == canonical_state({"b": 2, "a": 1})
    assert canonical_state({"a": 1}) != canonical_state({"a": 1.5})
    assert canonical_state("x") != canonical_state(["x"])


def test_merge_outcomes_worst_wins() -> None:
    ok = Answered({}, "m", Usage(1, 1))
    slow = Transient("rate_limit", "m", 5.0)
    slower = Transient("server", "m", 9.0)
    denied = Permanent("auth", "m", 401)
    assert merge_outcomes([ok, slow, slower]) == Transient("rate_limit", "m", 9.0)
    assert merge_outcomes([slow, denied, ok]) == denied
    assert merge_outcomes([ok, NoKey()]) == NoKey()
    assert merge_outcomes([ok, ok]).usage == Usage(2, 2)  # type: ignore[union-attr]


# --- retry-after parsing ----------------------------------------------------------------------
def test_advised_delay_reads_both_headers_and_dates() -> None:
    assert advised_delay({"retry-after-ms": "250"}) == 0.25
    assert advised_delay({"Retry-After": "3"}) == 3.0
    assert advised_delay({"retry-after-ms": "10", "retry-after": "7"}) == 0.01
    assert advised_delay({"retry-after-ms": "soon", "retry-after": "7"}) == 7.0
    later = format_datetime(datetime.now(UTC) + timedelta(hours=1), usegmt=True)
    delay = advised_delay({"retry-after": later})
    assert delay is not None and 3000 < delay <= 3600
    assert advised_delay({"retry-after": "-1"}) is None
    assert advised_delay({"retry-after": "whenever"}) is None
    assert advised_delay({}) is None


# --- the key never leaks ----------------------------------------------------------------------
SECRET = "tsk-live-SECRETSECRET-0123456789"


def _scenarios(api: FakeTypeSafeAPI, port_free: int) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("400", {"fail": (400, {})}),
        ("401 echoing the credentials", {"fail": (401, {"echo_authorization": True})}),
        ("403", {"fail": (403, {})}),
        ("404", {"fail": (404, {})}),
        ("422", {"fail": (422, {})}),
        ("429", {"fail": (429, {"headers": {"retry-after-ms": "10"}, "times": 3})}),
        ("503 echoing the credentials", {"fail": (503, {"echo_authorization": True, "times": 3})}),
        ("timeout", {"slow": 30.0}),
        ("bad response", {"queue": Failure(status=200, body={"nonsense": True})}),
        ("connection", {"base_url": f"http://127.0.0.1:{port_free}"}),
    ]


@pytest.mark.parametrize("name", [s[0] for s in _scenarios(FakeTypeSafeAPI(), 1)])
def test_the_key_never_appears_in_any_error(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with FakeTypeSafeAPI(api_key=SECRET) as api:
        scenario = dict(_scenarios(api, free))[name]
        if "fail" in scenario:
            status, kwargs = scenario["fail"]
            api.fail(status, **kwargs)
        if "slow" in scenario:
            api.slow(scenario["slow"], times=3)
        if "queue" in scenario:
            api.queue(scenario["queue"])
        options = ProviderOptions(**FAST, request_timeout=0.2)
        with TypeSafeProvider(SECRET, base_url=scenario.get("base_url", api.url), options=options) as p:
            outcome = p.ask("x", {"q": NOUL_Q})
            texts = [str(outcome), repr(outcome), json.dumps(outcome.to_json()), repr(p), str(vars(p))]
        assert isinstance(outcome, Transient | Permanent)
        for text in texts:
            assert SECRET not in text
        if "echo" in name:
            assert REDACTED in outcome.message  # the server did reflect it; we removed it
    # The SDK logs response bodies at DEBUG; only a server echoing the key could put it there.
    if "echo" not in name:
        assert SECRET not in caplog.text


def test_redact_covers_escaped_spellings() -> None:
    key = 'k"e\\y'
    text = f"raw {key} json {json.dumps(key)} repr {key!r}"
    assert key not in redact(text, key) and json.dumps(key)[1:-1] not in redact(text, key)
    assert redact("nothing", None) == "nothing"


# --- the fake itself --------------------------------------------------------------------------
def test_large_states_arrive_zstd_compressed_and_are_decoded(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    big = {"diff": "x" * 5000}
    answered(typesafe_provider.ask(big, {"q": NOUL_Q}))
    seen = typesafe_api.systemone_requests[0]
    assert seen.content_encoding == "zstd"
    assert seen.body["state"] == big and seen.raw_size < 5000


def test_compression_can_be_turned_off(typesafe_api: FakeTypeSafeAPI) -> None:
    with provider_for(typesafe_api, compression=False) as p:
        answered(p.ask({"diff": "x" * 5000}, {"q": NOUL_Q}))
    assert typesafe_api.systemone_requests[0].content_encoding is None


def test_fake_rules_match_by_instructions_state_and_times(
    typesafe_api: FakeTypeSafeAPI, typesafe_provider: TypeSafeProvider
) -> None:
    typesafe_api.answer("Which label fits?", choice("bug", 0.95))
    typesafe_api.add_rule(Rule(choice("docs", 0.8), question="label", state_contains="README", times=1))
    first = answered(typesafe_provider.ask("README is wrong", {"label": CHOICE_Q})).answers["label"]
    second = answered(typesafe_provider.ask("README is wrong", {"label": CHOICE_Q})).answers["label"]
    other = answered(typesafe_provider.ask("crash", {"label": CHOICE_Q})).answers["label"]
    assert (first.value, second.value, other.value) == ("docs", "bug", "bug")
    assert first.raw["probabilities"]["docs"] == 0.8


def test_fake_as_a_process_is_scripted_by_file_and_counts_requests(tmp_path: Path) -> None:
    script = {
        "answers": {"actionable": {"type": "noul", "noul": 0.97}},
        "failures": [{"status": 429, "headers": {"retry-after-ms": "10"}}],
        "unknown_types": ["where"],
    }
    with FakeTypeSafeProcess(script, workdir=tmp_path, api_key="proc-key") as proc:
        with TypeSafeProvider("proc-key", base_url=proc.url, options=ProviderOptions(**FAST)) as p:
            result = answered(p.ask("x", {"actionable": NOUL_Q, "where": NOUL_Q}))
        assert result.answers["actionable"].p == 0.97 and "where" in result.missing
        assert [r.status for r in proc.requests] == [429, 200]
        proc.script({"failures": [{"status": 401}]})
        with TypeSafeProvider("proc-key", base_url=proc.url, options=ProviderOptions(**FAST)) as p:
            assert isinstance(p.ask("x", {"q": NOUL_Q}), Permanent)
        assert proc.request_count == 3
        proc.reset()
        assert proc.request_count == 0
