"""A probe session's watch on the window while it runs: it opens the window for everyone else.

After a lift exactly one session probes each lifted scope (`Window.admit` elects it, and its
holder renews the election with its claim's lease: `tiers.lease.Holding`). This watch reads
the probe's stream and says "open" as soon as the stream shows it, so the rest need not wait
for the probe to finish.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dispatchq.backends import SessionBackend
    from dispatchq.core.judgement import Record
    from dispatchq.pools.credentials import Credential
    from dispatchq.settings import Settings
    from dispatchq.tiers.lease import Holding
    from dispatchq.window.face import Window

__all__ = ["ProbeWatch", "Watched"]


class Watched(Protocol):
    """What the watch reads of the run it watches (the session tier's attempt)."""

    @property
    def holding(self) -> Holding: ...
    @property
    def record(self) -> Record: ...
    @property
    def credential(self) -> Credential: ...
    @property
    def backend(self) -> SessionBackend: ...
    @property
    def window(self) -> Window: ...
    @property
    def probes(self) -> list[str]: ...
    @property
    def claim(self) -> str: ...
    @property
    def settings(self) -> Settings: ...
    def running(self, session_id: str | None) -> None: ...


class ProbeWatch:
    """What the session's stream says about the window, while it runs (for a probe session).

    A probe releases everyone else as soon as the window shows open: the first sign in the
    stream, or `probe_grace` seconds without a limit, or a normal completion (`_account`).
    Once the stream showed a limit, neither the stream nor the grace opens it any more.
    The session id is recorded as soon as the `system` event names it, so a worker that dies
    mid-session leaves a judgement that resumes.
    """

    def __init__(self, attempt: Watched) -> None:
        self.attempt = attempt
        self.opened = threading.Event()
        self.limited = threading.Event()
        self.grace: threading.Timer | None = None

    def open_window(self, why: str) -> None:
        if self.attempt.probes and not self.opened.is_set():
            self.opened.set()
            self.attempt.window.opened(self.attempt.probes, why)

    def on_event(self, event: dict[str, Any]) -> None:
        """Called from the launcher's read loop: no Redis call here, only work for the writer."""
        attempt = self.attempt
        sid = event.get("session_id")
        if isinstance(sid, str) and sid and event.get("type") == "system":

            def record_session(sid: str = sid) -> None:
                attempt.window.records.set_fields(
                    attempt.record.id, claim=attempt.claim, session_id=sid, credential=attempt.credential.name
                )
                attempt.running(sid)

            attempt.holding.write(record_session)
        state = attempt.backend.window_state(event)
        if state == "closed":
            self.limited.set()
        elif state == "open" and not self.limited.is_set():
            attempt.holding.write(
                lambda: self.open_window("the probe session's stream shows the window open")
            )

    def start_grace(self) -> None:
        if not self.attempt.probes:
            return
        self.grace = threading.Timer(self.attempt.settings.probe_grace, self._grace_over)
        self.grace.daemon = True
        self.grace.start()

    def _grace_over(self) -> None:
        if not self.limited.is_set():
            self.open_window(f"probe ran {self.attempt.settings.probe_grace}s without a limit")

    def stop_grace(self) -> None:
        if self.grace is not None:
            self.grace.cancel()
