"""Judgements through real Redis and RQ: in-process runtimes and real worker processes.

The session tier is never started here (no `claude`): a judgement that reaches it sits in
the session line, which is what these tests look at.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dispatchq.client import Client
from dispatchq.core.judgement import JudgementIn
from dispatchq.errors import UserError
from dispatchq.process.wiring import drain
from dispatchq.storage import keys
from tests.support.helpers import calls_of, counting_check, run_cli, write_check_module, write_config


def statuses(rt: Any, ids: list[str]) -> list[tuple[str, str | None]]:
    return [(r.status, r.tier) for r in rt.storage.records.get_many(ids)]


# --- the ladder, end to end -------------------------------------------------------------------------


def test_a_batch_climbs_code_then_keyless_typed_then_a_person_or_the_session_line(setup: Any) -> None:
    rt, client, calls = setup
    results = client.enqueue_many(
        [
            {"kind": "lock", "target": "answered-by-code", "state": {"answer": "rebuild"}},
            {"kind": "lock", "target": "lock-cannot-tell"},
            {"kind": "lock-then-typed", "target": "typed-then-person"},
            {"kind": "lock-then-session", "target": "typed-then-session"},
            {"kind": "typed-only", "target": "typed-first"},
        ]
    )
    assert all(r.ok and r.created for r in results)
    ids = [r.id for r in results]
    assert statuses(rt, ids) == [
        ("queued", "code"),
        ("queued", "code"),
        ("queued", "code"),
        ("queued", "code"),
        ("queued", "typed"),  # no code tier for this kind: it enters at typed
    ]

    drain(rt, sessions=False)

    code, cannot_tell, person, session, typed_first = rt.storage.records.get_many(ids)
    assert (code.status, code.tier, code.value) == ("answered", "code", "rebuild")
    assert (cannot_tell.status, cannot_tell.tier) == ("needs-triage", "needs-triage")
    assert [(s.tier, s.outcome) for s in cannot_tell.trail] == [("code", "moved-up")]
    assert (person.status, person.tier) == ("needs-triage", "needs-triage")
    assert [(s.tier, s.outcome) for s in person.trail] == [("code", "moved-up"), ("typed", "moved-up")]
    assert "no TypeSafe key" in person.trail[1].why
    assert (session.status, session.tier) == ("queued", "session")
    assert [(s.tier, s.outcome) for s in session.trail] == [("code", "moved-up"), ("typed", "moved-up")]
    assert rt.storage.records.line_ids(keys.session_line()) == [session.id]
    assert (typed_first.status, typed_first.tier) == ("needs-triage", "needs-triage")
    assert [s.tier for s in typed_first.trail] == ["typed"]
    assert rt.storage.records.answered_counts() == {"code": 1, "typed": 0, "session": 0}
    assert sorted(calls_of(calls)) == sorted(
        ["answered-by-code", "lock-cannot-tell", "typed-then-person", "typed-then-session"]
    )


def test_the_same_batch_through_real_worker_processes(setup: Any, dq_env: dict[str, str]) -> None:
    rt, _, calls = setup
    lines = "\n".join(
        json.dumps(j)
        for j in (
            {"kind": "lock", "target": "a", "state": {"answer": True}},
            {"kind": "lock-then-session", "target": "b"},
            {"kind": "lock-then-typed", "target": "c", "state": {"raise": True}},
        )
    )
    done = run_cli(["enqueue", "-"], dq_env, input=lines + "\n")
    assert done.returncode == 0, done.stderr
    ids = [line.split("\t")[1] for line in done.stdout.splitlines()]
    for tier in ("code", "typed"):
        worker = run_cli(["worker", tier, "--burst"], dq_env)
        assert worker.returncode == 0, worker.stderr
    a, b, c = rt.storage.records.get_many(ids)
    assert (a.status, a.tier, a.value) == ("answered", "code", True)
    assert (b.status, b.tier) == ("queued", "session")
    assert rt.storage.records.line_ids(keys.session_line()) == [b.id]
    assert (c.status, c.tier) == ("failed", "code")
    assert calls_of(calls) == ["a", "b", "c"]


def test_batches_larger_than_one_job(setup: Any, make_runtime: Any) -> None:
    _, _, calls = setup
    rt = make_runtime(DISPATCHQ_BATCH_SIZE="3")
    client = Client(runtime=rt)
    results = client.enqueue_many(
        [{"kind": "lock", "target": f"t{i}", "state": {"answer": i}} for i in range(10)]
    )
    jobs = {getattr(r, "job", None) for r in rt.storage.records.get_many([r.id for r in results])}
    assert len(jobs) == 4  # 3 + 3 + 3 + 1
    drain(rt, sessions=False)
    assert [r.value for r in rt.storage.records.get_many([r.id for r in results])] == list(range(10))
    assert len(calls_of(calls)) == 10


# --- idempotency ----------------------------------------------------------------------------------------


def test_duplicate_enqueue_returns_the_same_id_and_does_no_work(setup: Any, dq_env: dict[str, str]) -> None:
    rt, client, calls = setup
    first = client.enqueue("lock", "acme/app#1", state={"answer": 1, "b": 2})
    assert client.enqueue("lock", "acme/app#1", state={"b": 2, "answer": 1}) == first  # same content
    drain(rt, sessions=False)
    assert calls_of(calls) == ["acme/app#1"]
    # Answered and still held: the same judgement again is served, not re-judged.
    assert client.enqueue("lock", "acme/app#1", state={"answer": 1, "b": 2}) == first
    cli = run_cli(
        ["enqueue", "--kind", "lock", "--target", "acme/app#1", "--state", '{"answer": 1, "b": 2}'], dq_env
    )
    assert cli.stdout.strip() == first
    drain(rt, sessions=False)
    assert calls_of(calls) == ["acme/app#1"]
    assert rt.storage.records.ids() == [first]


def test_a_different_state_is_a_different_judgement(setup: Any) -> None:
    _, client, _ = setup
    assert client.enqueue("lock", "t", state={"answer": 1}) != client.enqueue(
        "lock", "t", state={"answer": 2}
    )


def test_force_re_judges(setup: Any, dq_env: dict[str, str]) -> None:
    rt, client, calls = setup
    first = client.enqueue("lock", "t", state={"answer": 1})
    drain(rt, sessions=False)
    done = run_cli(
        ["enqueue", "--kind", "lock", "--target", "t", "--state", '{"answer": 1}', "--force"], dq_env
    )
    assert done.returncode == 0, done.stderr
    second = done.stdout.strip()
    assert second != first
    drain(rt, sessions=False)
    assert calls_of(calls) == ["t", "t"]
    assert rt.storage.records.get(second).status == "answered"
    assert client.enqueue("lock", "t", state={"answer": 1}) == second  # the newest is the live one


def test_a_producer_key_decides_what_is_the_same(setup: Any) -> None:
    _, client, _ = setup
    first = client.enqueue("lock", "t", state={"answer": 1}, key="finding-7/attempt-1")
    assert client.enqueue("lock", "t", state={"answer": 2}, key="finding-7/attempt-1") == first
    assert client.enqueue("lock", "t", state={"answer": 1}, key="finding-7/attempt-2") != first


def test_a_failed_judgement_may_be_enqueued_again(setup: Any, tmp_path: Path) -> None:
    rt, client, calls = setup
    first = client.enqueue("lock", "t", state={"raise": True})
    drain(rt, sessions=False)
    assert rt.storage.records.get(first).status == "failed"
    again = client.enqueue("lock", "t", state={"raise": True})
    assert again != first
    drain(rt, sessions=False)
    assert calls_of(calls) == ["t", "t"]


# --- failures, cancel, retry ----------------------------------------------------------------------------


def test_a_check_that_raises_fails_only_its_own_judgement(setup: Any) -> None:
    rt, client, _ = setup
    results = client.enqueue_many(
        [
            {"kind": "lock-then-session", "target": "before", "state": {"answer": 1}},
            {"kind": "lock-then-session", "target": "broken", "state": {"raise": True}},
            {"kind": "lock-then-session", "target": "after", "state": {"answer": 3}},
        ]
    )
    ids = [r.id for r in results]
    records = rt.storage.records.get_many(ids)
    assert len({getattr(r, "job", None) for r in records}) == 1  # one RQ job carries all three

    drain(rt, sessions=False)

    before, broken, after = rt.storage.records.get_many(ids)
    assert (before.status, before.value) == ("answered", 1)
    assert (after.status, after.value) == ("answered", 3)
    assert (broken.status, broken.tier) == ("failed", "code")  # failed, never escalated to a session
    assert "RuntimeError" in broken.reason and "check exploded on broken" in broken.reason
    assert [(s.tier, s.outcome) for s in broken.trail] == [("code", "failed")]
    assert rt.storage.records.line_ids(keys.session_line()) == []
    assert rt.storage.records.ids("failed") == [broken.id]


def test_a_kind_removed_from_the_config_fails_visibly(setup: Any, tmp_path: Path, make_runtime: Any) -> None:
    rt, client, _ = setup
    jid = client.enqueue("lock", "t", state={"answer": 1})
    check, _ = counting_check(tmp_path)
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  other:\n    check: {check}\n")
    worker_rt = make_runtime()  # a worker started after the kind was deleted
    drain(worker_rt, sessions=False)
    record = rt.storage.records.get(jid)
    assert record.status == "failed" and "no longer in the config" in record.reason


def test_cancel_before_work(setup: Any) -> None:
    rt, client, calls = setup
    keep = client.enqueue("lock", "keep", state={"answer": 1})
    drop = client.enqueue("lock", "drop", state={"answer": 2})
    assert rt.dispatcher.cancel(drop) is True
    drain(rt, sessions=False)
    assert rt.storage.records.get(drop).status == "cancelled"
    assert rt.storage.records.get(drop).value is None
    assert rt.storage.records.get(keep).status == "answered"
    assert calls_of(calls) == ["keep"]
    assert rt.dispatcher.cancel(drop) is False  # already finished
    # A cancelled judgement frees its content: enqueueing it again is new work.
    assert client.enqueue("lock", "drop", state={"answer": 2}) != drop


def test_cancel_removes_a_judgement_from_the_session_line(setup: Any) -> None:
    rt, client, _ = setup
    jid = client.enqueue("lock-then-session", "t")
    drain(rt, sessions=False)
    assert rt.storage.records.line_ids(keys.session_line()) == [jid]
    rt.dispatcher.cancel(jid)
    assert rt.storage.records.line_ids(keys.session_line()) == []


def test_retry_re_judges_a_failed_judgement_from_its_entry_tier(setup: Any, tmp_path: Path) -> None:
    rt, client, _ = setup
    flag = tmp_path / "broken"
    flag.write_text("")
    module = write_check_module(
        tmp_path,
        f"""
        import pathlib

        def check(judgement):
            if pathlib.Path({str(flag)!r}).exists():
                raise RuntimeError("flaky")
            return "fixed"
        """,
    )
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  flaky:\n    check: {module}:check\n")
    jid = client.enqueue("flaky", "t")
    drain(rt, sessions=False)
    assert rt.storage.records.get(jid).status == "failed"
    flag.unlink()
    rt.dispatcher.retry(jid)
    record = rt.storage.records.get(jid)
    assert (record.status, record.tier, record.reason) == ("queued", "code", None)
    drain(rt, sessions=False)
    record = rt.storage.records.get(jid)
    assert (record.status, record.value) == ("answered", "fixed")
    assert [s.outcome for s in record.trail] == ["failed", "requeued", "answered"]


def test_retry_after_needs_triage_climbs_again(setup: Any) -> None:
    rt, client, calls = setup
    jid = client.enqueue("lock-then-typed", "t")
    drain(rt, sessions=False)
    assert rt.storage.records.get(jid).status == "needs-triage"
    rt.dispatcher.retry(jid)
    assert rt.storage.records.get(jid).tier == "code"
    drain(rt, sessions=False)
    record = rt.storage.records.get(jid)
    assert record.status == "needs-triage"
    assert [s.tier for s in record.trail] == ["code", "typed", "code", "code", "typed"]
    assert calls_of(calls) == ["t", "t"]


def test_retry_refuses_live_work(setup: Any) -> None:
    rt, client, _ = setup
    jid = client.enqueue("lock", "t")
    with pytest.raises(UserError, match="nothing to retry"):
        rt.dispatcher.retry(jid)


# --- records: the result TTL ------------------------------------------------------------------------------


def test_finished_records_get_the_ttl_and_unfinished_ones_do_not(setup: Any, redis_client: Any) -> None:
    rt, client, _ = setup
    answered = client.enqueue("lock", "answered", state={"answer": 1})
    failed = client.enqueue("lock", "failed", state={"raise": True})
    person = client.enqueue("lock", "person")
    waiting_session = client.enqueue("lock-then-session", "session")
    cancelled = client.enqueue("lock", "cancelled", state={"answer": 2})
    rt.dispatcher.cancel(cancelled)
    drain(rt, sessions=False)
    queued = client.enqueue("typed-only", "never-worked")

    for jid in (answered, failed, person, cancelled):
        ttl = redis_client.ttl(keys.record(jid))
        assert 0 < ttl <= 500, (rt.storage.records.get(jid).status, ttl)
    for jid in (waiting_session, queued):
        assert redis_client.ttl(keys.record(jid)) == -1, rt.storage.records.get(jid).status
    assert rt.storage.records.get(waiting_session).status == "queued"


# --- admission ---------------------------------------------------------------------------------------------


def test_a_checkout_outside_the_roots_is_refused_and_nothing_is_written(
    setup: Any, redis_client: Any, tmp_path: Path
) -> None:
    rt, client, calls = setup
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    outside.mkdir()
    before = sorted(redis_client.keys("*"))
    for checkout in (str(outside), f"{tmp_path}/../{outside.name}", "/"):
        with pytest.raises(UserError, match="outside DISPATCHQ_CHECKOUT_ROOTS"):
            client.enqueue("lock", "t", context={"checkout": checkout}, state={"answer": 1})
    assert sorted(redis_client.keys("*")) == before
    drain(rt, sessions=False)
    assert calls_of(calls) == []


def test_enqueue_many_reports_bad_judgements_and_keeps_the_good(setup: Any) -> None:
    rt, client, _ = setup
    results = client.enqueue_many(
        [
            {"kind": "lock", "target": "good"},
            {"kind": "lock", "target": "bad", "context": {"checkout": "/"}},
            {"kind": "nope", "target": "bad"},
            {"kind": "lock"},
            JudgementIn(kind="lock", target="also-good"),
        ]
    )
    assert [r.ok for r in results] == [True, False, False, False, True]
    assert [r.index for r in results] == [1, 2, 3, 4, 5]
    assert "target" in (results[3].error or "")
    assert sorted(rt.storage.records.ids()) == sorted([results[0].id, results[4].id])


def test_a_checkout_judgement_runs_only_on_its_host(
    setup: Any, dq_env: dict[str, str], git_repo: Path
) -> None:
    rt, _, calls = setup
    env_a = {**dq_env, "DISPATCHQ_HOST": "host-a"}
    context = json.dumps({"checkout": str(git_repo)})
    done = run_cli(
        ["enqueue", "--kind", "lock", "--target", "t", "--context", context, "--state", "1"], env_a
    )
    assert done.returncode == 0, done.stderr
    jid = done.stdout.strip()
    assert rt.storage.records.get(jid).host == "host-a"
    run_cli(["worker", "code", "--burst"], {**dq_env, "DISPATCHQ_HOST": "host-b"})
    assert rt.storage.records.get(jid).status == "queued"  # another machine never touches it
    assert calls_of(calls) == []
    run_cli(["worker", "code", "--burst"], env_a)
    assert rt.storage.records.get(jid).status in ("answered", "needs-triage")
    assert calls_of(calls) == ["t"]


def test_a_checkouts_edit_makes_it_a_new_judgement(setup: Any, git_repo: Path) -> None:
    _, client, _ = setup
    context = {"checkout": str(git_repo)}
    first = client.enqueue("lock", "t", context=context, state={"answer": 1})
    assert client.enqueue("lock", "t", context=context, state={"answer": 1}) == first
    (git_repo / "README.md").write_text("edited\n")
    assert client.enqueue("lock", "t", context=context, state={"answer": 1}) != first


def test_result_waits_for_the_answer(setup: Any) -> None:
    rt, client, _ = setup
    jid = client.enqueue("lock", "t", state={"answer": [1, 2]})
    assert client.result(jid).status == "queued"
    drain(rt, sessions=False)
    record = client.result(jid, wait=5)
    assert (record.status, record.value) == ("answered", [1, 2])
    with pytest.raises(UserError, match="no judgement"):
        client.result("0" * 32)


def test_a_late_commit_never_overwrites_a_cancel(setup: Any) -> None:
    from dispatchq.queue.dispatch import Moves

    rt, client, _ = setup
    jid = client.enqueue("lock", "t", state={"answer": 1})
    assert [c.id for c in rt.storage.records.claim([jid], "code")] == [jid]  # a worker holds it
    assert rt.dispatcher.cancel(jid) is True  # ...when a person cancels it
    moves = Moves()
    moves.answer(jid, "code", 1, "check answered")
    rt.dispatcher.commit(moves)  # the worker's commit arrives afterwards
    record = rt.storage.records.get(jid)
    assert (record.status, record.value) == ("cancelled", None)
    assert rt.storage.records.answered_counts()["code"] == 0


def test_reconcile_re_enqueues_a_judgement_whose_job_was_lost(setup: Any, redis_client: Any) -> None:
    from dispatchq.queue.scheduler import reconcile

    rt, client, calls = setup
    jid = client.enqueue("lock", "t", state={"answer": "found"})
    job = rt.storage.records.get(jid).job  # type: ignore[union-attr]
    # An operator deletes RQ's keys by hand: the record says queued, nothing will run it.
    redis_client.delete(f"rq:job:{job}", "rq:queue:dispatchq-code")
    drain(rt, sessions=False)
    assert rt.storage.records.get(jid).status == "queued" and calls_of(calls) == []
    assert reconcile(rt, min_age=0) == 1
    drain(rt, sessions=False)
    assert (rt.storage.records.get(jid).status, rt.storage.records.get(jid).value) == ("answered", "found")
    assert reconcile(rt, min_age=0) == 0


def test_every_key_written_is_dispatchqs_or_rqs(setup: Any, redis_client: Any) -> None:
    rt, client, _ = setup
    client.enqueue_many(
        [
            {"kind": "lock", "target": "a", "state": {"answer": 1}},
            {"kind": "lock", "target": "b", "state": {"raise": True}},
            {"kind": "lock-then-session", "target": "c"},
            {"kind": "typed-only", "target": "d"},
        ]
    )
    drain(rt, sessions=False)
    names = [k.decode() for k in redis_client.keys("*")]
    assert names
    assert [n for n in names if not n.startswith(("dispatchq:", "rq:"))] == []
