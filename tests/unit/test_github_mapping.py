"""The pure mapping of GitHub deliveries to triage events, trimming, narrowing, and `state:`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from dispatchq.errors import ConfigError
from dispatchq.triage.github import event_name, map_delivery, narrow, state_paths, target_of, trim
from dispatchq.triage.rules import Event, load_triage

WEBHOOKS = Path(__file__).resolve().parents[2].parent / "shared" / "github-webhooks"


def example(event: str, name: str = "payload.json") -> dict[str, Any]:
    path = WEBHOOKS / event / name
    if not path.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"GitHub's example payloads are missing: {path}")
        pytest.skip(f"LOUD SKIP: GitHub's example payloads are not at {WEBHOOKS}")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_trim_drops_urls_node_ids_gravatars_and_links_at_every_depth() -> None:
    payload = {
        "html_url": "x",
        "node_id": "n",
        "keep": 1,
        "user": {"avatar_url": "a", "gravatar_id": "", "login": "octo"},
        "list": [{"_links": {"self": "s"}, "url_like": "kept: not a _url suffix", "events_url": "e"}],
    }
    assert trim(payload) == {
        "keep": 1,
        "user": {"login": "octo"},
        "list": [{"url_like": "kept: not a _url suffix"}],
    }


def test_narrow_keeps_only_the_paths_asked_for_in_place() -> None:
    state = {"issue": {"title": "t", "body": "b", "labels": [{"name": "bug"}]}, "sender": {"login": "o"}}
    assert narrow(state, ["issue.title", "issue.labels", "nope.x"]) == {
        "issue": {"title": "t", "labels": [{"name": "bug"}]}
    }
    assert narrow(state, []) == {}


@pytest.mark.parametrize(
    ("event", "payload", "name"),
    [
        ("issues", {"action": "opened"}, "issues.opened"),
        ("push", {"ref": "refs/heads/main"}, "push"),
        ("create", {"ref": "v1", "ref_type": "tag"}, "create"),
        ("check_run", {"action": "completed"}, "check_run.completed"),
    ],
)
def test_event_names_have_the_action_when_there_is_one(
    event: str, payload: dict[str, Any], name: str
) -> None:
    assert event_name(event, payload) == name


def test_real_payloads_map_to_valid_triage_events() -> None:
    cases = {
        ("issues", "opened.payload.json"): ("issues.opened", "Codertocat/Hello-World#1"),
        ("issue_comment", "created.payload.json"): ("issue_comment.created", "Codertocat/Hello-World#1"),
        ("pull_request", "opened.payload.json"): ("pull_request.opened", "Codertocat/Hello-World#2"),
        ("check_run", "completed.payload.json"): ("check_run.completed", "Codertocat/Hello-World#2"),
        ("label", "created.payload.json"): ("label.created", "Codertocat/Hello-World"),
        ("status", "payload.json"): ("status", "Codertocat/Hello-World"),
        ("create", "payload.json"): ("create", "Codertocat/Hello-World"),
    }
    for (event, name), (expected_name, expected_target) in cases.items():
        raw = example(event, name)
        envelope = map_delivery(event, raw)
        assert (envelope["event"], envelope["target"]) == (expected_name, expected_target), (event, name)
        parsed = Event.from_json(envelope)  # the envelope triage itself accepts
        assert parsed.context["repository"] == "Codertocat/Hello-World"
        assert len(json.dumps(envelope["state"])) < len(json.dumps(raw))


def test_a_push_targets_its_new_head_and_a_comment_is_its_own_item() -> None:
    push = example("push")
    assert target_of("push", push) == f"Codertocat/Hello-World@{push['after']}"
    comment = example("issue_comment", "created.payload.json")
    assert map_delivery("issue_comment", comment)["item"] == f"comment:{comment['comment']['id']}"


def test_a_check_without_a_pull_request_targets_its_head_commit() -> None:
    payload = {
        "action": "completed",
        "check_run": {"id": 4, "head_sha": "abc123", "pull_requests": []},
        "repository": {"full_name": "acme/app"},
    }
    assert target_of("check_run", payload) == "acme/app@abc123"
    suite = {"check_suite": {"pull_requests": [{"number": 7}]}, "repository": {"full_name": "acme/app"}}
    assert target_of("check_suite", suite) == "acme/app#7"


def _config(rules: list[dict[str, Any]]) -> Any:
    section = {
        "mode": "shadow",
        "executor": "recording",
        "questions": {"q": {"type": "noul", "instructions": "?"}},
        "rules": rules,
    }
    return load_triage(section)


def test_rules_may_name_an_event_with_or_without_its_action_and_narrow_its_state() -> None:
    config = _config(
        [
            {"id": "a", "events": ["issues"], "state": ["issue.title"], "actions": [{"op": "close"}]},
            {
                "id": "b",
                "events": ["issues.opened"],
                "state": ["issue.labels"],
                "actions": [{"op": "reopen"}],
            },
            {"id": "c", "events": ["push"], "actions": [{"op": "lock"}]},
        ]
    )
    assert [r.id for r in config.triggered("issues.opened")] == ["a", "b"]
    assert [r.id for r in config.triggered("issues.closed")] == ["a"]
    assert [r.id for r in config.triggered("push")] == ["c"]
    assert config.triggered("issue_comment.created") == []  # `issues` is not a prefix of it
    assert state_paths(config, "issues.opened") == ("issue.title", "issue.labels")
    assert state_paths(config, "push") is None  # a rule without `state:` reads everything
    assert state_paths(config, "label.created") is None  # no rule: the whole trimmed payload is kept

    raw = {"action": "opened", "issue": {"number": 3, "title": "t", "body": "b", "labels": []}}
    envelope = map_delivery(
        "issues", {**raw, "repository": {"full_name": "acme/app"}}, state_paths=("issue.title",)
    )
    assert envelope["state"] == {"issue": {"title": "t"}}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], r"rules\[r\]\.state: expected a non-empty list of dotted paths"),
        (["issue..title"], r"rules\[r\]\.state\[0\]: 'issue\.\.title' is not a dotted path"),
        ("x", r"rules\[r\]\.state: expected a non-empty list"),
    ],
)
def test_a_bad_state_list_names_the_rule_and_field(value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config([{"id": "r", "events": ["issues"], "state": value, "actions": [{"op": "close"}]}])


def test_an_event_that_has_an_action_keeps_it_and_a_discussion_is_its_own_item() -> None:
    assert event_name("watch", {"action": "started"}) == "watch.started"
    discussion = {
        "action": "created",
        "discussion": {"id": 9, "number": 3},
        "repository": {"full_name": "a/b"},
    }
    envelope = map_delivery("discussion", discussion)
    assert (envelope["target"], envelope["item"]) == ("a/b", "discussion:9")  # not an issue: no #number
