"""Executors against a loopback fake of the GitHub REST API (a real HTTP server on 127.0.0.1).

What matters is what the fake *saw*: shadow mode makes no request at all, a failure is
not ledgered, a retry edits instead of posting, a foreign label is never deleted, and
nothing is written when the target is already in the wanted state.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
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
from tests.support.github_api import FakeGitHub

TARGET = "acme/app#12"
TOKEN = "ghp_fake-token-0123456789"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake is on loopback: no proxy from the shell may sit in between."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub(TOKEN) as fake:
        fake.issue(TARGET)
        yield fake


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.fixture
def executor(github: FakeGitHub, client: fakeredis.FakeRedis) -> Iterator[GitHubExecutor]:
    ex = GitHubExecutor(TOKEN, github.url, ledger=Ledger(TriageStorage(client)), retry_backoff=0.01)
    yield ex
    ex.close()


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
    tmp_path: Path, github: FakeGitHub, client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    result = run(config(tmp_path, "shadow"), client, executor, CountingAsk(SURE))
    assert [e.reason for e in result.suppressed] == ["shadow_mode", "shadow_mode"]
    assert github.seen == []  # not one request, not even a read
    assert github.issues[TARGET].labels == [] and github.issues[TARGET].comments == []
    assert client.hlen(keys.TRIAGE_LEDGER) == 0


def test_shadow_mode_override_writes_nothing_either(
    tmp_path: Path, github: FakeGitHub, client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    run(config(tmp_path, "auto"), client, executor, CountingAsk(SURE), mode_override="shadow")
    assert github.seen == []


# ------------------------------------------------------------------------ auto, redelivery


def test_auto_mode_writes_and_redelivery_makes_no_request(
    tmp_path: Path, github: FakeGitHub, client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    cfg = config(tmp_path, "auto")
    ask = CountingAsk(SURE)
    first = run(cfg, client, executor, ask)
    assert [e.executed.split(":")[0] for e in first.applied] == ["performed", "performed"]
    assert github.issues[TARGET].labels == ["needs-repro"]
    assert len(github.issues[TARGET].comments) == 1
    assert all(s.authorization == f"token {TOKEN}" for s in github.seen)
    assert client.hlen(keys.TRIAGE_LEDGER) == 2

    seen = len(github.seen)
    second = run(cfg, client, executor, ask)
    assert ask.calls == 1  # no provider request
    assert len(github.seen) == seen  # and no GitHub request: the ledger answered
    assert all((e.executed or "").startswith("already") for e in second.applied)


# --------------------------------------------------------------------------------- failure


def test_an_executor_failure_is_not_ledgered_and_a_retry_completes(
    tmp_path: Path, github: FakeGitHub, client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    cfg = config(tmp_path, "auto")
    for _ in range(4):  # the first try and githubkit's three retries
        github.fail_next("POST", "/issues/12/labels", 502)
    failed = run(cfg, client, executor, CountingAsk(SURE))
    (label,) = failed.failed
    (comment,) = failed.applied  # the failed write is reported as failed, not as applied
    assert label.reason == "failed"
    assert label.executed.startswith("failed: POST /repos/acme/app/issues/12/labels: HTTP 502")
    assert TOKEN not in label.executed  # the fake echoed the Authorization header
    assert comment.executed.startswith("performed")
    assert failed.counts() == {"apply": 1, "failed": 1}  # what `status` adds up
    assert "Failed (1)" in failed.render(cfg) and "Applied (1)" in failed.render(cfg)
    ledgered = [e["action"]["op"] for e in Ledger(TriageStorage(client)).entries()]
    assert ledgered == ["comment"]

    retried = run(cfg, client, executor, CountingAsk(SURE))
    assert retried.applied[0].executed.startswith("performed")
    assert retried.applied[1].executed.startswith("already")
    assert github.issues[TARGET].labels == ["needs-repro"]
    assert len(github.issues[TARGET].comments) == 1


def test_a_target_without_an_issue_number_is_failed_not_applied(
    tmp_path: Path, github: FakeGitHub, client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    push = Event("issues.opened", "acme/app@6113728f", None, {}, {"title": "crash"})
    result = triage(
        push,
        config(tmp_path, "auto"),
        ask=CountingAsk(SURE),
        store=TriageStore(TriageStorage(client)),
        executor=executor,
        budget=RunBudget(None),
    )
    assert result.applied == []
    assert [e.reason for e in result.failed] == ["failed", "failed"]
    assert all("owner/repo#number" in (e.executed or "") for e in result.failed)
    assert "Applied (0)" in result.render() and "Failed (2)" in result.render()
    assert result.to_json()["applied"] == [] and len(result.to_json()["failed"]) == 2
    assert "apply" not in result.counts()
    assert github.seen == []


def test_a_server_error_is_retried_and_the_write_lands_once(
    github: FakeGitHub, executor: GitHubExecutor
) -> None:
    github.fail_next("POST", "/issues/12/labels", 502)
    assert executor.perform(Command("label.add", label="bug"), TARGET).status == "performed"
    assert [(s.method, s.path.rsplit("/", 1)[-1]) for s in github.writes] == [("POST", "labels")] * 2
    assert github.issues[TARGET].labels == ["bug"]


def test_a_comment_post_that_failed_is_not_blindly_posted_again(
    github: FakeGitHub, executor: GitHubExecutor
) -> None:
    github.fail_next("POST", "/issues/12/comments", 502)
    with pytest.raises(ExecutorError, match="HTTP 502"):
        executor.perform(Command("comment", body="hi", marker=comment_marker("r", "t")), TARGET)
    assert [s.method for s in github.writes] == ["POST"]  # it might have landed: no second POST


@pytest.mark.parametrize("primary", [False, True])
def test_a_rate_limit_is_waited_out_as_retry_after_says(
    github: FakeGitHub, executor: GitHubExecutor, primary: bool
) -> None:
    github.rate_limit_next("POST", "/issues/12/labels", retry_after=0, status=403, primary=primary)
    assert executor.perform(Command("label.add", label="bug"), TARGET).status == "performed"
    assert github.issues[TARGET].labels == ["bug"]
    assert len(github.writes) == 2


def test_a_rate_limit_longer_than_the_wait_cap_fails_and_says_when(
    github: FakeGitHub, client: fakeredis.FakeRedis
) -> None:
    executor = GitHubExecutor(TOKEN, github.url, ledger=Ledger(TriageStorage(client)), max_retry_wait=5)
    github.rate_limit_next("POST", "/issues/12/labels", retry_after=3600, status=429)
    with pytest.raises(ExecutorError, match=r"rate limited by GitHub \(HTTP 429\); try again in 3600 s"):
        executor.perform(Command("label.add", label="bug"), TARGET)
    assert github.issues[TARGET].labels == []


def test_labels_past_the_first_hundred_are_read(github: FakeGitHub, executor: GitHubExecutor) -> None:
    github.issue(TARGET, labels=[f"label-{i}" for i in range(150)])
    assert executor.perform(Command("label.add", label="label-140"), TARGET).status == "unchanged"
    assert github.writes == []
    assert [s.path for s in github.seen] == ["/repos/acme/app/issues/12/labels"] * 2  # two pages


def test_remove_label_removes_dispatchqs_own_label_only(github: FakeGitHub, executor: GitHubExecutor) -> None:
    github.issue(TARGET, labels=["bug"])
    assert executor.perform(Command("label.add", label="needs-triage"), TARGET).status == "performed"
    assert executor.remove_label(TARGET, "needs-triage").status == "performed"
    assert executor.remove_label(TARGET, "bug").status == "refused"
    assert github.issues[TARGET].labels == ["bug"]


def test_the_recording_executor_removes_its_own_label_too(client: fakeredis.FakeRedis) -> None:
    recording = RecordingExecutor(TriageStorage(client))
    recording.perform(Command("label.add", label="needs-triage"), TARGET)
    assert recording.remove_label(TARGET, "needs-triage").status == "performed"
    assert recording.state(TARGET)["labels"] == []


# ---------------------------------------------------------------------------------- comments


def test_a_retried_comment_is_not_doubled(
    github: FakeGitHub, executor: GitHubExecutor, client: fakeredis.FakeRedis
) -> None:
    marker = comment_marker("needs-repro", "repro")
    command = Command("comment", body="Please add steps.", marker=marker)
    assert executor.perform(command, TARGET).status == "performed"
    # The ledger write after the first attempt was lost; the retry finds the marker.
    assert executor.perform(command, TARGET).status == "unchanged"
    assert len(github.issues[TARGET].comments) == 1
    assert [s.method for s in github.writes] == ["POST"]

    edited = Command("comment", body="Please add steps, and the version.", marker=marker)
    assert executor.perform(edited, TARGET).status == "performed"
    assert [s.method for s in github.writes] == ["POST", "PATCH"]
    (only,) = github.issues[TARGET].comments
    assert only["body"].startswith("Please add steps, and the version.") and marker in only["body"]


def test_a_marked_comment_past_the_first_page_is_found(github: FakeGitHub, executor: GitHubExecutor) -> None:
    marker = comment_marker("r", "t")
    github.issue(TARGET, comments=[{"id": i, "body": f"chatter {i}"} for i in range(150)])
    github.issues[TARGET].comments.append({"id": 999, "body": f"old text\n\n{marker}"})
    assert executor.perform(Command("comment", body="new text", marker=marker), TARGET).status == "performed"
    assert [s.method for s in github.writes] == ["PATCH"]
    assert len(github.issues[TARGET].comments) == 151


def test_a_comment_without_a_marker_is_refused(github: FakeGitHub, executor: GitHubExecutor) -> None:
    with pytest.raises(ExecutorError, match="marker"):
        executor.perform(Command("comment", body="hello"), TARGET)
    assert github.seen == []


# ------------------------------------------------------------------------------------ labels


def test_a_label_dispatchq_did_not_add_is_never_removed(github: FakeGitHub, executor: GitHubExecutor) -> None:
    github.issue(TARGET, labels=["bug"])
    result = executor.perform(Command("label.remove", label="bug"), TARGET)
    assert result.status == "refused"
    assert github.writes == [] and github.issues[TARGET].labels == ["bug"]

    # Adding a label a person already added is `unchanged`, and does not make it ours.
    assert executor.perform(Command("label.add", label="bug"), TARGET).status == "unchanged"
    assert executor.perform(Command("label.remove", label="bug"), TARGET).status == "refused"
    assert github.writes == []


def test_a_label_dispatchq_added_can_be_removed(github: FakeGitHub, executor: GitHubExecutor) -> None:
    assert executor.perform(Command("label.add", label="needs repro/maybe"), TARGET).status == "performed"
    assert executor.perform(Command("label.remove", label="needs repro/maybe"), TARGET).status == "performed"
    assert [(s.method, s.path) for s in github.writes] == [
        ("POST", "/repos/acme/app/issues/12/labels"),
        ("DELETE", "/repos/acme/app/issues/12/labels/needs%20repro%2Fmaybe"),
    ]
    assert github.issues[TARGET].labels == []


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
    github: FakeGitHub, executor: GitHubExecutor, state: dict[str, Any], command: Command
) -> None:
    github.issue(TARGET, **state)
    assert executor.perform(command, TARGET).status == "unchanged"
    assert github.writes == []
    assert github.seen  # it did re-read


def test_close_reopen_and_assign_write_when_needed(github: FakeGitHub, executor: GitHubExecutor) -> None:
    assert executor.perform(Command("close", reason="completed"), TARGET).status == "performed"
    assert github.issues[TARGET].state == "closed"
    assert github.writes[-1].body == {"state": "closed", "state_reason": "completed"}
    assert executor.perform(Command("reopen"), TARGET).status == "performed"
    assert github.issues[TARGET].state == "open"
    assert executor.perform(Command("assign", assignees=("alice", "bob")), TARGET).status == "performed"
    assert github.issues[TARGET].assignees == ["alice", "bob"]


# ----------------------------------------------------------------------------------- secrecy


def test_the_token_never_appears_in_errors_or_reprs(github: FakeGitHub, client: fakeredis.FakeRedis) -> None:
    wrong = "ghp_not-the-right-one-987654"
    executor = GitHubExecutor(wrong, github.url, ledger=Ledger(TriageStorage(client)))
    with pytest.raises(ExecutorError) as caught:
        executor.perform(Command("label.add", label="x"), TARGET)
    assert "HTTP 401" in str(caught.value)
    assert wrong not in str(caught.value)  # the fake put the whole header in its message
    assert "***" in str(caught.value)
    assert wrong not in repr(executor) and wrong not in str(executor)
    assert wrong not in repr(vars(executor))
    assert executor._github is not None and wrong not in repr(vars(executor._github))  # githubkit's auth too
    executor.close()


def test_no_token_means_no_request(github: FakeGitHub, client: fakeredis.FakeRedis) -> None:
    executor = GitHubExecutor(None, github.url, ledger=Ledger(TriageStorage(client)))
    with pytest.raises(ExecutorError, match="DISPATCHQ_GITHUB_TOKEN"):
        executor.perform(Command("label.add", label="x"), TARGET)
    assert github.seen == []


@pytest.mark.parametrize(
    "target", ["acme/app", "acme/app#0", "acme/../x#1", "a b/c#1", "acme/app#1; rm -rf /"]
)
def test_a_malformed_target_is_refused_before_any_request(
    github: FakeGitHub, executor: GitHubExecutor, target: str
) -> None:
    with pytest.raises(ExecutorError, match="owner/repo#number"):
        executor.perform(Command("label.add", label="x"), target)
    assert github.seen == []


def test_an_api_url_with_credentials_is_refused(client: fakeredis.FakeRedis) -> None:
    with pytest.raises(UserError, match="DISPATCHQ_GITHUB_API_URL"):
        GitHubExecutor(TOKEN, "https://user:pw@example.invalid", ledger=Ledger(TriageStorage(client)))


# ----------------------------------------------------------------------------- apply, suggest


def test_apply_performs_an_accepted_suggestion_once(
    tmp_path: Path, github: FakeGitHub, client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    cfg = config(tmp_path, "suggest")
    result = run(cfg, client, executor, CountingAsk(SURE))
    assert len(result.suggested) == 2 and github.seen == []
    done = apply_suggested(
        result.decision_id[:12], cfg, store=TriageStore(TriageStorage(client)), executor=executor
    )
    assert [e.executed.split(":")[0] for e in done] == ["performed", "performed"]
    writes = len(github.writes)
    again = apply_suggested(
        result.decision_id, cfg, store=TriageStore(TriageStorage(client)), executor=executor
    )
    assert all(e.executed.startswith("already") for e in again)
    assert len(github.writes) == writes


def test_apply_refuses_in_shadow_mode(
    tmp_path: Path, github: FakeGitHub, client: fakeredis.FakeRedis, executor: GitHubExecutor
) -> None:
    result = run(config(tmp_path, "suggest"), client, executor, CountingAsk(SURE))
    with pytest.raises(UserError, match="shadow"):
        apply_suggested(
            result.decision_id,
            config(tmp_path, "shadow"),
            store=TriageStore(TriageStorage(client)),
            executor=executor,
        )
    assert github.seen == []


# --------------------------------------------------------------------------------- recording


def test_the_recording_executor_keeps_to_its_own_keys(client: fakeredis.FakeRedis) -> None:
    recording = RecordingExecutor(TriageStorage(client))
    recording.seed(TARGET, labels=["bug"])
    assert recording.perform(Command("label.remove", label="bug"), TARGET).status == "refused"
    assert recording.perform(Command("label.add", label="triaged"), TARGET).status == "performed"
    assert recording.perform(Command("label.add", label="triaged"), TARGET).status == "unchanged"
    assert recording.perform(Command("label.remove", label="triaged"), TARGET).status == "performed"
    assert recording.state(TARGET)["labels"] == ["bug"]
    assert [r["op"] for r in recording.recorded()] == ["label.add", "label.remove"]
    written = {k.decode() for k in client.keys("*")}
    assert written <= {keys.TRIAGE_RECORDED, keys.TRIAGE_RECORDED_STATE, keys.triage_labels_added(TARGET)}


def test_the_recording_executor_honours_its_op_list(client: fakeredis.FakeRedis) -> None:
    recording = RecordingExecutor(TriageStorage(client), ops=["label.add"])
    assert not recording.supports("comment")
    with pytest.raises(ExecutorError):
        recording.perform(Command("comment", body="x", marker="<!-- m -->"), TARGET)
    assert recording.recorded() == []


def test_both_executors_offer_remove_label_through_the_protocol(
    executor: GitHubExecutor, client: fakeredis.FakeRedis
) -> None:
    from dispatchq.triage.executors import Executor

    for each in (executor, RecordingExecutor(TriageStorage(client))):
        assert isinstance(each, Executor) and callable(each.remove_label)
