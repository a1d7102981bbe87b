#!/usr/bin/env python3
"""A stand-in for `claude -p`, printing the envelopes the real CLI prints.

Dependency-free (standard library only) so it runs under any python3, also as an
unprivileged user. Driven by `FAKE_CLAUDE_*` environment variables (neutral names: the
session scrub drops `DISPATCHQ_*` and anything secret-shaped), by its argv
(`--output-format text|json|stream-json`, `--verbose`, `--resume ID`) and by an optional plan
file for multi-spawn scenarios.

Behaviour (env var, or the same key in lower case without the prefix in a plan step):

FAKE_CLAUDE_SCENARIO   answer (default) | limit (text only, as older versions) |
                       limit_event (rejected rate_limit_event + text) | limit_mid_run |
                       transient | error | hang
FAKE_CLAUDE_ANSWER     the answer text (default "ok")
FAKE_CLAUDE_MESSAGE    the limit / transient / error text
FAKE_CLAUDE_RESETS_AT  epoch seconds for rate_limit_event.resetsAt (default now + 1h)
FAKE_CLAUDE_RATE_LIMIT_TYPE  five_hour (default), seven_day, seven_day_opus, overage, ...
FAKE_CLAUDE_API_STATUS api_error_status of a failed result (429 limit, 529 transient)
FAKE_CLAUDE_SESSION_ID the session id (default a fresh uuid4; `--resume ID` wins)
FAKE_CLAUDE_NUM_TURNS / FAKE_CLAUDE_COST   result.num_turns / result.total_cost_usd
FAKE_CLAUDE_SLEEP      seconds to sleep after the first events, before the result
FAKE_CLAUDE_WAIT_FOR   a path: after init + rate_limit_event, wait (up to
                       FAKE_CLAUDE_WAIT_TIMEOUT, default 30 s) for it to exist; the record
                       says whether it appeared ("released")
FAKE_CLAUDE_GRANDCHILD 1: start a sleeping grandchild (its pid is recorded)
FAKE_CLAUDE_IGNORE_TERM 1: ignore SIGTERM (so only SIGKILL stops it)
FAKE_CLAUDE_RECORD     a path: JSON {argv, stdin, cwd, cwd_entries, pid, ppid, pgid, grandchild,
                       released, finished, output_format}; written once before sleeping and again at the end
FAKE_CLAUDE_ENV_DUMP   a path: JSON of the environment it was started with
                       (from /proc/self/environ, so Python's own locale fix-ups do not show)
FAKE_CLAUDE_READ_ENVIRON  comma-separated pids, or `ppid` / `gppid`: try to read each
                       /proc/<pid>/environ; results go to FAKE_CLAUDE_ENVIRON_REPORT as JSON
                       {pid: {"ok": bool, "environ": {...}} | {"ok": false, "error": "..."}}
FAKE_CLAUDE_SPAWN_LOG  a path: one line appended per spawn (pid and scenario)
FAKE_CLAUDE_PROMPT_LOG a path: one JSON line appended per spawn, {"argv": [...], "stdin": prompt}
FAKE_CLAUDE_PLAN       a JSON file holding a list of step objects; each spawn takes the first
                       step (under a lock) and it overrides the variables above. A step with
                       "match" (a string, or a list of strings that must all occur) is taken only
                       by a spawn whose prompt contains it: the first step that fits is taken
FAKE_CLAUDE_EDITS      JSON list of edits applied in the cwd before the result (a fixer that
                       "edits files as told"): {"path": P, "write": TEXT} | {"path": P,
                       "replace": [OLD, NEW]} | {"path": P, "append": TEXT} | {"path": P,
                       "delete": true}; in a plan step, "edits" holds the list itself
FAKE_CLAUDE_EXIT       force the exit code
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import uuid

PREFIX = "FAKE_CLAUDE_"
MODEL = "claude-sonnet-4-5-20250929"
DEFAULT_MESSAGES = {
    "limit": "You've hit your session limit · resets 4:50pm (America/Denver)",
    "limit_event": "You've hit your session limit · resets 4:50pm (America/Denver)",
    "limit_mid_run": "You've hit your session limit · resets 4:50pm (America/Denver)",
    "transient": (
        "API Error: 529 Overloaded. This is a server-side issue, usually temporary — try again in a moment."
    ),
    "error": "Error: tool execution failed",
}


def seen_credential() -> str:
    """The credential this session was given (a pool test's steps can be meant for one)."""
    return os.environ.get("CLAUDE_CODE_OAUTH_TOKEN") or os.environ.get("ANTHROPIC_API_KEY") or ""


def fits(step: dict, prompt: str) -> bool:
    credential = step.get("credential")
    if credential is not None and credential != seen_credential():
        return False
    match = step.get("match")
    if match is None:
        return True
    wanted = [match] if isinstance(match, str) else list(match)
    return all(str(w) in prompt for w in wanted)


def take_plan_step(prompt: str = "") -> dict:
    path = os.environ.get(PREFIX + "PLAN")
    if not path:
        return {}
    with open(path, "r+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            steps = json.load(handle)
        except ValueError:
            steps = []
        index = next((i for i, step in enumerate(steps) if fits(step, prompt)), None)
        step = steps.pop(index) if index is not None else {}
        handle.seek(0)
        handle.truncate()
        json.dump(steps, handle)
    return step


# The prompt arrives on stdin, closed by the launcher; read first so a step can match it.
PROMPT = sys.stdin.read() if __name__ == "__main__" else ""
STEP = take_plan_step(PROMPT)


def setting(name: str, default: str | None = None) -> str | None:
    key = name.lower()
    if key in STEP:
        value = STEP[key]
        return value if isinstance(value, str) or value is None else json.dumps(value)
    return os.environ.get(PREFIX + name, default)


def parse_argv(argv: list[str]) -> dict:
    opts = {"format": "text", "verbose": False, "resume": None}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--output-format" and i + 1 < len(argv):
            opts["format"] = argv[i + 1]
            i += 1
        elif arg.startswith("--output-format="):
            opts["format"] = arg.split("=", 1)[1]
        elif arg == "--verbose":
            opts["verbose"] = True
        elif arg in ("--resume", "-r") and i + 1 < len(argv):
            opts["resume"] = argv[i + 1]
            i += 1
        i += 1
    return opts


def startup_environ() -> dict:
    try:
        with open("/proc/self/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return dict(os.environ)
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            key, value = item.split(b"=", 1)
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def read_environs(spec: str) -> dict:
    report = {}
    for token in (t.strip() for t in spec.split(",")):
        if not token:
            continue
        if token == "ppid":
            pid = os.getppid()
        elif token == "gppid":
            pid = parent_of(os.getppid())
        else:
            pid = int(token)
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                raw = handle.read()
            environ = {}
            for item in raw.split(b"\0"):
                if b"=" in item:
                    key, value = item.split(b"=", 1)
                    environ[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
            report[str(pid)] = {"ok": True, "environ": environ}
        except OSError as exc:
            report[str(pid)] = {"ok": False, "error": exc.strerror or type(exc).__name__}
    return report


def parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def write_json(path: str, data: object) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


def emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> int:
    argv = sys.argv[1:]
    opts = parse_argv(argv)
    fmt = opts["format"]
    scenario = setting("SCENARIO", "answer") or "answer"
    session_id = opts["resume"] or setting("SESSION_ID") or str(uuid.uuid4())
    prompt = PROMPT

    if setting("IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spawn_log = setting("SPAWN_LOG")
    if spawn_log:
        with open(spawn_log, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {scenario} {seen_credential() or '-'}\n")
    prompt_log = setting("PROMPT_LOG")
    if prompt_log:
        with open(prompt_log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"argv": sys.argv, "stdin": prompt}) + "\n")
    if setting("ENV_DUMP"):
        write_json(setting("ENV_DUMP"), startup_environ())
    if setting("READ_ENVIRON") and setting("ENVIRON_REPORT"):
        write_json(setting("ENVIRON_REPORT"), read_environs(setting("READ_ENVIRON")))
    grandchild = None
    if setting("GRANDCHILD") == "1":
        grandchild = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(3600)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ).pid
    record = {
        "argv": sys.argv,
        "stdin": prompt,
        "cwd": os.getcwd(),
        "cwd_entries": sorted(os.listdir(".")),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "grandchild": grandchild,
        "output_format": fmt,
        "released": None,
        "finished": False,
    }
    if setting("RECORD"):
        write_json(setting("RECORD"), record)

    now = time.time()
    # RESETS_IN counts from the session's own start, so a test on a loaded machine cannot
    # see its reset pass before the session even ran.
    resets_in = setting("RESETS_IN")
    resets_at = int(float(setting("RESETS_AT") or (now + float(resets_in) if resets_in else now + 3600)))
    rate_type = setting("RATE_LIMIT_TYPE", "five_hour")
    events: list[dict] = []

    def out(event: dict) -> None:
        events.append(event)
        if fmt == "stream-json":
            emit(event)

    out(
        {
            "type": "system",
            "subtype": "init",
            "cwd": os.getcwd(),
            "session_id": session_id,
            "tools": ["Bash", "Edit", "Read"],
            "mcp_servers": [],
            "model": MODEL,
            "permissionMode": "default",
            "slash_commands": [],
            "apiKeySource": "none",
            "claude_code_version": "2.1.0",
            "output_style": "default",
            "uuid": str(uuid.uuid4()),
        }
    )
    rejected = scenario in ("limit_event", "limit_mid_run")
    if scenario == "limit_mid_run":
        out(rate_limit_event(session_id, "allowed", resets_at, rate_type))
        out(assistant(session_id, MODEL, "Working on it.", None))
    if scenario != "limit":  # the text-only limit stands for versions that printed no such event
        out(rate_limit_event(session_id, "rejected" if rejected else "allowed", resets_at, rate_type))

    apply_edits(setting("EDITS"))
    wait_for = setting("WAIT_FOR")
    if wait_for:
        limit = time.monotonic() + float(setting("WAIT_TIMEOUT", "30") or 30)
        while not os.path.exists(wait_for) and time.monotonic() < limit:
            time.sleep(0.02)
        record["released"] = os.path.exists(wait_for)
    sleep = float(setting("SLEEP", "0") or 0)
    if scenario == "hang":
        sleep = sleep or 3600
    if sleep:
        time.sleep(sleep)

    message = setting("MESSAGE") or DEFAULT_MESSAGES.get(scenario, "")
    answer = setting("ANSWER", "ok") or ""
    if scenario in ("limit", "limit_event", "limit_mid_run"):
        out(assistant(session_id, "<synthetic>", message, "rate_limit"))
        result = result_event(session_id, True, message, setting("API_STATUS", "429"), "api_error")
        result["num_turns"] = 5 if scenario == "limit_mid_run" else 1
        result["total_cost_usd"] = 0.21 if scenario == "limit_mid_run" else 0
    elif scenario == "transient":
        out(assistant(session_id, "<synthetic>", message, "server_error"))
        result = result_event(session_id, True, message, setting("API_STATUS", "529"), "api_error")
    elif scenario == "error":
        result = result_event(session_id, True, message, setting("API_STATUS"), "error")
        result["subtype"] = "error_during_execution"
    else:
        out(assistant(session_id, MODEL, answer, None))
        result = result_event(session_id, False, answer, None, "completed")
    if setting("NUM_TURNS"):
        result["num_turns"] = int(setting("NUM_TURNS"))
    if setting("COST"):
        result["total_cost_usd"] = float(setting("COST"))
    out(result)

    if fmt == "json":
        print(json.dumps(events if opts["verbose"] else result))
    elif fmt != "stream-json":
        print(result["result"])
    sys.stdout.flush()
    if setting("RECORD"):
        record["finished"] = True
        write_json(setting("RECORD"), record)
    code = setting("EXIT")
    if code is not None:
        return int(code)
    return 1 if result["is_error"] else 0


def apply_edits(spec: str | None) -> None:
    """Edit files in the cwd as told (a stand-in fixer); paths are relative to the cwd."""
    if not spec:
        return
    for edit in json.loads(spec):
        path = edit["path"]
        if edit.get("delete"):
            if os.path.lexists(path):
                os.unlink(path)
            continue
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        if "write" in edit:
            text = edit["write"]
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            if "replace" in edit:
                old, new = edit["replace"]
                text = text.replace(old, new)
            if "append" in edit:
                text += edit["append"]
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


def rate_limit_event(session_id: str, status: str, resets_at: int, rate_type: str | None) -> dict:
    return {
        "type": "rate_limit_event",
        "rate_limit_info": {
            "status": status,
            "resetsAt": resets_at,
            "rateLimitType": rate_type,
            "overageStatus": "rejected",
            "overageDisabledReason": "org_level_disabled",
            "isUsingOverage": False,
        },
        "uuid": str(uuid.uuid4()),
        "session_id": session_id,
    }


def assistant(session_id: str, model: str, text: str, error: str | None) -> dict:
    event = {
        "type": "assistant",
        "message": {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0 if error else 12, "output_tokens": 0 if error else 3},
        },
        "parent_tool_use_id": None,
        "session_id": session_id,
        "uuid": str(uuid.uuid4()),
    }
    if error:
        event["error"] = error
    return event


def result_event(session_id: str, is_error: bool, text: str, status: str | None, terminal: str) -> dict:
    return {
        "type": "result",
        "subtype": "success",
        "is_error": is_error,
        "duration_ms": 1200,
        "duration_api_ms": 900,
        "num_turns": 1,
        "result": text,
        "stop_reason": "end_turn" if not is_error else "stop_sequence",
        "session_id": session_id,
        "total_cost_usd": 0.0123 if not is_error else 0,
        "usage": {"input_tokens": 12, "output_tokens": 3},
        "modelUsage": {},
        "permission_denials": [],
        "api_error_status": int(status) if status else None,
        "terminal_reason": terminal,
        "uuid": str(uuid.uuid4()),
    }


if __name__ == "__main__":
    sys.exit(main())
