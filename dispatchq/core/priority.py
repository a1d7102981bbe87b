"""How urgent a judgement is: `urgent`, `normal` (the default) or `background`.

A producer says it (the Python API, `dispatchq enqueue --priority`, a JSON Lines field,
`POST /judgements`, or the kind's default); the session line serves a higher class first
and FIFO within one, and a credential may be kept for a class and above (`serves`). The
record keeps it as `urgency`, because a record's `priority` is the typed tier's `order`
score, which orders judgements *within* a class.
"""

from __future__ import annotations

from typing import Literal, cast, get_args

__all__ = [
    "DEFAULT_PRIORITY",
    "PRIORITIES",
    "Priority",
    "at_least",
    "line_band",
    "line_score",
    "parse_priority",
    "rank",
    "stored_priority",
]

Priority = Literal["urgent", "normal", "background"]
#: Highest first.
PRIORITIES: tuple[Priority, ...] = cast("tuple[Priority, ...]", get_args(Priority))
DEFAULT_PRIORITY: Priority = "normal"

_RANK: dict[str, int] = {"urgent": 2, "normal": 1, "background": 0}
#: How far a class moves a line score: far beyond any `order` score, so a class always leads.
#: `normal` adds nothing, so entries a store holds from before classes existed keep their place.
_BAND = 1e9


def rank(priority: str | None) -> int:
    """2 for urgent, 1 for normal (and for none), 0 for background."""
    return _RANK.get(priority or DEFAULT_PRIORITY, 1)


def at_least(priority: str | None, floor: str | None) -> bool:
    """Is `priority` the `floor` class or above (no floor: always)?"""
    return floor is None or rank(priority) >= rank(floor)


def line_band(priority: str | None) -> float:
    """What a class adds to a judgement's order score in the session line (higher goes first)."""
    return (rank(priority) - 1) * _BAND


def line_score(order: float | None, priority: str | None) -> float:
    """A judgement's score in a session line (lowest goes first): its class, then its `order` score.

    A score written before classes existed is `-order`, which is exactly a `normal` one's.
    """
    return -((order or 0.0) + line_band(priority))


def stored_priority(value: object) -> Priority:
    """A class as a store holds it: anything unreadable (none, an unknown word) reads as `normal`.

    Reading is lenient where writing is strict: a record must never become unreadable
    because of its class.
    """
    return cast("Priority", value) if isinstance(value, str) and value in _RANK else DEFAULT_PRIORITY


def parse_priority(value: object) -> Priority:
    """`value` as a class, or `ValueError` naming the three (None and "" are `normal`)."""
    if value is None or value == "":
        return DEFAULT_PRIORITY
    if isinstance(value, str) and value in _RANK:
        return cast("Priority", value)
    raise ValueError(f"priority must be one of {', '.join(PRIORITIES)} (got {value!r})")
