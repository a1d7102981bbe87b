"""Shared scaffolding for the decision-gate tests: a git repository with a findings report,
the fake `claude` scripted per role (analyst, restater, fixer), the real `dispatchq findings`
CLI in a subprocess, and a pseudo-terminal to drive the sweep as a person would.

Steps for the fake are matched to the prompt they answer (`match`), so the order in which
dispatchq happens to spawn sessions never decides which answer a session gets.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatchq.findings.evidence.pins import PinResult
from dispatchq.findings.evidence.record import DecisionRecord, RecordStore, report_lock_dir
from dispatchq.findings.grammar.lines import Decision
from dispatchq.findings.grammar.plans import Check
from dispatchq.storage.findings import FindingsStore
from tests.support.helpers import REPO

FAKE = REPO / "tests" / "support" / "fake_claude.py"
SESSION_COMMAND = f"{sys.executable} {FAKE} -p --output-format stream-json --verbose"
DAY = dt.date(2026, 8, 27)

GUIDE = "Run scripts/old-tool.sh to build.\nThe rest of the guide.\n"
NOTES = "notes line one\nnotes line two\n"
APP = "def main():\n    return old_name()\n"


def git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", *args],
        cwd=root,
        capture_output=True,
        check=True,
    )
    return done.stdout.decode()


def finding_block(
    fid: str,
    title: str,
    *,
    location: str | None = "`docs/guide.md:1`",
    drift: str | None = "dead-reference",
    problem: str = "docs/guide.md cites scripts/old-tool.sh, which no longer exists.",
    remediation: str = "Remove the mention of scripts/old-tool.sh from docs/guide.md.",
    source: str | None = None,
    severity: str = "MEDIUM",
    fix: str = "needs-decision",
) -> str:
    lines = [f"### [{severity}] {fid}: {title}"]
    if location is not None:
        lines.append(f"**Location:** {location}")
    lines.append(f"**Fix:** {fix}")
    if source is not None:
        lines.append(f"**Source:** {source}")
    if drift is not None:
        lines.append(f"**Drift-class:** {drift}")
    lines.append(f"**Problem:** {problem}")
    lines.append("**Impact:** Readers follow a dead instruction.")
    lines.append(f"**Remediation:** {remediation}")
    return "\n".join(lines) + "\n\n"


# --- answers of the fake sessions ------------------------------------------------------------
def alt(label: str, resolution: str, paths: Sequence[tuple[str, str]], plan: Sequence[Any] = ()) -> dict:
    return {
        "label": label,
        "resolution": resolution,
        "paths": [{"path": p, "role": r} for p, r in paths],
        "verification_plan": list(plan),
    }


def analysis(
    alternatives: Sequence[dict],
    *,
    target: str = "docs/guide.md:1",
    recommend: str = "A",
    candidate: dict | None = None,
    a_alone_reason: str = "",
) -> str:
    return json.dumps(
        {
            "target": target,
            "findings": [
                {
                    "claim": "the guide cites a script that is gone",
                    "evidence": [{"command": "glob scripts/old-tool.sh", "output": ""}],
                }
            ],
            "alternatives": list(alternatives),
            "a_alone": len(alternatives) == 1,
            "a_alone_reason": a_alone_reason,
            "recommendation": {"label": recommend, "reason": "smallest change"},
            "risk": "low",
            "code_preview": "- Run scripts/old-tool.sh to build.",
            "rejection_candidate": candidate,
        }
    )


REMOVE = "delete the sentence citing scripts/old-tool.sh at docs/guide.md:1"
RESTORE = "restore scripts/old-tool.sh as a build script, leaving docs/guide.md:1 as it is"
GONE = "grep -F old-tool.sh docs → empty"


def standard_alternatives() -> list[dict]:
    return [
        alt("A", REMOVE, [("docs/guide.md", "edit"), ("scripts/old-tool.sh", "ref")], [GONE]),
        alt(
            "B",
            RESTORE,
            [("scripts/old-tool.sh", "edit"), ("docs/guide.md", "ref")],
            ["glob scripts/old-tool.sh → lines 1"],
        ),
    ]


def analyst_step(fid: str, answer: str, **extra: Any) -> dict:
    return {"match": ["decision analyst", f"Finding: {fid} ("], "answer": answer, **extra}


def restater_step(fid: str, restated: Sequence[dict] | None, *, unrestatable: str | None = None) -> dict:
    answer = json.dumps({"restated": list(restated or []), "unrestatable": unrestatable})
    return {"match": ["dispatchq's restater", f"Finding: {fid} ("], "answer": answer}


def fixer_step(fid: str, edits: Sequence[dict] = (), **extra: Any) -> dict:
    return {"match": ["dispatchq's fixer", f"{fid}:"], "edits": list(edits), "answer": "changed it", **extra}


REMOVE_EDIT = {"path": "docs/guide.md", "replace": ["Run scripts/old-tool.sh to build.\n", ""]}


# --- the world --------------------------------------------------------------------------------------
@dataclass
class World:
    tmp: Path
    root: Path
    report: Path
    env: dict[str, str]
    redis: Any
    plan_file: Path
    spawn_log: Path

    # --- the fake ---------------------------------------------------------------------------------
    def steps(self, *steps: dict) -> None:
        current = json.loads(self.plan_file.read_text() or "[]")
        self.plan_file.write_text(json.dumps([*current, *steps]))

    def left(self) -> list[dict]:
        return json.loads(self.plan_file.read_text() or "[]")

    def spawns(self) -> int:
        return len(self.spawn_log.read_text().splitlines()) if self.spawn_log.exists() else 0

    def prompts(self) -> list[str]:
        path = self.tmp / "prompts.jsonl"
        if not path.exists():
            return []
        return [json.loads(line)["stdin"] for line in path.read_text().splitlines()]

    # --- the report -------------------------------------------------------------------------------
    def text(self) -> str:
        return self.report.read_text()

    def block(self, fid: str) -> str:
        text = self.text()
        start = text.index(f"] {fid}: ")
        start = text.rindex("### ", 0, start)
        end = text.find("\n### ", start + 1)
        return text[start : end + 1 if end >= 0 else None]

    def line(self, fid: str, name: str) -> str | None:
        for line in self.block(fid).splitlines():
            if line.startswith(f"**{name}:** "):
                return line[len(name) + 6 :]
        return None

    def record(self) -> DecisionRecord:
        return DecisionRecord(
            self.report,
            self.root,
            RecordStore(FindingsStore(self.redis), self.root),
            lock_dir=report_lock_dir(Path(self.env["DISPATCHQ_DATA_DIR"])),  # the CLI's own lock
        )

    def decide(
        self,
        fid: str,
        label: str,
        resolution: str,
        plan: Sequence[str] = (),
        roles: dict[str, str] | None = None,
    ) -> PinResult:
        """A decision written exactly as the sweep writes one (used to set up dispatch tests)."""
        checks = [Check.parse(c) for c in plan] or None
        return self.record().write_decision(
            fid,
            Decision(label, resolution, "tester", DAY),
            plan=checks,
            roles=roles,  # type: ignore[arg-type]
        )

    # --- the CLI --------------------------------------------------------------------------------------
    def argv(self, command: str, *extra: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "dispatchq.cli",
            "findings",
            command,
            str(self.report),
            "--repo",
            str(self.root),
            *extra,
        ]

    def cli(
        self, command: str, *extra: str, input: str | None = "", timeout: float = 240
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(command, *extra),
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.tmp,
        )

    def summary(self, command: str, *extra: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
        done = self.cli(command, "--json", *extra)
        try:
            return json.loads(done.stdout), done
        except json.JSONDecodeError:
            pytest.fail(f"no JSON summary (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")

    def pty(self, command: str, *extra: str, **env: str) -> PtyProcess:
        return PtyProcess(self.argv(command, *extra), {**self.env, **env}, self.tmp)


def make_world(tmp_path: Path, dq_env: dict[str, str], redis_client: Any, report: str) -> World:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "src").mkdir()
    (root / "reviews").mkdir()
    (root / "docs" / "guide.md").write_text(GUIDE)
    (root / "docs" / "notes.md").write_text(NOTES)
    (root / "src" / "app.py").write_text(APP)
    report_path = root / "reviews" / "report.md"
    report_path.write_text("# Review\n\n" + report)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "initial")
    plan_file = tmp_path / "fake-plan.json"
    plan_file.write_text("[]")
    spawn_log = tmp_path / "spawns.log"
    env = dict(
        dq_env,
        DISPATCHQ_SESSION_COMMAND=SESSION_COMMAND,
        DISPATCHQ_SESSION_TIMEOUT="60",
        DISPATCHQ_TIMEZONE="UTC",
        DISPATCHQ_PROBE_GRACE="1",
        FAKE_CLAUDE_PLAN=str(plan_file),
        FAKE_CLAUDE_SPAWN_LOG=str(spawn_log),
        FAKE_CLAUDE_PROMPT_LOG=str(tmp_path / "prompts.jsonl"),
        PYTHONUNBUFFERED="1",
    )
    return World(tmp_path, root, report_path, env, redis_client, plan_file, spawn_log)


# --- a pseudo-terminal ---------------------------------------------------------------------------------
class PtyProcess:
    """A subprocess whose stdin, stdout and stderr are a pseudo-terminal, driven like a person."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, start_new_session=True
        )
        os.close(slave)
        self.master = master
        self.output = ""
        self.pos = 0
        self.closed = False

    def _read(self, timeout: float) -> None:
        if self.closed:
            time.sleep(min(timeout, 0.05))
            return
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return
        try:
            data = os.read(self.master, 65536)
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return
        self.output += data.decode("utf-8", "replace").replace("\r\n", "\n")

    def expect(self, pattern: str, timeout: float = 180) -> re.Match[str]:
        """Wait for `pattern` in the output after the last match (a bounded wait, no timing claim)."""
        rx = re.compile(pattern, re.MULTILINE)
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.output, self.pos)
            if m:
                self.pos = m.end()
                return m
            if time.monotonic() > deadline or (self.closed and self.proc.poll() is not None):
                pytest.fail(f"never saw {pattern!r}; output so far:\n{self.output[-4000:]}")
            self._read(0.2)

    def send(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def finish(self, timeout: float = 180) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None or not self.closed:
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"the sweep did not end; output:\n{self.output[-4000:]}")
            self._read(0.2)
            if self.proc.poll() is not None:
                self._read(0.2)
                break
        return self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        os.close(self.master)


# --- driving real `dispatchq findings` processes (the interruption tests) ----------------
def until(predicate: Callable[[], Any], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def start(world: World, command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        world.argv(command, "--json"),
        env=world.env,
        cwd=world.tmp,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def fixer_count(world: World) -> int:
    return sum("dispatchq's fixer" in p for p in world.prompts())


def analyst_count(world: World) -> int:
    return sum("decision analyst" in p for p in world.prompts())
