"""Every exception dispatchq raises on purpose, in one tree.

    DispatchqError
    ├── UserError ............... bad input: the CLI prints one line and exits 2, never a traceback
    │   ├── ConfigError ......... the YAML config (names the kind or section and the field)
    │   ├── SettingsError ....... an environment setting (names the variable)
    │   ├── ReportError ......... a findings report that cannot be read or written safely
    │   ├── GrammarError ........ a loop-written report line that breaks its grammar
    │   ├── CheckError .......... a verification check or plan outside the grammar or boundary
    │   ├── UnsafeToken ......... a document-derived path token that fails the allow-list
    │   ├── RedisUnavailable .... the configured Redis cannot be used (a bad URL or data dir)
    │   │   └── RedisUnreachable  it does not answer now: an outage, waited out by long-running roles
    │   └── TooManyRefused ...... more refused lines in one batch than its caller allows: none enqueued
    ├── EnqueueInterrupted ...... Redis failed part way through a batch enqueue (what went in is kept)
    ├── AnswerError ............. a wire answer that cannot be read as the type it claims
    ├── ContractError ........... a session's return that breaks its contract
    ├── ConditionError .......... a rule's `if` that fails on the answers it has (row 2)
    ├── ExecutorError ........... an executor could not carry an action out
    ├── DeliveriesFailed ........ some webhook deliveries of one triage job failed (each is named)
    ├── GitError ................ a git command failed
    ├── GitUnavailable .......... git could not be run at all
    ├── TamperError ............. a line dispatchq wrote was changed by someone else
    ├── RegexTimeout ............ a check's regex ran past its time limit
    ├── Aborted ................. the person's terminal went away during the sweep
    └── LadderError ............. a move down the ladder: a bug, never user input

Why one tree: a caller can catch `UserError` to print one line, or `DispatchqError` to
tell dispatchq's deliberate refusals from bugs, without knowing which module raised
what. `AnswerError` and `ContractError` are also `ValueError`s, and `GitError` and
`LadderError` `RuntimeError`s, as they were before they joined the tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "Aborted",
    "AnswerError",
    "CheckError",
    "ConditionError",
    "ConfigError",
    "ContractError",
    "DeliveriesFailed",
    "DispatchqError",
    "EnqueueInterrupted",
    "ExecutorError",
    "GitError",
    "GitUnavailable",
    "GrammarError",
    "LadderError",
    "RedisUnavailable",
    "RedisUnreachable",
    "RegexTimeout",
    "ReportError",
    "SettingsError",
    "TamperError",
    "TooManyRefused",
    "UnsafeToken",
    "UserError",
]


class DispatchqError(Exception):
    """Base class for errors dispatchq raises deliberately."""


class UserError(DispatchqError):
    """Bad input: say what was wrong, in one line, and do nothing else."""


class ConfigError(UserError):
    """The config file is invalid; the message names the kind/section and the field.

    `problems`: every mistake found, one line each (the message is them, joined by newlines).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.problems: list[str] = message.splitlines() or [message]


class SettingsError(UserError):
    """An environment setting is invalid; the message names the variable."""


class ReportError(UserError):
    """A report dispatchq cannot read or write safely; every problem names its line."""

    def __init__(self, path: str | Path, problems: Sequence[tuple[int, str]]) -> None:
        self.path = str(path)
        self.problems = list(problems)
        text = "; ".join(f"{self.path}:{line}: {msg}" for line, msg in self.problems)
        super().__init__(text)


class GrammarError(UserError):
    """A loop-written line value that does not satisfy its grammar."""


class CheckError(UserError):
    """A check or plan that does not satisfy the grammar or the boundary's static rules."""


class UnsafeToken(UserError):
    """A document-derived path token that fails the allow-list; it is never escaped."""


class TooManyRefused(UserError):
    """A batch with more refused lines than the caller's cap: nothing of it was enqueued.

    `refused` is how many were counted when the cap was passed (counting stops there).
    """

    def __init__(self, refused: int, cap: int) -> None:
        super().__init__(f"more than {cap} lines are refused ({refused} counted); nothing was enqueued")
        self.refused = refused
        self.cap = cap


class RedisUnavailable(UserError):
    """The configured Redis cannot be reached (or the embedded one cannot start)."""


class RedisUnreachable(RedisUnavailable):
    """Redis does not answer right now (down, restarting, loading): a one-shot command says
    so in one line; a worker or the scheduler waits for it instead of exiting."""


class AnswerError(DispatchqError, ValueError):
    """A wire answer that cannot be read as the type it claims."""


class ContractError(DispatchqError, ValueError):
    """A session's return that does not meet its contract; the message says which rule."""


class ConditionError(DispatchqError):
    """An `if` that fails on the answers it has (row 2): a type error, a missing field."""


class DeliveriesFailed(DispatchqError):
    """Some events of a batch of webhook deliveries failed to triage; the others were triaged."""


class ExecutorError(DispatchqError):
    """The executor could not carry an action out (HTTP error, no token, bad target).

    Its message is safe to print: the token is redacted before it is built.
    """


class GitError(DispatchqError, RuntimeError):
    pass


class GitUnavailable(DispatchqError):
    """git could not be run at all: nothing can be pinned or observed."""


class TamperError(DispatchqError):
    """A line dispatchq wrote was changed by someone else; the finding is to be set aside."""

    def __init__(self, finding_id: str, changes: Sequence[str]) -> None:
        self.finding_id = finding_id
        self.changes = list(changes)
        super().__init__(f"{finding_id}: lines dispatchq wrote were changed: " + "; ".join(self.changes))


class RegexTimeout(DispatchqError):
    """A regex ran past its time limit (a catastrophic pattern or a huge input)."""


class Aborted(DispatchqError):
    """The person's terminal went away (end of input, or an interrupt): stop asking."""


class LadderError(DispatchqError, RuntimeError):
    """A move that would go down (or sideways) the ladder: a bug, never user input."""


class EnqueueInterrupted(DispatchqError):
    """Redis failed part way through writing a batch: `written` went in, the rest did not.

    Each chunk is one MULTI, so a chunk is all or nothing; `written` are the chunks whose
    EXEC answered, in input order. Re-sending the rest is safe: a judgement already live
    is recognised by its content key and not written twice.
    """

    def __init__(self, written: list[tuple[str, bool]], cause: BaseException) -> None:
        super().__init__(str(cause))
        self.written = written
        self.cause = cause
