"""How a built-in session kind steps around its spawn: a typed base class with no-op defaults.

The decision gate's fixer must take a repository lock, write a dispatch marker and verify
first before its session is spawned, and grade after it. Those steps are the gate's; the
session tier only needs to know what to do next. So a hook *returns a verdict* and the
session tier acts on it (requeue the judgement in its own line, or report the hook's own
result) instead of the gate reaching into the session tier's internals. Subclass
`SessionHooks` and override what you need, as dramatiq's `Middleware` is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dispatchq.core.judgement import Record
    from dispatchq.runtime import Runtime
    from dispatchq.window.limits import SessionOutcome

__all__ = ["GO", "Go", "Requeue", "SessionHooks", "Settled", "SpawnVerdict"]


@dataclass(frozen=True)
class Go:
    """Spawn the session now."""


@dataclass(frozen=True)
class Requeue:
    """Put the judgement back at the front of its line, uncharged, and report `result`."""

    why: str
    result: str


@dataclass(frozen=True)
class Settled:
    """The hook finished the judgement itself (no spawn); the job reports `result`."""

    result: str


SpawnVerdict = Go | Requeue | Settled
GO = Go()


class SessionHooks:
    """No-op hooks: a kind without special steps behaves exactly like a YAML kind."""

    def before_spawn(self, runtime: Runtime, record: Record) -> SpawnVerdict:
        """Called after admission, before the spawn."""
        return GO

    def render_prompt(self, runtime: Runtime, record: Record) -> str | None:
        """The prompt, when the kind builds its own; None renders the kind's template."""
        return None

    def not_spawned(self, runtime: Runtime, record: Record, reason: str) -> None:
        """The spawn did not happen after `before_spawn` said go: undo what it prepared."""

    def after_session(self, runtime: Runtime, record: Record, outcome: SessionOutcome, result: Any) -> None:
        """The session ended (answered, limited or failed) and the tier has accounted for it."""


NO_HOOKS = SessionHooks()
