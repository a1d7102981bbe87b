"""The command-line agents a session can run, behind one `SessionBackend` each.

`base` holds the protocol (what a backend provides, and why the seam is there); one module
per backend implements it (`claude`: Claude Code, `codex`: OpenAI Codex CLI).
`backend_for(name)` is the registry the session tier and the worker ask; a credential names
its backend by the same name. Adding a backend is its module and one row of `_REGISTRY`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dispatchq.backends.base import ReleaseCheck, SessionBackend
from dispatchq.backends.claude import ClaudeBackend
from dispatchq.backends.codex import CodexBackend
from dispatchq.errors import ConfigError

if TYPE_CHECKING:
    from dispatchq.settings import Settings

__all__ = [
    "DEFAULT_BACKEND",
    "ReleaseCheck",
    "SessionBackend",
    "backend_for",
    "command_for",
    "known_backends",
]

#: What a session runs when nothing names a backend (the one credential of a pool-less setup).
DEFAULT_BACKEND = "claude"

_REGISTRY: dict[str, Callable[[], SessionBackend]] = {
    "claude": ClaudeBackend,
    "codex": CodexBackend,
}


#: The setting that holds each backend's command (`DISPATCHQ_SESSION_COMMAND` is Claude Code's).
_COMMAND_SETTINGS: dict[str, str] = {"claude": "session_command", "codex": "codex_command"}


def command_for(name: str, settings: Settings) -> str:
    """The command a session of backend `name` runs, from that backend's own setting."""
    return str(getattr(settings, _COMMAND_SETTINGS.get(name, "session_command")))


def known_backends() -> tuple[str, ...]:
    """Every backend name `backend_for` answers, sorted."""
    return tuple(sorted(_REGISTRY))


def backend_for(name: str) -> SessionBackend:
    """The backend registered as `name`; a ConfigError naming it and the known ones otherwise."""
    make = _REGISTRY.get(name)
    if make is None:
        known = ", ".join(known_backends())
        raise ConfigError(f"unknown session backend {name!r} (known: {known})")
    return make()
