"""Triage end to end: the real CLI as a process, a real Redis, the real SDK against the fake API.

`dispatchq triage` runs as a subprocess with TYPESAFE_BASE_URL pointing at the loopback fake
in its own process, so every provider request the rules engine makes is counted there;
`--enqueue` is performed by a real `dispatchq worker typed --burst` process. The GitHub
executor talks to a loopback fake of GitHub that records every write.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatchq.storage import keys
from dispatchq.storage.triage import TriageStorage
from dispatchq.testing.typesafe import FakeTypeSafeProcess, choice, noul
from dispatchq.triage.engine import TriageStore
from dispatchq.triage.executors import RecordingExecutor
from tests.conftest import run_cli
from tests.support.github_api import FakeGitHub

KEY = "ts-live-triage-0123456789abcdef"
GITHUB_TOKEN = "ghp_fake-triage-token-0123456789"
TARGET = "acme/app#12"
EVENT = {
    "event": "issues.opened",
    "target": TARGET,
    "item": "issue:12",
    "context": {"repo": "acme/app"},
    "state": {"title": "It crashes", "body": "it crashes on start; $(rm -rf /) `whoami`"},
}
ANSWERS = {
    "answers": {
        "needs_repro": noul(0.97),
        "area": choice("bug", 0.9, {"bug": 0.9, "feature": 0.05, "docs": 0.05}),
    }
}
CONFIG = """\
triage:
  mode: {mode}
  gate: {{suggest: {suggest}, auto: 0.85}}
  budget: {{requests: 100}}
  allowDestructive: [close]
  executor: {executor}
  escalate: needs-triage
  templates: {{repro: templates/needs-repro.md}}
  questions:
    needs_repro: {{type: noul, instructions: "Does the issue lack steps to reproduce?"}}
    area:
      type: choice
      instructions: "Which area is the issue about?"
      criteria: {{bug: null, feature: null, docs: null}}
      events: [issues.opened]
  rules:
    - id: {rule}
      events: [issues.opened]
      if: 'needs_repro >= 0.8 && area == "bug"'
      gateOn: [needs_repro]
      actions:
        - {{op: label.add, label: needs-repro}}
        - {{op: comment, template: repro}}
    - id: docs-label
      events: [issues.opened]
      if: 'area == "docs"'
      actions:
        - {{op: label.add, label: docs}}
    - id: seen
      events: [issues.opened]
      actions:
        - {{op: label.add, label: triage-seen}}
"""
PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


class Triage:
    """One test's world: config file, event file, environment, and the CLI as a process."""

    def __init__(self, root: Path, env: dict[str, str], redis: Any) -> None:
        self.root = root
        self.env = env
        self.redis = redis
        self.event_file = root / "event.json"
        self.event_file.write_text(json.dumps(EVENT))
        (root / "templates").mkdir()
        (root / "templates" / "needs-repro.md").write_text("Please add the steps that reproduce this.\n")
        self.configure()

    def configure(
        self,
        *,
        mode: str = "shadow",
        suggest: float = 0.6,
        executor: str = "recording",
        rule: str = "needs-repro",
    ) -> None:
        text = CONFIG.format(mode=mode, suggest=suggest, executor=executor, rule=rule)
        Path(self.env["DISPATCHQ_CONFIG"]).write_text(text)

    def cli(self, *args: str, env: dict[str, str] | None = None) -> Any:
        done = run_cli(["triage", *args], env or self.env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert KEY not in done.stdout + done.stderr and GITHUB_TOKEN not in done.stdout + done.stderr
        return json.loads(done.stdout) if "--json" in args else done.stdout

    def run(self, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        return self.cli("--event", str(self.event_file), *args, "--json", env=env)

    def status(self) -> dict[str, Any]:
        done = run_cli(["status", "--json"], self.env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def recorded(self) -> list[dict[str, Any]]:
        return RecordingExecutor(TriageStorage(self.redis)).recorded()


def reasons(out: dict[str, Any], part: str = "suppressed") -> list[tuple[str, str]]:
    return sorted((e["rule"], e["reason"]) for e in out[part])


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[FakeTypeSafeProcess]:
    with FakeTypeSafeProcess(ANSWERS, workdir=tmp_path, api_key=KEY) as fake:
        yield fake


@pytest.fixture
def world(dq_env: dict[str, str], redis_client: Any, provider: FakeTypeSafeProcess, tmp_path: Path) -> Triage:
    env = {k: v for k, v in dq_env.items() if k not in PROXIES}
    env.update(TYPESAFE_API_KEY=KEY, TYPESAFE_BASE_URL=provider.url)
    return Triage(tmp_path, env, redis_client)


# --- idempotent decisions -------------------------------------------------------------------------
def test_a_redelivered_event_is_served_with_no_provider_request(
    world: Triage, provider: FakeTypeSafeProcess
) -> None:
    first = world.run()
    assert first["requests"] == 1 and provider.request_count == 1
    [request] = provider.requests
    assert sorted(request.question_ids) == ["area", "needs_repro"]  # both questions, one request
    assert reasons(first) == [
        ("needs-repro", "shadow_mode"),
        ("needs-repro", "shadow_mode"),
        ("seen", "shadow_mode"),
    ]

    again = world.run()
    assert provider.request_count == 1
    assert (again["requests"], again["asked"], again["reused"]) == (0, [], ["area", "needs_repro"])
    assert again["decision_id"] == first["decision_id"]
    assert again["suppressed"] == first["suppressed"]


def test_editing_the_config_re_triages(world: Triage, provider: FakeTypeSafeProcess) -> None:
    first = world.run()
    assert provider.request_count == 1

    world.configure(suggest=0.65)  # a threshold moved
    moved = world.run()
    assert moved["decision_id"] != first["decision_id"]
    assert (moved["requests"], provider.request_count) == (1, 2)
    assert {e["threshold"] for e in moved["suppressed"]} == {0.85}  # shadow entries show the auto gate

    world.configure(suggest=0.65, rule="needs-steps")  # a rule renamed
    renamed = world.run()
    assert renamed["decision_id"] not in (first["decision_id"], moved["decision_id"])
    assert (renamed["requests"], provider.request_count) == (1, 3)
    assert ("needs-steps", "shadow_mode") in reasons(renamed)

    assert world.run()["requests"] == 0 and provider.request_count == 3  # and that one is stored


def test_changing_only_the_mode_reuses_every_answer(world: Triage, provider: FakeTypeSafeProcess) -> None:
    shadow = world.run()
    assert provider.request_count == 1 and world.recorded() == []

    world.configure(mode="suggest")
    suggest = world.run()
    assert suggest["decision_id"] == shadow["decision_id"]
    assert (suggest["requests"], suggest["mode"]) == (0, "suggest")
    assert reasons(suggest, "suggested") == [
        ("needs-repro", "suggest"),
        ("needs-repro", "suggest"),
        ("seen", "suggest"),
    ]
    assert world.recorded() == []

    auto = world.run("--mode", "auto")
    assert (auto["decision_id"], auto["requests"], auto["mode"]) == (shadow["decision_id"], 0, "auto")
    assert reasons(auto, "applied") == [("needs-repro", "apply"), ("needs-repro", "apply"), ("seen", "apply")]
    assert sorted(r["op"] for r in world.recorded()) == ["comment", "label.add", "label.add"]
    assert provider.request_count == 1


# --- no key, shadow mode --------------------------------------------------------------------------
def test_a_keyless_shadow_run_lists_every_rule_that_needed_answers(
    world: Triage, provider: FakeTypeSafeProcess
) -> None:
    keyless = {k: v for k, v in world.env.items() if k != "TYPESAFE_API_KEY"}
    out = world.run(env=keyless)
    assert reasons(out) == [
        ("docs-label", "no_answers"),
        ("needs-repro", "no_answers"),
        ("needs-repro", "no_answers"),
        ("seen", "shadow_mode"),  # needs no answer: decided, and not written in shadow mode
    ]
    assert all("keyless" in e["explanation"] for e in out["suppressed"] if e["reason"] == "no_answers")
    assert out["requests"] == 0 and provider.request_count == 0
    assert out["applied"] == [] and out["suggested"] == []

    # Nothing keyless is stored as an answer: with a key, the same event asks.
    assert world.run()["requests"] == 1 and provider.request_count == 1


def test_shadow_mode_with_the_github_executor_writes_nothing_to_github(
    world: Triage, provider: FakeTypeSafeProcess
) -> None:
    with FakeGitHub(GITHUB_TOKEN) as github:
        github.issue(TARGET)
        env = {**world.env, "DISPATCHQ_GITHUB_API_URL": github.url, "DISPATCHQ_GITHUB_TOKEN": GITHUB_TOKEN}
        world.configure(executor="github")
        shadow = world.run(env=env)
        assert reasons(shadow) == [
            ("needs-repro", "shadow_mode"),
            ("needs-repro", "shadow_mode"),
            ("seen", "shadow_mode"),
        ]
        assert github.writes == []
        assert world.redis.hlen(keys.TRIAGE_LEDGER) == 0

        # The same wiring does reach GitHub once the mode allows it (answers reused).
        auto = world.run("--mode", "auto", env=env)
        assert all(e["executed"].startswith("performed") for e in auto["applied"]), auto["applied"]
        assert sorted(github.issue(TARGET).labels) == ["needs-repro", "triage-seen"]
        assert len(github.issue(TARGET).comments) == 1
        assert {(w.method, w.path.rsplit("/", 1)[-1]) for w in github.writes} == {
            ("POST", "labels"),
            ("POST", "comments"),
        }
        assert provider.request_count == 1


# --- enqueued triage, status, apply ----------------------------------------------------------------
def test_an_enqueued_event_is_performed_by_a_typed_worker_process(
    world: Triage, provider: FakeTypeSafeProcess
) -> None:
    world.configure(mode="auto")
    queued = world.cli("--event", str(world.event_file), "--enqueue", "--json")
    assert queued["queued"] is True and provider.request_count == 0

    worker = run_cli(["worker", "typed", "--burst", "--quiet"], world.env)
    assert worker.returncode == 0, worker.stderr
    assert KEY not in worker.stdout + worker.stderr

    [request] = provider.requests  # one batched request for the event's questions
    assert sorted(request.question_ids) == ["area", "needs_repro"]
    recorded = world.recorded()
    assert sorted((r["op"], r["detail"].split(" ", 1)[0]) for r in recorded) == [
        ("comment", "comment"),
        ("label.add", "label"),
        ("label.add", "label"),
    ]
    state = RecordingExecutor(TriageStorage(world.redis)).state(TARGET)
    assert state["labels"] == ["needs-repro", "triage-seen"] and len(state["comments"]) == 1
    stored = TriageStore(TriageStorage(world.redis)).load(queued["decision_id"])
    assert stored is not None and stored.result is not None
    assert reasons(dict(stored.result), "applied") == [
        ("needs-repro", "apply"),
        ("needs-repro", "apply"),
        ("seen", "apply"),
    ]

    section = world.status()["triage"]
    assert section["runs"] == 1 and section["counts"] == {"apply": 3}


def test_status_shows_the_last_runs_counts_by_outcome(world: Triage) -> None:
    assert world.status()["triage"]["runs"] == 0
    world.run()
    world.run("--mode", "suggest")
    section = world.status()["triage"]
    assert section["runs"] == 2 and section["last_run"] is not None
    assert section["counts"] == {"shadow_mode": 3, "suggest": 3}


def test_apply_performs_an_accepted_suggestion_once(world: Triage, provider: FakeTypeSafeProcess) -> None:
    world.configure(mode="suggest")
    out = world.run()
    assert len(out["suggested"]) == 3 and world.recorded() == []

    done = world.cli("apply", out["decision_id"], "--json")
    assert [e["executed"].split(":", 1)[0] for e in done] == ["performed"] * 3
    assert len(world.recorded()) == 3
    assert RecordingExecutor(TriageStorage(world.redis)).state(TARGET)["labels"] == [
        "needs-repro",
        "triage-seen",
    ]

    again = world.cli("apply", out["decision_id"], "--json")
    assert all(e["executed"] == "already performed (ledger)" for e in again), again
    assert len(world.recorded()) == 3  # nothing new was written
    assert provider.request_count == 1


def test_one_budget_is_shared_by_the_cli_and_a_typed_worker_process(
    world: Triage, provider: FakeTypeSafeProcess
) -> None:
    text = Path(world.env["DISPATCHQ_CONFIG"]).read_text()
    Path(world.env["DISPATCHQ_CONFIG"]).write_text(
        text.replace("budget: {requests: 100}", "budget: {requests: 1, window: 600}")
    )
    assert world.run()["requests"] == 1  # the CLI spends the one request

    other = world.root / "other.json"
    other.write_text(json.dumps({**EVENT, "target": "acme/app#13", "item": "issue:13"}))
    queued = world.cli("--event", str(other), "--enqueue", "--json")
    worker = run_cli(["worker", "typed", "--burst", "--quiet"], world.env)
    assert worker.returncode == 0, worker.stderr

    assert provider.request_count == 1  # the worker, another process, found it spent
    stored = TriageStore(TriageStorage(world.redis)).load(queued["decision_id"])
    assert stored is not None and stored.result is not None
    spent = [e for e in stored.result["suppressed"] if e["rule"] == "needs-repro"]
    assert {e["reason"] for e in spent} == {"budget_exhausted"}
    assert (
        "triage.budget budget spent: 1 of 1 requests in the last 10m; it refills at"
        in spent[0]["explanation"]
    )
