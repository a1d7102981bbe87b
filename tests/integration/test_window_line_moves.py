"""A window closing or opening moves its whole line at once, and only what it holds back.

The line moves in chunks of one script call (`Store.transition_many`), reading each judgement's
kind and reason, never its record whole: what makes a weekly limit over a backlog of a million
take under a minute. These pin which judgements move, across a chunk's edge.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dispatchq.client import Client
from dispatchq.window.limits import GENERAL_SCOPE
from dispatchq.window.messages import LimitSignal

CONFIG = """kinds:
  ask:
    session:
      prompt: "Answer {{ target }}"
  opus:
    session:
      prompt: "Answer {{ target }}"
      model: claude-opus-4
  sonnet:
    session:
      prompt: "Answer {{ target }}"
      model: claude-sonnet-4
"""


def _line(
    make_runtime: Any, dq_env: dict[str, str], kinds: dict[str, int]
) -> tuple[Any, dict[str, list[str]]]:
    Path(dq_env["DISPATCHQ_CONFIG"]).write_text(CONFIG)
    rt = make_runtime()
    client = Client(runtime=rt)
    made: dict[str, list[str]] = {}
    for kind, n in kinds.items():
        done = client.enqueue_many([{"kind": kind, "target": f"acme/app#{i}"} for i in range(n)])
        made[kind] = [d.id for d in done]
    return rt, made


def _statuses(rt: Any, ids: list[str]) -> set[str | None]:
    return set(rt.storage.records.statuses(ids))


def test_a_close_and_an_open_move_every_judgement_of_a_line_longer_than_a_chunk(
    make_runtime: Any, dq_env: dict[str, str]
) -> None:
    rt, made = _line(make_runtime, dq_env, {"ask": 1_201})
    ids = made["ask"]
    rt.window.close(datetime.now(UTC) + timedelta(hours=5), reason="test: closed")
    assert _statuses(rt, ids) == {"waiting"}
    reasons = {r for (r,) in rt.storage.records.fields_of(ids, "reason")}
    assert len(reasons) == 1 and next(iter(reasons), "").startswith("usage window closed until")
    counts = rt.storage.records.live_counts()
    assert counts.by_tier["session"]["waiting"] == len(ids) and counts.waiting.get("window") == len(ids)

    rt.window.open(who="test")
    assert _statuses(rt, ids) == {"queued"}
    assert {r for (r,) in rt.storage.records.fields_of(ids, "reason")} == {None}


def test_an_open_leaves_a_judgement_waiting_for_another_reason(
    make_runtime: Any, dq_env: dict[str, str]
) -> None:
    rt, made = _line(make_runtime, dq_env, {"ask": 3})
    first, *rest = made["ask"]
    rt.window.close(datetime.now(UTC) + timedelta(hours=5), reason="test: closed")
    rt.storage.records.set_fields(first, reason="host build-01 is blocked: no session command")
    rt.window.open(who="test")
    assert rt.storage.records.statuses([first]) == ["waiting"]
    assert _statuses(rt, rest) == {"queued"}


def test_a_models_own_limit_holds_back_its_model_and_the_default_but_not_another(
    make_runtime: Any, dq_env: dict[str, str]
) -> None:
    rt, made = _line(make_runtime, dq_env, {"opus": 2, "ask": 2, "sonnet": 2})
    lifts = datetime.now(UTC) + timedelta(hours=5)
    rt.window.raise_marker(
        LimitSignal(lifts_at=lifts, kind="seven_day_opus", scope="model:opus", message="opus limit"),
        session=None,
    )
    assert _statuses(rt, made["opus"] + made["ask"]) == {"waiting"}
    assert _statuses(rt, made["sonnet"]) == {"queued"}
    rt.window.raise_marker(
        LimitSignal(lifts_at=lifts, kind="five_hour", scope=GENERAL_SCOPE, message="limit"), session=None
    )
    assert _statuses(rt, made["sonnet"]) == {"waiting"}
