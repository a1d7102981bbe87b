"""The real-client layer's harness for OpenAI Codex: one release of the real `codex` CLI as a
pool's Codex command, against `dispatchq.testing.openai`, beside the real Claude Code CLI.

Each release runs where `python3 ops/dev.py test` installed it (`.cache/codex/<version>/`) and
is skipped, with the reason, where not; under `CI=true` a file of the layer refuses to import
without them (`refuse_a_missing_codex_under_ci`), as the Claude Code layer does."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import pytest

from dispatchq.launcher.codex_releases import RELEASES
from dispatchq.testing.anthropic import FakeAnthropicAPI
from dispatchq.testing.openai import FakeOpenAIAPI, Seen, chatgpt_auth
from tests.support.helpers import REPO
from tests.support.pool_config import secret_file
from tests.support.real_client import RealHarness, cli_ready, release_params

__all__ = [
    "SYSTEM_CA_BUNDLE",
    "CodexHarness",
    "codex_of",
    "codex_release_params",
    "refuse_a_missing_codex_under_ci",
    "skip_unless_codex_ready",
    "why_not_codex",
]


SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def codex_of(version: str) -> Path:
    """The release's own CLI, in its own folder (ops/dev.py installs each)."""
    return REPO / ".cache" / "codex" / version / "node_modules" / ".bin" / "codex"


@functools.cache
def why_not_codex(version: str) -> str | None:
    """Why the release cannot run here (None when it can), asked once per process."""
    return cli_ready(codex_of(version), version, "Codex CLI")


def skip_unless_codex_ready(version: str) -> None:
    """Skip the running case, loudly and with the reason, where the release cannot run here."""
    why = why_not_codex(version)
    if why is not None:
        pytest.skip(f"REAL CODEX CLI TESTS SKIPPED: {why}")


def refuse_a_missing_codex_under_ci() -> None:
    """Under `CI=true` the Codex real-client tests must run: a missing or broken CLI fails the
    file at import instead of skipping every case quietly."""
    missing = [why for version in RELEASES if (why := why_not_codex(version)) is not None]
    if missing and os.environ.get("CI") == "true":
        raise RuntimeError(f"CI=true and the Codex real-client layer cannot run: {'; '.join(missing)}")


def codex_release_params(versions: tuple[str, ...] = RELEASES) -> list[Any]:
    """One pytest param per Codex release (ids `cx0.169.0`, ...), skipped loudly where that
    release cannot run here."""
    return release_params(versions, prefix="cx", why=why_not_codex, title="CODEX")


class CodexHarness(RealHarness):
    """The session tier with a Claude Code release as the session command and a Codex release
    as the Codex command, each pointed at its loopback stand-in."""

    def __init__(
        self,
        env: dict[str, str],
        tmp: Path,
        client: Any,
        api: FakeAnthropicAPI,
        claude_version: str,
        openai: FakeOpenAIAPI,
        codex_version: str,
    ) -> None:
        super().__init__(env, tmp, client, api, claude_version)
        self.openai = openai
        self.codex_version = codex_version
        self.codex = codex_of(codex_version)
        self.env.update(
            DISPATCHQ_CODEX_COMMAND=str(self.codex),
            # Written into each session's config.toml as openai_base_url / chatgpt_base_url: a
            # plan login sends its model requests to the first (chatgpt.com's own host otherwise)
            # and its usage readings to the second.
            OPENAI_BASE_URL=openai.api_url,
            CHATGPT_BASE_URL=openai.chatgpt_url,
        )
        # A host that names its CA bundle, as Debian's ca-certificates puts it: Codex reads
        # SSL_CERT_FILE for every connection, its WebSocket to a plain-http base included.
        if Path(SYSTEM_CA_BUNDLE).is_file():
            self.env["SSL_CERT_FILE"] = SYSTEM_CA_BUNDLE

    def plan_login(self, name: str) -> tuple[Path, str]:
        """A ChatGPT plan's `auth.json` in a secret file: (its path, the access token it sends)."""
        text = chatgpt_auth()
        return secret_file(self, name, text), str(json.loads(text)["tokens"]["access_token"])

    def codex_runs(self, credential: str | None = None) -> list[Seen]:
        """The model requests Codex sent (one per session that reached the service), on
        `credential` when given."""
        seen = self.openai.response_requests
        return [s for s in seen if credential is None or s.credential == credential]

    def claude_runs(self) -> int:
        return len(self.api.message_requests)
