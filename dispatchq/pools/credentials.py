"""A credential as data, the pool of them, and the marker scopes that are one credential's.

With no `credentials:` section the pool is one credential named `default`, read from the
environment as before (`DISPATCHQ_SESSION_CREDENTIAL_VAR`, or `<VAR>_FILE`). Its marker
scopes, its slots and its probes keep the names a store written before pools used
(`general`, `model:opus`, ...), so such a store drains as `default`'s. Every other
credential's scope is qualified, `<credential>/<scope>`: a credential name never holds `/`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dispatchq.core.priority import Priority, at_least

__all__ = [
    "API_KEY_VAR",
    "CODEX_API_KEY_VAR",
    "CODEX_AUTH_VAR",
    "DEFAULT_CREDENTIAL",
    "OPENAI_API_KEY_VAR",
    "TOKEN_VAR",
    "Billing",
    "Credential",
    "Pool",
    "Serves",
    "SpendCap",
    "credential_of",
    "names_of",
    "qualify",
    "unqualified",
]

DEFAULT_CREDENTIAL = "default"
#: What a session sees its credential as, by how the operator gave it.
TOKEN_VAR = "CLAUDE_CODE_OAUTH_TOKEN"  # noqa: S105 (a name) `token_file`: a subscription's long-lived token
API_KEY_VAR = "ANTHROPIC_API_KEY"  # `api_key_file`: an Anthropic API key
#: `api_key_file` of a `codex` credential: an OpenAI API key, which `codex exec` reads from
#: `CODEX_API_KEY`. It ignores `OPENAI_API_KEY` (0.169.0 and 0.171.0 sent no Authorization with
#: only that set), which is still withheld from every Codex session as a credential.
CODEX_API_KEY_VAR = "CODEX_API_KEY"
OPENAI_API_KEY_VAR = "OPENAI_API_KEY"
#: `auth_file` of a `codex` credential: a ChatGPT plan's `auth.json`. No session sees it as a
#: variable; the `codex` backend writes it into the session's `CODEX_HOME`.
CODEX_AUTH_VAR = "CODEX_AUTH_JSON"

Billing = Literal["subscription", "metered"]


@dataclass(frozen=True)
class SpendCap:
    """USD a metered credential may spend per calendar day and month (in the configured zone)."""

    day: float | None = None
    month: float | None = None


@dataclass(frozen=True)
class Serves:
    """Who may use a credential: a priority floor, and/or only these kinds."""

    priority: Priority | None = None
    kinds: tuple[str, ...] | None = None

    def allows(self, priority: str | None, kind: str) -> bool:
        if not at_least(priority, self.priority):
            return False
        return self.kinds is None or kind in self.kinds


@dataclass(frozen=True)
class Credential:
    """One credential of the pool.

    `variable` is the name the session sees it under; `file` is where dispatchq reads it
    (None: the parent's environment, `variable` or `<variable>_FILE`, as the `default`
    credential always has been). `order` is the operator's preference among equals
    (lower first); `pacing` lets a credential whose use runs ahead of its window's elapsed
    share yield to an open peer; `reserve_urgent` lets urgent automation into the share of
    its window kept for people (`DISPATCHQ_WINDOW_RESERVE`).
    """

    name: str
    variable: str = TOKEN_VAR
    file: str | None = None
    backend: str = "claude"
    billing: Billing = "subscription"
    concurrency: int = 1
    order: int = 0
    spend_cap: SpendCap | None = None
    serves: Serves = field(default_factory=Serves)
    pacing: bool = True
    reserve_urgent: bool = False

    @property
    def metered(self) -> bool:
        return self.billing == "metered"

    def may_serve(self, priority: str | None, kind: str) -> bool:
        return self.serves.allows(priority, kind)

    def scope(self, scope: str) -> str:
        """This credential's marker scope for a limit scope (`general` -> `team-max/general`)."""
        return qualify(self.name, scope)


@dataclass(frozen=True)
class Pool:
    """The credentials, in the order the operator wrote them."""

    credentials: tuple[Credential, ...]

    def __post_init__(self) -> None:
        if not self.credentials:
            raise ValueError("a pool holds at least one credential")

    def __iter__(self) -> Iterator[Credential]:
        return iter(self.credentials)

    def __len__(self) -> int:
        return len(self.credentials)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.credentials]

    @property
    def single(self) -> bool:
        """One credential: reasons and status read as they did before pools."""
        return len(self.credentials) == 1

    def get(self, name: str) -> Credential | None:
        return next((c for c in self.credentials if c.name == name), None)

    def allowed(self, priority: str | None, kind: str) -> list[Credential]:
        return [c for c in self.credentials if c.may_serve(priority, kind)]

    @classmethod
    def of_one(cls, variable: str, concurrency: int) -> Pool:
        """The pool when the file names none: the environment's one credential, `default`."""
        return cls((Credential(DEFAULT_CREDENTIAL, variable=variable, concurrency=concurrency),))


def qualify(credential: str, scope: str) -> str:
    """The marker scope of `scope` on `credential` (the default's keeps its bare name)."""
    return scope if credential == DEFAULT_CREDENTIAL else f"{credential}/{scope}"


def credential_of(qualified: str) -> str:
    """Whose a marker scope is."""
    name, sep, _ = qualified.partition("/")
    return name if sep else DEFAULT_CREDENTIAL


def unqualified(qualified: str) -> str:
    """The limit scope without its credential (`team-max/model:opus` -> `model:opus`)."""
    _, sep, rest = qualified.partition("/")
    return rest if sep else qualified


def names_of(credentials: Sequence[Credential]) -> str:
    return ", ".join(c.name for c in credentials)
