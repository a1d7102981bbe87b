"""The typed tier end to end: real Redis, real RQ workers, the real typesafe-sdk, a loopback fake API.

In-process tests build a `Runtime` from a settings mapping that names the fake's URL and a
key, and run dispatchq's own burst workers (`drain`, `make_worker(...).work(burst=True)`).
A few run `dispatchq worker typed --burst` as a real process against the fake in its own
process. The fake counts every request, so batching, the decision cache and keyless runs
are checked by what they cost, never by mocks.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dispatchq.client import Client
from dispatchq.core.judgement import JudgementIn, Record
from dispatchq.process.wiring import drain, set_runtime
from dispatchq.queue.scheduler import due_retries, schedule_typed_retry
from dispatchq.runtime import Runtime
from dispatchq.storage import keys
from dispatchq.testing.typesafe import (
    DEFAULT_RESOLVED_MODEL,
    Failure,
    FakeTypeSafeAPI,
    FakeTypeSafeProcess,
    WireAnswer,
    choice,
    noul,
    score,
    unknown_answer,
)
from dispatchq.tiers.typed.tier import KEYLESS_WHY
from dispatchq.workers.run import make_worker
from dispatchq.workers.status import collect_status
from tests.support.helpers import REPO, run_cli, wait_for, write_config
from tests.support.typed import TYPED_KEY

TARGET = "acme/app#12"


# --- fixtures and helpers ---------------------------------------------------------------------
def enqueue(rt: Runtime, kind: str, state: Any = None, *, target: str = TARGET, force: bool = False) -> str:
    return Client(runtime=rt).enqueue(kind, target, state=state, force=force)


def record(rt: Runtime, jid: str) -> Record:
    found = rt.storage.records.get(jid)
    assert found is not None, f"no record for {jid}"
    return found


def step(found: Record, index: int = -1) -> dict[str, Any]:
    """One trail entry with its extra fields (threshold, confidence, margin, ...)."""
    return found.trail[index].model_dump()


def requests_counted(rt: Runtime) -> int:
    return int(rt.redis.get(keys.TYPED_REQUESTS) or 0)


def raw_record(rt: Runtime, jid: str) -> str:
    """Everything Redis holds for a judgement, as text (to prove a secret is nowhere in it)."""
    fields = rt.redis.hgetall(keys.record(jid))
    return json.dumps({k.decode(): v.decode() for k, v in fields.items()})


def by_state(qid: str, question: dict[str, Any], state: Any) -> WireAnswer | None:
    """A fake responder: each judgement's state carries the wire answer for each question id."""
    return (state.get("answers") or {}).get(qid.rsplit("__", 1)[-1]) if isinstance(state, dict) else None


# --- gates at and around each boundary --------------------------------------------------------
LOCAL_068 = {"DISPATCHQ_GATE_LOCAL": "0.68"}
EXTERNAL_09 = {"DISPATCHQ_GATE_EXTERNAL": "0.9"}
EXTERNAL_07 = {"DISPATCHQ_GATE_EXTERNAL": "0.7"}

GATES = [
    # kind, settings, question, wire answer, threshold, confidence, acts, value if it acts
    ("noul-local", {}, "yes", noul(0.8), 0.6, 0.6, True, True),  # |2*0.8-1| = 0.6000000000000001
    ("noul-local", {}, "yes", noul(0.2), 0.6, 0.6, True, False),
    ("noul-local", {}, "yes", noul(0.79), 0.6, 0.58, False, None),
    ("noul-local", {}, "yes", noul(0.21), 0.6, 0.58, False, None),
    ("noul-local", LOCAL_068, "yes", noul(0.16), 0.68, 0.68, True, False),  # 0.6799999999999999
    ("noul-local", LOCAL_068, "yes", noul(0.84), 0.68, 0.68, True, True),
    ("noul-local", LOCAL_068, "yes", noul(0.165), 0.68, 0.67, False, None),
    ("noul-local", LOCAL_068, "yes", noul(0.8), 0.68, 0.6, False, None),  # acts only at the default
    ("noul-external", {}, "yes", noul(0.925), 0.85, 0.85, True, True),  # 0.8500000000000001
    ("noul-external", {}, "yes", noul(0.92), 0.85, 0.84, False, None),
    ("noul-external", {}, "yes", noul(0.8), 0.85, 0.6, False, None),  # enough locally, not outside
    ("noul-external", EXTERNAL_09, "yes", noul(0.05), 0.9, 0.9, True, False),
    ("noul-external", EXTERNAL_09, "yes", noul(0.06), 0.9, 0.88, False, None),
    ("choice-local", {}, "area", choice("docs", 0.6), 0.6, 0.6, True, "docs"),
    ("choice-local", {}, "area", choice("docs", 0.59), 0.6, 0.59, False, None),
    ("choice-local", LOCAL_068, "area", choice("bug", 0.68), 0.68, 0.68, True, "bug"),
    ("choice-local", LOCAL_068, "area", choice("bug", 0.67), 0.68, 0.67, False, None),
    ("choice-external", {}, "area", choice("bug", 0.85), 0.85, 0.85, True, "bug"),
    ("choice-external", {}, "area", choice("bug", 0.849), 0.85, 0.849, False, None),
    ("choice-external", EXTERNAL_07, "area", choice("feature", 0.7), 0.7, 0.7, True, "feature"),
    ("choice-external", EXTERNAL_07, "area", choice("feature", 0.69), 0.7, 0.69, False, None),
    ("score-local", {}, "level", score(1.6, 0.6), 0.6, 0.6, True, 1.6),
    ("score-local", {}, "level", score(1.6, 0.59), 0.6, 0.59, False, None),
    ("score-local", LOCAL_068, "level", score(0.4, 0.68), 0.68, 0.68, True, 0.4),
    ("score-local", LOCAL_068, "level", score(0.4, 0.67), 0.68, 0.67, False, None),
    ("score-external", {}, "level", score(2.0, 0.85), 0.85, 0.85, True, 2.0),
    ("score-external", {}, "level", score(2.0, 0.84), 0.85, 0.84, False, None),
    ("score-external", EXTERNAL_09, "level", score(1.5, 0.9), 0.9, 0.9, True, 1.5),
    ("score-external", EXTERNAL_09, "level", score(1.5, 0.89), 0.9, 0.89, False, None),
]


def _gate_id(case: tuple[Any, ...]) -> str:
    kind, env, _, wire, threshold, _, acts, _ = case
    number = wire.get("noul", wire.get("confidence"))
    return f"{kind}-{'acts' if acts else 'moves-up'}-{number}-at-{threshold}{'-set' if env else ''}"


@pytest.mark.parametrize(
    ("kind", "env", "question", "wire", "threshold", "confidence", "acts", "value"),
    GATES,
    ids=[_gate_id(c) for c in GATES],
)
def test_the_gate_for_each_type_effect_and_threshold(
    make_rt: Callable[..., Runtime],
    api: FakeTypeSafeAPI,
    kind: str,
    env: dict[str, str],
    question: str,
    wire: WireAnswer,
    threshold: float,
    confidence: float,
    acts: bool,
    value: Any,
) -> None:
    rt = make_rt(**env)
    api.answer(question, wire)
    jid = enqueue(rt, kind, {"body": "please rename this"})
    drain(rt, sessions=False)

    found = record(rt, jid)
    last = step(found)
    assert api.request_count == 1
    assert last["tier"] == "typed"
    assert last["numbers"]["threshold"] == threshold
    assert last["numbers"]["confidence"] == pytest.approx(confidence)
    assert last["numbers"]["confidences"] == {question: pytest.approx(confidence)}
    if question == "yes":  # noul gates are shown as probabilities too
        hi, lo = round((1 + threshold) / 2, 9), round((1 - threshold) / 2, 9)
        assert last["gate"] == f"confidence >= {threshold:g} (p >= {hi:g} or p <= {lo:g})"
    if acts:
        assert (found.status, found.tier, last["outcome"]) == ("answered", "typed", "answered")
        assert found.value == value and type(found.value) is type(value)
        assert found.confidence == pytest.approx(confidence)
        assert last["numbers"]["margin"] >= 0
    else:
        assert (found.status, found.tier, last["outcome"]) == ("needs-triage", "needs-triage", "moved-up")
        assert found.value is None
        assert (
            last["numbers"]["margin"] == pytest.approx(confidence - threshold)
            and last["numbers"]["margin"] < 0
        )
        assert f"< {threshold:g}" in (found.reason or "")


@pytest.mark.parametrize(("level_confidence", "acts"), [(0.5, False), (0.6, True)])
def test_confidence_is_the_minimum_over_gate_on_never_an_average(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI, level_confidence: float, acts: bool
) -> None:
    rt = make_rt()
    api.answer("yes", noul(0.95))  # confidence 0.9
    api.answer("level", score(2.0, level_confidence))
    jid = enqueue(rt, "gated", {"body": "x"})
    drain(rt, sessions=False)

    found = record(rt, jid)
    last = step(found)
    # An average would be 0.7 (acts) and 0.75: the minimum is what the gate sees and reports.
    assert last["numbers"]["confidence"] == pytest.approx(level_confidence)
    assert last["numbers"]["confidences"] == {
        "yes": pytest.approx(0.9),
        "level": pytest.approx(level_confidence),
    }
    if acts:
        assert (found.status, found.value) == ("answered", True)
        assert found.confidence == pytest.approx(level_confidence)
    else:
        assert found.status == "needs-triage"
        assert "weakest: level" in last["why"]


def test_gate_on_replaces_the_answer_questions_confidence(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt()
    api.answer("yes", noul(0.6))  # confidence 0.2: not gated on
    api.answer("level", score(1.0, 0.9))
    jid = enqueue(rt, "gated-elsewhere", {"body": "x"})
    drain(rt, sessions=False)
    found = record(rt, jid)
    assert (found.status, found.value, found.confidence) == ("answered", True, pytest.approx(0.9))
    assert step(found)["numbers"]["confidences"] == {"level": pytest.approx(0.9)}


def test_result_json_shows_each_types_value_and_keeps_the_raw_numbers(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI, typed_env: dict[str, str]
) -> None:
    rt = make_rt()
    api.answer("yes", noul(0.1))
    api.answer("area", choice("docs", 0.9, {"bug": 0.05, "feature": 0.05, "docs": 0.9}))
    api.answer("level", score(1.6, 0.9))
    ids = {kind: enqueue(rt, kind, {"body": "x"}) for kind in ("noul-local", "choice-local", "score-local")}
    drain(rt, sessions=False)

    shown: dict[str, Any] = {}
    for kind, jid in ids.items():
        done = run_cli(["result", jid, "--json"], typed_env)
        assert done.returncode == 0, done.stderr
        assert TYPED_KEY not in done.stdout
        shown[kind] = json.loads(done.stdout)
    assert all(r["status"] == "answered" and r["tier"] == "typed" for r in shown.values())

    noul_r = shown["noul-local"]
    assert noul_r["value"] is False and noul_r["confidence"] == pytest.approx(0.8)
    assert noul_r["raw"]["answers"]["yes"]["raw"] == {"type": "noul", "noul": 0.1}

    choice_r = shown["choice-local"]
    assert choice_r["value"] == "docs" and choice_r["confidence"] == 0.9
    assert choice_r["raw"]["answers"]["area"]["raw"]["probabilities"] == {
        "bug": 0.05,
        "feature": 0.05,
        "docs": 0.9,
    }

    score_r = shown["score-local"]
    assert score_r["value"] == 1.6 and isinstance(score_r["value"], float)  # never rounded to 2
    raw = score_r["raw"]["answers"]["level"]["raw"]
    assert raw["score"] == 1.6
    assert raw["legend"] == {"0": "can wait", "1": "this week", "2": "today"}
    assert raw["probabilities"]["1"] == pytest.approx(0.4) and raw["probabilities"]["2"] == pytest.approx(0.6)
    assert score_r["raw"]["model"] == DEFAULT_RESOLVED_MODEL  # the resolved id, beside the request
    assert score_r["raw"]["requested_model"] == "jev-latest"


# --- what falls short moves up ------------------------------------------------------------------
def test_what_falls_short_moves_up_as_the_kind_says_with_the_numbers(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt()
    api.answer("yes", noul(0.7))  # confidence 0.4 < 0.6
    to_session = enqueue(rt, "to-session", {"body": "x"})
    to_person = enqueue(rt, "noul-local", {"body": "x"})
    drain(rt, sessions=False)

    session = record(rt, to_session)
    assert (session.status, session.tier, session.value) == ("queued", "session", None)
    assert rt.storage.records.line_ids(keys.session_line()) == [to_session]
    person = record(rt, to_person)
    assert (person.status, person.tier) == ("needs-triage", "needs-triage")
    for found in (session, person):
        last = step(found)
        assert (last["tier"], last["outcome"]) == ("typed", "moved-up")
        assert last["numbers"]["confidence"] == pytest.approx(0.4)
        assert last["numbers"]["threshold"] == 0.6
        assert last["numbers"]["margin"] == pytest.approx(-0.2)
        assert last["gate"] == "confidence >= 0.6 (p >= 0.8 or p <= 0.2)"
        assert "0.4 < 0.6" in last["why"]
        assert found.raw["answers"]["yes"]["raw"]["noul"] == 0.7  # the raw p stays in the record
    assert record(rt, to_session).confidence == pytest.approx(0.4)


# --- provider trouble ---------------------------------------------------------------------------
def test_a_rate_limit_then_success_is_answered_by_the_sdks_own_retry(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt()
    api.answer("yes", noul(0.95))
    api.rate_limit(retry_after_ms=10)
    jid = enqueue(rt, "noul-local", {"body": "x"})
    drain(rt, sessions=False)

    found = record(rt, jid)
    assert (found.status, found.value) == ("answered", True)
    assert [s.outcome for s in found.trail] == ["answered"]  # never left the worker
    assert [r.status for r in api.systemone_requests] == [429, 200]
    assert requests_counted(rt) == 1  # one provider call; the SDK's retry is inside it


def test_a_long_retry_after_is_scheduled_without_holding_a_worker(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt()
    api.answer("yes", noul(0.95))
    # Longer than the SDK's own retry budget: the call ends at once with the advised delay.
    api.fail(429, headers={"retry-after": "120"})
    jid = enqueue(rt, "noul-local", {"body": "x"})
    set_runtime(rt)
    before = time.time()
    make_worker(rt, "typed").work(burst=True, logging_level="WARNING", with_scheduler=False)

    # The worker returned: the judgement waits in rq-scheduler, in no worker and no queue.
    waiting = record(rt, jid)
    assert (waiting.status, waiting.tier, waiting.attempts) == ("queued", "typed", 1)
    assert [s.outcome for s in waiting.trail] == ["retry-scheduled"]
    assert sum(q.count for q in rt.dispatcher.queues_for("typed")) == 0
    [(job, when)] = rt.scheduler.get_jobs(with_times=True)
    assert job.origin == keys.queue_name("typed") and list(job.args[0]) == [jid]
    assert when.replace(tzinfo=UTC).timestamp() >= before + 120  # never before the advised delay
    assert api.request_count == 1

    # Beyond the horizon a burst drain does not wait: it reports the retry it leaves.
    assert drain(rt, sessions=False)["delayed_retries_left"] == 1
    assert record(rt, jid).status == "queued" and api.request_count == 1

    # Once due (time moved on), it is released and answered like any other.
    rt.scheduler.change_execution_time(job, datetime.now(UTC).replace(tzinfo=None))
    assert drain(rt, sessions=False)["delayed_retries_left"] == 0
    found = record(rt, jid)
    assert (found.status, found.value) == ("answered", True)
    assert [s.outcome for s in found.trail] == ["retry-scheduled", "answered"]
    assert api.request_count == 2


def test_a_retry_is_not_run_early_by_another_job_that_carried_the_judgement(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    # Two enqueues on one state are two RQ jobs; the first takes both (one request). When that
    # request is rate limited, both wait for the advised delay: the second job must not ask again.
    rt = make_rt()
    api.fail(429, headers={"retry-after": "120"})
    first = enqueue(rt, "noul-local", {"body": "same"}, target="acme/app#1")
    second = enqueue(rt, "noul-local", {"body": "same"}, target="acme/app#2")
    set_runtime(rt)
    make_worker(rt, "typed").work(burst=True, logging_level="WARNING", with_scheduler=False)

    assert api.request_count == 1
    for jid in (first, second):
        found = record(rt, jid)
        assert (found.status, found.attempts) == ("queued", 1)
        assert [s.outcome for s in found.trail] == ["retry-scheduled"]
    [job] = list(rt.scheduler.get_jobs())

    rt.scheduler.change_execution_time(job, datetime.now(UTC).replace(tzinfo=None))  # time passes
    drain(rt, sessions=False)
    assert [record(rt, jid).status for jid in (first, second)] == ["answered", "answered"]
    assert api.request_count == 2


def test_a_retry_is_never_scheduled_before_the_advised_delay(make_rt: Callable[..., Runtime]) -> None:
    # rq-scheduler keeps whole seconds; truncating would run a 1 s retry up to a second early.
    rt = make_rt()
    for _ in range(3):
        before = time.time()
        job = schedule_typed_retry(rt, ["x"], 1.0)
        [when] = [w for j, w in rt.scheduler.get_jobs(with_times=True) if j.id == job.id]
        assert when.replace(tzinfo=UTC).timestamp() >= before + 1.0


@pytest.mark.slow
def test_a_short_rate_limit_the_sdk_gives_up_on_is_answered_within_the_horizon(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt()
    api.answer("yes", noul(0.95))
    # Three 429s exhaust the SDK's own retries (2); the advised second then goes to the
    # scheduler, and a burst drain waits for it (due within DISPATCHQ_RETRY_HORIZON).
    api.fail(429, headers={"retry-after": "1"}, times=3)
    jid = enqueue(rt, "noul-local", {"body": "x"})
    assert drain(rt, sessions=False)["delayed_retries_left"] == 0
    found = record(rt, jid)
    assert (found.status, found.value) == ("answered", True)
    assert [s.outcome for s in found.trail] == ["retry-scheduled", "answered"]
    assert [r.status for r in api.systemone_requests] == [429, 429, 429, 200]


def test_server_errors_exhausted_over_the_attempts_move_up_with_the_error(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt(DISPATCHQ_TYPED_ATTEMPTS="2")
    # Each attempt is one SDK call of three requests (2 retries), advised 10 ms apart.
    api.fail(503, headers={"retry-after-ms": "10"}, times=6)
    jid = enqueue(rt, "to-session", {"body": "x"})
    drain(rt, sessions=False)

    found = record(rt, jid)
    assert (found.status, found.tier) == ("queued", "session")
    assert [(s.tier, s.outcome) for s in found.trail] == [("typed", "retry-scheduled"), ("typed", "moved-up")]
    last = step(found)
    assert "after 2 attempts" in last["why"] and "server" in last["why"]
    assert "503" in last["error"] or "Service unavailable" in last["error"]
    assert found.attempts == 2
    assert api.request_count == 6 and requests_counted(rt) == 2
    assert rt.storage.records.line_ids(keys.session_line()) == [jid]


def test_an_auth_error_moves_up_at_once_and_the_key_is_nowhere_in_the_record(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI, typed_env: dict[str, str]
) -> None:
    rt = make_rt()
    api.fail(401, echo_authorization=True)  # a server that quotes the credentials back
    jid = enqueue(rt, "noul-local", {"body": "x"})
    drain(rt, sessions=False)

    found = record(rt, jid)
    assert found.status == "needs-triage"
    assert [(s.tier, s.outcome) for s in found.trail] == [("typed", "moved-up")]
    last = step(found)
    assert "refused (auth)" in last["why"] and "401" in last["error"]
    assert "rejected credentials" in last["error"]  # the server's words are kept ...
    assert TYPED_KEY not in raw_record(rt, jid)  # ... but never the key
    assert api.request_count == 1  # not retried
    assert due_retries(rt, 3600) == (None, 0)
    shown = run_cli(["result", jid, "--json"], typed_env)
    assert shown.returncode == 0 and TYPED_KEY not in shown.stdout + shown.stderr


def test_an_unknown_answer_type_is_no_answer_and_moves_up(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt()
    api.unknown_type("yes")
    jid = enqueue(rt, "to-session", {"body": "x"})
    drain(rt, sessions=False)

    found = record(rt, jid)
    assert (found.status, found.tier) == ("queued", "session")
    why = step(found)["why"]
    assert why.startswith("no answer for yes") and "a type this SDK does not know" in why  # the cause
    assert "yes" in found.raw["missing"] and found.raw["answers"] == {}


# --- answers outside the question, and one bad answer among good ones ----------------------------
@pytest.mark.parametrize(
    ("kind", "question", "wire", "cause"),
    [
        ("choice-external", "area", {"type": "choice", "choice": "zzz", "confidence": 0.99}, "not one of"),
        ("score-local", "level", score(3.0, 0.99, probabilities={"2": 1.0}), "outside the levels' range"),
        ("noul-local", "yes", noul(1.5), "between 0 and 1"),
        ("choice-local", "area", choice("bug", 0.99, {"bug": 0.99, "docs": 0.5}), "sum to 1.49"),
    ],
)
def test_an_answer_outside_the_question_is_never_acted_on(
    make_rt: Callable[..., Runtime],
    api: FakeTypeSafeAPI,
    kind: str,
    question: str,
    wire: WireAnswer,
    cause: str,
) -> None:
    rt = make_rt()
    api.answer(question, wire)
    jid = enqueue(rt, kind, {"body": "x"})
    drain(rt, sessions=False)

    found = record(rt, jid)
    assert (found.status, found.value) == ("needs-triage", None)
    last = step(found)
    assert (last["tier"], last["outcome"]) == ("typed", "moved-up")
    assert last["why"].startswith(f"no answer for {question}") and cause in last["why"]
    assert found.raw["answers"] == {}


def test_one_answer_without_confidence_does_not_sink_the_others_on_its_state(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt()

    def respond(qid: str, question: dict[str, Any], state: Any) -> WireAnswer:
        if qid.endswith("__area"):
            return {"type": "choice", "choice": "bug"}  # no confidence: the SDK refuses the response
        return noul(0.95)

    api.responder = respond
    good = enqueue(rt, "noul-local", {"body": "shared"})
    broken = enqueue(rt, "choice-local", {"body": "shared"})
    drain(rt, sessions=False)

    assert api.request_count == 1  # one state, one request, not asked again
    assert (record(rt, good).status, record(rt, good).value) == ("answered", True)
    moved = record(rt, broken)
    assert moved.status == "needs-triage"
    assert "lacks 'confidence'" in step(moved)["why"] and ".area.confidence" in step(moved)["why"]


def test_an_html_body_on_a_200_moves_up_only_its_own_states_judgements(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt()
    api.queue(Failure(status=200, body="<html><body>Sign in to the proxy</body></html>"))
    first = enqueue(rt, "noul-local", {"body": "one"}, target="acme/app#1")
    second = enqueue(rt, "noul-local", {"body": "two"}, target="acme/app#2")
    drain(rt, sessions=False)

    assert api.request_count == 2
    found = sorted((record(rt, jid) for jid in (first, second)), key=lambda r: r.status)
    assert [r.status for r in found] == ["answered", "needs-triage"]
    assert "bad_response" in step(found[1])["why"]


# --- batching and the decision cache -----------------------------------------------------------
def test_k_judgements_over_s_states_cost_s_requests(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt()
    api.responder = lambda qid, question, state: noul(state["p"])
    states = [{"p": 0.95, "body": "rename it"}, {"p": 0.05, "body": "looks good"}]
    judgements = [
        JudgementIn(kind="noul-local", target=f"acme/app#{n}", state=states[n % 2]) for n in range(6)
    ]
    results = Client(runtime=rt).enqueue_many(judgements)
    drain(rt, sessions=False)

    assert api.request_count == 2 and requests_counted(rt) == 2
    assert sorted(len(r.question_ids) for r in api.systemone_requests) == [3, 3]
    for n, result in enumerate(results):
        assert result.id is not None
        found = record(rt, result.id)
        assert (found.status, found.value) == ("answered", n % 2 == 0), found.target  # routed back right


def test_a_forced_redelivery_is_served_from_the_cache_with_no_request(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt()
    api.answer("area", choice("bug", 0.9))
    first = enqueue(rt, "choice-local", {"body": "crash"})
    drain(rt, sessions=False)
    assert api.request_count == 1

    again = enqueue(rt, "choice-local", {"body": "crash"}, force=True)
    assert again != first
    drain(rt, sessions=False)
    found = record(rt, again)
    assert (found.status, found.tier, found.value) == ("answered", "typed", "bug")
    assert step(found)["cached"] is True and found.raw["cached"] is True
    assert api.request_count == 1 and requests_counted(rt) == 1


def test_a_redelivery_after_the_record_expired_makes_no_request(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt(DISPATCHQ_RESULT_TTL="3600")
    api.answer("area", choice("docs", 0.9))
    first = enqueue(rt, "choice-local", {"body": "typo in README"})
    drain(rt, sessions=False)
    done = record(rt, first)
    assert done.status == "answered" and done.content_key is not None
    record_ttl = rt.redis.ttl(keys.record(first))
    [cache_key] = rt.redis.keys(keys.typed_cache("*", "*"))
    assert 0 < record_ttl <= 3600 < rt.redis.ttl(cache_key)  # the answers outlive the record

    # What Redis does when the result TTL passes: the record and its idempotency key go.
    for key in (keys.record(first), keys.idempotency(done.content_key)):
        rt.redis.pexpire(key, 1)
    wait_for(lambda: not rt.redis.exists(keys.record(first)), timeout=10, what="the record to expire")

    again = enqueue(rt, "choice-local", {"body": "typo in README"})
    assert again != first  # a new judgement: nothing live to deduplicate against
    drain(rt, sessions=False)
    found = record(rt, again)
    assert (found.status, found.value) == ("answered", "docs")
    assert step(found)["cached"] is True
    assert api.request_count == 1


def test_the_cache_is_keyed_on_the_requested_model(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt()
    enqueue(rt, "noul-local", {"body": "x"})
    drain(rt, sessions=False)
    other = make_rt(TYPESAFE_DEFAULT_MODEL="jev-2")
    jid = enqueue(other, "noul-local", {"body": "x"}, force=True)
    drain(other, sessions=False)
    assert api.request_count == 2
    assert api.systemone_requests[-1].body["model"] == "jev-2"
    assert record(other, jid).raw["requested_model"] == "jev-2"


def _break_with_auth(api: FakeTypeSafeAPI) -> None:
    api.fail(401)


def _break_with_5xx(api: FakeTypeSafeAPI) -> None:
    api.fail(500, headers={"retry-after-ms": "10"}, times=3)


def _break_with_unknown_type(api: FakeTypeSafeAPI) -> None:
    api.answer("yes", {"type": "box2", "box2": {"x": 0.5}, "confidence": 0.99}, times=1)


@pytest.mark.parametrize(
    "trouble",
    [_break_with_auth, _break_with_5xx, _break_with_unknown_type, None],
    ids=["auth-error", "server-errors", "missing-answer", "keyless"],
)
def test_errors_missing_answers_and_keyless_runs_are_never_cached(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI, trouble: Callable[[FakeTypeSafeAPI], None] | None
) -> None:
    first = make_rt(keyless=trouble is None, DISPATCHQ_TYPED_ATTEMPTS="1")
    if trouble is not None:
        trouble(api)
    failed = enqueue(first, "noul-local", {"body": "x"})
    drain(first, sessions=False)
    assert record(first, failed).status == "needs-triage"
    before = api.request_count
    assert not first.redis.keys(keys.typed_cache("*", "*"))

    healthy = make_rt()
    jid = enqueue(healthy, "noul-local", {"body": "x"}, force=True)
    drain(healthy, sessions=False)
    found = record(healthy, jid)
    assert (found.status, found.value) == ("answered", True)
    assert step(found)["cached"] is False
    assert api.request_count == before + 1


# --- ordering -------------------------------------------------------------------------------------
def test_order_sets_priority_without_a_gate_and_the_session_line_follows_it(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt()
    api.responder = by_state

    def unsure(level: float) -> dict[str, Any]:
        # `yes` falls short (0.2 < 0.6); the ordering answer is barely confident and still counts.
        return {"answers": {"yes": noul(0.6), "level": score(level, 0.05)}}

    plan = [
        ("ordered", "low-first", unsure(0.5)),
        ("ordered", "high-a", unsure(2.0)),
        ("order-only", "middle", {"answers": {"level": score(1.2, 0.1)}}),
        ("ordered", "high-b", unsure(2.0)),
        ("ordered", "unordered", {"answers": {"yes": noul(0.6), "level": unknown_answer()}}),  # none
        ("ordered", "settled", {"answers": {"yes": noul(0.99), "level": score(2.0, 0.05)}}),
    ]
    judgements = [JudgementIn(kind=k, target=t, state=s) for k, t, s in plan]
    ids = {t: r.id for (_, t, _), r in zip(plan, Client(runtime=rt).enqueue_many(judgements), strict=True)}
    drain(rt, sessions=False)

    # Higher priority first, then first come first served.
    line = rt.storage.records.line_ids(keys.session_line())
    assert line == [ids["high-a"], ids["high-b"], ids["middle"], ids["low-first"], ids["unordered"]]
    assert record(rt, ids["high-a"]).priority == 2.0
    assert record(rt, ids["middle"]).priority == pytest.approx(1.2)
    assert record(rt, ids["unordered"]).priority is None
    only = record(rt, ids["middle"])
    assert step(only)["why"] == "ordering only: priority set, no answer to give"
    # A low-confidence ordering answer neither blocks nor drops a judgement the band answers.
    settled = record(rt, ids["settled"])
    assert (settled.status, settled.value) == ("answered", True)
    assert settled.priority is None and ids["settled"] not in line


def test_a_choice_with_a_priority_map_orders_the_line(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt()
    api.responder = by_state
    plan = [("low", choice("low", 0.4)), ("high", choice("high", 0.3))]
    judgements = [
        JudgementIn(kind="order-by-label", target=t, state={"answers": {"yes": noul(0.5), "tier": w}})
        for t, w in plan
    ]
    ids = [r.id for r in Client(runtime=rt).enqueue_many(judgements)]
    drain(rt, sessions=False)
    assert rt.storage.records.line_ids(keys.session_line()) == [ids[1], ids[0]]
    assert [record(rt, jid).priority for jid in ids] == [1.0, 10.0]  # type: ignore[arg-type]


# --- no key -----------------------------------------------------------------------------------------
def test_keyless_typed_judgements_move_on_with_zero_requests(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt(keyless=True)
    to_session = enqueue(rt, "ordered", {"body": "x"})
    to_person = enqueue(rt, "choice-external", {"body": "x"})
    drain(rt, sessions=False)

    assert api.request_count == 0 and requests_counted(rt) == 0
    session = record(rt, to_session)
    assert (session.status, session.tier) == ("queued", "session")
    assert rt.storage.records.line_ids(keys.session_line()) == [to_session]
    person = record(rt, to_person)
    assert person.status == "needs-triage"
    for found in (session, person):
        assert [(s.tier, s.outcome, s.why) for s in found.trail] == [("typed", "moved-up", KEYLESS_WHY)]

    # `status` speaks for the workers: a shell holding a key still sees the tier keyless ...
    keyed = make_rt()
    assert collect_status(keyed).as_json()["typed"] == {
        "keyless": True,
        "keyless_worker_host": rt.settings.host,
    }
    # ... until a typed worker on that host runs with a key.
    enqueue(keyed, "noul-local", {"body": "x"})
    drain(keyed, sessions=False)
    assert collect_status(keyed).as_json()["typed"] == {"keyless": False, "keyless_worker_host": None}
    # The workers are the tier, not the operator's shell: a shell without a key does not make
    # the status say keyless, and live typed workers' own reports decide it.
    assert collect_status(make_rt(keyless=True)).typed.keyless is False
    keyed.storage.records.publish_worker("typed-a", {"tier": "typed", "host": "h", "keyless": True}, ttl=60)
    assert collect_status(keyed).typed.keyless is True
    keyed.storage.records.publish_worker("typed-b", {"tier": "typed", "host": "h", "keyless": False}, ttl=60)
    assert collect_status(keyed).typed.keyless is False
    assert {w.name for w in collect_status(keyed).worker_details} == {"typed-a", "typed-b"}


KEYLESS_LADDER = """
kinds:
  lockfile:
    check: {check}
    questions:
      yes: {{type: noul, instructions: "Only the lockfile?"}}
    answer: yes
    escalate: session
    session:
      prompt: "Is {{{{ target }}}} only a lockfile conflict? {{{{ state }}}}"
  area:
    effect: external
    questions:
      area: {{type: choice, instructions: "Which area?", criteria: {{bug: null, docs: null}}}}
    answer: area
    escalate: needs-triage
"""


def test_a_keyless_run_completes_the_whole_ladder_and_status_says_keyless(
    typed_env: dict[str, str], api: FakeTypeSafeAPI, tmp_path: Path
) -> None:
    module = tmp_path / "lockcheck.py"
    module.write_text("def check(j):\n    return j.state.get('known')\n")
    write_config(tmp_path / "dispatchq.yaml", KEYLESS_LADDER.format(check="lockcheck:check"))
    env = {k: v for k, v in typed_env.items() if k != "TYPESAFE_API_KEY"}
    env.update(
        DISPATCHQ_SESSION_COMMAND=f"{sys.executable} {REPO / 'tests' / 'support' / 'fake_claude.py'} -p "
        "--output-format stream-json --verbose",
        FAKE_CLAUDE_ANSWER="yes, only the lockfile",
    )
    lines = [
        {"kind": "lockfile", "target": "acme/app#1", "state": {"known": True}},  # code answers
        {"kind": "lockfile", "target": "acme/app#2", "state": {"known": None}},  # code, typed, session
        {"kind": "area", "target": "acme/app#3", "state": {"body": "x"}},  # typed, then a person
    ]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(line) + "\n" for line in lines))

    done = run_cli(["run", str(batch), "--json", "--no-progress"], env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    by_target = {j["target"]: j for j in out["judgements"]}
    assert (by_target["acme/app#1"]["status"], by_target["acme/app#1"]["tier"]) == ("answered", "code")
    climbed = by_target["acme/app#2"]
    assert (climbed["status"], climbed["tier"], climbed["value"]) == (
        "answered",
        "session",
        "yes, only the lockfile",
    )
    assert [(s["tier"], s["outcome"]) for s in climbed["trail"]][:2] == [
        ("code", "moved-up"),
        ("typed", "moved-up"),
    ]
    assert climbed["trail"][1]["why"] == KEYLESS_WHY
    assert by_target["acme/app#3"]["status"] == "needs-triage"
    assert out["summary"]["answered"] == {"code": 1, "typed": 0, "session": 1}
    assert api.request_count == 0

    status = run_cli(["status", "--json"], env, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["typed"]["keyless"] is True


# --- real worker processes ------------------------------------------------------------------
def test_a_typed_worker_process_answers_through_the_fake_in_its_own_process(
    typed_env: dict[str, str], tmp_path: Path
) -> None:
    script = {"answers": {"yes": noul(0.9), "area": choice("bug", 0.95)}}
    with FakeTypeSafeProcess(script, workdir=tmp_path, api_key=TYPED_KEY) as fake:
        env = {**typed_env, "TYPESAFE_BASE_URL": fake.url}
        ids = []
        for kind in ("noul-local", "choice-external"):
            made = run_cli(["enqueue", "--kind", kind, "--target", TARGET, "--state", '{"body": "x"}'], env)
            assert made.returncode == 0, made.stderr
            ids.append(made.stdout.strip())
        worker = run_cli(["worker", "typed", "--burst", "--quiet"], env)
        assert worker.returncode == 0, worker.stderr
        assert TYPED_KEY not in worker.stdout + worker.stderr
        shown = [json.loads(run_cli(["result", jid, "--json"], env).stdout) for jid in ids]
        assert [(r["status"], r["tier"], r["value"]) for r in shown] == [
            ("answered", "typed", True),
            ("answered", "typed", "bug"),
        ]
        # Two enqueues are two RQ jobs, but one state: the worker asks about both at once.
        assert fake.request_count == 1
        assert sorted(q.split("__")[-1] for q in fake.requests[0].question_ids) == ["area", "yes"]


@pytest.mark.slow
def test_a_burst_worker_process_waits_for_a_retry_due_within_the_horizon(
    typed_env: dict[str, str], tmp_path: Path
) -> None:
    script = {
        "answers": {"yes": noul(0.9)},
        "failures": [{"status": 429, "headers": {"retry-after": "1"}, "times": 3}],
    }
    with FakeTypeSafeProcess(script, workdir=tmp_path, api_key=TYPED_KEY) as fake:
        env = {**typed_env, "TYPESAFE_BASE_URL": fake.url}
        made = run_cli(["enqueue", "--kind", "noul-local", "--target", TARGET, "--state", "{}"], env)
        jid = made.stdout.strip()
        worker = run_cli(["worker", "typed", "--burst", "--quiet"], env)
        assert worker.returncode == 0, worker.stderr
        found = json.loads(run_cli(["result", jid, "--json"], env).stdout)
        assert (found["status"], found["value"]) == ("answered", True)
        assert [s["outcome"] for s in found["trail"]] == ["retry-scheduled", "answered"]
        assert [r.status for r in fake.requests] == [429, 429, 429, 200]


@pytest.mark.parametrize("args", [["worker", "typed", "--burst"], ["run", "judgements.jsonl"]])
def test_a_malformed_key_is_refused_when_settings_load_and_no_worker_starts(
    typed_env: dict[str, str], api: FakeTypeSafeAPI, tmp_path: Path, args: list[str]
) -> None:
    line = {"kind": "noul-local", "target": TARGET, "state": {"body": "x"}}
    (tmp_path / "judgements.jsonl").write_text(json.dumps(line) + "\n")
    env = {**typed_env, "TYPESAFE_API_KEY": "tsk-bad key with-space"}
    done = run_cli(args, env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "TYPESAFE_API_KEY" in lines[0] and "whitespace" in lines[0]
    assert "tsk-bad" not in done.stderr and "with-space" not in done.stderr + done.stdout
    assert api.request_count == 0


def test_the_typed_concurrency_setting_reaches_the_provider(make_rt: Callable[..., Runtime]) -> None:
    from dispatchq.tiers.typed.provider import TypeSafeProvider
    from dispatchq.tiers.typed.tier import provider_for

    default, set_to_2 = provider_for(make_rt()), provider_for(make_rt(DISPATCHQ_TYPED_CONCURRENCY="2"))
    assert isinstance(default, TypeSafeProvider) and isinstance(set_to_2, TypeSafeProvider)
    assert (default.options.concurrency, set_to_2.options.concurrency) == (4, 2)


@pytest.mark.parametrize(
    ("kind", "gate"),
    [
        ("noul-local", "confidence >= 0.6 (p >= 0.8 or p <= 0.2)"),
        ("choice-local", "confidence >= 0.6"),
        ("gated-elsewhere", "confidence >= 0.6"),  # a noul answer gated on a score: no p form
    ],
)
def test_the_gate_text_shows_the_p_form_only_for_a_noul_gate(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI, kind: str, gate: str
) -> None:
    rt = make_rt()
    api.answer("yes", noul(0.95))
    api.answer("area", choice("bug", 0.95))
    api.answer("level", score(1.0, 0.95))
    jid = enqueue(rt, kind, {"body": "x"})
    drain(rt, sessions=False)
    assert step(record(rt, jid))["gate"] == gate


def test_a_confidence_exactly_at_the_gate_has_margin_plus_zero(
    make_rt: Callable[..., Runtime], api: FakeTypeSafeAPI
) -> None:
    rt = make_rt(DISPATCHQ_GATE_LOCAL="0.6000000000000001")
    api.answer("area", choice("docs", 0.6))  # 0.6 - 0.6000000000000001 rounds to -0.0
    jid = enqueue(rt, "choice-local", {"body": "x"})
    drain(rt, sessions=False)
    found = record(rt, jid)
    assert found.status == "answered"
    assert f"{step(found)['numbers']['margin']:+g}" == "+0"
