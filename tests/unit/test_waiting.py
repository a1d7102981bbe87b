"""Waiting reasons are free text; the classes `status` and `/metrics` count them by are not."""

from __future__ import annotations

import pytest

from dispatchq.core.waiting import reason_class

WINDOW = "usage window closed until 2030-01-01 00:00 UTC (five_hour)"


@pytest.mark.parametrize(
    ("reason", "cls"),
    [
        (WINDOW, "window"),
        ("You've hit your limit · resets 3pm", "window"),
        ("transient throttle, retrying after 10:00:00 UTC: overloaded", "retry"),
        ("all 2 session slot(s) busy", "slot"),
        ("findings dispatch lock held by build-01", "lock"),
        ("host build-01 blocked: claude not found", "host_blocked"),
        ("", "other"),
        (None, "other"),
        ("something else", "other"),
    ],
)
def test_reason_classes(reason: str | None, cls: str) -> None:
    assert reason_class(reason) == cls
