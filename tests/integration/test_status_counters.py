"""The live counts `status` reads instead of records stay exact on every path.

Each test compares the counters with a full scan of the records (the truth) after the
moves a judgement makes: enqueue, claim, wait (window, host block, throttle), a new reason,
release, answer, fail, cancel, retry, needs-triage, a tier change; under concurrent workers;
and after an upgrade from a store that had no counters. And `status` does not read the
waiting records: the server's own command counts say how many records it read.
"""

from __future__ import annotations

import json
import random
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dispatchq.core.judgement import FINISHED, STATUSES, TrailEntry
from dispatchq.core.waiting import WAIT_CLASSES
from dispatchq.storage import keys
from dispatchq.storage.store import WAIT_CLASS, WAITING_SAMPLE, NewRecord, Store
from tests.support.helpers import run_cli, write_check_module
from tests.support.store import new_record
from tests.support.unstarted import assert_index_exact

UNFINISHED = [s for s in STATUSES if s not in FINISHED]
WINDOW = "usage window closed until 2030-01-01 00:00 UTC (five_hour)"


def entry(jid: str, *, tier: str = "session", line: str = "") -> NewRecord:
    return new_record(jid, tier=tier, line=line)


def scan(store: Store) -> tuple[dict[str, dict[str, int]], dict[str, int], dict[str, int]]:
    """The truth, from every record: unfinished per tier and status, waiting per class and reason."""
    by_tier: dict[str, dict[str, int]] = {}
    classes = dict.fromkeys(WAIT_CLASSES, 0)
    reasons: dict[str, int] = {}
    for status in UNFINISHED:
        for jid in store.ids(status):
            raw = {k.decode(): v.decode() for k, v in store.redis.hgetall(keys.record(jid)).items()}
            assert raw["status"] == status
            tier = by_tier.setdefault(raw.get("tier", ""), {})
            tier[status] = tier.get(status, 0) + 1
            if status == "waiting":
                classes[raw[WAIT_CLASS]] += 1
                reason = raw.get("reason") or "unknown"
                reasons[reason] = reasons.get(reason, 0) + 1
            else:
                assert WAIT_CLASS not in raw, f"{jid} is {status} but still carries a wait class"
    return by_tier, classes, reasons


def assert_exact(store: Store) -> None:
    by_tier, classes, reasons = scan(store)
    live = store.live_counts()
    assert live.rebuilt is None
    assert {
        t: {s: n for s, n in c.items() if n} for t, c in live.by_tier.items() if any(c.values())
    } == by_tier
    assert live.waiting == classes
    shown, distinct = store.waiting_reasons(limit=1000)
    assert shown == reasons and distinct == len(reasons)


def test_counts_follow_every_move_of_a_record(counted_store: Store) -> None:
    line = keys.session_line()
    created = counted_store.create_many(
        [entry(f"j{i}", line=line) for i in range(6)] + [entry("c0", tier="code")]
    )
    assert created is not None and all(new for _, new in created)
    assert_exact(counted_store)
    assert counted_store.live_counts().by_tier["session"]["queued"] == 6

    # The window closes: every line member waits, with the window's reason.
    for i in range(6):
        assert counted_store.transition(f"j{i}", "waiting", expect=["queued"], fields={"reason": WINDOW})
    assert_exact(counted_store)
    assert counted_store.live_counts().waiting["window"] == 6

    # A new lift time: the same records wait with a new reason (class kept, reasons move).
    later = WINDOW.replace("2030", "2031")
    counted_store.transition("j0", "waiting", expect=["waiting"], fields={"reason": later})
    assert_exact(counted_store)

    # A host block names its class (its reason is free text).
    counted_store.transition(
        "j1",
        "waiting",
        expect=["waiting"],
        fields={"reason": "claude: not found", WAIT_CLASS: "host_blocked"},
    )
    counted_store.set_fields("j2", reason="transient throttle, retrying after 10:00:00 UTC: 529")
    assert_exact(counted_store)
    assert counted_store.live_counts().waiting == {
        **dict.fromkeys(WAIT_CLASSES, 0),
        "window": 4,
        "host_blocked": 1,
        "retry": 1,
    }

    # Released; admitted from the line; claimed from waiting by a tier.
    counted_store.transition("j3", "queued", expect=["waiting"], delete=["reason"])
    member = next(m.decode() for m in counted_store.redis.zrange(line, 0, -1) if m.decode().endswith(":j3"))
    assert counted_store.claim_from_line(line, member, "j3")
    assert [c.id for c in counted_store.claim(["j4"], "session")] == ["j4"]
    assert [c.id for c in counted_store.claim(["c0"], "code")] == ["c0"]
    assert_exact(counted_store)

    # Back to waiting from running (refused at spawn), then answered, failed, cancelled.
    counted_store.transition("j3", "waiting", expect=["running"], fields={"reason": WINDOW})
    counted_store.transition("j4", "answered", expect=["running"], fields={"tier": "session", "value": True})
    counted_store.transition("j5", "failed", fields={"reason": "session failed: boom"})
    counted_store.transition("j0", "cancelled", fields={"reason": "cancelled by request"})
    counted_store.transition(
        "c0", "needs-triage", fields={"tier": "needs-triage", "reason": "no tier could answer"}
    )
    assert_exact(counted_store)

    # Retry a failed one (its tier set again, then queued), and a tier change while waiting.
    counted_store.set_fields("j5", tier="session")
    counted_store.transition("j5", "queued", expect=["failed"], delete=["reason"])
    counted_store.set_fields("j1", tier="typed")
    assert_exact(counted_store)
    live = counted_store.live_counts()
    assert live.by_tier["typed"] == {"waiting": 1}
    finished = counted_store.counters().finished
    assert finished == {
        "session:answered": 1,
        "session:failed": 1,
        "session:cancelled": 1,
        "needs-triage:needs-triage": 1,
    }


def test_counts_follow_the_window_and_the_dispatcher(make_runtime: Any, dq_env: dict[str, str]) -> None:
    from dispatchq.client import Client

    Path(dq_env["DISPATCHQ_CONFIG"]).write_text(
        'kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n'
    )
    rt = make_runtime()
    store = rt.storage.records
    store.live_counts()
    client = Client(runtime=rt)
    ids = [client.enqueue("ask", f"o/r#{i}") for i in range(8)]
    assert_exact(store)

    rt.window.close(datetime.now(UTC) + timedelta(hours=2), reason="reserved for a demo")
    assert {r.status for r in store.get_many(ids) if r} == {"waiting"}
    assert_exact(store)
    assert store.live_counts().waiting["window"] == 8

    rt.dispatcher.cancel(ids[0])
    rt.window.open()
    assert_exact(store)
    assert store.live_counts().waiting["window"] == 0
    store.transition(ids[1], "failed", fields={"reason": "session failed: x"})
    rt.dispatcher.retry(ids[1])
    assert_exact(store)


def test_counts_stay_exact_under_concurrent_workers(redis_client: Any, redis_server: Any) -> None:
    base = Store(redis_client)
    base.live_counts()
    line = keys.session_line()
    ids = [f"w{i}" for i in range(120)]
    base.create_many([entry(jid, line=line) for jid in ids])
    reasons = [WINDOW, "transient throttle, retrying after 10:00:00 UTC", "all 2 session slot(s) busy", "x"]
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        store = Store(redis_server.client())  # its own connection, as a worker process has
        try:
            for _ in range(300):
                jid = rng.choice(ids)
                move = rng.randrange(7)
                if move == 0:
                    store.claim([jid], "session", strict=True)
                elif move == 1:
                    store.transition(jid, "waiting", fields={"reason": rng.choice(reasons)})
                elif move == 2:
                    store.transition(jid, "queued", expect=["waiting", "running"], delete=["reason"])
                elif move == 3:
                    store.transition(jid, "answered", expect=["running"], fields={"tier": "session"})
                elif move == 4:
                    store.transition(jid, "queued", expect=["answered", "failed", "cancelled"])
                elif move == 5:
                    store.set_fields(jid, tier=rng.choice(["session", "typed"]))
                else:
                    trail = TrailEntry(tier="session", outcome="failed", why="boom")
                    store.transition(jid, "failed", expect=["running", "waiting"], trail=trail)
        except BaseException as error:  # surfaced below: a thread's failure must fail the test
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert_exact(base)
    assert_index_exact(base)  # the oldest-waiting index, moved by the same scripts
    # The mix really reached every interesting state (else the test proves little).
    by_tier, classes, _ = scan(base)
    assert sum(classes.values()) > 0 and any("running" in c for c in by_tier.values())


def test_a_store_without_counters_is_recounted_once(redis_client: Any) -> None:
    store = Store(redis_client)
    line = keys.session_line()
    store.create_many([entry(f"u{i}", line=line) for i in range(30)])
    for i in range(20):
        reason = WINDOW if i % 2 else "all 2 session slot(s) busy"
        store.transition(f"u{i}", "waiting", fields={"reason": reason})
    store.claim(["u25"], "session")
    truth = scan(store)
    # What an older dispatchq left: no counters, no class on the records.
    redis_client.delete(keys.STATS_LIVE, keys.STATS_WAITING_REASONS)
    for i in range(20):
        redis_client.hdel(keys.record(f"u{i}"), WAIT_CLASS)

    live = store.live_counts()
    assert live.rebuilt == 30
    assert live.waiting == {**dict.fromkeys(WAIT_CLASSES, 0), "window": 10, "slot": 10}
    assert scan(store) == truth
    assert store.live_counts().rebuilt is None  # once
    assert_exact(store)


def test_status_reads_counters_not_the_waiting_records(make_runtime: Any, dq_env: dict[str, str]) -> None:
    from dispatchq.workers.status import LATEST_SHOWN, collect_status

    rt = make_runtime()
    store = rt.storage.records
    line = keys.session_line()
    store.live_counts()

    def wait(first: int, last: int) -> None:
        store.create_many([entry(f"s{i}", line=line) for i in range(first, last)])
        for i in range(first, last):
            store.transition(f"s{i}", "waiting", fields={"reason": WINDOW})

    def reads() -> tuple[dict[str, int], dict[str, Any]]:
        """Record-reading commands the server ran for one `collect_status` (its own counts)."""
        rt.redis.config_resetstat()
        data = collect_status(rt).as_json()
        stats = rt.redis.info("commandstats")
        return {
            c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hgetall", "hmget", "hget")
        }, data

    wait(0, 40)
    few, _ = reads()
    wait(40, 400)
    many, data = reads()
    # Without the counters each waiting record cost one HGETALL: 40, then 400. Now the same
    # few reads however many wait (a bounded sample of them, the latest, a few hashes).
    assert many == few, (few, many)
    assert many["hgetall"] + many["hmget"] + many["hget"] <= WAITING_SAMPLE + LATEST_SHOWN + 20, many
    assert data["judgements"]["waiting"] == 400
    assert data["waiting"] == {WINDOW: 400}
    assert data["waiting_by_class"]["window"] == 400
    assert len(data["waiting_sample"]) == WAITING_SAMPLE
    assert all(s["reason"] == WINDOW for s in data["waiting_sample"])


def test_status_says_when_it_rebuilt_the_counts(dq_env: dict[str, str], redis_client: Any) -> None:
    store = Store(redis_client)
    store.create_many([entry("r1", line=keys.session_line())])
    store.transition("r1", "waiting", fields={"reason": WINDOW})
    redis_client.delete(keys.STATS_LIVE)
    done = run_cli(["status", "--json"], dq_env)
    assert done.returncode == 0, done.stderr
    assert "rebuilt once from 1 unfinished judgement" in done.stderr
    assert json.loads(done.stdout)["waiting_by_class"]["window"] == 1
    again = run_cli(["status", "--json"], dq_env)
    assert "rebuilt" not in again.stderr
    text = run_cli(["status", "--recount"], dq_env)
    assert text.returncode == 0, text.stderr
    assert "recounted 1 unfinished judgement" in text.stderr
    assert f"1 waiting: {WINDOW}" in text.stdout and "waiting by class: window 1" in text.stdout


def test_a_host_block_counts_its_judgements_as_host_blocked(
    make_runtime: Any, dq_env: dict[str, str]
) -> None:
    from dispatchq.tiers.session import block_host

    rt = make_runtime()
    store = rt.storage.records
    store.live_counts()
    line = keys.session_line(rt.settings.host)
    store.create_many([entry(f"h{i}", line=line) for i in range(4)])
    store.claim(["h0"], "session")
    record = store.get("h0")
    assert record is not None
    # Its reason is the failure's own text, which says nothing of hosts: the writer names the class.
    block_host(rt.window, record, "claude: command not found", "fingerprint")
    assert store.live_counts().waiting["host_blocked"] == 4
    assert_exact(store)


def test_status_json_is_the_documented_document(make_runtime: Any, dq_env: dict[str, str]) -> None:
    """Every field the schema requires is in `status --json`, which reads back as the same `Status`."""
    from dispatchq.core.status import SCHEMA_VERSION, Status, status_json_schema

    rt = make_runtime()
    rt.storage.records.create_many([entry("d1", line=keys.session_line())])
    rt.storage.records.transition("d1", "waiting", fields={"reason": WINDOW})
    done = run_cli(["status", "--json"], dq_env)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["schema"] == SCHEMA_VERSION
    assert set(status_json_schema()["required"]) <= set(document)
    assert set(document) <= set(status_json_schema()["properties"])
    assert document["waiting_for_redis_here"] == []  # the CLI's own field: this host waits for nothing
    assert Status.model_validate(document).as_json() == document


def test_status_asks_about_each_running_job_once_not_each_judgement_it_carries(
    make_runtime: Any, dq_env: dict[str, str], monkeypatch: Any
) -> None:
    from dispatchq.client import Client
    from dispatchq.queue.liveness import JobLiveness
    from dispatchq.workers import status as status_module

    config = Path(dq_env["DISPATCHQ_CONFIG"])
    module = write_check_module(
        config.parent, "def noop(j):\n    return j.target\n"
    )  # its own name in-process
    config.write_text(f"kinds:\n  noop:\n    check: {module}:noop\n")
    rt = make_runtime()
    store = rt.storage.records
    store.live_counts()
    done = Client(runtime=rt).enqueue_many([{"kind": "noop", "target": f"o/r#{i}"} for i in range(30)])
    ids = [e.id for e in done if e.id]
    assert len(ids) == 30 and len(store.claim(ids, "code")) == 30  # one job's batch, all running
    asked: list[str | None] = []

    def dead(client: Any, job: str | None, *, workers: Any = None) -> JobLiveness:
        asked.append(job)
        return JobLiveness("orphaned", "its worker died")

    monkeypatch.setattr(status_module, "job_liveness", dead)
    assert status_module.collect_status(rt).judgements_orphaned == 30  # every judgement of the job
    assert len(asked) == len(set(asked)) == 1
