"""Executors against a loopback fake of the GitHub REST API (a real HTTP server on 127.0.0.1).

What matters is what the fake *saw*: shadow mode makes no request at all, a failure is
not ledgered, a retry edits instead of posting, a foreign label is never deleted, and
nothing is written when the target is already in the wanted state.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from dispatchq.core.answers import Answer
from dispatchq.errors import ExecutorError, UserError
from dispatchq.storage import keys
from dispatchq.storage.triage import TriageStorage
from dispatchq.triage.engine import AskResult, RunBudget, TriageStore, apply_suggested, triage
from dispatchq.triage.executors import Command, GitHubExecutor, Ledger, RecordingExecutor, comment_marker
from dispatchq.triage.rules import Event, TriageConfig, load_triage
from tests.support.executors import TARGET, TOKEN
from tests.support.github_api import FakeGitHub

pytestmark = pytest.mark.usefixtures("no_proxy")


class CountingAsk:
    def __init__(self, wire: dict[str, dict[str, Any]]) -> None:
        self.wire = wire
        self.calls = 0

    def __call__(self, state: Any, questions: Any) -> AskResult:
        self.calls += 1
        return AskResult(
            answers={q: Answer.from_wire(q, self.wire[q]) for q in questions if q in self.wire}, requests=1
        )


def config(tmp_path: Path, mode: str, *, body: str = "Please add steps to reproduce.") -> TriageConfig:
    (tmp_path / "templates").mkdir(exist_ok=True)
    (tmp_path / "templates" / "repro.md").write_text(body)
    section = {
        "mode": mode,
        "executor": "github",
        "templates": {"repro": "templates/repro.md"},
        "questions": {"needs_repro": {"type": "noul", "instructions": "Does it lack steps to reproduce?"}},
        "rules": [
            {
                "id": "needs-repro",
                "events": ["issues.opened"],
                "if": "needs_repro >= 0.8",
                "actions": [
                    {"op": "label.add", "label": "needs-repro"},
                    {"op": "comment", "template": "repro"},
                ],
            }
        ],
    }
    return load_triage(copy.deepcopy(section), base_dir=tmp_path)


EVENT = Event("issues.opened", TARGET, "issue:12", {"repo": "acme/app"}, {"title": "crash"})
SURE = {"needs_repro": {"type": "noul", "noul": 0.99}}


def run(cfg: TriageConfig, client: fakeredis.FakeRedis, executor: Any, ask: Any, **kw: Any) -> Any:
    return triage(
        EVENT,
        cfg,
        ask=ask,
        store=TriageStore(TriageStorage(client)),
        executor=executor,
        budget=RunBudget(None),
        **kw,
    )


# ------------------------------------------------------------------------------- shadow


def test_shadow_mode_writes_nothing_outside_dispatchqs_store(
    tmp_path: Path, fake_github: FakeGitHub, fake_client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    result = run(config(tmp_path, "shadow"), fake_client, executor, CountingAsk(SURE))
    assert [e.reason for e in result.suppressed] == ["shadow_mode", "shadow_mode"]
    assert fake_github.seen == []  # not one request, not even a read
    assert fake_github.issues[TARGET].labels == [] and fake_github.issues[TARGET].comments == []
    assert fake_client.hlen(keys.TRIAGE_LEDGER) == 0


def test_shadow_mode_override_writes_nothing_either(
    tmp_path: Path, fake_github: FakeGitHub, fake_client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    run(config(tmp_path, "auto"), fake_client, executor, CountingAsk(SURE), mode_override="shadow")
    assert fake_github.seen == []


# ------------------------------------------------------------------------ auto, redelivery


def test_auto_mode_writes_and_redelivery_makes_no_request(
    tmp_path: Path, fake_github: FakeGitHub, fake_client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    cfg = config(tmp_path, "auto")
    ask = CountingAsk(SURE)
    first = run(cfg, fake_client, executor, ask)
    assert [e.executed.split(":")[0] for e in first.applied] == ["performed", "performed"]
    assert fake_github.issues[TARGET].labels == ["needs-repro"]
    assert len(fake_github.issues[TARGET].comments) == 1
    assert all(s.authorization == f"token {TOKEN}" for s in fake_github.seen)
    assert fake_client.hlen(keys.TRIAGE_LEDGER) == 2

    seen = len(fake_github.seen)
    second = run(cfg, fake_client, executor, ask)
    assert ask.calls == 1  # no provider request
    assert len(fake_github.seen) == seen  # and no GitHub request: the ledger answered
    assert all((e.executed or "").startswith("already") for e in second.applied)


# --------------------------------------------------------------------------------- failure


def test_an_executor_failure_is_not_ledgered_and_a_retry_completes(
    tmp_path: Path, fake_github: FakeGitHub, fake_client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    cfg = config(tmp_path, "auto")
    for _ in range(4):  # the first try and githubkit's three retries
        fake_github.fail_next("POST", "/issues/12/labels", 502)
    failed = run(cfg, fake_client, executor, CountingAsk(SURE))
    (label,) = failed.failed
    (comment,) = failed.applied  # the failed write is reported as failed, not as applied
    assert label.reason == "failed"
    assert label.executed.startswith("failed: POST /repos/acme/app/issues/12/labels: HTTP 502")
    assert TOKEN not in label.executed  # the fake echoed the Authorization header
    assert comment.executed.startswith("performed")
    assert failed.counts() == {"apply": 1, "failed": 1}  # what `status` adds up
    assert "Failed (1)" in failed.render(cfg) and "Applied (1)" in failed.render(cfg)
    ledgered = [e["action"]["op"] for e in Ledger(TriageStorage(fake_client)).entries()]
    assert ledgered == ["comment"]

    retried = run(cfg, fake_client, executor, CountingAsk(SURE))
    assert retried.applied[0].executed.startswith("performed")
    assert retried.applied[1].executed.startswith("already")
    assert fake_github.issues[TARGET].labels == ["needs-repro"]
    assert len(fake_github.issues[TARGET].comments) == 1


def test_a_target_without_an_issue_number_is_failed_not_applied(
    tmp_path: Path, fake_github: FakeGitHub, fake_client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    push = Event("issues.opened", "acme/app@6113728f", None, {}, {"title": "crash"})
    result = triage(
        push,
        config(tmp_path, "auto"),
        ask=CountingAsk(SURE),
        store=TriageStore(TriageStorage(fake_client)),
        executor=executor,
        budget=RunBudget(None),
    )
    assert result.applied == []
    assert [e.reason for e in result.failed] == ["failed", "failed"]
    assert all("owner/repo#number" in (e.executed or "") for e in result.failed)
    assert "Applied (0)" in result.render() and "Failed (2)" in result.render()
    assert result.to_json()["applied"] == [] and len(result.to_json()["failed"]) == 2
    assert "apply" not in result.counts()
    assert fake_github.seen == []


def test_a_server_error_is_retried_and_the_write_lands_once(
    fake_github: FakeGitHub, executor: GitHubExecutor
) -> None:
    fake_github.fail_next("POST", "/issues/12/labels", 502)
    assert executor.perform(Command("label.add", label="bug"), TARGET).status == "performed"
    assert [(s.method, s.path.rsplit("/", 1)[-1]) for s in fake_github.writes] == [("POST", "labels")] * 2
    assert fake_github.issues[TARGET].labels == ["bug"]


def test_a_comment_post_that_failed_is_not_blindly_posted_again(
    fake_github: FakeGitHub, executor: GitHubExecutor
) -> None:
    fake_github.fail_next("POST", "/issues/12/comments", 502)
    with pytest.raises(ExecutorError, match="HTTP 502"):
        executor.perform(Command("comment", body="hi", marker=comment_marker("r", "t")), TARGET)
    assert [s.method for s in fake_github.writes] == ["POST"]  # it might have landed: no second POST


@pytest.mark.parametrize("primary", [False, True])
def test_a_rate_limit_is_waited_out_as_retry_after_says(
    fake_github: FakeGitHub, executor: GitHubExecutor, primary: bool
) -> None:
    fake_github.rate_limit_next("POST", "/issues/12/labels", retry_after=0, status=403, primary=primary)
    assert executor.perform(Command("label.add", label="bug"), TARGET).status == "performed"
    assert fake_github.issues[TARGET].labels == ["bug"]
    assert len(fake_github.writes) == 2


def test_a_rate_limit_longer_than_the_wait_cap_fails_and_says_when(
    fake_github: FakeGitHub, fake_client: fakeredis.FakeRedis
) -> None:
    executor = GitHubExecutor(
        TOKEN, fake_github.url, ledger=Ledger(TriageStorage(fake_client)), max_retry_wait=5
    )
    fake_github.rate_limit_next("POST", "/issues/12/labels", retry_after=3600, status=429)
    with pytest.raises(ExecutorError, match=r"rate limited by GitHub \(HTTP 429\); try again in 3600 s"):
        executor.perform(Command("label.add", label="bug"), TARGET)
    assert fake_github.issues[TARGET].labels == []


def test_labels_past_the_first_hundred_are_read(fake_github: FakeGitHub, executor: GitHubExecutor) -> None:
    fake_github.issue(TARGET, labels=[f"label-{i}" for i in range(150)])
    assert executor.perform(Command("label.add", label="label-140"), TARGET).status == "unchanged"
    assert fake_github.writes == []
    assert [s.path for s in fake_github.seen] == ["/repos/acme/app/issues/12/labels"] * 2  # two pages


def test_remove_label_removes_dispatchqs_own_label_only(
    fake_github: FakeGitHub, executor: GitHubExecutor
) -> None:
    fake_github.issue(TARGET, labels=["bug"])
    assert executor.perform(Command("label.add", label="needs-triage"), TARGET).status == "performed"
    assert executor.remove_label(TARGET, "needs-triage").status == "performed"
    assert executor.remove_label(TARGET, "bug").status == "refused"
    assert fake_github.issues[TARGET].labels == ["bug"]


def test_the_recording_executor_removes_its_own_label_too(fake_client: fakeredis.FakeRedis) -> None:
    recording = RecordingExecutor(TriageStorage(fake_client))
    recording.perform(Command("label.add", label="needs-triage"), TARGET)
    assert recording.remove_label(TARGET, "needs-triage").status == "performed"
    assert recording.state(TARGET)["labels"] == []


# ---------------------------------------------------------------------------------- comments


def test_a_retried_comment_is_not_doubled(
    fake_github: FakeGitHub, executor: GitHubExecutor, fake_client: fakeredis.FakeRedis
) -> None:
    marker = comment_marker("needs-repro", "repro")
    command = Command("comment", body="Please add steps.", marker=marker)
    assert executor.perform(command, TARGET).status == "performed"
    # The ledger write after the first attempt was lost; the retry finds the marker.
    assert executor.perform(command, TARGET).status == "unchanged"
    assert len(fake_github.issues[TARGET].comments) == 1
    assert [s.method for s in fake_github.writes] == ["POST"]

    edited = Command("comment", body="Please add steps, and the version.", marker=marker)
    assert executor.perform(edited, TARGET).status == "performed"
    assert [s.method for s in fake_github.writes] == ["POST", "PATCH"]
    (only,) = fake_github.issues[TARGET].comments
    assert only["body"].startswith("Please add steps, and the version.") and marker in only["body"]


def test_a_marked_comment_past_the_first_page_is_found(
    fake_github: FakeGitHub, executor: GitHubExecutor
) -> None:
    marker = comment_marker("r", "t")
    fake_github.issue(TARGET, comments=[{"id": i, "body": f"chatter {i}"} for i in range(150)])
    fake_github.issues[TARGET].comments.append({"id": 999, "body": f"old text\n\n{marker}"})
    assert executor.perform(Command("comment", body="new text", marker=marker), TARGET).status == "performed"
    assert [s.method for s in fake_github.writes] == ["PATCH"]
    assert len(fake_github.issues[TARGET].comments) == 151


def test_a_comment_without_a_marker_is_refused(fake_github: FakeGitHub, executor: GitHubExecutor) -> None:
    with pytest.raises(ExecutorError, match="marker"):
        executor.perform(Command("comment", body="hello"), TARGET)
    assert fake_github.seen == []


# ------------------------------------------------------------------------------------ labels


def test_a_label_dispatchq_did_not_add_is_never_removed(
    fake_github: FakeGitHub, executor: GitHubExecutor
) -> None:
    fake_github.issue(TARGET, labels=["bug"])
    result = executor.perform(Command("label.remove", label="bug"), TARGET)
    assert result.status == "refused"
    assert fake_github.writes == [] and fake_github.issues[TARGET].labels == ["bug"]

    # Adding a label a person already added is `unchanged`, and does not make it ours.
    assert executor.perform(Command("label.add", label="bug"), TARGET).status == "unchanged"
    assert executor.perform(Command("label.remove", label="bug"), TARGET).status == "refused"
    assert fake_github.writes == []


def test_a_label_dispatchq_added_can_be_removed(fake_github: FakeGitHub, executor: GitHubExecutor) -> None:
    assert executor.perform(Command("label.add", label="needs repro/maybe"), TARGET).status == "performed"
    assert executor.perform(Command("label.remove", label="needs repro/maybe"), TARGET).status == "performed"
    assert [(s.method, s.path) for s in fake_github.writes] == [
        ("POST", "/repos/acme/app/issues/12/labels"),
        ("DELETE", "/repos/acme/app/issues/12/labels/needs%20repro%2Fmaybe"),
    ]
    assert fake_github.issues[TARGET].labels == []


# --------------------------------------------------------------------------- re-read first


@pytest.mark.parametrize(
    ("state", "command"),
    [
        ({"labels": ["needs-repro"]}, Command("label.add", label="needs-repro")),
        ({"state": "closed"}, Command("close", reason="not_planned")),
        ({"state": "open"}, Command("reopen")),
        ({"assignees": ["alice", "bob"]}, Command("assign", assignees=("alice",))),
    ],
)
def test_nothing_is_written_when_the_target_is_already_there(
    fake_github: FakeGitHub, executor: GitHubExecutor, state: dict[str, Any], command: Command
) -> None:
    fake_github.issue(TARGET, **state)
    assert executor.perform(command, TARGET).status == "unchanged"
    assert fake_github.writes == []
    assert fake_github.seen  # it did re-read


def test_close_reopen_and_assign_write_when_needed(fake_github: FakeGitHub, executor: GitHubExecutor) -> None:
    assert executor.perform(Command("close", reason="completed"), TARGET).status == "performed"
    assert fake_github.issues[TARGET].state == "closed"
    assert fake_github.writes[-1].body == {"state": "closed", "state_reason": "completed"}
    assert executor.perform(Command("reopen"), TARGET).status == "performed"
    assert fake_github.issues[TARGET].state == "open"
    assert executor.perform(Command("assign", assignees=("alice", "bob")), TARGET).status == "performed"
    assert fake_github.issues[TARGET].assignees == ["alice", "bob"]


# ----------------------------------------------------------------------------------- secrecy


def test_the_token_never_appears_in_errors_or_reprs(
    fake_github: FakeGitHub, fake_client: fakeredis.FakeRedis
) -> None:
    wrong = "ghp_not-the-right-one-987654"
    executor = GitHubExecutor(wrong, fake_github.url, ledger=Ledger(TriageStorage(fake_client)))
    with pytest.raises(ExecutorError) as caught:
        executor.perform(Command("label.add", label="x"), TARGET)
    assert "HTTP 401" in str(caught.value)
    assert wrong not in str(caught.value)  # the fake put the whole header in its message
    assert "***" in str(caught.value)
    assert wrong not in repr(executor) and wrong not in str(executor)
    assert wrong not in repr(vars(executor))
    assert executor._github is not None and wrong not in repr(vars(executor._github))  # githubkit's auth too
    executor.close()


def test_no_token_means_no_request(fake_github: FakeGitHub, fake_client: fakeredis.FakeRedis) -> None:
    executor = GitHubExecutor(None, fake_github.url, ledger=Ledger(TriageStorage(fake_client)))
    with pytest.raises(ExecutorError, match="DISPATCHQ_GITHUB_TOKEN"):
        executor.perform(Command("label.add", label="x"), TARGET)
    assert fake_github.seen == []


@pytest.mark.parametrize(
    "target", ["acme/app", "acme/app#0", "acme/../x#1", "a b/c#1", "acme/app#1; rm -rf /"]
)
def test_a_malformed_target_is_refused_before_any_request(
    fake_github: FakeGitHub, executor: GitHubExecutor, target: str
) -> None:
    with pytest.raises(ExecutorError, match="owner/repo#number"):
        executor.perform(Command("label.add", label="x"), target)
    assert fake_github.seen == []


def test_an_api_url_with_credentials_is_refused(fake_client: fakeredis.FakeRedis) -> None:
    with pytest.raises(UserError, match="DISPATCHQ_GITHUB_API_URL"):
        GitHubExecutor(TOKEN, "https://user:pw@example.invalid", ledger=Ledger(TriageStorage(fake_client)))


# ----------------------------------------------------------------------------- apply, suggest


def test_apply_performs_an_accepted_suggestion_once(
    tmp_path: Path, fake_github: FakeGitHub, fake_client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    cfg = config(tmp_path, "suggest")
    result = run(cfg, fake_client, executor, CountingAsk(SURE))
    assert len(result.suggested) == 2 and fake_github.seen == []
    done = apply_suggested(
        result.decision_id[:12], cfg, store=TriageStore(TriageStorage(fake_client)), executor=executor
    )
    assert [e.executed.split(":")[0] for e in done] == ["performed", "performed"]
    writes = len(fake_github.writes)
    again = apply_suggested(
        result.decision_id, cfg, store=TriageStore(TriageStorage(fake_client)), executor=executor
    )
    assert all(e.executed.startswith("already") for e in again)
    assert len(fake_github.writes) == writes


def test_apply_refuses_in_shadow_mode(
    tmp_path: Path, fake_github: FakeGitHub, fake_client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    result = run(config(tmp_path, "suggest"), fake_client, executor, CountingAsk(SURE))
    with pytest.raises(UserError, match="shadow"):
        apply_suggested(
            result.decision_id,
            config(tmp_path, "shadow"),
            store=TriageStore(TriageStorage(fake_client)),
            executor=executor,
        )
    assert fake_github.seen == []


# --------------------------------------------------------------------------------- recording


def test_the_recording_executor_keeps_to_its_own_keys(fake_client: fakeredis.FakeRedis) -> None:
    recording = RecordingExecutor(TriageStorage(fake_client))
    recording.seed(TARGET, labels=["bug"])
    assert recording.perform(Command("label.remove", label="bug"), TARGET).status == "refused"
    assert recording.perform(Command("label.add", label="triaged"), TARGET).status == "performed"
    assert recording.perform(Command("label.add", label="triaged"), TARGET).status == "unchanged"
    assert recording.perform(Command("label.remove", label="triaged"), TARGET).status == "performed"
    assert recording.state(TARGET)["labels"] == ["bug"]
    assert [r["op"] for r in recording.recorded()] == ["label.add", "label.remove"]
    written = {k.decode() for k in fake_client.keys("*")}
    assert written <= {keys.TRIAGE_RECORDED, keys.TRIAGE_RECORDED_STATE, keys.triage_labels_added(TARGET)}


def test_the_recording_executor_honours_its_op_list(fake_client: fakeredis.FakeRedis) -> None:
    recording = RecordingExecutor(TriageStorage(fake_client), ops=["label.add"])
    assert not recording.supports("comment")
    with pytest.raises(ExecutorError):
        recording.perform(Command("comment", body="x", marker="<!-- m -->"), TARGET)
    assert recording.recorded() == []


def test_both_executors_offer_remove_label_through_the_protocol(
    executor: GitHubExecutor, fake_client: fakeredis.FakeRedis
) -> None:
    from dispatchq.triage.executors import Executor

    for each in (executor, RecordingExecutor(TriageStorage(fake_client))):
        assert isinstance(each, Executor) and callable(each.remove_label)
