#!/usr/bin/env python3
"""A stand-in for `codex exec --json`, printing the JSON Lines the real CLI prints.

Standard library only. It refuses an argv that is not `exec … --json … -` (exit 2), reads the
prompt from stdin, and says which credential it was given: `CODEX_API_KEY`, or the `account`
of the `auth.json` in its `CODEX_HOME`. Driven by the same plan file and spawn log as
`fake_claude.py` (`FAKE_CLAUDE_PLAN`, `FAKE_CLAUDE_SPAWN_LOG`: the names the test sessions'
allowlist lets through); a step with `"credential"` is taken only by a spawn that saw it.

Step keys: `scenario` answer (default) | limit (`You've hit your usage limit. Try again at …`,
the reset `resets_at` (epoch seconds) printed in UTC as Codex prints its host's local time:
the tests' host zone is UTC) | limit_later (`… Try again later.`) | error; `answer`, `message`;
`renew` (`{"tokens": {...}, "last_refresh"}`): the login in `CODEX_HOME` rewritten first, as a
token refresh does.
`fake_codex.py app-server` answers `account/rateLimits/read` (see `app_server`).
Each spawn appends one JSON line to `FAKE_CODEX_RECORD` (a path in the step or the environment)
with its argv, prompt, environment names and the files in its `CODEX_HOME`.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime


def emit(event: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def seen_credential() -> str:
    key = os.environ.get("CODEX_API_KEY")  # what `codex exec` reads a key from (not OPENAI_API_KEY)
    if key:
        return key
    home = os.environ.get("CODEX_HOME", "")
    try:
        with open(os.path.join(home, "auth.json"), encoding="utf-8") as handle:
            return "auth:" + str(json.load(handle).get("account", "?"))
    except (OSError, ValueError):
        return ""


def take_step(prompt: str) -> dict:
    path = os.environ.get("FAKE_CLAUDE_PLAN")
    if not path:
        return {}
    with open(path, "r+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            steps = json.load(handle)
        except ValueError:
            steps = []
        seen = seen_credential()
        index = next((i for i, s in enumerate(steps) if s.get("credential") in (None, seen)), None)
        step = steps.pop(index) if index is not None else {}
        handle.seek(0)
        handle.truncate()
        json.dump(steps, handle)
    return step


def retry_clause(resets_at: float) -> str:
    """Codex's words: the time alone on the same (host-local, here UTC) date, else the date too."""
    at, now = datetime.fromtimestamp(resets_at, UTC), datetime.now(UTC)
    if at.date() == now.date():
        return at.strftime("%-I:%M %p")
    day = at.day
    suffix = "th" if 11 <= day <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return at.strftime(f"%b %-d{suffix}, %Y %-I:%M %p")


def app_server() -> int:
    """`codex app-server` on stdio: answers `initialize` and `account/rateLimits/read`.

    The reading is the JSON file `FAKE_CLAUDE_RATE_LIMITS` names (a reply's `result`); without
    one the read is refused, as an API-key login's is. Each read is logged to
    `FAKE_CLAUDE_APPSERVER_LOG` with the credential the process saw.
    """
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        method, ident = message.get("method"), message.get("id")
        if method == "initialize":
            emit({"id": ident, "result": {"userAgent": "fake", "codexHome": os.environ.get("CODEX_HOME")}})
            emit({"method": "remoteControl/status/changed", "params": {"status": "disabled"}})
        elif method == "account/rateLimits/read":
            log = os.environ.get("FAKE_CLAUDE_APPSERVER_LOG")
            if log:
                with open(log, "a", encoding="utf-8") as handle:
                    handle.write(f"{os.getpid()} rateLimits {seen_credential() or '-'}\n")
            source = os.environ.get("FAKE_CLAUDE_RATE_LIMITS")
            try:
                with open(source or "", encoding="utf-8") as handle:
                    emit({"id": ident, "result": json.load(handle)})
            except (OSError, ValueError):
                emit({"id": ident, "error": {"code": -32600, "message": "chatgpt authentication required"}})
    return 0


def renew(fields: dict) -> None:
    """What Codex does when it refreshes a plan's access token: rewrite `auth.json` in its
    `CODEX_HOME`, here with the step's `tokens` and `last_refresh` over what it was given."""
    path = os.path.join(os.environ.get("CODEX_HOME", ""), "auth.json")
    with open(path, encoding="utf-8") as handle:
        login = json.load(handle)
    login.setdefault("tokens", {}).update(fields.get("tokens", {}))
    login["last_refresh"] = fields.get("last_refresh", datetime.now(UTC).isoformat())
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(login, handle)


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["app-server"]:
        return app_server()
    if "exec" not in argv or "--json" not in argv or argv[-1] != "-":
        sys.stderr.write(f"fake codex: not an exec --json run with the prompt on stdin: {argv}\n")
        return 2
    prompt = sys.stdin.read()
    step = take_step(prompt)
    scenario = str(step.get("scenario", "answer"))
    spawn_log = os.environ.get("FAKE_CLAUDE_SPAWN_LOG")
    if spawn_log:
        with open(spawn_log, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} codex-{scenario} {seen_credential() or '-'}\n")
    record = step.get("record") or os.environ.get("FAKE_CODEX_RECORD")
    if record:
        home = os.environ.get("CODEX_HOME", "")
        with open(record, "a", encoding="utf-8") as handle:
            entry = {
                "argv": argv,
                "prompt": prompt,
                "env": sorted(os.environ),
                "codex_home": home,
                "files": sorted(os.listdir(home)) if home and os.path.isdir(home) else [],
            }
            handle.write(json.dumps(entry) + "\n")
    if "renew" in step:
        renew(step["renew"])
    thread = str(uuid.uuid4())
    emit({"type": "thread.started", "thread_id": thread})
    emit({"type": "turn.started"})
    if scenario == "answer":
        emit({"type": "item.completed", "item": {"id": "item_0", "type": "reasoning", "text": "**Reading**"}})
        text = str(step.get("answer", "ok"))
        emit({"type": "item.completed", "item": {"id": "item_1", "type": "agent_message", "text": text}})
        usage = {"input_tokens": 2100, "cached_input_tokens": 1800, "output_tokens": 40}
        emit({"type": "turn.completed", "usage": usage})
        return 0
    if scenario == "limit":
        resets = float(step.get("resets_at", time.time() + 3600))
        message = f"You've hit your usage limit. Try again at {retry_clause(resets)}."
    elif scenario == "limit_later":
        message = "You've hit your usage limit. Try again later."
    else:
        message = str(step.get("message", "Codex ran out of room in the model's context window."))
    emit({"type": "error", "message": message})
    emit({"type": "turn.failed", "error": {"message": message}})
    return 1


if __name__ == "__main__":
    sys.exit(main())
