"""Bytes to text, once: Redis replies, subprocess output and stored fields.

Redis hands back `bytes` unless a client decodes, subprocesses print bytes, and
dispatchq stores text; one helper keeps the rule (UTF-8, undecodable bytes replaced,
`None` kept) the same everywhere instead of seven local `_s` functions.
"""

from __future__ import annotations

from typing import overload

__all__ = ["as_text"]


@overload
def as_text(value: None) -> None: ...
@overload
def as_text(value: bytes | bytearray | memoryview | str | int | float) -> str: ...
@overload
def as_text(value: object) -> str | None: ...
def as_text(value: object) -> str | None:
    """`value` as `str`: bytes decoded as UTF-8 (bad bytes replaced), None kept as None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)
