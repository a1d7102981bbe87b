"""`/metrics` as a scraper reads it: every family parsed by prometheus_client's own text parser.

On a real Redis with judgements that were enqueued, claimed, answered and left waiting, and a
session duration observed: the names keep the exposition suffixes, `tier` only ever holds a
tier of the table, the replaced names say "deprecated: use X", the histograms are built from
the bucket counters every process adds to, and the oldest waiting age is per tier.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dispatchq.core.tiers import TIERS
from dispatchq.serve.metrics import DEPRECATED, StoreCollector
from dispatchq.storage.histograms import observe_session, oldest_waiting, read_histograms
from dispatchq.storage.store import NewRecord

SUFFIXES = ("_total", "_seconds", "_timestamp_seconds", "_ratio", "_bytes", "_usd", "_info")
#: Gauges of a count of things (a number with no unit) or a 0/1 fact: named for what they count.
UNITLESS = {
    "dispatchq_window_closed",
    "dispatchq_judgements_unfinished",
    "dispatchq_judgements_by_status",
    "dispatchq_waiting",
    "dispatchq_workers",
    "dispatchq_queue_depth",
    "dispatchq_host_blocked",
    "dispatchq_scheduler_alive",
    "dispatchq_warning",
    "dispatchq_credential_open",
    "dispatchq_credential_sessions_running",
    "dispatchq_session_backlog",
}


def _entry(jid: str, tier: str) -> NewRecord:
    fields = {
        "id": jid,
        "content_key": f"ck-{jid}",
        "force": "0",
        "line": "",
        "input": json.dumps({"kind": "k", "target": f"t/{jid}"}),
        "tier": tier,
        "effect": "local",
    }
    return NewRecord(**{name: fields.get(name, "") for name in NewRecord._fields})


def _scrape(rt: Any) -> dict[str, Any]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(lambda: rt))
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}, text  # type: ignore[return-value]


def test_the_families_parse_and_keep_the_naming_rules(
    make_runtime: Any, dq_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    Path(dq_env["DISPATCHQ_CONFIG"]).write_text('kinds:\n  k:\n    session:\n      prompt: "x"\n')
    rt = make_runtime()
    store = rt.storage.records
    store.create_many([_entry(f"j{i}", "code") for i in range(3)])
    claimed = store.claim(["j0", "j1"], "code")
    assert len(claimed) == 2
    time.sleep(0.05)
    for jid in ("j0", "j1"):
        assert store.transition(jid, "answered", fields={"tier": "code", "value": "yes"})
    assert not store.transition("j0", "answered", fields={"tier": "code"})  # refused: not counted again
    pipe = rt.redis.pipeline()
    store.transition("j2", "answered", fields={"tier": "typed", "value": "no"}, pipe=pipe)  # the pipe path
    pipe.execute()
    two_minutes_ago = time.time() - 120
    with monkeypatch.context() as patched:
        patched.setattr("time.time", lambda: two_minutes_ago)
        store.create_many([_entry("old", "session")])  # enqueued two minutes ago
    observe_session(rt.redis, 42.0)
    observe_session(rt.redis, 4000.0)

    hist = read_histograms(rt.redis)
    assert hist["queue_time"]["code"].buckets[-1] == ("+Inf", 2.0)
    assert hist["queue_time"]["typed"].buckets[-1] == ("+Inf", 1.0)
    assert oldest_waiting(rt.redis)["session"] >= 119

    families, text = _scrape(rt)
    exposed = {name for name in families}

    # The suffixes: a counter ends _total, a histogram or age _seconds, an instant _timestamp_seconds.
    for family in families.values():
        name = family.name
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), name
        elif family.type == "info":
            assert all(s.name.endswith("_info") for s in family.samples), name
        elif name in DEPRECATED or name + "_total" in DEPRECATED:
            continue
        elif name not in UNITLESS:
            assert name.endswith(SUFFIXES), f"{name} has no unit suffix"
        if "lifts_at" in name or "resets_at" in name or "expires_at" in name or "reported_at" in name:
            assert name.endswith("_timestamp_seconds") or name in DEPRECATED, name
        assert not name.endswith("_utilization"), name

    # `tier` values come only from the table, outside the deprecated duplicates.
    for family in families.values():
        deprecated = (family.documentation or "").startswith("deprecated: use ")
        for sample in family.samples:
            if "tier" in sample.labels and not deprecated:
                assert sample.labels["tier"] in TIERS, (family.name, sample.labels)
            assert "row" not in sample.labels or deprecated, family.name

    # The replaced names stay, said to be deprecated, naming what to use.
    for old, new in DEPRECATED.items():
        base = old.removesuffix("_total")
        assert base in exposed, old
        assert families[base].documentation == f"deprecated: use {new}"
    assert "dispatchq_window_lifts_at_timestamp_seconds" in exposed
    assert "dispatchq_window_utilization_ratio" in exposed
    # The pool without a `credentials:` section: the environment's one, `default`, open.
    opened = {s.labels["credential"]: s.value for s in families["dispatchq_credential_open"].samples}
    assert opened == {"default": 1.0}
    for name in (
        "dispatchq_session_backlog",
        "dispatchq_session_drain_seconds",
        "dispatchq_credential_spend_usd",
    ):
        assert name in exposed, name

    (build,) = families["dispatchq_build_info"].samples  # the text format has no info type: a gauge
    assert build.name == "dispatchq_build_info" and build.labels["version"] and build.value == 1

    queue_time = families["dispatchq_queue_time_seconds"]
    assert queue_time.type == "histogram"
    counts = {s.labels["tier"]: s.value for s in queue_time.samples if s.name.endswith("_count")}
    assert counts == {"code": 2.0, "typed": 1.0}
    session = families["dispatchq_session_duration_seconds"]
    inf = [s for s in session.samples if s.labels.get("le") == "+Inf"]
    assert [s.value for s in inf] == [2.0]
    assert [s.value for s in session.samples if s.name.endswith("_sum")] == [4042.0]
    le_3600 = [s for s in session.samples if s.labels.get("le") == "3600.0"]
    assert [s.value for s in le_3600] == [1.0]

    ages = {s.labels["tier"]: s.value for s in families["dispatchq_oldest_waiting_age_seconds"].samples}
    assert set(ages) == set(TIERS) and ages["session"] >= 119 and ages["code"] == 0

    by_status = {s.labels["status"]: s.value for s in families["dispatchq_judgements_by_status"].samples}
    assert by_status["answered"] == 3 and by_status["queued"] == 1
    finished = {
        (s.labels["tier"], s.labels["status"]): s.value
        for s in families["dispatchq_judgements_finished"].samples
        if s.name.endswith("_total")
    }
    assert finished[("code", "answered")] == 2
    warnings = {s.labels["id"] for s in families["dispatchq_warning"].samples}
    assert "scheduler_down" in warnings  # no scheduler runs in this test
    assert "dispatchq_warning{" in text
