"""The code tier: answers the tree, git or an API already state, for free.

Two forms:

- a *check* (`module:function`) returns an answer, or None for "cannot tell";
- *produce-and-verify* runs the repository's own regenerators in a temporary git
  worktree at HEAD and lets its own verifier judge: pass -> answered with the diff
  and a local branch; fail -> the judgement moves up carrying the verifier's output,
  so a session only reads what the regenerators could not fix.

A check that raises *fails* the judgement (visibly) instead of escalating it: a
crashing check would otherwise turn every judgement into a session.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatchq.core.judgement import Judgement
from dispatchq.core.kinds import Kind
from dispatchq.errors import GitError
from dispatchq.git import runner as git
from dispatchq.launcher.environment import child_environment
from dispatchq.queue.dispatch import Moves
from dispatchq.settings import parent_environment

if TYPE_CHECKING:
    from dispatchq.runtime import Runtime

__all__ = [
    "TAIL_CHARS",
    "CodeOutcome",
    "process_batch",
    "produce_and_verify",
    "run_check",
]

TAIL_CHARS = 4000


@dataclass(frozen=True)
class CodeOutcome:
    """answered / cannot-tell / failed, with what the record and trail need."""

    status: str  # "answered" | "up" | "failed"
    value: Any = None
    reason: str = ""
    raw: Any = None


def run_check(kind: Kind, judgement: Judgement) -> CodeOutcome:
    assert kind.check_fn is not None
    try:
        result = kind.check_fn(judgement)
    except Exception as error:
        where = traceback.extract_tb(error.__traceback__)[-1]
        return CodeOutcome(
            "failed",
            reason=f"check {kind.check} raised {type(error).__name__}: {error} "
            f"({Path(where.filename).name}:{where.lineno})",
        )
    if result is None:
        return CodeOutcome("up", reason=f"check {kind.check} cannot tell")
    reason = f"check {kind.check}"
    value = result
    if isinstance(result, dict) and "value" in result and set(result) <= {"value", "reason"}:
        value = result["value"]
        reason = str(result.get("reason") or reason)
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return CodeOutcome(
            "failed", reason=f"check {kind.check} returned a value that is not JSON: {type(value).__name__}"
        )
    return CodeOutcome("answered", value=value, reason=reason)


def _tail(text: str) -> str:
    return text if len(text) <= TAIL_CHARS else "…" + text[-TAIL_CHARS:]


def _run(argv: Sequence[str], cwd: Path, env: Mapping[str, str], timeout: float) -> tuple[int, str]:
    """Run one command (no shell) in its own process group; kill the group on timeout."""
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as error:
        return 127, f"{argv[0]}: {error.strerror}"
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -9, out.decode(errors="replace") + f"\n[dispatchq: killed after {timeout:g}s]"
    return proc.returncode, out.decode(errors="replace")


def produce_and_verify(
    kind: Kind, judgement: Judgement, *, env: Mapping[str, str], timeout: float
) -> CodeOutcome:
    """Regenerate in a throwaway worktree; the repository's verifier decides."""
    checkout = Path(judgement.context["checkout"])
    repo = git.toplevel(checkout, env)
    if repo is None:
        return CodeOutcome("failed", reason=f"{checkout} is not a git repository")
    workdir = Path(tempfile.mkdtemp(prefix="dispatchq-repair-"))
    tree = workdir / "tree"
    log: list[dict[str, Any]] = []
    try:
        try:
            git.add_worktree(repo, tree, env)
        except GitError as error:
            return CodeOutcome("failed", reason=str(error))
        # Run where the checkout sits inside the repository (a subdirectory stays a subdirectory).
        cwd = tree / checkout.resolve().relative_to(repo.resolve())
        for phase, commands in (("produce", kind.produce), ("verify", kind.verify)):
            for argv in commands:
                code, output = _run(argv, cwd, env, timeout)
                log.append({"phase": phase, "argv": list(argv), "exit": code})
                if code != 0:
                    return CodeOutcome(
                        "up",
                        reason=f"{phase} {' '.join(argv)} exited {code}",
                        raw={"commands": log, "output_tail": _tail(output)},
                    )
        diff = git.diff_all(tree, env)
        if not diff.strip():
            return CodeOutcome(
                "answered",
                value={"changed": False, "diff": "", "branch": None, "commit": None},
                reason="verify passed with nothing to change",
                raw={"commands": log},
            )
        branch = f"dispatchq/repair-{judgement.id}"
        commit = git.commit_to_branch(
            tree, branch, f"dispatchq repair for {judgement.kind} {judgement.target}", env
        )
        return CodeOutcome(
            "answered",
            value={"changed": True, "diff": diff, "branch": branch, "commit": commit},
            reason="regenerated; verify passed",
            raw={"commands": log},
        )
    except GitError as error:
        return CodeOutcome("failed", reason=str(error), raw={"commands": log})
    finally:
        git.remove_worktree(repo, tree, env)
        shutil.rmtree(workdir, ignore_errors=True)


def process_batch(runtime: Runtime, ids: Sequence[str]) -> int:
    """Run the code tier over one RQ job's judgements; returns how many it handled.

    Judgements already finished (a retried job) or cancelled are not claimed, so a
    re-run does only what is left.
    """
    settings = runtime.settings
    claimed = runtime.storage.records.claim(ids, "code")
    if not claimed:
        return 0
    parent = parent_environment()
    moves = Moves()
    for c in claimed:
        judgement = Judgement(id=c.id, **c.input)
        kind = runtime.config.kinds.get(judgement.kind)
        if kind is None:
            moves.fail(c.id, "code", f"kind {judgement.kind!r} is no longer in the config")
            continue
        if kind.check is not None:
            outcome = run_check(kind, judgement)
        else:
            env = child_environment(parent, deny=settings.session_deny_env, allow=kind.env)
            outcome = produce_and_verify(kind, judgement, env=env, timeout=settings.produce_timeout)
        host = settings.host if judgement.checkout else None
        if outcome.status == "answered":
            moves.answer(c.id, "code", outcome.value, outcome.reason, raw=outcome.raw)
        elif outcome.status == "up":
            fields = {"raw": outcome.raw} if outcome.raw is not None else {}
            moves.move_up(c.id, kind, "code", outcome.reason, host=host, fields=fields, state=judgement.state)
        else:
            moves.fail(c.id, "code", outcome.reason)
    runtime.dispatcher.commit(moves)
    return len(claimed)
