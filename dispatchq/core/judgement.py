"""The judgement, its record, and its content key: pure data, no I/O.

A *judgement* is what a producer asks (`kind`, `target`, optional `item`, `context`,
`state`). Its *record* is dispatchq's own account of it: status, the tier that
answered, the answer, and the trail of tiers it passed through with why each moved
on. RQ executes work; these records are the source of truth, and they outlive RQ's
500-second job results.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from dispatchq.core.priority import DEFAULT_PRIORITY, PRIORITIES, Priority, parse_priority

__all__ = [
    "FINISHED",
    "REUSABLE",
    "STATUSES",
    "Effect",
    "Judgement",
    "JudgementIn",
    "Record",
    "Status",
    "TrailEntry",
    "canonical_json",
    "content_key",
    "is_plain_json",
    "sha256_hex",
    "state_digest",
]

Status = Literal["queued", "running", "answered", "waiting", "needs-triage", "failed", "cancelled"]
STATUSES: tuple[Status, ...] = (
    "queued",
    "running",
    "answered",
    "waiting",
    "needs-triage",
    "failed",
    "cancelled",
)
#: Finished records expire after the result TTL; the others never do.
FINISHED: frozenset[str] = frozenset({"answered", "needs-triage", "failed", "cancelled"})
#: A judgement whose key maps to one of these may be enqueued again as new work.
REUSABLE: frozenset[str] = frozenset({"failed", "cancelled"})

Effect = Literal["local", "external"]


def is_plain_json(value: Any) -> bool:
    """True when `value` is made only of dict (str keys), list, str, int, bool, None and
    finite floats: parsed JSON, the common case, which needs no conversion or error walk.

    Exact type checks: this runs over every state hashed, and `isinstance` against a
    union or an ABC costs several times `type() is`.
    """
    kind = type(value)
    if kind is dict:
        return all(type(key) is str and is_plain_json(item) for key, item in value.items())
    if kind is list:
        return all(is_plain_json(item) for item in value)
    if kind is float:
        return math.isfinite(value)
    return kind is str or kind is int or kind is bool or value is None


def _check_finite(value: Any, depth: int = 0) -> None:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} has no JSON spelling")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"object keys must be strings, not {type(key).__name__}")
            _check_finite(item, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_finite(item, depth + 1)
    elif value is not None and not isinstance(value, str | int | bool):
        raise TypeError(f"{type(value).__name__} is not JSON data")


def canonical_json(value: Any, *, plain: bool = False) -> str:
    """One byte-exact spelling of a JSON value, so equal content hashes equally.

    `plain=True`: the caller has just seen `is_plain_json(value)` hold, so it is not walked
    again (orjson still refuses a lone surrogate and an integer past 64 bits).
    """
    if not plain and not is_plain_json(value):
        _check_finite(value)  # a tuple or dict subclass passes; anything with no spelling raises
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def state_digest(state: Any) -> str:
    """Identity of a typed-tier state: judgements sharing it can share one provider request."""
    return sha256_hex(canonical_json(state))[:32]


class JudgementIn(BaseModel):
    """What a producer enqueues. Unknown fields are refused so typos are caught early."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(min_length=1, max_length=200)
    target: str = Field(min_length=1, max_length=4000)
    item: str | None = Field(None, max_length=4000)
    context: dict[str, Any] = Field(default_factory=dict)
    state: Any = None
    key: str | None = Field(
        None, min_length=1, max_length=1000, description="Producer's own idempotency key."
    )
    priority: Priority | None = Field(
        None, description="urgent, normal or background; none: the kind's default (else normal)."
    )

    @field_validator("priority", mode="before")
    @classmethod
    def _known_priority(cls, value: Any) -> Priority | None:
        # Checked here, before pydantic's own literal check, so the refusal names the three
        # classes in the words `dispatchq enqueue --help` uses. "" is "not said", like null.
        if value is None or value == "":
            return None
        try:
            return parse_priority(value)
        except ValueError:
            raise ValueError(f"must be one of {', '.join(PRIORITIES)} (got {value!r})") from None

    @field_validator("context")
    @classmethod
    def _checkout_is_text(cls, value: dict[str, Any]) -> dict[str, Any]:
        checkout = value.get("checkout")
        if checkout is not None and (not isinstance(checkout, str) or not checkout):
            raise ValueError("context.checkout must be a directory path (a non-empty string)")
        return value

    @field_validator("state", "context")
    @classmethod
    def _plain_json(cls, value: Any) -> Any:
        # Python's json reads NaN and Infinity (and 1e999 as inf), which JSON has no spelling
        # for: refuse them here, with the field named, rather than crash the content key. Parsed
        # JSON (the common case) passes the exact-type walk; the rest is walked for the error.
        if is_plain_json(value):
            return value
        try:
            _check_finite(value)
        except (TypeError, ValueError) as error:
            raise ValueError(f"not plain JSON data ({error})") from None
        return value

    @property
    def checkout(self) -> str | None:
        value = self.context.get("checkout")
        return value if isinstance(value, str) else None

    def input_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=False)


class Judgement(JudgementIn):
    """A judgement with its id: what a code check receives."""

    id: str


def content_key(judgement: JudgementIn, kind_digest: str, checkout_fingerprint: str | None = None) -> str:
    """The judgement's identity for idempotency and caching, defined once.

    sha256 over canonical JSON of (kind, target, item, context, state, the kind's
    definition), plus, for a judgement that runs in a checkout, the checkout's HEAD
    and a digest of every changed or untracked file. Editing the kind or the tree
    changes the key; re-sending the same judgement does not.

    A producer-supplied `key` replaces the content: the producer then says what
    "the same judgement" means (the decision gate uses finding, attempt, block hash).
    """
    if judgement.key is not None:
        return "p-" + sha256_hex(canonical_json(["producer-key", judgement.kind, judgement.key]))
    payload = [
        judgement.kind,
        judgement.target,
        judgement.item,
        judgement.context,
        judgement.state,
        kind_digest,
        checkout_fingerprint,
    ]
    # Texts, and a context and state that `JudgementIn`'s own validator (`_plain_json`) has
    # checked are plain JSON: not walked a second time for every judgement enqueued.
    return sha256_hex(canonical_json(payload, plain=True))


class TrailEntry(BaseModel):
    """One step of a judgement's climb: which tier, what happened, and why it moved on."""

    model_config = ConfigDict(extra="allow")

    tier: str
    outcome: str
    why: str = ""
    at: float = Field(default_factory=time.time)


class Record(BaseModel):
    """dispatchq's record of one judgement: the public `result --json` contract.

    The fields `id, kind, target, status, tier, value, confidence, reason, trail`
    are the contract; others may be added but these keep their meaning.
    """

    model_config = ConfigDict(extra="allow")

    id: str
    kind: str
    target: str
    item: str | None = None
    status: Status
    tier: str | None = None
    value: Any = None
    confidence: float | None = None
    reason: str | None = None
    trail: list[TrailEntry] = Field(default_factory=list)
    context: dict[str, Any] = Field(default_factory=dict)
    state: Any = None
    key: str | None = None
    content_key: str | None = None
    effect: str = "local"
    host: str | None = None
    #: The typed tier's `order` score: orders judgements within one class of `urgency`.
    priority: float | None = None
    #: The judgement's class (the producer's `priority`, else its kind's): the line serves
    #: higher classes first. Named apart from `priority`, which is the `order` score above.
    urgency: Priority = DEFAULT_PRIORITY
    raw: Any = None
    created_at: float | None = None
    updated_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def public(self) -> dict[str, Any]:
        """The JSON form printed by `dispatchq result --json`."""
        data = self.model_dump(mode="json")
        # Keep the contract's fields first, in the documented order.
        ordered = {k: data.pop(k) for k in ("id", "kind", "target", "status", "tier", "value", "confidence")}
        ordered["reason"] = data.pop("reason")
        ordered["trail"] = data.pop("trail")
        ordered.update(data)
        return ordered
