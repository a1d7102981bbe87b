"""The result TTL the store tests set."""

from __future__ import annotations

__all__ = ["TTL"]


TTL = 1234
