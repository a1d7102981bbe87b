"""The real-client layer's harness: one release of the real Claude Code CLI as the session command.

Each release runs where its CLI is installed and is skipped, with the reason, where not;
under `CI=true` a file of the layer refuses to import without them
(`refuse_a_missing_cli_under_ci`)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dispatchq.launcher.releases import RELEASES, installed_claude
from dispatchq.storage import keys
from dispatchq.testing.anthropic import FakeAnthropicAPI
from tests.support.helpers import REPO
from tests.support.session import Harness

__all__ = [
    "RealHarness",
    "claude_of",
    "cli_ready",
    "command_of",
    "path_without_bwrap",
    "refuse_a_missing_cli_under_ci",
    "release_params",
    "skip_unless_ready",
    "why_not",
]


def claude_of(version: str) -> Path:
    """The release's own CLI, in its own folder (ops/dev.py installs each)."""
    return installed_claude(REPO, version)


def command_of(version: str) -> str:
    return f"{claude_of(version)} -p --output-format stream-json --verbose"


def _claude_ready(version: str) -> str | None:
    """None when the release's CLI runs here, else why not."""
    return cli_ready(claude_of(version), version, "Claude Code")


def cli_ready(cli: Path, version: str, title: str) -> str | None:
    """None when `cli` runs here and says it is `version`, else why not (one line)."""
    if not sys.platform.startswith("linux"):
        return "the real-client layer runs on Linux"
    if not cli.exists():
        return f"{title} {version} is not at {cli} (`python3 ops/dev.py test` installs it with npm)"
    done = subprocess.run([str(cli), "--version"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0 or version not in done.stdout:
        printed = done.stdout.strip() or done.stderr.strip()[-200:]
        return f"{cli} --version printed {printed!r} (want {version})"
    return None


@functools.cache
def why_not(version: str) -> str | None:
    """Why the release cannot run here (None when it can), asked once per process: the real-client
    files ask at import, the layer's `release` fixture when a case needs it, and no other file pays
    for starting the CLI."""
    return _claude_ready(version)


def skip_unless_ready(version: str) -> None:
    """Skip the running case, loudly and with the reason, where the release cannot run here."""
    why = why_not(version)
    if why is not None:
        pytest.skip(f"REAL CLAUDE CODE CLI TESTS SKIPPED: {why}")


def refuse_a_missing_cli_under_ci() -> None:
    """Under `CI=true` the real-client layer must run: a file of it calls this at import, so a
    missing or broken CLI fails that file instead of skipping every case quietly."""
    missing = {version: why for version in RELEASES if (why := why_not(version)) is not None}
    if missing and os.environ.get("CI") == "true":
        raise RuntimeError(f"CI=true and the real-client layer cannot run: {'; '.join(missing.values())}")


def release_params(
    versions: tuple[str, ...] = RELEASES,
    *,
    prefix: str = "cc",
    why: Callable[[str], str | None] | None = None,
    title: str = "CLAUDE CODE",
) -> list[Any]:
    """One pytest param per release (ids `<prefix><version>`), skipped loudly where that release
    cannot run here (`why`, Claude Code's `why_not` unless given)."""
    reason_of = why or why_not
    return [
        pytest.param(
            version,
            id=f"{prefix}{version}",
            marks=pytest.mark.skipif(
                reason_of(version) is not None,
                reason=f"REAL {title} CLI TESTS SKIPPED: {reason_of(version)}",
            ),
        )
        for version in versions
    ]


class RealHarness(Harness):
    """The session tier's harness with one release of the real CLI as the session command."""

    def __init__(
        self, env: dict[str, str], tmp: Path, client: Any, api: FakeAnthropicAPI, version: str
    ) -> None:
        super().__init__(env, tmp, client)
        home = tmp / "home"
        home.mkdir()
        self.api = api
        self.version = version
        self.node: Any = None  # the running case's pytest item (for newest_gap)
        self.claude = claude_of(version)
        self.command = command_of(version)
        self.env.update(
            DISPATCHQ_SESSION_COMMAND=self.command,
            ANTHROPIC_BASE_URL=api.url,
            CLAUDE_CODE_OAUTH_TOKEN="stand-in-token",
            DISABLE_TELEMETRY="1",
            DISABLE_ERROR_REPORTING="1",
            DISABLE_AUTOUPDATER="1",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            CLAUDE_CODE_MAX_RETRIES="1",
            HOME=str(home),
            TZ="UTC",
            # The fake session shows the window in a second; the real CLI takes seconds to reach
            # the API, and a probe must not be taken as open before its refusal arrives.
            DISPATCHQ_PROBE_GRACE="60",
            # The real CLI runs as deployed: confined, reaching the stand-in only through the
            # sandbox's egress proxy (HTTP_PROXY), with its non-secret settings allowed by name.
            DISPATCHQ_SESSION_SANDBOX="on",
        )

    def use_api_key(self) -> None:
        """Authenticate as an API-key user (the CLI then has no usage window, only API limits)."""
        self.env.pop("CLAUDE_CODE_OAUTH_TOKEN", None)
        self.env.update(
            DISPATCHQ_SESSION_CREDENTIAL_VAR="ANTHROPIC_API_KEY", ANTHROPIC_API_KEY="sk-ant-stand-in"
        )

    def window_markers(self) -> list[Any]:
        return self.rt.window.markers()

    def add_kinds(self, text: str) -> None:
        config = self.tmp / "dispatchq.yaml"
        config.write_text(config.read_text() + text)

    def bursts(self, count: int = 1, **env: str) -> None:
        """`count` burst workers at once; each must exit by itself, 0."""
        procs = [self.start("worker", "session", "--burst", **env) for _ in range(count)]
        for proc in procs:
            try:
                assert proc.wait(timeout=120) == 0, self.logs()
            except subprocess.TimeoutExpired:
                pytest.fail(f"a burst worker did not exit\n{self.logs()}")

    def spawns(self) -> int:
        """Sessions dispatchq spawned (its own counter: the CLI is not ours to instrument)."""
        return int(self.redis.get(keys.STATS_SESSIONS_SPAWNED) or 0)

    def figure(self, case: str, judgements: int, **counts: int) -> None:
        """For bench/sessions.py: one line of spawn counts per case, when it asks for them."""
        path = os.environ.get("BENCH_SPAWN_FIGURES")
        if path:
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps({"case": case, "judgements": judgements, **counts}) + "\n")


def path_without_bwrap(tmp: Path, path: str) -> str:
    """A PATH with every command of `path` but `bwrap` (symlinks in one folder)."""
    folder = tmp / "no-bwrap-bin"
    folder.mkdir()
    for directory in path.split(os.pathsep):
        if not directory or not Path(directory).is_dir():
            continue
        for entry in Path(directory).iterdir():
            target = folder / entry.name
            if entry.name != "bwrap" and not target.exists():
                target.symlink_to(entry)
    return str(folder)
