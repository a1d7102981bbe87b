"""`/metrics`' families from `status`'s data and the store's counters (a pure function)."""

from __future__ import annotations

from typing import Any

from dispatchq.core.status import Status
from dispatchq.serve.metrics import metric_families


def samples(
    data: dict[str, Any], counters: dict[str, Any]
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples for a part of `status`'s document (validated as a `Status`) and its counters."""
    ages = data.pop("oldest_waiting", None)
    status = Status.model_validate({**data, "counters": counters})
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metric_families(status, oldest_waiting=ages)
        for s in family.samples
    }


def test_an_open_window_and_an_empty_store_export_zeroes_not_nothing() -> None:
    got = samples({"judgements": {}, "waiting_by_class": {}}, {})
    assert got[("dispatchq_window_closed", (("scope", "general"),))] == 0
    assert got[("dispatchq_waiting", (("reason_class", "host_blocked"),))] == 0
    assert got[("dispatchq_judgements", (("status", "queued"), ("tier", "session")))] == 0
    assert got[("dispatchq_sessions_spawned_total", ())] == 0


def test_scopes_tiers_classes_and_rows_become_labels() -> None:
    data = {
        "markers": [
            {"scope": "general", "up": True, "lifts_at_epoch": 1800000000.0, "utilization": 0.97},
            {"scope": "model:opus", "up": False, "lifts_at_epoch": 1700000000.0, "utilization": None},
        ],
        "judgements_by_tier": {"session": {"waiting": 7, "queued": 1}, "needs-triage": {}},
        "judgements": {"answered": 40, "failed": 2},
        "waiting_by_class": {"window": 6, "host_blocked": 1},
        "workers": {"code": 2},
        "sessions": {"blocked": {"build-01": "claude: not found"}},
        "scheduler": {"alive": True},
    }
    counters = {
        "answered": {"code": 30, "typed": 9, "session": 1},
        "triage_outcomes": {"shadow_mode": 3, "apply": 1},
        "finished": {"code:answered": 30},
        "sessions_spawned": 5,
    }
    got = samples(data, counters)
    assert got[("dispatchq_window_closed", (("scope", "general"),))] == 1
    assert got[("dispatchq_window_closed", (("scope", "model:opus"),))] == 0
    assert got[("dispatchq_window_utilization", (("scope", "general"),))] == 0.97
    assert ("dispatchq_window_utilization", (("scope", "model:opus"),)) not in got
    assert got[("dispatchq_judgements", (("status", "waiting"), ("tier", "session")))] == 7
    assert got[("dispatchq_judgements", (("status", "answered"), ("tier", "all")))] == 40
    assert got[("dispatchq_waiting", (("reason_class", "window"),))] == 6
    assert got[("dispatchq_host_blocked", (("host", "build-01"),))] == 1
    assert got[("dispatchq_sessions_avoided_total", ())] == 39
    assert got[("dispatchq_triage_outcomes_total", (("row", "shadow_mode"),))] == 3
    assert got[("dispatchq_judgements_finished_total", (("status", "answered"), ("tier", "code")))] == 30
    assert got[("dispatchq_scheduler_alive", ())] == 1


def test_the_new_names_carry_the_same_numbers_and_no_tier_outside_the_table() -> None:
    data = {
        "markers": [{"scope": "general", "up": True, "lifts_at_epoch": 1800000000.0}],
        "judgements_by_tier": {"session": {"waiting": 7}, "needs-triage": {"waiting": 1}},
        "judgements": {"answered": 40, "needs-triage": 3},
        "warnings": [{"id": "scheduler_down", "text": "t", "hint": "h"}],
        "oldest_waiting": {"session": 90.0},
    }
    counters = {
        "triage_outcomes": {"shadow_mode": 3},
        "finished": {"code:answered": 30, "needs-triage:needs-triage": 2},
    }
    got = samples(data, counters)
    assert got[("dispatchq_window_lifts_at_timestamp_seconds", (("scope", "general"),))] == 1800000000.0
    assert got[("dispatchq_window_lifts_at_seconds", (("scope", "general"),))] == 1800000000.0
    assert got[("dispatchq_judgements_unfinished", (("status", "waiting"), ("tier", "session")))] == 7
    assert got[("dispatchq_judgements_by_status", (("status", "needs-triage"),))] == 3
    assert got[("dispatchq_triage_actions_total", (("reason", "shadow_mode"),))] == 3
    assert got[("dispatchq_judgements_finished_untiered_total", (("status", "needs-triage"),))] == 2
    assert got[("dispatchq_warning", (("id", "scheduler_down"),))] == 1
    assert got[("dispatchq_oldest_waiting_age_seconds", (("tier", "session"),))] == 90
    assert got[("dispatchq_oldest_waiting_age_seconds", (("tier", "code"),))] == 0
    assert not [key for key in got if ("tier", "needs-triage") in key[1]]
