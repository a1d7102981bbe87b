"""The non-dumpable session tests' world: a repository owned by another user and a canary secret."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.session import NOBODY

__all__ = [
    "DUMPABLE_CANARY",
    "DUMPABLE_REPO",
    "NOBODY",
    "DumpableWorld",
    "as_target",
    "chown_tree",
    "dumpable_git",
]


DUMPABLE_REPO = Path(__file__).resolve().parents[2]


DUMPABLE_CANARY = "canary-" + os.urandom(4).hex()


def as_target() -> tuple[list[str], int]:
    """The argv prefix that runs a target as another uid, and that uid."""
    if os.geteuid() != 0:
        return [], os.geteuid()
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run the targets as another uid than root")
    caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *caps], NOBODY


@dataclass
class DumpableWorld:
    root: Path
    env: dict[str, str]
    prefix: list[str]
    uid: int

    def start(self, args: list[str], name: str, **extra_env: str) -> subprocess.Popen[bytes]:
        log = (self.root / "logs" / f"{name}.log").open("wb")
        try:
            return subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "dispatchq.cli", *args],
                env={**self.env, **extra_env},
                cwd=self.root / "repo",
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()  # the child holds its own copy

    def log(self, name: str) -> str:
        return (self.root / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]


def chown_tree(root: Path, uid: int) -> None:
    for directory, dirs, files in os.walk(root):
        for entry in [directory, *(os.path.join(directory, n) for n in dirs + files)]:
            os.lchown(entry, uid, uid)


def dumpable_git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
