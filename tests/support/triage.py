"""The triage integration tests' world: the event, the answers, the config and the `Triage` driver."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dispatchq.storage.triage import TriageStorage
from dispatchq.testing.typesafe import choice, noul
from dispatchq.triage.executors import RecordingExecutor
from tests.support.helpers import run_cli

__all__ = [
    "CONFIG",
    "EVENT",
    "GITHUB_TOKEN",
    "TARGET",
    "TRIAGE_ANSWERS",
    "TRIAGE_KEY",
    "TRIAGE_PROXIES",
    "Triage",
]


TRIAGE_KEY = "ts-live-triage-0123456789abcdef"


GITHUB_TOKEN = "ghp_fake-triage-token-0123456789"


TARGET = "acme/app#12"


EVENT = {
    "event": "issues.opened",
    "target": TARGET,
    "item": "issue:12",
    "context": {"repo": "acme/app"},
    "state": {"title": "It crashes", "body": "it crashes on start; $(rm -rf /) `whoami`"},
}


TRIAGE_ANSWERS = {
    "answers": {
        "needs_repro": noul(0.97),
        "area": choice("bug", 0.9, {"bug": 0.9, "feature": 0.05, "docs": 0.05}),
    }
}


CONFIG = """\
triage:
  mode: {mode}
  gate: {{suggest: {suggest}, auto: 0.85}}
  budget: {{requests: 100}}
  allowDestructive: [close]
  executor: {executor}
  escalate: needs-triage
  templates: {{repro: templates/needs-repro.md}}
  questions:
    needs_repro: {{type: noul, instructions: "Does the issue lack steps to reproduce?"}}
    area:
      type: choice
      instructions: "Which area is the issue about?"
      criteria: {{bug: null, feature: null, docs: null}}
      events: [issues.opened]
  rules:
    - id: {rule}
      events: [issues.opened]
      if: 'needs_repro >= 0.8 && area == "bug"'
      gateOn: [needs_repro]
      actions:
        - {{op: label.add, label: needs-repro}}
        - {{op: comment, template: repro}}
    - id: docs-label
      events: [issues.opened]
      if: 'area == "docs"'
      actions:
        - {{op: label.add, label: docs}}
    - id: seen
      events: [issues.opened]
      actions:
        - {{op: label.add, label: triage-seen}}
"""


TRIAGE_PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


class Triage:
    """One test's world: config file, event file, environment, and the CLI as a process."""

    def __init__(self, root: Path, env: dict[str, str], redis: Any) -> None:
        self.root = root
        self.env = env
        self.redis = redis
        self.event_file = root / "event.json"
        self.event_file.write_text(json.dumps(EVENT))
        (root / "templates").mkdir()
        (root / "templates" / "needs-repro.md").write_text("Please add the steps that reproduce this.\n")
        self.configure()

    def configure(
        self,
        *,
        mode: str = "shadow",
        suggest: float = 0.6,
        executor: str = "recording",
        rule: str = "needs-repro",
    ) -> None:
        text = CONFIG.format(mode=mode, suggest=suggest, executor=executor, rule=rule)
        Path(self.env["DISPATCHQ_CONFIG"]).write_text(text)

    def cli(self, *args: str, env: dict[str, str] | None = None) -> Any:
        done = run_cli(["triage", *args], env or self.env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert TRIAGE_KEY not in done.stdout + done.stderr and GITHUB_TOKEN not in done.stdout + done.stderr
        return json.loads(done.stdout) if "--json" in args else done.stdout

    def run(self, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        return self.cli("--event", str(self.event_file), *args, "--json", env=env)

    def status(self) -> dict[str, Any]:
        done = run_cli(["status", "--json"], self.env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def recorded(self) -> list[dict[str, Any]]:
        return RecordingExecutor(TriageStorage(self.redis)).recorded()
