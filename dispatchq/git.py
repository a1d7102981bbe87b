"""The git operations the code tier needs, as argv lists with no shell.

Produce-and-verify must never touch a person's working tree, so it works in a
temporary worktree at HEAD; the content key must change when the tree does, so it
fingerprints HEAD plus every changed or untracked file's content.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Mapping
from pathlib import Path

from dispatchq.errors import GitError


def run_git(
    repo: Path, *args: str, env: Mapping[str, str] | None = None, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    argv = ["git", "-C", str(repo), *args]
    try:
        done = subprocess.run(
            argv, capture_output=True, env=dict(env) if env is not None else None, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise GitError(f"git {args[0]}: {error}") from None
    if check and done.returncode != 0:
        raise GitError(f"git {args[0]} failed: {done.stderr.decode(errors='replace').strip()[:500]}")
    return done


def toplevel(path: Path, env: Mapping[str, str] | None = None) -> Path | None:
    done = run_git(path, "rev-parse", "--show-toplevel", env=env, check=False)
    if done.returncode != 0:
        return None
    return Path(done.stdout.decode().strip())


def head(repo: Path, env: Mapping[str, str] | None = None) -> str | None:
    done = run_git(repo, "rev-parse", "--verify", "-q", "HEAD", env=env, check=False)
    return done.stdout.decode().strip() or None if done.returncode == 0 else None


def fingerprint(repo: Path, env: Mapping[str, str] | None = None) -> str:
    """HEAD plus a digest of the content of every changed or untracked file.

    Two enqueues of the same judgement against the same tree get the same key; any
    edit, staged or not, gives a new one.
    """
    digest = hashlib.sha256()
    digest.update((head(repo, env) or "no-head").encode())
    status = run_git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all", env=env).stdout
    entries = [e for e in status.split(b"\0") if e]
    paths: list[bytes] = []
    skip_next = False
    for entry in entries:
        if skip_next:  # the original name of a rename
            skip_next = False
            continue
        code, path = entry[:2], entry[3:]
        if code[:1] in (b"R", b"C"):
            skip_next = True
        paths.append(path)
    for rel in sorted(paths):
        digest.update(b"\0" + rel + b"\0")
        file = repo / rel.decode("utf-8", "surrogateescape")
        try:
            if file.is_symlink():
                digest.update(b"link:" + str(file.readlink()).encode())
            elif file.is_file():
                digest.update(hashlib.sha256(file.read_bytes()).digest())
            else:
                digest.update(b"absent")
        except OSError:
            digest.update(b"unreadable")
    return digest.hexdigest()


def add_worktree(repo: Path, path: Path, env: Mapping[str, str] | None = None) -> None:
    run_git(repo, "worktree", "add", "--detach", "--quiet", str(path), "HEAD", env=env)


def remove_worktree(repo: Path, path: Path, env: Mapping[str, str] | None = None) -> None:
    run_git(repo, "worktree", "remove", "--force", str(path), env=env, check=False)
    run_git(repo, "worktree", "prune", env=env, check=False)


def diff_all(worktree: Path, env: Mapping[str, str] | None = None) -> str:
    """Everything the regenerators changed, untracked files included."""
    run_git(worktree, "add", "--all", env=env)
    return run_git(worktree, "diff", "--cached", "--binary", env=env).stdout.decode(errors="replace")


def commit_to_branch(worktree: Path, branch: str, message: str, env: Mapping[str, str] | None = None) -> str:
    """Commit what is staged in the worktree onto a new local branch; return the commit id."""
    identity = (
        "-c",
        "user.name=dispatchq",
        "-c",
        "user.email=dispatchq@localhost",
        "-c",
        "commit.gpgsign=false",
    )
    run_git(worktree, *identity, "commit", "--quiet", "--no-verify", "-m", message, env=env)
    commit = run_git(worktree, "rev-parse", "HEAD", env=env).stdout.decode().strip()
    run_git(worktree, "branch", "--force", branch, commit, env=env)
    return commit
