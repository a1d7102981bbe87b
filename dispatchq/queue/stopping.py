"""Whether this process was asked to stop: what tells a shutdown from a session's own doing.

A session ended by SIGTERM, SIGINT or SIGHUP looks the same whoever sent the signal: a unit
stop (systemd's `KillMode=control-group` signals the worker and the session's group
together) or the session command itself (one that kills its own group every time). Only the
first is "stopped by a shutdown" and free; the worker knows which, because a real stop
reaches it too. Its signal handler records the request here, process-wide (RQ runs the job
in the same process: `SimpleWorker`), and the session tier asks before it requeues.
"""

from __future__ import annotations

import threading

__all__ = ["note_stop_requested", "stop_requested"]

_STOP = threading.Event()


def note_stop_requested() -> None:
    """Called from the worker's stop handler (the first SIGTERM/SIGINT, or a later one)."""
    _STOP.set()


def stop_requested(within: float = 0.0) -> bool:
    """Was this process asked to stop (waiting up to `within` seconds for the request)?

    The wait covers a stop that signals the session's group a moment before the worker: the
    session's end is then seen first, the worker's own signal an instant later.
    """
    return _STOP.wait(within) if within > 0 else _STOP.is_set()
