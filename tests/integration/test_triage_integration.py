"""Triage end to end: the real CLI as a process, a real Redis, the real SDK against the fake API.

`dispatchq triage` runs as a subprocess with TYPESAFE_BASE_URL pointing at the loopback fake
in its own process, so every provider request the rules engine makes is counted there;
`--enqueue` is performed by a real `dispatchq worker typed --burst` process. The GitHub
executor talks to a loopback fake of GitHub that records every write.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dispatchq.storage import keys
from dispatchq.storage.triage import TriageStorage
from dispatchq.testing.typesafe import FakeTypeSafeProcess
from dispatchq.triage.engine import TriageStore
from dispatchq.triage.executors import RecordingExecutor
from tests.support.github_api import FakeGitHub
from tests.support.helpers import run_cli
from tests.support.triage import (
    EVENT,
    GITHUB_TOKEN,
    TARGET,
    TRIAGE_KEY,
    Triage,
)


def reasons(out: dict[str, Any], part: str = "suppressed") -> list[tuple[str, str]]:
    return sorted((e["rule"], e["reason"]) for e in out[part])


# --- idempotent decisions -------------------------------------------------------------------------
def test_a_redelivered_event_is_served_with_no_provider_request(
    triage_world: Triage, triage_provider: FakeTypeSafeProcess
) -> None:
    first = triage_world.run()
    assert first["requests"] == 1 and triage_provider.request_count == 1
    [request] = triage_provider.requests
    assert sorted(request.question_ids) == ["area", "needs_repro"]  # both questions, one request
    assert reasons(first) == [
        ("needs-repro", "shadow_mode"),
        ("needs-repro", "shadow_mode"),
        ("seen", "shadow_mode"),
    ]

    again = triage_world.run()
    assert triage_provider.request_count == 1
    assert (again["requests"], again["asked"], again["reused"]) == (0, [], ["area", "needs_repro"])
    assert again["decision_id"] == first["decision_id"]
    assert again["suppressed"] == first["suppressed"]


def test_editing_the_config_re_triages(triage_world: Triage, triage_provider: FakeTypeSafeProcess) -> None:
    first = triage_world.run()
    assert triage_provider.request_count == 1

    triage_world.configure(suggest=0.65)  # a threshold moved
    moved = triage_world.run()
    assert moved["decision_id"] != first["decision_id"]
    assert (moved["requests"], triage_provider.request_count) == (1, 2)
    assert {e["threshold"] for e in moved["suppressed"]} == {0.85}  # shadow entries show the auto gate

    triage_world.configure(suggest=0.65, rule="needs-steps")  # a rule renamed
    renamed = triage_world.run()
    assert renamed["decision_id"] not in (first["decision_id"], moved["decision_id"])
    assert (renamed["requests"], triage_provider.request_count) == (1, 3)
    assert ("needs-steps", "shadow_mode") in reasons(renamed)

    assert (
        triage_world.run()["requests"] == 0 and triage_provider.request_count == 3
    )  # and that one is stored


def test_changing_only_the_mode_reuses_every_answer(
    triage_world: Triage, triage_provider: FakeTypeSafeProcess
) -> None:
    shadow = triage_world.run()
    assert triage_provider.request_count == 1 and triage_world.recorded() == []

    triage_world.configure(mode="suggest")
    suggest = triage_world.run()
    assert suggest["decision_id"] == shadow["decision_id"]
    assert (suggest["requests"], suggest["mode"]) == (0, "suggest")
    assert reasons(suggest, "suggested") == [
        ("needs-repro", "suggest"),
        ("needs-repro", "suggest"),
        ("seen", "suggest"),
    ]
    assert triage_world.recorded() == []

    auto = triage_world.run("--mode", "auto")
    assert (auto["decision_id"], auto["requests"], auto["mode"]) == (shadow["decision_id"], 0, "auto")
    assert reasons(auto, "applied") == [("needs-repro", "apply"), ("needs-repro", "apply"), ("seen", "apply")]
    assert sorted(r["op"] for r in triage_world.recorded()) == ["comment", "label.add", "label.add"]
    assert triage_provider.request_count == 1


# --- no key, shadow mode --------------------------------------------------------------------------
def test_a_keyless_shadow_run_lists_every_rule_that_needed_answers(
    triage_world: Triage, triage_provider: FakeTypeSafeProcess
) -> None:
    keyless = {k: v for k, v in triage_world.env.items() if k != "TYPESAFE_API_KEY"}
    out = triage_world.run(env=keyless)
    assert reasons(out) == [
        ("docs-label", "no_answers"),
        ("needs-repro", "no_answers"),
        ("needs-repro", "no_answers"),
        ("seen", "shadow_mode"),  # needs no answer: decided, and not written in shadow mode
    ]
    assert all("keyless" in e["explanation"] for e in out["suppressed"] if e["reason"] == "no_answers")
    assert out["requests"] == 0 and triage_provider.request_count == 0
    assert out["applied"] == [] and out["suggested"] == []

    # Nothing keyless is stored as an answer: with a key, the same event asks.
    assert triage_world.run()["requests"] == 1 and triage_provider.request_count == 1


def test_shadow_mode_with_the_github_executor_writes_nothing_to_github(
    triage_world: Triage, triage_provider: FakeTypeSafeProcess
) -> None:
    with FakeGitHub(GITHUB_TOKEN) as github:
        github.issue(TARGET)
        env = {
            **triage_world.env,
            "DISPATCHQ_GITHUB_API_URL": github.url,
            "DISPATCHQ_GITHUB_TOKEN": GITHUB_TOKEN,
        }
        triage_world.configure(executor="github")
        shadow = triage_world.run(env=env)
        assert reasons(shadow) == [
            ("needs-repro", "shadow_mode"),
            ("needs-repro", "shadow_mode"),
            ("seen", "shadow_mode"),
        ]
        assert github.writes == []
        assert triage_world.redis.hlen(keys.TRIAGE_LEDGER) == 0

        # The same wiring does reach GitHub once the mode allows it (answers reused).
        auto = triage_world.run("--mode", "auto", env=env)
        assert all(e["executed"].startswith("performed") for e in auto["applied"]), auto["applied"]
        assert sorted(github.issue(TARGET).labels) == ["needs-repro", "triage-seen"]
        assert len(github.issue(TARGET).comments) == 1
        assert {(w.method, w.path.rsplit("/", 1)[-1]) for w in github.writes} == {
            ("POST", "labels"),
            ("POST", "comments"),
        }
        assert triage_provider.request_count == 1


# --- enqueued triage, status, apply ----------------------------------------------------------------
def test_an_enqueued_event_is_performed_by_a_typed_worker_process(
    triage_world: Triage, triage_provider: FakeTypeSafeProcess
) -> None:
    triage_world.configure(mode="auto")
    queued = triage_world.cli("--event", str(triage_world.event_file), "--enqueue", "--json")
    assert queued["queued"] is True and triage_provider.request_count == 0

    worker = run_cli(["worker", "typed", "--burst", "--quiet"], triage_world.env)
    assert worker.returncode == 0, worker.stderr
    assert TRIAGE_KEY not in worker.stdout + worker.stderr

    [request] = triage_provider.requests  # one batched request for the event's questions
    assert sorted(request.question_ids) == ["area", "needs_repro"]
    recorded = triage_world.recorded()
    assert sorted((r["op"], r["detail"].split(" ", 1)[0]) for r in recorded) == [
        ("comment", "comment"),
        ("label.add", "label"),
        ("label.add", "label"),
    ]
    state = RecordingExecutor(TriageStorage(triage_world.redis)).state(TARGET)
    assert state["labels"] == ["needs-repro", "triage-seen"] and len(state["comments"]) == 1
    stored = TriageStore(TriageStorage(triage_world.redis)).load(queued["decision_id"])
    assert stored is not None and stored.result is not None
    assert reasons(dict(stored.result), "applied") == [
        ("needs-repro", "apply"),
        ("needs-repro", "apply"),
        ("seen", "apply"),
    ]

    section = triage_world.status()["triage"]
    assert section["runs"] == 1 and section["counts"] == {"apply": 3}


def test_status_shows_the_last_runs_counts_by_outcome(triage_world: Triage) -> None:
    assert triage_world.status()["triage"]["runs"] == 0
    triage_world.run()
    triage_world.run("--mode", "suggest")
    section = triage_world.status()["triage"]
    assert section["runs"] == 2 and section["last_run"] is not None
    assert section["counts"] == {"shadow_mode": 3, "suggest": 3}


def test_apply_performs_an_accepted_suggestion_once(
    triage_world: Triage, triage_provider: FakeTypeSafeProcess
) -> None:
    triage_world.configure(mode="suggest")
    out = triage_world.run()
    assert len(out["suggested"]) == 3 and triage_world.recorded() == []

    done = triage_world.cli("apply", out["decision_id"], "--json")
    assert [e["executed"].split(":", 1)[0] for e in done] == ["performed"] * 3
    assert len(triage_world.recorded()) == 3
    assert RecordingExecutor(TriageStorage(triage_world.redis)).state(TARGET)["labels"] == [
        "needs-repro",
        "triage-seen",
    ]

    again = triage_world.cli("apply", out["decision_id"], "--json")
    assert all(e["executed"] == "already performed (ledger)" for e in again), again
    assert len(triage_world.recorded()) == 3  # nothing new was written
    assert triage_provider.request_count == 1


def test_one_budget_is_shared_by_the_cli_and_a_typed_worker_process(
    triage_world: Triage, triage_provider: FakeTypeSafeProcess
) -> None:
    text = Path(triage_world.env["DISPATCHQ_CONFIG"]).read_text()
    Path(triage_world.env["DISPATCHQ_CONFIG"]).write_text(
        text.replace("budget: {requests: 100}", "budget: {requests: 1, window: 600}")
    )
    assert triage_world.run()["requests"] == 1  # the CLI spends the one request

    other = triage_world.root / "other.json"
    other.write_text(json.dumps({**EVENT, "target": "acme/app#13", "item": "issue:13"}))
    queued = triage_world.cli("--event", str(other), "--enqueue", "--json")
    worker = run_cli(["worker", "typed", "--burst", "--quiet"], triage_world.env)
    assert worker.returncode == 0, worker.stderr

    assert triage_provider.request_count == 1  # the worker, another process, found it spent
    stored = TriageStore(TriageStorage(triage_world.redis)).load(queued["decision_id"])
    assert stored is not None and stored.result is not None
    spent = [e for e in stored.result["suppressed"] if e["rule"] == "needs-repro"]
    assert {e["reason"] for e in spent} == {"budget_exhausted"}
    assert (
        "triage.budget budget spent: 1 of 1 requests in the last 10m; it refills at"
        in spent[0]["explanation"]
    )
