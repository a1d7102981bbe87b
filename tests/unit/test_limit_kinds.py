"""The kinds of limit are one closed list (`LimitKind`), and the model names one tuple (`MODELS`).

A kind the readers produce that the Literal lacks would be a marker whose `kind` the type
says cannot exist; a model added to one reader and not the other would be a limit read from
the event but not from the message (or the reverse). Both are checked against what the
readers actually produce, not against a copy of the list.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import get_args

import pytest

from dispatchq.window import limits, marker, messages
from dispatchq.window.limits import LimitKind, limit_from_event, reserve_signals
from dispatchq.window.messages import MODELS, detect_limit, limit_kind

NOW = datetime(2025, 10, 20, 15, 30, tzinfo=UTC)
KINDS = frozenset(get_args(LimitKind))
RESETS = int((NOW + timedelta(hours=2)).timestamp())
# Every `rateLimitType` Claude Code documents (see dispatchq.window.limits), and the one it
# has been seen to print besides.
CLI_RATE_TYPES = (
    "five_hour",
    "seven_day",
    "seven_day_opus",
    "seven_day_sonnet",
    "overage",
    "seven_day_overage_included",
)


def _rejected(rate_type: object) -> dict[str, object]:
    info = {"status": "rejected", "resetsAt": RESETS, "rateLimitType": rate_type, "isUsingOverage": False}
    return {"type": "rate_limit_event", "rate_limit_info": info}


def test_every_kind_a_message_head_names_is_a_limit_kind() -> None:
    head_kinds = {kind for _, kind in messages._HEADS}
    assert head_kinds - {"model", "model_credits"} <= KINDS  # those two take the model from the words
    assert "model" in head_kinds  # the one placeholder, resolved per model below


@pytest.mark.parametrize("model", MODELS)
def test_a_models_own_limit_is_a_limit_kind_from_the_message_and_the_event(model: str) -> None:
    assert f"seven_day_{model}" in KINDS
    for text in (
        f"You've hit your {model.title()} weekly limit · resets 8pm",
        f"You've hit your {model} 5 limit",
    ):
        signal = detect_limit(text, now=NOW, default_tz="UTC", unknown_reset=60)
        assert signal is not None and (signal.kind, signal.scope) == (f"seven_day_{model}", f"model:{model}")
    event = limit_from_event(_rejected(f"seven_day_{model}"), now=NOW, unknown_reset=60)
    assert event is not None and (event.kind, event.scope) == (f"seven_day_{model}", f"model:{model}")


@pytest.mark.parametrize(
    "rate_type", [*CLI_RATE_TYPES, "ten_minute", "seven_day_mythos", 7, None, "BAD TYPE"]
)
def test_every_kind_an_event_produces_is_a_limit_kind(rate_type: object) -> None:
    signal = limit_from_event(_rejected(rate_type), now=NOW, unknown_reset=60)
    assert signal is not None and signal.kind in KINDS
    if rate_type in CLI_RATE_TYPES:
        assert signal.kind == ("credits" if rate_type == "overage" else rate_type)


def test_a_model_no_list_knows_keeps_its_scope_and_reads_as_a_weekly_limit() -> None:
    signal = detect_limit(
        "You've hit your Mythos weekly limit · resets 8pm", now=NOW, default_tz="UTC", unknown_reset=60
    )
    assert signal is not None and (signal.kind, signal.scope) == ("seven_day", "model:mythos")


def test_the_reserve_and_an_operator_close_are_limit_kinds() -> None:
    event = _rejected("five_hour")
    event["rate_limit_info"] = {"status": "allowed_warning", "resetsAt": RESETS, "utilization": 0.95}
    ((signal, _),) = reserve_signals([event], reserve=0.1, now=NOW)
    assert signal.kind == "reserved"
    assert "reserved" in KINDS
    assert "operator" in KINDS  # Window.close's kind (it needs Redis to run)


def test_a_stored_marker_of_an_unknown_kind_reads_as_unknown() -> None:
    fields = {"lifts_at": "1.0", "kind": "seven_day_mythos"}
    read = marker.marker_from_fields("general", fields)
    assert read is not None and read.kind == "unknown"
    assert limit_kind("five_hour") == "five_hour" and limit_kind("nonsense", "seven_day") == "seven_day"


def test_the_model_list_is_defined_once_and_both_readers_derive_from_it() -> None:
    assert frozenset(MODELS) == limits._EVENT_MODELS
    assert {m for m in MODELS if re.fullmatch(messages._KNOWN_MODELS, m)} == set(MODELS)
    assert not re.fullmatch(messages._KNOWN_MODELS, "claude")
