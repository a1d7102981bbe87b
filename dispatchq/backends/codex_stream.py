"""What one `codex exec --json` run amounted to, read from the JSON Lines it printed (pure).

The events (`codex-rs/exec/src/exec_events.rs`, docs/codex-cli.md): `thread.started`
(`thread_id`), `turn.started`, `item.started|updated|completed` (each with an `item` whose
`type` is `agent_message`, `reasoning`, `command_execution`, `file_change`, `mcp_tool_call`,
`web_search`, `todo_list` or `error`), then `turn.completed` (`usage`) or `turn.failed`
(`error.message`); `error` (`message`) is a fatal stream error. Codex states a usage limit only
in the failure's words, so the words are read by `dispatchq.window.codex_limits`, in the zone of
the host that ran the CLI.

The same `SessionOutcome` as Claude Code's reader: the answer (the last agent message), a limit
(until when, which scope), a throttle, a host-wide failure (the network, a refused credential),
or an error. `result` holds the `turn.completed` event, whose `usage` prices a metered run
(`dispatchq.backends.codex_prices`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any

from dispatchq.window.codex_limits import detect_codex_limit, is_codex_credential_refused, is_codex_transient
from dispatchq.window.limits import (
    SessionOutcome,
    WindowState,
    is_host_wide,
    is_transient,
    normalize_message,
    parse_events,
    resolve_timezone,
)
from dispatchq.window.messages import error_line, require_aware

__all__ = ["TokenUsage", "codex_window_state", "read_codex_outcome", "token_usage"]

#: Items that only come back once the API answered: the window was open for this run.
_ANSWERED_ITEMS = frozenset(
    {"agent_message", "reasoning", "command_execution", "file_change", "mcp_tool_call", "web_search", "plan"}
)
_ITEM_EVENTS = frozenset({"item.started", "item.updated", "item.completed"})
# Codex's own words for a network that is not there (reqwest's connect and DNS errors).
_NO_NETWORK = re.compile(
    r"connection refused|tcp connect error|dns error|failed to lookup address|network is unreachable",
    re.IGNORECASE,
)
# `codex exec resume <id>` for a thread this CODEX_HOME does not hold (`CodexErr::ThreadNotFound`).
_NO_THREAD = re.compile(r"no thread with id|no (?:rollout|session) found", re.IGNORECASE)


@dataclass(frozen=True)
class TokenUsage:
    """A run's tokens as `turn.completed` reported them (the thread's totals)."""

    input_tokens: int
    cached_input_tokens: int
    output_tokens: int


def token_usage(outcome: SessionOutcome) -> TokenUsage | None:
    """The tokens of a completed run; None when it reported none."""
    usage = outcome.result.get("usage") if outcome.result is not None else None
    if not isinstance(usage, Mapping):
        return None
    counts = [usage.get(name) for name in ("input_tokens", "cached_input_tokens", "output_tokens")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        return None
    return TokenUsage(*counts)  # type: ignore[arg-type]  # each checked to be an int above


def _item(event: Mapping[str, Any]) -> Mapping[str, Any] | None:
    item = event.get("item")
    return item if event.get("type") in _ITEM_EVENTS and isinstance(item, Mapping) else None


def _failure_words(event: Mapping[str, Any]) -> str | None:
    """The message of a `turn.failed` or `error` event."""
    if event.get("type") == "turn.failed":
        error = event.get("error")
        message = error.get("message") if isinstance(error, Mapping) else None
    elif event.get("type") == "error":
        message = event.get("message")
    else:
        return None
    return message if isinstance(message, str) and message.strip() else None


def codex_window_state(event: Mapping[str, Any]) -> WindowState | None:
    """What one live event says about the window, for a probe watching a session.

    `open`: the API answered (an item of the model's making, a completed turn). `closed`: a
    failure whose words are a usage limit. None: no evidence (`thread.started`, `turn.started`,
    an `error` item, a failure that is something else).
    """
    item = _item(event)
    if item is not None:
        return "open" if item.get("type") in _ANSWERED_ITEMS else None
    if event.get("type") == "turn.completed":
        return "open"
    words = _failure_words(event)
    if words is not None and re.search(r"hit your usage limit", normalize_message(words), re.IGNORECASE):
        return "closed"
    return None


def read_codex_outcome(
    stdout: str,
    *,
    now: datetime,
    default_tz: str | tzinfo,
    unknown_reset: float,
    returncode: int | None = None,
    stderr: str = "",
) -> SessionOutcome:
    """Classify one `codex exec --json` run (pure: `now` and the host's zone passed in).

    A `turn.completed` with no `turn.failed` after it is an answer, whatever `error` events
    came before (Codex reports the retries it made). Otherwise the failure's words decide, in
    this order: a usage limit, a host-wide failure (no network, a refused credential), a
    throttle, a thread this host no longer holds (`resume_missing`), then an error.
    """
    require_aware(now)
    zone = resolve_timezone(default_tz)
    events = parse_events(stdout)
    thread_id = next(
        (
            e["thread_id"]
            for e in events
            if e.get("type") == "thread.started" and isinstance(e.get("thread_id"), str)
        ),
        None,
    )
    turns = sum(1 for e in events if e.get("type") == "turn.started")
    opened = any(codex_window_state(e) == "open" for e in events)
    last_turn = next(
        (e for e in reversed(events) if e.get("type") in ("turn.completed", "turn.failed")), None
    )
    answer = next(
        (
            str(item.get("text", ""))
            for e in reversed(events)
            if e.get("type") == "item.completed"
            and (item := _item(e))
            and item.get("type") == "agent_message"
        ),
        "",
    )
    common: dict[str, Any] = {
        "session_id": thread_id,
        "num_turns": turns or None,
        "window_opened": opened,
        "result": last_turn,
        "events": (),
    }
    if last_turn is not None and last_turn.get("type") == "turn.completed":
        return SessionOutcome(kind="answer", text=answer, **common)
    words = [w for e in events if (w := _failure_words(e)) is not None]
    text = words[-1] if words else ""
    failed = bool(words) or last_turn is not None or returncode not in (0, None)
    if not failed:
        # Exit 0 and no turn at all: nothing was asked (an empty prompt) or nothing printed.
        return SessionOutcome(kind="error", text=text or "codex printed no turn", is_error=True, **common)
    if not text:
        text = (stdout.strip() if not events else "") or error_line(stderr) or f"codex exited {returncode}"
    every = "\n".join(words) or text
    limit = detect_codex_limit(every, now=now, default_tz=zone, unknown_reset=unknown_reset)
    if limit is not None:
        return SessionOutcome(kind="limit", text=text, is_error=True, limit=limit, limits=(limit,), **common)
    if _NO_NETWORK.search(every) or is_codex_credential_refused(every) or is_host_wide(every):
        return SessionOutcome(kind="host", text=text, is_error=True, **common)
    if is_codex_transient(every) or is_transient(every):
        return SessionOutcome(kind="transient", text=text, is_error=True, **common)
    missing = bool(_NO_THREAD.search(every) or _NO_THREAD.search(stderr))
    return SessionOutcome(kind="error", text=text, is_error=True, resume_missing=missing, **common)
