"""A harness's config with a `credentials:` section, its secrets in files the way an operator keeps them."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.session import CONFIG, Harness

__all__ = ["PRICED_CODEX_KIND", "pool_text", "secret_file", "write_pool", "write_secret"]


def write_secret(folder: Path, name: str, value: str) -> Path:
    """`value` in `<folder>/secrets/<name>`, a file only its owner reads (as `token_file` /
    `api_key_file` expect)."""
    path = folder / "secrets" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def pool_text(base: str, credentials: str, kinds_extra: str = "") -> str:
    """A config: `base` (a `kinds:` section last) plus `kinds_extra` under it, then `credentials`."""
    return (
        textwrap.dedent(base)
        + textwrap.indent(textwrap.dedent(kinds_extra), "  ")  # more kinds, under `kinds:`
        + "credentials:\n"
        + textwrap.indent(textwrap.dedent(credentials), "  ")
    )


def secret_file(harness: Harness, name: str, value: str) -> Path:
    return write_secret(harness.tmp, name, value)


def write_pool(harness: Harness, credentials: str, kinds_extra: str = "") -> None:
    """Rewrite the harness's config: its kinds (plus `kinds_extra`) and `credentials`, and make
    the in-process runtime read it again."""
    (harness.tmp / "dispatchq.yaml").write_text(pool_text(CONFIG, credentials, kinds_extra))
    harness.rt.__dict__.pop("config", None)


#: A Codex-only kind priced by its tokens at `house-model` (DISPATCHQ_CODEX_PRICES names it),
#: with the admission estimate a metered credential's cap reserves.
PRICED_CODEX_KIND = """
          priced:
            session:
              prompt: "Answer {{ target }}"
              backends: [codex]
              model: house-model
              cost_estimate: 0.5
        """
