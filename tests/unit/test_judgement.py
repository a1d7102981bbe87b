"""The judgement model and its content key: one definition of "the same judgement"."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from dispatchq.config import parse_config
from dispatchq.core.judgement import JudgementIn, Record, TrailEntry, canonical_json, content_key

DIGEST = "kind-digest-1"


def j(**fields: Any) -> JudgementIn:
    base: dict[str, Any] = {"kind": "k", "target": "acme/app#12"}
    return JudgementIn(**{**base, **fields})


# --- the key over content ----------------------------------------------------------------------


def test_key_is_stable_for_equal_content() -> None:
    one = j(item="comment:1", state={"a": 1, "b": [1, 2]}, context={"x": "y"})
    two = j(item="comment:1", state={"b": [1, 2], "a": 1}, context={"x": "y"})  # key order differs
    assert content_key(one, DIGEST) == content_key(two, DIGEST)
    assert len(content_key(one, DIGEST)) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"kind": "other"},
        {"target": "acme/app#13"},
        {"item": "comment:2"},
        {"state": {"a": 2}},
        {"state": {"a": "1"}},  # a string is not the number
        {"context": {"x": "z"}},
    ],
)
def test_key_changes_with_any_field(change: dict[str, Any]) -> None:
    base = {"item": "comment:1", "state": {"a": 1}, "context": {"x": "y"}}
    assert content_key(j(**base), DIGEST) != content_key(j(**{**base, **change}), DIGEST)


def test_key_changes_with_the_kind_definition() -> None:
    def kinds(instructions: str) -> Any:
        doc = {"questions": {"q": {"type": "noul", "instructions": instructions}}, "answer": "q"}
        return parse_config({"kinds": {"k": {**doc, "escalate": "needs-triage"}}}).kinds["k"]

    judgement = j(state={"a": 1})
    assert content_key(judgement, kinds("Is it?").digest) == content_key(judgement, kinds("Is it?").digest)
    assert content_key(judgement, kinds("Is it?").digest) != content_key(
        judgement, kinds("Is it, really?").digest
    )


def test_key_changes_with_the_checkout_fingerprint() -> None:
    judgement = j(context={"checkout": "/x"})
    assert content_key(judgement, DIGEST, "fp-1") != content_key(judgement, DIGEST, "fp-2")
    assert content_key(judgement, DIGEST, "fp-1") == content_key(judgement, DIGEST, "fp-1")


def test_producer_key_replaces_the_content() -> None:
    one = j(key="finding-7/attempt-1/abc", state={"a": 1})
    two = j(key="finding-7/attempt-1/abc", state={"a": 2}, target="elsewhere")
    assert content_key(one, DIGEST) == content_key(two, "another-digest", "fp")
    assert content_key(one, DIGEST) != content_key(j(key="finding-7/attempt-2/abc"), DIGEST)
    # ...scoped to the kind, and never equal to a content key.
    assert content_key(one, DIGEST) != content_key(j(kind="other", key="finding-7/attempt-1/abc"), DIGEST)
    assert content_key(one, DIGEST) != content_key(j(state={"a": 1}), DIGEST)


def test_canonical_json_is_one_spelling() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": "é"}]}) == '{"a":[1,{"c":"é","d":2}],"b":1}'
    with pytest.raises(ValueError):
        canonical_json(float("nan"))


# --- the judgement model -------------------------------------------------------------------------


def test_unknown_field_is_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        JudgementIn.model_validate({"kind": "k", "target": "t", "stat": {}})


@pytest.mark.parametrize("checkout", [5, "", ["a"]])
def test_checkout_must_be_a_path_string(checkout: Any) -> None:
    with pytest.raises(ValidationError, match=r"context\.checkout"):
        j(context={"checkout": checkout})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("state", float("nan")),
        ("state", {"x": float("inf")}),
        ("context", {"n": float("-inf")}),
        ("state", {1, 2}),
    ],
)
def test_state_and_context_must_be_plain_json(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=field):
        j(**{field: value})


def test_nan_in_a_json_line_is_refused_not_a_crash() -> None:
    with pytest.raises(ValidationError, match="state"):
        JudgementIn.model_validate_json('{"kind": "k", "target": "t", "state": {"x": NaN}}')


@pytest.mark.parametrize("missing", ["kind", "target"])
def test_kind_and_target_are_required(missing: str) -> None:
    data = {"kind": "k", "target": "t"}
    del data[missing]
    with pytest.raises(ValidationError, match=missing):
        JudgementIn.model_validate(data)


def test_record_public_form_keeps_the_contract_first() -> None:
    record = Record(
        id="x",
        kind="k",
        target="t",
        status="answered",
        tier="code",
        value=False,
        confidence=None,
        reason="r",
        trail=[TrailEntry(tier="code", outcome="answered", why="r")],
    )
    public = record.public()
    assert list(public)[:9] == [
        "id",
        "kind",
        "target",
        "status",
        "tier",
        "value",
        "confidence",
        "reason",
        "trail",
    ]
    assert public["value"] is False
    assert set(public["trail"][0]) >= {"tier", "outcome", "why"}
