"""Helpers for `dispatchq serve` tests: a real server process on a free loopback port, real HTTP.

GitHub's example payloads are read at test time from `shared/github-webhooks/` beside the
repository (where CI lays `shared/`), never copied into the project.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import REPO

WEBHOOKS = REPO.parent / "shared" / "github-webhooks"
#: GitHub's documented example secret, made long enough for `serve` (32 characters at least).
SECRET = "It's a Secret to Everybody, 0123456789abcdef"
PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")

CONFIG = """\
kinds:
  echo:
    check: {check}
    escalate: needs-triage
triage:
  mode: shadow
  executor: recording
  questions:
    needs_repro: {{type: noul, instructions: "Does the issue lack steps to reproduce?"}}
  rules:
    - id: needs-repro
      events: [issues.opened]
      if: 'needs_repro >= 0.8'
      state: [issue.title, issue.body]
      actions:
        - {{op: label.add, label: needs-repro}}
    - id: any-push
      events: [push]
      actions:
        - {{op: label.add, label: pushed}}
    - id: checks
      events: [check_run]
      actions:
        - {{op: label.add, label: checked}}
"""


def payload(event: str, name: str = "payload.json") -> bytes:
    """The raw bytes of one of GitHub's example payloads (as GitHub would send them)."""
    path = WEBHOOKS / event / name
    if not path.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"GitHub's example payloads are missing: {path} (shared/ must sit beside the clone)")
        pytest.skip(f"LOUD SKIP: GitHub's example payloads are not at {WEBHOOKS} (shared/ beside the clone)")
    return path.read_bytes()


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    *,
    timeout: float = 30,
) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        response = conn.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        conn.close()


def deliver(
    port: int,
    event: str,
    body: bytes,
    *,
    delivery: str,
    signature: str | None = "",
) -> Reply:
    """POST one delivery as GitHub does; `signature=""` signs it correctly, None sends none."""
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery,
        "User-Agent": "GitHub-Hookshot/test",
    }
    if signature == "":
        headers["X-Hub-Signature-256"] = sign(body)
    elif signature is not None:
        headers["X-Hub-Signature-256"] = signature
    return request(port, "POST", "/webhooks/github", body, headers)


class Server:
    """`dispatchq serve` as a real subprocess on a free port; stderr kept in a file."""

    def __init__(self, env: dict[str, str], workdir: Path, *args: str) -> None:
        self.port = free_port()
        self.env = {k: v for k, v in env.items() if k not in PROXIES}
        self.log = workdir / f"serve-{self.port}.log"
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        with self.log.open("wb") as handle:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "dispatchq.cli", "serve", "--port", str(self.port), *self.args],
                env=self.env,
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"dispatchq serve exited {self.process.returncode}: {self.output}")
            try:
                if request(self.port, "GET", "/healthz", timeout=2).status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"dispatchq serve did not answer /healthz within 60 s: {self.output}")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def module_env(redis_server: Any, directory: Path, check: str, **extra: str) -> dict[str, str]:
    """What `dq_env` gives a test, for a server shared by a module's tests (its own directory)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCHQ_", "TYPESAFE_"))}
    (directory / "dispatchq.yaml").write_text(CONFIG.format(check=check))
    env.update(
        DISPATCHQ_DATA_DIR=str(redis_server.data_dir),
        DISPATCHQ_CHECKOUT_ROOTS=str(directory),
        DISPATCHQ_CONFIG=str(directory / "dispatchq.yaml"),
        DISPATCHQ_RECOVERY_INTERVAL="2",
        DISPATCHQ_HEARTBEAT_INTERVAL="1",
        DISPATCHQ_HEARTBEAT_GRACE="3",
        XDG_DATA_HOME=str(directory / "xdg"),
        PYTHONPATH=f"{REPO}{os.pathsep}{directory}",
        DISPATCHQ_GITHUB_WEBHOOK_SECRET=SECRET,
        **extra,
    )
    return env


ACTIONS_TOKEN = "Wq7-actions-token-0123456789abcdefABCDEF"


#: base64 with `+`, `/` and `=` padding: the cookie once held the token quoted, and such never matched.
GATE_TOKEN = "q3+Vx/9kZ2Fw0LmN7pR4sT1uW8yA5bC6dE0fG2hJ4k=="


GATE_PUBLIC = "dispatchq.example.test"


API_TOKEN = "serve-api-token-0123456789abcdef"


SERVE_BOUNDS = {
    "DISPATCHQ_SERVE_BODY_TIMEOUT": "2",
    "DISPATCHQ_SERVE_HEADER_TIMEOUT": "2",
    "DISPATCHQ_SERVE_MAX_BODY": str(1024 * 1024),
    "DISPATCHQ_SERVE_MAX_LINES": "20",
    "DISPATCHQ_SERVE_MAX_STATE": "2048",
    "DISPATCHQ_SERVE_MAX_ERRORS": "3",
}


WEBHOOKS_TOKEN = "serve-test-token-0123456789abcdef"
