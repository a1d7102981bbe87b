"""Why a judgement waits, as one of a few classes (reasons are free text; classes are not).

`status`, the status page and the `dispatchq_waiting{reason_class}` metric count waiting
judgements by these classes. The store keeps the counts exact in the same script as the
record's change, so the class is decided when the reason is written: by the writer when
it knows (a host block passes `host_blocked`), else from the reason's own wording here.
"""

from __future__ import annotations

__all__ = ["WAIT_CLASSES", "reason_class"]

#: Every class, in the order `status` shows them.
WAIT_CLASSES: tuple[str, ...] = ("window", "host_blocked", "slot", "lock", "retry", "other")

_WINDOW = ("usage window", "usage limit", "rate limit", "limit reached", "hit your limit", "resets ")
_RETRY = ("retrying", "retry ", "back off", "backing off", "transient throttle")


def reason_class(reason: str | None) -> str:
    """The class of a waiting reason: `window`, `host_blocked`, `slot`, `lock`, `retry` or `other`."""
    text = (reason or "").strip().lower()
    if not text:
        return "other"
    if any(word in text for word in _WINDOW):
        return "window"
    if text.startswith("host ") and "blocked" in text:
        return "host_blocked"
    if any(word in text for word in _RETRY):
        return "retry"
    if "slot" in text:
        return "slot"
    if "lock" in text:
        return "lock"
    return "other"
