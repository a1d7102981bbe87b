"""Priority classes: what a producer may say, how a kind's default applies, and the line score."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from dispatchq.client import describe_validation
from dispatchq.core.judgement import JudgementIn, Record, content_key
from dispatchq.core.kinds import Kind
from dispatchq.core.priority import PRIORITIES, line_band, line_score, parse_priority, stored_priority
from dispatchq.errors import UserError
from dispatchq.queue.dispatch import urgency_of


def judgement(**fields: Any) -> JudgementIn:
    return JudgementIn.model_validate({"kind": "k", "target": "acme/app#12", **fields})


# --- what a producer may say ----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["urgent", "normal", "background"])
def test_each_class_is_accepted_as_said(value: str) -> None:
    assert judgement(priority=value).priority == value


@pytest.mark.parametrize("value", [None, ""])
def test_no_priority_is_not_said(value: Any) -> None:
    assert judgement(priority=value).priority is None
    assert judgement().priority is None


@pytest.mark.parametrize("value", ["bogus", "URGENT", 5, 1.5, True, ["urgent"], {"class": "urgent"}])
def test_a_bad_priority_is_refused_naming_the_field_and_the_classes(value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        judgement(priority=value)
    said = describe_validation(caught.value)
    assert said.startswith("priority: must be one of urgent, normal, background"), said
    assert repr(value) in said


def test_a_bad_priority_in_a_json_line_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as caught:
        JudgementIn.model_validate_json('{"kind": "k", "target": "t", "priority": "soon"}')
    assert (
        describe_validation(caught.value)
        == "priority: must be one of urgent, normal, background (got 'soon')"
    )


def test_the_class_is_not_part_of_the_judgements_identity() -> None:
    # Asking the same thing more urgently is the same judgement: its live duplicate answers.
    keys = {content_key(judgement(priority=p), "digest") for p in (None, *PRIORITIES)}
    assert len(keys) == 1


def test_parse_priority_names_the_three() -> None:
    assert parse_priority(None) == "normal"
    with pytest.raises(ValueError, match="urgent, normal, background"):
        parse_priority("high")


def test_a_stored_class_reads_leniently() -> None:
    assert [stored_priority(p) for p in PRIORITIES] == list(PRIORITIES)
    assert stored_priority(None) == "normal"  # a record written before classes existed
    assert stored_priority("garbage") == "normal"


# --- the kind's default -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("said", "default", "expected"),
    [
        (None, "normal", "normal"),
        (None, "background", "background"),
        (None, "urgent", "urgent"),
        ("urgent", "background", "urgent"),
        ("background", "urgent", "background"),
        ("normal", "urgent", "normal"),
    ],
)
def test_an_explicit_priority_wins_over_the_kinds_default(
    said: str | None, default: str, expected: str
) -> None:
    assert urgency_of(judgement(priority=said), Kind("k", priority=default)) == expected


def test_a_kind_without_a_default_is_normal() -> None:
    assert urgency_of(judgement(), Kind("k")) == "normal"


def test_a_kinds_bad_default_is_a_user_error_naming_the_kind() -> None:
    with pytest.raises(UserError, match="kind sweep: priority must be one of"):
        urgency_of(judgement(), Kind("sweep", priority="later"))


# --- the line score -----------------------------------------------------------------------------------


@pytest.mark.parametrize("order", [None, 0.0, 1.0, 5.0, -3.0, 0.25])
def test_a_normal_score_is_the_score_a_store_held_before_classes(order: float | None) -> None:
    assert line_score(order, "normal") == -(order or 0.0)
    assert line_score(order, None) == -(order or 0.0)


@pytest.mark.parametrize(("low", "high"), [(0.0, 1000.0), (-1000.0, 1e6), (1e6, -1e6)])
def test_a_higher_class_leads_whatever_the_order_scores(low: float, high: float) -> None:
    # Lowest score goes first: every urgent before every normal before every background.
    assert line_score(low, "urgent") < line_score(high, "normal")
    assert line_score(low, "normal") < line_score(high, "background")


def test_within_a_class_the_higher_order_score_leads() -> None:
    for name in PRIORITIES:
        assert line_score(5.0, name) < line_score(1.0, name) < line_score(None, name)


def test_the_bands_are_symmetric_around_normal() -> None:
    assert line_band("normal") == 0.0
    assert line_band("urgent") == -line_band("background") > 0


# --- the record -------------------------------------------------------------------------------------


def test_a_record_is_normal_unless_it_says_otherwise_and_shows_its_class_after_priority() -> None:
    plain = Record(id="a", kind="k", target="t", status="queued")
    assert plain.urgency == "normal"
    shown = Record(id="a", kind="k", target="t", status="queued", priority=2.0, urgency="urgent").public()
    names = list(shown)
    assert shown["urgency"] == "urgent"
    assert names.index("urgency") == names.index("priority") + 1
