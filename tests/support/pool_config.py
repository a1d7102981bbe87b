"""A harness's config with a `credentials:` section, its secrets in files the way an operator keeps them."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.session import CONFIG, Harness

__all__ = ["secret_file", "write_pool"]


def secret_file(harness: Harness, name: str, value: str) -> Path:
    """`value` in a file only its owner reads (as `token_file` / `api_key_file` expect)."""
    path = harness.tmp / "secrets" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def write_pool(harness: Harness, credentials: str, kinds_extra: str = "") -> None:
    """Rewrite the harness's config: its kinds (plus `kinds_extra`) and `credentials`, and make
    the in-process runtime read it again."""
    text = (
        textwrap.dedent(CONFIG)
        + textwrap.indent(textwrap.dedent(kinds_extra), "  ")  # more kinds, under `kinds:`
        + "credentials:\n"
        + textwrap.indent(textwrap.dedent(credentials), "  ")
    )
    (harness.tmp / "dispatchq.yaml").write_text(text)
    harness.rt.__dict__.pop("config", None)
