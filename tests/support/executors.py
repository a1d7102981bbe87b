"""The issue and token the GitHub executor tests and their fixtures (tests/unit/conftest.py) share."""

from __future__ import annotations

__all__ = ["TARGET", "TOKEN"]


TARGET = "acme/app#12"


TOKEN = "ghp_fake-token-0123456789"
