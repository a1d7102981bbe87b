"""What the command-line tests and their fixtures (tests/cli/conftest.py) share: the fake
`claude` command, the findings report and git helper, and the triage command's environment."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import fakeredis
from click.testing import CliRunner, Result

from dispatchq.cli import main
from tests.support.helpers import REPO

__all__ = ["CONFIG", "FAKE", "REPORT", "Env", "git"]


FAKE = REPO / "tests" / "support" / "fake_claude.py"


REPORT = """# Review

### [MEDIUM] DOC-001: clean and decided
**Location:** `docs/a.md:1`
**Fix:** needs-decision
**Decision:** A — delete the line citing scripts/tool.sh at docs/a.md:1 [user, 2026-08-27]

### [LOW] DOC-002: escapes through a symlink
**Location:** `out/secret.md:1`
**Fix:** needs-decision

### [LOW] DOC-003: broken grammar
**Fix:** auto
**Decision:** A — something [user, 2026-08-27; attempt 3: failed]
**Status:** ✅ Fixed (2026-08-27)

### [HIGH] DOC-004: outside by dot-dot
**Location:** `../root-evil/secret.md:1`

### [HIGH] DOC-005: missing
**Location:** `docs/missing.md:3` (was: `unknown:0`)
**Decision:** B — restore docs/missing.md:3 [user, 2026-08-27]
**Dispatch:** attempt 1 dispatched 2026-08-27

### [HIGH] DOC-006: absolute
**Location:** /etc/hosts:1
**Status:** 🚫 Rejected (2026-08-27) — not a bug

### [HIGH] DOC-007: no location
**Fix:** needs-decision
"""


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=root,
        check=True,
        capture_output=True,
    )


CONFIG = """\
triage:
  mode: {mode}
  gate: {{suggest: 0.6, auto: 0.85}}
  budget: {{requests: 100}}
  allowDestructive: [close]
  executor: recording
  escalate: needs-triage
  templates: {{repro: templates/needs-repro.md}}
  questions:
    needs_repro: {{type: noul, instructions: "Does the issue lack steps to reproduce?"}}
    area: {{type: choice, criteria: {{bug: null, feature: null, docs: null}}, events: [issues.opened]}}
  rules:
    - id: needs-repro
      events: [issues.opened]
      if: 'needs_repro >= 0.8 && area == "bug"'
      gateOn: [needs_repro]
      actions:
        - {{op: label.add, label: needs-repro}}
        - {{op: comment, template: repro}}
"""


class Env:
    def __init__(self, root: Path, server: fakeredis.FakeServer) -> None:
        self.root = root
        self.server = server

    def write_config(self, mode: str = "shadow", text: str | None = None) -> None:
        (self.root / "dispatchq.yaml").write_text(text if text is not None else CONFIG.format(mode=mode))

    def redis(self) -> fakeredis.FakeRedis:
        return fakeredis.FakeRedis(server=self.server)

    def file(self, name: str, data: Any) -> str:
        path = self.root / name
        path.write_text(data if isinstance(data, str) else json.dumps(data))
        return str(path)

    def run(self, *args: str) -> Result:
        return CliRunner().invoke(main, ["triage", *args], catch_exceptions=False)

    def run_json(self, *args: str) -> Any:
        result = self.run(*args, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)
