"""The ladder: a judgement enters at the cheapest tier its kind supports and only moves up.

The pure functions are tested without Redis; the last tests run the code tier on a real
Redis in-process to show that what the code tier answered never reaches a model.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from dispatchq.config import parse_config
from dispatchq.core import tiers as tier_table
from dispatchq.core.answers import Answer
from dispatchq.core.kinds import Kind
from dispatchq.core.ladder import decide_typed, entry_tier, next_tier, threshold_for
from dispatchq.errors import LadderError
from dispatchq.process.wiring import drain
from dispatchq.queue.dispatch import Moves
from dispatchq.storage import keys
from tests.support.helpers import counting_check, write_config

NOUL = {"type": "noul", "instructions": "?"}
SESSION = {"prompt": "Decide {{ target }}"}


def kind_of(doc: dict[str, Any]) -> Kind:
    return parse_config({"kinds": {"k": doc}}).kinds["k"]


#: Every shape a kind can take: (has a check, has questions, has a session block / escalate).
SHAPES: dict[str, dict[str, Any]] = {
    "check": {"check": "tests.support.checks:noop"},
    "check+session": {"check": "tests.support.checks:noop", "session": SESSION},
    "produce": {"produce": [["true"]], "verify": [["true"]]},
    "typed": {"questions": {"q": NOUL}, "answer": "q", "escalate": "needs-triage"},
    "typed+session": {"questions": {"q": NOUL}, "answer": "q", "session": SESSION},
    "check+typed": {"check": "tests.support.checks:noop", "questions": {"q": NOUL}, "answer": "q"},
    "check+typed+session": {
        "check": "tests.support.checks:noop",
        "questions": {"q": NOUL},
        "answer": "q",
        "session": SESSION,
    },
    "session": {"session": SESSION},
}


@pytest.mark.parametrize(
    ("shape", "entry"),
    [
        ("check", "code"),
        ("check+session", "code"),
        ("produce", "code"),
        ("typed", "typed"),
        ("typed+session", "typed"),
        ("check+typed", "code"),
        ("check+typed+session", "code"),
        ("session", "session"),
    ],
)
def test_entry_tier_is_the_cheapest_the_kind_supports(shape: str, entry: str) -> None:
    assert entry_tier(kind_of(SHAPES[shape])) == entry


@pytest.mark.parametrize(
    ("shape", "current", "up"),
    [
        ("check", "code", "needs-triage"),
        ("check+session", "code", "session"),
        ("check+typed", "code", "typed"),
        ("check+typed+session", "code", "typed"),
        ("check+typed+session", "typed", "session"),
        ("typed", "typed", "needs-triage"),
        ("typed+session", "typed", "session"),
    ],
)
def test_next_tier(shape: str, current: str, up: str) -> None:
    assert next_tier(kind_of(SHAPES[shape]), current) == up


RUNGS = (*tier_table.TIERS, tier_table.NEEDS_TRIAGE)


@pytest.mark.parametrize(("shape", "current"), list(itertools.product(SHAPES, RUNGS)))
def test_next_tier_only_ever_moves_up(shape: str, current: str) -> None:
    kind = kind_of(SHAPES[shape])
    try:
        target = next_tier(kind, current)
    except LadderError:
        # Nowhere higher to go: the top of this kind's ladder (a session or a person).
        assert current in ("session", "needs-triage")
        return
    assert tier_table.rank(target) > tier_table.rank(current)


def test_session_and_needs_triage_have_nowhere_higher() -> None:
    kind = kind_of(SHAPES["check+typed+session"])
    with pytest.raises(LadderError):
        next_tier(kind, "session")
    with pytest.raises(LadderError):
        next_tier(kind, "needs-triage")


def test_a_kind_without_questions_skips_the_typed_tier() -> None:
    # The typed tier is never asked about a kind that has no questions for it.
    assert next_tier(kind_of(SHAPES["check+session"]), "code") == "session"


# --- the typed decision: act only inside the band --------------------------------------------------


def noul(question: str, p: float) -> Answer:
    return Answer.from_wire(question, {"type": "noul", "noul": p})


def score(question: str, level: float, confidence: float) -> Answer:
    return Answer.from_wire(question, {"type": "score", "score": level, "confidence": confidence})


GATED = {
    "questions": {
        "actionable": NOUL,
        "severity": {"type": "score", "instructions": "?", "criteria": ["low", "mid", "high"]},
    },
    "answer": "actionable",
    "gateOn": ["actionable", "severity"],
    "order": "severity",
    "escalate": "needs-triage",
}


def test_confidence_is_the_minimum_over_gate_on_not_an_average() -> None:
    kind = kind_of(GATED)
    answers = {"actionable": noul("actionable", 0.99), "severity": score("severity", 1.6, 0.5)}
    decision = decide_typed(kind, answers, 0.6)
    assert not decision.answered
    assert decision.confidence == pytest.approx(0.5)
    assert "weakest: severity" in decision.why
    assert decision.priority == pytest.approx(1.6)  # the ordering answer, unrounded and ungated


def test_inside_the_band_answers_with_the_answer_questions_value() -> None:
    kind = kind_of(GATED)
    answers = {"actionable": noul("actionable", 0.05), "severity": score("severity", 2.0, 0.95)}
    decision = decide_typed(kind, answers, 0.6)
    assert decision.answered
    assert decision.value is False  # a confident "no" is an answer
    assert decision.confidence == pytest.approx(0.9)


def test_gate_is_inclusive_and_robust_to_float_error() -> None:
    kind = kind_of(SHAPES["typed"])
    # |2 * 0.8 - 1| is 0.6000000000000001 in floats; 0.6 is exactly the local gate.
    assert decide_typed(kind, {"q": noul("q", 0.8)}, 0.6).answered
    assert not decide_typed(kind, {"q": noul("q", 0.79)}, 0.6).answered


def test_a_missing_answer_moves_up() -> None:
    decision = decide_typed(kind_of(GATED), {"actionable": noul("actionable", 1.0)}, 0.6)
    assert not decision.answered
    assert "no answer for severity" in decision.why


def test_ordering_only_kind_sets_priority_and_passes_on() -> None:
    kind = kind_of({"questions": {"s": GATED["questions"]["severity"]}, "order": "s", "session": SESSION})
    decision = decide_typed(kind, {"s": score("s", 2.4, 0.1)}, 0.6)
    assert not decision.answered and decision.priority == pytest.approx(2.4)


def test_external_effect_needs_the_higher_gate() -> None:
    local = kind_of(SHAPES["typed"])
    external = kind_of({**SHAPES["typed"], "effect": "external"})
    assert threshold_for(local, 0.6, 0.85) == 0.6
    assert threshold_for(external, 0.6, 0.85) == 0.85
    answers = {"q": noul("q", 0.85)}  # confidence 0.7
    assert decide_typed(local, answers, threshold_for(local, 0.6, 0.85)).answered
    assert not decide_typed(external, answers, threshold_for(external, 0.6, 0.85)).answered


# --- on real Redis: moves are committed only upward ------------------------------------------------

LADDER_CONFIG = """
kinds:
  lock:
    check: {check}
    questions:
      ok: {{type: noul, instructions: "Is it ok?"}}
    answer: ok
    session:
      prompt: "Decide {{{{ target }}}}"
"""


def test_code_answers_are_never_asked_of_the_typed_tier_or_a_session(
    tmp_path: Path, make_runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dispatchq.tiers.typed.tier as typed_tier

    check, calls = counting_check(tmp_path)
    write_config(tmp_path / "dispatchq.yaml", LADDER_CONFIG.format(check=check))
    rt = make_runtime()
    seen_by_typed: list[str] = []
    real = typed_tier.process_batch

    def spy(runtime: Any, ids: list[str], **kwargs: Any) -> int:
        seen_by_typed.extend(ids)
        return real(runtime, ids, **kwargs)

    monkeypatch.setattr(typed_tier, "process_batch", spy)
    client_ids = {}
    for target, answer in (("yes", "rebuild"), ("false", False), ("zero", 0), ("unknown", None)):
        client_ids[target] = rt.dispatcher.submit(
            [rt.dispatcher.prepare(_judgement(target, {"answer": answer}))]
        )[0][0]
    drain(rt, sessions=False)

    answered = {t: client_ids[t] for t in ("yes", "false", "zero")}
    for target, jid in answered.items():
        record = rt.storage.records.get(jid)
        assert record is not None
        assert (record.status, record.tier) == ("answered", "code"), target
        assert [step.tier for step in record.trail] == ["code"]
        assert jid not in seen_by_typed
    assert rt.storage.records.get(answered["false"]).value is False  # type: ignore[union-attr]
    assert rt.storage.records.get(answered["zero"]).value == 0  # type: ignore[union-attr]

    # Only "cannot tell" climbed: typed (keyless here) passed it on to the session line.
    unknown = rt.storage.records.get(client_ids["unknown"])
    assert unknown is not None and unknown.tier == "session"
    assert [(s.tier, s.outcome) for s in unknown.trail] == [("code", "moved-up"), ("typed", "moved-up")]
    assert seen_by_typed == [client_ids["unknown"]]
    assert rt.storage.records.line_ids(keys.session_line()) == [client_ids["unknown"]]
    assert sorted(calls.read_text().split()) == ["false", "unknown", "yes", "zero"]


def _judgement(target: str, state: Any) -> Any:
    from dispatchq.core.judgement import JudgementIn

    return JudgementIn(kind="lock", target=target, state=state)


def test_commit_refuses_a_move_that_does_not_go_up(tmp_path: Path, make_runtime: Any) -> None:
    check, _ = counting_check(tmp_path)
    write_config(tmp_path / "dispatchq.yaml", LADDER_CONFIG.format(check=check))
    rt = make_runtime()
    [(jid, _)] = rt.dispatcher.submit([rt.dispatcher.prepare(_judgement("t", {}))])
    assert rt.storage.records.claim([jid], "code")
    kind = rt.config.kind("lock")
    moves = Moves()
    moves.move_up(jid, kind, "session", "would go nowhere higher", host=None)
    with pytest.raises(LadderError):
        rt.dispatcher.commit(moves)
    record = rt.storage.records.get(jid)
    assert record is not None and (record.status, record.tier, record.trail) == ("running", "code", [])
