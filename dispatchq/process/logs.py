"""Logs an operator can grep: one line per event, ISO 8601 time, level, role, message.

Every long-running process (a tier's worker, the scheduler) configures this once at its
start with its role. RQ's own records (`rq.worker`, `rq.job`) go through the same
handler: RQ adds its own colourised `HH:MM:SS` handler only when no handler is in
effect, so one root handler here is enough. Tracebacks are kept for bugs; an outage is
one line (see `dispatchq.storage.outage`).

`DISPATCHQ_LOG_FORMAT=json` writes one JSON object a line instead, with the keys
`time`, `level`, `role`, `message` (and `error` when a traceback came with it).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

from dispatchq.storage.outage import is_out_of_memory, is_outage

__all__ = ["JsonFormatter", "TextFormatter", "configure"]


def _iso(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """`2026-12-01T09:30:00.123Z WARNING session: Redis back after 12 s`."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_iso(record.created)} {record.levelname} {self.role}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: `time`, `level`, `role`, `message` (and `error`)."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": _iso(record.created),
            "level": record.levelname,
            "role": self.role,
            "message": record.getMessage(),
        }
        if record.exc_info:
            data["error"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False)


class _QuietOutages(logging.Filter):
    """RQ's own lines about Redis being away become dispatchq's one line per change.

    RQ logs "could not connect to Redis instance … retrying" every round of its dequeue
    loop, and a multi-line traceback when its loop quits on a dropped connection; the
    worker already says "Redis unreachable at …" once and "Redis back after …" once.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("rq."):
            return True
        if "could not connect to Redis instance" in str(record.msg):
            return False
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and (is_outage(error) or is_out_of_memory(error)):
            why = "Redis is unreachable" if is_outage(error) else "Redis is out of memory"
            record.msg = f"{record.getMessage()} ({why})"
            record.args = ()
            record.exc_info = None
        return True


class _RqChatter(logging.Filter):
    """RQ's own INFO lines ("default: job picked up", "Job OK", registry cleaning) at DEBUG.

    They were 70 % of a worker's log and say nothing dispatchq's own lines (a judgement
    answered, a marker put up) do not say better; `DISPATCHQ_LOG_RQ=true` shows them again.
    RQ's warnings and errors always pass.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.name.split(".")[0] in ("rq", "rq_scheduler"))


def configure(
    role: str,
    fmt: str = "text",
    *,
    level: int = logging.INFO,
    stream: TextIO | None = None,
    rq_info: bool = False,
) -> None:
    """Route every logger of this process through one handler for `role`."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(role) if fmt == "json" else TextFormatter(role))
    handler.addFilter(_QuietOutages())
    if not rq_info:
        handler.addFilter(_RqChatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("rq.worker", "rq.job", "rq.scheduler", "rq_scheduler.scheduler"):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True
        # A level left by an earlier RQ loop in this process (`work(logging_level=...)` sets
        # one) must not hide RQ's records from the one handler; each new loop sets its own.
        logger.setLevel(logging.NOTSET)
