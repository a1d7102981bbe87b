"""Kinds of judgement: what each tier needs to answer one, as plain frozen data.

A `Kind` is built by `dispatchq.config` from YAML (or in code, for the decision gate's
built-in kinds) and read by every tier. It lives in `core` because the ladder and the
tiers decide from it without any I/O; loading and validating YAML is the config's job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatchq.core.answers import wire_question
from dispatchq.core.priority import DEFAULT_PRIORITY

__all__ = ["Kind", "Kinds", "Question", "SessionSpec"]


@dataclass(frozen=True)
class Question:
    """A typed-tier question in the SDK's own form, plus dispatchq's `priority` map."""

    id: str
    type: str
    instructions: Any = None
    criteria: Any = None
    priority: dict[str, float] | None = None

    def wire(self) -> dict[str, Any]:
        """The question as the SDK sends it (dispatchq's own keys removed)."""
        return wire_question(self.type, self.instructions, self.criteria)


@dataclass(frozen=True)
class SessionSpec:
    prompt: str
    args: tuple[str, ...] = ()
    format: str = "text"
    model: str | None = None  # the model this kind's session runs, when it names one
    # Extra paths the kind's confined session sees, as written: `/opt/tool` (read-only),
    # `/opt/tool:ro` or `/srv/data:rw`. The sandbox mounts them; `dispatchq.config` checks them.
    bind: tuple[str, ...] = ()
    # What one session of this kind is expected to cost (USD): what admission reserves
    # against a metered credential's cap before the run reports its real cost. None: the
    # running mean of the kind's recent sessions.
    cost_estimate: float | None = None
    # The session backends that may answer the kind (`claude`, `codex`), by preference of
    # none: a credential of any of them may take it. Empty: the pool's first credential's only.
    backends: tuple[str, ...] = ()
    # A backend's own prompt, where it differs from `prompt`: (backend, prompt) pairs.
    prompts: tuple[tuple[str, str], ...] = ()

    def prompt_for(self, backend: str) -> str:
        """The prompt a session of `backend` is given: its own, else the kind's."""
        return dict(self.prompts).get(backend, self.prompt)


@dataclass(frozen=True)
class Kind:
    """One kind of judgement and the tiers that can answer it."""

    name: str
    effect: str = "local"
    check: str | None = None
    check_fn: Callable[..., Any] | None = field(default=None, compare=False, repr=False)
    produce: tuple[tuple[str, ...], ...] = ()
    verify: tuple[tuple[str, ...], ...] = ()
    questions: dict[str, Question] = field(default_factory=dict)
    answer: str | None = None
    gate_on: tuple[str, ...] = ()
    order: str | None = None
    escalate: str = "session"
    session: SessionSpec | None = None
    # Variables (exact names or globs) the kind's produce/verify commands receive beyond the
    # toolchain-neutral base (`dispatchq.launcher.environment.CHILD_BASE`), e.g. GOPATH.
    env: tuple[str, ...] = ()
    digest: str = ""
    # The class a judgement of this kind gets when its producer names none
    # (`dispatchq.core.priority`): urgent, normal or background.
    priority: str = DEFAULT_PRIORITY

    @property
    def has_code(self) -> bool:
        return self.check is not None or bool(self.produce)

    @property
    def has_typed(self) -> bool:
        return bool(self.questions)

    @property
    def gate_questions(self) -> tuple[str, ...]:
        """The questions whose minimum confidence is the judgement's confidence."""
        if self.gate_on:
            return self.gate_on
        return (self.answer,) if self.answer else ()


class Kinds(dict[str, Kind]):
    """The user's kinds, plus dispatchq's built-in kinds found by name but never listed.

    The decision gate's analyst, restater and fixer are defined in code (their prompts and
    hooks are part of the product), yet workers look a judgement's kind up by name like any
    other. So `[]`, `get` and `in` also find the built-ins, while iterating, `len` and `==`
    see only what the config file declared: a listing of "your kinds" stays yours.
    """

    def __init__(
        self, kinds: Mapping[str, Kind] | None = None, builtin: Mapping[str, Kind] | None = None
    ) -> None:
        super().__init__(kinds or {})
        self.builtin: dict[str, Kind] = dict(builtin or {})

    def __getitem__(self, name: str) -> Kind:
        if dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        if name in self.builtin:
            return self.builtin[name]
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or name in self.builtin

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default
