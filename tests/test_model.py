"""The judgement model and its content key: one definition of "the same judgement".

Unit tests: no Redis server. The checkout part runs real git in a temporary repository;
`Dispatcher.prepare` (which computes the key a producer's judgement gets) touches no Redis,
so it is driven with a fakeredis client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fakeredis
import pytest
from pydantic import ValidationError

from dispatchq import git
from dispatchq.config import parse_config
from dispatchq.errors import UserError
from dispatchq.model import JudgementIn, Record, TrailEntry, canonical_json, content_key
from dispatchq.runtime import Runtime
from dispatchq.settings import load_settings
from tests.conftest import git as run_git

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


# --- the checkout fingerprint: HEAD plus every changed or untracked file ----------------------------


def test_fingerprint_is_stable_for_an_unchanged_tree(git_repo: Path) -> None:
    assert git.fingerprint(git_repo) == git.fingerprint(git_repo)


def test_fingerprint_changes_with_head(git_repo: Path) -> None:
    before = git.fingerprint(git_repo)
    run_git(git_repo, "commit", "-q", "--allow-empty", "-m", "empty but a new HEAD")
    assert git.fingerprint(git_repo) != before


def test_fingerprint_changes_with_a_dirty_tracked_file(git_repo: Path) -> None:
    before = git.fingerprint(git_repo)
    (git_repo / "src" / "app.py").write_text("x = 2\n")
    dirty = git.fingerprint(git_repo)
    assert dirty != before
    (git_repo / "src" / "app.py").write_text("x = 3\n")  # a second edit of the same file
    assert git.fingerprint(git_repo) not in (before, dirty)
    (git_repo / "src" / "app.py").write_text("x = 1\n")  # back to HEAD's content
    assert git.fingerprint(git_repo) == before


def test_fingerprint_changes_with_an_untracked_file_and_its_content(git_repo: Path) -> None:
    before = git.fingerprint(git_repo)
    (git_repo / "notes").mkdir()
    (git_repo / "notes" / "todo.txt").write_text("one\n")
    untracked = git.fingerprint(git_repo)
    assert untracked != before
    (git_repo / "notes" / "todo.txt").write_text("two\n")
    assert git.fingerprint(git_repo) != untracked


def test_fingerprint_changes_with_a_staged_change_and_a_deletion(git_repo: Path) -> None:
    before = git.fingerprint(git_repo)
    (git_repo / "README.md").write_text("changed\n")
    run_git(git_repo, "add", "README.md")
    staged = git.fingerprint(git_repo)
    assert staged != before
    (git_repo / "src" / "app.py").unlink()
    assert git.fingerprint(git_repo) not in (before, staged)


# --- the key a producer's judgement gets at enqueue -------------------------------------------------


@pytest.fixture
def prepare(tmp_path: Path) -> Any:
    """`prepare(judgement)` -> Prepared, with tmp_path as the only checkout root (no Redis used)."""
    settings = load_settings({"DISPATCHQ_CHECKOUT_ROOTS": str(tmp_path)})
    config = parse_config(
        {
            "kinds": {
                "k": {"check": "jobs.examples:noop"},
                "repair": {"produce": [["true"]], "verify": [["true"]]},
            }
        }
    )
    runtime = Runtime(settings=settings, redis=fakeredis.FakeRedis(), config_override=config)
    return runtime.dispatcher.prepare


def test_enqueue_key_includes_the_checkout_state(prepare: Any, git_repo: Path) -> None:
    judgement = j(context={"checkout": str(git_repo)})
    clean = prepare(judgement).content_key
    assert prepare(judgement).content_key == clean  # stable while the tree is unchanged
    (git_repo / "scratch.txt").write_text("untracked\n")
    assert prepare(judgement).content_key != clean


def test_enqueue_key_of_a_producer_key_ignores_the_tree(prepare: Any, git_repo: Path) -> None:
    judgement = j(context={"checkout": str(git_repo)}, key="my-key")
    before = prepare(judgement).content_key
    (git_repo / "scratch.txt").write_text("untracked\n")
    assert prepare(judgement).content_key == before


def test_enqueue_refuses_a_checkout_outside_the_roots(prepare: Any, tmp_path: Path) -> None:
    outside = tmp_path.parent
    with pytest.raises(UserError, match="outside DISPATCHQ_CHECKOUT_ROOTS"):
        prepare(j(context={"checkout": str(outside)}))
    with pytest.raises(UserError, match="outside DISPATCHQ_CHECKOUT_ROOTS"):
        prepare(j(context={"checkout": f"{tmp_path}/../{outside.name}"}))  # `..` does not escape


def test_enqueue_refuses_a_symlink_escaping_the_roots(prepare: Any, tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (tmp_path / "sneaky").symlink_to(outside)
    with pytest.raises(UserError, match="outside DISPATCHQ_CHECKOUT_ROOTS"):
        prepare(j(context={"checkout": str(tmp_path / "sneaky")}))


def test_enqueue_refuses_relative_or_missing_checkouts(prepare: Any, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="absolute path"):
        prepare(j(context={"checkout": "repo"}))
    with pytest.raises(UserError, match="not a directory"):
        prepare(j(context={"checkout": str(tmp_path / "absent")}))


def test_produce_verify_needs_a_git_checkout(prepare: Any, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"give context\.checkout"):
        prepare(j(kind="repair"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(UserError, match="not a git repository"):
        prepare(j(kind="repair", context={"checkout": str(tmp_path / "plain")}))


def test_entry_tier_and_host_binding(prepare: Any, git_repo: Path) -> None:
    unbound = prepare(j())
    assert unbound.tier == "code" and unbound.host is None
    bound = prepare(j(context={"checkout": str(git_repo)}))
    assert bound.host == load_settings({}).host
