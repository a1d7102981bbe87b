"""The gate's three built-in session kinds, and the hooks the session tier calls for them.

Defined in code, not YAML: their prompts state the contract and their hooks carry the
gate's guarantees, so a config cannot redefine them. The analyst and restater only get
their prompt built at spawn time (a fresh nonce each time); the fixer's hooks hand each
step to `dispatchq.findings.run.fixer.FixerJob`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dispatchq.core.judgement import canonical_json, sha256_hex
from dispatchq.core.kinds import Kind, SessionSpec
from dispatchq.findings.texts.returns import ANALYST, FIXER, RESTATER
from dispatchq.tiers.hooks import SessionHooks, SpawnVerdict

if TYPE_CHECKING:
    from dispatchq.core.judgement import Record
    from dispatchq.findings.run.fixer import FixerJob
    from dispatchq.runtime import Runtime
    from dispatchq.window.limits import SessionOutcome

__all__ = [
    "ANALYST_ARGS",
    "FIXER_ARGS",
    "GIT_READERS",
    "WRITING_GIT_OPTIONS",
    "FixerHooks",
    "QuestionHooks",
    "builtin_kinds",
]

# --- the built-in kinds ---------------------------------------------------------------------
GIT_READERS = ("log", "show", "diff", "blame", "status")
_READ_ONLY_TOOLS = ",".join(["Read", "Grep", "Glob", *(f"Bash(git {sub}:*)" for sub in GIT_READERS)])
# The allowed git readers still take options that write or run something: `--output=<file>`
# / `--output <file>` (log, show, diff write the patch to any path) and `--ext-diff` (runs
# the repository's configured diff program). Each form is denied for every allowed reader,
# wherever it sits on the command line (a deny rule wins over the allow rule).
WRITING_GIT_OPTIONS = ("--output", "--ext-diff")
_DENIED = ",".join(
    [
        "Edit",
        "Write",
        "NotebookEdit",
        *(f"Bash(git {sub} *{opt}*)" for sub in GIT_READERS for opt in WRITING_GIT_OPTIONS),
    ]
)
ANALYST_ARGS = ("--allowedTools", _READ_ONLY_TOOLS, "--disallowedTools", _DENIED)
FIXER_ARGS = ("--permission-mode", "acceptEdits", "--allowedTools", "Read,Grep,Glob,Edit,Write")
_FALLBACK_PROMPT = "dispatchq builds this prompt in code.\n{{ state }}"


class QuestionHooks(SessionHooks):
    """Hooks of the analyst and restater: only their prompt is dispatchq's own.

    Built at spawn time so the nonce is fresh for every invocation and never stored.
    """

    def render_prompt(self, runtime: Runtime, record: Record) -> str:
        # Lazy: every process that reads a config names these kinds; only a session spawns them.
        from dispatchq.findings.texts.prompts import (  # noqa: PLC0415 (lazy: the gate's texts)
            analyst_prompt,
            new_nonce,
            restater_prompt,
        )

        state = record.state if isinstance(record.state, dict) else {}
        nonce = new_nonce()
        if record.kind == ANALYST:
            return analyst_prompt(state, nonce)
        return restater_prompt(state, nonce)


def _fixer(runtime: Runtime, record: Record) -> FixerJob:
    """The fixer job of this record, its module imported only when a fixer session runs:
    every process that reads a config names the built-in kinds, few spawn the fixer."""
    from dispatchq.findings.run.fixer import FixerJob  # noqa: PLC0415 (lazy: the gate's machinery)

    return FixerJob.load(runtime, record)


class FixerHooks(SessionHooks):
    """The fixer job's own steps around the spawn (see `FixerJob`)."""

    def before_spawn(self, runtime: Runtime, record: Record) -> SpawnVerdict:
        return _fixer(runtime, record).before_spawn()

    def render_prompt(self, runtime: Runtime, record: Record) -> str:
        return _fixer(runtime, record).prompt()

    def after_session(self, runtime: Runtime, record: Record, outcome: SessionOutcome, result: Any) -> None:
        _fixer(runtime, record).after_session(outcome, result)

    def not_spawned(self, runtime: Runtime, record: Record, reason: str) -> None:
        _fixer(runtime, record).not_spawned(reason)


def _kind(name: str, prompt: str, args: Sequence[str], fmt: str) -> Kind:
    digest = sha256_hex(canonical_json({"builtin": name, "args": list(args), "format": fmt}))
    return Kind(name=name, session=SessionSpec(prompt, tuple(args), fmt, None), digest=digest)


def builtin_kinds() -> dict[str, Kind]:
    """The three kinds the gate runs. Defined in code, not YAML: their prompts state the
    contract and their hooks carry the gate's guarantees, so a config cannot redefine them
    (a YAML kind of the same name is a config error)."""
    return {
        ANALYST: _kind(ANALYST, _FALLBACK_PROMPT, ANALYST_ARGS, "json"),
        RESTATER: _kind(RESTATER, _FALLBACK_PROMPT, ANALYST_ARGS, "json"),
        FIXER: _kind(FIXER, _FALLBACK_PROMPT, FIXER_ARGS, "text"),
    }


def builtin_hooks() -> dict[str, SessionHooks]:
    """The code each built-in kind runs around its spawn, by kind name.

    A `Kind` is data; these are handed to the session tier by the process wiring
    (`dispatchq.process.wiring.session_hooks`), so the pure kind names no tier."""
    questions = QuestionHooks()
    return {ANALYST: questions, RESTATER: questions, FIXER: FixerHooks()}
