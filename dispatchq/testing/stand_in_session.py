"""A stand-in for `claude -p --output-format stream-json --verbose`: a test double for the demo.

It starts no model and never spends a usage window: it prints the events a real headless
session prints. Its first run reports a usage limit that lifts a few seconds later (a
`rate_limit_event` with `status: rejected` and the CLI's own limit wording); every later
run answers. The demo uses it so that `python3 ops/dev.py demo` shows the marker, the
countdown, zero spawns while the window is closed, the probe and the drain.

    python -m dispatchq.testing.stand_in_session --state FILE [--lift-after SECONDS] [claude's flags...]

Standard library only (it imports nothing of dispatchq, so it also runs by path under any
python3); the prompt arrives on stdin, as it does for the real CLI.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from datetime import UTC, datetime

__all__ = ["emit", "main"]


def emit(event: dict[str, object]) -> None:
    """One event per line, flushed at once: the worker reads the stream as it comes."""
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> int:
    """The first run (counted in the --state file) hits a limit; every later one answers."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--state", required=True)
    parser.add_argument("--lift-after", type=float, default=6.0)
    known, _claude_flags = parser.parse_known_args()
    prompt = sys.stdin.read()
    try:
        with open(known.state) as handle:
            state = json.load(handle)
    except (OSError, ValueError):
        state = {"runs": 0}
    state["runs"] += 1
    with open(known.state, "w") as handle:
        json.dump(state, handle)

    session_id = str(uuid.uuid4())
    emit({"type": "system", "subtype": "init", "session_id": session_id, "model": "stand-in"})
    if state["runs"] == 1:
        resets = int(time.time() + known.lift_after)
        clock = datetime.fromtimestamp(resets, UTC).strftime("%-I:%M%p").lower()
        message = f"You've hit your limit · resets {clock} (UTC)"
        emit(
            {
                "type": "rate_limit_event",
                "rate_limit_info": {"status": "rejected", "resetsAt": resets, "rateLimitType": "five_hour"},
                "session_id": session_id,
            }
        )
        emit(
            {
                "type": "result",
                "subtype": "success",
                "is_error": True,
                "result": message,
                "api_error_status": 429,
                "num_turns": 1,
                "session_id": session_id,
            }
        )
        return 1
    if "Answer with JSON" in prompt:
        answer = json.dumps(
            {"actionable": "rename" in prompt or "Please" in prompt, "why": "stand-in answer"}
        )
    else:
        answer = "The stand-in session read the failure and answered (no model was run)."
    emit({"type": "rate_limit_event", "rate_limit_info": {"status": "allowed"}, "session_id": session_id})
    emit(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": answer,
            "num_turns": 1,
            "session_id": session_id,
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
