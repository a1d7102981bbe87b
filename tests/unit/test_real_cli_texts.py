"""What the real Claude Code CLI (2.1.197) printed, read the way dispatchq must read it.

Every text here was printed by the real CLI against the stand-in API
(`tests/fakes/anthropic_api.py`) or is quoted in issue 12; `tests/unit/test_limits.py` keeps
the older forms. Pure and clock-free: `now` is always given.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dispatchq.window.limits import read_outcome
from dispatchq.window.messages import error_line

NOW = datetime(2026, 12, 1, 7, 16, tzinfo=UTC)
UNKNOWN = 900.0

BUN_STDERR = (
    '472 | `),process.exit(1)}function a7r(){return!1}function NFd(e){return!1}var LBt="X";\n'
    "473 | var hRn,c7r;var u7r=E(()=>{Kr();hRn=ve(()=>H.object({restrictions:H.record(H.string())}))});\n"
    "                                                                                        ^\n"
    "error: bubblewrap is required for subprocess env scrubbing and isolation. Install with: sudo "
    "apt-get install -y bubblewrap, set sandbox.bwrapPath in managed settings, or set "
    "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB=0 to disable (loses subprocess isolation).\n"
    "      at M7r (/$bunfs/root/src/entrypoints/cli.js:477:6115)\n"
    "      at <anonymous> (/$bunfs/root/src/entrypoints/cli.js:11379:4615)\n"
    "      at n (/$bunfs/root/src/entrypoints/cli.js:12:20060)\n"
    "\n"
    "Bun v1.4.0 (Linux x64 baseline)\n"
)


def test_the_reason_is_the_error_line_not_source_frames_or_banner() -> None:
    line = error_line(BUN_STDERR)
    assert line.startswith("error: bubblewrap is required for subprocess env scrubbing")
    assert line.endswith("(loses subprocess isolation).")


@pytest.mark.parametrize(
    ("stderr", "line"),
    [
        (
            "No conversation found with session ID: 1234-abcd\n",
            "No conversation found with session ID: 1234-abcd",
        ),
        (
            "warning: something\nError: Invalid API key · Please run /login\n",
            "Error: Invalid API key · Please run /login",
        ),
        ("plain words only\n", "plain words only"),
        ("      at x (/a.js:1:2)\nBun v1.4.0 (Linux x64 baseline)\n", ""),
    ],
)
def test_error_line_forms(stderr: str, line: str) -> None:
    assert error_line(stderr) == line


def test_error_line_is_capped() -> None:
    assert len(error_line("error: " + "word " * 400)) <= 400


def _stream(*events: dict[str, Any]) -> str:
    return "\n".join(json.dumps(e) for e in events)


def _result(
    text: str, *, is_error: bool, status: int | None, turns: int = 1, cost: float = 0.0
) -> dict[str, Any]:
    return {
        "type": "result",
        "subtype": "success",
        "is_error": is_error,
        "api_error_status": status,
        "num_turns": turns,
        "result": text,
        "session_id": "s-1",
        "total_cost_usd": cost,
        "terminal_reason": "completed",
    }


def _event(**info: Any) -> dict[str, Any]:
    return {"type": "rate_limit_event", "rate_limit_info": info, "session_id": "s-1"}


def outcome(stdout: str, now: datetime = NOW, **kwargs: Any) -> Any:
    return read_outcome(stdout, now=now, default_tz="UTC", unknown_reset=UNKNOWN, **kwargs)


def test_a_failed_start_reads_its_error_line_from_stderr() -> None:
    got = outcome("", returncode=1, stderr=BUN_STDERR)
    assert got.kind == "error"
    assert got.text.startswith("error: bubblewrap is required")


def test_a_subscriber_429_not_your_usage_limit_is_transient_despite_the_rejected_event() -> None:
    text = "API Error: Server is temporarily limiting requests (not your usage limit) · Rate limited"
    got = outcome(
        _stream(_event(status="rejected", isUsingOverage=False), _result(text, is_error=True, status=429))
    )
    assert got.kind == "transient"
    assert got.limit is None


def test_a_completed_answer_billed_as_extra_usage_is_an_answer() -> None:
    resets = int((NOW + timedelta(hours=2)).timestamp())
    event = _event(
        status="rejected",
        resetsAt=resets,
        rateLimitType="five_hour",
        overageStatus="allowed",
        isUsingOverage=True,
    )
    got = outcome(_stream(event, _result("4", is_error=False, status=None, cost=0.00005)))
    assert got.kind == "answer"
    assert got.text == "4"


def test_the_real_session_limit_is_a_limit_at_its_resets_at() -> None:
    resets = int((NOW + timedelta(minutes=30)).timestamp())
    event = _event(
        status="rejected",
        resetsAt=resets,
        rateLimitType="five_hour",
        overageStatus="rejected",
        overageDisabledReason="org_level_disabled",
        isUsingOverage=False,
    )
    got = outcome(
        _stream(
            event, _result("You've hit your session limit · resets 7:46am (UTC)", is_error=True, status=429)
        )
    )
    assert got.kind == "limit"
    assert got.limit is not None and got.limit.lifts_at.timestamp() == resets
    assert got.limit.kind == "five_hour" and got.refused_at_spawn
