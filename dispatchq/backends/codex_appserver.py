"""Asking `codex app-server` for the account's windows: `account/rateLimits/read`, in fields.

`codex exec --json` states a usage limit only in words (docs/codex-cli.md); the app-server
(JSON-RPC, one JSON object per line on stdio, `"jsonrpc"` left out) answers
`account/rateLimits/read` with each window's `usedPercent`, `windowDurationMins` and
`resetsAt` (epoch seconds), read from the service. After a run that hit a limit, the `codex`
backend asks it once, with the session's own environment (its `CODEX_HOME`, its one
credential), so the windows and instants in fields win over the words.

The exchange (`initialize`, then `initialized` and the read) was checked against codex-cli
0.171.0's app-server on loopback. Anything but a well-formed reply in time is no reading: the
words stand.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["APP_SERVER_TIMEOUT", "READ_ID", "rate_limits_requests", "rate_limits_result", "read_rate_limits"]

#: How long one reading may take, start to reply (the service answers in well under a second).
APP_SERVER_TIMEOUT = 15.0
INITIALIZE_ID = 0
READ_ID = 1
_CLIENT = {"name": "dispatchq", "title": "dispatchq", "version": "1"}


def rate_limits_requests() -> tuple[str, str]:
    """The two writes: `initialize`; then, once it is answered, `initialized` and the read."""
    initialize = {"method": "initialize", "id": INITIALIZE_ID, "params": {"clientInfo": _CLIENT}}
    then = [{"method": "initialized"}, {"method": "account/rateLimits/read", "id": READ_ID}]
    return json.dumps(initialize) + "\n", "".join(json.dumps(m) + "\n" for m in then)


def _message(line: str) -> Mapping[str, Any] | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, Mapping) else None


def rate_limits_result(lines: Iterable[str], request_id: int = READ_ID) -> Mapping[str, Any] | None:
    """The `result` of the reply to `request_id` among `lines`; None for an error or no reply."""
    for line in lines:
        message = _message(line)
        if message is not None and message.get("id") == request_id and "method" not in message:
            result = message.get("result")
            return result if isinstance(result, Mapping) else None
    return None


def _line(
    stream: IO[bytes], selector: selectors.BaseSelector, deadline: float, buffer: bytearray
) -> str | None:
    """The next line of the app-server's stdout before `deadline`, else None."""
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        if left <= 0 or not selector.select(left):
            return None
        chunk = os.read(stream.fileno(), 65536)
        if not chunk:
            return None
        buffer.extend(chunk)
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line.decode("utf-8", "replace")


def read_rate_limits(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path, *, timeout: float = APP_SERVER_TIMEOUT
) -> Mapping[str, Any] | None:
    """One `account/rateLimits/read` from `argv` (the Codex command and `app-server`); None when
    it could not start, refused, or did not answer within `timeout`. The process group is ended
    either way."""
    first, then = rate_limits_requests()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    except OSError:
        return None
    assert proc.stdin is not None and proc.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = bytearray()
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            proc.stdin.write(first.encode())
            proc.stdin.flush()
            sent = False
            while (line := _line(proc.stdout, selector, deadline, buffer)) is not None:
                message = _message(line)
                if message is None or "method" in message:
                    continue  # a notification, or a log line
                if message.get("id") == INITIALIZE_ID and not sent:
                    if "result" not in message:
                        return None
                    proc.stdin.write(then.encode())
                    proc.stdin.flush()
                    sent = True
                elif message.get("id") == READ_ID:
                    return rate_limits_result([line])
        return None
    except OSError:
        return None
    finally:
        _end(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
